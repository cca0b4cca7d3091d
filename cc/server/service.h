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

// The bulk methods are raw callback methods: they read and write gRPC byte
// buffers through cc/rpc/wire.h, so tensor bytes are never copied through
// protobuf messages. The control methods stay synchronous.
using ServiceBase = v1::ParameterServer::WithRawCallbackMethod_GetParams<
    v1::ParameterServer::WithRawCallbackMethod_SendGrads<
        v1::ParameterServer::WithRawCallbackMethod_PushPull<v1::ParameterServer::Service>>>;

class ParameterServerService final : public ServiceBase {
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
  grpc::ServerUnaryReactor* GetParams(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::Status SendGrad(grpc::ServerContext* context, const v1::SendGradRequest* request,
                        v1::SendGradResponse* response) override;
  grpc::ServerUnaryReactor* SendGrads(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* PushPull(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::Status GetStats(grpc::ServerContext* context, const v1::GetStatsRequest* request,
                        v1::GetStatsResponse* response) override;

 private:
  // Reads `refs` into a GetParamsResponse; nothing is returned on any error.
  absl::Status ReadParams(absl::Span<const v1::ParamRef> refs, grpc::ByteBuffer* response);

  ParameterStore* const store_;
  const uint32_t index_;
  const absl::Time started_ = absl::Now();
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_SERVICE_H_
