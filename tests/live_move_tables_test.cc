// Live moves of tables (issue 16, docs/elastic.md "Live moves of tables"):
// while a trainer pushes deterministic steps to a sparse table with Adam and
// runs two BSP workers on a KV table, ScaleCluster (psctl scale) takes the
// cluster through 2 -> 3 -> 4 -> 2 servers; rows move with their optimizer
// state, worker clocks and held-back adds with them, and the trainer's
// client follows the redirects. After each move: every row, its optimizer
// state and step count equal a run without moves (a SparseTable in this
// process fed the same pushes), every KV value and every worker clock is
// exact, and the bytes moved are within 1.5x of the ideal fraction. Each
// step also checks a BSP read that waits for the other worker's clock
// (across a move when one falls inside it). Real etcd, servers in this
// process over gRPC. No timing: every wait is a bounded loop on a condition.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/client/client.h"
#include "cc/client/table.h"
#include "cc/core/placement.h"
#include "cc/core/sparse_table.h"
#include "cc/core/status_macros.h"
#include "cc/core/tables.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/placement_record.h"
#include "cc/rpc/grpc_status.h"
#include "cc/server/replication.h"
#include "grpcpp/grpcpp.h"
#include "pserver/v1/service.grpc.pb.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pserver/v1/table.pb.h"
#include "tests/live_move_fixture.h"

namespace pserver {
namespace {

using ::pserver::testing::LiveMoveFixture;
using ::pserver::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::pserver::testing::Trainer;

constexpr uint32_t kEmbDim = 4;
constexpr uint32_t kKvDim = 2;
constexpr int kEmbKeys = 1024;
constexpr int kKvKeys = 256;

// Half sequential ids, half spread over 64 bits.
std::vector<uint64_t> EmbKeys() {
  std::vector<uint64_t> keys;
  for (int i = 0; i < kEmbKeys / 2; ++i) keys.push_back(static_cast<uint64_t>(i));
  for (int i = 0; i < kEmbKeys / 2; ++i) keys.push_back(Mix64(0x1234 + i));
  return keys;
}

std::vector<uint64_t> KvKeys() {
  std::vector<uint64_t> keys;
  for (int i = 0; i < kKvKeys; ++i) keys.push_back(1000 + static_cast<uint64_t>(i));
  return keys;
}

v1::TableConfig EmbConfig() {
  v1::TableConfig config;
  config.set_dim(kEmbDim);
  config.mutable_initializer()->mutable_normal()->set_stddev(0.1);
  config.mutable_initializer()->set_seed(7);
  config.mutable_optimizer()->mutable_adam()->set_learning_rate(0.01);
  return config;
}

v1::TableConfig KvConfig() {
  v1::TableConfig config;
  config.set_dim(kKvDim);
  config.mutable_optimizer()->mutable_add();
  config.mutable_consistency()->set_model(v1::Consistency::BSP);
  return config;
}

std::vector<float> EmbGrads(int step) {
  std::vector<float> g(kEmbKeys * kEmbDim);
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.25f * static_cast<float>((i + step) % 5) - 0.5f;
  return g;
}

// Worker w's add at clock c: multiples of 1/4, so every sum is exact.
std::vector<float> KvAdd(int worker, int clock) {
  std::vector<float> a(kKvKeys * kKvDim);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = 0.25f * static_cast<float>((i + clock + 3 * worker) % 4);
  }
  return a;
}

// The KV values a read at clock c sees under BSP: every add of clocks < c.
std::vector<float> KvAt(int clock) {
  std::vector<float> v(kKvKeys * kKvDim, 0.0f);
  for (int c = 0; c < clock; ++c) {
    for (int w = 0; w < 2; ++w) {
      const std::vector<float> a = KvAdd(w, c);
      for (size_t i = 0; i < v.size(); ++i) v[i] += a[i];
    }
  }
  return v;
}

class LiveMoveTablesTest : public LiveMoveFixture {
 protected:
  // One step: a push of every embedding key; on the KV table, w0 adds and
  // ticks, reads at its new clock (a read that waits for w1 on the
  // servers), w1 adds and ticks, and the read must see exactly the adds of
  // every earlier clock.
  absl::Status Step(int step, const Table& emb, KvWorker& w0, KvWorker& w1) {
    const std::vector<uint64_t> emb_keys = EmbKeys();
    PS_RETURN_IF_ERROR(emb.Push<float>(emb_keys, EmbGrads(step)));
    const std::vector<uint64_t> kv_keys = KvKeys();
    PS_RETURN_IF_ERROR(w0.Add<float>(kv_keys, KvAdd(0, step)));
    PS_RETURN_IF_ERROR(w0.Clock());
    std::vector<float> read(kKvKeys * kKvDim);
    Ticket waiting = w0.GetAsync(
        kv_keys, absl::Span<char>(reinterpret_cast<char*>(read.data()), read.size() * 4));
    PS_RETURN_IF_ERROR(w1.Add<float>(kv_keys, KvAdd(1, step)));
    PS_RETURN_IF_ERROR(w1.Clock());
    PS_RETURN_IF_ERROR(waiting.Wait(absl::Seconds(120)));
    if (read != KvAt(step + 1)) {
      return absl::InternalError(absl::StrCat("w0's BSP read at clock ", step + 1,
                                              " does not see exactly the adds before it"));
    }
    return absl::OkStatus();
  }

  // Every row of table `name` that the servers serve (each its owner's
  // under the current count), with its state and step count, by key.
  struct Row {
    std::string values, state;
    uint64_t step = 0;
    bool operator==(const Row& o) const {
      return values == o.values && state == o.state && step == o.step;
    }
  };
  static std::map<uint64_t, Row> RowsOf(const v1::SparseTableSnapshot& snap) {
    std::map<uint64_t, Row> rows;
    const size_t row_bytes = snap.values().size() / std::max<uint64_t>(1, snap.rows());
    const size_t state_bytes = snap.state().size() / std::max<uint64_t>(1, snap.rows());
    for (uint64_t r = 0; r < snap.rows(); ++r) {
      uint64_t key, step;
      std::memcpy(&key, snap.keys().data() + r * 8, 8);
      std::memcpy(&step, snap.steps().data() + r * 8, 8);
      rows[key] = {snap.values().substr(r * row_bytes, row_bytes),
                   snap.state().substr(r * state_bytes, state_bytes), step};
    }
    return rows;
  }
  absl::StatusOr<std::map<uint64_t, Row>> ServedRows(const std::string& name) {
    const Placement placement = Placement::Jump(static_cast<int>(servers_.size()), 0, kBlockBytes);
    std::map<uint64_t, Row> rows;
    for (auto& [index, server] : servers_) {
      std::map<std::string, std::string> extensions;
      PS_ASSIGN_OR_RETURN(Tables::Exported exported,
                          server->tables().ExportRows(
                              name,
                              [&, index = index](uint64_t key) {
                                return placement.HashKeyServer(key) == static_cast<int>(index);
                              },
                              &extensions));
      (void)exported;
      v1::SparseTableSnapshot snap;
      if (!snap.ParseFromString(extensions[absl::StrCat(Tables::kTablePrefix, name)])) {
        return absl::DataLossError("does not parse");
      }
      for (auto& [key, row] : RowsOf(snap)) {
        if (!rows.emplace(key, std::move(row)).second) {
          return absl::DataLossError(absl::StrCat("key ", key, " served twice"));
        }
      }
    }
    return rows;
  }
};

TEST_F(LiveMoveTablesTest, SparseAdamAndBspKvStayExactThroughTwoThreeFourTwoServers) {
  StartServers(2, 2);
  ASSERT_EQ(servers_.size(), 2u);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Connect());
  ASSERT_OK_AND_ASSIGN(Table emb, Table::Create(*client, "emb", EmbConfig()));
  ASSERT_OK_AND_ASSIGN(Table kv, Table::Create(*client, "kv", KvConfig()));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvWorker> w0, KvWorker::Join(kv, "w0"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvWorker> w1, KvWorker::Join(kv, "w1"));
  // The run without moves: one table in this process, fed the same pushes.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SparseTable> reference,
                       SparseTable::Create("emb", EmbConfig()));
  int reference_steps = 0;

  const uint64_t emb_bytes =
      uint64_t{kEmbKeys} * (kEmbDim + reference->state_per_row()) * sizeof(float);
  const uint64_t model = emb_bytes + uint64_t{kKvKeys} * kKvDim * sizeof(float);

  uint32_t now = 2;
  int steps = 0;
  for (const Change& change : kChanges) {
    SCOPED_TRACE(absl::StrCat(now, " -> ", change.to, " servers"));
    Trainer trainer([&](int step) { return Step(step, emb, *w0, *w1); }, steps);
    ASSERT_TRUE(trainer.Advance(2)) << trainer.Stop();
    ASSERT_OK_AND_ASSIGN(ScaleResult result, ScaleTo(change.to, *client, trainer));
    steps = trainer.steps();
    EXPECT_TRUE(result.moved);
    ASSERT_EQ(servers_.size(), change.to);
    ExpectAboutIdeal(result, model, now, change, steps);

    // Rows, Adam's moments and step counts: exactly the run without moves.
    const std::vector<uint64_t> keys = EmbKeys();
    for (; reference_steps < steps; ++reference_steps) {
      const std::vector<float> grads = EmbGrads(reference_steps);
      ASSERT_OK(reference->Push(
          keys, absl::string_view(reinterpret_cast<const char*>(grads.data()), grads.size() * 4)));
    }
    v1::SparseTableSnapshot expected_snap;
    ASSERT_TRUE(expected_snap.ParseFromString(reference->Serialize()));
    const std::map<uint64_t, Row> expected = RowsOf(expected_snap);
    using Rows = std::map<uint64_t, Row>;
    ASSERT_OK_AND_ASSIGN(const Rows served, ServedRows("emb"));
    ASSERT_EQ(served.size(), expected.size());
    for (const auto& [key, row] : expected) {
      auto it = served.find(key);
      ASSERT_TRUE(it != served.end()) << "key " << key << " is served by no server";
      ASSERT_TRUE(it->second == row)
          << "key " << key << " after " << steps << " steps: step " << it->second.step
          << ", expected " << row.step << "; values " << (it->second.values == row.values)
          << ", state " << (it->second.state == row.state);
    }
    // Each server holds just its own rows: the old owners dropped the rows
    // they handed over (their table stats, bounded wait: each drops once it
    // sees the stable placement).
    const Placement placement = Placement::Jump(static_cast<int>(change.to), 0, kBlockBytes);
    std::map<std::pair<uint32_t, std::string>, uint64_t> share, held;
    auto owner = [&](uint64_t key) { return static_cast<uint32_t>(placement.HashKeyServer(key)); };
    for (const auto& [key, row] : expected) ++share[{owner(key), "emb"}];
    for (uint64_t key : KvKeys()) ++share[{owner(key), "kv"}];
    for (int attempt = 0; attempt < 6000 && held != share; ++attempt) {
      if (attempt > 0) absl::SleepFor(absl::Milliseconds(10));
      held.clear();
      for (auto& [index, server] : servers_) {
        v1::TableStatsResponse stats;
        server->tables().Stats(&stats);
        for (const v1::TableStats& table : stats.tables()) {
          if (table.rows() > 0) held[{index, table.name()}] = table.rows();
        }
      }
    }
    for (const auto& [where, rows] : share) {
      std::printf("%u servers: server %u holds %llu rows of '%s', its share %llu\n", change.to,
                  where.first, static_cast<unsigned long long>(held[where]), where.second.c_str(),
                  static_cast<unsigned long long>(rows));
    }
    EXPECT_EQ(held, share);
    // And read back through a client of the new count.
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> fresh, Connect());
    ASSERT_EQ(fresh->num_servers(), static_cast<int>(change.to));
    ASSERT_OK_AND_ASSIGN(Table fresh_emb, Table::Create(*fresh, "emb", EmbConfig()));
    std::vector<float> pulled(keys.size() * kEmbDim);
    ASSERT_OK(fresh_emb.Pull<float>(keys, absl::MakeSpan(pulled)));
    std::string in_key_order;
    for (uint64_t key : keys) in_key_order += expected.at(key).values;
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(pulled.data()), pulled.size() * 4),
              in_key_order);
    // The KV table: every add of every clock, and both workers' clocks on
    // every server.
    ASSERT_OK_AND_ASSIGN(Table fresh_kv, Table::Create(*fresh, "kv", KvConfig()));
    std::vector<float> values(kKvKeys * kKvDim);
    ASSERT_OK(fresh_kv.Pull<float>(KvKeys(), absl::MakeSpan(values)));
    EXPECT_EQ(values, KvAt(steps));
    EXPECT_EQ(w0->clock(), steps);
    for (auto& [index, server] : servers_) {
      for (const auto& [table, clocks] : server->tables().AllWorkerClocks()) {
        if (table != "kv") continue;
        EXPECT_EQ(clocks, (Tables::Clocks{{"w0", steps}, {"w1", steps}})) << "server " << index;
      }
    }
    now = change.to;
  }
}

// A copy of table rows that is not the receiver's, or malformed, is refused
// naming what is wrong, and nothing of it is taken.
TEST_F(LiveMoveTablesTest, BadTableCopiesAreRefusedAndChangeNothing) {
  StartServers(2, 2);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Connect());
  ASSERT_OK_AND_ASSIGN(Table emb, Table::Create(*client, "emb", EmbConfig()));
  const std::vector<uint64_t> keys = EmbKeys();
  ASSERT_OK(emb.Push<float>(keys, EmbGrads(0)));
  // Server 0's rows, all of them: under 3 servers none goes from 0 to 1.
  std::map<std::string, std::string> extensions;
  ASSERT_OK(servers_.at(0)->tables().ExportRows("emb", [](uint64_t) { return true; }, &extensions)
                .status());
  StoreSnapshot snapshot;
  snapshot.extensions = extensions;
  ASSERT_OK_AND_ASSIGN(std::vector<v1::SnapshotFile> files,
                       SnapshotToFiles(snapshot, 0, CheckpointWriteOptions()));

  ASSERT_OK_AND_ASSIGN(KeyValue before, etcd_client_->Get(etcd_keys::PlacementKey()));
  ASSERT_OK_AND_ASSIGN(v1::Placement stable, ParsePlacementRecord(before.value));
  ASSERT_OK_AND_ASSIGN(const v1::Placement moving, PutMoving(stable, 3));

  std::unique_ptr<v1::ParameterServer::Stub> stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(servers_.at(1)->address(), grpc::InsecureChannelCredentials()));
  auto receive = [&](const std::vector<v1::MovedBuckets>& buckets) {
    v1::ReceiveBlocksRequest request;
    request.set_version(moving.version());
    request.set_from_server(0);
    for (const v1::SnapshotFile& file : files) *request.add_files() = file;
    for (const v1::MovedBuckets& moved : buckets) *request.add_table_buckets() = moved;
    absl::Status status;
    // UNAVAILABLE until server 1 has seen the moving placement.
    for (int i = 0; i < 6000; ++i) {
      grpc::ClientContext context;
      v1::ReceiveBlocksResponse response;
      status = FromGrpcStatus(stub->ReceiveBlocks(&context, request, &response));
      if (!absl::IsUnavailable(status)) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return status;
  };
  auto buckets = [](const std::string& table, uint32_t begin, uint32_t end) {
    v1::MovedBuckets moved;
    moved.set_table(table);
    moved.set_begin(begin);
    moved.set_end(end);
    return moved;
  };
  auto rows_on = [&](uint32_t index) {
    v1::TableStatsResponse stats;
    servers_.at(index)->tables().Stats(&stats);
    return stats.tables(0).rows();
  };
  const uint64_t rows_before = rows_on(1);
  EXPECT_THAT(receive({buckets("emb", 0, kKeyBuckets)}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("under placement version")));
  EXPECT_THAT(receive({buckets("emb", 10, 5)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0 <= begin < end <= 256")));
  EXPECT_THAT(receive({buckets("emb", 0, kKeyBuckets + 1)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0 <= begin < end <= 256")));
  EXPECT_THAT(receive({buckets("emb", 0, 1), buckets("other", 1, 2)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one table")));
  // Nothing was taken.
  EXPECT_EQ(rows_on(1), rows_before);
}

// Table rows do not move yet on a server whose received rows would not
// reach its checkpoints (or its backups): the coordinator's first question
// is refused naming why, and nothing is written.
TEST_F(LiveMoveTablesTest, TableRowsOnServersWithCheckpointsRefuseToMove) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  checkpoint_dir_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/tables-ckpt");
  StartServers(2, 2);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Connect());
  ASSERT_OK_AND_ASSIGN(Table emb, Table::Create(*client, "emb", EmbConfig()));
  ASSERT_OK(emb.Push<float>(EmbKeys(), EmbGrads(0)));
  ASSERT_OK_AND_ASSIGN(KeyValue before, etcd_client_->Get(etcd_keys::PlacementKey()));
  EXPECT_THAT(ScaleCluster(Scale(3)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("live moves of table rows do not work with "
                                       "--checkpoint_dir yet"),
                             HasSubstr("table 'emb'"), HasSubstr("nothing was changed"))));
  ASSERT_OK_AND_ASSIGN(KeyValue after, etcd_client_->Get(etcd_keys::PlacementKey()));
  EXPECT_EQ(after.mod_revision, before.mod_revision);
}

}  // namespace
}  // namespace pserver
