// Compression on the wire end to end, over gRPC: a parameter configured with
// wire_compression is pushed and pulled in float16/bfloat16 or as top-k with
// error feedback, split over two servers, and ends where float32 SGD on the
// same data ends (exactly, with values every type represents).
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cc/client/client.h"
#include "cc/core/compression.h"
#include "cc/server/local_cluster.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::IsOk;
using ::testing::ElementsAreArray;

constexpr int64_t kN = 1000;  // 4000 bytes: two blocks of 2048 bytes

std::vector<float> Values(const Tensor& t) {
  std::vector<float> v(t.num_elements());
  std::memcpy(v.data(), t.data(), v.size() * sizeof(float));
  return v;
}

// Multiples of 1/64 in [-1, 1]: exact in float16 and bfloat16, and their
// sums over a few steps too.
Tensor Gradient(int step) {
  std::vector<float> g(kN);
  for (int64_t i = 0; i < kN; ++i) g[i] = static_cast<float>((i * 29 + step * 7) % 129 - 64) / 64;
  return Tensor::FromValues<float>({kN}, g);
}

class WireCompressionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(cluster_, LocalCluster::Start(2));
    ClientOptions options;
    options.servers = cluster_->addresses();
    options.block_bytes = 2048;
    options.timeout = absl::Seconds(60);
    ASSERT_OK_AND_ASSIGN(client_, Client::Connect(options));
  }

  void Init(const std::string& name, const v1::WireCompression& compression) {
    v1::ParameterConfig config;
    config.mutable_learning_rate()->set_learning_rate(1.0);
    *config.mutable_wire_compression() = compression;
    ASSERT_THAT(client_->InitParam(name, *Tensor::Zeros(v1::FLOAT32, {kN}), config), IsOk());
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<Client> client_;
};

TEST_F(WireCompressionTest, HalfTypesPushAndPullAsFloat32Does) {
  v1::WireCompression f16, bf16;
  f16.set_value_type(v1::WireCompression::FLOAT16);
  bf16.set_value_type(v1::WireCompression::BFLOAT16);
  Init("plain", {});
  Init("f16", f16);
  Init("bf16", bf16);
  ASSERT_THAT(client_->FinishInitParams(), IsOk());
  for (int step = 0; step < 3; ++step) {
    const Tensor g = Gradient(step);
    ASSERT_THAT(client_->SendGrad("plain", g), IsOk());
    ASSERT_THAT(client_->SendGrad("f16", g), IsOk());
    Tensor out;
    ASSERT_THAT(client_->PushPull("bf16", g, &out), IsOk());
  }
  ASSERT_OK_AND_ASSIGN(Tensor plain, client_->GetParam("plain"));
  for (const char* name : {"f16", "bf16"}) {
    ASSERT_OK_AND_ASSIGN(Tensor got, client_->GetParam(name));
    EXPECT_EQ(got.type(), v1::FLOAT32);
    EXPECT_THAT(Values(got), ElementsAreArray(Values(plain))) << name;
  }
}

TEST_F(WireCompressionTest, TopKWithErrorFeedbackSendsTheWholeGradientOverTime) {
  v1::WireCompression topk;
  topk.set_topk_fraction(0.05);
  Init("plain", {});
  Init("topk", topk);
  ASSERT_THAT(client_->FinishInitParams(), IsOk());
  for (int step = 0; step < 4; ++step) {
    const Tensor g = Gradient(step);
    ASSERT_THAT(client_->SendGrad("plain", g), IsOk());
    Tensor out;
    ASSERT_THAT(client_->PushPull("topk", g, &out), IsOk());
  }
  // SGD with lr 1 from zero: plain = -sum(g); topk = -sum(sent), and
  // sum(sent) + residual = sum(g).
  ASSERT_OK_AND_ASSIGN(Tensor plain, client_->GetParam("plain"));
  ASSERT_OK_AND_ASSIGN(Tensor topk_values, client_->GetParam("topk"));
  const std::vector<float> residual = client_->wire_residual("topk");
  ASSERT_EQ(residual.size(), static_cast<size_t>(kN));
  std::vector<float> reconstructed = Values(topk_values);
  int moved = 0;
  for (int64_t i = 0; i < kN; ++i) {
    moved += reconstructed[i] != 0;
    reconstructed[i] -= residual[i];
  }
  EXPECT_THAT(reconstructed, ElementsAreArray(Values(plain)));
  // 5% of each block (512 and 488 elements: 26 + 25) per step.
  EXPECT_GT(moved, 0);
  EXPECT_LE(moved, 4 * (26 + 25));
}

TEST_F(WireCompressionTest, AClientThatDidNotInitLearnsTheCompression) {
  v1::WireCompression f16;
  f16.set_value_type(v1::WireCompression::FLOAT16);
  Init("f16", f16);
  ASSERT_THAT(client_->FinishInitParams(), IsOk());
  ClientOptions options;
  options.servers = cluster_->addresses();
  options.block_bytes = 2048;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> other, Client::Connect(options));
  ASSERT_OK_AND_ASSIGN(ParamLayout layout, other->GetLayout("f16"));
  EXPECT_EQ(layout.type, v1::FLOAT32);
  EXPECT_EQ(layout.compression.value_type(), v1::WireCompression::FLOAT16);
  // Its pushes and pulls travel in float16 too.
  Tensor out;
  ASSERT_THAT(other->PushPull("f16", Gradient(0), &out), IsOk());
  EXPECT_THAT(Values(out), ElementsAreArray(Values(*client_->GetParam("f16"))));
}

}  // namespace
}  // namespace pserver
