// Bulk pushes shipped to a backup (ApplyReplicatedPush): the SendGrads bytes
// a primary received, applied on another shard, leave the two with one state
// checksum; a push shipped twice (a retried request id) is applied once.
#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/parameter_store.h"
#include "cc/core/tables.h"
#include "cc/server/dispatcher.h"
#include "cc/server/service.h"
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

}  // namespace
}  // namespace pserver
