#include "cc/core/row_error_feedback.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::testing::ElementsAre;

TEST(RowErrorFeedbackTest, SendsTheLargestRowsAndKeepsTheRest) {
  RowErrorFeedback feedback(/*dim=*/2, /*max_rows=*/100);
  const std::vector<uint64_t> keys = {7, 3, 9};
  const std::vector<float> grads = {1, 0, 3, 4, 0, 2};  // norms 1, 5, 2
  SelectedRows sent = feedback.AddAndSelect(keys, grads.data(), 2);
  EXPECT_THAT(sent.keys, ElementsAre(3, 9));  // in the order of `keys`
  EXPECT_THAT(sent.values, ElementsAre(3, 4, 0, 2));
  EXPECT_EQ(feedback.rows(), 1u);
  ASSERT_NE(feedback.ResidualOf(7), nullptr);
  EXPECT_EQ(feedback.ResidualOf(7)[0], 1.0f);
  EXPECT_EQ(feedback.ResidualOf(3), nullptr);  // sent: nothing left

  // Key 7 again: its residual joins the new gradient.
  const std::vector<uint64_t> again = {7};
  const std::vector<float> more = {0.5f, 1};
  sent = feedback.AddAndSelect(again, more.data(), 1);
  EXPECT_THAT(sent.keys, ElementsAre(7));
  EXPECT_THAT(sent.values, ElementsAre(1.5f, 1));
  EXPECT_EQ(feedback.rows(), 0u);
}

TEST(RowErrorFeedbackTest, SentPlusResidualIsTheSumOfGradients) {
  const size_t dim = 3;
  RowErrorFeedback feedback(dim, 1000);
  std::vector<double> total(10 * dim, 0.0), sent_total(10 * dim, 0.0);
  for (int step = 0; step < 20; ++step) {
    std::vector<uint64_t> keys;
    std::vector<float> grads;
    for (int i = 0; i < 6; ++i) {
      const uint64_t key = static_cast<uint64_t>((step * 7 + i * 3) % 10);
      keys.push_back(key);
      for (size_t j = 0; j < dim; ++j) {
        const float g = static_cast<float>((step * 13 + i * 5 + static_cast<int>(j)) % 9) - 4;
        grads.push_back(g);
        total[key * dim + j] += g;
      }
    }
    SelectedRows sent = feedback.AddAndSelect(keys, grads.data(), 2);
    ASSERT_LE(sent.keys.size(), 2u);
    for (size_t r = 0; r < sent.keys.size(); ++r) {
      for (size_t j = 0; j < dim; ++j)
        sent_total[sent.keys[r] * dim + j] += sent.values[r * dim + j];
    }
  }
  for (uint64_t key = 0; key < 10; ++key) {
    const float* residual = feedback.ResidualOf(key);
    for (size_t j = 0; j < dim; ++j) {
      const double left = residual == nullptr ? 0.0 : residual[j];
      EXPECT_DOUBLE_EQ(sent_total[key * dim + j] + left, total[key * dim + j]) << key << " " << j;
    }
  }
  EXPECT_EQ(feedback.dropped_rows(), 0u);
}

TEST(RowErrorFeedbackTest, DuplicateKeysAreSummedAndSentOnce) {
  RowErrorFeedback feedback(1, 10);
  const std::vector<uint64_t> keys = {5, 5, 6};
  const std::vector<float> grads = {1, 2, 0.5f};
  SelectedRows sent = feedback.AddAndSelect(keys, grads.data(), 5);
  EXPECT_THAT(sent.keys, ElementsAre(5, 6));
  EXPECT_THAT(sent.values, ElementsAre(3, 0.5f));
  EXPECT_EQ(RowErrorFeedback::DistinctKeys(keys), 2u);
}

TEST(RowErrorFeedbackTest, KeepsAtMostMaxRowsDroppingTheOldest) {
  RowErrorFeedback feedback(1, /*max_rows=*/3);
  for (uint64_t key = 0; key < 5; ++key) {
    const std::vector<uint64_t> keys = {key, 100};
    const std::vector<float> grads = {1, 1000};  // 100 is sent, `key` kept
    SelectedRows sent = feedback.AddAndSelect(keys, grads.data(), 1);
    ASSERT_THAT(sent.keys, ElementsAre(100));
  }
  EXPECT_EQ(feedback.rows(), 3u);
  EXPECT_EQ(feedback.dropped_rows(), 2u);
  EXPECT_EQ(feedback.ResidualOf(0), nullptr);  // pushed longest ago
  EXPECT_EQ(feedback.ResidualOf(1), nullptr);
  EXPECT_NE(feedback.ResidualOf(4), nullptr);
}

TEST(RowErrorFeedbackTest, TiesGoToTheKeySeenFirst) {
  RowErrorFeedback feedback(1, 10);
  const std::vector<uint64_t> keys = {9, 4, 1};
  const std::vector<float> grads = {-2, 2, 2};
  EXPECT_THAT(feedback.AddAndSelect(keys, grads.data(), 2).keys, ElementsAre(9, 4));
}

}  // namespace
}  // namespace pserver
