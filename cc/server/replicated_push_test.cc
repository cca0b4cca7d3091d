// Bulk pushes shipped to a backup (ApplyReplicatedPush): the SendGrads bytes
// a primary received, applied on another shard, leave the two with one state
// checksum; a push shipped twice (a retried request id) is applied once.
// Overlapped (docs/replication.md, "Overlapped apply"): a push reaching a
// primary's SendGrads is handed to its backups once checked, before the
// primary applies it; what that could break (a refused push shipped, a
// backup at a newer epoch while the primary applied) is tested here, with
// no thread and no timing.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "cc/core/parameter_store.h"
#include "cc/core/tables.h"
#include "cc/server/backup_log.h"
#include "cc/server/dispatcher.h"
#include "cc/server/primary_log.h"
#include "cc/server/service.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "cc/server/state_checksum.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

struct Shard {
  Shard() {
    v1::Parameter w;
    w.set_name("w");
    w.set_element_type(v1::FLOAT32);
    w.add_shape(3);
    w.set_content(std::string(3 * sizeof(float), '\0'));
    v1::ParameterConfig adam;
    adam.mutable_optimizer()->mutable_adam();
    EXPECT_OK(store.Init(w, adam));
    store.FinishInit();
  }
  uint32_t Checksum() {
    absl::StatusOr<StoreSnapshot> snapshot = dispatcher.Snapshot();
    EXPECT_OK(snapshot.status());
    absl::StatusOr<uint32_t> crc =
        snapshot.ok() ? ShardStateChecksum(*snapshot) : absl::StatusOr<uint32_t>(0u);
    EXPECT_OK(crc.status());
    return crc.ok() ? *crc : 0;
  }
  ParameterStore store;
  Tables tables;
  Dispatcher dispatcher{&store, &tables, /*index=*/0};
};

std::string Push(uint64_t sequence, float value) {
  v1::SendGradsRequest request;
  v1::Gradient* grad = request.add_gradients();
  grad->set_name("w");
  grad->set_element_type(v1::FLOAT32);
  const std::vector<float> values = {value, -value, 2 * value};
  grad->set_content(
      std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
  request.set_client_id(42);
  request.set_sequence(sequence);
  return request.SerializeAsString();
}

TEST(ReplicatedPushTest, ABackupApplyingThePrimarysPushBytesMatchesIt) {
  Shard primary, backup;
  for (uint64_t s = 1; s <= 5; ++s) {
    const std::string bytes = Push(s, 0.25f * s);
    ASSERT_OK(ApplyReplicatedPush(primary.dispatcher, bytes));
    ASSERT_OK(ApplyReplicatedPush(backup.dispatcher, bytes));
  }
  const uint32_t crc = primary.Checksum();
  EXPECT_EQ(backup.Checksum(), crc);
  // Shipped again (a retry with the same request id): acknowledged, not
  // applied twice.
  ASSERT_OK(ApplyReplicatedPush(backup.dispatcher, Push(3, 0.75f)));
  EXPECT_EQ(backup.Checksum(), crc);
  EXPECT_EQ(backup.dispatcher.duplicates_ignored(), 1u);
  // A push the backup alone applied shows.
  ASSERT_OK(ApplyReplicatedPush(backup.dispatcher, Push(6, 1)));
  EXPECT_NE(backup.Checksum(), crc);
}

TEST(ReplicatedPushTest, BytesThatAreNotAPushAreRefused) {
  Shard shard;
  const uint32_t crc = shard.Checksum();
  EXPECT_THAT(ApplyReplicatedPush(shard.dispatcher, "\xff\xff\xff\xff"),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_EQ(shard.Checksum(), crc);
}

// A primary's write path as PrimaryReplication's (overlapped), over a
// PrimaryLog whose one backup is `backup`'s BackupLog, delivered in the
// calling thread when the write is handed over (Post), that is before the
// primary applies it.
class OverlappingShipper : public WriteShipper {
 public:
  OverlappingShipper(Shard& primary, Shard& backup)
      : primary_(primary),
        backup_log_(1, 0, BackupLog::Options{},
                    [&backup](const BackupLog::Write& write) {
                      return ApplyReplicatedPush(backup.dispatcher, write.request);
                    }),
        log_(1, 0, 1, {}, [this](size_t, const BackupLog::Write& write) { return Deliver(write); },
             [this](size_t, const BackupLog::Write& write) -> std::function<absl::Status()> {
               ++posted_;
               // The primary has not applied the push yet: "w" is as before.
               v1::ParamRef ref;
               ref.set_name("w");
               v1::Parameter w;
               EXPECT_OK(primary_.store.Get(ref, &w));
               seen_at_post_.push_back(w.content());
               absl::Status answer = Deliver(write);
               return [answer] { return answer; };
             }) {
    primary.dispatcher.SetShipper(this);
  }

  absl::Status Write(absl::string_view method, absl::FunctionRef<SharedBytes()> request,
                     absl::FunctionRef<absl::Status(absl::FunctionRef<void()>)> apply) override {
    return log_.WriteShippingFirst(method, request(), apply);
  }

  BackupLog& backup_log() { return backup_log_; }
  PrimaryLog& log() { return log_; }
  int posted() const { return posted_; }
  // "w"'s bytes on the primary each time a write was handed over.
  const std::vector<std::string>& seen_at_post() const { return seen_at_post_; }

 private:
  absl::Status Deliver(const BackupLog::Write& write) {
    // As it travels: the bytes the primary holds, in one piece at the backup.
    BackupLog::Write received{write.epoch, write.lsn, write.method, write.request_bytes()};
    return backup_log_.Deliver(std::move(received), absl::Now() + absl::Seconds(60));
  }

  Shard& primary_;
  BackupLog backup_log_;
  PrimaryLog log_;
  int posted_ = 0;
  std::vector<std::string> seen_at_post_;
};

// SendGrads as a client's request reaches the primary (the bulk method, on a
// byte buffer in two slices, as gRPC may deliver it).
absl::Status SendGrads(Dispatcher& dispatcher, const std::string& bytes) {
  const size_t half = bytes.size() / 2;
  grpc::Slice slices[2] = {grpc::Slice(bytes.data(), half),
                           grpc::Slice(bytes.data() + half, bytes.size() - half)};
  grpc::ByteBuffer request(slices, 2);
  grpc::ByteBuffer response;
  ReplyHold hold;
  return FindBulkMethod("SendGrads")(dispatcher, request, &response, &hold);
}

std::string Content(Shard& shard) {
  v1::ParamRef ref;
  ref.set_name("w");
  v1::Parameter w;
  EXPECT_OK(shard.store.Get(ref, &w));
  return w.content();
}

TEST(ReplicatedPushTest, APushIsHandedToTheBackupOnceCheckedBeforeThePrimaryAppliesIt) {
  Shard primary, backup;
  OverlappingShipper shipper(primary, backup);
  std::vector<std::string> before;
  for (uint64_t s = 1; s <= 5; ++s) {
    before.push_back(Content(primary));
    ASSERT_OK(SendGrads(primary.dispatcher, Push(s, 0.25f * s)));
  }
  // Each push was handed over before the primary applied it (Adam: each
  // step changes "w"), and the backup, which applied it first, ends equal.
  EXPECT_EQ(shipper.seen_at_post(), before);
  EXPECT_EQ(shipper.log().last_lsn(), 5u);
  EXPECT_EQ(shipper.backup_log().applied_lsn(), 5u);
  EXPECT_EQ(backup.Checksum(), primary.Checksum());
  // A retry (same id): applied nowhere twice, shipped again under a new LSN
  // after the primary found it applied (nothing to check first).
  ASSERT_OK(SendGrads(primary.dispatcher, Push(3, 0.75f)));
  EXPECT_EQ(shipper.posted(), 5);
  EXPECT_EQ(shipper.backup_log().applied_lsn(), 6u);
  EXPECT_EQ(backup.Checksum(), primary.Checksum());
}

// A push the primary refuses (its checks fail: a wrong size, a non-finite
// value) is numbered nowhere and shipped nowhere, and its id is used up
// nowhere: primary and backup keep one state, the id sets included (one
// checksum), and the same id retried gets the same refusal on the primary
// and on the backup once it serves alone (it took the shard over).
TEST(ReplicatedPushTest, APushThePrimaryRefusesIsShippedNowhereAndItsIdUsedUpNowhere) {
  Shard primary, backup;
  OverlappingShipper shipper(primary, backup);
  ASSERT_OK(SendGrads(primary.dispatcher, Push(1, 0.5f)));
  const uint32_t crc = backup.Checksum();
  ASSERT_EQ(primary.Checksum(), crc);
  const std::string w = Content(primary);
  v1::SendGradsRequest wrong;
  v1::Gradient* grad = wrong.add_gradients();
  grad->set_name("w");
  grad->set_element_type(v1::FLOAT32);
  grad->set_content(std::string(2 * sizeof(float), '\0'));  // 2 of 3 elements
  wrong.set_client_id(42);
  wrong.set_sequence(2);
  const std::string nan = Push(3, std::numeric_limits<float>::quiet_NaN());
  for (const std::string& refused : {wrong.SerializeAsString(), nan}) {
    absl::Status first = SendGrads(primary.dispatcher, refused);
    EXPECT_THAT(first, StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
    // Retried on the primary: checked again, the same answer (not OK).
    EXPECT_EQ(SendGrads(primary.dispatcher, refused), first);
    // Retried on the backup serving alone (after a takeover): the same.
    EXPECT_EQ(SendGrads(backup.dispatcher, refused), first);
  }
  EXPECT_EQ(shipper.posted(), 1);
  EXPECT_EQ(shipper.log().last_lsn(), 1u);
  EXPECT_EQ(shipper.backup_log().applied_lsn(), 1u);
  // Nothing applied on either side, and no id recorded on one side only.
  EXPECT_EQ(Content(primary), w);
  EXPECT_EQ(primary.Checksum(), crc);
  EXPECT_EQ(backup.Checksum(), crc);
  EXPECT_EQ(primary.dispatcher.duplicates_ignored(), 0u);
  // The ids were not used up: a good push under one of them is applied on
  // both, and the two stay equal.
  ASSERT_OK(SendGrads(primary.dispatcher, Push(3, 0.25f)));
  EXPECT_EQ(shipper.backup_log().applied_lsn(), 2u);
  EXPECT_NE(primary.Checksum(), crc);
  EXPECT_EQ(backup.Checksum(), primary.Checksum());
}

// A backup that moved to a newer epoch (another replica took over) refuses
// the push the stale primary shipped while the primary applied it: nothing
// is acknowledged. The client retries with the same id on the new primary,
// which applies it once: the two end equal.
TEST(ReplicatedPushTest, ABackupAtANewerEpochRefusesAPushThePrimaryAppliedMeanwhile) {
  Shard primary, backup;
  OverlappingShipper shipper(primary, backup);
  ASSERT_OK(SendGrads(primary.dispatcher, Push(1, 0.5f)));
  shipper.backup_log().SetEpoch(2);
  const std::string second = Push(2, 1.5f);
  EXPECT_THAT(SendGrads(primary.dispatcher, second),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("older than this replica's epoch 2")));
  EXPECT_EQ(shipper.posted(), 2);
  EXPECT_EQ(shipper.backup_log().applied_lsn(), 1u);
  EXPECT_NE(backup.Checksum(), primary.Checksum());  // applied on the stale side only
  // The retry on the new primary (it serves alone now): applied there once.
  ASSERT_OK(SendGrads(backup.dispatcher, second));
  ASSERT_OK(SendGrads(backup.dispatcher, second));
  EXPECT_EQ(backup.dispatcher.duplicates_ignored(), 1u);
  EXPECT_EQ(backup.Checksum(), primary.Checksum());
}

}  // namespace
}  // namespace pserver
