// README.md's C++ example ("Using it from C++"), run as written
// (examples/readme_cpp_example.py makes it a function) against a 2-server
// in-process cluster: Adam's first step with learning rate 0.01 moves each
// weight by 0.01 against the sign of its gradient.
#include <memory>
#include <vector>

#include "cc/core/tensor.h"
#include "cc/server/local_cluster.h"
#include "cc/testing/status_matchers.h"
#include "examples/readme_cpp_example.h"
#include "gtest/gtest.h"

namespace {

TEST(ReadmeCppTest, TheExampleRunsAsWrittenAndAdamStepsEachWeightByTheLearningRate) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<pserver::LocalCluster> cluster,
                       pserver::LocalCluster::Start(2));
  const pserver::Tensor w = RunReadmeCppExample(cluster->addresses());
  const std::vector<float> got = w.ToVector<float>();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_NEAR(got[0], -0.01f, 1e-6);
  EXPECT_NEAR(got[1], 0.01f, 1e-6);
}

}  // namespace
