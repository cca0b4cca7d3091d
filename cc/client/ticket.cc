#include "cc/client/ticket.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/client/cancellation.h"
#include "absl/time/clock.h"

namespace pserver {

void TraceRecorder::Sent() {
  absl::MutexLock lock(&mu_);
  if (trace_.sent == absl::InfinitePast()) trace_.sent = absl::Now();
  ++trace_.requests;
}

void TraceRecorder::Server(const v1::ServerTrace& trace) {
  if (trace.received_unix_nanos() == 0) return;  // the server did not say
  const absl::Time received = absl::FromUnixNanos(trace.received_unix_nanos());
  const absl::Time processed = absl::FromUnixNanos(trace.processed_unix_nanos());
  absl::MutexLock lock(&mu_);
  if (trace_.server_received == absl::InfinitePast() || received < trace_.server_received) {
    trace_.server_received = received;
  }
  trace_.server_processed = std::max(trace_.server_processed, processed);
}

void TraceRecorder::Replied() {
  absl::MutexLock lock(&mu_);
  trace_.reply_received = absl::Now();
}

TicketTrace TraceRecorder::Get() const {
  absl::MutexLock lock(&mu_);
  return trace_;
}

struct Ticket::State {
  TraceRecorder recorder;
  mutable absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
  std::vector<Callback> callbacks ABSL_GUARDED_BY(mu);
};

Ticket::Ticket() : state_(std::make_shared<State>()) {
  absl::MutexLock lock(&state_->recorder.mu_);
  state_->recorder.trace_.queued = absl::Now();
}

Ticket Ticket::Failed(absl::Status status) {
  Ticket ticket;
  ticket.Finish(std::move(status));
  return ticket;
}

bool Ticket::done() const {
  absl::MutexLock lock(&state_->mu);
  return state_->done;
}

absl::Status Ticket::Wait(absl::Duration timeout) const {
  absl::MutexLock lock(&state_->mu);
  const bool done = Cancellation::Await(state_->mu, absl::Condition(&state_->done), timeout);
  if (!done) {
    return absl::DeadlineExceededError(
        absl::StrCat("ticket still running after ", absl::FormatDuration(timeout)));
  }
  return state_->status;
}

TicketTrace Ticket::trace() const { return state_->recorder.Get(); }

void Ticket::OnDone(Callback callback) const {
  absl::Status status;
  {
    absl::MutexLock lock(&state_->mu);
    if (!state_->done) {
      state_->callbacks.push_back(std::move(callback));
      return;
    }
    status = state_->status;
  }
  callback(status);
}

TraceRecorder& Ticket::recorder() const { return state_->recorder; }

void Ticket::Finish(absl::Status status) const {
  std::vector<Callback> callbacks;
  {
    absl::MutexLock lock(&state_->mu);
    if (state_->done) return;
    state_->done = true;
    state_->status = status;
    callbacks.swap(state_->callbacks);
  }
  for (Callback& callback : callbacks) callback(status);
}

}  // namespace pserver
