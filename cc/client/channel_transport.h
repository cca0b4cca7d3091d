// ChannelTransport: a Transport that carries push, pull and push+pull over
// the server's bulk channel (cc/rpc/frame.h: a framed TCP stream, or an
// abstract Unix socket when the server is on this host) and everything else
// over the gRPC transport it wraps.
//
//   auto grpc = GrpcTransport::Create("10.0.0.2:7000");
//   auto transport = std::make_unique<ChannelTransport>(*std::move(grpc));
//   transport->Push(id, grads, deadline, done);   // over the channel
//
// The first bulk call asks the server where its channel listens
// (OpenChannel, through gRPC) and connects, presenting the server's token:
// first to the Unix socket (reachable only from the same host and network
// namespace, and the token proves it is the same server), else over TCP to
// the gRPC host. A server with the channel off, an old server, or a channel
// that cannot be reached or refuses the connection (full) makes bulk calls
// fall back to gRPC, silently (logged once), trying the channel again after
// `retry_after`.
//
// Calls: each is a frame with an id on one of `connections` connections;
// replies are matched by id. A call blocks its caller while its request is
// written (over TCP: until all but `unsent_bytes` of it has left). A caller
// that then waits in a CallGroup (as Client's calls do)
// for its one call, when that is its connection's only call in flight,
// reads the reply itself; so does one waiting for a group of table calls
// (small replies: one per server, read one after the other); other replies
// are read by the connection's reader thread. Deadlines and cancellation fail the call (DEADLINE_EXCEEDED,
// CANCELLED) and drop its connection; a broken connection fails its calls
// with UNAVAILABLE, which Client retries (same request id: applied once).
// The next call reconnects.
//
// Thread-safe.
#ifndef PSERVER_CC_CLIENT_CHANNEL_TRANSPORT_H_
#define PSERVER_CC_CLIENT_CHANNEL_TRANSPORT_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cc/client/transport.h"
#include "cc/core/waiters.h"
#include "cc/rpc/frame.h"
#include "cc/security/tls.h"

namespace pserver {

struct ChannelTransportOptions {
  // Connections to the server; calls are spread over them.
  int connections = 2;
  // Opening the channel (OpenChannel, connect, TLS handshake, the hello
  // with the token and its answer) takes at most this long (and never past
  // the first call's deadline): a server that accepts and never answers
  // has its connection shut down then, and bulk calls use gRPC for
  // `retry_after`. Abandon ends an opening in progress at once.
  absl::Duration connect_timeout = absl::Seconds(5);
  // Try the server's Unix socket before TCP.
  bool unix_socket = true;
  // After the channel could not be opened, bulk calls use gRPC this long.
  absl::Duration retry_after = absl::Seconds(30);
  // Presented in the hello frame after the channel token, to a server with
  // roles (docs/security.md); "": none.
  std::string bearer_token;
  // TLS on: connections are mutual TLS over TCP (no Unix socket).
  TlsOptions tls;
  // A plain connection's reader polls for up to this long before it sleeps
  // waiting for a reply header (cc/rpc/byte_stream.h ReadSpin: only while a
  // core is free, backing off when replies take longer); 0: never.
  absl::Duration read_spin = absl::Microseconds(50);
  // A TCP connection's unsent bytes at which a blocking write returns
  // (TCP_NOTSENT_LOWAT, set on TCP connections, plain and TLS; not on the
  // Unix socket; best effort). With the kernel's default a request is
  // "written" once it is copied into the socket's 4 MiB send buffer, so the
  // requests of one call to several servers share the link at once and
  // their replies all come at the end; with this, a write returns once all
  // but this much has left for the network: the requests leave one after
  // another and the first replies come back while later requests go out
  // (docs/architecture.md "Bulk channel"). 0: the kernel's default
  // (net.ipv4.tcp_notsent_lowat). At least 0. Not set on a connection to a
  // loopback address unless `unsent_bytes_on_loopback`: there is no link to
  // pace there, and the limit only adds wake-ups (bench/RESULTS.md, session
  // 24: the AEAD layer's push+pull made 30% more client system calls).
  int unsent_bytes = 128 << 10;
  bool unsent_bytes_on_loopback = false;
};

class ChannelTransport final : public Transport {
 public:
  explicit ChannelTransport(std::unique_ptr<Transport> grpc, ChannelTransportOptions options = {});
  ~ChannelTransport() override;

  const std::string& address() const override { return grpc_->address(); }
  // TablePull (but a read by a worker, which may wait) and TablePush go over
  // the channel when it is open (frame.h kTablePull, kTablePush); every other
  // control call goes over gRPC.
  void Call(absl::string_view method, const google::protobuf::Message& request,
            google::protobuf::Message* response, absl::Time deadline, Done done) override;
  void Push(const RequestId& id, absl::Span<const GradientView> grads, absl::Time deadline,
            Done done, TraceRecorder* trace = nullptr) override;
  void Pull(absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time deadline, Done done,
            TraceRecorder* trace = nullptr) override;
  void PushPull(const RequestId& id, absl::Span<const GradientView> grads,
                absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time deadline, Done done,
                TraceRecorder* trace = nullptr) override;
  // Over the channel when it is open and the server speaks table frames
  // (OpenChannelResponse.table_frames); false otherwise (an older server,
  // the channel off or unreachable: the caller sends the control call).
  bool TableRows(FrameMethod method, const TableFrame& frame, RowsSink rows, absl::Time deadline,
                 Done& done, TraceRecorder* trace) override;
  // Fails every call in flight with `why` (dropping the connections: a
  // caller blocked writing to a silent server, or a waiter reading its
  // reply, returns at once), and every later call, over the channel or gRPC.
  // A connection being opened (TLS handshake, hello) is shut down first,
  // so this never waits for a silent server.
  void Abandon(const absl::Status& why) override;

  // What the last bulk call went over: "unix", "tcp", or "grpc".
  std::string route() const;
  // Connections opened so far (a dropped one is reopened on the next call).
  int connections_opened() const { return opened_.load(); }
  // Replies read by the caller waiting for them (in a CallGroup), not
  // handed over by a connection's reader thread.
  uint64_t replies_read_by_waiters() const { return counters_.waiter_reads.load(); }
  // Pulled blocks' content bytes (GetParams, PushPull) read from the stream
  // straight into the caller's memory (the sink's BlockSink::Where), and
  // those read into a buffer first (of pulls whose sink has a Where).
  uint64_t pulled_bytes_in_place() const { return counters_.bytes_in_place.load(); }
  uint64_t pulled_bytes_buffered() const { return counters_.bytes_buffered.load(); }

  class Connection;

 private:
  // What the getters above report; the connections count into them.
  struct Counters {
    std::atomic<uint64_t> waiter_reads{0};
    std::atomic<uint64_t> bytes_in_place{0};
    std::atomic<uint64_t> bytes_buffered{0};
  };

  // A connection for the next bulk call; null: use gRPC.
  std::shared_ptr<Connection> Pick(absl::Time deadline);
  // Asks the server for its channel (OpenChannel) and connects to it.
  absl::StatusOr<std::shared_ptr<Connection>> Open(absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<Connection>> Connect(const v1::OpenChannelResponse& offer,
                                                      absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends a bulk call over a connection, or returns false (use gRPC).
  bool Send(FrameMethod method, absl::Span<const absl::string_view> payload, BlockSink sink,
            absl::Time deadline, Done& done, TraceRecorder* trace);
  void FallBack(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // While a connection is opened (TLS handshake, hello), Abandon or
  // `deadline` shut its socket `fd` down (through a duplicate of it, so
  // that it stays ours whoever owns the socket meanwhile). Begin returns
  // the reason if abandoned already; End the reason the socket was shut
  // down, if it was (OK otherwise).
  absl::Status BeginConnecting(int fd, absl::Time deadline);
  absl::Status EndConnecting();

  const std::unique_ptr<Transport> grpc_;
  const ChannelTransportOptions options_;
  // Declared before the timer, whose callbacks use them.
  absl::Mutex connecting_mu_;
  int connecting_fd_ ABSL_GUARDED_BY(connecting_mu_) = -1;  // a duplicate; -1: none
  uint64_t connecting_id_ ABSL_GUARDED_BY(connecting_mu_) = 0;
  uint64_t connect_timer_ ABSL_GUARDED_BY(connecting_mu_) = 0;
  std::optional<absl::Status> connect_cut_ ABSL_GUARDED_BY(connecting_mu_);
  std::optional<absl::Status> abandoned_why_ ABSL_GUARDED_BY(connecting_mu_);
  DeadlineTimer timer_;
  std::atomic<size_t> next_{0};
  std::atomic<int> opened_{0};
  Counters counters_;

  mutable absl::Mutex mu_;
  bool have_offer_ ABSL_GUARDED_BY(mu_) = false;
  v1::OpenChannelResponse offer_ ABSL_GUARDED_BY(mu_);
  bool over_unix_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time grpc_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool logged_ ABSL_GUARDED_BY(mu_) = false;
  std::string route_ ABSL_GUARDED_BY(mu_) = "grpc";
  bool abandoned_ ABSL_GUARDED_BY(mu_) = false;  // Abandon: no connection opened
  std::vector<std::shared_ptr<Connection>> slots_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pserver

#endif  // PSERVER_CC_CLIENT_CHANNEL_TRANSPORT_H_
