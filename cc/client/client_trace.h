// ClientTrace: what a Client records when asked to trace
// (ClientOptions::trace_file, or the PSERVER_TRACE environment variable):
// each call (SendGrads, GetParams, PushPull, InitParams, table ops, ...) as a
// span on the track of the thread that runs it, until it is done (an async
// ticket's call also has a "queued" span, from when it was queued until a
// thread took it, on the "queued" tracks); and each request of it as a span
// on its server's tracks ("-> server 0", and "-> server 0 #2", ... for
// requests in flight at once: trace::Lanes) from sending to the reply, with
// the call's id,
// the attempt, the status and what the request carried (its push request id,
// blocks and parameter names). Written as Chrome trace JSON (cc/trace).
//
//   ClientTrace::Call call(trace, "SendGrads");   // the outermost per thread counts
//   ... RunWithRetries wraps each request's done with trace->Request(...)
//
// Thread-safe. A call's span belongs to the thread that runs it; its
// requests may finish on any thread.
#ifndef PSERVER_CC_CLIENT_CLIENT_TRACE_H_
#define PSERVER_CC_CLIENT_CLIENT_TRACE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cc/client/transport.h"
#include "cc/trace/trace.h"

namespace pserver {

class ClientTrace {
 public:
  // Request spans to server i go to tracks kServerTrackBase + i * kLanes
  // and up; "queued" spans to kQueueTrackBase and up.
  static constexpr uint32_t kLanes = 64;
  static constexpr uint32_t kServerTrackBase = 1u << 30;
  static constexpr uint32_t kQueueTrackBase = kServerTrackBase - kLanes;

  ClientTrace(std::unique_ptr<trace::Recorder> recorder, int num_servers);

  // The span of one call on this thread. Nested calls (SendGrad inside
  // SendGrads, a layout lookup inside a push) are part of the outermost one
  // and record nothing of their own; the first op named names it. `trace`
  // null: records nothing.
  class Call {
   public:
    // `op` null: named by the first nested call.
    Call(ClientTrace* trace, const char* op, absl::Time queued = absl::InfinitePast());
    Call(ClientTrace* trace, absl::string_view op) : Call(trace, nullptr) { Name(op); }
    ~Call();
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    void Name(absl::string_view op);

    ClientTrace* trace_ = nullptr;  // null: nested or not tracing
    std::string op_;  // "": not named yet
    uint64_t id_ = 0;
    int64_t start_us_ = 0;
    Call* outer_ = nullptr;
    friend class ClientTrace;
  };

  // `done`, wrapped to record the request's span (now until it is called) on
  // `server`'s track within the current call. `details` adds what the
  // request carries (may be null).
  Transport::Done Request(int server, absl::string_view address, int attempt,
                          const std::function<void(trace::Args&)>& details, Transport::Done done);

  trace::Recorder& recorder() { return *recorder_; }

 private:
  // Server `server`'s lanes, made on first use (servers join in live moves).
  trace::Lanes& LanesOf(int server) ABSL_LOCKS_EXCLUDED(servers_mu_);

  const std::unique_ptr<trace::Recorder> recorder_;
  absl::Mutex servers_mu_;
  std::vector<std::unique_ptr<trace::Lanes>> servers_ ABSL_GUARDED_BY(servers_mu_);  // per index
  trace::Lanes queue_{kQueueTrackBase, "queued", kLanes};
  std::atomic<uint64_t> next_call_{1};
};

}  // namespace pserver

#endif  // PSERVER_CC_CLIENT_CLIENT_TRACE_H_
