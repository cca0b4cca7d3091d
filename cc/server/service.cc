#include "cc/server/service.h"

#include <cstring>
#include <vector>

#include "cc/rpc/grpc_status.h"
#include "cc/rpc/wire.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace pserver {

ParameterServerService::ParameterServerService(ParameterStore* store, uint32_t index)
    : store_(store), index_(index) {}

grpc::Status ParameterServerService::InitParam(grpc::ServerContext*,
                                               const v1::InitParamRequest* request,
                                               v1::InitParamResponse*) {
  return ToGrpcStatus(store_->Init(request->parameter(), request->config()));
}

grpc::Status ParameterServerService::FinishInitParams(grpc::ServerContext*,
                                                      const v1::FinishInitParamsRequest*,
                                                      v1::FinishInitParamsResponse*) {
  store_->FinishInit();
  return grpc::Status::OK;
}

grpc::Status ParameterServerService::GetParam(grpc::ServerContext*,
                                              const v1::GetParamRequest* request,
                                              v1::GetParamResponse* response) {
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
  const v1::Gradient* grad = &request->gradient();
  return ToGrpcStatus(store_->ApplyGradients(absl::MakeConstSpan(&grad, 1)));
}

grpc::ServerUnaryReactor* ParameterServerService::SendGrads(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* request,
                                                            grpc::ByteBuffer* response) {
  PushRequest push;
  absl::Status status = DecodePushRequest(*request, &push);
  if (!status.ok()) {
    store_->CountRejected();
    return Finish(context, status);
  }
  status = store_->ApplyGradients(push.grads);
  if (status.ok()) *response = EmptyMessage();
  return Finish(context, status);
}

grpc::ServerUnaryReactor* ParameterServerService::PushPull(grpc::CallbackServerContext* context,
                                                           const grpc::ByteBuffer* request,
                                                           grpc::ByteBuffer* response) {
  PushRequest push;
  absl::Status status = DecodePushRequest(*request, &push);
  if (!status.ok()) {
    store_->CountRejected();
    return Finish(context, status);
  }
  status = store_->ApplyGradients(push.grads);
  if (status.ok()) status = ReadParams(push.refs, response);
  return Finish(context, status);
}

grpc::Status ParameterServerService::GetStats(grpc::ServerContext*, const v1::GetStatsRequest*,
                                              v1::GetStatsResponse* response) {
  v1::ServerStats* out = response->mutable_stats();
  store_->FillStats(out);
  out->set_index(index_);
  out->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - started_));
  return grpc::Status::OK;
}

}  // namespace pserver
