// Benchmark harness: repetitions with warm-up, min/median/max, a table per
// group on stdout, and the whole report as JSON.
//
//   Harness h(options);
//   Result& r = h.Add("dense", "push");
//   r.set_payload_bytes(1 << 20);
//   h.Measure(&r, "GB/s", [&] { ...one repetition...; return bytes / seconds; });
//   h.Compare(&r, "socket");     // ratio to the ceiling measured as "socket"
//                                // (or the best of its alternatives)
//   h.WriteJson("results.json");
//
// Not thread-safe; a measured function may use threads of its own.
#ifndef PSERVER_BENCH_HARNESS_H_
#define PSERVER_BENCH_HARNESS_H_

#include <sys/types.h>

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

// The `percent`th percentile of `values` (nearest rank, not interpolated);
// `values` must not be empty.
double Percentile(std::vector<double> values, int percent);

class Harness {
 public:
  explicit Harness(HarnessOptions options);

  const HarnessOptions& options() const { return options_; }
  bool quick() const { return options_.quick; }

  // A new result in `group`; the reference stays valid until the next Add.
  Result& Add(const std::string& group, const std::string& name);

  // Runs `one` warmup + repetitions times; each call returns the metric of
  // one repetition (or an error, which aborts the measurement). With
  // `probe`, each repetition is also recorded in result->each with the
  // counters the probe read over it, and a repetition whose metric is more
  // than 25% off the median is printed with its counters beside the
  // median one's (a slow mode, or load: compare page faults, context
  // switches, run-queue waits and other processes' CPU).
  absl::Status Measure(Result* result, const std::string& unit,
                       const std::function<absl::StatusOr<double>()>& one,
                       const class RepetitionProbe* probe = nullptr);

  // Sets result->ratio to its median over the median of the ceiling result
  // named `ceiling` (group "ceiling") with the same payload size, or the
  // closest one measured. `scale` multiplies the ceiling first (e.g. 3.5 for
  // an optimizer that moves 7 bytes for every 2 that memcpy moves).
  // With alternatives set for `ceiling`, the highest median among it and
  // them is used, and result->ceiling names the one used.
  void Compare(Result* result, const std::string& ceiling, double scale = 1.0);

  // Compare(r, `ceiling`) judges against the best of `ceiling` and
  // `alternatives` measured in this run (e.g. "socket" against the harness's
  // own stream, the iperf3-style stream and iperf3 itself).
  void SetCeilingAlternatives(const std::string& ceiling, std::vector<std::string> alternatives);

  // Records that `group` was not run, and why (the report says so; a
  // skipped group does not make it incomplete).
  void Skip(const std::string& group, const std::string& reason);

  // Prints the results of `group` as a table.
  void PrintGroup(const std::string& group) const;

  absl::Status WriteJson(const std::string& path) const;

 private:
  const Result* FindCeiling(const std::string& name, uint64_t bytes) const;
  // Prints the repetitions of `result` more than 25% off its median.
  void PrintOffMedian(const Result& result) const;

  HarnessOptions options_;
  Report report_;
  std::map<std::string, std::vector<std::string>> alternatives_;
};

// One repetition for Harness::Measure of `ops` calls of `op`, one after
// another: returns ops/s and appends each call's time, in microseconds, to
// `micros`; the first error ends it.
absl::StatusOr<double> TimeOps(int ops, const std::function<absl::Status()>& op,
                               std::vector<double>* micros);

// CPU seconds (user + system) used so far by this process, all its threads.
double SelfCpuSeconds();

// CPU seconds (utime + stime in /proc/<pid>/stat) used so far by process
// `pid`; 0 when it cannot be read (the process is gone).
double ProcessCpuSeconds(pid_t pid);

// What one process did so far: page faults (minor, major), context
// switches (voluntary: it waited; involuntary: it was preempted), CPU
// seconds, and seconds its threads waited runnable for a core (run queue;
// threads alive now only).
struct ProcessCounters {
  double minflt = 0;
  double majflt = 0;
  double vcsw = 0;
  double ivcsw = 0;
  double cpu_s = 0;
  double runq_s = 0;
};

// This process (getrusage; runq_s from /proc/self/task/*/schedstat).
ProcessCounters SelfCounters();
// Process `pid` from /proc (every thread alive now); zeros when it is gone.
ProcessCounters CountersOf(pid_t pid);
// CPU seconds every core of the machine spent busy so far (/proc/stat).
double MachineBusySeconds();

// Reads the counters of this process ("client_") and `servers` (summed,
// "server_") and the CPU seconds of everything else on the machine
// ("others_cpu_s"), for Harness::Measure to record per repetition.
class RepetitionProbe {
 public:
  explicit RepetitionProbe(std::vector<pid_t> servers) : servers_(std::move(servers)) {}
  std::map<std::string, double> Read() const;

 private:
  std::vector<pid_t> servers_;
};

// CPU seconds per GB moved, summed over this process and `others` (e.g. the
// server processes), over the spans between Start and Stop:
//
//   CpuPerGB cpu({server_pid});
//   cpu.Start(); ...move `bytes`...; cpu.Stop(bytes);
//   (*r.mutable_extra())["cpu_s_per_GB"] = cpu.SecondsPerGB();
class CpuPerGB {
 public:
  explicit CpuPerGB(std::vector<pid_t> others) : others_(std::move(others)) {}
  void Start() { started_ = Now(); }
  void Stop(double bytes_moved) {
    seconds_ += Now() - started_;
    bytes_ += bytes_moved;
  }
  double SecondsPerGB() const { return bytes_ > 0 ? seconds_ / (bytes_ / 1e9) : 0; }

 private:
  double Now() const;

  std::vector<pid_t> others_;
  double started_ = 0;
  double seconds_ = 0;
  double bytes_ = 0;
};

// "4 KiB", "64 MiB".
std::string FormatBytes(uint64_t bytes);

}  // namespace pserver::bench

#endif  // PSERVER_BENCH_HARNESS_H_
