// ReplicaChannel: a primary's link to one backup (docs/replication.md,
// "Replication over the bulk channel"). Each replicated write travels as one
// bulk channel frame (cc/rpc/frame.h kReplicate) on one long-lived
// connection to the backup's bulk listener: the backup's abstract Unix
// socket when it is on this host, else TCP to its gRPC host; the request's
// bytes are written as they are (no protobuf re-encode). Several writes may be
// in flight at once; the backup answers them in order and replies are
// matched by call id.
//
//   ReplicaChannel channel(shard, "10.0.0.3:7000", stub, /*next_lsn=*/last + 1, {});
//   absl::Status acked = channel.Send(write, absl::Now() + absl::Seconds(10));
//
// Opening asks the backup where its channel listens (OpenChannel over gRPC)
// and presents its token, as clients do (cc/client/channel_transport.h). A
// backup whose channel cannot be opened (off, full, not reachable) is sent
// its writes as gRPC Replicate calls, and the channel is tried again after
// `retry_after`. With roles on the backup authorizes "Replicate" for the
// connection's principal; without, the channel token is the proof.
//
// Answers: no thread of the channel's own reads them. A sender waiting for
// its answer (Await, Send) reads the connection's replies itself when no
// other waiter is reading them, until its own arrives, and hands the reading
// over (to whichever waiter the mutex wakes next) when it has it; answers to
// other waiters that it reads on the way are handed to them. One writer
// waiting on one backup is thus woken by the backup's answer itself, not by
// a reader thread that then wakes it (docs/replication.md, "Replication over
// the bulk channel").
//
// Order: the backup serves one connection's frames one at a time and holds a
// write until every earlier LSN arrived, so a frame must never be written
// behind a later LSN on the same connection. Send writes LSN n only once
// every LSN below n was written on the current connection or handed to gRPC
// (the first expected is `next_lsn`); a broken connection, or an UNAVAILABLE
// answer, fails every write in flight on it (UNAVAILABLE: the caller
// retries) and the lowest of them goes first again on the next connection.
// Over gRPC one write is in flight at a time, in LSN order (each call holds
// one of the backup's gRPC threads until the earlier LSNs arrived).
//
// Thread-safe.
#ifndef PSERVER_CC_SERVER_REPLICA_CHANNEL_H_
#define PSERVER_CC_SERVER_REPLICA_CHANNEL_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cc/rpc/byte_stream.h"
#include "cc/server/backup_log.h"
#include "pserver/v1/service.grpc.pb.h"

namespace pserver {

// The payload of a kReplicate frame: a 32-byte header (shard u32, 4 zero
// bytes, epoch u64, LSN u64, method length u32, 4 zero bytes; little-endian),
// the method name, then the request's bytes to the end.
inline constexpr size_t kReplicateHeaderBytes = 32;
// The longest method name a replicated write carries.
inline constexpr size_t kMaxReplicateMethodBytes = 64;

// The header and method of `write` (its request bytes follow them).
std::string EncodeReplicateHeader(uint32_t shard, const BackupLog::Write& write);

struct ReplicateFrame {
  uint32_t shard = 0;
  uint64_t epoch = 0;
  uint64_t lsn = 0;
  std::string method;
};
// Decodes the header and method at the start of a kReplicate payload of
// `payload_bytes` in all (`in` holds at least kReplicateHeaderBytes);
// `*method_bytes` is set to the method's length (which follows the header).
// INVALID_ARGUMENT naming what is wrong: a payload shorter than the header,
// nonzero padding, LSN 0, or a method name that is empty, longer than
// kMaxReplicateMethodBytes or than the payload.
absl::StatusOr<ReplicateFrame> DecodeReplicateHeader(const char* in, uint64_t payload_bytes,
                                                     size_t* method_bytes);
// INVALID_ARGUMENT unless `method` is one a primary replicates ("SendGrads"
// or one of Dispatcher::kReplicatedMethods).
absl::Status CheckReplicatedMethod(absl::string_view method);

struct ReplicaChannelOptions {
  // Opening the channel (OpenChannel, connect, token) takes at most this long.
  absl::Duration connect_timeout = absl::Seconds(5);
  // Try the backup's Unix socket before TCP.
  bool unix_socket = true;
  // After the channel could not be opened, writes use gRPC Replicate this long.
  absl::Duration retry_after = absl::Seconds(1);
  // A write to the backup's socket that makes no progress this long fails
  // (a paused backup, a silent host) and breaks the connection.
  absl::Duration io_timeout = absl::Seconds(10);
  // false: gRPC Replicate only (the channel is never opened).
  bool enabled = true;
  // A bearer token sent with every gRPC call (OpenChannel, Replicate) as
  // "authorization: Bearer <token>": the primary's --peer_token_file. "": none.
  std::string bearer_token;
};

class ReplicaChannel {
 public:
  // `address`: the backup's gRPC address; `stub`: a stub to it (OpenChannel
  // and the gRPC fallback), which must outlive this. `next_lsn`: the first
  // LSN that will be sent.
  ReplicaChannel(uint32_t shard, std::string address, v1::ParameterServer::Stub* stub,
                 uint64_t next_lsn, ReplicaChannelOptions options = {});
  // Closes the connection; no Send may be running.
  ~ReplicaChannel();
  ReplicaChannel(const ReplicaChannel&) = delete;
  ReplicaChannel& operator=(const ReplicaChannel&) = delete;

  // Sends `write` and returns the backup's answer (BackupLog::Deliver's),
  // or UNAVAILABLE when the connection broke or could not be opened (retry:
  // the backup applies a write once), ABORTED once the channel is closed
  // (Close: no use retrying), DEADLINE_EXCEEDED at `deadline`.
  absl::Status Send(const BackupLog::Write& write, absl::Time deadline);

  // A write handed over on the channel, its answer still to come.
  class Posted;
  // Writes `write` on the open connection now and returns without waiting
  // for its answer (Await it), when that can be done at once: a connection
  // is open, the frame fits it, no other sender is writing and every lower
  // LSN was handed over. Otherwise null, nothing sent: Send it. The frame
  // itself is written on this thread (the kernel's socket buffers hold it
  // while the backup reads). The write's bytes must stay alive until Await.
  std::shared_ptr<Posted> Post(const BackupLog::Write& write);
  // The posted write's answer, as Send returns it.
  absl::Status Await(Posted& posted, absl::Time deadline);

  // Gives up on the backup for good (its address refuses connections, or
  // it left its shard: its primary drops it): every write in flight, every
  // Send waiting for its turn behind a write that never went out, and every
  // Send from now on are answered ABORTED `why` at once (Post declines).
  void Close(const std::string& why);

  // Writes sent (and answered, whatever the answer) over the channel, and
  // over gRPC Replicate.
  uint64_t sent_over_channel() const { return over_channel_.load(); }
  uint64_t sent_over_grpc() const { return over_grpc_.load(); }
  // What the last write went over: "unix", "tcp" or "grpc".
  std::string route() const;

 private:
  struct Connection;
  struct Pending {
    uint64_t lsn = 0;
    bool done = false;
    absl::Status status;
  };
  // Writes `write` as a frame on `connection` (the sender's turn taken:
  // writing_ set, and given back here); its answer will be in the result.
  std::shared_ptr<Posted> HandOver(const std::shared_ptr<Connection>& connection,
                                   const BackupLog::Write& write, absl::Time deadline);

  // Opens a connection (OpenChannel, connect, hello); null with the reason
  // when it cannot be opened.
  absl::StatusOr<std::shared_ptr<Connection>> Open(absl::Time deadline);
  // One reply read from a connection: its header and message.
  struct Reply;
  // Reads the next reply on `connection` (the caller holds its reading
  // turn). DEADLINE_EXCEEDED when it was not read whole by `deadline`,
  // UNAVAILABLE when the connection broke (either way it is of no more use).
  absl::StatusOr<Reply> ReadReply(Connection& connection, absl::Time deadline);
  // Hands `reply` to the write it answers, if one still waits for it.
  void Answered(Connection* connection, const Reply& reply) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A write that did not get through: UNAVAILABLE `why` (retry), or ABORTED
  // once the channel is closed.
  absl::Status Failed(const std::string& why) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Why a write found its connection gone: broken, or the channel closed.
  std::string Broken() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Fails every write in flight on `connection` (when it is the current one)
  // as Failed(why), marks their LSNs to be resent, and forgets the
  // connection.
  void Break(Connection* connection, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SendOverGrpc(const BackupLog::Write& write, absl::Time deadline);
  // A gRPC call's deadline and, when set, the bearer token.
  void PrepareCall(absl::Time deadline, grpc::ClientContext* context) const;
  // Whether LSN `lsn` may be handed over now: no lower LSN waits to be
  // handed over (again) before it.
  bool MayHandOver(uint64_t lsn) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // `lsn` was handed over (written, or given to gRPC).
  void HandedOver(uint64_t lsn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint32_t shard_;
  const std::string address_;
  v1::ParameterServer::Stub* const stub_;
  const ReplicaChannelOptions options_;
  std::atomic<uint64_t> over_channel_{0};
  std::atomic<uint64_t> over_grpc_{0};

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string closed_why_ ABSL_GUARDED_BY(mu_);  // Close's; "": not closed
  bool writing_ ABSL_GUARDED_BY(mu_) = false;  // a sender has its turn
  // The next LSN never handed over yet (written on a connection or sent
  // over gRPC); every lower one was, once at least.
  uint64_t next_lsn_ ABSL_GUARDED_BY(mu_);
  // LSNs handed over on a connection that broke, or answered UNAVAILABLE
  // there, and not yet handed over again: the lowest goes first.
  std::set<uint64_t> resend_ ABSL_GUARDED_BY(mu_);
  uint64_t next_call_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::shared_ptr<Connection> connection_ ABSL_GUARDED_BY(mu_);  // null: none open
  // On connection_, by call id.
  std::map<uint64_t, std::shared_ptr<Pending>> pending_ ABSL_GUARDED_BY(mu_);
  absl::Time grpc_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::string route_ ABSL_GUARDED_BY(mu_) = "grpc";
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_REPLICA_CHANNEL_H_
