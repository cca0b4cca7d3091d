#include "cc/client/grpc_transport.h"

#include <utility>

#include "cc/client/cancellation.h"
#include "cc/core/status_macros.h"
#include "cc/rpc/grpc_status.h"
#include "cc/rpc/wire.h"
#include "grpcpp/grpcpp.h"

namespace pserver {
namespace {

constexpr char kGetParamsMethod[] = "/pserver.v1.ParameterServer/GetParams";
constexpr char kSendGradsMethod[] = "/pserver.v1.ParameterServer/SendGrads";
constexpr char kPushPullMethod[] = "/pserver.v1.ParameterServer/PushPull";

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

// One raw call in flight.
struct RawCall {
  std::shared_ptr<grpc::ClientContext> context;
  std::shared_ptr<Cancellation::Registration> cancel;
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
  Transport::BlockSink sink;
  Transport::Done done;
  absl::Status status;
};

}  // namespace

GrpcTransport::GrpcTransport(std::string address, std::vector<Channel> channels,
                             bool wait_for_ready)
    : address_(std::move(address)),
      channels_(std::move(channels)),
      wait_for_ready_(wait_for_ready) {}

absl::StatusOr<std::unique_ptr<GrpcTransport>> GrpcTransport::Create(const std::string& address,
                                                                     int channels,
                                                                     bool wait_for_ready) {
  if (address.empty()) return absl::InvalidArgumentError("server address is empty");
  if (channels < 1) {
    return absl::InvalidArgumentError("a transport needs at least one channel");
  }
  std::vector<Channel> made;
  for (int i = 0; i < channels; ++i) {
    Channel c;
    c.channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                          DefaultChannelArguments());
    c.stub = v1::ParameterServer::NewStub(c.channel);
    c.generic = std::make_unique<grpc::GenericStub>(c.channel);
    made.push_back(std::move(c));
  }
  return std::unique_ptr<GrpcTransport>(
      new GrpcTransport(address, std::move(made), wait_for_ready));
}

GrpcTransport::Channel& GrpcTransport::Next() {
  return channels_[next_.fetch_add(1, std::memory_order_relaxed) % channels_.size()];
}

template <typename Request, typename Response>
void GrpcTransport::Call(typename NonDeduced<AsyncMethod<Request, Response>>::type method,
                         const Request& request, Response* response, absl::Time deadline,
                         Done done) {
  // The completion callback owns the context.
  std::shared_ptr<grpc::ClientContext> context = NewContext(deadline, wait_for_ready_);
  std::shared_ptr<Cancellation::Registration> cancel = CancelWithCall(context);
  (Next().stub->async()->*method)(
      context.get(), &request, response,
      [context, cancel, done = std::move(done)](grpc::Status status) mutable {
        cancel.reset();
        // Drop the context (and its reference on the channel) before
        // `done` wakes the caller: if the caller then destroys the
        // client, the channel's last reference must not die on this
        // gRPC thread.
        context.reset();
        done(FromGrpcStatus(status));
      });
}

void GrpcTransport::InitParam(const v1::InitParamRequest& request, absl::Time deadline, Done done) {
  auto response = std::make_shared<v1::InitParamResponse>();
  Call(&v1::ParameterServer::Stub::async::InitParam, request, response.get(), deadline,
       [response, done = std::move(done)](absl::Status status) { done(std::move(status)); });
}

void GrpcTransport::FinishInitParams(absl::Time deadline, Done done) {
  static const auto* const kRequest = new v1::FinishInitParamsRequest();
  auto response = std::make_shared<v1::FinishInitParamsResponse>();
  Call(&v1::ParameterServer::Stub::async::FinishInitParams, *kRequest, response.get(), deadline,
       [response, done = std::move(done)](absl::Status status) { done(std::move(status)); });
}

void GrpcTransport::GetStats(v1::GetStatsResponse* response, absl::Time deadline, Done done) {
  static const auto* const kRequest = new v1::GetStatsRequest();
  Call(&v1::ParameterServer::Stub::async::GetStats, *kRequest, response, deadline, std::move(done));
}

void GrpcTransport::CallRaw(const char* method,
                            const std::function<grpc::ByteBuffer(PayloadLease*)>& encode,
                            BlockSink sink, absl::Time deadline, Done done, TraceRecorder* trace) {
  auto call = std::make_shared<RawCall>();
  call->context = NewContext(deadline, wait_for_ready_);
  call->cancel = CancelWithCall(call->context);
  call->sink = std::move(sink);
  call->done = std::move(done);
  // Reports once the call is over (the owner's release) and every borrowed
  // payload slice is free.
  PayloadLease* lease = PayloadLease::Create([call] { call->done(call->status); });
  call->request = encode(lease);
  Next().generic->UnaryCall(call->context.get(), method, grpc::StubOptions(), &call->request,
                            &call->response, [call, lease, trace](grpc::Status status) {
                              call->status = FromGrpcStatus(status);
                              if (trace != nullptr) RecordServerTrace(*call->context, *trace);
                              if (call->status.ok() && call->sink) {
                                call->status = DeliverBlocks(call->response, call->sink);
                              }
                              // Let go of what gRPC may still reference before reporting (see
                              // Call).
                              call->cancel.reset();
                              call->context.reset();
                              call->request.Clear();
                              call->response.Clear();
                              lease->Release();
                            });
}

// Without an id (0: unset), a push is the id'd form.
void GrpcTransport::Push(absl::Span<const GradientView> grads, absl::Time deadline, Done done,
                         TraceRecorder* trace) {
  PushWithId(RequestId{}, grads, deadline, std::move(done), trace);
}

void GrpcTransport::PushWithId(const RequestId& id, absl::Span<const GradientView> grads,
                               absl::Time deadline, Done done, TraceRecorder* trace) {
  CallRaw(
      kSendGradsMethod,
      [grads, id](PayloadLease* lease) {
        return EncodePushRequest(grads, {}, lease, id.client, id.sequence);
      },
      nullptr, deadline, std::move(done), trace);
}

void GrpcTransport::PushPullWithId(const RequestId& id, absl::Span<const GradientView> grads,
                                   absl::Span<const v1::ParamRef> refs, BlockSink sink,
                                   absl::Time deadline, Done done, TraceRecorder* trace) {
  CallRaw(
      kPushPullMethod,
      [grads, refs, id](PayloadLease* lease) {
        return EncodePushRequest(grads, refs, lease, id.client, id.sequence);
      },
      std::move(sink), deadline, std::move(done), trace);
}

void GrpcTransport::Pull(absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time deadline,
                         Done done, TraceRecorder* trace) {
  CallRaw(
      kGetParamsMethod,
      [refs](PayloadLease*) {
        v1::GetParamsRequest request;
        for (const v1::ParamRef& ref : refs) *request.add_params() = ref;
        grpc::ByteBuffer buffer;
        bool own_buffer = false;
        grpc::GenericSerialize<grpc::ProtoBufferWriter, v1::GetParamsRequest>(request, &buffer,
                                                                              &own_buffer);
        return buffer;
      },
      std::move(sink), deadline, std::move(done), trace);
}

void GrpcTransport::PushPull(absl::Span<const GradientView> grads,
                             absl::Span<const v1::ParamRef> refs, BlockSink sink,
                             absl::Time deadline, Done done, TraceRecorder* trace) {
  PushPullWithId(RequestId{}, grads, refs, std::move(sink), deadline, std::move(done), trace);
}

void GrpcTransport::CreateTable(const v1::CreateTableRequest& request,
                                v1::CreateTableResponse* response, absl::Time deadline, Done done) {
  Call(&v1::ParameterServer::Stub::async::CreateTable, request, response, deadline,
       std::move(done));
}

void GrpcTransport::TablePull(const v1::TablePullRequest& request, v1::TablePullResponse* response,
                              absl::Time deadline, Done done) {
  Call(&v1::ParameterServer::Stub::async::TablePull, request, response, deadline, std::move(done));
}

void GrpcTransport::TablePush(const v1::TablePushRequest& request, v1::TablePushResponse* response,
                              absl::Time deadline, Done done) {
  Call(&v1::ParameterServer::Stub::async::TablePush, request, response, deadline, std::move(done));
}

void GrpcTransport::Clock(const v1::ClockRequest& request, v1::ClockResponse* response,
                          absl::Time deadline, Done done) {
  Call(&v1::ParameterServer::Stub::async::Clock, request, response, deadline, std::move(done));
}

void GrpcTransport::TableStats(const v1::TableStatsRequest& request,
                               v1::TableStatsResponse* response, absl::Time deadline, Done done) {
  Call(&v1::ParameterServer::Stub::async::TableStats, request, response, deadline, std::move(done));
}

void GrpcTransport::Barrier(const v1::BarrierRequest& request, v1::BarrierResponse* response,
                            absl::Time deadline, Done done) {
  Call(&v1::ParameterServer::Stub::async::Barrier, request, response, deadline, std::move(done));
}

void GrpcTransport::AllReduce(const v1::AllReduceRequest& request, v1::AllReduceResponse* response,
                              absl::Time deadline, Done done) {
  Call(&v1::ParameterServer::Stub::async::AllReduce, request, response, deadline, std::move(done));
}

void GrpcTransport::Broadcast(const v1::BroadcastRequest& request, v1::BroadcastResponse* response,
                              absl::Time deadline, Done done) {
  Call(&v1::ParameterServer::Stub::async::Broadcast, request, response, deadline, std::move(done));
}

}  // namespace pserver
