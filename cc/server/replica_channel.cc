#include "cc/server/replica_channel.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "cc/auth/authorizer.h"
#include "cc/core/status_macros.h"
#include "cc/rpc/frame.h"
#include "cc/rpc/grpc_status.h"
#include "cc/server/dispatcher.h"
#include "grpcpp/grpcpp.h"

namespace pserver {
namespace {

void Put(uint64_t value, int bytes, char* out) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}
uint64_t Get(const char* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t{static_cast<uint8_t>(in[i])} << (8 * i);
  return value;
}

// Bounds every read (SO_RCVTIMEO) or write (SO_SNDTIMEO) on a socket stream;
// zero: no bound. Other streams are left as they are.
void SetTimeout(ByteStream& stream, int option, absl::Duration timeout) {
  auto* socket = dynamic_cast<SocketStream*>(&stream);
  if (socket == nullptr) return;
  timeval tv = absl::ToTimeval(timeout);
  setsockopt(socket->fd(), SOL_SOCKET, option, &tv, sizeof(tv));
}

}  // namespace

std::string EncodeReplicateHeader(uint32_t shard, const BackupLog::Write& write) {
  std::string out(kReplicateHeaderBytes, '\0');
  Put(shard, 4, out.data());
  Put(write.epoch, 8, out.data() + 8);
  Put(write.lsn, 8, out.data() + 16);
  Put(write.method.size(), 4, out.data() + 24);
  out.append(write.method);
  return out;
}

absl::StatusOr<ReplicateFrame> DecodeReplicateHeader(const char* in, uint64_t payload_bytes,
                                                     size_t* method_bytes) {
  if (payload_bytes < kReplicateHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a Replicate frame of ", payload_bytes, " bytes is shorter than its ",
                     kReplicateHeaderBytes, "-byte header"));
  }
  if (Get(in + 4, 4) != 0 || Get(in + 28, 4) != 0) {
    return absl::InvalidArgumentError("nonzero padding in a Replicate frame's header");
  }
  ReplicateFrame frame;
  frame.shard = static_cast<uint32_t>(Get(in, 4));
  frame.epoch = Get(in + 8, 8);
  frame.lsn = Get(in + 16, 8);
  const uint64_t method = Get(in + 24, 4);
  if (frame.lsn == 0) return absl::InvalidArgumentError("a Replicate frame carries LSN 0");
  if (method == 0 || method > kMaxReplicateMethodBytes ||
      method > payload_bytes - kReplicateHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a Replicate frame's method name of ", method, " bytes (must be 1-",
        kMaxReplicateMethodBytes, " and within the frame's ", payload_bytes, ")"));
  }
  *method_bytes = static_cast<size_t>(method);
  return frame;
}

absl::Status CheckReplicatedMethod(absl::string_view method) {
  if (method == "SendGrads") return absl::OkStatus();
  // A live move's writes (cc/server/move.h, IsMoveWrite).
  if (method == "MoveMarks" || method == "ReceiveBlocks") return absl::OkStatus();
  for (const char* const* name = Dispatcher::kReplicatedMethods; *name != nullptr; ++name) {
    if (method == *name) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", absl::CHexEscape(method), "' is not a replicated write"));
}

// ---- the primary's link ---------------------------------------------------------------

struct ReplicaChannel::Connection {
  std::unique_ptr<ByteStream> stream;
  std::string kind;  // "unix" or "tcp"
  uint64_t max_frame_bytes = 0;  // the backup's (its --max_message_bytes)
  // A waiter is reading its replies (guarded by the channel's mu_).
  bool reading = false;
};

struct ReplicaChannel::Reply {
  ReplyHeader header;
  std::string message;
};

ReplicaChannel::ReplicaChannel(uint32_t shard, std::string address,
                               v1::ParameterServer::Stub* stub, uint64_t next_lsn,
                               ReplicaChannelOptions options)
    : shard_(shard),
      address_(std::move(address)),
      stub_(stub),
      options_(options),
      next_lsn_(next_lsn) {}

ReplicaChannel::~ReplicaChannel() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (connection_ != nullptr) Break(connection_.get(), "the link to the backup is closing");
    auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !writing_; };
    mu_.Await(absl::Condition(&idle));
    if (connection_ != nullptr) Break(connection_.get(), "the link to the backup is closing");
  }
}

void ReplicaChannel::Close(const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  stopping_ = true;
  // Never empty: an empty reason means "open" to Send, which would answer
  // UNAVAILABLE (retried) instead of ABORTED.
  closed_why_ = why.empty() ? absl::StrCat("the link to backup at ", address_, " was closed") : why;
  if (connection_ != nullptr) Break(connection_.get(), closed_why_);
}

absl::Status ReplicaChannel::Failed(const std::string& why) const {
  return closed_why_.empty() ? absl::UnavailableError(why) : absl::AbortedError(why);
}

std::string ReplicaChannel::Broken() const {
  return absl::StrCat("the bulk channel to backup at ", address_,
                      closed_why_.empty() ? " broke; retry" : " is closed");
}

std::string ReplicaChannel::route() const {
  absl::MutexLock lock(&mu_);
  return route_;
}

bool ReplicaChannel::MayHandOver(uint64_t lsn) const {
  return lsn <= (resend_.empty() ? next_lsn_ : *resend_.begin());
}

void ReplicaChannel::HandedOver(uint64_t lsn) {
  resend_.erase(lsn);
  next_lsn_ = std::max(next_lsn_, lsn + 1);
}

void ReplicaChannel::Break(Connection* connection, const std::string& why) {
  if (connection_.get() != connection) return;  // broken already
  connection->stream->Shutdown();
  for (auto& [id, pending] : pending_) {
    pending->done = true;
    pending->status = Failed(why);
    resend_.insert(pending->lsn);
  }
  pending_.clear();
  // Waiters still hold it (a reader's read returns: the stream is shut down).
  connection_ = nullptr;
}

void ReplicaChannel::PrepareCall(absl::Time deadline, grpc::ClientContext* context) const {
  context->set_deadline(absl::ToChronoTime(deadline));
  if (!options_.bearer_token.empty()) {
    context->AddMetadata(kAuthorizationMetadataKey,
                         absl::StrCat(kBearerPrefix, options_.bearer_token));
  }
}

absl::StatusOr<std::shared_ptr<ReplicaChannel::Connection>> ReplicaChannel::Open(
    absl::Time deadline) {
  grpc::ClientContext context;
  PrepareCall(deadline, &context);
  v1::OpenChannelResponse offer;
  PS_RETURN_IF_ERROR(
      FromGrpcStatus(stub_->OpenChannel(&context, v1::OpenChannelRequest(), &offer)));
  if (offer.token().size() != kChannelTokenBytes) {
    return absl::FailedPreconditionError("the backup offered a bulk channel token of the wrong size");
  }
  auto connection = std::make_shared<Connection>();
  connection->max_frame_bytes = offer.max_frame_bytes();
  if (options_.unix_socket && !offer.unix_socket().empty()) {
    absl::StatusOr<std::unique_ptr<ByteStream>> local = ConnectAbstractUnix(offer.unix_socket());
    if (local.ok()) {  // else another host or network namespace: TCP
      connection->stream = *std::move(local);
      connection->kind = "unix";
    }
  }
  if (connection->stream == nullptr) {
    const std::string host = TargetHost(address_);
    if (host.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("backup address ", address_, " names no TCP host for its bulk channel"));
    }
    PS_ASSIGN_OR_RETURN(connection->stream,
                        ConnectTcp(host, static_cast<int>(offer.tcp_port()),
                                   std::max(deadline - absl::Now(), absl::Milliseconds(1))));
    connection->kind = "tcp";
  }
  ByteStream& stream = *connection->stream;
  // A backup that stops reading (paused, or its host gone silent) fails a
  // write after this long, rather than blocking its sender for good.
  SetTimeout(stream, SO_SNDTIMEO, options_.io_timeout);
  char header[kFrameHeaderBytes];
  EncodeRequestHeader({FrameMethod::kHello, 0, 0, offer.token().size()}, header);
  PS_RETURN_IF_ERROR(stream.Write({absl::string_view(header, sizeof(header)), offer.token()}));
  SetTimeout(stream, SO_RCVTIMEO, std::max(deadline - absl::Now(), absl::Milliseconds(1)));
  char encoded[kReplyHeaderBytes];
  PS_RETURN_IF_ERROR(stream.Read(encoded, sizeof(encoded)));
  PS_ASSIGN_OR_RETURN(ReplyHeader reply, DecodeReplyHeader(encoded, /*max_payload_bytes=*/0));
  std::string message(reply.message_bytes, '\0');
  PS_RETURN_IF_ERROR(stream.Read(message.data(), message.size()));
  SetTimeout(stream, SO_RCVTIMEO, absl::ZeroDuration());
  if (reply.code != absl::StatusCode::kOk) return absl::Status(reply.code, message);
  return connection;
}

absl::StatusOr<ReplicaChannel::Reply> ReplicaChannel::ReadReply(Connection& connection,
                                                                 absl::Time deadline) {
  ByteStream& stream = *connection.stream;
  // The read is bounded by the deadline (SO_RCVTIMEO; zero: none). A read
  // that fails at it timed out, whatever it had read: the caller breaks the
  // connection either way.
  const absl::Duration left =
      deadline == absl::InfiniteFuture() ? absl::ZeroDuration() : deadline - absl::Now();
  if (deadline != absl::InfiniteFuture() && left <= absl::ZeroDuration()) {
    return absl::DeadlineExceededError("no answer arrived in time");
  }
  // Rounded up: a timeout that ends on time ends at the deadline or later.
  SetTimeout(stream, SO_RCVTIMEO, absl::Ceil(left, absl::Microseconds(1)));
  Reply reply;
  char encoded[kReplyHeaderBytes];
  absl::Status read = stream.Read(encoded, sizeof(encoded));
  if (read.ok()) {
    absl::StatusOr<ReplyHeader> header = DecodeReplyHeader(encoded, /*max_payload_bytes=*/0);
    if (!header.ok()) return header.status();  // not a reply: the connection breaks
    reply.header = *header;
    reply.message.resize(reply.header.message_bytes);
    read = stream.Read(reply.message.data(), reply.message.size());
  }
  if (read.ok()) return reply;
  if (absl::Now() >= deadline) return absl::DeadlineExceededError("no answer arrived in time");
  return read;
}

void ReplicaChannel::Answered(Connection* connection, const Reply& reply) {
  if (connection_.get() != connection) return;
  const absl::StatusCode code = reply.header.code;
  if (auto it = pending_.find(reply.header.call_id); it != pending_.end()) {
    it->second->done = true;
    it->second->status = absl::Status(code, reply.message);
    if (code == absl::StatusCode::kUnavailable) resend_.insert(it->second->lsn);
    pending_.erase(it);
  }
  // Not applied (the backup's budget, its copy loading, a newer epoch it
  // has yet to learn): later writes on this connection would wait behind
  // it at the backup; every one in flight is resent, this one first.
  if (code == absl::StatusCode::kUnavailable) {
    Break(connection, absl::StrCat("backup at ", address_, " answered a write: ", reply.message));
  }
}

absl::Status ReplicaChannel::SendOverGrpc(const BackupLog::Write& write, absl::Time deadline) {
  v1::ReplicateRequest request;
  request.set_shard(shard_);
  request.set_epoch(write.epoch);
  request.set_lsn(write.lsn);
  request.set_method(write.method);
  request.set_request(write.request_bytes());  // gRPC needs it in one piece
  grpc::ClientContext context;
  PrepareCall(deadline, &context);
  v1::ReplicateResponse response;
  absl::Status status = FromGrpcStatus(stub_->Replicate(&context, request, &response));
  over_grpc_.fetch_add(1);
  return status;
}

class ReplicaChannel::Posted {
 public:
  Posted(std::shared_ptr<Connection> connection, std::shared_ptr<Pending> pending,
         uint64_t call_id)
      : connection_(std::move(connection)), pending_(std::move(pending)), call_id_(call_id) {}

 private:
  friend class ReplicaChannel;
  std::shared_ptr<Connection> connection_;
  std::shared_ptr<Pending> pending_;
  uint64_t call_id_;
};

std::shared_ptr<ReplicaChannel::Posted> ReplicaChannel::Post(const BackupLog::Write& write) {
  std::shared_ptr<Connection> connection;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || writing_ || connection_ == nullptr || !MayHandOver(write.lsn)) return nullptr;
    const uint64_t payload = kReplicateHeaderBytes + write.method.size() + write.request_size();
    if (payload > connection_->max_frame_bytes) return nullptr;
    // Resent below one in flight: Send starts over on a fresh connection.
    for (const auto& [id, pending] : pending_) {
      if (pending->lsn >= write.lsn) return nullptr;
    }
    writing_ = true;
    connection = connection_;
  }
  return HandOver(connection, write, absl::InfiniteFuture());
}

std::shared_ptr<ReplicaChannel::Posted> ReplicaChannel::HandOver(
    const std::shared_ptr<Connection>& connection, const BackupLog::Write& write,
    absl::Time deadline) {
  auto pending = std::make_shared<Pending>();
  pending->lsn = write.lsn;
  uint64_t call_id = 0;
  {
    absl::MutexLock lock(&mu_);
    if (connection_ != connection) {  // broke meanwhile: nothing was handed over
      writing_ = false;
      pending->done = true;
      pending->status = Failed(Broken());
      return std::make_shared<Posted>(connection, std::move(pending), 0);
    }
    call_id = next_call_id_++;
    pending_[call_id] = pending;
    HandedOver(write.lsn);  // if the write fails, Break marks it to be resent
  }
  const uint64_t payload = kReplicateHeaderBytes + write.method.size() + write.request_size();
  char header[kFrameHeaderBytes];
  // The backup drops a frame whose timeout passed before it served it; a
  // posted write has none of its own (0: none), its waiter's deadline rules.
  const uint64_t timeout_micros =
      deadline == absl::InfiniteFuture()
          ? 0
          : static_cast<uint64_t>(absl::ToInt64Microseconds(
                std::max(deadline - absl::Now(), absl::Microseconds(1))));
  EncodeRequestHeader({FrameMethod::kReplicate, call_id, timeout_micros, payload}, header);
  const std::string replicate = EncodeReplicateHeader(shard_, write);
  // The request's bytes as the write holds them: no copy.
  std::vector<absl::string_view> parts = {absl::string_view(header, sizeof(header)), replicate};
  for (absl::string_view part : write.request_parts()) parts.push_back(part);
  const absl::Status written = connection->stream->Write(parts);
  absl::MutexLock lock(&mu_);
  writing_ = false;
  route_ = connection->kind;
  if (!written.ok()) {
    Break(connection.get(), absl::StrCat("writing to backup at ", address_,
                                         " failed: ", written.message()));
  }
  return std::make_shared<Posted>(connection, std::move(pending), call_id);
}

absl::Status ReplicaChannel::Await(Posted& posted, absl::Time deadline) {
  Pending& pending = *posted.pending_;
  Connection* const connection = posted.connection_.get();
  absl::MutexLock lock(&mu_);
  // Answered, or nobody reads the connection's replies: this waiter does.
  auto answered_or_free = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return pending.done || !connection->reading;
  };
  bool timed_out = false;
  while (!pending.done && !timed_out) {
    if (!mu_.AwaitWithDeadline(absl::Condition(&answered_or_free), deadline)) {
      timed_out = true;
      break;
    }
    if (pending.done) break;
    if (connection_.get() != connection) {  // not expected: Break answers every write
      pending.done = true;
      pending.status = Failed(Broken());
      break;
    }
    connection->reading = true;
    mu_.Unlock();
    absl::StatusOr<Reply> reply = ReadReply(*connection, deadline);
    mu_.Lock();
    connection->reading = false;
    if (reply.ok()) {
      Answered(connection, *reply);
    } else if (absl::IsDeadlineExceeded(reply.status())) {
      timed_out = true;
    } else {
      Break(connection, absl::StrCat("the bulk channel to backup at ", address_,
                                     " broke: ", reply.status().message()));
    }
  }
  if (timed_out && !pending.done) {
    // The connection goes with it: a late answer would match nothing.
    Break(connection, absl::StrCat("LSN ", pending.lsn, " timed out at backup ", address_));
    pending_.erase(posted.call_id_);
    return absl::DeadlineExceededError(absl::StrCat(
        "backup at ", address_, " did not answer LSN ", pending.lsn, " in time"));
  }
  if (posted.call_id_ != 0) over_channel_.fetch_add(1);
  return pending.status;
}

absl::Status ReplicaChannel::Send(const BackupLog::Write& write, absl::Time deadline) {
  std::shared_ptr<Connection> connection;
  bool try_open = false;
  {
    absl::MutexLock lock(&mu_);
    auto turn = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return stopping_ || (!writing_ && MayHandOver(write.lsn));
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&turn), deadline)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "LSN ", write.lsn, " was not sent to backup at ", address_, ": LSN ",
          resend_.empty() ? next_lsn_ : *resend_.begin(), " before it was not sent in time"));
    }
    if (stopping_) {
      return Failed(closed_why_.empty()
                        ? absl::StrCat("the link to backup at ", address_, " is closing")
                        : closed_why_);
    }
    // A write resent below one already in flight would queue behind it at
    // the backup, which waits for it: start over on a fresh connection.
    const bool behind = std::any_of(pending_.begin(), pending_.end(), [&](const auto& entry) {
      return entry.second->lsn >= write.lsn;
    });
    if (behind) {
      Break(connection_.get(), absl::StrCat("LSN ", write.lsn, " is resent to backup at ",
                                            address_, "; the later ones go after it"));
    }
    writing_ = true;  // this sender's turn: nobody else writes meanwhile
    connection = connection_;
    try_open = connection == nullptr && options_.enabled && absl::Now() >= grpc_until_;
  }
  if (try_open) {
    absl::StatusOr<std::shared_ptr<Connection>> opened =
        Open(std::min(deadline, absl::Now() + options_.connect_timeout));
    absl::MutexLock lock(&mu_);
    if (opened.ok()) {
      connection = *std::move(opened);
      connection_ = connection;
    } else {
      grpc_until_ = absl::Now() + options_.retry_after;
    }
  }
  const uint64_t payload = kReplicateHeaderBytes + write.method.size() + write.request_size();
  // A frame over the backup's limit goes over gRPC (as the client's request
  // it carries may be at that limit).
  if (connection == nullptr || payload > connection->max_frame_bytes) {
    // One call at a time, keeping the turn until it is answered: the
    // backup's gRPC threads may be few, and each call waits there until the
    // earlier LSNs arrived. Not applied (UNAVAILABLE): it goes first again.
    const absl::Status status = SendOverGrpc(write, deadline);
    absl::MutexLock lock(&mu_);
    writing_ = false;
    HandedOver(write.lsn);
    if (absl::IsUnavailable(status)) resend_.insert(write.lsn);
    route_ = "grpc";
    return status;
  }
  std::shared_ptr<Posted> posted = HandOver(connection, write, deadline);
  return Await(*posted, deadline);
}

}  // namespace pserver
