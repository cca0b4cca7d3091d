// The state checksum GetStats reports on request: equal for two shards that
// applied the same writes in the same order, whatever was read in between or
// in which order independent rows were created; different as soon as a
// write, an applied request id, a table row or a worker clock differs.
#include "cc/server/state_checksum.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cc/core/gradient_view.h"
#include "cc/core/parameter_store.h"
#include "cc/core/status_macros.h"
#include "cc/core/tables.h"
#include "cc/server/dispatcher.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

std::string Floats(std::vector<float> values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}
std::string Keys(std::vector<uint64_t> keys) {
  return std::string(reinterpret_cast<const char*>(keys.data()), keys.size() * sizeof(uint64_t));
}

// One shard: a store with dense parameter "w" (Adam) and a dispatcher.
class Shard {
 public:
  Shard() {
    v1::Parameter w;
    w.set_name("w");
    w.set_element_type(v1::FLOAT32);
    w.add_shape(4);
    w.set_content(Floats({1, 2, 3, 4}));
    v1::ParameterConfig adam;
    adam.mutable_optimizer()->mutable_adam();
    EXPECT_OK(store_.Init(w, adam));
    store_.FinishInit();
  }

  absl::Status Push(uint64_t client, uint64_t sequence, std::vector<float> values) {
    v1::Gradient grad;
    grad.set_name("w");
    grad.set_element_type(v1::FLOAT32);
    grad.set_content(Floats(std::move(values)));
    const GradientView view = GradientView::Of(grad);
    return dispatcher_.Push(RequestId{client, sequence}, absl::MakeConstSpan(&view, 1));
  }

  // Calls control method `name` (all of them here answer at once).
  template <typename Response, typename Request>
  absl::StatusOr<Response> Call(const char* name, const Request& request) {
    Response response;
    absl::Status result = absl::InternalError("not answered");
    dispatcher_.Call(name, request, &response, {}, [&](absl::Status s) { result = s; });
    if (!result.ok()) return result;
    return response;
  }

  absl::Status CreateTable(const std::string& name, bool adam) {
    v1::CreateTableRequest request;
    request.set_name(name);
    request.mutable_config()->set_dim(2);
    if (adam) request.mutable_config()->mutable_optimizer()->mutable_adam();
    return Call<v1::CreateTableResponse>("CreateTable", request).status();
  }

  absl::Status TablePush(const std::string& table, std::vector<uint64_t> keys,
                         std::vector<float> values, std::string worker = "", int64_t clock = 0) {
    v1::TablePushRequest request;
    request.set_table(table);
    request.set_keys(Keys(std::move(keys)));
    request.set_values(Floats(std::move(values)));
    request.set_worker(worker);
    request.set_clock(clock);
    return Call<v1::TablePushResponse>("TablePush", request).status();
  }

  absl::Status TablePull(const std::string& table, std::vector<uint64_t> keys) {
    v1::TablePullRequest request;
    request.set_table(table);
    request.set_keys(Keys(std::move(keys)));
    return Call<v1::TablePullResponse>("TablePull", request).status();
  }

  absl::StatusOr<v1::ServerStats> Stats(bool checksum) {
    v1::GetStatsRequest request;
    request.set_state_checksum(checksum);
    PS_ASSIGN_OR_RETURN(v1::GetStatsResponse response,
                        (Call<v1::GetStatsResponse>("GetStats", request)));
    return response.stats();
  }

  uint32_t Checksum() {
    absl::StatusOr<v1::ServerStats> stats = Stats(true);
    EXPECT_OK(stats.status());
    EXPECT_TRUE(stats.ok() && stats->has_state_checksum());
    return stats.ok() ? stats->state_checksum() : 0;
  }

  Dispatcher& dispatcher() { return dispatcher_; }

 private:
  ParameterStore store_;
  Tables tables_;
  Dispatcher dispatcher_{&store_, &tables_, /*index=*/0};
};

// The same writes on two shards: dense pushes with ids, a table with Adam.
void SameWrites(Shard* shard) {
  ASSERT_OK(shard->Push(7, 1, {1, 1, 1, 1}));
  ASSERT_OK(shard->Push(7, 2, {0.5, -1, 2, 0}));
  ASSERT_OK(shard->CreateTable("emb", /*adam=*/true));
  ASSERT_OK(shard->TablePush("emb", {3, 9}, {1, 2, 3, 4}));
}

TEST(StateChecksumTest, ReportedOnlyWhenAskedFor) {
  Shard shard;
  ASSERT_OK_AND_ASSIGN(v1::ServerStats plain, shard.Stats(false));
  EXPECT_FALSE(plain.has_state_checksum());
  ASSERT_OK_AND_ASSIGN(v1::ServerStats with, shard.Stats(true));
  EXPECT_TRUE(with.has_state_checksum());
}

TEST(StateChecksumTest, EqualForTheSameWritesWhateverWasReadInBetween) {
  Shard a, b;
  SameWrites(&a);
  SameWrites(&b);
  // Reads of existing rows reorder b's rows (recency) and count keys
  // pulled; a GetStats with a checksum changes nothing either.
  ASSERT_OK(b.TablePull("emb", {9, 3}));
  ASSERT_OK(b.TablePull("emb", {3}));
  EXPECT_EQ(a.Checksum(), b.Checksum());
  EXPECT_EQ(a.Checksum(), a.Checksum());
}

TEST(StateChecksumTest, EqualWhenIndependentRowsWereCreatedInAnotherOrder) {
  Shard a, b;
  ASSERT_OK(a.CreateTable("emb", /*adam=*/false));
  ASSERT_OK(b.CreateTable("emb", /*adam=*/false));
  // 64 rows, one push each: ascending keys on a, descending on b (so that
  // rows sharing one of the table's internal shards are held in opposite
  // orders).
  constexpr uint64_t kRows = 64;
  for (uint64_t k = 0; k < kRows; ++k) {
    const float v = static_cast<float>(k);
    ASSERT_OK(a.TablePush("emb", {k}, {v, -v}));
    const uint64_t back = kRows - 1 - k;
    const float w = static_cast<float>(back);
    ASSERT_OK(b.TablePush("emb", {back}, {w, -w}));
  }
  EXPECT_EQ(a.Checksum(), b.Checksum());
}

TEST(StateChecksumTest, DiffersForADifferentDensePush) {
  Shard a, b;
  SameWrites(&a);
  SameWrites(&b);
  const uint32_t before = b.Checksum();
  ASSERT_OK(b.Push(7, 3, {0, 0, 0, 1}));
  EXPECT_NE(a.Checksum(), b.Checksum());
  EXPECT_NE(before, b.Checksum());
}

TEST(StateChecksumTest, CoversTheAppliedRequestIds) {
  // The same gradient with and without a request id: equal parameters and
  // optimizer state, different exactly-once sets.
  Shard a, b;
  ASSERT_OK(a.Push(7, 1, {1, 1, 1, 1}));
  ASSERT_OK(b.Push(0, 0, {1, 1, 1, 1}));
  EXPECT_NE(a.Checksum(), b.Checksum());
}

TEST(StateChecksumTest, CoversTableRowsAndTheirOptimizerState) {
  Shard a, b;
  SameWrites(&a);
  SameWrites(&b);
  ASSERT_OK(b.TablePush("emb", {9}, {0, 1}));
  EXPECT_NE(a.Checksum(), b.Checksum());
}

TEST(StateChecksumTest, CoversWorkerClocksAndHeldBackAdds) {
  Shard a, b;
  for (Shard* s : {&a, &b}) {
    v1::CreateTableRequest request;
    request.set_name("bsp");
    request.mutable_config()->set_dim(2);
    request.mutable_config()->mutable_consistency()->set_model(v1::Consistency::BSP);
    ASSERT_OK((s->Call<v1::CreateTableResponse>("CreateTable", request)).status());
  }
  const uint32_t empty = a.Checksum();
  ASSERT_EQ(empty, b.Checksum());
  // An add held back under BSP (worker "w0" at clock 0) is state.
  ASSERT_OK(b.TablePush("bsp", {1}, {1, 1}, "w0", 0));
  EXPECT_NE(empty, b.Checksum());
  ASSERT_OK(a.TablePush("bsp", {1}, {1, 1}, "w0", 0));
  EXPECT_EQ(a.Checksum(), b.Checksum());
}

TEST(StateChecksumTest, AMalformedExtensionIsDataLossNamingIt) {
  Shard shard;
  ASSERT_OK_AND_ASSIGN(StoreSnapshot snapshot, shard.dispatcher().Snapshot());
  snapshot.extensions["table/emb"] = "\xff\xff not a table";
  EXPECT_THAT(ShardStateChecksum(snapshot).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("'table/emb'")));
  snapshot.extensions.erase("table/emb");
  v1::SparseTableSnapshot table;
  table.set_rows(2);
  table.set_keys(Keys({1}));
  snapshot.extensions["table/t"] = table.SerializeAsString();
  EXPECT_THAT(ShardStateChecksum(snapshot).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("8 key bytes for 2 rows")));
}

}  // namespace
}  // namespace pserver
