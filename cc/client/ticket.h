// Ticket: the handle of an asynchronous client call. The call's *Async form
// returns a ticket at once; Wait blocks until the call is over (or a
// timeout), OnDone registers a callback, and trace() tells when each stage
// of the call happened (like StepMesh's fetch_trace).
//
//   Ticket t = client->SendGradsAsync(grads);
//   ... compute the next batch ...
//   PS_RETURN_IF_ERROR(t.Wait(absl::Seconds(10)));
//   TicketTrace trace = t.trace();
//   LOG(INFO) << "server processed in " << trace.server_processed - trace.server_received;
//
// Thread-safe: a ticket may be copied, waited on and read from any thread.
#ifndef PSERVER_CC_CLIENT_TICKET_H_
#define PSERVER_CC_CLIENT_TICKET_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "pserver/v1/service.pb.h"

namespace pserver {

// When each stage of a call happened; absl::InfinitePast() for a stage not
// reached (a call that failed before sending, say).
struct TicketTrace {
  absl::Time queued = absl::InfinitePast();  // the *Async call was made
  absl::Time sent = absl::InfinitePast();    // its first request went to a transport
  // The earliest time a server received one of the call's requests, and the
  // latest time a server had processed one (the servers' clocks).
  absl::Time server_received = absl::InfinitePast();
  absl::Time server_processed = absl::InfinitePast();
  absl::Time reply_received = absl::InfinitePast();  // the last reply arrived
  uint32_t requests = 0;  // server requests the call was made of (retries included)
};

// Collects a call's trace while it runs: the transports report each
// request's server times to it. Thread-safe.
class TraceRecorder {
 public:
  void Sent();
  void Server(const v1::ServerTrace& trace);
  void Replied();
  TicketTrace Get() const;

 private:
  friend class Ticket;
  mutable absl::Mutex mu_;
  TicketTrace trace_ ABSL_GUARDED_BY(mu_);
};

class Ticket {
 public:
  using Callback = std::function<void(const absl::Status&)>;

  // A ticket not yet done, queued now.
  Ticket();
  // A ticket already done with `status` (a call refused before it started).
  static Ticket Failed(absl::Status status);

  bool done() const;
  // The call's status once done. DEADLINE_EXCEEDED "ticket still running
  // after ..." when it is not done within `timeout` (the call goes on; wait
  // again later).
  absl::Status Wait(absl::Duration timeout = absl::InfiniteDuration()) const;
  TicketTrace trace() const;
  // Runs `callback` with the call's status once it is done: at once, on this
  // thread, when it is done already; else on the thread that completes it.
  // Callbacks must not block.
  void OnDone(Callback callback) const;

  // --- for the client that runs the call ---
  TraceRecorder& recorder() const;
  // Completes the ticket: records the status, wakes waiters, runs callbacks.
  void Finish(absl::Status status) const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace pserver

#endif  // PSERVER_CC_CLIENT_TICKET_H_
