// InProcessTransport: a Transport that calls a server's Dispatcher in the
// same process (the embedded cluster): no socket and no serialization. It
// answers exactly as the server's gRPC service does, since both are the same
// dispatcher. Pushes apply straight from the caller's memory; pulls copy each
// block once, from the store into the caller's buffer. Sparse table pulls
// (without a worker) and pushes go as table frames do over the bulk channel
// (Dispatcher::PullTableRows / PushTableRows on views of the caller's keys
// and rows: no protobuf message, no key copy). Calls that do not wait for
// other workers complete before returning.
//
//   PS_ASSIGN_OR_RETURN(auto cluster, LocalCluster::Start(2));
//   auto client = Client::Create(options, InProcessTransports(*cluster));
//
// Thread-safe, as the dispatcher is. The dispatcher (its server) must
// outlive the transport.
#ifndef PSERVER_CC_SERVER_IN_PROCESS_TRANSPORT_H_
#define PSERVER_CC_SERVER_IN_PROCESS_TRANSPORT_H_

#include <memory>
#include <string>
#include <vector>

#include "cc/client/transport.h"
#include "cc/server/dispatcher.h"
#include "cc/server/local_cluster.h"

namespace pserver {

class InProcessTransport final : public Transport {
 public:
  explicit InProcessTransport(Dispatcher* dispatcher);

  const std::string& address() const override { return address_; }
  // A table with a custom handler (which may block) is served on the caller.
  bool TableCallMayBlockCaller(absl::string_view table) const override;

  void Call(absl::string_view method, const google::protobuf::Message& request,
            google::protobuf::Message* response, absl::Time deadline, Done done) override;
  void Push(const RequestId& id, absl::Span<const GradientView> grads, absl::Time deadline,
            Done done, TraceRecorder* trace = nullptr) override;
  void Pull(absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time deadline, Done done,
            TraceRecorder* trace = nullptr) override;
  void PushPull(const RequestId& id, absl::Span<const GradientView> grads,
                absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time deadline, Done done,
                TraceRecorder* trace = nullptr) override;
  // Always carried (a pull by a worker, which may wait, excepted): the
  // dispatcher's PullTableRows / PushTableRows, completed before returning.
  bool TableRows(FrameMethod method, const TableFrame& frame, RowsSink rows, absl::Time deadline,
                 Done& done, TraceRecorder* trace) override;

 private:
  absl::Status Read(absl::Span<const v1::ParamRef> refs, const BlockSink& sink);

  Dispatcher* const dispatcher_;
  const std::string address_;
};

// One in-process transport per dispatcher, in index order.
std::vector<std::unique_ptr<Transport>> InProcessTransports(
    const std::vector<Dispatcher*>& dispatchers);
// One per server of `cluster`, in index order.
std::vector<std::unique_ptr<Transport>> InProcessTransports(const LocalCluster& cluster);

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_IN_PROCESS_TRANSPORT_H_
