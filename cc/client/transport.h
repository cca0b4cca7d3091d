// Transport: how a client reaches one server. The client speaks only to this
// interface: GrpcTransport carries calls over gRPC, InProcessTransport calls
// a server's store in the same process without any copy or socket.
//
// Every call is asynchronous and `done` runs exactly once, on any thread, by
// the deadline at the latest (DEADLINE_EXCEEDED). Everything a call is given
// (requests, spans, the memory gradient views point at) must stay valid until
// `done` runs; implementations let go of it before calling `done`.
// Implementations are thread-safe.
#ifndef PSERVER_CC_CLIENT_TRANSPORT_H_
#define PSERVER_CC_CLIENT_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cc/client/ticket.h"
#include "cc/core/parameter_store.h"
#include "cc/core/tensor.h"
#include "pserver/v1/service.pb.h"

namespace pserver {

// Identifies a push for exactly-once application (service.proto): a random
// non-zero client id and that client's sequence number for one server.
// A retried push carries the same id. client 0: not tracked.
struct RequestId {
  uint64_t client = 0;
  uint64_t sequence = 0;
};

class Transport {
 public:
  using Done = std::function<void(absl::Status)>;
  // Receives each block a pull returns, in request order, before `done`.
  // `header` holds all but the content; `content` is valid only during the
  // call. An error fails the whole call.
  using BlockSink =
      std::function<absl::Status(const v1::Parameter& header, const Segments& content)>;

  virtual ~Transport() = default;

  // Where this transport leads, for error messages ("127.0.0.1:7000").
  virtual const std::string& address() const = 0;

  virtual void InitParam(const v1::InitParamRequest& request, absl::Time deadline, Done done) = 0;
  virtual void FinishInitParams(absl::Time deadline, Done done) = 0;
  virtual void GetStats(v1::GetStatsResponse* response, absl::Time deadline, Done done) = 0;

  // Bulk data. A batch is applied whole or not at all by the server. A
  // `trace`, when given, gets the server's receive and processing times.
  virtual void Push(absl::Span<const GradientView> grads, absl::Time deadline, Done done,
                    TraceRecorder* trace = nullptr) = 0;
  virtual void Pull(absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time deadline,
                    Done done, TraceRecorder* trace = nullptr) = 0;
  // Applies `grads`, then reads `refs`, in one round trip.
  virtual void PushPull(absl::Span<const GradientView> grads, absl::Span<const v1::ParamRef> refs,
                        BlockSink sink, absl::Time deadline, Done done,
                        TraceRecorder* trace = nullptr) = 0;

  // Tables and collectives (cc/core/tables.h answers them on the server).
  // `request` and `response` must stay valid until `done` runs. Barrier,
  // AllReduce, Broadcast and consistent TablePulls wait on the server for
  // other workers, within `deadline`.
  virtual void CreateTable(const v1::CreateTableRequest& request, v1::CreateTableResponse* response,
                           absl::Time deadline, Done done) = 0;
  virtual void TablePull(const v1::TablePullRequest& request, v1::TablePullResponse* response,
                         absl::Time deadline, Done done) = 0;
  virtual void TablePush(const v1::TablePushRequest& request, v1::TablePushResponse* response,
                         absl::Time deadline, Done done) = 0;
  virtual void Clock(const v1::ClockRequest& request, v1::ClockResponse* response,
                     absl::Time deadline, Done done) = 0;
  virtual void TableStats(const v1::TableStatsRequest& request, v1::TableStatsResponse* response,
                          absl::Time deadline, Done done) = 0;
  virtual void Barrier(const v1::BarrierRequest& request, v1::BarrierResponse* response,
                       absl::Time deadline, Done done) = 0;
  virtual void AllReduce(const v1::AllReduceRequest& request, v1::AllReduceResponse* response,
                         absl::Time deadline, Done done) = 0;
  virtual void Broadcast(const v1::BroadcastRequest& request, v1::BroadcastResponse* response,
                         absl::Time deadline, Done done) = 0;

  // Push and PushPull carrying a request id, so that a server applies a
  // retried request once. Transports that cannot lose a reply (in-process)
  // need not override these.
  virtual void PushWithId(const RequestId& id, absl::Span<const GradientView> grads,
                          absl::Time deadline, Done done, TraceRecorder* trace = nullptr) {
    (void)id;
    Push(grads, deadline, std::move(done), trace);
  }
  virtual void PushPullWithId(const RequestId& id, absl::Span<const GradientView> grads,
                              absl::Span<const v1::ParamRef> refs, BlockSink sink,
                              absl::Time deadline, Done done, TraceRecorder* trace = nullptr) {
    (void)id;
    PushPull(grads, refs, std::move(sink), deadline, std::move(done), trace);
  }
};

}  // namespace pserver

#endif  // PSERVER_CC_CLIENT_TRANSPORT_H_
