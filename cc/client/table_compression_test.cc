// A sparse table's compression on the wire end to end, over gRPC on two
// servers (TableConfig.wire_compression, cc/client/table_compressor.h):
// float16/bfloat16 pushes and pulls train as float32 does (exactly, with
// values every type represents), top-k sends k rows and keeps the rest in
// per-row residuals that later pushes send, the residual is bounded, and a
// bad config is refused before anything is created.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cc/client/client.h"
#include "cc/client/table.h"
#include "cc/server/local_cluster.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::IsOk;
using ::pserver::testing::StatusIs;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr uint32_t kDim = 4;

// Multiples of 1/64 in [-1, 1]: exact in float16 and bfloat16, their sums too.
std::vector<float> Grads(size_t rows, int step) {
  std::vector<float> g(rows * kDim);
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = static_cast<float>((static_cast<int>(i) * 29 + step * 7) % 129 - 64) / 64;
  }
  return g;
}

class TableCompressionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(cluster_, LocalCluster::Start(2));
    ClientOptions options;
    options.servers = cluster_->addresses();
    options.timeout = absl::Seconds(60);
    ASSERT_OK_AND_ASSIGN(client_, Client::Connect(options));
    ASSERT_THAT(client_->FinishInitParams(), IsOk());
  }

  absl::StatusOr<Table> Create(const std::string& name, const v1::WireCompression& compression) {
    v1::TableConfig config;
    config.set_dim(kDim);
    config.mutable_optimizer()->mutable_sgd()->set_learning_rate(1.0);
    if (compression.ByteSizeLong() > 0) *config.mutable_wire_compression() = compression;
    return Table::Create(*client_, name, config);
  }

  std::vector<float> Rows(const Table& table, const std::vector<uint64_t>& keys) {
    std::vector<float> out(keys.size() * kDim);
    EXPECT_THAT(table.Pull<float>(keys, absl::MakeSpan(out)), IsOk());
    return out;
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<Client> client_;
};

TEST_F(TableCompressionTest, HalfTypesTrainAsFloat32Does) {
  v1::WireCompression f16, bf16;
  f16.set_value_type(v1::WireCompression::FLOAT16);
  bf16.set_value_type(v1::WireCompression::BFLOAT16);
  ASSERT_OK_AND_ASSIGN(Table plain, Create("plain", {}));
  ASSERT_OK_AND_ASSIGN(Table half, Create("f16", f16));
  ASSERT_OK_AND_ASSIGN(Table brain, Create("bf16", bf16));
  ASSERT_NE(half.compressor(), nullptr);
  const std::vector<uint64_t> keys = {1, 2, 3, 40, 500, 6000, 3, 1};  // both servers, repeats
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> g = Grads(keys.size(), step);
    for (const Table* t : {&plain, &half, &brain}) {
      ASSERT_THAT(t->Push<float>(keys, g), IsOk()) << t->name();
    }
  }
  const std::vector<float> want = Rows(plain, keys);
  EXPECT_THAT(Rows(half, keys), ElementsAreArray(want));
  EXPECT_THAT(Rows(brain, keys), ElementsAreArray(want));
}

TEST_F(TableCompressionTest, TopKSendsKRowsAndTheResidualLater) {
  v1::WireCompression topk;
  topk.set_topk_fraction(0.25);
  topk.set_value_type(v1::WireCompression::BFLOAT16);
  ASSERT_OK_AND_ASSIGN(Table plain, Create("plain", {}));
  ASSERT_OK_AND_ASSIGN(Table sparse, Create("topk", topk));
  const std::vector<uint64_t> keys = {10, 11, 12, 13, 14, 15, 16, 17};
  const std::vector<float> g = Grads(keys.size(), 1);
  ASSERT_THAT(plain.Push<float>(keys, g), IsOk());
  ASSERT_THAT(sparse.Push<float>(keys, g), IsOk());
  const std::vector<float> after_one = Rows(sparse, keys);
  size_t moved = 0;
  for (size_t r = 0; r < keys.size(); ++r) {
    bool any = false;
    for (uint32_t j = 0; j < kDim; ++j) any |= after_one[r * kDim + j] != 0.0f;
    moved += any;
  }
  EXPECT_EQ(moved, 2u);  // 25% of 8 rows
  EXPECT_EQ(sparse.compressor()->residual_rows(), 6u);
  // Zero gradients flush the residual, two rows a push.
  const std::vector<float> zeros(keys.size() * kDim, 0.0f);
  for (int push = 0; push < 3; ++push) ASSERT_THAT(sparse.Push<float>(keys, zeros), IsOk());
  EXPECT_EQ(sparse.compressor()->residual_rows(), 0u);
  EXPECT_THAT(Rows(sparse, keys), ElementsAreArray(Rows(plain, keys)));
}

TEST_F(TableCompressionTest, ResidualRowsAreBounded) {
  v1::WireCompression topk;
  topk.set_topk_count(1);
  topk.set_max_residual_rows(3);
  ASSERT_OK_AND_ASSIGN(Table table, Create("bounded", topk));
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 10; ++k) keys.push_back(k);
  ASSERT_THAT(table.Push<float>(keys, Grads(keys.size(), 2)), IsOk());
  EXPECT_EQ(table.compressor()->residual_rows(), 3u);
  EXPECT_EQ(table.compressor()->dropped_rows(), 6u);  // 10 pushed, 1 sent, 3 kept
}

TEST_F(TableCompressionTest, BadConfigIsRefusedAndCreatesNothing) {
  v1::WireCompression bad;
  bad.set_topk_fraction(2.0);
  EXPECT_THAT(Create("t", bad).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("table 't': wire_compression.topk_fraction must be in [0, 1]")));
  v1::TableConfig float64;
  float64.set_dim(1);
  float64.set_element_type(v1::FLOAT64);
  float64.mutable_wire_compression()->set_value_type(v1::WireCompression::FLOAT16);
  EXPECT_THAT(Table::Create(*client_, "t", float64).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("wire_compression needs a float32 table; this one is float64")));
  v1::TableConfig other;
  other.set_dim(2);
  ASSERT_OK_AND_ASSIGN(Table t, Table::Create(*client_, "t", other));
  EXPECT_EQ(t.dim(), 2u);  // no table 't' was made by the failures
}

}  // namespace
}  // namespace pserver
