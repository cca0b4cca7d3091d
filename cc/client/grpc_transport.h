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
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "cc/client/cancellation.h"
#include "cc/client/transport.h"
#include "cc/security/tls.h"
#include "grpcpp/generic/generic_stub.h"

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
  // With `tls` enabled (checked by CheckTlsOptions) the channels speak mutual
  // TLS (cc/security/tls.h).
  static absl::StatusOr<std::unique_ptr<GrpcTransport>> Create(const std::string& address,
                                                               int channels = 1,
                                                               bool wait_for_ready = true,
                                                               const TlsOptions& tls = {});

  const std::string& address() const override { return address_; }

  // Metadata sent with every call (a bearer token, the instance etcd
  // named). Set before the first call.
  using CallMetadata = std::vector<std::pair<std::string, std::string>>;
  void SetCallMetadata(CallMetadata metadata) { metadata_ = std::move(metadata); }

  void Call(absl::string_view method, const google::protobuf::Message& request,
            google::protobuf::Message* response, absl::Time deadline, Done done) override;
  void Push(const RequestId& id, absl::Span<const GradientView> grads, absl::Time deadline,
            Done done, TraceRecorder* trace = nullptr) override;
  void Pull(absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time deadline, Done done,
            TraceRecorder* trace = nullptr) override;
  void PushPull(const RequestId& id, absl::Span<const GradientView> grads,
                absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time deadline, Done done,
                TraceRecorder* trace = nullptr) override;
  // Cancels every call in flight (they end with `why`, not CANCELLED) and
  // fails every later one at once with it.
  void Abandon(const absl::Status& why) override;

 private:
  struct Channel {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<grpc::GenericStub> generic;
  };
  // Reads a reply's bytes into what the caller asked for.
  using Receive = std::function<absl::Status(const grpc::ByteBuffer& response)>;

  GrpcTransport(std::string address, std::vector<Channel> channels, bool wait_for_ready);
  Channel& Next();

  // Sends the request `encode` builds (borrowing payloads through the lease
  // it is given) to `method` (the short name) through the generic stub;
  // `receive` (if set) reads the reply. `done` runs once the call is over
  // and gRPC has let go of every borrowed payload.
  void CallRaw(absl::string_view method,
               const std::function<grpc::ByteBuffer(class PayloadLease*)>& encode, Receive receive,
               absl::Time deadline, Done done, TraceRecorder* trace);

  const std::string address_;
  std::vector<Channel> channels_;
  std::atomic<size_t> next_{0};
  const bool wait_for_ready_;
  bool tls_ = false;  // its channels speak TLS: failures are described as such
  CallMetadata metadata_;
  // Abandon's: shared with the calls in flight, which may outlive the
  // transport.
  struct Abandonment {
    Cancellation cancel;  // cancelled by Abandon; every call registers with it
    mutable absl::Mutex mu;
    std::optional<absl::Status> why ABSL_GUARDED_BY(mu);
    // Why the transport was abandoned; none while it is not.
    std::optional<absl::Status> Why() const {
      absl::MutexLock lock(&mu);
      return why;
    }
  };
  const std::shared_ptr<Abandonment> abandonment_ = std::make_shared<Abandonment>();
};

}  // namespace pserver

#endif  // PSERVER_CC_CLIENT_GRPC_TRANSPORT_H_
