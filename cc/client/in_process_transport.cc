#include "cc/client/in_process_transport.h"

#include <algorithm>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cc/client/cancellation.h"

namespace pserver {
namespace {

// Starts a wait on the store for other workers (`start` hands it `done` and
// returns its CancelWait), holding no thread while it waits, as the gRPC
// service does. The calling thread's cancellation (cancellation.h), if any,
// ends it with CANCELLED; `done` may run on whichever thread completes it.
void WaitWithoutThread(const std::function<CancelWait(WaitDone)>& start, WaitDone done) {
  Cancellation* const cancel = Cancellation::Current();
  if (cancel == nullptr) {
    start(std::move(done));
    return;
  }
  if (absl::Status cancelled = cancel->Check(); !cancelled.ok()) {
    done(std::move(cancelled));
    return;
  }
  // The registration lives until the wait completes, whichever comes first.
  struct State {
    absl::Mutex mu;
    bool completed ABSL_GUARDED_BY(mu) = false;
    Cancellation::Registration registration ABSL_GUARDED_BY(mu);
  };
  auto state = std::make_shared<State>();
  CancelWait cancel_wait = start([state, done = std::move(done)](absl::Status status) {
    Cancellation::Registration registration;  // unregistered outside the lock
    {
      absl::MutexLock lock(&state->mu);
      state->completed = true;
      registration = std::move(state->registration);
    }
    done(std::move(status));
  });
  // Outside the lock: already cancelled, OnCancel completes the wait at once.
  Cancellation::Registration registration = cancel->OnCancel(std::move(cancel_wait));
  absl::MutexLock lock(&state->mu);
  if (!state->completed) state->registration = std::move(registration);
}

// The in-process "server" times of a call, for its ticket's trace.
class ServerTimes {
 public:
  explicit ServerTimes(TraceRecorder* trace)
      : trace_(trace), received_(absl::ToUnixNanos(absl::Now())) {}
  void Report() const {
    if (trace_ == nullptr) return;
    v1::ServerTrace times;
    times.set_received_unix_nanos(received_);
    times.set_processed_unix_nanos(absl::ToUnixNanos(absl::Now()));
    trace_->Server(times);
  }

 private:
  TraceRecorder* const trace_;
  const int64_t received_;
};

}  // namespace

InProcessTransport::InProcessTransport(ParameterStore* store, Tables* tables, uint32_t index)
    : store_(store), tables_(tables), index_(index), address_(absl::StrCat("in-process:", index)) {}

absl::Status InProcessTransport::CheckTables() const {
  if (tables_ != nullptr) return absl::OkStatus();
  return absl::UnimplementedError(
      absl::StrCat(address_, " was made without tables: no tables or collectives"));
}

void InProcessTransport::CreateTable(const v1::CreateTableRequest& request,
                                     v1::CreateTableResponse*, absl::Time, Done done) {
  absl::Status status = CheckTables();
  done(status.ok() ? tables_->Create(request) : status);
}

void InProcessTransport::TablePull(const v1::TablePullRequest& request,
                                   v1::TablePullResponse* response, absl::Time deadline,
                                   Done done) {
  absl::Status status = CheckTables();
  if (status.ok()) {
    WaitWithoutThread(
        [&](WaitDone wait_done) {
          return tables_->PullAsync(request, response, deadline, std::move(wait_done));
        },
        std::move(done));
    return;
  }
  done(status);
}

void InProcessTransport::TablePush(const v1::TablePushRequest& request,
                                   v1::TablePushResponse* response, absl::Time, Done done) {
  absl::Status status = CheckTables();
  done(status.ok() ? tables_->Push(request, response) : status);
}

void InProcessTransport::Clock(const v1::ClockRequest& request, v1::ClockResponse* response,
                               absl::Time, Done done) {
  absl::Status status = CheckTables();
  if (status.ok()) {
    absl::StatusOr<int64_t> clock = tables_->Clock(request);
    if (clock.ok()) response->set_clock(*clock);
    status = clock.status();
  }
  done(status);
}

void InProcessTransport::TableStats(const v1::TableStatsRequest&, v1::TableStatsResponse* response,
                                    absl::Time, Done done) {
  absl::Status status = CheckTables();
  if (status.ok()) tables_->Stats(response);
  done(status);
}

void InProcessTransport::Barrier(const v1::BarrierRequest& request, v1::BarrierResponse*,
                                 absl::Time deadline, Done done) {
  absl::Status status = CheckTables();
  if (status.ok()) {
    WaitWithoutThread(
        [&](WaitDone wait_done) {
          return tables_->BarrierAsync(request, deadline, std::move(wait_done));
        },
        std::move(done));
    return;
  }
  done(status);
}

void InProcessTransport::AllReduce(const v1::AllReduceRequest& request,
                                   v1::AllReduceResponse* response, absl::Time deadline,
                                   Done done) {
  absl::Status status = CheckTables();
  if (status.ok()) {
    WaitWithoutThread(
        [&](WaitDone wait_done) {
          return tables_->AllReduceAsync(request, response, deadline, std::move(wait_done));
        },
        std::move(done));
    return;
  }
  done(status);
}

void InProcessTransport::Broadcast(const v1::BroadcastRequest& request,
                                   v1::BroadcastResponse* response, absl::Time deadline,
                                   Done done) {
  absl::Status status = CheckTables();
  if (status.ok()) {
    WaitWithoutThread(
        [&](WaitDone wait_done) {
          return tables_->BroadcastAsync(request, response, deadline, std::move(wait_done));
        },
        std::move(done));
    return;
  }
  done(status);
}

void InProcessTransport::InitParam(const v1::InitParamRequest& request, absl::Time, Done done) {
  done(store_->Init(request.parameter(), request.config()));
}

void InProcessTransport::FinishInitParams(absl::Time, Done done) {
  store_->FinishInit();
  done(absl::OkStatus());
}

void InProcessTransport::GetStats(v1::GetStatsResponse* response, absl::Time, Done done) {
  store_->FillStats(response->mutable_stats());
  response->mutable_stats()->set_index(index_);
  done(absl::OkStatus());
}

void InProcessTransport::Push(absl::Span<const GradientView> grads, absl::Time, Done done,
                              TraceRecorder* trace) {
  ServerTimes times(trace);
  absl::Status status = store_->ApplyGradients(grads);
  times.Report();
  done(status);
}

absl::Status InProcessTransport::Read(absl::Span<const v1::ParamRef> refs, const BlockSink& sink) {
  v1::Parameter header;
  for (const v1::ParamRef& ref : refs) {
    header.Clear();
    absl::Status delivered;
    absl::Status read = store_->Read(
        ref, &header, [&](absl::string_view bytes) { delivered = sink(header, Segments{bytes}); });
    if (!read.ok()) return read;
    if (!delivered.ok()) return delivered;
  }
  return absl::OkStatus();
}

void InProcessTransport::Pull(absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time,
                              Done done, TraceRecorder* trace) {
  ServerTimes times(trace);
  absl::Status status = Read(refs, sink);
  times.Report();
  done(status);
}

void InProcessTransport::PushPull(absl::Span<const GradientView> grads,
                                  absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time,
                                  Done done, TraceRecorder* trace) {
  ServerTimes times(trace);
  absl::Status status = store_->ApplyGradients(grads);
  if (status.ok()) status = Read(refs, sink);
  times.Report();
  done(status);
}

std::vector<std::unique_ptr<Transport>> InProcessTransports(
    const std::vector<ParameterStore*>& stores, const std::vector<Tables*>& tables) {
  std::vector<std::unique_ptr<Transport>> transports;
  for (size_t i = 0; i < stores.size(); ++i) {
    transports.push_back(std::make_unique<InProcessTransport>(
        stores[i], i < tables.size() ? tables[i] : nullptr, static_cast<uint32_t>(i)));
  }
  return transports;
}

}  // namespace pserver
