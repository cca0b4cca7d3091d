// ParameterServerService: the gRPC face of a ParameterStore. Each RPC checks
// and forwards its request to the store and maps the result onto gRPC codes;
// all lifecycle and validation rules live in the store.
//
//   ParameterStore store;
//   ParameterServerService service(&store, /*index=*/0);
//   builder.RegisterService(&service);
//
// Thread-safe, as the store is.
#ifndef PSERVER_CC_SERVER_SERVICE_H_
#define PSERVER_CC_SERVER_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cc/core/parameter_store.h"
#include "cc/core/tables.h"
#include "cc/server/applied_sequences.h"
#include "cc/server/reply_budget.h"
#include "pserver/v1/registry.pb.h"
#include "pserver/v1/service.grpc.pb.h"

namespace pserver {

// The bulk methods are raw callback methods: they read and write gRPC byte
// buffers through cc/rpc/wire.h, so tensor bytes are never copied through
// protobuf messages. The waiting methods (Barrier, AllReduce, Broadcast,
// TablePull) and GetParam are callback methods too, so that a call waiting
// for others, or a reply waiting for a slow reader, holds no thread. The
// other control methods stay synchronous.
using ServiceBase = v1::ParameterServer::WithRawCallbackMethod_GetParams<
    v1::ParameterServer::WithRawCallbackMethod_SendGrads<
        v1::ParameterServer::WithRawCallbackMethod_PushPull<
            v1::ParameterServer::WithCallbackMethod_GetParam<
                v1::ParameterServer::WithCallbackMethod_TablePull<
                    v1::ParameterServer::WithCallbackMethod_Barrier<
                        v1::ParameterServer::WithCallbackMethod_AllReduce<
                            v1::ParameterServer::WithCallbackMethod_Broadcast<
                                v1::ParameterServer::Service>>>>>>>>;

struct PushRequest;  // cc/rpc/wire.h

// What a Server adds to the service beyond the store; every field optional.
struct ServiceHooks {
  // Save RPC: writes (and publishes) a checkpoint. Unset: FAILED_PRECONDITION.
  std::function<absl::StatusOr<v1::CheckpointRecord>()> save;
  // ListWorkers RPC: the live trainers. Unset: FAILED_PRECONDITION.
  std::function<absl::StatusOr<std::vector<v1::WorkerInfo>>()> list_workers;
  // Fault injection for tests: every n-th push that is applied is answered
  // UNAVAILABLE, as if its reply had been lost. 0: off.
  uint64_t drop_reply_after_apply_every_n = 0;
  // Bytes of replies (GetParam, GetParams, PushPull) built but not yet sent,
  // over all calls; past it reads get UNAVAILABLE ("retry"; RESOURCE_EXHAUSTED
  // for a single reply larger than the limit)
  // (--max_reply_bytes_in_flight).
  uint64_t max_reply_bytes_in_flight = uint64_t{1} << 30;
};

class ParameterServerService final : public ServiceBase {
 public:
  // `store` and `tables` must outlive the service.
  ParameterServerService(ParameterStore* store, Tables* tables, uint32_t index,
                         ServiceHooks hooks = {});

  // While not serving (a server still claiming its index or loading its
  // checkpoint) every call but GetStats fails with UNAVAILABLE, which
  // clients retry. A service starts serving.
  void SetServing(bool serving) { serving_.store(serving, std::memory_order_release); }
  void SetIndex(uint32_t index) { index_.store(index, std::memory_order_relaxed); }

  // Pushes with a request id (client_id, sequence) are applied at most once.
  AppliedSequences& applied() { return applied_; }
  // Held shared while a push is applied and its id recorded; a checkpoint
  // holds it exclusively so that the store and applied() agree.
  absl::Mutex& apply_mu() { return apply_mu_; }
  uint64_t replies_dropped() const { return replies_dropped_.load(); }
  uint64_t duplicates_ignored() const { return duplicates_.load(); }
  void SetCheckpointSequence(uint64_t sequence) { checkpoint_sequence_.store(sequence); }

  grpc::Status InitParam(grpc::ServerContext* context, const v1::InitParamRequest* request,
                         v1::InitParamResponse* response) override;
  grpc::Status FinishInitParams(grpc::ServerContext* context,
                                const v1::FinishInitParamsRequest* request,
                                v1::FinishInitParamsResponse* response) override;
  grpc::ServerUnaryReactor* GetParam(grpc::CallbackServerContext* context,
                                     const v1::GetParamRequest* request,
                                     v1::GetParamResponse* response) override;
  grpc::ServerUnaryReactor* GetParams(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::Status SendGrad(grpc::ServerContext* context, const v1::SendGradRequest* request,
                        v1::SendGradResponse* response) override;
  grpc::ServerUnaryReactor* SendGrads(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* PushPull(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::Status GetStats(grpc::ServerContext* context, const v1::GetStatsRequest* request,
                        v1::GetStatsResponse* response) override;
  grpc::Status Save(grpc::ServerContext* context, const v1::SaveRequest* request,
                    v1::SaveResponse* response) override;
  grpc::Status ListWorkers(grpc::ServerContext* context, const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override;

  // Tables and collectives (cc/core/tables.h). Waiting calls (consistent
  // reads, barriers, all-reduce, broadcast reads) wait within the call's
  // deadline, and at most kMaxWait, holding no thread; a call the client
  // cancels stops waiting at once and drops what it contributed.
  grpc::Status CreateTable(grpc::ServerContext* context, const v1::CreateTableRequest* request,
                           v1::CreateTableResponse* response) override;
  grpc::ServerUnaryReactor* TablePull(grpc::CallbackServerContext* context,
                                      const v1::TablePullRequest* request,
                                      v1::TablePullResponse* response) override;
  grpc::Status TablePush(grpc::ServerContext* context, const v1::TablePushRequest* request,
                         v1::TablePushResponse* response) override;
  grpc::Status Clock(grpc::ServerContext* context, const v1::ClockRequest* request,
                     v1::ClockResponse* response) override;
  grpc::Status TableStats(grpc::ServerContext* context, const v1::TableStatsRequest* request,
                          v1::TableStatsResponse* response) override;
  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* context,
                                    const v1::BarrierRequest* request,
                                    v1::BarrierResponse* response) override;
  grpc::ServerUnaryReactor* AllReduce(grpc::CallbackServerContext* context,
                                      const v1::AllReduceRequest* request,
                                      v1::AllReduceResponse* response) override;
  grpc::ServerUnaryReactor* Broadcast(grpc::CallbackServerContext* context,
                                      const v1::BroadcastRequest* request,
                                      v1::BroadcastResponse* response) override;

  // Bytes of replies built but not yet sent (see max_reply_bytes_in_flight).
  const ReplyBudget& reply_budget() const { return reply_budget_; }

  static constexpr absl::Duration kMaxWait = absl::Minutes(10);

 private:
  // UNAVAILABLE while not serving.
  absl::Status CheckServing() const;
  // Runs `apply` unless the push (client_id, sequence) was applied before;
  // client_id 0 is not tracked.
  absl::Status ApplyOnce(uint64_t client_id, uint64_t sequence,
                         absl::FunctionRef<absl::Status()> apply);
  // Decodes a SendGrads/PushPull request and applies it (once).
  absl::Status DecodeAndApply(const grpc::ByteBuffer& request, PushRequest* push);

  // Reads `refs` into a GetParamsResponse; nothing is returned on any error.
  absl::Status ReadParams(absl::Span<const v1::ParamRef> refs, grpc::ByteBuffer* response);
  // Starts a waiting call on a reactor that finishes when the wait completes
  // and cancels the wait when the client cancels.
  grpc::ServerUnaryReactor* StartWait(grpc::CallbackServerContext* context,
                                      const std::function<CancelWait(absl::Time, WaitDone)>& start);

  ParameterStore* const store_;
  Tables* const tables_;
  std::atomic<uint32_t> index_;
  const ServiceHooks hooks_;
  const absl::Time started_ = absl::Now();
  std::atomic<bool> serving_{true};
  AppliedSequences applied_;
  absl::Mutex apply_mu_;
  std::atomic<uint64_t> pushes_applied_{0};
  std::atomic<uint64_t> replies_dropped_{0};
  std::atomic<uint64_t> duplicates_{0};
  std::atomic<uint64_t> checkpoint_sequence_{0};
  ReplyBudget reply_budget_;
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_SERVICE_H_
