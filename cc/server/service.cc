#include "cc/server/service.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "cc/auth/grpc_credentials.h"
#include "cc/core/status_macros.h"
#include "cc/rpc/grpc_status.h"
#include "cc/rpc/wire.h"
#include "cc/server/table_bulk.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/impl/codegen/server_callback_handlers.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace pserver {

namespace {

namespace protobuf = google::protobuf;

int64_t UnixNanos() { return absl::ToUnixNanos(absl::Now()); }

// When a waiting call gives up: before its own deadline, so that the caller
// gets the server's explanation rather than its own bare DEADLINE_EXCEEDED
// (a quarter of the time left, at most a second: room for the answer on a
// loaded machine), and after kMaxWait at most.
absl::Time WaitDeadline(const grpc::ServerContextBase& context) {
  const absl::Time now = absl::Now();
  const absl::Time deadline =
      std::min(absl::FromChrono(context.deadline()), now + Dispatcher::kMaxWait);
  return deadline - std::min(absl::Seconds(1), (deadline - now) / 4);
}

// An empty message (SendGradsResponse) as a byte buffer.
grpc::ByteBuffer EmptyMessage() {
  grpc::Slice empty;
  return grpc::ByteBuffer(&empty, 1);
}

// ---- bulk: GetParams, SendGrads, PushPull on raw byte buffers ----

// Reads `refs` into `response` (a GetParamsResponse); nothing on error.
absl::Status ReadParams(Dispatcher& dispatcher, absl::Span<const v1::ParamRef> refs,
                        grpc::ByteBuffer* response) {
  ParamsResponseBuilder builder;
  PS_RETURN_IF_ERROR(
      dispatcher.Read(refs, [&](const v1::Parameter& header, absl::string_view bytes) {
        builder.Add(header, bytes.size(), [&](char* dest) {
          if (!bytes.empty()) std::memcpy(dest, bytes.data(), bytes.size());
        });
        return absl::OkStatus();
      }));
  *response = builder.Finish();
  return absl::OkStatus();
}

// A byte buffer's bytes where they are: its slices, referenced (a bulk
// channel frame's one buffer, or gRPC's slices), not copied.
SharedBytes BufferBytes(const grpc::ByteBuffer& buffer) {
  auto slices = std::make_shared<std::vector<grpc::Slice>>();
  SharedBytes bytes;
  if (!buffer.Dump(slices.get()).ok()) slices->clear();  // as an empty request
  for (const grpc::Slice& slice : *slices) {
    bytes.parts.emplace_back(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  bytes.owner = std::move(slices);
  return bytes;
}

// Marks the gradients `scan` (may be null) found finite in their bytes.
void MarkScanned(const PushFiniteScan* scan, std::vector<GradientView>* grads) {
  if (scan == nullptr) return;
  for (GradientView& grad : *grads) grad.checked_finite = scan->Finite(grad);
}

// Applies a decoded SendGrads/PushPull request, `push` of `request`'s
// bytes (once).
absl::Status ApplyDecoded(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                          const PushRequest* push) {
  const RequestId id{push->client_id, push->sequence};
  // With backups the request's bytes are shipped (docs/replication.md); a
  // PushPull's reads are ignored by the backup.
  // The push is handed to them once checked, before it is applied here
  // (Dispatcher::Push's `ship`).
  return dispatcher.Ship(
      "SendGrads", [&] { return BufferBytes(request); },
      [&](absl::FunctionRef<void()> ship) { return dispatcher.Push(id, push->grads, ship); });
}

// Decodes a SendGrads/PushPull request and applies it (once); `scan` (may
// be null) names the gradients already found finite.
absl::Status DecodeAndApply(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                            const PushFiniteScan* scan, PushRequest* push) {
  PS_RETURN_IF_ERROR(DecodeBulkPush(dispatcher, request, scan, push));
  return ApplyDecoded(dispatcher, request, push);
}

absl::Status GetParams(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                       grpc::ByteBuffer* response, ReplyHold* hold) {
  // Before parsing, so that a starting server answers UNAVAILABLE whatever
  // it is sent (Dispatcher::Read checks again, for every face).
  PS_RETURN_IF_ERROR(dispatcher.CheckServing());
  v1::GetParamsRequest parsed;
  grpc::ByteBuffer copy(request);  // shares the slices
  if (!grpc::SerializationTraits<v1::GetParamsRequest>::Deserialize(&copy, &parsed).ok()) {
    dispatcher.CountMalformed();
    return absl::InvalidArgumentError("malformed GetParamsRequest");
  }
  PS_RETURN_IF_ERROR(dispatcher.CheckReplyRoom());
  // Moved, not copied, out of the parsed request.
  std::vector<v1::ParamRef> refs(std::make_move_iterator(parsed.mutable_params()->begin()),
                                 std::make_move_iterator(parsed.mutable_params()->end()));
  PS_RETURN_IF_ERROR(ReadParams(dispatcher, refs, response));
  return dispatcher.HoldReply(response->Length(), hold);
}

absl::Status SendGradsScanned(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                              const PushFiniteScan* scan, grpc::ByteBuffer* response,
                              ReplyHold*) {
  PushRequest push;
  PS_RETURN_IF_ERROR(DecodeAndApply(dispatcher, request, scan, &push));
  *response = EmptyMessage();
  return absl::OkStatus();
}

absl::Status SendGrads(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                       grpc::ByteBuffer* response, ReplyHold* hold) {
  return SendGradsScanned(dispatcher, request, nullptr, response, hold);
}

absl::Status PushPullScanned(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                             const PushFiniteScan* scan, grpc::ByteBuffer* response,
                             ReplyHold* hold) {
  // Over the budget nothing is applied (nor decoded); the read is refused.
  PS_RETURN_IF_ERROR(dispatcher.CheckReplyRoom());
  PushRequest push;
  PS_RETURN_IF_ERROR(DecodeBulkPush(dispatcher, request, scan, &push));
  return PushPullDecoded(dispatcher, request, push, response, hold);
}

absl::Status PushPull(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                      grpc::ByteBuffer* response, ReplyHold* hold) {
  return PushPullScanned(dispatcher, request, nullptr, response, hold);
}

using BulkMethod = absl::Status (*)(Dispatcher&, const grpc::ByteBuffer&, grpc::ByteBuffer*,
                                    ReplyHold*);

// A bulk call: its reply holds reply budget until it is sent (or the call
// ends otherwise). Deletes itself when done.
class BulkReactor final : public grpc::ServerUnaryReactor {
 public:
  // Runs `method` and finishes, telling the client when the call was
  // received and processed (trailing metadata).
  // A push that may wait for backups runs on `blocking`'s threads.
  BulkReactor(Dispatcher& dispatcher, const ServiceSecurity& security, absl::string_view name,
              BulkMethod method, grpc::CallbackServerContext* context,
              const grpc::ByteBuffer& request, grpc::ByteBuffer* response,
              BlockingCalls& blocking) {
    const int64_t received = UnixNanos();
    if (BlockingCalls::MayWait(dispatcher, name, /*writes=*/name != "GetParams")) {
      // gRPC keeps the request, response and context until Finish.
      blocking.Run([this, &dispatcher, &security, name, method, context, &request, response,
                    received] {
        Serve(dispatcher, security, name, method, context, request, response, received);
      });
      return;
    }
    Serve(dispatcher, security, name, method, context, request, response, received);
  }
  void OnDone() override { delete this; }

 private:
  void Serve(Dispatcher& dispatcher, const ServiceSecurity& security, absl::string_view name,
             BulkMethod method, grpc::CallbackServerContext* context,
             const grpc::ByteBuffer& request, grpc::ByteBuffer* response, int64_t received) {
    absl::Status status = AdmitCall(security, *context, name);
    if (status.ok()) status = method(dispatcher, request, response, &hold_);
    if (!status.ok()) {
      hold_.Reset();
      response->Clear();
    }
    v1::ServerTrace trace;
    trace.set_received_unix_nanos(received);
    trace.set_processed_unix_nanos(UnixNanos());
    context->AddTrailingMetadata(kServerTraceMetadataKey, trace.SerializeAsString());
    Finish(ToGrpcStatus(status));
  }

  ReplyHold hold_;
};

// One control call: reads its request, dispatches it by name, writes the
// reply. It may complete later on another thread (a wait), or be cancelled by
// the client meanwhile. Deletes itself when done, giving back the reply
// budget its reply held.
class CallReactor final : public grpc::ServerGenericBidiReactor {
 public:
  CallReactor(Dispatcher* dispatcher, const ServiceSecurity* security,
              grpc::GenericCallbackServerContext* context, BlockingCalls* blocking)
      : dispatcher_(dispatcher), security_(security), context_(context), blocking_(blocking) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the call carried no request"));
      return;
    }
    absl::string_view name = context_->method();
    if (!absl::ConsumePrefix(&name, Dispatcher::kMethodPrefix)) return Unknown();
    const Dispatcher::Method* method = dispatcher_->FindMethod(name);
    if (method != nullptr && BlockingCalls::MayWait(*dispatcher_, name, method->writes)) {
      // Not on gRPC's callback thread (service.h); the reactor lives until
      // it finishes.
      blocking_->Run([this, name] { Control(name); });
      return;
    }
    Control(name);
  }

  void OnCancel() override {
    CancelWait cancel;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      cancel = cancel_;
    }
    if (cancel) cancel();  // completes the wait (a no-op if it has completed)
  }

  void OnDone() override { delete this; }

 private:
  void Unknown() {
    Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        absl::StrCat("unknown method ", context_->method())));
  }

  void Reply(const absl::Status& status) {
    if (!status.ok()) {
      hold_.Reset();
      Finish(ToGrpcStatus(status));
      return;
    }
    StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
  }

  // ---- control ----
  void Control(absl::string_view name) {
    const Dispatcher::Method* method = dispatcher_->FindMethod(name);
    if (method == nullptr) return Unknown();
    if (absl::Status admitted = AdmitCall(*security_, *context_, name); !admitted.ok()) {
      return Reply(admitted);
    }
    request_message_.reset(method->request_prototype->New());
    response_message_.reset(method->response_prototype->New());
    if (!grpc::SerializationTraits<protobuf::Message>::Deserialize(&request_,
                                                                   request_message_.get())
             .ok()) {
      dispatcher_->CountMalformed();
      return Reply(absl::InvalidArgumentError(
          absl::StrCat("malformed ", method->descriptor->input_type()->name())));
    }
    if (absl::Status admitted = AdmitStateChecksum(name, *request_message_); !admitted.ok()) {
      return Reply(admitted);
    }
    Dispatcher::CallContext call;
    call.deadline = WaitDeadline(*context_);
    call.reply = &hold_;
    CancelWait cancel =
        dispatcher_->Call(name, *request_message_, response_message_.get(), call,
                          [this](absl::Status status) { Complete(std::move(status)); });
    bool finish_now = false, cancel_now = false;
    {
      absl::MutexLock lock(&mu_);
      started_ = true;
      cancel_ = cancel;
      finish_now = completed_;
      cancel_now = cancelled_ && !completed_;
    }
    // Once the reply is sent the reactor may be deleted: nothing after it.
    if (finish_now) {
      ReplyControl(status_);
    } else if (cancel_now) {
      cancel();
    }
  }

  // A state checksum (GetStatsRequest.state_checksum) holds every push of
  // the shard while the state is copied, as a checkpoint does: only a caller
  // that may Save may ask for one.
  absl::Status AdmitStateChecksum(absl::string_view name, const protobuf::Message& request) {
    if (name != "GetStats" ||
        !static_cast<const v1::GetStatsRequest&>(request).state_checksum()) {
      return absl::OkStatus();
    }
    absl::Status admitted = AdmitCall(*security_, *context_, "Save");
    if (admitted.ok()) return admitted;
    return absl::Status(admitted.code(),
                        absl::StrCat("GetStats with state_checksum needs the role that may Save: ",
                                     admitted.message()));
  }

  void Complete(absl::Status status) {
    {
      absl::MutexLock lock(&mu_);
      completed_ = true;
      if (!started_) {  // completed inside Call: Control replies
        status_ = std::move(status);
        return;
      }
    }
    ReplyControl(status);
  }

  void ReplyControl(absl::Status status) {
    if (status.ok()) {
      bool own_buffer = false;
      grpc::Status serialized = grpc::SerializationTraits<protobuf::Message>::Serialize(
          *response_message_, &response_, &own_buffer);
      if (!serialized.ok()) status = FromGrpcStatus(serialized);
    }
    Reply(status);
  }

  Dispatcher* const dispatcher_;
  const ServiceSecurity* const security_;
  grpc::GenericCallbackServerContext* const context_;
  BlockingCalls* const blocking_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  std::unique_ptr<protobuf::Message> request_message_;
  std::unique_ptr<protobuf::Message> response_message_;
  ReplyHold hold_;  // the reply's bytes, given back when the call is done

  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool completed_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_;  // written before started_, read by Control
  CancelWait cancel_ ABSL_GUARDED_BY(mu_);
};

// The three bulk methods as raw callback methods of a hand-made service
// (the generic path costs per-call time on small bulk calls).
constexpr const char* kBulkMethods[] = {"/pserver.v1.ParameterServer/GetParams",
                                        "/pserver.v1.ParameterServer/SendGrads",
                                        "/pserver.v1.ParameterServer/PushPull"};
constexpr BulkMethod kBulkHandlers[] = {&GetParams, &SendGrads, &PushPull};

// The short name of bulk method i ("GetParams").
absl::string_view BulkMethodName(int i) {
  absl::string_view name = kBulkMethods[i];
  absl::ConsumePrefix(&name, Dispatcher::kMethodPrefix);
  return name;
}

}  // namespace

absl::Status PushPullDecoded(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                             const PushRequest& push, grpc::ByteBuffer* response,
                             ReplyHold* hold) {
  PS_RETURN_IF_ERROR(dispatcher.CheckReplyRoom());
  PS_RETURN_IF_ERROR(ApplyDecoded(dispatcher, request, &push));
  PS_RETURN_IF_ERROR(ReadParams(dispatcher, push.refs, response));
  absl::Status held = dispatcher.HoldReply(response->Length(), hold);
  if (held.ok()) return held;
  // Applied, but the reply does not fit: UNAVAILABLE while others hold the
  // room, which clients retry with the same sequence (not applied again);
  // RESOURCE_EXHAUSTED if it never can.
  return absl::Status(
      held.code(),
      absl::StrCat("the push was applied but its reply does not fit: ", held.message()));
}

absl::Status AdmitCall(const ServiceSecurity& security, const grpc::ServerContextBase& context,
                       absl::string_view method) {
  if (!security.instance_id.empty()) {
    const auto& metadata = context.client_metadata();
    auto it = metadata.find(kInstanceMetadataKey);
    if (it != metadata.end() &&
        absl::string_view(it->second.data(), it->second.size()) != security.instance_id) {
      return absl::UnavailableError(absl::StrCat(
          "this server is instance ", security.instance_id, ", not ",
          absl::string_view(it->second.data(), it->second.size()),
          " that etcd named: a stale or rogue registry entry; refused before anything was "
          "applied"));
    }
  }
  if (security.auth == nullptr || !security.auth->enabled()) return absl::OkStatus();
  return security.auth->Check(CredentialsOf(context), method);
}

absl::Status ApplyReplicatedPush(Dispatcher& dispatcher, absl::string_view request,
                                 const PushFiniteScan* scan) {
  // The decoded views point into `request` itself (no copy): it outlives them.
  grpc::Slice slice(request.data(), request.size(), grpc::Slice::STATIC_SLICE);
  grpc::ByteBuffer buffer(&slice, 1);
  PushRequest push;
  if (absl::Status status = DecodePushRequest(buffer, &push); !status.ok()) return status;
  MarkScanned(scan, &push.grads);
  return dispatcher.PushReplicated(RequestId{push.client_id, push.sequence}, push.grads);
}

BulkMethodFn FindBulkMethod(absl::string_view method) {
  // The table calls travel as bulk methods on the bulk channel only (on
  // gRPC they stay control calls, where a consistent read may wait).
  if (method == "TablePull") return &TablePullBulk;
  if (method == "TablePush") return &TablePushBulk;
  if (method == "TablePullRows") return &TableRowsPullBulk;
  if (method == "TablePushRows") return &TableRowsPushBulk;
  for (int i = 0; i < 3; ++i) {
    absl::string_view name = kBulkMethods[i];
    if (absl::ConsumePrefix(&name, Dispatcher::kMethodPrefix) && name == method) {
      return kBulkHandlers[i];
    }
  }
  return nullptr;
}

absl::Status DecodeBulkPush(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                            const PushFiniteScan* scan, PushRequest* push) {
  if (absl::Status status = DecodePushRequest(request, push); !status.ok()) {
    dispatcher.CountMalformed();
    return status;
  }
  MarkScanned(scan, &push->grads);
  return absl::OkStatus();
}

BulkPushFn FindBulkPushMethod(absl::string_view method) {
  if (method == "SendGrads") return &SendGradsScanned;
  if (method == "PushPull") return &PushPullScanned;
  return nullptr;
}

bool BlockingCalls::MayWait(const Dispatcher& dispatcher, absl::string_view name, bool writes) {
  if (name == "Replicate" || name == "AttachStandby" || name == "ReceiveBlocks" ||
      name == "Save") {
    return true;
  }
  return writes && dispatcher.Ships();
}

void BlockingCalls::Run(std::function<void()> call) {
  Executor* executor = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (executor_ == nullptr) executor_ = std::make_unique<Executor>(kBlockingCallThreads);
    executor = executor_.get();
  }
  executor->Schedule(std::move(call));
}

ParameterServerService::BulkService::BulkService(Dispatcher* dispatcher,
                                                 const ServiceSecurity* security,
                                                 BlockingCalls* blocking) {
  for (int i = 0; i < 3; ++i) {
    AddMethod(new grpc::internal::RpcServiceMethod(
        kBulkMethods[i], grpc::internal::RpcMethod::NORMAL_RPC, nullptr));
    MarkMethodRawCallback(
        i, new grpc::internal::CallbackUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
               [dispatcher, security, blocking, name = BulkMethodName(i),
                method = kBulkHandlers[i]](grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) {
                 return new BulkReactor(*dispatcher, *security, name, method, context, *request,
                                        response, *blocking);
               }));
  }
}

grpc::ServerGenericBidiReactor* ParameterServerService::ControlService::CreateReactor(
    grpc::GenericCallbackServerContext* context) {
  return new CallReactor(dispatcher_, security_, context, blocking_);
}

void ParameterServerService::RegisterWith(grpc::ServerBuilder* builder) {
  builder->RegisterService(&bulk_);
  builder->RegisterCallbackGenericService(&control_);
}

}  // namespace pserver
