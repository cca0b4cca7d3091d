// What a server trusts and checks about checkpoints when it starts (issue 11,
// items 12 to 16): it loads only from its own directory, checking the etcd
// record's shard, cluster and CRC against the manifest; it refuses a
// checkpoint written by another number of servers, naming both counts, and
// leaves the files alone; it finds an unusable --checkpoint_dir at once and
// exits non-zero when its last checkpoint fails; checkpoint files are 0600
// and directories 0700; a --num_servers that disagrees with /ps_desired fails
// Start. In-process servers, a real etcd, and the pserver binary as a child;
// every wait is bounded.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/client/client.h"
#include "cc/core/checkpoint.h"
#include "cc/core/placement.h"
#include "cc/core/status_macros.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/placement_record.h"
#include "cc/etcd/testing/etcd_process.h"
#include "cc/server/local_cluster.h"
#include "cc/server/server.h"
#include "cc/testing/child_process.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "pserver/v1/registry.pb.h"

namespace pserver {
namespace {

namespace fs = std::filesystem;

using ::pserver::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

v1::ParameterConfig Sgd(double lr) {
  v1::ParameterConfig config;
  config.mutable_optimizer()->mutable_sgd();
  config.mutable_learning_rate()->set_learning_rate(lr);
  return config;
}

// A fresh directory under $TEST_TMPDIR, named after the test.
std::string TestDir(const std::string& suffix = "") {
  const char* root = std::getenv("TEST_TMPDIR");
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::path(root != nullptr ? root : "/tmp") /
                 absl::StrCat(info->test_suite_name(), ".", info->name(), suffix);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every file under `dir` with its bytes.
std::map<std::string, std::string> FilesUnder(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) files[entry.path().string()] = ReadFile(entry.path().string());
  }
  return files;
}

uint32_t ModeOf(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// The model's "w" as `server` serves it.
absl::StatusOr<std::vector<float>> ServedW(Server& server) {
  ClientOptions options;
  options.servers = {server.address()};
  options.timeout = absl::Seconds(20);
  PS_ASSIGN_OR_RETURN(auto client, Client::Connect(options));
  PS_ASSIGN_OR_RETURN(Tensor w, client->GetParam("w"));
  return w.ToVector<float>();
}

// Starts a server with `options`, gives it "w" = `values` and saves.
absl::StatusOr<CheckpointInfo> SaveW(const ServerOptions& options, std::vector<float> values) {
  PS_ASSIGN_OR_RETURN(auto server, Server::Start(options));
  ClientOptions client_options;
  if (options.etcd_endpoints.empty()) {
    client_options.servers = {server->address()};
  } else {
    client_options.etcd_endpoints = options.etcd_endpoints;
    client_options.cluster = options.cluster;
    client_options.discovery_timeout = absl::Seconds(20);
  }
  client_options.timeout = absl::Seconds(20);
  PS_ASSIGN_OR_RETURN(auto client, Client::Connect(client_options));
  const int64_t n = static_cast<int64_t>(values.size());
  PS_RETURN_IF_ERROR(client->InitParam("w", Tensor::FromValues<float>({n}, values), Sgd(1)));
  PS_RETURN_IF_ERROR(client->FinishInitParams());
  PS_ASSIGN_OR_RETURN(CheckpointInfo info, server->Save());
  client.reset();
  server->Shutdown();
  return info;
}

// ---- a real etcd: trusted records (item 12) and /ps_desired (item 16) -----------------

class CheckpointTrustTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(etcd_, testing::EtcdProcess::Start());
    EtcdClientOptions options;
    options.endpoints = {etcd_->endpoint()};
    options.prefix = etcd_keys::ClusterPrefix("job");
    ASSERT_OK_AND_ASSIGN(etcd_client_, EtcdClient::Connect(options));
  }

  ServerOptions EtcdServer(const std::string& checkpoint_dir) const {
    ServerOptions options;
    options.etcd_endpoints = {etcd_->endpoint()};
    options.cluster = "job";
    options.num_servers = 1;
    options.lease_ttl = absl::Seconds(2);
    options.register_timeout = absl::Seconds(20);
    options.checkpoint_dir = checkpoint_dir;
    options.checkpoint_on_shutdown = false;
    return options;
  }

  v1::CheckpointRecord Published() {
    v1::CheckpointRecord record;
    absl::StatusOr<KeyValue> kv = etcd_client_->Get(etcd_keys::CheckpointKey(0));
    EXPECT_OK(kv.status());
    if (kv.ok()) {
      EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(kv->value, &record).ok());
    }
    return record;
  }

  void Publish(const v1::CheckpointRecord& record) {
    std::string json;
    ASSERT_TRUE(google::protobuf::util::MessageToJsonString(record, &json).ok());
    ASSERT_OK(etcd_client_->Put(etcd_keys::CheckpointKey(0), json));
  }

  std::unique_ptr<testing::EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> etcd_client_;
};

// etcd /placement: written by the server, read by the client at connect and
// watched, recorded in the manifests; a malformed value fails both, naming
// the key, and stays as it was.
TEST_F(CheckpointTrustTest, PlacementIsKeptInEtcdReadByClientsAndRecordedInCheckpoints) {
  const std::string dir = TestDir();
  ASSERT_OK_AND_ASSIGN(CheckpointInfo saved, SaveW(EtcdServer(dir), {1, 2}));
  EXPECT_EQ(saved.placement.version(), 1u);
  EXPECT_EQ(saved.placement.kind(), v1::Placement::JUMP);
  EXPECT_EQ(saved.placement.num_servers(), 1u);
  ASSERT_OK_AND_ASSIGN(KeyValue kv, etcd_client_->Get(etcd_keys::PlacementKey()));
  ASSERT_OK_AND_ASSIGN(v1::Placement held, ParsePlacementRecord(kv.value));
  EXPECT_EQ(held.version(), 1u);

  ASSERT_OK_AND_ASSIGN(auto server, Server::Start(EtcdServer(dir)));
  ClientOptions options;
  options.etcd_endpoints = {etcd_->endpoint()};
  options.cluster = "job";
  options.discovery_timeout = absl::Seconds(20);
  options.timeout = absl::Seconds(20);
  {
    ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(options));
    EXPECT_EQ(client->placement().version(), 1u);
    EXPECT_EQ(client->placement().kind(), v1::Placement::JUMP);
    EXPECT_EQ(client->etcd_placement_version(), 1u);
    // A newer version is seen and routed by (the same count: nothing moves).
    v1::Placement next = held;
    next.set_version(2);
    ASSERT_OK(etcd_client_->Put(etcd_keys::PlacementKey(), FormatPlacementRecord(next)));
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    for (int i = 0; i < 3000 && client->etcd_placement_version() != 2 && absl::Now() < deadline;
         ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_EQ(client->etcd_placement_version(), 2u);
    EXPECT_EQ(client->placement().version(), 2u);
    EXPECT_EQ(client->placement().num_servers(), 1);
  }
  // Another count than etcd lists: the client refuses, saying why.
  ASSERT_OK(etcd_client_->Put(etcd_keys::PlacementKey(),
                              R"({"version":"3","kind":"JUMP","numServers":2})"));
  EXPECT_THAT(Client::Connect(options),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("/placement is for 2 servers"), HasSubstr("lists 1"))));
  // Malformed: clients and servers refuse it; it stays.
  ASSERT_OK(etcd_client_->Put(etcd_keys::PlacementKey(), "{oops"));
  EXPECT_THAT(Client::Connect(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("etcd /placement does not hold a placement")));
  server.reset();
  EXPECT_THAT(Server::Start(EtcdServer(dir)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("etcd /placement does not hold a placement")));
  ASSERT_OK_AND_ASSIGN(kv, etcd_client_->Get(etcd_keys::PlacementKey()));
  EXPECT_EQ(kv.value, "{oops");
}

TEST_F(CheckpointTrustTest, RecordNamesTheClusterAndItsOwnCheckpoint) {
  const std::string dir = TestDir();
  ASSERT_OK_AND_ASSIGN(CheckpointInfo saved, SaveW(EtcdServer(dir), {1, 2}));
  const v1::CheckpointRecord record = Published();
  EXPECT_EQ(record.cluster(), "job");
  EXPECT_EQ(record.path(), saved.path);
  ASSERT_OK_AND_ASSIGN(auto server, Server::Start(EtcdServer(dir)));
  ASSERT_TRUE(server->loaded_checkpoint().has_value());
  EXPECT_EQ(server->loaded_checkpoint()->path, saved.path);
  EXPECT_EQ(ServedW(*server).value_or(std::vector<float>{}), (std::vector<float>{1, 2}));
}

TEST_F(CheckpointTrustTest, PlantedRecordOutsideTheOwnDirectoryIsIgnored) {
  const std::string dir = TestDir();
  ASSERT_OK_AND_ASSIGN(CheckpointInfo own, SaveW(EtcdServer(dir), {1, 2}));
  // Foreign weights for shard 0 of cluster "job", with a record naming them
  // and their true CRC: everything matches but the place.
  const std::string foreign_dir = TestDir("-foreign");
  CheckpointInfo foreign;
  {
    ServerOptions options;
    options.checkpoint_dir = foreign_dir;
    options.checkpoint_on_shutdown = false;
    ASSERT_OK_AND_ASSIGN(foreign, SaveW(options, {666, 666}));
  }
  v1::CheckpointRecord planted = Published();
  planted.set_path(foreign.path);
  planted.set_sequence(foreign.sequence);
  planted.set_manifest_crc32c(foreign.manifest_crc32c);
  ASSERT_NO_FATAL_FAILURE(Publish(planted));
  // Also by a path that only looks like ours.
  for (const std::string& path :
       {foreign.path,
        absl::StrCat(dir, "/shard-0/../../", fs::path(foreign_dir).filename().string(), "/shard-0/",
                     fs::path(foreign.path).filename().string())}) {
    SCOPED_TRACE(path);
    planted.set_path(path);
    ASSERT_NO_FATAL_FAILURE(Publish(planted));
    ASSERT_OK_AND_ASSIGN(auto server, Server::Start(EtcdServer(dir)));
    const std::string messages = absl::StrJoin(server->load_messages(), "\n");
    ASSERT_TRUE(server->loaded_checkpoint().has_value()) << messages;
    EXPECT_EQ(server->loaded_checkpoint()->path, own.path) << messages;
    EXPECT_THAT(messages, AllOf(HasSubstr("ignored etcd /checkpoints/0"), HasSubstr(path),
                                HasSubstr("not the directory")));
    EXPECT_EQ(ServedW(*server).value_or(std::vector<float>{}), (std::vector<float>{1, 2}));
  }
}

TEST_F(CheckpointTrustTest, NewJobWithAnEmptyDirectoryAndAnOldClusterNameStartsEmpty) {
  ASSERT_OK(SaveW(EtcdServer(TestDir("-old-job")), {1, 2}).status());
  ASSERT_OK_AND_ASSIGN(auto server, Server::Start(EtcdServer(TestDir("-new-job"))));
  const std::string messages = absl::StrJoin(server->load_messages(), "\n");
  EXPECT_FALSE(server->loaded_checkpoint().has_value()) << messages;
  EXPECT_THAT(messages, HasSubstr("ignored etcd /checkpoints/0"));
  EXPECT_THAT(messages, HasSubstr("starting empty"));
}

TEST_F(CheckpointTrustTest, RecordWhoseCrcOrShardDoesNotMatchIsIgnored) {
  const std::string dir = TestDir();
  ServerOptions options = EtcdServer(dir);
  ASSERT_OK_AND_ASSIGN(CheckpointInfo older, SaveW(options, {1, 2}));
  ASSERT_OK_AND_ASSIGN(auto writer, Server::Start(options));
  ASSERT_OK_AND_ASSIGN(CheckpointInfo newest, writer->Save());
  writer->Shutdown();
  writer.reset();

  struct Case {
    const char* what;
    std::function<void(v1::CheckpointRecord*)> damage;
    const char* why;
  };
  const std::vector<Case> cases = {
      {"crc", [](v1::CheckpointRecord* r) { r->set_manifest_crc32c(r->manifest_crc32c() ^ 1); },
       "crc32c"},
      {"shard", [](v1::CheckpointRecord* r) { r->set_shard(5); }, "shard 5"},
      {"cluster", [](v1::CheckpointRecord* r) { r->set_cluster("other"); }, "cluster 'other'"},
      {"epoch", [](v1::CheckpointRecord* r) { r->set_epoch(r->epoch() + 7); }, "epoch"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    v1::CheckpointRecord record = Published();
    record.set_path(older.path);  // an older one of our own, so the record matters
    record.set_sequence(older.sequence);
    record.set_manifest_crc32c(older.manifest_crc32c);
    record.set_epoch(older.epoch);
    record.set_shard(0);
    record.set_cluster("job");
    c.damage(&record);
    ASSERT_NO_FATAL_FAILURE(Publish(record));
    ASSERT_OK_AND_ASSIGN(auto server, Server::Start(options));
    const std::string messages = absl::StrJoin(server->load_messages(), "\n");
    ASSERT_TRUE(server->loaded_checkpoint().has_value()) << messages;
    EXPECT_EQ(server->loaded_checkpoint()->path, newest.path) << messages;
    EXPECT_THAT(messages, AllOf(HasSubstr("ignored etcd /checkpoints/0"), HasSubstr(c.why)));
  }
}

TEST_F(CheckpointTrustTest, OwnDirectoryHoldingAnotherClustersCheckpointFailsStart) {
  const std::string dir = TestDir();
  ServerOptions other = EtcdServer(dir);
  other.cluster = "other-job";
  ASSERT_OK(SaveW(other, {1, 2}).status());
  const auto before = FilesUnder(dir);
  EXPECT_THAT(Server::Start(EtcdServer(dir)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("cluster 'other-job'"), HasSubstr("cluster 'job'"))));
  EXPECT_EQ(FilesUnder(dir), before);
}

TEST_F(CheckpointTrustTest, NumServersThatDisagreesWithPsDesiredFailsStartAtOnce) {
  ASSERT_OK(etcd_client_->Put(etcd_keys::DesiredKey(), "2"));
  ServerOptions options = EtcdServer(TestDir());
  options.num_servers = 3;
  const absl::Time begun = absl::Now();
  EXPECT_THAT(Server::Start(options),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("--num_servers=3"), HasSubstr("/ps_desired = 2"))));
  // Reported, not waited on (register_timeout is 20 s).
  EXPECT_LT(absl::Now() - begun, absl::Seconds(15));
  // Nothing claimed.
  EXPECT_THAT(etcd_client_->Get(etcd_keys::ServerKey(0)), testing::StatusCodeIs(absl::StatusCode::kNotFound));
  // Agreeing, or leaving the count to etcd, starts.
  options.num_servers = 2;
  EXPECT_OK(Server::Start(options).status());
  options.num_servers = 0;
  EXPECT_OK(Server::Start(options).status());
}

// ---- the server count (item 13) ------------------------------------------------------

// Three servers without etcd (--index, --num_servers) each save a shard.
std::vector<CheckpointInfo> SaveThreeShards(const std::string& dir) {
  std::vector<CheckpointInfo> saved;
  for (uint32_t i = 0; i < 3; ++i) {
    ServerOptions options;
    options.index = i;
    options.num_servers = 3;
    options.checkpoint_dir = dir;
    options.checkpoint_on_shutdown = false;
    absl::StatusOr<CheckpointInfo> info = SaveW(options, {1.0f * i, 2});
    EXPECT_OK(info.status());
    if (info.ok()) saved.push_back(*info);
  }
  return saved;
}

// Each of the three saved its own "w": no model three servers could have
// written, so two or four cannot reshard it, and say why, changing nothing.
TEST(ServerCountTest, InconsistentCheckpointsOfThreeServersFailTwoOrFourChangingNothing) {
  const std::string dir = TestDir();
  const std::vector<CheckpointInfo> saved = SaveThreeShards(dir);
  ASSERT_EQ(saved.size(), 3u);
  EXPECT_EQ(saved[0].num_servers, 3u);
  const auto before = FilesUnder(dir);
  for (uint32_t count : {2u, 4u}) {
    for (uint32_t index = 0; index < count; ++index) {
      SCOPED_TRACE(absl::StrCat(index, " of ", count));
      ServerOptions options;
      options.index = index;
      options.num_servers = count;
      options.checkpoint_dir = dir;
      EXPECT_THAT(Server::Start(options),
                  StatusIs(absl::StatusCode::kDataLoss,
                           AllOf(HasSubstr("resharding the checkpoints in " + dir),
                                 HasSubstr(absl::StrCat(" for shard ", index, " of ", count)),
                                 HasSubstr("is in two checkpoints"))));
    }
  }
  EXPECT_EQ(FilesUnder(dir), before) << "the old checkpoint is untouched";
  // Three start again, each with its own shard.
  ServerOptions options;
  options.index = 2;
  options.num_servers = 3;
  options.checkpoint_dir = dir;
  ASSERT_OK_AND_ASSIGN(auto server, Server::Start(options));
  ASSERT_TRUE(server->loaded_checkpoint().has_value());
  EXPECT_EQ(server->loaded_checkpoint()->path, saved[2].path);
}

TEST(ServerCountTest, ShardBeyondTheCountIsRefusedEvenWithoutARecordedCount) {
  // Checkpoints written before the count was recorded: shard-2 alone tells
  // that at least 3 servers wrote them.
  const std::string dir = TestDir();
  for (uint32_t i = 0; i < 3; ++i) {
    ServerOptions options;
    options.index = i;
    options.checkpoint_dir = dir;
    options.checkpoint_on_shutdown = false;
    ASSERT_OK(SaveW(options, {1, 2}).status());
  }
  const auto before = FilesUnder(dir);
  ServerOptions options;
  options.index = 0;
  options.num_servers = 2;
  options.checkpoint_dir = dir;
  EXPECT_THAT(Server::Start(options),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("shard 2"), HasSubstr("at least 3 servers"),
                             HasSubstr("did not record its count"),
                             HasSubstr("this cluster has 2"))));
  EXPECT_EQ(FilesUnder(dir), before);
}

// A cluster of another size reshards at start: each server writes its share
// as a checkpoint of the new placement beside the old ones; pruning keeps
// the newest of those (servers of the new size still starting need it).
TEST(ServerCountTest, LocalClusterRecordsItsPlacementAndAnotherSizeReshardsAtStart) {
  ServerOptions base;
  base.checkpoint_dir = TestDir();
  base.checkpoint_keep = 1;  // only what pruning spares stays
  {
    ASSERT_OK_AND_ASSIGN(auto cluster, LocalCluster::Start(3, base));
    ASSERT_OK_AND_ASSIGN(CheckpointInfo saved, cluster->server(0).Save());
    EXPECT_EQ(saved.num_servers, 3u);
    EXPECT_EQ(saved.placement.num_servers(), 3u);
    EXPECT_EQ(saved.placement.kind(), v1::Placement::JUMP);
  }  // each saves a last checkpoint
  const auto before = FilesUnder(base.checkpoint_dir);
  std::vector<CheckpointInfo> newest_of_three;
  for (int k = 0; k < 3; ++k) {
    ASSERT_OK_AND_ASSIGN(LoadedCheckpoint newest,
                         LoadLatestCheckpoint(absl::StrCat(base.checkpoint_dir, "/shard-", k)));
    newest_of_three.push_back(newest.info);
  }
  for (int count : {2, 3, 2}) {
    SCOPED_TRACE(count);
    {
      ASSERT_OK_AND_ASSIGN(auto cluster, LocalCluster::Start(count, base));
      for (int i = 0; i < count; ++i) {
        ASSERT_TRUE(cluster->server(i).loaded_checkpoint().has_value());
        EXPECT_EQ(cluster->server(i).loaded_checkpoint()->num_servers,
                  static_cast<uint32_t>(count));
        EXPECT_EQ(cluster->server(i).loaded_checkpoint()->placement.num_servers(),
                  static_cast<uint32_t>(count));
      }
    }  // each saves a last checkpoint and prunes
    if (newest_of_three.empty()) continue;
    const auto after = FilesUnder(base.checkpoint_dir);
    for (const CheckpointInfo& old : newest_of_three) {
      for (const auto& [path, bytes] : before) {
        if (!absl::StartsWith(path, old.path + "/")) continue;
        auto it = after.find(path);
        ASSERT_NE(it, after.end()) << path << " is gone";
        EXPECT_EQ(it->second, bytes) << path << " changed";
      }
    }
    newest_of_three.clear();  // 3 servers again: theirs are the current ones
  }
}

// Checkpoints of the placement before versioned placements (MODULO: block b
// of "w" on (fnv1a64("w") + b) % 3), written by `recorded` servers (0:
// servers that knew no count, started with --index alone); three servers of
// today's placement, with the count or (for 0) without, reshard them at
// start and serve "w" exactly.
class ModuloCheckpointTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(ModuloCheckpointTest, ModuloPlacedCheckpointsLoadIntoTheSameCount) {
  constexpr int kServers = 3;
  const uint32_t recorded = GetParam();
  constexpr uint32_t kBlockFloats = 4;
  constexpr uint32_t kBlocks = 9;
  ServerOptions base;
  base.checkpoint_dir = TestDir();
  v1::Placement modulo;
  modulo.set_kind(v1::Placement::MODULO);
  modulo.set_num_servers(kServers);
  ASSERT_OK_AND_ASSIGN(Placement old_placement,
                       Placement::FromSpec(modulo, kBlockFloats * sizeof(float)));
  std::vector<StoreSnapshot> shards(kServers);
  std::vector<float> w(kBlocks * kBlockFloats);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5f * i - 3;
  for (const BlockSpec& spec : old_placement.Blocks("w", w.size(), sizeof(float))) {
    BlockSnapshot block;
    block.name = "w";
    block.type = v1::FLOAT32;
    block.shape = {static_cast<int64_t>(w.size())};
    block.block.set_index(spec.index);
    block.block.set_count(spec.count);
    block.block.set_offset(spec.offset);
    *block.config.mutable_optimizer() = Sgd(1).optimizer();
    block.content.assign(reinterpret_cast<const char*>(w.data() + spec.offset),
                         spec.elements * sizeof(float));
    shards[spec.server].blocks.push_back(std::move(block));
  }
  for (int k = 0; k < kServers; ++k) {
    shards[k].initialized = true;
    CheckpointWriteOptions write;
    write.num_servers = recorded;
    write.placement = modulo;
    write.placement.set_version(1);  // kept as MODULO with a count of 0 too
    ASSERT_OK(SaveCheckpoint(shards[k], absl::StrCat(base.checkpoint_dir, "/shard-", k), k, 7,
                             write)
                  .status());
  }
  // The two placements disagree on some block, or this would prove nothing.
  const Placement new_placement(kServers, kBlockFloats * sizeof(float));
  int differ = 0;
  for (uint32_t b = 0; b < kBlocks; ++b) {
    differ += old_placement.ServerOf("w", b) != new_placement.ServerOf("w", b);
  }
  ASSERT_GT(differ, 0);

  std::vector<std::unique_ptr<Server>> servers;
  ClientOptions options;
  for (int k = 0; k < kServers; ++k) {
    ServerOptions one = base;
    one.index = k;
    one.num_servers = recorded;
    ASSERT_OK_AND_ASSIGN(auto server, Server::Start(one));
    ASSERT_TRUE(server->loaded_checkpoint().has_value());
    EXPECT_EQ(server->loaded_checkpoint()->placement.kind(), v1::Placement::JUMP);
    EXPECT_EQ(server->loaded_checkpoint()->placement.num_servers(), 3u);
    EXPECT_EQ(server->loaded_checkpoint()->sequence, 8u);
    options.servers.push_back(server->address());
    servers.push_back(std::move(server));
  }
  options.block_bytes = kBlockFloats * sizeof(float);
  options.timeout = absl::Seconds(20);
  ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(options));
  ASSERT_OK_AND_ASSIGN(Tensor got, client->GetParam("w"));
  EXPECT_EQ(got.ToVector<float>(), w);
}

INSTANTIATE_TEST_SUITE_P(Recorded, ModuloCheckpointTest, ::testing::Values(3u, 0u));

// ---- the checkpoint directory (items 14, 15) ---------------------------------------------

TEST(CheckpointDirStartupTest, UnusableDirectoryFailsStartNamingIt) {
  // Root may write anywhere, but never under a regular file.
  const std::string file = TestDir() + "/a-file";
  std::ofstream(file) << "x";
  ServerOptions options;
  options.checkpoint_dir = file + "/checkpoints";
  EXPECT_THAT(Server::Start(options),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("checkpoint directory " + file + "/checkpoints"),
                             HasSubstr("not usable"))));
  // A directory nobody can create, where loading finds "no checkpoint" (the
  // old code started empty and failed only at the final save).
  options.checkpoint_dir = "/proc/pserver-checkpoints-cannot-be-here";
  absl::StatusOr<std::unique_ptr<Server>> in_proc = Server::Start(options);
  EXPECT_FALSE(in_proc.ok());
  EXPECT_THAT(in_proc.status().message(),
              AllOf(HasSubstr("checkpoint directory /proc/pserver-checkpoints-cannot-be-here/"
                              "shard-0 is not usable"),
                    HasSubstr("cannot create directory")));
  options.checkpoint_dir = file;
  EXPECT_THAT(Server::Start(options), StatusIs(absl::StatusCode::kFailedPrecondition,
                                               AllOf(HasSubstr(file + "/shard-0 is not usable"),
                                                     HasSubstr("Not a directory"))));
}

TEST(CheckpointDirStartupTest, FilesAreOwnerOnlyAndTheModeIsAnOption) {
  const mode_t old_umask = ::umask(0);  // the modes hold whatever the umask
  const std::string dir = TestDir() + "/new";
  ServerOptions options;
  options.checkpoint_dir = dir;
  options.checkpoint_on_shutdown = false;
  absl::StatusOr<CheckpointInfo> saved = SaveW(options, {1, 2});
  options.checkpoint_file_mode = 0640;
  options.index = 1;
  absl::StatusOr<CheckpointInfo> shared = SaveW(options, {1, 2});
  ::umask(old_umask);
  ASSERT_OK(saved.status());
  ASSERT_OK(shared.status());
  EXPECT_EQ(ModeOf(dir), 0700u);
  EXPECT_EQ(ModeOf(dir + "/shard-0"), 0700u);
  EXPECT_EQ(ModeOf(saved->path), 0700u);
  for (const auto& entry : fs::directory_iterator(saved->path)) {
    EXPECT_EQ(ModeOf(entry.path().string()), 0600u) << entry.path();
  }
  EXPECT_EQ(ModeOf(dir + "/shard-1"), 0750u);
  for (const auto& entry : fs::directory_iterator(shared->path)) {
    EXPECT_EQ(ModeOf(entry.path().string()), 0640u) << entry.path();
  }
  options.checkpoint_file_mode = 0644 | 0111;
  EXPECT_THAT(Server::Start(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0755")));
}

// ---- the pserver binary ----------------------------------------------------------------

constexpr absl::Duration kStartTimeout = absl::Seconds(20);
constexpr absl::Duration kStopTimeout = absl::Seconds(20);

TEST(PserverCheckpointExitTest, FailedFinalCheckpointExitsNonZero) {
  const std::string dir = TestDir();
  ASSERT_OK_AND_ASSIGN(auto child, ChildProcess::Spawn(RunfilesPath("cc/server/pserver"),
                                                       {"--port=0", "--index=0",
                                                        absl::StrCat("--checkpoint_dir=", dir)}));
  ASSERT_OK(WaitForPserverAddress(*child, 0, absl::Now() + kStartTimeout).status())
      << child->output();
  // The shard directory is replaced by a file: the final save cannot write.
  fs::remove_all(dir + "/shard-0");
  std::ofstream(dir + "/shard-0") << "not a directory";
  ASSERT_EQ(kill(child->pid(), SIGTERM), 0) << std::strerror(errno);
  ASSERT_OK_AND_ASSIGN(int status, child->WaitForExit(absl::Now() + kStopTimeout));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << DescribeWaitStatus(status) << "\n"
                                                             << child->output();
  EXPECT_THAT(child->err(), HasSubstr("final checkpoint failed"));
}

TEST(PserverCheckpointExitTest, SuccessfulFinalCheckpointExitsZero) {
  const std::string dir = TestDir();
  ASSERT_OK_AND_ASSIGN(auto child,
                       ChildProcess::Spawn(RunfilesPath("cc/server/pserver"),
                                           {"--port=0", "--index=0", "--checkpoint_mode=0640",
                                            absl::StrCat("--checkpoint_dir=", dir)}));
  ASSERT_OK(WaitForPserverAddress(*child, 0, absl::Now() + kStartTimeout).status())
      << child->output();
  ASSERT_EQ(kill(child->pid(), SIGTERM), 0) << std::strerror(errno);
  ASSERT_OK_AND_ASSIGN(int status, child->WaitForExit(absl::Now() + kStopTimeout));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << DescribeWaitStatus(status) << "\n"
                                                             << child->output();
  ASSERT_OK_AND_ASSIGN(std::vector<CheckpointEntry> saved, ListCheckpoints(dir + "/shard-0"));
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_EQ(ModeOf(saved[0].path + "/MANIFEST"), 0640u);
}

TEST(PserverCheckpointExitTest, UnwritableDirectoryOrBadModeExitsAtStartup) {
  const std::string file = TestDir() + "/a-file";
  std::ofstream(file) << "x";
  for (const std::vector<std::string>& flags : std::vector<std::vector<std::string>>{
           {"--checkpoint_dir=" + file + "/sub"},
           {"--checkpoint_dir=/proc/pserver-not-here"},
           {"--checkpoint_dir=" + file + "-dir", "--checkpoint_mode=0777"}}) {
    std::vector<std::string> args = {"--port=0"};
    args.insert(args.end(), flags.begin(), flags.end());
    ASSERT_OK_AND_ASSIGN(auto child, ChildProcess::Spawn(RunfilesPath("cc/server/pserver"), args));
    ASSERT_OK_AND_ASSIGN(int status, child->WaitForExit(absl::Now() + kStopTimeout));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << DescribeWaitStatus(status) << "\n"
                                                               << child->output();
    EXPECT_THAT(child->out(), ::testing::Not(HasSubstr("listening")));
    const std::string named = flags.size() == 2 ? "0777" : flags[0].substr(flags[0].find('=') + 1);
    EXPECT_THAT(child->err(), HasSubstr(named));
  }
}

}  // namespace
}  // namespace pserver
