// Transport: how a client reaches one server. The client speaks only to this
// interface: GrpcTransport carries calls over gRPC, InProcessTransport
// (cc/server/in_process_transport.h) calls a server's dispatcher in the same
// process without any copy or socket.
//
// Control calls are generic: a method of pserver.v1.ParameterServer by name
// with its request and response messages, so a new control RPC needs no new
// transport method:
//
//   v1::GetStatsRequest request;
//   v1::GetStatsResponse response;
//   transport.Call("GetStats", request, &response, deadline, std::move(done));
//
// Bulk data (pushes, pulls, push+pull) has its own methods on borrowed
// views: tensor bytes never pass through a protobuf message.
//
// Every call is asynchronous and `done` runs exactly once, on any thread, by
// the deadline at the latest (DEADLINE_EXCEEDED). Everything a call is given
// (requests, responses, spans, the memory gradient views point at) must stay
// valid until `done` runs; implementations let go of it before calling
// `done`. Implementations are thread-safe.
#ifndef PSERVER_CC_CLIENT_TRANSPORT_H_
#define PSERVER_CC_CLIENT_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cc/client/ticket.h"
#include "cc/core/gradient_view.h"
#include "cc/core/request_id.h"
#include "cc/core/tensor.h"
#include "cc/rpc/frame.h"
#include "cc/rpc/table_frame.h"
#include "google/protobuf/message.h"
#include "pserver/v1/service.pb.h"

namespace pserver {

// gRPC's health check (grpc.health.v1.Health/Check): what Transport::Call
// also carries, with grpc.health.v1 HealthCheckRequest/Response.
inline constexpr char kHealthCheckMethod[] = "/grpc.health.v1.Health/Check";

class Transport {
 public:
  using Done = std::function<void(absl::Status)>;
  // Receives each block a pull returns, in request order, before `done`.
  // `header` holds all but the content; `content` is valid only during the
  // call. An error fails the whole call.
  using BlockPlace =
      std::function<absl::Status(const v1::Parameter& header, const Segments& content)>;
  // Where a block's content would end up: memory of exactly `content_bytes`
  // the content may be read into straight from the wire (the BlockPlace
  // then gets it there: content.data() is that address), or null (it goes
  // the usual way). Asked before each block, with its complete header.
  using BlockWhere =
      std::function<char*(const v1::Parameter& header, uint64_t content_bytes)>;
  // A pull's BlockPlace, and optionally its BlockWhere (only the bulk
  // channel asks it; gRPC and in-process transports hand content over as
  // they have it). Converts from any BlockPlace-like callable.
  class BlockSink {
   public:
    BlockSink() = default;
    BlockSink(std::nullptr_t) {}  // NOLINT: as std::function's
    template <typename F,
              typename = std::enable_if_t<
                  !std::is_same_v<std::decay_t<F>, BlockSink> &&
                  std::is_invocable_r_v<absl::Status, F&, const v1::Parameter&, const Segments&>>>
    BlockSink(F place) : place_(std::move(place)) {}  // NOLINT: a callable is a sink
    BlockSink(BlockPlace place, BlockWhere where)
        : place_(std::move(place)), where_(std::move(where)) {}

    absl::Status operator()(const v1::Parameter& header, const Segments& content) const {
      return place_(header, content);
    }
    explicit operator bool() const { return static_cast<bool>(place_); }
    bool has_where() const { return static_cast<bool>(place_) && static_cast<bool>(where_); }
    char* Where(const v1::Parameter& header, uint64_t content_bytes) const {
      return where_ ? where_(header, content_bytes) : nullptr;
    }

   private:
    BlockPlace place_;
    BlockWhere where_;
  };

  virtual ~Transport() = default;

  // Where this transport leads, for error messages ("127.0.0.1:7000").
  virtual const std::string& address() const = 0;

  // True when a table call of `table` through this transport (TableRows)
  // runs on the calling thread and may wait there: in-process, on a table
  // served by a custom handler (Tables::SetHandler), which may block. An
  // async table call through it then runs on the client's executor instead
  // of the calling thread. The default: false.
  virtual bool TableCallMayBlockCaller(absl::string_view table) const { return false; }

  // A control call: `method` is a method of pserver.v1.ParameterServer
  // ("GetStats"), or kHealthCheckMethod; `request` and `response` are its
  // message types. Waiting
  // calls (Barrier, AllReduce, Broadcast, consistent TablePull) wait on the
  // server for other workers, within `deadline`. UNIMPLEMENTED for a method
  // the server does not have.
  virtual void Call(absl::string_view method, const google::protobuf::Message& request,
                    google::protobuf::Message* response, absl::Time deadline, Done done) = 0;

  // Bulk data. A batch is applied whole or not at all by the server, once per
  // `id` (a retried request carries the same id; client 0: not tracked). A
  // `trace`, when given, gets the server's receive and processing times.
  virtual void Push(const RequestId& id, absl::Span<const GradientView> grads, absl::Time deadline,
                    Done done, TraceRecorder* trace = nullptr) = 0;
  virtual void Pull(absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time deadline,
                    Done done, TraceRecorder* trace = nullptr) = 0;
  // Applies `grads`, then reads `refs`, in one round trip.
  virtual void PushPull(const RequestId& id, absl::Span<const GradientView> grads,
                        absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time deadline,
                        Done done, TraceRecorder* trace = nullptr) = 0;

  // Receives a table pull's rows (`content_type`: the ElementType number
  // they came in, 0 as stored) before `done`; valid only during the call.
  using RowsSink = std::function<absl::Status(uint32_t content_type, absl::string_view rows)>;
  // A sparse table's pull (kTableRowsPull, without a worker) or push
  // (kTableRowsPush) as a table frame (cc/rpc/table_frame.h: the keys and
  // rows go out from the caller's memory, no protobuf message), when this
  // transport carries table frames to this server: true, and `done` taken.
  // Otherwise false, nothing sent and `done` left to the caller, who sends
  // the TablePull / TablePush control call instead. The default: false.
  virtual bool TableRows(FrameMethod method, const TableFrame& frame, RowsSink rows,
                         absl::Time deadline, Done& done, TraceRecorder* trace) {
    return false;
  }

  // The client no longer routes to this transport's server: etcd names
  // another server process for its index (a standby took the shard over
  // from a primary that went silent). Every call in flight ends at once with
  // `why` (UNAVAILABLE: the client retries it at the new server, with the
  // same request id, so a push the old server applied is not applied
  // twice), and so does every call started later. Idempotent; the first
  // `why` stays. The default does nothing (calls run to their deadline).
  virtual void Abandon(const absl::Status& why) {}
};

}  // namespace pserver

#endif  // PSERVER_CC_CLIENT_TRANSPORT_H_
