#include "cc/client/client_trace.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pserver {
namespace {

// The outermost call running on this thread, if traced.
thread_local ClientTrace::Call* current_call = nullptr;

}  // namespace

ClientTrace::ClientTrace(std::unique_ptr<trace::Recorder> recorder, int num_servers)
    : recorder_(std::move(recorder)) {
  if (num_servers > 0) LanesOf(num_servers - 1);
}

trace::Lanes& ClientTrace::LanesOf(int server) {
  absl::MutexLock lock(&servers_mu_);
  for (int i = static_cast<int>(servers_.size()); i <= server; ++i) {
    servers_.push_back(std::make_unique<trace::Lanes>(kServerTrackBase + i * kLanes,
                                                      absl::StrCat("-> server ", i), kLanes));
  }
  return *servers_.at(server);
}

ClientTrace::Call::Call(ClientTrace* trace, const char* op, absl::Time queued) {
  if (trace == nullptr) return;
  if (current_call != nullptr) {
    if (op != nullptr) current_call->Name(op);
    return;
  }
  trace_ = trace;
  if (op != nullptr) op_ = op;
  id_ = trace->next_call_.fetch_add(1, std::memory_order_relaxed);
  start_us_ = trace::NowMicros();
  if (queued != absl::InfinitePast()) {
    // On tracks of its own: the thread that runs the call may have been
    // running another one meanwhile.
    const int64_t queued_us = std::min(start_us_, trace->recorder_->MonotonicMicrosOf(queued));
    trace->recorder_->Complete("queued", "client", queued_us, start_us_,
                               trace->queue_.Place(*trace->recorder_, queued_us, start_us_),
                               trace::Args().Add("call", id_).json());
  }
  current_call = this;
}

void ClientTrace::Call::Name(absl::string_view op) {
  ClientTrace::Call* call = current_call;
  if (call != nullptr && call->op_.empty()) call->op_ = std::string(op);
}

ClientTrace::Call::~Call() {
  if (trace_ == nullptr) return;
  current_call = nullptr;
  trace_->recorder_->Complete(op_.empty() ? "call" : op_, "call", start_us_, trace::NowMicros(),
                              trace::Recorder::ThreadTrack(),
                              trace::Args().Add("call", id_).json());
}

Transport::Done ClientTrace::Request(int server, absl::string_view address, int attempt,
                                     const std::function<void(trace::Args&)>& details,
                                     Transport::Done done) {
  trace::Args args;
  const Call* call = current_call;
  std::string op = call != nullptr && !call->op_.empty() ? call->op_ : "request";
  if (call != nullptr) args.Add("call", call->id_);
  args.Add("server", server).Add("address", address).Add("attempt", attempt);
  if (details) details(args);
  return [this, op = std::move(op), server, args = std::move(args), start = trace::NowMicros(),
          done = std::move(done)](absl::Status status) mutable {
    args.Add("status", absl::StatusCodeToString(status.code()));
    const int64_t end = trace::NowMicros();
    recorder_->Complete(op, "request", start, end,
                        LanesOf(server).Place(*recorder_, start, end), args.json());
    done(std::move(status));
  };
}

}  // namespace pserver
