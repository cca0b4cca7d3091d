#include "cc/server/in_process_transport.h"

#include <functional>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cc/client/cancellation.h"
#include "cc/core/status_macros.h"
#include "cc/server/table_bulk.h"
#include "grpc/health/v1/health.pb.h"

namespace pserver {
namespace {

// Starts a call on the dispatcher (`start` hands it `done` and returns its
// CancelWait), holding no thread while it waits, as the gRPC service does.
// The calling thread's cancellation (cancellation.h), if any, ends it with
// CANCELLED; `done` may run on whichever thread completes it.
void CallCancellable(const std::function<CancelWait(WaitDone)>& start, WaitDone done) {
  Cancellation* const cancel = Cancellation::Current();
  if (cancel == nullptr) {
    start(std::move(done));
    return;
  }
  if (absl::Status cancelled = cancel->Check(); !cancelled.ok()) {
    done(std::move(cancelled));
    return;
  }
  // The registration lives until the call completes, whichever comes first.
  struct State {
    absl::Mutex mu;
    bool completed ABSL_GUARDED_BY(mu) = false;
    Cancellation::Registration registration ABSL_GUARDED_BY(mu);
  };
  auto state = std::make_shared<State>();
  CancelWait cancel_wait = start([state, done = std::move(done)](absl::Status status) {
    {
      Cancellation::Registration registration;  // unregistered outside the lock
      absl::MutexLock lock(&state->mu);
      state->completed = true;
      registration = std::move(state->registration);
      // The lock goes first, then the registration: unregistered before
      // `done`, since once the caller hears of the completion it may destroy
      // its Cancellation (the C ABI's pserver_cancel_t). Seen as heap
      // corruption when a Go worker's Clock completed another's wait.
    }
    done(std::move(status));
  });
  {
    absl::MutexLock lock(&state->mu);
    if (state->completed) return;  // completed inside start(): nothing to cancel
  }
  // Outside the lock: already cancelled, OnCancel completes the wait at once.
  Cancellation::Registration registration = cancel->OnCancel(std::move(cancel_wait));
  absl::MutexLock lock(&state->mu);
  if (!state->completed) state->registration = std::move(registration);
}

// The in-process "server" times of a call, for its ticket's trace.
class ServerTimes {
 public:
  explicit ServerTimes(TraceRecorder* trace)
      : trace_(trace), received_(absl::ToUnixNanos(absl::Now())) {}
  void Report() const {
    if (trace_ == nullptr) return;
    v1::ServerTrace times;
    times.set_received_unix_nanos(received_);
    times.set_processed_unix_nanos(absl::ToUnixNanos(absl::Now()));
    trace_->Server(times);
  }

 private:
  TraceRecorder* const trace_;
  const int64_t received_;
};

}  // namespace

InProcessTransport::InProcessTransport(Dispatcher* dispatcher)
    : dispatcher_(dispatcher), address_(absl::StrCat("in-process:", dispatcher->index())) {}

bool InProcessTransport::TableCallMayBlockCaller(absl::string_view table) const {
  return dispatcher_->HasTableHandler(table);
}

void InProcessTransport::Call(absl::string_view method, const google::protobuf::Message& request,
                              google::protobuf::Message* response, absl::Time deadline, Done done) {
  if (method == kHealthCheckMethod) {
    // No gRPC health service in process: the dispatcher's serving state is
    // what a server's health service reports (no etcd, no draining here).
    auto* health = dynamic_cast<grpc::health::v1::HealthCheckResponse*>(response);
    if (health == nullptr) {
      done(absl::InvalidArgumentError("Health/Check answers grpc.health.v1.HealthCheckResponse"));
      return;
    }
    health->set_status(dispatcher_->CheckServing().ok()
                           ? grpc::health::v1::HealthCheckResponse::SERVING
                           : grpc::health::v1::HealthCheckResponse::NOT_SERVING);
    done(absl::OkStatus());
    return;
  }
  Dispatcher::CallContext call;
  call.deadline = deadline;
  CallCancellable(
      [&](WaitDone call_done) {
        return dispatcher_->Call(method, request, response, call, std::move(call_done));
      },
      std::move(done));
}

void InProcessTransport::Push(const RequestId& id, absl::Span<const GradientView> grads, absl::Time,
                              Done done, TraceRecorder* trace) {
  ServerTimes times(trace);
  absl::Status status = dispatcher_->Push(id, grads);
  times.Report();
  done(status);
}

absl::Status InProcessTransport::Read(absl::Span<const v1::ParamRef> refs, const BlockSink& sink) {
  return dispatcher_->Read(refs, [&](const v1::Parameter& header, absl::string_view bytes) {
    return sink(header, Segments{bytes});
  });
}

void InProcessTransport::Pull(absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time,
                              Done done, TraceRecorder* trace) {
  ServerTimes times(trace);
  absl::Status status = Read(refs, sink);
  times.Report();
  done(status);
}

void InProcessTransport::PushPull(const RequestId& id, absl::Span<const GradientView> grads,
                                  absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time,
                                  Done done, TraceRecorder* trace) {
  ServerTimes times(trace);
  absl::Status status = dispatcher_->Push(id, grads);
  if (status.ok()) status = Read(refs, sink);
  times.Report();
  done(status);
}

bool InProcessTransport::TableRows(FrameMethod method, const TableFrame& frame, RowsSink rows,
                                   absl::Time, Done& done, TraceRecorder* trace) {
  const bool push = method == FrameMethod::kTableRowsPush;
  if (!push && (method != FrameMethod::kTableRowsPull || !frame.worker.empty())) return false;
  Done finish = std::move(done);
  // As a control call: a cancelled caller's call does not start.
  if (Cancellation* cancel = Cancellation::Current(); cancel != nullptr) {
    if (absl::Status cancelled = cancel->Check(); !cancelled.ok()) {
      finish(std::move(cancelled));
      return true;
    }
  }
  ServerTimes times(trace);
  absl::Status status;
  if (push) {
    status = dispatcher_->PushTableRows(TableRowsViewOf(frame), frame.client_id, frame.sequence);
  } else {
    // The rows are read into the caller's memory where it offered it
    // (TableFrame::rows_into) and they fit it exactly, else into a buffer of
    // this thread's, kept between calls (up to kKeptPullBytes), then handed
    // to `rows`.
    constexpr size_t kKeptPullBytes = size_t{4} << 20;
    thread_local std::unique_ptr<char[]> kept;
    thread_local size_t kept_bytes = 0;
    std::unique_ptr<char[]> large;
    absl::string_view read;
    ElementType content_type = v1::ELEMENT_TYPE_UNSPECIFIED;
    status = dispatcher_->PullTableRows(
        TableRowsViewOf(frame),
        [&](size_t bytes, ElementType type) -> absl::StatusOr<absl::Span<char>> {
          content_type = type;
          char* data;
          if (!frame.rows_into.empty() && frame.rows_at.empty() &&
              bytes == frame.rows_into.size()) {
            data = frame.rows_into.data();  // straight into the caller's output
          } else if (bytes > kKeptPullBytes) {
            large.reset(new char[bytes]);
            data = large.get();
          } else {
            if (kept_bytes < bytes) {
              kept.reset(new char[bytes]);
              kept_bytes = bytes;
            }
            data = kept.get();
          }
          read = absl::string_view(data, bytes);
          return absl::MakeSpan(data, bytes);
        });
    if (status.ok()) status = rows(static_cast<uint32_t>(content_type), read);
  }
  times.Report();
  finish(std::move(status));
  return true;
}

std::vector<std::unique_ptr<Transport>> InProcessTransports(
    const std::vector<Dispatcher*>& dispatchers) {
  std::vector<std::unique_ptr<Transport>> transports;
  transports.reserve(dispatchers.size());
  for (Dispatcher* dispatcher : dispatchers) {
    transports.push_back(std::make_unique<InProcessTransport>(dispatcher));
  }
  return transports;
}

std::vector<std::unique_ptr<Transport>> InProcessTransports(const LocalCluster& cluster) {
  return InProcessTransports(cluster.dispatchers());
}

}  // namespace pserver
