// ParameterServerService: the gRPC face of a ParameterStore. Each RPC checks
// and forwards its request to the store and maps the result onto gRPC codes;
// all lifecycle and validation rules live in the store.
//
//   ParameterStore store;
//   ParameterServerService service(&store, /*index=*/0);
//   builder.RegisterService(&service);
//
// Thread-safe, as the store is.
#ifndef PSERVER_CC_SERVER_SERVICE_H_
#define PSERVER_CC_SERVER_SERVICE_H_

#include <cstdint>

#include "absl/time/clock.h"
#include "cc/core/parameter_store.h"
#include "pserver/v1/service.grpc.pb.h"

namespace pserver {

class ParameterServerService final : public v1::ParameterServer::Service {
 public:
  // `store` must outlive the service.
  ParameterServerService(ParameterStore* store, uint32_t index);

  grpc::Status InitParam(grpc::ServerContext* context, const v1::InitParamRequest* request,
                         v1::InitParamResponse* response) override;
  grpc::Status FinishInitParams(grpc::ServerContext* context,
                                const v1::FinishInitParamsRequest* request,
                                v1::FinishInitParamsResponse* response) override;
  grpc::Status GetParam(grpc::ServerContext* context, const v1::GetParamRequest* request,
                        v1::GetParamResponse* response) override;
  grpc::Status GetParams(grpc::ServerContext* context, const v1::GetParamsRequest* request,
                         v1::GetParamsResponse* response) override;
  grpc::Status SendGrad(grpc::ServerContext* context, const v1::SendGradRequest* request,
                        v1::SendGradResponse* response) override;
  grpc::Status SendGrads(grpc::ServerContext* context, const v1::SendGradsRequest* request,
                         v1::SendGradsResponse* response) override;
  grpc::Status GetStats(grpc::ServerContext* context, const v1::GetStatsRequest* request,
                        v1::GetStatsResponse* response) override;

 private:
  ParameterStore* const store_;
  const uint32_t index_;
  const absl::Time started_ = absl::Now();
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_SERVICE_H_
