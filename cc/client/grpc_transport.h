// GrpcTransport: a Transport over one gRPC channel to one server, using the
// callback (non-blocking) stub so many calls fly at once without threads.
//
//   auto transport = GrpcTransport::Create("127.0.0.1:7000");
//
// Thread-safe.
#ifndef PSERVER_CC_CLIENT_GRPC_TRANSPORT_H_
#define PSERVER_CC_CLIENT_GRPC_TRANSPORT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cc/client/transport.h"
#include "pserver/v1/service.grpc.pb.h"

namespace pserver {

class GrpcTransport final : public Transport {
 public:
  // Does not connect yet (gRPC connects on the first call); INVALID_ARGUMENT
  // for an empty address.
  static absl::StatusOr<std::unique_ptr<GrpcTransport>> Create(const std::string& address);

  const std::string& address() const override { return address_; }

  void InitParam(const v1::InitParamRequest& request, v1::InitParamResponse* response,
                 absl::Time deadline, Done done) override;
  void FinishInitParams(const v1::FinishInitParamsRequest& request,
                        v1::FinishInitParamsResponse* response, absl::Time deadline,
                        Done done) override;
  void GetParams(const v1::GetParamsRequest& request, v1::GetParamsResponse* response,
                 absl::Time deadline, Done done) override;
  void SendGrads(const v1::SendGradsRequest& request, v1::SendGradsResponse* response,
                 absl::Time deadline, Done done) override;
  void GetStats(const v1::GetStatsRequest& request, v1::GetStatsResponse* response,
                absl::Time deadline, Done done) override;

 private:
  GrpcTransport(std::string address, std::shared_ptr<grpc::Channel> channel);

  template <typename Request, typename Response>
  using AsyncMethod = void (v1::ParameterServer::Stub::async::*)(
      grpc::ClientContext*, const Request*, Response*, std::function<void(grpc::Status)>);
  template <typename T>
  struct NonDeduced {
    using type = T;
  };

  // Starts `method` on the async stub with a deadline; `done` gets the status.
  template <typename Request, typename Response>
  void Call(typename NonDeduced<AsyncMethod<Request, Response>>::type method,
            const Request& request, Response* response, absl::Time deadline, Done done);

  const std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
};

}  // namespace pserver

#endif  // PSERVER_CC_CLIENT_GRPC_TRANSPORT_H_
