// Benchmark harness: repetitions with warm-up, min/median/max, a table per
// group on stdout, and the whole report as JSON.
//
//   Harness h(options);
//   Result& r = h.Add("dense", "push");
//   r.set_payload_bytes(1 << 20);
//   h.Measure(&r, "GB/s", [&] { ...one repetition...; return bytes / seconds; });
//   h.Compare(&r, "socket");     // ratio to the ceiling measured as "socket"
//   h.WriteJson("results.json");
//
// Not thread-safe; a measured function may use threads of its own.
#ifndef PSERVER_BENCH_HARNESS_H_
#define PSERVER_BENCH_HARNESS_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "results.pb.h"

namespace pserver::bench {

struct HarnessOptions {
  bool quick = false;
  int warmup = 1;
  int repetitions = 5;
  std::string command;  // how the run was started, for the report
};

// Seconds since an arbitrary start, monotonic.
double NowSeconds();

Stats Summarize(std::vector<double> values);

class Harness {
 public:
  explicit Harness(HarnessOptions options);

  const HarnessOptions& options() const { return options_; }
  bool quick() const { return options_.quick; }

  // A new result in `group`; the reference stays valid until the next Add.
  Result& Add(const std::string& group, const std::string& name);

  // Runs `one` warmup + repetitions times; each call returns the metric of
  // one repetition (or an error, which aborts the measurement).
  absl::Status Measure(Result* result, const std::string& unit,
                       const std::function<absl::StatusOr<double>()>& one);

  // Sets result->ratio to its median over the median of the ceiling result
  // named `ceiling` (group "ceiling") with the same payload size, or the
  // closest one measured. `scale` multiplies the ceiling first (e.g. 3.5 for
  // an optimizer that moves 7 bytes for every 2 that memcpy moves).
  void Compare(Result* result, const std::string& ceiling, double scale = 1.0);

  // Prints the results of `group` as a table.
  void PrintGroup(const std::string& group) const;

  absl::Status WriteJson(const std::string& path) const;

 private:
  const Result* FindCeiling(const std::string& name, uint64_t bytes) const;

  HarnessOptions options_;
  Report report_;
};

// "4 KiB", "64 MiB".
std::string FormatBytes(uint64_t bytes);

}  // namespace pserver::bench

#endif  // PSERVER_BENCH_HARNESS_H_
