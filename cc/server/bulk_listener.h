// BulkListener: the server end of the bulk channel (cc/rpc/frame.h), a
// framed byte stream beside gRPC for GetParams, SendGrads and PushPull.
//
//   BulkListenerOptions options;              // host, limits
//   PS_ASSIGN_OR_RETURN(auto bulk, BulkListener::Start(&dispatcher, options));
//   v1::OpenChannelResponse offer = bulk->Offer();   // what OpenChannel answers
//   bulk->Stop();                                    // also done by the destructor
//
// It listens on TCP (the gRPC host, a free port) and, for clients on the same
// host and network namespace, on an abstract Unix socket. A connection must
// first present the server's random token (kHello); then each request frame
// runs the same bulk method the gRPC face runs (service.h FindBulkMethod: the
// serving check, exactly-once ids, counters, reply budget) and is answered
// with the method's reply bytes and status. On a standby it also serves its
// primary's replicated writes (kReplicate, with options.replicate; the role
// that may "Replicate" when roles are on). One thread per connection serves
// its frames in order; at most `max_connections` connections are served, a
// further one is answered RESOURCE_EXHAUSTED and closed. A malformed or
// oversized frame, or a wrong token, is answered (when its id is known) and
// closes that connection; it is counted (GetStats requests_rejected, and
// malformed_frames() here). A frame whose payload is not all in within
// `frame_receive_timeout` of its header (a client that stalls mid-frame)
// ends its connection and gives its bytes back (frame_deadlines.h; counted
// in requests_rejected and frames_timed_out()).
//
// Thread-safe.
#ifndef PSERVER_CC_SERVER_BULK_LISTENER_H_
#define PSERVER_CC_SERVER_BULK_LISTENER_H_

#include <atomic>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cc/auth/authorizer.h"
#include "cc/rpc/byte_stream.h"
#include "cc/rpc/frame.h"
#include "cc/rpc/transport_limits.h"
#include "cc/server/dispatcher.h"
#include "cc/server/frame_deadlines.h"
#include "cc/server/reply_budget.h"
#include "cc/security/tls.h"
#include "cc/server/backup_log.h"
#include "pserver/v1/service.pb.h"

namespace pserver {

struct BulkListenerOptions {
  // Where TCP connections are accepted (the gRPC server's host); port 0: free.
  std::string host = "127.0.0.1";
  int port = 0;
  // Also listen on an abstract Unix socket for same-host clients.
  bool unix_socket = true;
  // Connections served at once (--max_bulk_connections); more are refused.
  int max_connections = 256;
  // The largest request payload (--max_message_bytes).
  uint64_t max_frame_bytes = kDefaultMaxMessageBytes;
  // Request payload bytes read or being served at once, over all
  // connections (--max_bulk_request_bytes_in_flight). A frame that does not
  // fit now is read and dropped and answered UNAVAILABLE ("retry later",
  // which clients retry); one larger than the whole budget,
  // RESOURCE_EXHAUSTED. The connection stays open either way.
  uint64_t max_request_bytes_in_flight = uint64_t{1} << 30;
  // A connection that has not presented its token by then is closed.
  absl::Duration hello_timeout = absl::Seconds(10);
  // A frame's payload must be all in by this long after its header
  // (--bulk_frame_receive_timeout_seconds), else the connection is closed
  // and the bytes it held of the request budget given back (the client
  // retries on a new one). Zero or infinite: no deadline.
  absl::Duration frame_receive_timeout = absl::Seconds(60);
  // A plain connection's thread polls for up to this long for the next
  // request before it sleeps (cc/rpc/byte_stream.h ReadSpin: only while a
  // core is free, backing off on an idle connection); 0: never.
  absl::Duration read_spin = absl::Microseconds(50);
  // Roles (docs/security.md); null or disabled: off. When on, the hello
  // frame carries a bearer token after the channel token; its principal
  // (or, without a token, that of the verified TLS client certificate under
  // the authorizer's cert rule, as on gRPC) is the connection's, and each
  // frame's method is authorized against it (a refused frame is answered
  // PERMISSION_DENIED, the connection stays). A hello whose credentials the
  // authorizer does not accept is refused and closes the connection (the
  // client keeps to gRPC). Must outlive the listener.
  const Authorizer* auth = nullptr;

  // TLS on: every connection is mutual TLS (TCP only; the TLS handshake
  // also ends by hello_timeout).
  TlsOptions tls;

  // A standby's: applies a write its primary replicated (a kReplicate frame,
  // cc/server/replica_channel.h; BackupReplication::Deliver) and returns once
  // it is applied. Null: such frames are answered FAILED_PRECONDITION.
  std::function<absl::Status(uint32_t shard, BackupLog::Write write)> replicate;
};

class BulkListener {
 public:
  // INVALID_ARGUMENT for max_connections < 1; UNAVAILABLE when a socket
  // cannot be bound. `dispatcher` must outlive the listener.
  static absl::StatusOr<std::unique_ptr<BulkListener>> Start(Dispatcher* dispatcher,
                                                             const BulkListenerOptions& options);
  ~BulkListener();
  BulkListener(const BulkListener&) = delete;
  BulkListener& operator=(const BulkListener&) = delete;

  // What OpenChannel answers: the TCP port, the Unix socket, the token.
  const v1::OpenChannelResponse& Offer() const { return offer_; }

  // Stops accepting, closes every connection and waits for their threads.
  // Idempotent.
  void Stop();

  // Closes every connection (as a network failure would); clients reconnect.
  void DropConnections();

  uint64_t malformed_frames() const { return malformed_.load(); }
  // Request bytes held now (0 once every frame has been served).
  uint64_t request_bytes_held() const { return request_budget_.held(); }
  uint64_t refused_connections() const { return refused_.load(); }
  // Connections that switched to the AEAD layer after TLS (--tls_bulk_aead).
  uint64_t aead_connections() const { return aead_.load(); }
  // Connections closed because a frame's payload was not in by
  // frame_receive_timeout.
  uint64_t frames_timed_out() const { return deadlines_.expired(); }
  int connections() const;

 private:
  struct Connection {
    std::unique_ptr<SocketStream> stream;
    std::thread thread;
    std::atomic<bool> finished{false};
  };

  BulkListener(Dispatcher* dispatcher, const BulkListenerOptions& options);
  void AcceptLoop(int listen_fd);
  // Takes a new connection, or refuses it when full or stopping.
  void Admit(int fd);
  // Joins the threads of finished connections.
  void ReapFinished() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Serve(SocketStream& socket);
  // Checks the hello frame on `stream` (`fd`: its socket, for the hello's
  // receive timeout): the channel token, then a bearer token. With auth on,
  // the token, or else the TLS peer's verified certificate (`peer`), names
  // the connection's principal, which every later frame is checked against.
  absl::Status CheckHello(ByteStream& stream, int fd, const std::optional<CertNames>& peer,
                          std::optional<Principal>* principal);
  // Reads and answers one request frame; an error closes the connection.
  // `socket`: the connection's (shut down when the frame's payload is late).
  // A PushPull's reply is streamed while it is applied (streamed_push_pull.h)
  // on `plain`, the connection's socket when `stream` is that socket itself
  // (no TLS), or, `sealed`, through `stream`'s AEAD layer.
  absl::Status ServeFrame(ByteStream& stream, SocketStream& socket, SocketStream* plain,
                          bool sealed,
                          const std::optional<Principal>& principal);
  // Reads the rest of a kReplicate frame (`header`) and applies it
  // (options_.replicate), its answer in `*answer`; a malformed one is
  // refused (read and dropped) and changes nothing. An error: the stream's.
  // `receiving` (the frame's deadline) is disarmed once it is read.
  absl::Status ServeReplicate(ByteStream& stream, const RequestHeader& header,
                              FrameDeadlines::Armed& receiving, absl::Status* answer);
  // Reads and drops `bytes` of payload, in small pieces.
  static absl::Status Discard(ByteStream& stream, uint64_t bytes);
  // Counts a malformed frame and tells the peer why (best effort).
  absl::Status Malformed(ByteStream& stream, uint64_t call_id, const absl::Status& why);

  Dispatcher* const dispatcher_;
  const BulkListenerOptions options_;
  v1::OpenChannelResponse offer_;
  std::vector<int> listen_fds_;
  std::vector<std::thread> acceptors_;
  std::atomic<uint64_t> malformed_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> aead_{0};
  ReplyBudget request_budget_;
  FrameDeadlines deadlines_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::list<std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_BULK_LISTENER_H_
