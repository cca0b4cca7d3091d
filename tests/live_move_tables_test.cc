// Live moves of tables (issue 16, docs/elastic.md "Live moves of tables"):
// while a trainer pushes deterministic steps to a sparse table with Adam and
// runs two BSP workers on a KV table (tests/table_workload.h),
// ScaleCluster (psctl scale) takes the cluster through 2 -> 3 -> 4 -> 2
// servers; rows move with their optimizer state, worker clocks and
// held-back adds with them, and the trainer's client follows the
// redirects. After each move: every row, its optimizer state and step count
// equal a run without moves (a SparseTable in this process fed the same
// pushes), every KV value and every worker clock is exact, and the bytes
// moved are within 1.5x of the ideal fraction. Each step also checks a BSP
// read that waits for the other worker's clock (across a move when one
// falls inside it). With --checkpoint_dir, the checkpoints after a move
// hold exactly the rows each server owns, and a restart of everything from
// them is exact. Real etcd, servers in this process over gRPC. No timing:
// every wait is a bounded loop on a condition.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/client/client.h"
#include "cc/client/table.h"
#include "cc/core/checkpoint.h"
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
#include "tests/table_workload.h"

namespace pserver {
namespace testing {
namespace {

using ::testing::HasSubstr;

class LiveMoveTablesTest : public LiveMoveFixture {
 protected:
  // Every row of table `name` that the servers serve (each its owner's
  // under the current count), with its state and step count, by key.
  // `only_owned`: every row a server holds must be its own (after a
  // restart from checkpoints).
  absl::StatusOr<std::map<uint64_t, TableRow>> ServedRows(const std::string& name,
                                                          bool only_owned = false) {
    const Placement placement = Placement::Jump(static_cast<int>(servers_.size()), 0, kBlockBytes);
    std::map<uint64_t, TableRow> rows;
    for (auto& [index, server] : servers_) {
      std::map<std::string, std::string> extensions;
      PS_ASSIGN_OR_RETURN(Tables::Exported exported,
                          server->tables().ExportRows(
                              name,
                              [&, index = index](uint64_t key) {
                                return only_owned ||
                                       placement.HashKeyServer(key) == static_cast<int>(index);
                              },
                              &extensions));
      (void)exported;
      v1::SparseTableSnapshot snap;
      if (!snap.ParseFromString(extensions[absl::StrCat(Tables::kTablePrefix, name)])) {
        return absl::DataLossError("does not parse");
      }
      for (auto& [key, row] : RowsOf(snap)) {
        if (placement.HashKeyServer(key) != static_cast<int>(index)) {
          return absl::DataLossError(absl::StrCat("server ", index, " holds key ", key,
                                                  ", which is not its own"));
        }
        if (!rows.emplace(key, std::move(row)).second) {
          return absl::DataLossError(absl::StrCat("key ", key, " served twice"));
        }
      }
    }
    return rows;
  }

  // After `steps` steps on the servers running: every "emb" row, its Adam
  // moments and step count equal `reference`'s, read back through a client
  // of the new count too; every KV value holds every add of every clock;
  // both workers' clocks are `steps` on every server.
  void ExpectTablesExact(ReferenceEmb& reference, int steps, bool only_owned = false) {
    ASSERT_OK(reference.AdvanceTo(steps));
    ASSERT_OK_AND_ASSIGN(const auto expected, reference.Rows());
    ASSERT_OK_AND_ASSIGN(const auto served, ServedRows("emb", only_owned));
    ASSERT_EQ(served.size(), expected.size());
    for (const auto& [key, row] : expected) {
      auto it = served.find(key);
      ASSERT_TRUE(it != served.end()) << "key " << key << " is served by no server";
      ASSERT_TRUE(it->second == row)
          << "key " << key << " after " << steps << " steps: step " << it->second.step
          << ", expected " << row.step << "; values " << (it->second.values == row.values)
          << ", state " << (it->second.state == row.state);
    }
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> fresh, Connect());
    ASSERT_EQ(fresh->num_servers(), static_cast<int>(servers_.size()));
    ASSERT_OK_AND_ASSIGN(Table fresh_emb, Table::Create(*fresh, "emb", EmbConfig()));
    const std::vector<uint64_t> keys = EmbKeys();
    std::vector<float> pulled(keys.size() * kEmbDim);
    ASSERT_OK(fresh_emb.Pull<float>(keys, absl::MakeSpan(pulled)));
    ASSERT_OK_AND_ASSIGN(const std::string in_key_order, reference.ValuesInKeyOrder());
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(pulled.data()), pulled.size() * 4),
              in_key_order);
    ASSERT_OK_AND_ASSIGN(Table fresh_kv, Table::Create(*fresh, "kv", KvConfig()));
    std::vector<float> values(kKvKeys * kKvDim);
    ASSERT_OK(fresh_kv.Pull<float>(KvKeys(), absl::MakeSpan(values)));
    EXPECT_EQ(values, KvAt(steps));
    for (auto& [index, server] : servers_) {
      for (const auto& [table, clocks] : server->tables().AllWorkerClocks()) {
        if (table != "kv") continue;
        EXPECT_EQ(clocks, (Tables::Clocks{{"w0", steps}, {"w1", steps}})) << "server " << index;
      }
    }
  }

  // Each server holds just its own rows: the old owners dropped the rows
  // they handed over (their table stats, bounded wait: each drops once it
  // sees the stable placement of `count` servers).
  void ExpectEachServerHoldsItsShare(ReferenceEmb& reference, uint32_t count) {
    ASSERT_OK_AND_ASSIGN(const auto expected, reference.Rows());
    const Placement placement = Placement::Jump(static_cast<int>(count), 0, kBlockBytes);
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
      std::printf("%u servers: server %u holds %llu rows of '%s', its share %llu\n", count,
                  where.first, static_cast<unsigned long long>(held[where]), where.second.c_str(),
                  static_cast<unsigned long long>(rows));
    }
    EXPECT_EQ(held, share);
  }

  // Each shard's newest checkpoint in checkpoint_dir_ holds exactly the
  // "emb" and "kv" rows placement `count` gives it, both workers' clocks at
  // `steps`, and no held-back add; together every row once.
  void ExpectTableCheckpointsOf(uint32_t count, int steps) {
    const Placement placement = Placement::Jump(count, 0, kBlockBytes);
    std::map<std::string, std::map<uint64_t, int>> held;
    for (uint32_t shard = 0; shard < count; ++shard) {
      SCOPED_TRACE(absl::StrCat("shard ", shard, " of ", count));
      ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded,
                           LoadLatestCheckpoint(absl::StrCat(checkpoint_dir_, "/shard-", shard)));
      EXPECT_EQ(loaded.info.placement.num_servers(), count);
      Tables tables;
      ASSERT_OK(tables.RestoreFrom(loaded.snapshot.extensions));
      for (const std::string name : {"emb", "kv"}) {
        std::map<std::string, std::string> section;
        ASSERT_OK(tables.ExportRows(name, nullptr, &section).status());
        v1::SparseTableSnapshot snap;
        ASSERT_TRUE(snap.ParseFromString(section[absl::StrCat(Tables::kTablePrefix, name)]));
        for (const auto& [key, row] : RowsOf(snap)) {
          EXPECT_EQ(placement.HashKeyServer(key), static_cast<int>(shard))
              << name << " key " << key;
          ++held[name][key];
        }
        EXPECT_EQ(section.count(absl::StrCat(Tables::kPendingPrefix, name)), 0u) << name;
      }
      for (const auto& [table, clocks] : tables.AllWorkerClocks()) {
        if (table != "kv") continue;
        EXPECT_EQ(clocks, (Tables::Clocks{{"w0", steps}, {"w1", steps}}));
      }
    }
    EXPECT_EQ(held["emb"].size(), static_cast<size_t>(kEmbKeys));
    EXPECT_EQ(held["kv"].size(), static_cast<size_t>(kKvKeys));
    for (const auto& [name, keys] : held) {
      for (const auto& [key, n] : keys) EXPECT_EQ(n, 1) << name << " key " << key;
    }
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
  ASSERT_OK_AND_ASSIGN(ReferenceEmb reference, ReferenceEmb::Create());
  const uint64_t model = reference.bytes() + uint64_t{kKvKeys} * kKvDim * sizeof(float);

  uint32_t now = 2;
  int steps = 0;
  for (const Change& change : kChanges) {
    SCOPED_TRACE(absl::StrCat(now, " -> ", change.to, " servers"));
    Trainer trainer([&](int step) { return TableStep(step, emb, *w0, *w1); }, steps);
    ASSERT_TRUE(trainer.Advance(2)) << trainer.Stop();
    ASSERT_OK_AND_ASSIGN(ScaleResult result, ScaleTo(change.to, *client, trainer));
    steps = trainer.steps();
    EXPECT_TRUE(result.moved);
    ASSERT_EQ(servers_.size(), change.to);
    ExpectAboutIdeal(result, model, now, change, steps);
    ExpectTablesExact(reference, steps);
    ASSERT_FALSE(HasFatalFailure());
    ExpectEachServerHoldsItsShare(reference, change.to);
    EXPECT_EQ(w0->clock(), steps);
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

// Issue 16, table moves with checkpoints: after 2 -> 3 servers with the
// trainer running, each server's checkpoint holds exactly the table rows
// (with their optimizer state), clocks and held-back adds it owns under the
// new placement; every server stopped as by a kill (no final checkpoint)
// and as many started again on the directory serve exactly the trained
// rows, KV values and clocks, and the workers go on training from there.
TEST_F(LiveMoveTablesTest, TableCheckpointsAfterAMoveHoldTheMovedRowsForARestartOfEverything) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  checkpoint_dir_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/tables-ckpt");
  StartServers(2, 2);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Connect());
  ASSERT_OK_AND_ASSIGN(ReferenceEmb reference, ReferenceEmb::Create());
  int steps = 0;
  {
    ASSERT_OK_AND_ASSIGN(Table emb, Table::Create(*client, "emb", EmbConfig()));
    ASSERT_OK_AND_ASSIGN(Table kv, Table::Create(*client, "kv", KvConfig()));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvWorker> w0, KvWorker::Join(kv, "w0"));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvWorker> w1, KvWorker::Join(kv, "w1"));
    Trainer trainer([&](int step) { return TableStep(step, emb, *w0, *w1); });
    ASSERT_TRUE(trainer.Advance(2)) << trainer.Stop();
    // A checkpoint of the 2 servers before the move: the older generation.
    ASSERT_OK(client->SaveCheckpoint());
    ASSERT_OK_AND_ASSIGN(ScaleResult result, ScaleTo(3, *client, trainer));
    EXPECT_TRUE(result.moved);
    EXPECT_GT(result.bytes_moved, 0u);
    steps = trainer.steps();
    ASSERT_EQ(servers_.size(), 3u);
    ASSERT_OK(client->SaveCheckpoint());
    ExpectTableCheckpointsOf(3, steps);
    // The workers leave (on the servers, not in the checkpoint).
  }

  // Every server stopped without a final checkpoint, then as many started.
  client.reset();
  servers_.clear();
  departed_of_.clear();
  StartServers(3, 3);
  ASSERT_EQ(servers_.size(), 3u);
  ExpectTablesExact(reference, steps, /*only_owned=*/true);

  // The workers go on from their clocks.
  ASSERT_OK_AND_ASSIGN(client, Connect());
  ASSERT_OK_AND_ASSIGN(Table emb, Table::Create(*client, "emb", EmbConfig()));
  ASSERT_OK_AND_ASSIGN(Table kv, Table::Create(*client, "kv", KvConfig()));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvWorker> w0, KvWorker::Join(kv, "w0"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvWorker> w1, KvWorker::Join(kv, "w1"));
  EXPECT_EQ(w0->clock(), steps);
  ASSERT_OK(TableStep(steps, emb, *w0, *w1));
  ExpectTablesExact(reference, steps + 1, /*only_owned=*/true);
}

}  // namespace
}  // namespace testing
}  // namespace pserver
