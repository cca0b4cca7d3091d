// Trace: spans of a process's work written as Chrome trace JSON (the
// "traceEvents" array that chrome://tracing and ui.perfetto.dev load), so a
// slow step can be looked at. A worker's client records its calls and their
// requests per server; a server records its requests' stages.
//
//   trace::RecorderOptions options;
//   options.path = "/tmp/worker.json";
//   options.process_name = "worker";
//   PS_ASSIGN_OR_RETURN(std::unique_ptr<trace::Recorder> recorder, trace::Recorder::Open(options));
//   const int64_t start = trace::NowMicros();
//   ... work ...
//   recorder->Complete("SendGrads", "call", start, trace::NowMicros(), recorder->ThreadTrack(),
//                      trace::Args().Add("call", 7).json());
//   PS_RETURN_IF_ERROR(recorder->Flush());   // also done by the destructor
//
// Clock: CLOCK_MONOTONIC (std::chrono::steady_clock) in microseconds, the
// same clock in every process of one host, so a worker's and its servers'
// files line up as they are. The file also holds the process's start on
// both clocks ("otherData": start_monotonic_us, start_unix_us) so files from
// different hosts can be shifted onto one time line (python -m pserver.trace
// merge).
//
// Bounded: at most `max_events` events are held (a ring: once full, the
// oldest is overwritten and counted in dropped()). Recording takes a short
// lock and copies the event; no file I/O happens before Flush.
//
// Thread-safe.
#ifndef PSERVER_CC_TRACE_TRACE_H_
#define PSERVER_CC_TRACE_TRACE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pserver {
namespace trace {

// Now on CLOCK_MONOTONIC, in microseconds.
int64_t NowMicros();

// A JSON object of event arguments, built in order; keys are not checked for
// repeats.
class Args {
 public:
  Args& Add(absl::string_view key, int64_t value);
  Args& Add(absl::string_view key, absl::string_view value);
  Args& Add(absl::string_view key, const char* value) { return Add(key, absl::string_view(value)); }
  // `value` in hexadecimal, as a string (JSON numbers lose 64-bit ids).
  Args& AddHex(absl::string_view key, uint64_t value);
  std::string json() const { return body_.empty() ? "" : "{" + body_ + "}"; }

 private:
  std::string body_;
};

// `text` as a JSON string literal, quotes included.
std::string JsonString(absl::string_view text);

struct RecorderOptions {
  std::string path;  // where Flush writes; required
  // Events held; past it the oldest are dropped. At least 1.
  size_t max_events = size_t{1} << 18;
  std::string process_name = "pserver";
};

class Recorder {
 public:
  // A recorder that writes to options.path. INVALID_ARGUMENT for an empty
  // path or max_events 0; the error of creating the file (it is created
  // now, empty, so that a bad path fails at start, not at exit).
  static absl::StatusOr<std::unique_ptr<Recorder>> Open(const RecorderOptions& options);
  ~Recorder();  // flushes; an error is printed to stderr
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // A span [start_us, end_us] (NowMicros) on track `tid` ("ph": "X").
  // `args_json`: an Args::json() object, or "".
  void Complete(absl::string_view name, const char* category, int64_t start_us, int64_t end_us,
                uint32_t tid, std::string args_json = "");
  // The calling thread's track: its Linux thread id.
  static uint32_t ThreadTrack();
  // Names track `tid` in the viewer (kept apart from the ring; set once per
  // track).
  void NameTrack(uint32_t tid, absl::string_view name);
  // A wall-clock time (absl::Now, e.g. a peer's stamp) on this process's
  // monotonic time line, by the offset sampled at Open.
  int64_t MonotonicMicrosOf(absl::Time wall) const;

  // The trace as JSON: every event held, oldest first.
  std::string ToJson() const;
  // Writes ToJson() to the path (a temporary file renamed over it, so a
  // reader never sees half a file). May be called again: each call writes
  // the events held then.
  absl::Status Flush();

  const std::string& path() const { return options_.path; }
  size_t max_events() const { return options_.max_events; }
  uint64_t recorded() const;  // events ever recorded
  uint64_t dropped() const;   // of them, overwritten

 private:
  struct Event {
    std::string name;
    const char* category;
    int64_t start_us;
    int64_t duration_us;
    uint32_t tid;
    std::string args_json;
  };

  explicit Recorder(const RecorderOptions& options);

  const RecorderOptions options_;
  const int64_t pid_;
  const int64_t start_monotonic_us_;
  const int64_t start_unix_us_;
  mutable absl::Mutex mu_;
  std::vector<Event> ring_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;  // where the next event goes once the ring is full
  uint64_t recorded_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint32_t, std::string> track_names_ ABSL_GUARDED_BY(mu_);
  absl::Mutex flush_mu_;  // one Flush at a time
};

// Records [construction, destruction] on the calling thread's track; does
// nothing when `recorder` is null (tracing off costs a pointer test).
//
//   trace::Span span(recorder, "apply", "server");
//   if (span.active()) span.set_args(trace::Args().Add("grads", n).json());
class Span {
 public:
  Span(Recorder* recorder, const char* name, const char* category)
      : recorder_(recorder), name_(name), category_(category),
        start_us_(recorder == nullptr ? 0 : NowMicros()) {}
  ~Span() {
    if (recorder_ != nullptr) {
      recorder_->Complete(name_, category_, start_us_, NowMicros(), Recorder::ThreadTrack(),
                          std::move(args_));
    }
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  bool active() const { return recorder_ != nullptr; }
  void set_args(std::string json) { args_ = std::move(json); }

 private:
  Recorder* const recorder_;
  const char* const name_;
  const char* const category_;
  const int64_t start_us_;
  std::string args_;
};

// Tracks for spans that may overlap (requests in flight at once, calls that
// wait): each span goes to the lowest lane whose spans all ended by its
// start, so the spans of one lane never overlap and a viewer draws
// concurrent ones side by side. Lanes are tracks base, base + 1, ...,
// named "<name>", "<name> #2", ...; past `max_lanes` a span shares the lane
// that frees first (and may overlap there). Thread-safe.
class Lanes {
 public:
  Lanes(uint32_t base, std::string name, uint32_t max_lanes = 64)
      : base_(base), name_(std::move(name)), max_lanes_(max_lanes < 1 ? 1 : max_lanes) {}
  // The track for a span [start_us, end_us]; names a new lane in `recorder`.
  uint32_t Place(Recorder& recorder, int64_t start_us, int64_t end_us);

 private:
  const uint32_t base_;
  const std::string name_;
  const uint32_t max_lanes_;
  absl::Mutex mu_;
  std::vector<int64_t> last_end_ ABSL_GUARDED_BY(mu_);  // per lane
};

// The recorder that `path` asks for, or that the environment variable
// `variable` (e.g. "PSERVER_TRACE") names when `path` is empty; null when
// neither names a file. `variable`_MAX_EVENTS, when set, is max_events
// (INVALID_ARGUMENT when it is not a positive integer).
absl::StatusOr<std::unique_ptr<Recorder>> OpenFromPathOrEnvironment(absl::string_view path,
                                                                    const char* variable,
                                                                    std::string process_name,
                                                                    size_t max_events = 0);

}  // namespace trace
}  // namespace pserver

#endif  // PSERVER_CC_TRACE_TRACE_H_
