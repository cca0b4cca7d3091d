// The shard copy a standby attaches with (cc/server/replication.h): a
// snapshot as one checkpoint's files and back, file names from the wire
// checked, and the server options replication refuses.
#include <stdlib.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/core/parameter_store.h"
#include "cc/core/tables.h"
#include "cc/server/dispatcher.h"
#include "cc/server/replication.h"
#include "cc/server/server.h"
#include "cc/server/state_checksum.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

std::string Bytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

struct Shard {
  ParameterStore store;
  Tables tables;
  Dispatcher dispatcher{&store, &tables, /*index=*/0};
};

StoreSnapshot TrainedSnapshot(Shard& shard) {
  v1::InitParamRequest init;
  init.mutable_parameter()->set_name("w");
  init.mutable_parameter()->set_element_type(v1::FLOAT32);
  init.mutable_parameter()->add_shape(3);
  init.mutable_parameter()->set_content(Bytes({1, 2, 3}));
  init.mutable_config()->mutable_optimizer()->mutable_adam();
  EXPECT_OK(shard.dispatcher.ApplyWrite("InitParam", init.SerializeAsString()));
  EXPECT_OK(shard.dispatcher.ApplyWrite("FinishInitParams", ""));
  v1::SendGradRequest grad;
  grad.mutable_gradient()->set_name("w");
  grad.mutable_gradient()->set_element_type(v1::FLOAT32);
  grad.mutable_gradient()->set_content(Bytes({0.5f, -1.0f, 3.0f}));
  EXPECT_OK(shard.dispatcher.ApplyWrite("SendGrad", grad.SerializeAsString()));
  absl::StatusOr<StoreSnapshot> snapshot = shard.dispatcher.Snapshot();
  EXPECT_OK(snapshot.status());
  return snapshot.ok() ? *std::move(snapshot) : StoreSnapshot();
}

TEST(ReplicationFilesTest, ASnapshotTravelsAsCheckpointFilesWithItsChecksum) {
  Shard shard;
  const StoreSnapshot snapshot = TrainedSnapshot(shard);
  ASSERT_OK_AND_ASSIGN(uint32_t before, ShardStateChecksum(snapshot));
  CheckpointWriteOptions options;
  options.epoch = 4;
  ASSERT_OK_AND_ASSIGN(std::vector<v1::SnapshotFile> files, SnapshotToFiles(snapshot, 3, options));
  ASSERT_FALSE(files.empty());
  google::protobuf::RepeatedPtrField<v1::SnapshotFile> wire(files.begin(), files.end());
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadSnapshotFiles(wire));
  EXPECT_EQ(loaded.info.shard, 3u);
  EXPECT_EQ(loaded.info.epoch, 4u);
  ASSERT_OK_AND_ASSIGN(uint32_t after, ShardStateChecksum(loaded.snapshot));
  EXPECT_EQ(after, before);
}

TEST(ReplicationFilesTest, TheCopyIsMadeInMemoryWithoutATemporaryDirectory) {
  Shard shard;
  const StoreSnapshot snapshot = TrainedSnapshot(shard);
  // No temporary directory can be made: the copy must not need one.
  const char* old = std::getenv("TMPDIR");
  const std::string saved = old != nullptr ? old : "";
  ASSERT_EQ(setenv("TMPDIR", "/nonexistent/pserver-no-such-dir", 1), 0);
  absl::StatusOr<std::vector<v1::SnapshotFile>> files = SnapshotToFiles(snapshot, 0, {});
  if (old != nullptr) {
    setenv("TMPDIR", saved.c_str(), 1);
  } else {
    unsetenv("TMPDIR");
  }
  ASSERT_OK(files.status());
  google::protobuf::RepeatedPtrField<v1::SnapshotFile> wire(files->begin(), files->end());
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadSnapshotFiles(wire));
  ASSERT_OK_AND_ASSIGN(uint32_t before, ShardStateChecksum(snapshot));
  ASSERT_OK_AND_ASSIGN(uint32_t after, ShardStateChecksum(loaded.snapshot));
  EXPECT_EQ(after, before);
}

TEST(ReplicationFilesTest, FileNamesThatAreNotPlainOrRepeatedAreRefused) {
  Shard shard;
  ASSERT_OK_AND_ASSIGN(std::vector<v1::SnapshotFile> files,
                       SnapshotToFiles(TrainedSnapshot(shard), 0, {}));
  const std::vector<std::string> names = {"",          ".",   "..",
                                          "../escape", "a/b", std::string("x\0y", 3)};
  for (const std::string& bad : names) {
    google::protobuf::RepeatedPtrField<v1::SnapshotFile> wire(files.begin(), files.end());
    wire.Mutable(0)->set_name(bad);
    EXPECT_THAT(LoadSnapshotFiles(wire).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a plain file name")))
        << bad;
  }
  google::protobuf::RepeatedPtrField<v1::SnapshotFile> twice(files.begin(), files.end());
  *twice.Add() = files[0];
  EXPECT_THAT(LoadSnapshotFiles(twice).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("given twice")));
}

TEST(ReplicationFilesTest, ADamagedCopyIsAnErrorNotACrash) {
  Shard shard;
  ASSERT_OK_AND_ASSIGN(std::vector<v1::SnapshotFile> files,
                       SnapshotToFiles(TrainedSnapshot(shard), 0, {}));
  for (size_t i = 0; i < files.size(); ++i) {
    google::protobuf::RepeatedPtrField<v1::SnapshotFile> wire(files.begin(), files.end());
    std::string* content = wire.Mutable(static_cast<int>(i))->mutable_content();
    if (content->empty()) continue;
    (*content)[content->size() / 2] ^= 0x5a;
    EXPECT_FALSE(LoadSnapshotFiles(wire).ok()) << files[i].name();
  }
  EXPECT_FALSE(LoadSnapshotFiles({}).ok());
}

TEST(ReplicationFilesTest, StartRefusesAStandbyWithoutEtcdAndTokenRolesWithoutAPeerToken) {
  ServerOptions standby;
  standby.standby = true;
  EXPECT_THAT(Server::Start(standby).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs etcd")));
  ServerOptions primary;
  primary.accept_standbys = true;
  EXPECT_THAT(Server::Start(primary).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs etcd")));
  ServerOptions roles;
  roles.etcd_endpoints = {"127.0.0.1:1"};
  roles.accept_standbys = true;
  roles.job = "job";
  roles.auth_tokens_file = "/nonexistent/tokens";
  EXPECT_THAT(Server::Start(roles).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("need --peer_token_file")));
  ServerOptions unreadable = roles;
  unreadable.peer_token_file = "/nonexistent/peer_token";
  EXPECT_THAT(Server::Start(unreadable).status(),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("--peer_token_file /nonexistent/peer_token")));
}

TEST(ReplicationFilesTest, StartRefusesMaxStandbysOutsideItsRange) {
  for (size_t bad : {size_t{0}, size_t{65}}) {
    ServerOptions primary;
    primary.max_standbys = bad;
    EXPECT_THAT(Server::Start(primary).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("max_standbys must be in [1, 64], got ", bad))));
  }
}

TEST(ReplicationFilesTest, StartRefusesJoinBoundsOutsideTheirRanges) {
  for (uint64_t bad : {uint64_t{0}, uint64_t{1023}, (uint64_t{1} << 40) + 1}) {
    ServerOptions primary;
    primary.max_joining_bytes = bad;
    EXPECT_THAT(Server::Start(primary).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("max_joining_bytes must be in [1024, 2^40], got ",
                                                bad))));
  }
  for (absl::Duration bad : {absl::ZeroDuration(), absl::Milliseconds(999), absl::Seconds(-5),
                             absl::Hours(1) + absl::Seconds(1)}) {
    ServerOptions primary;
    primary.join_timeout = bad;
    EXPECT_THAT(Server::Start(primary).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("join_timeout must be in [1s, 1h], got ",
                                                absl::FormatDuration(bad)))));
    primary.join_timeout = absl::Seconds(120);
    primary.replicate_timeout = bad;
    EXPECT_THAT(Server::Start(primary).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("replicate_timeout must be in [1s, 1h], got ",
                                                absl::FormatDuration(bad)))));
  }
  for (uint64_t bad : {uint64_t{1}, uint64_t{1023}, (uint64_t{1} << 40) + 1}) {
    ServerOptions primary;
    primary.catch_up_bytes = bad;
    EXPECT_THAT(Server::Start(primary).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("catch_up_bytes must be 0 or in [1024, 2^40], got ",
                                                bad))));
  }
  // The bounds themselves are accepted (a server without etcd starts).
  ServerOptions edges;
  edges.host = "127.0.0.1";
  edges.catch_up_bytes = 1024;
  edges.max_joining_bytes = 1024;
  edges.join_timeout = absl::Hours(1);
  edges.replicate_timeout = absl::Hours(1);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server, Server::Start(edges));
  server->Shutdown();
}

TEST(ReplicationFilesTest, StartRefusesMaxStandbyCopyBytesOutsideItsRange) {
  for (size_t bad : {size_t{0}, size_t{1023}, size_t{1} << 31}) {
    ServerOptions standby;
    standby.max_standby_copy_bytes = bad;
    EXPECT_THAT(Server::Start(standby).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("max_standby_copy_bytes must be in [1024, 2^31-1], "
                                                "got ", bad))));
  }
}

}  // namespace
}  // namespace pserver
