// ParameterServerService: the gRPC face of a Dispatcher. One generic
// callback service reads each call's single request message and hands it
// on: the bulk methods (GetParams, SendGrads, PushPull) through the
// zero-copy codec of cc/rpc/wire.h to the dispatcher's bulk methods, every
// other method to Dispatcher::Call by name, with its message types taken
// from the service descriptor. Adding a control RPC touches nothing here.
//
//   Dispatcher dispatcher(&store, &tables, /*index=*/0);
//   ParameterServerService service(&dispatcher);
//   builder.RegisterCallbackGenericService(&service);
//
// What the face adds to the dispatcher: the server's receive and processing
// times on the bulk calls (trailing metadata), reply bytes held against the
// reply budget until the reply is sent, waits cancelled when the client
// cancels, INVALID_ARGUMENT for a malformed request (counted), UNIMPLEMENTED
// for an unknown method. No call holds a thread while it waits.
//
// Thread-safe, as the dispatcher is.
#ifndef PSERVER_CC_SERVER_SERVICE_H_
#define PSERVER_CC_SERVER_SERVICE_H_

#include "cc/server/dispatcher.h"
#include "grpcpp/generic/async_generic_service.h"

namespace pserver {

class ParameterServerService final : public grpc::CallbackGenericService {
 public:
  // `dispatcher` must outlive the service.
  explicit ParameterServerService(Dispatcher* dispatcher) : dispatcher_(dispatcher) {}

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override;

 private:
  Dispatcher* const dispatcher_;
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_SERVICE_H_
