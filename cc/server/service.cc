#include "cc/server/service.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/core/status_macros.h"
#include "cc/rpc/grpc_status.h"
#include "cc/rpc/wire.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace pserver {

ParameterServerService::ParameterServerService(ParameterStore* store, uint32_t index,
                                               ServiceHooks hooks)
    : store_(store), index_(index), hooks_(std::move(hooks)) {}

absl::Status ParameterServerService::CheckServing() const {
  if (serving_.load(std::memory_order_acquire)) return absl::OkStatus();
  return absl::UnavailableError(
      "pserver is starting: registering and loading its checkpoint; retry");
}

absl::Status ParameterServerService::ApplyOnce(const PushRequest& push) {
  absl::ReaderMutexLock lock(&apply_mu_);
  const bool tracked = push.client_id != 0 && push.sequence != 0;
  if (tracked) {
    switch (applied_.Begin(push.client_id, push.sequence)) {
      case AppliedSequences::kApplied:
        duplicates_.fetch_add(1, std::memory_order_relaxed);
        return absl::OkStatus();
      case AppliedSequences::kInProgress:
        return absl::UnavailableError(absl::StrCat(
            "push ", push.sequence, " of client ", absl::Hex(push.client_id),
            " is still being applied; retry"));
      case AppliedSequences::kNew:
        break;
    }
  }
  absl::Status status = store_->ApplyGradients(push.grads);
  if (tracked) applied_.Finish(push.client_id, push.sequence);
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

// Finishes a callback call with `status`.
grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context,
                                 const absl::Status& status) {
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
  if (absl::Status s = CheckServing(); !s.ok()) return Finish(context, s);
  v1::GetParamsRequest parsed;
  grpc::ByteBuffer copy(*request);  // shares the slices
  if (!grpc::SerializationTraits<v1::GetParamsRequest>::Deserialize(&copy, &parsed).ok()) {
    store_->CountRejected();
    return Finish(context, absl::InvalidArgumentError("malformed GetParamsRequest"));
  }
  std::vector<v1::ParamRef> refs(parsed.params().begin(), parsed.params().end());
  return Finish(context, ReadParams(refs, response));
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
  return ApplyOnce(*push);
}

grpc::ServerUnaryReactor* ParameterServerService::SendGrads(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* request,
                                                            grpc::ByteBuffer* response) {
  PushRequest push;
  absl::Status status = DecodeAndApply(*request, &push);
  if (status.ok()) *response = EmptyMessage();
  return Finish(context, status);
}

grpc::ServerUnaryReactor* ParameterServerService::PushPull(grpc::CallbackServerContext* context,
                                                           const grpc::ByteBuffer* request,
                                                           grpc::ByteBuffer* response) {
  PushRequest push;
  absl::Status status = DecodeAndApply(*request, &push);
  if (status.ok()) status = ReadParams(push.refs, response);
  return Finish(context, status);
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

}  // namespace pserver
