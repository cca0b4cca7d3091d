// ParameterServerService: the gRPC face of a Dispatcher, in two parts.
// - Control: one generic callback service reads each call's single request
//   message and hands it to Dispatcher::Call by method name, its message
//   types taken from the service descriptor. Adding a control RPC touches
//   nothing here.
// - Bulk: GetParams, SendGrads and PushPull are raw callback methods that
//   read and write byte buffers through the zero-copy codec of
//   cc/rpc/wire.h and the dispatcher's bulk methods (the generic path
//   costs 10-25% on small bulk calls).
//
//   Dispatcher dispatcher(&store, &tables, /*index=*/0);
//   ParameterServerService service(&dispatcher);
//   service.RegisterWith(&builder);
//
// What the face adds to the dispatcher: the server's receive and processing
// times on the bulk calls (trailing metadata), reply bytes held against the
// reply budget until the reply is sent, waits cancelled when the client
// cancels, INVALID_ARGUMENT for a malformed request (counted), UNIMPLEMENTED
// for an unknown method. No call holds a thread while it waits (a wait
// completes the call later), and no call that may wait on another server
// holds one of gRPC's callback threads: those are few and shared by every
// server of the process (gRPC runs callback handlers on a process-wide pool
// of 2-16 threads, half the cores), so a primary's replicated writes
// waiting for their backups' answers there would keep a standby slot of
// the same process (--replicas) from answering its own primary, which may
// be waiting on this process in turn (docs/replication.md). Such calls
// (BlockingCalls::MayWait) run on the service's own threads instead
// (kBlockingCallThreads, started at the first such call; more wait in
// order for one).
//
// Thread-safe, as the dispatcher is.
#ifndef PSERVER_CC_SERVER_SERVICE_H_
#define PSERVER_CC_SERVER_SERVICE_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "cc/auth/authorizer.h"
#include "cc/client/executor.h"
#include "cc/rpc/wire.h"
#include "cc/server/dispatcher.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/impl/service_type.h"
#include "grpcpp/server_builder.h"

namespace pserver {

// The bulk methods on byte buffers, as the gRPC face runs them, for the bulk
// channel (bulk_listener.h): `method` is "GetParams", "SendGrads",
// "PushPull", or "TablePull" / "TablePush" and the table frames
// "TablePullRows" / "TablePushRows" (table_bulk.h; the channel only),
// null for any other name. The reply's bytes stay held in
// `hold` until it is sent.
using BulkMethodFn = absl::Status (*)(Dispatcher&, const grpc::ByteBuffer& request,
                                      grpc::ByteBuffer* response, ReplyHold* hold);
BulkMethodFn FindBulkMethod(absl::string_view method);

// SendGrads and PushPull as FindBulkMethod's, given a scan of the request's
// bytes made while they arrived (wire.h PushFiniteScan; null: none): a
// gradient it found finite is not scanned again. Null for other methods.
using BulkPushFn = absl::Status (*)(Dispatcher&, const grpc::ByteBuffer& request,
                                    const PushFiniteScan* scan, grpc::ByteBuffer* response,
                                    ReplyHold* hold);
BulkPushFn FindBulkPushMethod(absl::string_view method);
// Decodes a SendGrads/PushPull request (a malformed one is counted and
// INVALID_ARGUMENT), marking the gradients `scan` (may be null) found finite.
absl::Status DecodeBulkPush(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                            const PushFiniteScan* scan, PushRequest* push);
// PushPull as FindBulkPushMethod's, on `push`, `request` decoded already by
// DecodeBulkPush (a bulk frame StreamPushPull did not stream): the reply
// room checked, the push applied once, the blocks read.
absl::Status PushPullDecoded(Dispatcher& dispatcher, const grpc::ByteBuffer& request,
                             const PushRequest& push, grpc::ByteBuffer* response,
                             ReplyHold* hold);

// A bulk push a primary shipped (docs/replication.md): `request` is a
// SendGradsRequest's bytes (or PushPullRequest's, whose reads are ignored),
// decoded and applied exactly as SendGrads applies it, once per request id;
// `scan` as for BulkPushFn (the receiving backup's own scan of these bytes;
// null: the store scans them). INVALID_ARGUMENT for bytes that are not a
// push request.
absl::Status ApplyReplicatedPush(Dispatcher& dispatcher, absl::string_view request,
                                 const PushFiniteScan* scan = nullptr);

// Who may call (docs/security.md), checked before a call reaches the
// dispatcher: the caller's role (`auth`, null or disabled: anyone), and the
// instance a client expects (kInstanceMetadataKey, from etcd): a call that
// names another instance than `instance_id` is refused UNAVAILABLE.
struct ServiceSecurity {
  const Authorizer* auth = nullptr;  // must outlive the service
  std::string instance_id;           // "": no instance check
};

// OK when `context`'s caller may call `method` (a short name) here.
absl::Status AdmitCall(const ServiceSecurity& security, const grpc::ServerContextBase& context,
                       absl::string_view method);

// The threads a service runs its calls that may wait on other servers on.
inline constexpr int kBlockingCallThreads = 16;

// Runs the calls that may wait on other servers off gRPC's callback threads.
// Thread-safe.
class BlockingCalls {
 public:
  // Whether control method `name` (a short name), or bulk push `name`, may
  // wait on another server on `dispatcher`: a write while writes are shipped
  // to backups (it waits for their answers), a backup's Replicate (it
  // waits for the earlier writes), AttachStandby, ReceiveBlocks and Save.
  static bool MayWait(const Dispatcher& dispatcher, absl::string_view name, bool writes);
  // Runs `call` on one of kBlockingCallThreads threads (started at the
  // first call), in order with the others waiting for one.
  void Run(std::function<void()> call);

 private:
  absl::Mutex mu_;
  std::unique_ptr<Executor> executor_ ABSL_GUARDED_BY(mu_);
};

class ParameterServerService {
 public:
  // `dispatcher` must outlive the service.
  explicit ParameterServerService(Dispatcher* dispatcher, ServiceSecurity security = {})
      : security_(std::move(security)), bulk_(dispatcher, &security_, &blocking_),
        control_(dispatcher, &security_, &blocking_) {}

  // Registers both parts; the service must outlive the server built.
  void RegisterWith(grpc::ServerBuilder* builder);

 private:
  class BulkService final : public grpc::Service {
   public:
    BulkService(Dispatcher* dispatcher, const ServiceSecurity* security, BlockingCalls* blocking);
  };
  class ControlService final : public grpc::CallbackGenericService {
   public:
    ControlService(Dispatcher* dispatcher, const ServiceSecurity* security,
                   BlockingCalls* blocking)
        : dispatcher_(dispatcher), security_(security), blocking_(blocking) {}
    grpc::ServerGenericBidiReactor* CreateReactor(
        grpc::GenericCallbackServerContext* context) override;

   private:
    Dispatcher* const dispatcher_;
    const ServiceSecurity* const security_;
    BlockingCalls* const blocking_;
  };

  const ServiceSecurity security_;
  // Its calls use security_: declared after it, they finish before it goes.
  BlockingCalls blocking_;
  BulkService bulk_;
  ControlService control_;
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_SERVICE_H_
