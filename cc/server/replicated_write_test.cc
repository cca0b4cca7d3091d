// A backup that applies what its primary shipped ends bit-identical: writes
// applied on a primary dispatcher are delivered as (epoch, LSN, method,
// request bytes) to a backup's BackupLog out of order and twice, applied
// there through Dispatcher::ApplyWrite, and the two shards' state checksums
// agree. No thread and no timing: held writes are delivered with a deadline
// already past, then the first LSN drains them.
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/core/parameter_store.h"
#include "cc/core/tables.h"
#include "cc/server/backup_log.h"
#include "cc/server/dispatcher.h"
#include "cc/server/primary_log.h"
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
std::string Keys(const std::vector<uint64_t>& keys) {
  return std::string(reinterpret_cast<const char*>(keys.data()), keys.size() * sizeof(uint64_t));
}

struct Shard {
  ParameterStore store;
  Tables tables;
  Dispatcher dispatcher{&store, &tables, /*index=*/0};

  uint32_t Checksum() {
    absl::StatusOr<StoreSnapshot> snapshot = dispatcher.Snapshot();
    EXPECT_OK(snapshot.status());
    if (!snapshot.ok()) return 0;
    absl::StatusOr<uint32_t> crc = ShardStateChecksum(*snapshot);
    EXPECT_OK(crc.status());
    return crc.ok() ? *crc : 0;
  }
};

// A training run's writes, as a primary receives them.
std::vector<std::pair<std::string, std::string>> Writes() {
  std::vector<std::pair<std::string, std::string>> writes;
  v1::InitParamRequest init;
  init.mutable_parameter()->set_name("w");
  init.mutable_parameter()->set_element_type(v1::FLOAT32);
  init.mutable_parameter()->add_shape(3);
  init.mutable_parameter()->set_content(Bytes({1, 2, 3}));
  init.mutable_config()->mutable_optimizer()->mutable_adam();
  writes.emplace_back("InitParam", init.SerializeAsString());
  writes.emplace_back("FinishInitParams", v1::FinishInitParamsRequest().SerializeAsString());
  for (int step = 1; step <= 4; ++step) {
    v1::SendGradRequest grad;
    grad.mutable_gradient()->set_name("w");
    grad.mutable_gradient()->set_element_type(v1::FLOAT32);
    grad.mutable_gradient()->set_content(Bytes({0.5f * step, -1.0f, 3.0f / step}));
    writes.emplace_back("SendGrad", grad.SerializeAsString());
  }
  v1::CreateTableRequest table;
  table.set_name("emb");
  table.mutable_config()->set_dim(2);
  table.mutable_config()->mutable_optimizer()->mutable_adam();
  writes.emplace_back("CreateTable", table.SerializeAsString());
  v1::CreateTableRequest bsp;
  bsp.set_name("bsp");
  bsp.mutable_config()->set_dim(2);
  bsp.mutable_config()->mutable_consistency()->set_model(v1::Consistency::BSP);
  writes.emplace_back("CreateTable", bsp.SerializeAsString());
  for (uint64_t k = 0; k < 8; ++k) {
    v1::TablePushRequest push;
    push.set_table(k % 2 == 0 ? "emb" : "bsp");
    push.set_keys(Keys({k, 100 + k}));
    push.set_values(Bytes({1.0f * k, 2, 3, -1.0f * k}));
    if (k % 2 == 1) {
      push.set_worker("w0");  // held back under BSP
      push.set_client_id(9);
      push.set_sequence(k);
    }
    writes.emplace_back("TablePush", push.SerializeAsString());
  }
  return writes;
}

TEST(ReplicatedWriteTest, ABackupApplyingShippedWritesOutOfOrderEndsBitIdentical) {
  Shard primary, backup;
  BackupLog log(/*epoch=*/1, /*applied_lsn=*/0, {}, [&](const BackupLog::Write& w) {
    return backup.dispatcher.ApplyWrite(w.method, w.request);
  });
  const auto writes = Writes();
  std::vector<BackupLog::Write> shipped;
  for (const auto& [method, request] : writes) {
    ASSERT_OK(primary.dispatcher.ApplyWrite(method, request)) << method;
    shipped.push_back({1, shipped.size() + 1, method, request});
  }
  // Last LSN first: each is held (its deadline already past) ...
  for (size_t i = shipped.size(); i-- > 1;) {
    EXPECT_THAT(log.Deliver(shipped[i], absl::Now()),
                StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("waiting for LSN 1")));
  }
  EXPECT_EQ(log.held_writes(), shipped.size() - 1);
  EXPECT_NE(primary.Checksum(), backup.Checksum());  // nothing applied yet
  // ... until LSN 1 drains them all, in order.
  ASSERT_OK(log.Deliver(shipped[0], absl::Now() + absl::Seconds(60)));
  EXPECT_EQ(log.applied_lsn(), shipped.size());
  EXPECT_EQ(primary.Checksum(), backup.Checksum());

  // Every write retried (a primary resending after a lost ack): acknowledged,
  // applied once.
  for (const BackupLog::Write& w : shipped) ASSERT_OK(log.Deliver(w, absl::Now()));
  EXPECT_EQ(primary.Checksum(), backup.Checksum());

  // Order matters: the same writes with two pushes swapped (Adam) differ,
  // which is why a backup applies in LSN order.
  Shard swapped;
  auto reordered = writes;
  std::swap(reordered[4], reordered[5]);  // the third and fourth SendGrad
  for (const auto& [method, request] : reordered) {
    ASSERT_OK(swapped.dispatcher.ApplyWrite(method, request));
  }
  EXPECT_NE(primary.Checksum(), swapped.Checksum());

  // A write the backup alone applied shows.
  ASSERT_OK(backup.dispatcher.ApplyWrite(writes[2].first, writes[2].second));
  EXPECT_NE(primary.Checksum(), backup.Checksum());
}

TEST(ReplicatedWriteTest, OnlyShardWritesAreApplied) {
  Shard shard;
  for (const char* method : {"Save", "Barrier", "AllReduce", "Broadcast", "GetParam", "Nope"}) {
    EXPECT_THAT(shard.dispatcher.ApplyWrite(method, ""),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("is not a replicated write (InitParam, FinishInitParams")))
        << method;
  }
  EXPECT_THAT(shard.dispatcher.ApplyWrite("SendGrad", "\xff\xff\xff"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("replicated SendGrad: malformed SendGradRequest")));
  // A write the shard refuses is refused as it would be for a client.
  v1::SendGradRequest grad;
  grad.mutable_gradient()->set_name("missing");
  EXPECT_FALSE(shard.dispatcher.ApplyWrite("SendGrad", grad.SerializeAsString()).ok());
}

// A primary and two backups in one process: PrimaryLog ships to each
// backup's BackupLog, which applies through its own dispatcher.
class ReplicaSet {
 public:
  explicit ReplicaSet(PrimaryLog::Options options = {}) {
    for (int i = 0; i < 2; ++i) {
      backups_.push_back(std::make_unique<Shard>());
      Shard* shard = backups_.back().get();
      logs_.push_back(std::make_unique<BackupLog>(
          1, 0, BackupLog::Options{}, [shard](const BackupLog::Write& w) {
            return shard->dispatcher.ApplyWrite(w.method, w.request);
          }));
    }
    primary_log_ = std::make_unique<PrimaryLog>(
        1, 0, logs_.size(), options, [this](size_t backup, const BackupLog::Write& w) {
          return logs_[backup]->Deliver(w, absl::Now() + absl::Seconds(60));
        });
  }

  absl::Status Write(const std::string& method, const std::string& request) {
    return primary_log_->Write(method, request,
                               [&] { return primary_.dispatcher.ApplyWrite(method, request); });
  }

  Shard& primary() { return primary_; }
  Shard& backup(size_t i) { return *backups_[i]; }
  BackupLog& backup_log(size_t i) { return *logs_[i]; }
  PrimaryLog& primary_log() { return *primary_log_; }

 private:
  Shard primary_;
  std::vector<std::unique_ptr<Shard>> backups_;
  std::vector<std::unique_ptr<BackupLog>> logs_;
  std::unique_ptr<PrimaryLog> primary_log_;
};

std::string SgdGrad(float value) {
  v1::SendGradRequest grad;
  grad.mutable_gradient()->set_name("w");
  grad.mutable_gradient()->set_element_type(v1::FLOAT32);
  grad.mutable_gradient()->set_content(Bytes({value, -value, 1}));
  return grad.SerializeAsString();
}

TEST(ReplicatedWriteTest, ConcurrentWritersThroughThePrimaryLeaveEveryReplicaIdentical) {
  ReplicaSet set;
  const auto writes = Writes();  // InitParam ... (Adam: order-sensitive)
  for (const auto& [method, request] : writes) ASSERT_OK(set.Write(method, request));
  constexpr int kThreads = 4, kPerThread = 25;
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread && results[t].ok(); ++i) {
        results[t] = set.Write("SendGrad", SgdGrad(static_cast<float>(t * 100 + i)));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& r : results) EXPECT_OK(r);
  const uint64_t total = writes.size() + kThreads * kPerThread;
  EXPECT_EQ(set.primary_log().last_lsn(), total);
  EXPECT_EQ(set.primary_log().in_flight_writes(), 0u);
  EXPECT_EQ(set.backup_log(0).applied_lsn(), total);
  EXPECT_EQ(set.backup_log(1).applied_lsn(), total);
  const uint32_t crc = set.primary().Checksum();
  EXPECT_EQ(set.backup(0).Checksum(), crc);
  EXPECT_EQ(set.backup(1).Checksum(), crc);
}

TEST(ReplicatedWriteTest, AWriteThePrimaryRefusesTakesNoLsnAndIsShippedNowhere) {
  ReplicaSet set;
  v1::SendGradRequest missing;
  missing.mutable_gradient()->set_name("missing");
  EXPECT_FALSE(set.Write("SendGrad", missing.SerializeAsString()).ok());
  EXPECT_EQ(set.primary_log().last_lsn(), 0u);
  EXPECT_EQ(set.backup_log(0).applied_lsn(), 0u);
}

TEST(ReplicatedWriteTest, AStalePrimaryIsToldSoAndItsWriteIsNotAcknowledged) {
  ReplicaSet set;
  const auto writes = Writes();
  ASSERT_OK(set.Write(writes[0].first, writes[0].second));
  set.backup_log(0).SetEpoch(2);  // another replica took over
  absl::Status refused = set.Write(writes[1].first, writes[1].second);
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kFailedPrecondition,
                                HasSubstr("backup 0 did not acknowledge LSN 2 (FinishInitParams) "
                                          "of epoch 1: replicated write LSN 2 is of epoch 1, "
                                          "older than this replica's epoch 2")));
  // The other backup still got it: it holds no gap.
  EXPECT_EQ(set.backup_log(1).applied_lsn(), 2u);
}

// Every backup is sent a write at once: each fake backup answers only once
// all three were called, which a one-after-another send never reaches (it
// would wait for the first forever; the wait is bounded and then fails).
TEST(ReplicatedWriteTest, AWriteIsSentToEveryBackupAtOnce) {
  constexpr size_t kBackups = 3;
  absl::Mutex mu;
  size_t entered = 0;
  PrimaryLog log(1, 0, kBackups, {}, [&](size_t, const BackupLog::Write&) {
    absl::MutexLock lock(&mu);
    ++entered;
    auto all = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return entered == kBackups; };
    if (!mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(60))) {
      return absl::DeadlineExceededError("the other backups were not sent the write meanwhile");
    }
    return absl::OkStatus();
  });
  std::vector<absl::Status> acks;
  EXPECT_OK(log.Write("SendGrad", "a", [] { return absl::OkStatus(); }, &acks));
  ASSERT_EQ(acks.size(), kBackups);
  for (const absl::Status& ack : acks) EXPECT_OK(ack);
}

// Each backup's own answer comes back, so the caller drops exactly the
// backups that failed (PrimaryReplication drops them from /shards/<i>
// before acknowledging); the others still got the write.
TEST(ReplicatedWriteTest, EachBackupsAnswerIsReportedAndTheOthersStillGetTheWrite) {
  std::vector<uint64_t> got(3, 0);
  absl::Mutex mu;
  PrimaryLog log(1, 0, 3, {}, [&](size_t backup, const BackupLog::Write& w) {
    if (backup == 1) return absl::UnavailableError("backup at 127.0.0.1:1 refuses connections");
    absl::MutexLock lock(&mu);
    got[backup] = w.lsn;
    return absl::OkStatus();
  });
  std::vector<absl::Status> acks;
  EXPECT_THAT(log.Write("SendGrad", "a", [] { return absl::OkStatus(); }, &acks),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("backup 1 did not acknowledge LSN 1 (SendGrad) of epoch 1: "
                                 "backup at 127.0.0.1:1 refuses connections")));
  ASSERT_EQ(acks.size(), 3u);
  EXPECT_OK(acks[0]);
  EXPECT_THAT(acks[1], StatusIs(absl::StatusCode::kUnavailable, HasSubstr("refuses")));
  EXPECT_OK(acks[2]);
  EXPECT_EQ(got, (std::vector<uint64_t>{1, 0, 1}));
  // A write refused here is sent nowhere and reports no answers.
  EXPECT_FALSE(
      log.Write("SendGrad", "b", [] { return absl::InvalidArgumentError("no"); }, &acks).ok());
  EXPECT_TRUE(acks.empty());
  EXPECT_EQ(log.last_lsn(), 1u);
}

TEST(ReplicatedWriteTest, WritesInFlightAreBoundedAndARefusedOneIsNotApplied) {
  absl::Notification release;
  absl::Notification sending;
  PrimaryLog::Options options;
  options.max_in_flight_writes = 1;
  PrimaryLog log(1, 0, 1, options, [&](size_t, const BackupLog::Write&) {
    sending.Notify();
    release.WaitForNotification();
    return absl::OkStatus();
  });
  absl::Status first;
  std::thread writer([&] { first = log.Write("SendGrad", "a", [] { return absl::OkStatus(); }); });
  sending.WaitForNotification();
  EXPECT_EQ(log.in_flight_writes(), 1u);
  EXPECT_EQ(log.in_flight_bytes(), 9u);
  bool applied = false;
  EXPECT_THAT(log.Write("SendGrad", "b",
                        [&] {
                          applied = true;
                          return absl::OkStatus();
                        }),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("primary has 1 writes (9 bytes) not yet acknowledged by every "
                                 "backup, at its bound of 1 writes")));
  EXPECT_FALSE(applied);
  release.Notify();
  writer.join();
  EXPECT_OK(first);
  EXPECT_EQ(log.in_flight_writes(), 0u);
  EXPECT_EQ(log.last_lsn(), 1u);
}

// Overlapped (WriteShippingFirst): a write is handed to every backup (Post)
// when its apply calls ship, before the apply goes on; refused before ship,
// it takes no LSN and reaches nobody; failing after ship, it reaches every
// backup all the same (a missing LSN would hold all later ones) and its
// error is returned, not an acknowledgement. A backup whose Post declines
// is sent the write after the apply.
TEST(ReplicatedWriteTest, AWriteShippedFirstReachesEveryBackupWhateverItsApplyDoesAfter) {
  std::vector<uint64_t> posted(2, 0), sent(2, 0);
  bool decline = false;
  PrimaryLog log(
      1, 0, 2, {},
      [&](size_t backup, const BackupLog::Write& w) {
        sent[backup] = w.lsn;
        return absl::OkStatus();
      },
      [&](size_t backup, const BackupLog::Write& w) -> std::function<absl::Status()> {
        if (decline && backup == 1) return nullptr;
        EXPECT_EQ(w.request_bytes(), absl::StrCat("w", w.lsn));  // shared, not copied
        posted[backup] = w.lsn;
        return [] { return absl::OkStatus(); };
      });
  std::vector<absl::Status> acks;
  EXPECT_THAT(log.WriteShippingFirst("SendGrads", SharedBytes::Own("w1"),
                                     [](absl::FunctionRef<void()>) {
                                       return absl::InvalidArgumentError("refused here");
                                     },
                                     &acks),
              StatusIs(absl::StatusCode::kInvalidArgument, "refused here"));
  EXPECT_TRUE(acks.empty());
  EXPECT_EQ(log.last_lsn(), 0u);
  EXPECT_EQ(posted, (std::vector<uint64_t>{0, 0}));
  bool posted_before_apply = false;
  EXPECT_OK(log.WriteShippingFirst("SendGrads", SharedBytes::Own("w1"),
                                   [&](absl::FunctionRef<void()> ship) {
                                     ship();
                                     posted_before_apply = posted[0] == 1 && posted[1] == 1;
                                     return absl::OkStatus();
                                   }));
  EXPECT_TRUE(posted_before_apply);
  EXPECT_THAT(log.WriteShippingFirst("SendGrads", SharedBytes::Own("w2"),
                                     [](absl::FunctionRef<void()> ship) {
                                       ship();
                                       return absl::DataLossError("storage failed");
                                     },
                                     &acks),
              StatusIs(absl::StatusCode::kDataLoss, "storage failed"));
  ASSERT_EQ(acks.size(), 2u);
  EXPECT_OK(acks[0]);
  EXPECT_OK(acks[1]);
  EXPECT_EQ(posted, (std::vector<uint64_t>{2, 2}));
  decline = true;
  EXPECT_OK(log.WriteShippingFirst("SendGrads", SharedBytes::Own("w3"),
                                   [](absl::FunctionRef<void()> ship) {
                                     ship();
                                     return absl::OkStatus();
                                   }));
  EXPECT_EQ(posted, (std::vector<uint64_t>{3, 2}));
  EXPECT_EQ(sent, (std::vector<uint64_t>{0, 3}));
  EXPECT_EQ(log.last_lsn(), 3u);
  EXPECT_EQ(log.in_flight_writes(), 0u);
  EXPECT_EQ(log.in_flight_bytes(), 0u);
}

// R=3: the old primary shipped its last write to one backup only (not
// acknowledged). The successor takes the writes it lacks from the other
// backup before the new epoch writes anything; afterwards the two agree,
// and the old primary's writes are refused.
TEST(ReplicatedWriteTest, ATakeoverFirstBringsTheSuccessorToTheMostAdvancedBackup) {
  Shard old_primary, successor, other;
  auto log_of = [](Shard* shard) {
    BackupLog::Options options;
    options.max_retained_bytes = uint64_t{64} << 20;  // for AppliedSince
    return std::make_unique<BackupLog>(1, 0, options,
                                       [shard](const BackupLog::Write& w) {
                                         return shard->dispatcher.ApplyWrite(w.method, w.request);
                                       });
  };
  std::unique_ptr<BackupLog> successor_log = log_of(&successor), other_log = log_of(&other);
  bool successor_unreachable = false;
  PrimaryLog old_log(1, 0, 2, {}, [&](size_t backup, const BackupLog::Write& w) {
    if (backup == 0 && successor_unreachable) return absl::UnavailableError("connection reset");
    return (backup == 0 ? *successor_log : *other_log).Deliver(w, absl::Now() + absl::Seconds(60));
  });
  auto write = [](PrimaryLog& log, Shard& shard, const std::string& method,
                  const std::string& request) {
    return log.Write(method, request,
                     [&] { return shard.dispatcher.ApplyWrite(method, request); });
  };
  const auto writes = Writes();
  for (size_t i = 0; i + 1 < writes.size(); ++i) {
    ASSERT_OK(write(old_log, old_primary, writes[i].first, writes[i].second));
  }
  successor_unreachable = true;
  EXPECT_THAT(write(old_log, old_primary, writes.back().first, writes.back().second),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("connection reset")));
  ASSERT_EQ(other_log->applied_lsn(), successor_log->applied_lsn() + 1);

  // The takeover: what the other backup has beyond the successor, then the
  // new epoch on both.
  ASSERT_OK_AND_ASSIGN(std::vector<BackupLog::Write> missing,
                       other_log->AppliedSince(successor_log->applied_lsn()));
  ASSERT_EQ(missing.size(), 1u);
  for (const BackupLog::Write& w : missing) {
    ASSERT_OK(successor_log->Deliver(w, absl::Now() + absl::Seconds(60)));
  }
  successor_log->SetEpoch(2);
  other_log->SetEpoch(2);
  PrimaryLog new_log(2, successor_log->applied_lsn(), 1, {},
                     [&](size_t, const BackupLog::Write& w) {
                       return other_log->Deliver(w, absl::Now() + absl::Seconds(60));
                     });
  for (int i = 0; i < 5; ++i) {
    ASSERT_OK(write(new_log, successor, "SendGrad", SgdGrad(static_cast<float>(i))));
  }
  EXPECT_EQ(successor.Checksum(), other.Checksum());
  EXPECT_EQ(other_log->applied_lsn(), writes.size() + 5);
  // The old primary, still running, gets no acknowledgement.
  successor_unreachable = false;
  EXPECT_THAT(write(old_log, old_primary, "SendGrad", SgdGrad(7)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("older than")));
}

// Reads change no replicated state: pulls of an Adam table and of a BSP
// table's keys (with and without rows) on the primary between
// its writes leave every backup with the primary's checksum.
TEST(ReplicatedWriteTest, PullsOnThePrimaryLeaveTheBackupsIdentical) {
  ReplicaSet set;
  const uint32_t before = set.primary().Checksum();
  for (const auto& [method, request] : Writes()) {
    ASSERT_OK(set.Write(method, request)) << method;
    for (const char* table : {"emb", "bsp"}) {
      v1::TablePullRequest pull;
      pull.set_table(table);
      pull.set_keys(Keys({0, 1, 2, 100, 7777}));
      v1::TablePullResponse pulled;
      const absl::Status status =
          set.primary().tables.Pull(pull, &pulled, absl::Now() + absl::Seconds(60));
      if (!status.ok()) {
        EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << table << ": " << status;
      }
    }
  }
  const uint32_t crc = set.primary().Checksum();
  EXPECT_NE(crc, before);
  EXPECT_EQ(set.backup(0).Checksum(), crc);
  EXPECT_EQ(set.backup(1).Checksum(), crc);
}

// A shipper that applies each write and ships nothing: the dispatcher of a
// server with --accept_standbys before a standby attached.
class ApplyingShipper : public WriteShipper {
 public:
  absl::Status Write(absl::string_view, absl::FunctionRef<SharedBytes()>,
                     absl::FunctionRef<absl::Status(absl::FunctionRef<void()>)> apply) override {
    return apply([] {});
  }
};

absl::Status CreateTable(Dispatcher& dispatcher, const std::string& name,
                         const v1::Eviction& eviction) {
  v1::CreateTableRequest request;
  request.set_name(name);
  request.mutable_config()->set_dim(2);
  *request.mutable_config()->mutable_eviction() = eviction;
  v1::CreateTableResponse response;
  absl::Status result = absl::InternalError("not answered");
  dispatcher.Call("CreateTable", request, &response, {},
                  [&](absl::Status status) { result = std::move(status); });
  return result;
}

// Eviction and admission change rows on reads and on the server's own clock,
// which a standby does not see: a replicating server refuses such a table,
// naming why, and creates nothing; without a shipper it is created.
TEST(ReplicatedWriteTest, AReplicatingServerRefusesTablesWhosePullsChangeRows) {
  Shard replicating;
  ApplyingShipper shipper;
  replicating.dispatcher.SetShipper(&shipper);
  v1::Eviction ttl, capacity, admission;
  ttl.set_ttl_seconds(5);
  capacity.set_capacity(100);
  admission.set_admission_count(3);
  for (const v1::Eviction& eviction : {ttl, capacity, admission}) {
    EXPECT_THAT(CreateTable(replicating.dispatcher, "evicting", eviction),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("table 'evicting': eviction (ttl_seconds")))
        << eviction.ShortDebugString();
  }
  v1::TableStatsResponse stats;
  replicating.tables.Stats(&stats);
  EXPECT_EQ(stats.tables_size(), 0);
  v1::Eviction admit_at_once;
  admit_at_once.set_admission_count(1);  // every key admitted: no state off the write path
  EXPECT_OK(CreateTable(replicating.dispatcher, "plain", admit_at_once));

  Shard alone;  // R=1: unchanged
  EXPECT_OK(CreateTable(alone.dispatcher, "evicting", ttl));
}

}  // namespace
}  // namespace pserver
