#include "cc/core/tables.h"

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cc/core/status_macros.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::IsOk;
using ::pserver::testing::StatusCodeIs;
using ::pserver::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// A clock the test moves by hand.
class FakeClock {
 public:
  absl::Time Now() {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
};

class TablesTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kMaxHeldAddBytes = 4096;

  TablesTest() : tables_(Options()) {}

  TablesOptions Options() {
    TablesOptions options;
    options.table.now = [this] { return clock_.Now(); };
    options.max_held_add_bytes = kMaxHeldAddBytes;
    return options;
  }

  absl::Status Create(const std::string& name, const std::string& config_text) {
    v1::CreateTableRequest request;
    request.set_name(name);
    request.mutable_config()->set_dim(1);
    request.mutable_config()->set_element_type(v1::FLOAT64);
    if (!config_text.empty()) {
      v1::TableConfig extra;
      EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(config_text, &extra));
      request.mutable_config()->MergeFrom(extra);
    }
    return tables_.Create(request);
  }

  absl::StatusOr<std::vector<double>> Pull(const std::string& table,
                                           const std::vector<uint64_t>& keys,
                                           const std::string& worker = "", int64_t clock = 0) {
    v1::TablePullRequest request;
    request.set_table(table);
    request.set_keys(EncodeKeys(keys));
    request.set_worker(worker);
    request.set_clock(clock);
    v1::TablePullResponse response;
    PS_RETURN_IF_ERROR(tables_.Pull(request, &response, absl::Now() + absl::Seconds(5)));
    std::vector<double> values(keys.size());
    std::memcpy(values.data(), response.values().data(), response.values().size());
    return values;
  }

  absl::Status Push(const std::string& table, const std::vector<uint64_t>& keys,
                    const std::vector<double>& values, const std::string& worker = "",
                    int64_t clock = 0) {
    v1::TablePushRequest request;
    request.set_table(table);
    request.set_keys(EncodeKeys(keys));
    request.set_values(
        std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(double)));
    request.set_worker(worker);
    request.set_clock(clock);
    v1::TablePushResponse response;
    return tables_.Push(request, &response);
  }

  absl::StatusOr<int64_t> Clock(const std::string& table, const std::string& worker,
                                v1::ClockRequest::Op op, int64_t to = 0) {
    v1::ClockRequest request;
    request.set_table(table);
    request.set_worker(worker);
    request.set_op(op);
    request.set_to(to);
    return tables_.Clock(request);
  }

  uint64_t Rows(const std::string& table) {
    v1::TableStatsResponse stats;
    tables_.Stats(&stats);
    for (const auto& s : stats.tables()) {
      if (s.name() == table) return s.rows();
    }
    return 0;
  }

  FakeClock clock_;
  Tables tables_;
};

TEST_F(TablesTest, UnknownTablesAndBadKeysAreRefused) {
  EXPECT_THAT(Pull("nope", {1}).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no table 'nope'")));
  ASSERT_OK(Create("t", ""));
  v1::TablePullRequest request;
  request.set_table("t");
  request.set_keys("12345");  // not whole uint64s
  v1::TablePullResponse response;
  EXPECT_THAT(tables_.Pull(request, &response, absl::Now() + absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("5 bytes")));
  EXPECT_THAT(Create("", ""), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("name")));
}

TEST_F(TablesTest, ExpiredRowsAreSweptOnTheNextRequest) {
  ASSERT_OK(Create("ttl", "eviction { ttl_seconds: 10 }"));
  ASSERT_OK(Push("ttl", {1, 2, 3}, {0, 0, 0}));
  EXPECT_EQ(Rows("ttl"), 3u);
  clock_.Advance(absl::Seconds(11));
  ASSERT_OK(Push("ttl", {4}, {0}));  // sweeps 1..3 first
  EXPECT_EQ(Rows("ttl"), 1u);
  clock_.Advance(absl::Seconds(5));
  ASSERT_OK(Pull("ttl", {4}).status());  // a read keeps row 4 alive
  clock_.Advance(absl::Seconds(6));
  EXPECT_EQ(tables_.EvictExpired(), 0u);
  clock_.Advance(absl::Seconds(11));
  EXPECT_EQ(tables_.EvictExpired(), 1u);
  EXPECT_EQ(Rows("ttl"), 0u);
}

TEST_F(TablesTest, BspHoldsAddsUntilEveryWorkerPassesTheirClock) {
  ASSERT_OK(Create("bsp", "optimizer { add {} } consistency { model: BSP }"));
  ASSERT_OK(Clock("bsp", "a", v1::ClockRequest::JOIN).status());
  ASSERT_OK(Clock("bsp", "b", v1::ClockRequest::JOIN).status());
  ASSERT_OK(Push("bsp", {7}, {1.5}, "a", 0));
  EXPECT_THAT(*Pull("bsp", {7}), ::testing::ElementsAre(0.0));  // held
  ASSERT_OK(Clock("bsp", "a", v1::ClockRequest::TICK, 1).status());
  EXPECT_THAT(*Pull("bsp", {7}), ::testing::ElementsAre(0.0));  // b is still at 0
  // A retried tick (same target) is not counted twice.
  ASSERT_OK_AND_ASSIGN(int64_t again, Clock("bsp", "a", v1::ClockRequest::TICK, 1));
  EXPECT_EQ(again, 1);
  ASSERT_OK(Clock("bsp", "b", v1::ClockRequest::TICK, 1).status());
  EXPECT_THAT(*Pull("bsp", {7}, "b", 1), ::testing::ElementsAre(1.5));
  // A wrong-sized held add is refused at once, not dropped later.
  EXPECT_THAT(Push("bsp", {7, 8}, {1.0}, "a", 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("16 bytes")));
}

TEST_F(TablesTest, SspReadTimesOutNamingTheStraggler) {
  ASSERT_OK(Create("ssp", "optimizer { add {} } consistency { model: SSP staleness: 1 }"));
  ASSERT_OK(Clock("ssp", "fast", v1::ClockRequest::JOIN).status());
  ASSERT_OK(Clock("ssp", "slow", v1::ClockRequest::JOIN).status());
  for (int c = 1; c <= 3; ++c) ASSERT_OK(Clock("ssp", "fast", v1::ClockRequest::TICK).status());
  EXPECT_OK(Pull("ssp", {1}, "fast", 1).status());  // needs slow at clock 0
  v1::TablePullRequest request;
  request.set_table("ssp");
  request.set_keys(EncodeKeys(std::vector<uint64_t>{1}));
  request.set_worker("fast");
  request.set_clock(3);  // needs slow at clock 2
  v1::TablePullResponse response;
  EXPECT_THAT(tables_.Pull(request, &response, absl::Now() + absl::Milliseconds(50)),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr("table 'ssp'"), HasSubstr("slow at clock 0"))));
  EXPECT_TRUE(response.values().empty());
}

TEST_F(TablesTest, HandlersCanBeInstalledAndRemoved) {
  class Doubling : public TableHandler {
    absl::Status Push(SparseTable& table, absl::Span<const uint64_t> keys,
                      absl::string_view values) override {
      std::string twice(values);
      auto* v = reinterpret_cast<double*>(twice.data());
      for (size_t i = 0; i < keys.size(); ++i) v[i] *= 2;
      return table.Push(keys, twice);
    }
  };
  ASSERT_OK(Create("h", "optimizer { add {} }"));
  tables_.SetHandler("h", std::make_shared<Doubling>());
  ASSERT_OK(Push("h", {1}, {1.0}));
  tables_.SetHandler("h", nullptr);
  ASSERT_OK(Push("h", {1}, {1.0}));
  EXPECT_THAT(*Pull("h", {1}), ::testing::ElementsAre(3.0));
}

TEST_F(TablesTest, SaveAndRestoreCarryRowsClocksAndHeldAdds) {
  ASSERT_OK(Create("kv", "optimizer { add {} } consistency { model: BSP }"));
  ASSERT_OK(Clock("kv", "a", v1::ClockRequest::JOIN).status());
  ASSERT_OK(Clock("kv", "b", v1::ClockRequest::JOIN).status());
  ASSERT_OK(Push("kv", {1}, {4.0}));          // applied at once (no worker)
  ASSERT_OK(Push("kv", {1}, {2.0}, "a", 0));  // held
  std::map<std::string, std::string> extensions;
  tables_.SaveTo(&extensions);
  EXPECT_EQ(extensions.count("table/kv"), 1u);
  EXPECT_EQ(extensions.count("clocks/kv"), 1u);
  EXPECT_EQ(extensions.count("pending/kv"), 1u);

  Tables restored(Options());
  ASSERT_OK(restored.RestoreFrom(extensions));
  EXPECT_THAT(restored.RestoreFrom(extensions),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("without any")));
  v1::ClockRequest tick;
  tick.set_table("kv");
  tick.set_op(v1::ClockRequest::TICK);
  for (const char* w : {"a", "b"}) {
    tick.set_worker(w);
    ASSERT_OK(restored.Clock(tick).status());
  }
  v1::TablePullRequest pull;
  pull.set_table("kv");
  pull.set_keys(EncodeKeys(std::vector<uint64_t>{1}));
  v1::TablePullResponse response;
  ASSERT_OK(restored.Pull(pull, &response, absl::Now() + absl::Seconds(1)));
  double value = 0;
  std::memcpy(&value, response.values().data(), sizeof(double));
  EXPECT_EQ(value, 6.0);

  extensions["table/kv"] = "not a snapshot";
  Tables broken(Options());
  EXPECT_THAT(broken.RestoreFrom(extensions),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("extension 'table/kv'")));
}

// Live moves (docs/elastic.md): a table's rows, held-back adds and clocks
// exported from one server's tables and imported into another's.
TEST_F(TablesTest, RowsHeldBackAddsAndClocksMoveToAnotherServersTables) {
  ASSERT_OK(Create("bsp", "optimizer { add {} } consistency { model: BSP }"));
  ASSERT_OK(Clock("bsp", "a", v1::ClockRequest::JOIN).status());
  ASSERT_OK(Clock("bsp", "b", v1::ClockRequest::JOIN).status());
  ASSERT_OK(Push("bsp", {1, 2, 3}, {1, 2, 3}));
  ASSERT_OK(Push("bsp", {1, 2, 3}, {10, 20, 30}, "a", 0));  // held back
  std::map<std::string, std::string> extensions;
  ASSERT_OK_AND_ASSIGN(Tables::Exported exported,
                       tables_.ExportRows("bsp", [](uint64_t key) { return key != 3; },
                                          &extensions));
  EXPECT_EQ(exported.rows, 2u);
  EXPECT_EQ(exported.bytes, 2 * sizeof(double));
  EXPECT_THAT(tables_.ExportRows("nope", [](uint64_t) { return true; }, &extensions),
              StatusCodeIs(absl::StatusCode::kNotFound));

  Tables other(Options());
  auto all = [](uint64_t) { return true; };
  // A key the receiver refuses: nothing taken, not even the table.
  EXPECT_THAT(other.ImportRows(
                  extensions,
                  [](const std::string&, const v1::TableConfig&, uint64_t key) {
                    return key == 2 ? absl::FailedPreconditionError("not mine") : absl::OkStatus();
                  },
                  all),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not mine")));
  EXPECT_THAT(other.ConfigOf("bsp"), StatusCodeIs(absl::StatusCode::kNotFound));
  auto mine = [](const std::string&, const v1::TableConfig&, uint64_t) { return absl::OkStatus(); };
  ASSERT_OK_AND_ASSIGN(uint64_t rows, other.ImportRows(extensions, mine, all));
  EXPECT_EQ(rows, 2u);
  EXPECT_EQ(other.Names(), std::vector<std::string>{"bsp"});
  EXPECT_EQ(other.AllWorkerClocks(), tables_.AllWorkerClocks());  // the clocks came along
  auto pull = [&](Tables& t) {
    v1::TablePullRequest request;
    request.set_table("bsp");
    request.set_keys(EncodeKeys({1, 2, 3}));
    v1::TablePullResponse response;
    EXPECT_OK(t.Pull(request, &response, absl::Now() + absl::Seconds(5)));
    std::vector<double> values(3);
    std::memcpy(values.data(), response.values().data(), response.values().size());
    return values;
  };
  EXPECT_EQ(pull(other), (std::vector<double>{1, 2, 0}));  // the adds are held back
  for (const char* worker : {"a", "b"}) {
    v1::ClockRequest tick;
    tick.set_table("bsp");
    tick.set_worker(worker);
    tick.set_op(v1::ClockRequest::TICK);
    ASSERT_OK(other.Clock(tick).status());
  }
  EXPECT_EQ(pull(other), (std::vector<double>{11, 22, 0}));  // applied by the ticks there
  // Sent again: refused unless it may replace; replacing, adds of clocks
  // every worker here passed apply at once.
  EXPECT_THAT(other.ImportRows(extensions, mine, nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("here already")));
  ASSERT_OK(other.ImportRows(extensions, mine, all).status());
  EXPECT_EQ(pull(other), (std::vector<double>{11, 22, 0}));
  EXPECT_THAT(other.ImportRows({}, mine, all),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("without a table")));
}

// BSP adds held back for a slower worker are bounded (--max_held_add_bytes):
// past the limit a push is UNAVAILABLE ("retry") and one add larger than it
// RESOURCE_EXHAUSTED, each naming the flag and changing nothing; adds that
// apply free their bytes.
TEST_F(TablesTest, HeldBackAddsAreBoundedByMaxHeldAddBytes) {
  ASSERT_OK(Create("bsp", "optimizer { add {} } consistency { model: BSP }"));
  ASSERT_OK(Clock("bsp", "a", v1::ClockRequest::JOIN).status());
  ASSERT_OK(Clock("bsp", "b", v1::ClockRequest::JOIN).status());
  std::vector<uint64_t> keys(200);
  for (uint64_t k = 0; k < keys.size(); ++k) keys[k] = k;
  const std::vector<double> ones(keys.size(), 1.0);
  ASSERT_OK(Push("bsp", keys, ones, "a", 0));  // 3200 bytes held: b is at clock 0
  EXPECT_THAT(Push("bsp", keys, ones, "a", 0),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("--max_held_add_bytes")));
  std::vector<uint64_t> many(300);
  for (uint64_t k = 0; k < many.size(); ++k) many[k] = k;
  EXPECT_THAT(Push("bsp", many, std::vector<double>(many.size(), 1.0), "a", 0),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max_held_add_bytes")));
  ASSERT_OK(Clock("bsp", "a", v1::ClockRequest::TICK, 1).status());
  ASSERT_OK(Clock("bsp", "b", v1::ClockRequest::TICK, 1).status());
  EXPECT_THAT(*Pull("bsp", {0, 199}), ::testing::ElementsAre(1.0, 1.0)) << "applied once";
  // Applied, the add's bytes are free again.
  ASSERT_OK(Push("bsp", keys, ones, "a", 1));
}

// Tables made by Create are bounded (--max_tables): past the bound a create
// is RESOURCE_EXHAUSTED naming the flag and the table, and nothing is
// created; a create of a table held already is still answered as before.
TEST(TablesLimitTest, CreatesPastMaxTablesAreRefusedAndCreateNothing) {
  TablesOptions options;
  options.max_tables = 3;
  Tables tables(options);
  const auto create = [&](const std::string& name, int dim) {
    v1::CreateTableRequest request;
    request.set_name(name);
    request.mutable_config()->set_dim(dim);
    return tables.Create(request);
  };
  for (int i = 0; i < 3; ++i) ASSERT_OK(create(absl::StrCat("t", i), 1));
  for (int i = 3; i < 100; ++i) {
    ASSERT_THAT(create(absl::StrCat("t", i), 1),
                StatusIs(absl::StatusCode::kResourceExhausted,
                         AllOf(HasSubstr("--max_tables=3"), HasSubstr(absl::StrCat("'t", i, "'")))));
    ASSERT_THAT(tables.ConfigOf(absl::StrCat("t", i)), StatusCodeIs(absl::StatusCode::kNotFound));
  }
  EXPECT_OK(create("t0", 1));  // held already, the same config
  EXPECT_THAT(create("t1", 2), StatusCodeIs(absl::StatusCode::kAlreadyExists));
  v1::TableStatsResponse stats;
  tables.Stats(&stats);
  EXPECT_EQ(stats.tables_size(), 3);
}

// The row budget (--max_table_row_bytes) is one for all tables of a server:
// rows of one table leave no room for another's; a push past it is refused
// naming the table and the flag, nothing applied; checkpoints restore whole.
TEST(TablesLimitTest, RowsOfAllTablesShareMaxRowBytes) {
  TablesOptions options;
  options.max_row_bytes = 4 * 41;  // four rows of dim 1 (41 bytes each: SparseTable::row_budget_bytes)
  Tables tables(options);
  const auto push = [&](const std::string& table, std::vector<uint64_t> keys) {
    v1::CreateTableRequest create;
    create.set_name(table);
    create.mutable_config()->set_dim(1);
    EXPECT_OK(tables.Create(create));
    TableRowsView view;
    view.table = table;
    view.keys = keys;
    const std::vector<float> values(keys.size(), 1);
    view.values = absl::string_view(reinterpret_cast<const char*>(values.data()),
                                    values.size() * sizeof(float));
    return tables.PushRows(view);
  };
  ASSERT_OK(push("a", {1, 2, 3}));
  EXPECT_EQ(tables.row_budget().used(), 3 * 41u);
  EXPECT_THAT(push("b", {1, 2}),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("table 'b'"), HasSubstr("--max_table_row_bytes=164"))));
  ASSERT_OK(push("b", {1}));
  EXPECT_EQ(tables.row_budget().used(), 4 * 41u);
  v1::TableStatsResponse stats;
  tables.Stats(&stats);
  ASSERT_EQ(stats.tables_size(), 2);
  EXPECT_EQ(stats.tables(0).rows() + stats.tables(1).rows(), 4u);

  // A checkpoint of more rows than the budget is restored whole.
  std::map<std::string, std::string> extensions;
  tables.SaveTo(&extensions);
  TablesOptions smaller;
  smaller.max_row_bytes = 41;
  Tables restored(smaller);
  ASSERT_OK(restored.RestoreFrom(extensions));
  EXPECT_EQ(restored.row_budget().used(), 4 * 41u);
  // Replaced whole (a standby's fresh copy): the old rows' bytes go back.
  ASSERT_OK(restored.RestoreFrom({}, /*replace=*/true));
  EXPECT_EQ(restored.row_budget().used(), 0u);
}

}  // namespace
}  // namespace pserver
