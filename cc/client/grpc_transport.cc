#include "cc/client/grpc_transport.h"

#include "cc/rpc/grpc_status.h"
#include "grpcpp/grpcpp.h"

namespace pserver {

GrpcTransport::GrpcTransport(std::string address, std::shared_ptr<grpc::Channel> channel)
    : address_(std::move(address)),
      channel_(std::move(channel)),
      stub_(v1::ParameterServer::NewStub(channel_)) {}

absl::StatusOr<std::unique_ptr<GrpcTransport>> GrpcTransport::Create(const std::string& address) {
  if (address.empty()) return absl::InvalidArgumentError("server address is empty");
  auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                           DefaultChannelArguments());
  return std::unique_ptr<GrpcTransport>(new GrpcTransport(address, std::move(channel)));
}

template <typename Request, typename Response>
void GrpcTransport::Call(typename NonDeduced<AsyncMethod<Request, Response>>::type method,
                         const Request& request, Response* response, absl::Time deadline,
                         Done done) {
  // The context must outlive the call; the completion callback owns it.
  auto context = std::make_shared<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(deadline));
  // Wait for a connection (within the deadline) instead of failing at once
  // while a server is still starting.
  context->set_wait_for_ready(true);
  (stub_->async()->*method)(context.get(), &request, response,
                            [context, done = std::move(done)](grpc::Status status) mutable {
                              // Free the context before `done` lets the caller
                              // go on: it holds a reference to the channel, and
                              // if the caller then destroys this transport, the
                              // channel's last reference must not drop here, on
                              // gRPC's callback thread (~Channel shuts down the
                              // callback queue this thread runs on: abort).
                              context.reset();
                              done(FromGrpcStatus(status));
                            });
}

void GrpcTransport::InitParam(const v1::InitParamRequest& request,
                              v1::InitParamResponse* response, absl::Time deadline, Done done) {
  Call(&v1::ParameterServer::Stub::async::InitParam, request, response, deadline,
       std::move(done));
}

void GrpcTransport::FinishInitParams(const v1::FinishInitParamsRequest& request,
                                     v1::FinishInitParamsResponse* response,
                                     absl::Time deadline, Done done) {
  Call(&v1::ParameterServer::Stub::async::FinishInitParams, request, response, deadline,
       std::move(done));
}

void GrpcTransport::GetParams(const v1::GetParamsRequest& request,
                              v1::GetParamsResponse* response, absl::Time deadline, Done done) {
  Call(&v1::ParameterServer::Stub::async::GetParams, request, response, deadline,
       std::move(done));
}

void GrpcTransport::SendGrads(const v1::SendGradsRequest& request,
                              v1::SendGradsResponse* response, absl::Time deadline, Done done) {
  Call(&v1::ParameterServer::Stub::async::SendGrads, request, response, deadline,
       std::move(done));
}

void GrpcTransport::GetStats(const v1::GetStatsRequest& request, v1::GetStatsResponse* response,
                             absl::Time deadline, Done done) {
  Call(&v1::ParameterServer::Stub::async::GetStats, request, response, deadline,
       std::move(done));
}

}  // namespace pserver
