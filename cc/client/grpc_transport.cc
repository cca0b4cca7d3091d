#include "cc/client/grpc_transport.h"

#include <arpa/inet.h>

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cc/client/cancellation.h"
#include "cc/core/status_macros.h"
#include "cc/rpc/grpc_status.h"
#include "cc/rpc/wire.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/proto_utils.h"

namespace pserver {
namespace {

constexpr char kMethodPrefix[] = "/pserver.v1.ParameterServer/";

std::unique_ptr<grpc::ClientContext> NewContext(absl::Time deadline, bool wait_for_ready) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(deadline));
  // Wait for a connection (within the deadline) instead of failing at once
  // while a server is still starting.
  context->set_wait_for_ready(wait_for_ready);
  return context;
}

// Cancels `context` when the call running on this thread is cancelled
// (cancellation.h). The callback holds the context: it may run after the
// call's completion let go of it.
std::shared_ptr<Cancellation::Registration> CancelWithCall(
    std::shared_ptr<grpc::ClientContext> context) {
  Cancellation* cancel = Cancellation::Current();
  if (cancel == nullptr) return nullptr;
  return std::make_shared<Cancellation::Registration>(
      cancel->OnCancel([context = std::move(context)] { context->TryCancel(); }));
}

absl::Status DeliverBlocks(const grpc::ByteBuffer& response, const Transport::BlockSink& sink) {
  ParamsResponse decoded;
  PS_RETURN_IF_ERROR(DecodeParamsResponse(response, &decoded));
  for (size_t i = 0; i < decoded.headers.size(); ++i) {
    PS_RETURN_IF_ERROR(sink(decoded.headers[i], decoded.contents[i]));
  }
  return absl::OkStatus();
}

// Hands the server's times (trailing metadata of the bulk calls) to `trace`.
void RecordServerTrace(const grpc::ClientContext& context, TraceRecorder& trace) {
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find(kServerTraceMetadataKey);
  if (it == trailers.end()) return;
  v1::ServerTrace server;
  if (server.ParseFromArray(it->second.data(), static_cast<int>(it->second.size()))) {
    trace.Server(server);
  }
}

// "" when `host` is an IPv4 address or a DNS name; what is wrong otherwise.
std::string HostProblem(absl::string_view host) {
  if (host.empty()) return "has no host before ':'";
  if (absl::StrContains(host, ':')) return "is an IPv6 address without brackets: write [host]:port";
  if (host.size() > 253) return "has a host name longer than 253 characters";
  const bool numeric = host.find_first_not_of("0123456789.") == absl::string_view::npos;
  if (numeric) {
    in_addr ip;
    const std::string copy(host);
    return inet_pton(AF_INET, copy.c_str(), &ip) == 1 ? "" : "has a malformed IPv4 address";
  }
  if (host.back() == '.') host.remove_suffix(1);  // a fully qualified name
  for (absl::string_view label : absl::StrSplit(host, '.')) {
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') {
      return absl::StrCat("has a malformed host name ('", label,
                          "' is not a label of 1-63 characters)");
    }
    for (char c : label) {
      if (!absl::ascii_isalnum(c) && c != '-' && c != '_') {
        return absl::StrCat("has a host name with '", std::string(1, c),
                            "' (letters, digits, '-', '_' and '.' only)");
      }
    }
  }
  return "";
}

// "" when `port` is a number in 1-65535; what is wrong otherwise.
std::string PortProblem(absl::string_view port) {
  int number = 0;
  if (port.empty()) return "has no port after ':'";
  if (port.size() > 5 || port.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(port, &number) || number < 1 || number > 65535) {
    return absl::StrCat("has port '", port, "', not a number in 1-65535");
  }
  return "";
}

// "" when gRPC can dial `address`; what is wrong otherwise.
std::string AddressProblem(absl::string_view address) {
  if (address.empty()) return "is empty";
  if (absl::StartsWith(address, "unix:")) {
    return address.size() > 5 ? "" : "names no socket path after 'unix:'";
  }
  if (absl::StrContains(address, "://")) return "is a URL: give host:port";
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    if (close == absl::string_view::npos) return "has '[' without ']'";
    const std::string ip(address.substr(1, close - 1));
    in6_addr ip6;
    if (inet_pton(AF_INET6, ip.c_str(), &ip6) != 1) {
      return absl::StrCat("has '", ip, "' in brackets, not an IPv6 address");
    }
    if (close + 1 >= address.size() || address[close + 1] != ':') {
      return "has no ':port' after ']'";
    }
    return PortProblem(address.substr(close + 2));
  }
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return "is not host:port (no ':port')";
  std::string problem = HostProblem(address.substr(0, colon));
  if (problem.empty()) problem = PortProblem(address.substr(colon + 1));
  return problem;
}

// The call's status; when it never reached the server, why (UnreachableCause)
// rides along as a payload. Runs while the call's context still holds the
// channel.
absl::Status CallStatus(const grpc::Status& status, grpc::Channel& channel, bool tls) {
  absl::Status out = FromGrpcStatus(status);
  if (out.ok()) return out;
  std::string cause = UnreachableCause(status, channel.GetState(/*try_to_connect=*/false));
  // A TLS cause says more than gRPC's words; a plaintext client hung up on
  // is told the server may want TLS.
  if (!cause.empty()) {
    const std::string tls_cause = DescribeTlsFailure(status.error_message(), tls);
    if (!tls_cause.empty()) {
      cause = tls ? absl::StrCat(tls_cause, " (", status.error_message(), ")")
                  : absl::StrCat(cause, "; ", tls_cause);
    }
  }
  if (!cause.empty()) out.SetPayload(kUnreachableCausePayload, absl::Cord(cause));
  return out;
}

// One raw call in flight.
struct RawCall {
  std::shared_ptr<grpc::ClientContext> context;
  std::shared_ptr<Cancellation::Registration> cancel;
  std::shared_ptr<const void> abandonment;              // outlives `abandon` (after it)
  std::shared_ptr<Cancellation::Registration> abandon;  // GrpcTransport::Abandon's
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
  std::string method;
  std::function<absl::Status(const grpc::ByteBuffer&)> receive;
  Transport::Done done;
  absl::Status status;
};

}  // namespace

absl::Status ValidateServerAddress(absl::string_view address) {
  const std::string problem = AddressProblem(address);
  if (problem.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("address '", address, "' ", problem));
}

std::string UnreachableCauseOf(const absl::Status& status) {
  auto cause = status.GetPayload(kUnreachableCausePayload);
  return cause.has_value() ? std::string(*cause) : std::string();
}

GrpcTransport::GrpcTransport(std::string address, std::vector<Channel> channels,
                             bool wait_for_ready)
    : address_(std::move(address)),
      channels_(std::move(channels)),
      wait_for_ready_(wait_for_ready) {}

absl::StatusOr<std::unique_ptr<GrpcTransport>> GrpcTransport::Create(const std::string& address,
                                                                     int channels,
                                                                     bool wait_for_ready,
                                                                     const TlsOptions& tls) {
  PS_RETURN_IF_ERROR(ValidateServerAddress(address));
  PS_RETURN_IF_ERROR(CheckTlsOptions(tls));
  const std::shared_ptr<grpc::ChannelCredentials> credentials = MakeChannelCredentials(tls);
  grpc::ChannelArguments arguments = DefaultChannelArguments();
  AddTlsChannelArguments(tls, &arguments);
  if (channels < 1) {
    return absl::InvalidArgumentError("a transport needs at least one channel");
  }
  std::vector<Channel> made;
  for (int i = 0; i < channels; ++i) {
    Channel c;
    c.channel = grpc::CreateCustomChannel(address, credentials, arguments);
    c.generic = std::make_unique<grpc::GenericStub>(c.channel);
    made.push_back(std::move(c));
  }
  auto transport = std::unique_ptr<GrpcTransport>(
      new GrpcTransport(address, std::move(made), wait_for_ready));
  transport->tls_ = tls.enabled();
  return transport;
}

GrpcTransport::Channel& GrpcTransport::Next() {
  Channel& next = channels_[next_.fetch_add(1, std::memory_order_relaxed) % channels_.size()];
  // A channel that failed to connect waits out gRPC's reconnect backoff (up
  // to two minutes) before it tries again, failing calls at once meanwhile.
  // The client's retry loop paces its own attempts, so try again now: a
  // server that came up is reached on the next attempt.
  if (next.channel->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_TRANSIENT_FAILURE) {
    grpc::experimental::ChannelResetConnectionBackoff(next.channel.get());
  }
  return next;
}

void GrpcTransport::CallRaw(absl::string_view method,
                            const std::function<grpc::ByteBuffer(PayloadLease*)>& encode,
                            Receive receive, absl::Time deadline, Done done, TraceRecorder* trace) {
  if (std::optional<absl::Status> why = abandonment_->Why()) {
    done(*why);
    return;
  }
  auto call = std::make_shared<RawCall>();
  // A full path ("/grpc.health.v1.Health/Check") names another service.
  call->method =
      absl::StartsWith(method, "/") ? std::string(method) : absl::StrCat(kMethodPrefix, method);
  call->context = NewContext(deadline, wait_for_ready_);
  for (const auto& [key, value] : metadata_) call->context->AddMetadata(key, value);
  call->cancel = CancelWithCall(call->context);
  // Abandoned after the check above: the context is cancelled now (gRPC
  // cancels a call whose context was cancelled before it started).
  call->abandonment = abandonment_;
  call->abandon = std::make_shared<Cancellation::Registration>(
      abandonment_->cancel.OnCancel([context = call->context] { context->TryCancel(); }));
  call->receive = std::move(receive);
  call->done = std::move(done);
  // Reports once the call is over (the owner's release) and every borrowed
  // payload slice is free.
  PayloadLease* lease = PayloadLease::Create([call] { call->done(call->status); });
  call->request = encode(lease);
  Channel& channel = Next();
  channel.generic->UnaryCall(
      call->context.get(), call->method, grpc::StubOptions(), &call->request, &call->response,
      [call, lease, trace, channel = channel.channel.get(), tls = tls_,
       abandonment = abandonment_.get()](grpc::Status status) {
        call->status = CallStatus(status, *channel, tls);
        if (absl::IsCancelled(call->status)) {
          // Cancelled by Abandon (or by the caller too: it checks its own).
          if (std::optional<absl::Status> why = abandonment->Why()) call->status = *why;
        }
        if (trace != nullptr) RecordServerTrace(*call->context, *trace);
        if (call->status.ok() && call->receive) call->status = call->receive(call->response);
        // Let go of what gRPC may still reference before reporting: if the
        // caller then destroys the client, the channel's last reference must
        // not die on this gRPC thread.
        call->cancel.reset();
        call->abandon.reset();
        call->abandonment.reset();
        call->context.reset();
        call->request.Clear();
        call->response.Clear();
        lease->Release();
      });
}

void GrpcTransport::Abandon(const absl::Status& why) {
  {
    absl::MutexLock lock(&abandonment_->mu);
    if (abandonment_->why.has_value()) return;
    abandonment_->why = why;
  }
  abandonment_->cancel.Cancel();
}

namespace {

// Reads the blocks of a GetParamsResponse into `sink`.
std::function<absl::Status(const grpc::ByteBuffer&)> BlocksInto(Transport::BlockSink sink) {
  return [sink = std::move(sink)](const grpc::ByteBuffer& response) {
    return DeliverBlocks(response, sink);
  };
}

grpc::ByteBuffer Serialize(const google::protobuf::Message& message) {
  grpc::ByteBuffer buffer;
  bool own_buffer = false;
  grpc::SerializationTraits<google::protobuf::Message>::Serialize(message, &buffer, &own_buffer);
  return buffer;
}

}  // namespace

void GrpcTransport::Call(absl::string_view method, const google::protobuf::Message& request,
                         google::protobuf::Message* response, absl::Time deadline, Done done) {
  CallRaw(
      method, [&request](PayloadLease*) { return Serialize(request); },
      [response, method = std::string(method)](const grpc::ByteBuffer& reply) {
        grpc::ByteBuffer copy(reply);  // shares the slices
        if (!grpc::SerializationTraits<google::protobuf::Message>::Deserialize(&copy, response)
                 .ok()) {
          return absl::InternalError(absl::StrCat("malformed reply to ", method, ": not a ",
                                                  response->GetDescriptor()->full_name()));
        }
        return absl::OkStatus();
      },
      deadline, std::move(done), nullptr);
}

void GrpcTransport::Push(const RequestId& id, absl::Span<const GradientView> grads,
                         absl::Time deadline, Done done, TraceRecorder* trace) {
  CallRaw(
      "SendGrads",
      [grads, id](PayloadLease* lease) {
        return EncodePushRequest(grads, {}, lease, id.client, id.sequence);
      },
      nullptr, deadline, std::move(done), trace);
}

void GrpcTransport::PushPull(const RequestId& id, absl::Span<const GradientView> grads,
                             absl::Span<const v1::ParamRef> refs, BlockSink sink,
                             absl::Time deadline, Done done, TraceRecorder* trace) {
  CallRaw(
      "PushPull",
      [grads, refs, id](PayloadLease* lease) {
        return EncodePushRequest(grads, refs, lease, id.client, id.sequence);
      },
      BlocksInto(std::move(sink)), deadline, std::move(done), trace);
}

void GrpcTransport::Pull(absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time deadline,
                         Done done, TraceRecorder* trace) {
  CallRaw(
      "GetParams",
      [refs](PayloadLease*) {
        v1::GetParamsRequest request;
        for (const v1::ParamRef& ref : refs) *request.add_params() = ref;
        return Serialize(request);
      },
      BlocksInto(std::move(sink)), deadline, std::move(done), trace);
}

}  // namespace pserver
