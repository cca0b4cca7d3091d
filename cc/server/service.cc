#include "cc/server/service.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/core/status_macros.h"
#include "cc/rpc/grpc_status.h"
#include "cc/rpc/wire.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace pserver {

namespace {

// When a waiting call gives up: a little before its own deadline, so that
// the caller gets the server's explanation rather than its own bare
// DEADLINE_EXCEEDED, and after kMaxWait at most.
absl::Time WaitDeadline(const grpc::ServerContextBase& context) {
  const absl::Time now = absl::Now();
  const absl::Time deadline =
      std::min(absl::FromChrono(context.deadline()), now + ParameterServerService::kMaxWait);
  return deadline - std::min(absl::Milliseconds(100), (deadline - now) / 5);
}

// A call that waits in the core (cc/core/waiters.h): finishes when the wait
// completes, and cancels the wait when the client cancels or goes away, so
// that the core drops what the call holds at once. Deletes itself when done.
class WaitReactor : public grpc::ServerUnaryReactor {
 public:
  // Starts the wait; `start` gets the completion and returns the cancel.
  void Start(const std::function<CancelWait(WaitDone)>& start) {
    CancelWait cancel = start([this](absl::Status status) { Complete(std::move(status)); });
    bool finish_now = false, cancel_now = false;
    {
      absl::MutexLock lock(&mu_);
      started_ = true;
      cancel_ = cancel;
      finish_now = completed_;
      cancel_now = cancelled_ && !completed_;
    }
    // Once Finish is called the reactor may be deleted: nothing after it.
    if (finish_now) {
      Finish(ToGrpcStatus(status_));
    } else if (cancel_now) {
      cancel();
    }
  }

  void OnCancel() override {
    CancelWait cancel;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      cancel = cancel_;
    }
    if (cancel) cancel();  // completes the wait (a no-op if it has completed)
  }

  void OnDone() override { delete this; }

 private:
  void Complete(absl::Status status) {
    {
      absl::MutexLock lock(&mu_);
      if (!started_) {  // completed inside start(): Start finishes
        status_ = std::move(status);
        completed_ = true;
        return;
      }
    }
    Finish(ToGrpcStatus(status));
  }

  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool completed_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_;  // written before started_, read by Start
  CancelWait cancel_ ABSL_GUARDED_BY(mu_);
};

// A call whose reply holds bytes of the reply budget until it is sent (or
// the call ends otherwise). Deletes itself when done.
class ReplyReactor : public grpc::ServerUnaryReactor {
 public:
  explicit ReplyReactor(ReplyBudget* budget) : budget_(budget) {}
  // Takes `bytes` from the budget for this reply; on failure the reply must
  // not be sent.
  absl::Status Hold(uint64_t bytes) {
    PS_RETURN_IF_ERROR(budget_->Acquire(bytes));
    held_ = bytes;
    return absl::OkStatus();
  }
  void OnDone() override {
    budget_->Release(held_);
    delete this;
  }

 private:
  ReplyBudget* const budget_;
  uint64_t held_ = 0;
};

}  // namespace

ParameterServerService::ParameterServerService(ParameterStore* store, Tables* tables,
                                               uint32_t index, ServiceHooks hooks)
    : store_(store),
      tables_(tables),
      index_(index),
      hooks_(std::move(hooks)),
      reply_budget_(hooks_.max_reply_bytes_in_flight) {}

absl::Status ParameterServerService::CheckServing() const {
  if (serving_.load(std::memory_order_acquire)) return absl::OkStatus();
  return absl::UnavailableError(
      "pserver is starting: registering and loading its checkpoint; retry");
}

absl::Status ParameterServerService::ApplyOnce(uint64_t client_id, uint64_t sequence,
                                               absl::FunctionRef<absl::Status()> apply) {
  absl::ReaderMutexLock lock(&apply_mu_);
  const bool tracked = client_id != 0 && sequence != 0;
  if (tracked) {
    switch (applied_.Begin(client_id, sequence)) {
      case AppliedSequences::kApplied:
        duplicates_.fetch_add(1, std::memory_order_relaxed);
        return absl::OkStatus();
      case AppliedSequences::kInProgress:
        return absl::UnavailableError(absl::StrCat("push ", sequence, " of client ",
                                                   absl::Hex(client_id),
                                                   " is still being applied; retry"));
      case AppliedSequences::kNew:
        break;
    }
  }
  absl::Status status = apply();
  if (tracked) applied_.Finish(client_id, sequence);
  const uint64_t every = hooks_.drop_reply_after_apply_every_n;
  if (status.ok() && every > 0 &&
      (pushes_applied_.fetch_add(1, std::memory_order_relaxed) + 1) % every == 0) {
    replies_dropped_.fetch_add(1, std::memory_order_relaxed);
    return absl::UnavailableError("fault injection: the push was applied, its reply dropped");
  }
  return status;
}

grpc::Status ParameterServerService::InitParam(grpc::ServerContext*,
                                               const v1::InitParamRequest* request,
                                               v1::InitParamResponse*) {
  if (absl::Status s = CheckServing(); !s.ok()) return ToGrpcStatus(s);
  return ToGrpcStatus(store_->Init(request->parameter(), request->config()));
}

grpc::Status ParameterServerService::FinishInitParams(grpc::ServerContext*,
                                                      const v1::FinishInitParamsRequest*,
                                                      v1::FinishInitParamsResponse*) {
  if (absl::Status s = CheckServing(); !s.ok()) return ToGrpcStatus(s);
  store_->FinishInit();
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* ParameterServerService::GetParam(grpc::CallbackServerContext*,
                                                           const v1::GetParamRequest* request,
                                                           v1::GetParamResponse* response) {
  auto* reactor = new ReplyReactor(&reply_budget_);
  absl::Status status = CheckServing();
  if (status.ok() && !reply_budget_.Available()) status = reply_budget_.Exhausted(0);
  if (status.ok()) status = store_->Get(request->param(), response->mutable_parameter());
  if (status.ok()) status = reactor->Hold(response->ByteSizeLong());
  if (!status.ok()) response->Clear();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

namespace {

int64_t UnixNanos() { return absl::ToUnixNanos(absl::Now()); }

// Finishes a callback call on `reactor` with `status`, telling the client
// when it was received (`received`, Unix nanoseconds) and processed (now).
grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context,
                                 grpc::ServerUnaryReactor* reactor, const absl::Status& status,
                                 int64_t received) {
  v1::ServerTrace trace;
  trace.set_received_unix_nanos(received);
  trace.set_processed_unix_nanos(UnixNanos());
  context->AddTrailingMetadata(kServerTraceMetadataKey, trace.SerializeAsString());
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context, const absl::Status& status,
                                 int64_t received) {
  return Finish(context, context->DefaultReactor(), status, received);
}

// An empty message (SendGradsResponse) as a byte buffer.
grpc::ByteBuffer EmptyMessage() {
  grpc::Slice empty;
  return grpc::ByteBuffer(&empty, 1);
}

}  // namespace

absl::Status ParameterServerService::ReadParams(absl::Span<const v1::ParamRef> refs,
                                                grpc::ByteBuffer* response) {
  ParamsResponseBuilder builder;
  v1::Parameter header;
  for (const v1::ParamRef& ref : refs) {
    header.Clear();
    absl::Status status = store_->Read(ref, &header, [&](absl::string_view bytes) {
      builder.Add(header, bytes.size(), [&](char* dest) {
        if (!bytes.empty()) std::memcpy(dest, bytes.data(), bytes.size());
      });
    });
    if (!status.ok()) return status;
  }
  *response = builder.Finish();
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* ParameterServerService::GetParams(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* request,
                                                            grpc::ByteBuffer* response) {
  const int64_t received = UnixNanos();
  auto* reactor = new ReplyReactor(&reply_budget_);
  if (absl::Status s = CheckServing(); !s.ok()) return Finish(context, reactor, s, received);
  v1::GetParamsRequest parsed;
  grpc::ByteBuffer copy(*request);  // shares the slices
  if (!grpc::SerializationTraits<v1::GetParamsRequest>::Deserialize(&copy, &parsed).ok()) {
    store_->CountRejected();
    return Finish(context, reactor, absl::InvalidArgumentError("malformed GetParamsRequest"),
                  received);
  }
  if (!reply_budget_.Available()) {
    return Finish(context, reactor, reply_budget_.Exhausted(0), received);
  }
  // Moved, not copied, out of the parsed request.
  std::vector<v1::ParamRef> refs(std::make_move_iterator(parsed.mutable_params()->begin()),
                                 std::make_move_iterator(parsed.mutable_params()->end()));
  absl::Status status = ReadParams(refs, response);
  if (status.ok()) status = reactor->Hold(response->Length());
  if (!status.ok()) response->Clear();
  return Finish(context, reactor, status, received);
}

grpc::Status ParameterServerService::SendGrad(grpc::ServerContext*,
                                              const v1::SendGradRequest* request,
                                              v1::SendGradResponse*) {
  if (absl::Status s = CheckServing(); !s.ok()) return ToGrpcStatus(s);
  const v1::Gradient* grad = &request->gradient();
  return ToGrpcStatus(store_->ApplyGradients(absl::MakeConstSpan(&grad, 1)));
}

absl::Status ParameterServerService::DecodeAndApply(const grpc::ByteBuffer& request,
                                                    PushRequest* push) {
  absl::Status status = DecodePushRequest(request, push);
  if (!status.ok()) {
    store_->CountRejected();
    return status;
  }
  PS_RETURN_IF_ERROR(CheckServing());
  return ApplyOnce(push->client_id, push->sequence,
                   [&] { return store_->ApplyGradients(push->grads); });
}

grpc::ServerUnaryReactor* ParameterServerService::SendGrads(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* request,
                                                            grpc::ByteBuffer* response) {
  const int64_t received = UnixNanos();
  PushRequest push;
  absl::Status status = DecodeAndApply(*request, &push);
  if (status.ok()) *response = EmptyMessage();
  return Finish(context, status, received);
}

grpc::ServerUnaryReactor* ParameterServerService::PushPull(grpc::CallbackServerContext* context,
                                                           const grpc::ByteBuffer* request,
                                                           grpc::ByteBuffer* response) {
  const int64_t received = UnixNanos();
  auto* reactor = new ReplyReactor(&reply_budget_);
  PushRequest push;
  // Over the budget nothing is applied; the read is refused.
  absl::Status status =
      reply_budget_.Available() ? DecodeAndApply(*request, &push) : reply_budget_.Exhausted(0);
  if (status.ok()) status = ReadParams(push.refs, response);
  if (status.ok()) {
    if (absl::Status held = reactor->Hold(response->Length()); !held.ok()) {
      // Applied, but the reply does not fit: UNAVAILABLE while others hold
      // the room, which clients retry with the same sequence (not applied
      // again); RESOURCE_EXHAUSTED if it never can.
      status = absl::Status(
          held.code(),
          absl::StrCat("the push was applied but its reply does not fit: ", held.message()));
    }
  }
  if (!status.ok()) response->Clear();
  return Finish(context, reactor, status, received);
}

grpc::Status ParameterServerService::GetStats(grpc::ServerContext*, const v1::GetStatsRequest*,
                                              v1::GetStatsResponse* response) {
  v1::ServerStats* out = response->mutable_stats();
  store_->FillStats(out);
  out->set_index(index_.load(std::memory_order_relaxed));
  out->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - started_));
  out->set_duplicates_ignored(duplicates_.load(std::memory_order_relaxed));
  out->set_replies_dropped(replies_dropped_.load(std::memory_order_relaxed));
  out->set_checkpoint_sequence(checkpoint_sequence_.load(std::memory_order_relaxed));
  out->set_reply_bytes_in_flight(reply_budget_.held());
  out->set_reads_refused_for_memory(reply_budget_.refused());
  return grpc::Status::OK;
}

grpc::Status ParameterServerService::Save(grpc::ServerContext*, const v1::SaveRequest*,
                                          v1::SaveResponse* response) {
  if (absl::Status s = CheckServing(); !s.ok()) return ToGrpcStatus(s);
  if (!hooks_.save) {
    return ToGrpcStatus(absl::FailedPreconditionError(
        "this server has no checkpoint directory (--checkpoint_dir)"));
  }
  absl::StatusOr<v1::CheckpointRecord> record = hooks_.save();
  if (!record.ok()) return ToGrpcStatus(record.status());
  *response->mutable_checkpoint() = *std::move(record);
  return grpc::Status::OK;
}

grpc::Status ParameterServerService::ListWorkers(grpc::ServerContext*,
                                                 const v1::ListWorkersRequest*,
                                                 v1::ListWorkersResponse* response) {
  if (!hooks_.list_workers) {
    return ToGrpcStatus(
        absl::FailedPreconditionError("this server has no etcd (--etcd): no worker registry"));
  }
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = hooks_.list_workers();
  if (!workers.ok()) return ToGrpcStatus(workers.status());
  for (v1::WorkerInfo& w : *workers) *response->add_workers() = std::move(w);
  return grpc::Status::OK;
}

grpc::Status ParameterServerService::CreateTable(grpc::ServerContext*,
                                                 const v1::CreateTableRequest* request,
                                                 v1::CreateTableResponse*) {
  if (absl::Status s = CheckServing(); !s.ok()) return ToGrpcStatus(s);
  return ToGrpcStatus(tables_->Create(*request));
}

grpc::ServerUnaryReactor* ParameterServerService::StartWait(
    grpc::CallbackServerContext* context,
    const std::function<CancelWait(absl::Time, WaitDone)>& start) {
  auto* reactor = new WaitReactor();
  if (absl::Status s = CheckServing(); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  const absl::Time deadline = WaitDeadline(*context);
  reactor->Start([&](WaitDone done) { return start(deadline, std::move(done)); });
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::TablePull(grpc::CallbackServerContext* context,
                                                            const v1::TablePullRequest* request,
                                                            v1::TablePullResponse* response) {
  return StartWait(context, [&](absl::Time deadline, WaitDone done) {
    return tables_->PullAsync(*request, response, deadline, std::move(done));
  });
}

grpc::Status ParameterServerService::TablePush(grpc::ServerContext*,
                                               const v1::TablePushRequest* request,
                                               v1::TablePushResponse* response) {
  if (absl::Status s = CheckServing(); !s.ok()) return ToGrpcStatus(s);
  return ToGrpcStatus(ApplyOnce(request->client_id(), request->sequence(),
                                [&] { return tables_->Push(*request, response); }));
}

grpc::Status ParameterServerService::Clock(grpc::ServerContext*, const v1::ClockRequest* request,
                                           v1::ClockResponse* response) {
  if (absl::Status s = CheckServing(); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<int64_t> clock = tables_->Clock(*request);
  if (!clock.ok()) return ToGrpcStatus(clock.status());
  response->set_clock(*clock);
  return grpc::Status::OK;
}

grpc::Status ParameterServerService::TableStats(grpc::ServerContext*, const v1::TableStatsRequest*,
                                                v1::TableStatsResponse* response) {
  tables_->Stats(response);
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* ParameterServerService::Barrier(grpc::CallbackServerContext* context,
                                                          const v1::BarrierRequest* request,
                                                          v1::BarrierResponse*) {
  return StartWait(context, [&](absl::Time deadline, WaitDone done) {
    return tables_->BarrierAsync(*request, deadline, std::move(done));
  });
}

grpc::ServerUnaryReactor* ParameterServerService::AllReduce(grpc::CallbackServerContext* context,
                                                            const v1::AllReduceRequest* request,
                                                            v1::AllReduceResponse* response) {
  return StartWait(context, [&](absl::Time deadline, WaitDone done) {
    return tables_->AllReduceAsync(*request, response, deadline, std::move(done));
  });
}

grpc::ServerUnaryReactor* ParameterServerService::Broadcast(grpc::CallbackServerContext* context,
                                                            const v1::BroadcastRequest* request,
                                                            v1::BroadcastResponse* response) {
  return StartWait(context, [&](absl::Time deadline, WaitDone done) {
    return tables_->BroadcastAsync(*request, response, deadline, std::move(done));
  });
}

}  // namespace pserver
