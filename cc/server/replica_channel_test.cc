// A primary's link to a backup (ReplicaChannel) against a backup built in
// this process: a dispatcher, its BackupReplication, a bulk listener and a
// gRPC server on 127.0.0.1. Writes go over the bulk channel (Unix socket or
// TCP) in LSN order from many threads, over gRPC Replicate when the backup
// has no channel; a stale epoch is refused; a dropped connection is reopened;
// a backup that is gone answers UNAVAILABLE; malformed Replicate frames are
// answered with a clear error and change nothing. No test depends on timing:
// every wait is for a condition, bounded by a deadline of tens of seconds.
#include "cc/server/replica_channel.h"

#include <atomic>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "cc/core/parameter_store.h"
#include "cc/core/tables.h"
#include "cc/rpc/byte_stream.h"
#include "cc/rpc/frame.h"
#include "cc/server/bulk_listener.h"
#include "cc/server/dispatcher.h"
#include "cc/server/replication.h"
#include "cc/server/service.h"
#include "cc/server/state_checksum.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusCodeIs;
using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(60);

std::string Bytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

// InitParam of "w" (3 floats), FinishInitParams, then `steps` SendGrads, as
// the writes (LSN 1, 2, ...) of epoch 1.
std::vector<BackupLog::Write> Writes(int steps) {
  std::vector<BackupLog::Write> writes;
  v1::InitParamRequest init;
  init.mutable_parameter()->set_name("w");
  init.mutable_parameter()->set_element_type(v1::FLOAT32);
  init.mutable_parameter()->add_shape(3);
  init.mutable_parameter()->set_content(Bytes({1, 2, 3}));
  init.mutable_config()->mutable_optimizer()->mutable_sgd();
  writes.push_back({1, 1, "InitParam", init.SerializeAsString()});
  writes.push_back({1, 2, "FinishInitParams", v1::FinishInitParamsRequest().SerializeAsString()});
  for (int step = 1; step <= steps; ++step) {
    v1::SendGradRequest grad;
    grad.mutable_gradient()->set_name("w");
    grad.mutable_gradient()->set_element_type(v1::FLOAT32);
    grad.mutable_gradient()->set_content(Bytes({0.25f * step, -1.0f, 3.0f / step}));
    writes.push_back({1, writes.size() + 1, "SendGrad", grad.SerializeAsString()});
  }
  return writes;
}

uint32_t Checksum(Dispatcher& dispatcher) {
  absl::StatusOr<StoreSnapshot> snapshot = dispatcher.Snapshot();
  EXPECT_OK(snapshot.status());
  if (!snapshot.ok()) return 0;
  absl::StatusOr<uint32_t> crc = ShardStateChecksum(*snapshot);
  EXPECT_OK(crc.status());
  return crc.ok() ? *crc : 0;
}

// The shard as a primary applied `writes` (a bulk push, "SendGrads", as
// a backup applies it, scanned by the store).
uint32_t PrimaryChecksum(const std::vector<BackupLog::Write>& writes) {
  ParameterStore store;
  Tables tables;
  Dispatcher dispatcher(&store, &tables, 0);
  for (const BackupLog::Write& write : writes) {
    EXPECT_OK(write.method == "SendGrads" ? ApplyReplicatedPush(dispatcher, write.request)
                                          : dispatcher.ApplyWrite(write.method, write.request))
        << write.method;
  }
  return Checksum(dispatcher);
}

// A standby of shard 0 (a copy of nothing loaded, epoch 1), in this process.
class Backup {
 public:
  // `channel`: with a bulk listener (and OpenChannel); `unix_socket`: it
  // also listens on a Unix socket.
  explicit Backup(bool channel, bool unix_socket = true) {
    DispatcherHooks hooks;
    if (channel) hooks.open_channel = [this] { return bulk_->Offer(); };
    hooks.replicate = [this](const v1::ReplicateRequest& request) {
      return replication_->Replicate(request);
    };
    dispatcher_ = std::make_unique<Dispatcher>(&store_, &tables_, 0, std::move(hooks));
    replication_ = std::make_unique<BackupReplication>(dispatcher_.get());
    replication_->Attached(/*shard=*/0, /*epoch=*/1, /*last_lsn=*/0);
    if (channel) {
      BulkListenerOptions options;
      options.unix_socket = unix_socket;
      options.replicate = [this](uint32_t shard, BackupLog::Write write) {
        if (absl::Notification* hold = hold_.load(); hold != nullptr) hold->WaitForNotification();
        return replication_->Deliver(shard, std::move(write));
      };
      absl::StatusOr<std::unique_ptr<BulkListener>> bulk =
          BulkListener::Start(dispatcher_.get(), options);
      EXPECT_OK(bulk.status());
      if (bulk.ok()) bulk_ = *std::move(bulk);
    }
    service_ = std::make_unique<ParameterServerService>(dispatcher_.get());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    service_->RegisterWith(&builder);
    grpc_ = builder.BuildAndStart();
    address_ = absl::StrCat("127.0.0.1:", port);
    stub_ = v1::ParameterServer::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }
  ~Backup() { Stop(); }

  // Stops both listeners (the backup is gone).
  void Stop() {
    if (bulk_ != nullptr) bulk_->Stop();
    if (grpc_ != nullptr) grpc_->Shutdown(absl::ToChronoTime(absl::Now()));
  }

  // Channel writes from now on wait for `hold` before they are applied (a
  // backup that does not answer); null: none.
  void HoldWritesUntil(absl::Notification* hold) { hold_.store(hold); }
  const std::string& address() const { return address_; }
  v1::ParameterServer::Stub* stub() { return stub_.get(); }
  BulkListener* bulk() { return bulk_.get(); }
  BackupReplication& replication() { return *replication_; }
  ParameterStore& store() { return store_; }
  uint32_t Checksum() { return pserver::Checksum(*dispatcher_); }

 private:
  std::atomic<absl::Notification*> hold_{nullptr};
  ParameterStore store_;
  Tables tables_;
  std::unique_ptr<Dispatcher> dispatcher_;
  std::unique_ptr<BackupReplication> replication_;
  std::unique_ptr<BulkListener> bulk_;
  std::unique_ptr<ParameterServerService> service_;
  std::unique_ptr<grpc::Server> grpc_;
  std::string address_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
};

// Sends every write from a thread of its own, the last LSN's thread
// started first; returns their answers by LSN.
std::vector<absl::Status> SendFromThreads(ReplicaChannel& channel,
                                          const std::vector<BackupLog::Write>& writes) {
  std::vector<absl::Status> answers(writes.size());
  std::vector<std::thread> threads;
  for (size_t i = writes.size(); i-- > 0;) {
    threads.emplace_back([&, i] { answers[i] = channel.Send(writes[i], absl::Now() + kWait); });
  }
  for (std::thread& t : threads) t.join();
  return answers;
}

// Sends `writes[from..]` in turn, each again while it is answered
// UNAVAILABLE (a write caught by a broken connection; at most 100 tries),
// and expects each acknowledged.
void ResendUntilAcknowledged(ReplicaChannel& channel, const std::vector<BackupLog::Write>& writes,
                             size_t from) {
  for (size_t i = from; i < writes.size(); ++i) {
    absl::Status sent;
    for (int attempt = 0; attempt < 100; ++attempt) {
      sent = channel.Send(writes[i], absl::Now() + kWait);
      if (!absl::IsUnavailable(sent)) break;
    }
    EXPECT_OK(sent) << "LSN " << writes[i].lsn;
  }
}

TEST(ReplicaChannelTest, WritesFromManyThreadsGoOverTheUnixSocketAndApplyInOrder) {
  Backup backup(/*channel=*/true);
  ReplicaChannel channel(0, backup.address(), backup.stub(), /*next_lsn=*/1);
  const std::vector<BackupLog::Write> writes = Writes(30);
  for (const absl::Status& answer : SendFromThreads(channel, writes)) EXPECT_OK(answer);
  EXPECT_EQ(backup.replication().applied_lsn(), writes.size());
  EXPECT_EQ(channel.sent_over_channel(), writes.size());
  EXPECT_EQ(channel.sent_over_grpc(), 0u);
  EXPECT_EQ(channel.route(), "unix");
  EXPECT_EQ(backup.Checksum(), PrimaryChecksum(writes));
  // One long-lived connection carried them all.
  EXPECT_EQ(backup.bulk()->connections(), 1);
}

// Post hands a write over without waiting for its answer (the primary then
// applies it meanwhile): writes posted while the backup answers nothing are
// all on the wire, and applied in order once it does. Post declines (null,
// nothing sent) before a connection is open and out of LSN order. A write
// whose request is held in pieces (SharedBytes) arrives whole.
TEST(ReplicaChannelTest, PostedWritesTravelBeforeTheirAnswersAndApplyInOrder) {
  Backup backup(/*channel=*/true);
  ReplicaChannel channel(0, backup.address(), backup.stub(), /*next_lsn=*/1);
  std::vector<BackupLog::Write> writes = Writes(8);
  EXPECT_EQ(channel.Post(writes[0]), nullptr);  // no connection yet
  ASSERT_OK(channel.Send(writes[0], absl::Now() + kWait));  // opens it
  EXPECT_EQ(channel.Post(writes[2]), nullptr);  // LSN 2 first
  // The rest in three pieces each, as a primary holds a received request.
  for (BackupLog::Write& write : writes) {
    const std::string bytes = std::move(write.request);
    write.request.clear();
    auto owned = std::make_shared<const std::string>(bytes);
    const size_t third = owned->size() / 3;
    write.shared.parts = {absl::string_view(*owned).substr(0, third),
                          absl::string_view(*owned).substr(third, third),
                          absl::string_view(*owned).substr(2 * third)};
    write.shared.owner = owned;
  }
  absl::Notification release;
  backup.HoldWritesUntil(&release);
  std::vector<std::shared_ptr<ReplicaChannel::Posted>> posted;
  for (size_t i = 1; i < writes.size(); ++i) {
    posted.push_back(channel.Post(writes[i]));
    ASSERT_NE(posted.back(), nullptr) << "LSN " << writes[i].lsn;
  }
  EXPECT_EQ(backup.replication().applied_lsn(), 1u);  // none answered yet
  release.Notify();
  for (auto& p : posted) EXPECT_OK(channel.Await(*p, absl::Now() + kWait));
  EXPECT_EQ(backup.replication().applied_lsn(), writes.size());
  EXPECT_EQ(channel.sent_over_channel(), writes.size());
  EXPECT_EQ(backup.bulk()->connections(), 1);
  std::vector<BackupLog::Write> whole = Writes(8);
  EXPECT_EQ(backup.Checksum(), PrimaryChecksum(whole));
}

// A channel opened by writes[0] whose backup then holds every write until
// `release`, with writes[1..post-1] posted (their answers to come; by
// index, 0: null).
struct HeldWrites {
  HeldWrites(int steps, size_t post) : writes(Writes(steps)), posted(post) {
    EXPECT_OK(channel.Send(writes[0], absl::Now() + kWait));  // opens the connection
    backup.HoldWritesUntil(&release);
    for (size_t i = 1; i < post; ++i) {
      posted[i] = channel.Post(writes[i]);
      EXPECT_NE(posted[i], nullptr) << "LSN " << writes[i].lsn;
    }
    EXPECT_EQ(backup.replication().applied_lsn(), 1u);  // none answered yet
  }
  ~HeldWrites() { Release(); }
  void Release() {
    backup.HoldWritesUntil(nullptr);
    if (!release.HasBeenNotified()) release.Notify();
  }
  // Lets the backup go on (a held write's answer may be lost with its
  // connection), sends writes[1..] again until acknowledged, and expects
  // each applied once.
  void ReleaseAndResend() {
    Release();
    ResendUntilAcknowledged(channel, writes, /*from=*/1);
    EXPECT_EQ(backup.replication().applied_lsn(), writes.size());
    EXPECT_EQ(backup.Checksum(), PrimaryChecksum(writes));
  }

  Backup backup{/*channel=*/true};
  ReplicaChannel channel{0, backup.address(), backup.stub(), /*next_lsn=*/1};
  const std::vector<BackupLog::Write> writes;
  absl::Notification release;
  std::vector<std::shared_ptr<ReplicaChannel::Posted>> posted;
};

// No thread of the channel reads the backup's answers: each waiter reads
// them itself while nobody else does. Writes posted while the backup answers
// nothing, awaited from one thread each in reverse LSN order (the last LSN's
// waiter may read every earlier answer and hand each to its waiter), and one
// more write sent meanwhile (a waiter arriving while another reads): every
// waiter gets its own answer, applied in order, once.
TEST(ReplicaChannelTest, WaitersReadTheirAnswersThemselvesInAnyOrder) {
  HeldWrites held(/*steps=*/10, /*post=*/11);  // all but the last of 12
  ReplicaChannel& channel = held.channel;
  const std::vector<BackupLog::Write>& writes = held.writes;
  std::vector<absl::Status> answers(writes.size());
  std::vector<std::thread> waiters;
  for (size_t i = held.posted.size(); i-- > 1;) {
    waiters.emplace_back(
        [&, i] { answers[i] = channel.Await(*held.posted[i], absl::Now() + kWait); });
  }
  // The last LSN is sent (written, then awaited) by one more thread.
  const size_t last = writes.size() - 1;
  waiters.emplace_back(
      [&] { answers[last] = channel.Send(writes[last], absl::Now() + kWait); });
  held.Release();
  for (std::thread& t : waiters) t.join();
  for (size_t i = 1; i < writes.size(); ++i) EXPECT_OK(answers[i]) << "LSN " << writes[i].lsn;
  EXPECT_EQ(held.backup.replication().applied_lsn(), writes.size());
  EXPECT_EQ(channel.sent_over_channel(), writes.size());
  EXPECT_EQ(held.backup.bulk()->connections(), 1);
  EXPECT_EQ(held.backup.Checksum(), PrimaryChecksum(writes));
}

// The connection breaks while waiters wait for answers (whichever of them
// reads the socket sees it end): each is answered UNAVAILABLE long before
// its deadline, and their writes, sent again, are applied once.
TEST(ReplicaChannelTest, AConnectionThatBreaksWhileAWaiterReadsItFailsEveryWaiter) {
  HeldWrites held(/*steps=*/1, /*post=*/3);
  const absl::Time deadline = absl::Now() + kWait;
  std::vector<absl::Status> answers(held.posted.size());
  std::vector<std::thread> waiters;
  for (size_t i = 1; i < held.posted.size(); ++i) {
    waiters.emplace_back([&, i] { answers[i] = held.channel.Await(*held.posted[i], deadline); });
  }
  held.backup.bulk()->DropConnections();
  for (std::thread& t : waiters) t.join();
  EXPECT_LT(absl::Now(), deadline);
  for (size_t i = 1; i < answers.size(); ++i) {
    EXPECT_THAT(answers[i], StatusCodeIs(absl::StatusCode::kUnavailable)) << "LSN " << i + 1;
  }
  held.ReleaseAndResend();
}

// A waiter whose deadline passes while another waiter reads the socket (or
// while it reads it itself) fails DEADLINE_EXCEEDED and breaks the
// connection: the other waiter is answered UNAVAILABLE at once rather than
// at its own, later, deadline; both writes, resent, are applied once.
TEST(ReplicaChannelTest, AWaiterThatTimesOutBreaksTheConnectionForTheOthers) {
  HeldWrites held(/*steps=*/1, /*post=*/3);
  ASSERT_NE(held.posted[1], nullptr);
  ASSERT_NE(held.posted[2], nullptr);
  const absl::Time late = absl::Now() + kWait;
  absl::Status patient;
  std::thread waiter([&] { patient = held.channel.Await(*held.posted[1], late); });
  EXPECT_THAT(held.channel.Await(*held.posted[2], absl::Now() + absl::Seconds(1)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("did not answer LSN 3")));
  waiter.join();
  EXPECT_LT(absl::Now(), late);
  EXPECT_THAT(patient, StatusCodeIs(absl::StatusCode::kUnavailable));
  held.ReleaseAndResend();
}

TEST(ReplicaChannelTest, WithoutAUnixSocketWritesGoOverTcp) {
  Backup backup(/*channel=*/true, /*unix_socket=*/false);
  ReplicaChannel channel(0, backup.address(), backup.stub(), 1);
  const std::vector<BackupLog::Write> writes = Writes(5);
  for (const absl::Status& answer : SendFromThreads(channel, writes)) EXPECT_OK(answer);
  EXPECT_EQ(channel.route(), "tcp");
  EXPECT_EQ(channel.sent_over_channel(), writes.size());
  EXPECT_EQ(backup.Checksum(), PrimaryChecksum(writes));
}

TEST(ReplicaChannelTest, ABackupWithoutAChannelGetsItsWritesOverGrpc) {
  Backup backup(/*channel=*/false);
  ReplicaChannel channel(0, backup.address(), backup.stub(), 1);
  const std::vector<BackupLog::Write> writes = Writes(5);
  for (const absl::Status& answer : SendFromThreads(channel, writes)) EXPECT_OK(answer);
  EXPECT_EQ(channel.route(), "grpc");
  EXPECT_EQ(channel.sent_over_grpc(), writes.size());
  EXPECT_EQ(channel.sent_over_channel(), 0u);
  EXPECT_EQ(backup.Checksum(), PrimaryChecksum(writes));
}

TEST(ReplicaChannelTest, AWriteOfAStaleEpochIsRefusedAndNotApplied) {
  Backup backup(/*channel=*/true);
  ReplicaChannel channel(0, backup.address(), backup.stub(), 1);
  std::vector<BackupLog::Write> writes = Writes(1);
  ASSERT_OK(channel.Send(writes[0], absl::Now() + kWait));
  backup.replication().SetEpoch(2);  // a successor took over
  EXPECT_THAT(channel.Send(writes[1], absl::Now() + kWait),
              StatusCodeIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(backup.replication().applied_lsn(), 1u);
  EXPECT_EQ(channel.sent_over_channel(), 2u);
}

TEST(ReplicaChannelTest, ADroppedConnectionIsReopenedAndNoWriteIsAppliedTwice) {
  Backup backup(/*channel=*/true);
  ReplicaChannel channel(0, backup.address(), backup.stub(), 1);
  const std::vector<BackupLog::Write> writes = Writes(6);
  for (size_t i = 0; i < writes.size(); ++i) {
    if (i % 2 == 1) backup.bulk()->DropConnections();
    // A write caught by the drop is UNAVAILABLE; resent, it is applied once.
    absl::Status sent;
    for (int attempt = 0; attempt < 100; ++attempt) {
      sent = channel.Send(writes[i], absl::Now() + kWait);
      if (!absl::IsUnavailable(sent)) break;
    }
    ASSERT_OK(sent) << "LSN " << writes[i].lsn;
    // Sent again after it was applied: acknowledged, not applied again.
    ASSERT_OK(channel.Send(writes[i], absl::Now() + kWait));
  }
  EXPECT_EQ(backup.replication().applied_lsn(), writes.size());
  EXPECT_EQ(backup.Checksum(), PrimaryChecksum(writes));
  EXPECT_EQ(channel.sent_over_grpc(), 0u);
}

TEST(ReplicaChannelTest, ABackupThatIsGoneAnswersUnavailable) {
  Backup backup(/*channel=*/true);
  ReplicaChannel channel(0, backup.address(), backup.stub(), 1);
  const std::vector<BackupLog::Write> writes = Writes(1);
  ASSERT_OK(channel.Send(writes[0], absl::Now() + kWait));
  backup.Stop();
  EXPECT_THAT(channel.Send(writes[1], absl::Now() + kWait),
              StatusCodeIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(backup.replication().applied_lsn(), 1u);
}

// Close with no reason (a backup that answered ABORTED with an empty
// message): the channel is closed all the same, so that the primary's
// Deliver stops retrying at once: its writes are answered ABORTED (not
// UNAVAILABLE, which Deliver retries) naming the backup.
TEST(ReplicaChannelTest, AChannelClosedWithoutAReasonIsClosed) {
  Backup backup(/*channel=*/true);
  ReplicaChannel channel(0, backup.address(), backup.stub(), 1);
  const std::vector<BackupLog::Write> writes = Writes(1);
  ASSERT_OK(channel.Send(writes[0], absl::Now() + kWait));
  channel.Close("");
  EXPECT_THAT(channel.Send(writes[1], absl::Now() + kWait),
              StatusIs(absl::StatusCode::kAborted, HasSubstr(backup.address())));
  EXPECT_EQ(backup.replication().applied_lsn(), 1u);
}

// Close gives up on a backup for good: a write in flight (its backup not
// answering), a write waiting for its turn behind it, and every write after
// are answered ABORTED with the reason, at once (no retry can help: the
// primary drops the backup), and nothing is posted any more. Whatever the
// order in which the two threads reach the channel, both answers are so.
TEST(ReplicaChannelTest, AClosedChannelAnswersEveryWriteAbortedAtOnce) {
  Backup backup(/*channel=*/true);
  ReplicaChannel channel(0, backup.address(), backup.stub(), 1);
  const std::vector<BackupLog::Write> writes = Writes(3);
  ASSERT_OK(channel.Send(writes[0], absl::Now() + kWait));  // the channel is open
  absl::Notification answer;
  backup.HoldWritesUntil(&answer);
  absl::Status in_flight, behind;
  std::thread first([&] { in_flight = channel.Send(writes[1], absl::Now() + kWait); });
  std::thread second([&] { behind = channel.Send(writes[2], absl::Now() + kWait); });
  channel.Close("backup b1 left its shard");
  first.join();
  second.join();
  answer.Notify();
  EXPECT_THAT(in_flight, StatusIs(absl::StatusCode::kAborted, HasSubstr("b1 left")));
  EXPECT_THAT(behind, StatusIs(absl::StatusCode::kAborted, HasSubstr("b1 left")));
  EXPECT_THAT(channel.Send(writes[3], absl::Now() + kWait),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("b1 left")));
  EXPECT_EQ(channel.Post(writes[3]), nullptr);
}

TEST(ReplicaChannelTest, ABackupThatDoesNotAnswerTimesOutAndItsRetryIsAppliedOnce) {
  Backup backup(/*channel=*/true);
  ReplicaChannel channel(0, backup.address(), backup.stub(), 1);
  const std::vector<BackupLog::Write> writes = Writes(1);
  ASSERT_OK(channel.Send(writes[0], absl::Now() + kWait));  // the channel is open
  absl::Notification answer;
  backup.HoldWritesUntil(&answer);
  // Nothing answers: the write fails at its deadline (and its connection
  // with it) instead of waiting for good.
  EXPECT_THAT(channel.Send(writes[1], absl::Now() + absl::Seconds(1)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("did not answer LSN 2")));
  backup.HoldWritesUntil(nullptr);
  answer.Notify();  // the backup applies it after all (its answer is lost)
  // The retry goes over a new connection and is acknowledged, applied once.
  ASSERT_OK(channel.Send(writes[1], absl::Now() + kWait));
  ASSERT_OK(channel.Send(writes[2], absl::Now() + kWait));
  EXPECT_EQ(backup.replication().applied_lsn(), 3u);
  EXPECT_EQ(backup.Checksum(), PrimaryChecksum(writes));
  EXPECT_EQ(channel.route(), "unix");
}

// ---- malformed Replicate frames, spoken raw ----

std::unique_ptr<ByteStream> Greeted(BulkListener& bulk) {
  absl::StatusOr<std::unique_ptr<ByteStream>> stream =
      ConnectTcp("127.0.0.1", static_cast<int>(bulk.Offer().tcp_port()), absl::Seconds(30));
  EXPECT_OK(stream.status());
  if (!stream.ok()) return nullptr;
  char header[kFrameHeaderBytes];
  EncodeRequestHeader({FrameMethod::kHello, 1, 0, bulk.Offer().token().size()}, header);
  EXPECT_OK((*stream)->Write({absl::string_view(header, sizeof(header)), bulk.Offer().token()}));
  char reply[kReplyHeaderBytes];
  EXPECT_OK((*stream)->Read(reply, sizeof(reply)));
  return *std::move(stream);
}

// Sends one kReplicate frame with `payload` and returns the answer.
absl::Status Replicate(ByteStream& stream, absl::string_view payload) {
  char header[kFrameHeaderBytes];
  EncodeRequestHeader({FrameMethod::kReplicate, 7, 0, payload.size()}, header);
  if (absl::Status s = stream.Write({absl::string_view(header, sizeof(header)), payload});
      !s.ok()) {
    return s;
  }
  char encoded[kReplyHeaderBytes];
  if (absl::Status s = stream.Read(encoded, sizeof(encoded)); !s.ok()) return s;
  absl::StatusOr<ReplyHeader> reply = DecodeReplyHeader(encoded, 0);
  if (!reply.ok()) return reply.status();
  std::string message(reply->message_bytes, '\0');
  if (absl::Status s = stream.Read(message.data(), message.size()); !s.ok()) return s;
  return absl::Status(reply->code, message);
}

std::string Frame(uint32_t shard, const BackupLog::Write& write) {
  return EncodeReplicateHeader(shard, write) + write.request;
}

TEST(ReplicaChannelTest, MalformedReplicateFramesAreRefusedAndChangeNothing) {
  Backup backup(/*channel=*/true);
  std::unique_ptr<ByteStream> stream = Greeted(*backup.bulk());
  ASSERT_NE(stream, nullptr);
  const std::vector<BackupLog::Write> writes = Writes(1);
  const uint32_t before = backup.Checksum();
  std::string padded = Frame(0, writes[0]);
  padded[5] = 1;
  std::string long_method = Frame(0, writes[0]);
  long_method[24] = static_cast<char>(200);
  BackupLog::Write lsn0 = writes[0];
  lsn0.lsn = 0;
  BackupLog::Write save = writes[0];
  save.method = "Save";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"short", "shorter than its 32-byte header"},
      {padded, "nonzero padding"},
      {long_method, "method name of 200 bytes"},
      {Frame(0, lsn0), "LSN 0"},
      {Frame(0, save), "'Save' is not a replicated write"},
      {Frame(5, writes[0]), "not 5"},
  };
  for (const auto& [payload, why] : bad) {
    EXPECT_THAT(Replicate(*stream, payload),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(why)));
  }
  EXPECT_EQ(backup.replication().applied_lsn(), 0u);
  EXPECT_EQ(backup.Checksum(), before);
  // The connection stays: a good frame is applied.
  EXPECT_OK(Replicate(*stream, Frame(0, writes[0])));
  EXPECT_EQ(backup.replication().applied_lsn(), 1u);
}

// InitParam of `name`: `floats` zeros, SGD at learning rate 0.5,
// non-finite gradients `policy`.
std::string InitZeros(const std::string& name, size_t floats,
                      v1::ParameterConfig::NonFinite policy) {
  v1::InitParamRequest init;
  init.mutable_parameter()->set_name(name);
  init.mutable_parameter()->set_element_type(v1::FLOAT32);
  init.mutable_parameter()->add_shape(floats);
  init.mutable_parameter()->set_content(std::string(floats * sizeof(float), '\0'));
  init.mutable_config()->mutable_optimizer()->mutable_sgd();
  init.mutable_config()->mutable_learning_rate()->set_learning_rate(0.5);
  init.mutable_config()->set_non_finite(policy);
  return init.SerializeAsString();
}

// A bulk push (SendGradsRequest) of `value` to each of `names`; with
// `nan_in`, that one's last element is a NaN.
std::string PushAll(const std::vector<std::string>& names, size_t floats, float value,
                    uint64_t sequence, const std::string& nan_in = "") {
  v1::SendGradsRequest request;
  for (const std::string& name : names) {
    std::vector<float> values(floats, value);
    if (name == nan_in) values.back() = std::numeric_limits<float>::quiet_NaN();
    v1::Gradient* grad = request.add_gradients();
    grad->set_name(name);
    grad->set_element_type(v1::FLOAT32);
    grad->set_content(Bytes(values));
  }
  request.set_client_id(7);
  request.set_sequence(sequence);
  return request.SerializeAsString();
}

// Whether every value of `name` on `store` is `value`.
bool AllValuesAre(ParameterStore& store, const std::string& name, float value) {
  v1::ParamRef ref;
  ref.set_name(name);
  v1::Parameter param;
  EXPECT_OK(store.Get(ref, &param));
  const std::string& content = param.content();
  if (content.empty() || content.size() % sizeof(float) != 0) return false;
  for (size_t i = 0; i < content.size(); i += sizeof(float)) {
    float v;
    std::memcpy(&v, content.data() + i, sizeof(v));
    if (v != value) return false;  // a NaN too
  }
  return true;
}

// A shipped push of 1 MiB or more is read into a buffer that is not
// zero-filled first and scanned for NaN and infinity while it arrives
// (bulk_listener.cc): the gradients found finite are applied without a
// second scan, and a NaN in one is still caught on the backup as the store
// catches it: skipped there (non_finite: SKIP), the whole push refused
// (REJECT: the backup, no longer matching a primary that applied it, is
// broken for good). Replicas stay equal, byte for byte.
TEST(ReplicaChannelTest, ALargeShippedPushIsScannedAsItArrivesAndANaNInItIsStillCaught) {
  constexpr size_t kFloats = size_t{1} << 18;  // 1 MiB a gradient
  Backup backup(/*channel=*/true);
  ReplicaChannel channel(0, backup.address(), backup.stub(), /*next_lsn=*/1);
  std::vector<BackupLog::Write> writes = {
      {1, 1, "InitParam", InitZeros("s", kFloats, v1::ParameterConfig::SKIP)},
      {1, 2, "InitParam", InitZeros("r", kFloats, v1::ParameterConfig::REJECT)},
      {1, 3, "FinishInitParams", v1::FinishInitParamsRequest().SerializeAsString()},
      // Both finite: applied (0 - 0.5 * -2).
      {1, 4, "SendGrads", PushAll({"s", "r"}, kFloats, -2, 1)},
      // A NaN in "s": skipped; "r" applied.
      {1, 5, "SendGrads", PushAll({"s", "r"}, kFloats, -2, 2, "s")},
  };
  for (const BackupLog::Write& write : writes) {
    ASSERT_OK(channel.Send(write, absl::Now() + kWait)) << "LSN " << write.lsn;
  }
  EXPECT_EQ(channel.sent_over_channel(), writes.size());
  EXPECT_EQ(backup.Checksum(), PrimaryChecksum(writes));
  EXPECT_TRUE(AllValuesAre(backup.store(), "s", 1));
  EXPECT_TRUE(AllValuesAre(backup.store(), "r", 2));
  // A NaN in "r": the whole push is refused there, nothing of it applied.
  const uint32_t before = backup.Checksum();
  EXPECT_THAT(channel.Send({1, 6, "SendGrads", PushAll({"s", "r"}, kFloats, -2, 3, "r")},
                           absl::Now() + kWait),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("NaN")));
  EXPECT_EQ(backup.replication().applied_lsn(), 5u);
  EXPECT_EQ(backup.Checksum(), before);
  EXPECT_TRUE(AllValuesAre(backup.store(), "r", 2));
}

TEST(ReplicaChannelTest, AServerThatIsNoBackupRefusesReplicateFrames) {
  ParameterStore store;
  Tables tables;
  Dispatcher dispatcher(&store, &tables, 0);
  absl::StatusOr<std::unique_ptr<BulkListener>> bulk = BulkListener::Start(&dispatcher, {});
  ASSERT_OK(bulk.status());
  std::unique_ptr<ByteStream> stream = Greeted(**bulk);
  ASSERT_NE(stream, nullptr);
  EXPECT_THAT(Replicate(*stream, Frame(0, Writes(0)[0])),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no backup")));
}

}  // namespace
}  // namespace pserver
