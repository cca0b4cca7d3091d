// InProcessTransport: a Transport that calls a ParameterStore living in the
// same process (the embedded cluster): no socket and no serialization.
// Pushes apply straight from the caller's memory; pulls copy each block once,
// from the store into the caller's buffer. Calls complete before returning.
//
//   std::vector<std::unique_ptr<Transport>> transports =
//       InProcessTransports(cluster->stores());
//   auto client = Client::Create(options, std::move(transports));
//
// Thread-safe, as the store is. The store must outlive the transport.
#ifndef PSERVER_CC_CLIENT_IN_PROCESS_TRANSPORT_H_
#define PSERVER_CC_CLIENT_IN_PROCESS_TRANSPORT_H_

#include <memory>
#include <string>
#include <vector>

#include "cc/client/transport.h"
#include "cc/core/parameter_store.h"

namespace pserver {

class InProcessTransport final : public Transport {
 public:
  InProcessTransport(ParameterStore* store, uint32_t index);

  const std::string& address() const override { return address_; }

  void InitParam(const v1::InitParamRequest& request, absl::Time deadline, Done done) override;
  void FinishInitParams(absl::Time deadline, Done done) override;
  void GetStats(v1::GetStatsResponse* response, absl::Time deadline, Done done) override;
  void Push(absl::Span<const GradientView> grads, absl::Time deadline, Done done) override;
  void Pull(absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time deadline,
            Done done) override;
  void PushPull(absl::Span<const GradientView> grads, absl::Span<const v1::ParamRef> refs,
                BlockSink sink, absl::Time deadline, Done done) override;

 private:
  absl::Status Read(absl::Span<const v1::ParamRef> refs, const BlockSink& sink);

  ParameterStore* const store_;
  const uint32_t index_;
  const std::string address_;
};

// One in-process transport per store, in index order.
std::vector<std::unique_ptr<Transport>> InProcessTransports(
    const std::vector<ParameterStore*>& stores);

}  // namespace pserver

#endif  // PSERVER_CC_CLIENT_IN_PROCESS_TRANSPORT_H_
