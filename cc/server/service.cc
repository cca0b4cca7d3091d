#include "cc/server/service.h"

#include <vector>

#include "cc/rpc/grpc_status.h"

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

grpc::Status ParameterServerService::GetParams(grpc::ServerContext*,
                                               const v1::GetParamsRequest* request,
                                               v1::GetParamsResponse* response) {
  response->mutable_parameters()->Reserve(request->params_size());
  for (const v1::ParamRef& ref : request->params()) {
    absl::Status status = store_->Get(ref, response->add_parameters());
    if (!status.ok()) {
      response->Clear();
      return ToGrpcStatus(status);
    }
  }
  return grpc::Status::OK;
}

grpc::Status ParameterServerService::SendGrad(grpc::ServerContext*,
                                              const v1::SendGradRequest* request,
                                              v1::SendGradResponse*) {
  const v1::Gradient* grad = &request->gradient();
  return ToGrpcStatus(store_->ApplyGradients(absl::MakeConstSpan(&grad, 1)));
}

grpc::Status ParameterServerService::SendGrads(grpc::ServerContext*,
                                               const v1::SendGradsRequest* request,
                                               v1::SendGradsResponse*) {
  std::vector<const v1::Gradient*> grads;
  grads.reserve(request->gradients_size());
  for (const v1::Gradient& grad : request->gradients()) grads.push_back(&grad);
  return ToGrpcStatus(store_->ApplyGradients(grads));
}

grpc::Status ParameterServerService::GetStats(grpc::ServerContext*, const v1::GetStatsRequest*,
                                              v1::GetStatsResponse* response) {
  ParameterStore::Stats stats = store_->GetStats();
  v1::ServerStats* out = response->mutable_stats();
  out->set_index(index_);
  out->set_initialized(stats.initialized);
  out->set_parameters(stats.blocks);
  out->set_parameter_bytes(stats.parameter_bytes);
  out->set_optimizer_state_bytes(stats.optimizer_state_bytes);
  out->set_gradients_applied(stats.gradients_applied);
  out->set_gets_served(stats.gets_served);
  out->set_requests_rejected(stats.requests_rejected);
  out->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - started_));
  return grpc::Status::OK;
}

}  // namespace pserver
