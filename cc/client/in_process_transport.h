// InProcessTransport: a Transport that calls a ParameterStore living in the
// same process (the embedded cluster): no socket and no serialization.
// Pushes apply straight from the caller's memory; pulls copy each block once,
// from the store into the caller's buffer. Calls complete before returning.
//
//   std::vector<std::unique_ptr<Transport>> transports =
//       InProcessTransports(cluster->stores(), cluster->tables());
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
#include "cc/core/tables.h"

namespace pserver {

class InProcessTransport final : public Transport {
 public:
  // `tables` may be null: table and collective calls then fail with
  // UNIMPLEMENTED.
  InProcessTransport(ParameterStore* store, Tables* tables, uint32_t index);

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

 private:
  absl::Status Read(absl::Span<const v1::ParamRef> refs, const BlockSink& sink);

  // UNIMPLEMENTED without tables.
  absl::Status CheckTables() const;

  ParameterStore* const store_;
  Tables* const tables_;
  const uint32_t index_;
  const std::string address_;
};

// One in-process transport per store, in index order; `tables` is empty or
// holds each store's server's tables.
std::vector<std::unique_ptr<Transport>> InProcessTransports(
    const std::vector<ParameterStore*>& stores, const std::vector<Tables*>& tables = {});

}  // namespace pserver

#endif  // PSERVER_CC_CLIENT_IN_PROCESS_TRANSPORT_H_
