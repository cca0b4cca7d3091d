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
absl::Time WaitDeadline(const grpc::ServerContext& context) {
  const absl::Time now = absl::Now();
  const absl::Time deadline =
      std::min(absl::FromChrono(context.deadline()), now + ParameterServerService::kMaxWait);
  return deadline - std::min(absl::Milliseconds(100), (deadline - now) / 5);
}

}  // namespace

ParameterServerService::ParameterServerService(ParameterStore* store, Tables* tables,
                                               uint32_t index, ServiceHooks hooks)
    : store_(store), tables_(tables), index_(index), hooks_(std::move(hooks)) {}

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

grpc::Status ParameterServerService::GetParam(grpc::ServerContext*,
                                              const v1::GetParamRequest* request,
                                              v1::GetParamResponse* response) {
  if (absl::Status s = CheckServing(); !s.ok()) return ToGrpcStatus(s);
  return ToGrpcStatus(store_->Get(request->param(), response->mutable_parameter()));
}

namespace {

int64_t UnixNanos() { return absl::ToUnixNanos(absl::Now()); }

// Finishes a callback call with `status`, telling the client when it was
// received (`received`, Unix nanoseconds) and processed (now).
grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context, const absl::Status& status,
                                 int64_t received) {
  v1::ServerTrace trace;
  trace.set_received_unix_nanos(received);
  trace.set_processed_unix_nanos(UnixNanos());
  context->AddTrailingMetadata(kServerTraceMetadataKey, trace.SerializeAsString());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
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
  if (absl::Status s = CheckServing(); !s.ok()) return Finish(context, s, received);
  v1::GetParamsRequest parsed;
  grpc::ByteBuffer copy(*request);  // shares the slices
  if (!grpc::SerializationTraits<v1::GetParamsRequest>::Deserialize(&copy, &parsed).ok()) {
    store_->CountRejected();
    return Finish(context, absl::InvalidArgumentError("malformed GetParamsRequest"), received);
  }
  // Moved, not copied, out of the parsed request.
  std::vector<v1::ParamRef> refs(std::make_move_iterator(parsed.mutable_params()->begin()),
                                 std::make_move_iterator(parsed.mutable_params()->end()));
  return Finish(context, ReadParams(refs, response), received);
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
  PushRequest push;
  absl::Status status = DecodeAndApply(*request, &push);
  if (status.ok()) status = ReadParams(push.refs, response);
  return Finish(context, status, received);
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

grpc::Status ParameterServerService::TablePull(grpc::ServerContext* context,
                                               const v1::TablePullRequest* request,
                                               v1::TablePullResponse* response) {
  if (absl::Status s = CheckServing(); !s.ok()) return ToGrpcStatus(s);
  return ToGrpcStatus(tables_->Pull(*request, response, WaitDeadline(*context)));
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

grpc::Status ParameterServerService::Barrier(grpc::ServerContext* context,
                                             const v1::BarrierRequest* request,
                                             v1::BarrierResponse*) {
  if (absl::Status s = CheckServing(); !s.ok()) return ToGrpcStatus(s);
  return ToGrpcStatus(tables_->Barrier(*request, WaitDeadline(*context)));
}

grpc::Status ParameterServerService::AllReduce(grpc::ServerContext* context,
                                               const v1::AllReduceRequest* request,
                                               v1::AllReduceResponse* response) {
  if (absl::Status s = CheckServing(); !s.ok()) return ToGrpcStatus(s);
  return ToGrpcStatus(tables_->AllReduce(*request, response, WaitDeadline(*context)));
}

grpc::Status ParameterServerService::Broadcast(grpc::ServerContext* context,
                                               const v1::BroadcastRequest* request,
                                               v1::BroadcastResponse* response) {
  if (absl::Status s = CheckServing(); !s.ok()) return ToGrpcStatus(s);
  return ToGrpcStatus(tables_->Broadcast(*request, response, WaitDeadline(*context)));
}

}  // namespace pserver
