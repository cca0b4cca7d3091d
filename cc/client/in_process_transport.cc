#include "cc/client/in_process_transport.h"

#include <algorithm>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cc/client/cancellation.h"

namespace pserver {
namespace {

// How often a waiting call that can be cancelled looks at its cancellation.
constexpr absl::Duration kCancelSlice = absl::Milliseconds(100);

// Runs `wait(deadline)`, a call that waits on the store for other workers,
// so that the calling thread's cancellation (cancellation.h) ends it
// promptly: in slices of kCancelSlice until `deadline`. A slice that runs
// out leaves no trace in the store (a timed-out arrival is withdrawn, a
// consistent read has read nothing), so the next slice simply waits again.
absl::Status WaitCancellably(absl::Time deadline,
                             const std::function<absl::Status(absl::Time)>& wait) {
  Cancellation* const cancel = Cancellation::Current();
  if (cancel == nullptr) return wait(deadline);
  while (true) {
    if (absl::Status cancelled = cancel->Check(); !cancelled.ok()) return cancelled;
    const absl::Time slice = std::min(deadline, absl::Now() + kCancelSlice);
    absl::Status status = wait(slice);
    if (!absl::IsDeadlineExceeded(status) || slice >= deadline) return status;
  }
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
    status = WaitCancellably(
        deadline, [&](absl::Time until) { return tables_->Pull(request, response, until); });
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
    status = WaitCancellably(deadline,
                             [&](absl::Time until) { return tables_->Barrier(request, until); });
  }
  done(status);
}

void InProcessTransport::AllReduce(const v1::AllReduceRequest& request,
                                   v1::AllReduceResponse* response, absl::Time deadline,
                                   Done done) {
  absl::Status status = CheckTables();
  if (status.ok()) {
    status = WaitCancellably(
        deadline, [&](absl::Time until) { return tables_->AllReduce(request, response, until); });
  }
  done(status);
}

void InProcessTransport::Broadcast(const v1::BroadcastRequest& request,
                                   v1::BroadcastResponse* response, absl::Time deadline,
                                   Done done) {
  absl::Status status = CheckTables();
  if (status.ok()) {
    status = WaitCancellably(
        deadline, [&](absl::Time until) { return tables_->Broadcast(request, response, until); });
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
