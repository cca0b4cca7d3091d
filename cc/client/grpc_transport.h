// GrpcTransport: a Transport over gRPC to one server. Bulk calls go through
// the generic (byte buffer) stub with the zero-copy encoders of
// cc/rpc/wire.h: gradients are sent straight from the caller's memory and
// pulled blocks are handed to the sink in the slices they arrived in. Calls
// are spread round-robin over several channels (TCP connections).
//
//   auto transport = GrpcTransport::Create("127.0.0.1:7000", /*channels=*/2);
//
// Thread-safe.
#ifndef PSERVER_CC_CLIENT_GRPC_TRANSPORT_H_
#define PSERVER_CC_CLIENT_GRPC_TRANSPORT_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cc/client/transport.h"
#include "grpcpp/generic/generic_stub.h"
#include "pserver/v1/service.grpc.pb.h"

namespace pserver {

// OK when gRPC can dial `address` as a server: "host:port" (a DNS name or an
// IPv4 address), "[IPv6]:port", or "unix:/path/to/socket". Otherwise
// INVALID_ARGUMENT naming the address and what is wrong with it.
absl::Status ValidateServerAddress(absl::string_view address);

// A failed call's status carries, under this payload, why it never reached
// its server (cc/rpc/grpc_status.h UnreachableCause), when that is so.
inline constexpr char kUnreachableCausePayload[] = "type.pserver.dev/unreachable-cause";
// That cause, or empty.
std::string UnreachableCauseOf(const absl::Status& status);

class GrpcTransport final : public Transport {
 public:
  // Does not connect yet (gRPC connects on the first call). INVALID_ARGUMENT
  // for a malformed address (ValidateServerAddress) or fewer than one
  // channel. With `wait_for_ready` a call waits (within its deadline) for the
  // server to be reachable; without, a call to an unreachable server fails at
  // once with UNAVAILABLE and the cause (UnreachableCauseOf), which Client's
  // retry loop retries, on the new address when the server moved (etcd).
  static absl::StatusOr<std::unique_ptr<GrpcTransport>> Create(const std::string& address,
                                                               int channels = 1,
                                                               bool wait_for_ready = true);

  const std::string& address() const override { return address_; }

  void InitParam(const v1::InitParamRequest& request, absl::Time deadline, Done done) override;
  void FinishInitParams(absl::Time deadline, Done done) override;
  void GetStats(v1::GetStatsResponse* response, absl::Time deadline, Done done) override;
  void Push(absl::Span<const GradientView> grads, absl::Time deadline, Done done,
            TraceRecorder* trace = nullptr) override;
  void Pull(absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time deadline, Done done,
            TraceRecorder* trace = nullptr) override;
  void PushPull(absl::Span<const GradientView> grads, absl::Span<const v1::ParamRef> refs,
                BlockSink sink, absl::Time deadline, Done done,
                TraceRecorder* trace = nullptr) override;
  void CreateTable(const v1::CreateTableRequest& request, v1::CreateTableResponse* response,
                   absl::Time deadline, Done done) override;
  void TablePull(const v1::TablePullRequest& request, v1::TablePullResponse* response,
                 absl::Time deadline, Done done) override;
  void TablePush(const v1::TablePushRequest& request, v1::TablePushResponse* response,
                 absl::Time deadline, Done done) override;
  void Clock(const v1::ClockRequest& request, v1::ClockResponse* response, absl::Time deadline,
             Done done) override;
  void TableStats(const v1::TableStatsRequest& request, v1::TableStatsResponse* response,
                  absl::Time deadline, Done done) override;
  void Barrier(const v1::BarrierRequest& request, v1::BarrierResponse* response,
               absl::Time deadline, Done done) override;
  void AllReduce(const v1::AllReduceRequest& request, v1::AllReduceResponse* response,
                 absl::Time deadline, Done done) override;
  void Broadcast(const v1::BroadcastRequest& request, v1::BroadcastResponse* response,
                 absl::Time deadline, Done done) override;
  void PushWithId(const RequestId& id, absl::Span<const GradientView> grads, absl::Time deadline,
                  Done done, TraceRecorder* trace = nullptr) override;
  void PushPullWithId(const RequestId& id, absl::Span<const GradientView> grads,
                      absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time deadline,
                      Done done, TraceRecorder* trace = nullptr) override;

 private:
  struct Channel {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::ParameterServer::Stub> stub;
    std::unique_ptr<grpc::GenericStub> generic;
  };

  GrpcTransport(std::string address, std::vector<Channel> channels, bool wait_for_ready);
  Channel& Next();

  // Sends the request `encode` builds (borrowing payloads through the lease
  // it is given) to `method` through the generic stub; `sink` (if set) gets
  // the blocks of the reply. `done` runs once the call is over and gRPC has
  // let go of every borrowed payload.
  void CallRaw(const char* method,
               const std::function<grpc::ByteBuffer(class PayloadLease*)>& encode, BlockSink sink,
               absl::Time deadline, Done done, TraceRecorder* trace);

  template <typename Request, typename Response>
  using AsyncMethod = void (v1::ParameterServer::Stub::async::*)(grpc::ClientContext*,
                                                                 const Request*, Response*,
                                                                 std::function<void(grpc::Status)>);
  template <typename T>
  struct NonDeduced {
    using type = T;
  };
  // Starts a protobuf `method` on the async stub with a deadline.
  template <typename Request, typename Response>
  void Call(typename NonDeduced<AsyncMethod<Request, Response>>::type method,
            const Request& request, Response* response, absl::Time deadline, Done done);

  const std::string address_;
  std::vector<Channel> channels_;
  std::atomic<size_t> next_{0};
  const bool wait_for_ready_;
};

}  // namespace pserver

#endif  // PSERVER_CC_CLIENT_GRPC_TRANSPORT_H_
