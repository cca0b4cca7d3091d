// The dispatcher's bulk path under a PlacementGate: a block this server does
// not own under the current placement is refused with PlacementMoved before
// anything is applied or read; the refused request id is not used up (its
// retry is redirected again, or applied once the block is owned), while a
// duplicate of a push applied before the block moved is acknowledged.
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "cc/core/gradient_view.h"
#include "cc/core/parameter_store.h"
#include "cc/core/placement.h"
#include "cc/core/tables.h"
#include "cc/server/dispatcher.h"
#include "cc/server/placement_gate.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

std::string Floats(std::vector<float> values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

// A name whose block 0 is on server 0 of 2 and on server 2 of 3.
std::string MovingName() {
  for (int i = 0; i < 10000; ++i) {
    const std::string name = "w" + std::to_string(i);
    if (Placement::Jump(2, 1).ServerOf(name, 0) == 0 &&
        Placement::Jump(3, 2).ServerOf(name, 0) == 2)
      return name;
  }
  ADD_FAILURE() << "no name moves from server 0 to server 2";
  return "";
}

class DispatcherPlacementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    name_ = MovingName();
    v1::Parameter w;
    w.set_name(name_);
    w.set_element_type(v1::FLOAT32);
    w.add_shape(2);
    w.set_content(Floats({0, 0}));
    v1::ParameterConfig sgd;
    sgd.mutable_optimizer()->mutable_sgd();
    sgd.mutable_learning_rate()->set_learning_rate(1.0);
    ASSERT_OK(store_.Init(w, sgd));
    store_.FinishInit();
    dispatcher_.SetPlacementGate(&gate_);
  }

  absl::Status Push(uint64_t sequence) {
    v1::Gradient grad;
    grad.set_name(name_);
    grad.set_element_type(v1::FLOAT32);
    grad.set_content(Floats({-1, -2}));
    const GradientView view = GradientView::Of(grad);
    return dispatcher_.Push(RequestId{7, sequence}, absl::MakeConstSpan(&view, 1));
  }

  absl::StatusOr<std::vector<float>> Read() {
    v1::ParamRef ref;
    ref.set_name(name_);
    std::vector<float> values;
    absl::Status status = dispatcher_.Read(
        absl::MakeConstSpan(&ref, 1), [&](const v1::Parameter&, absl::string_view bytes) {
          values.resize(bytes.size() / sizeof(float));
          std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
          return absl::OkStatus();
        });
    if (!status.ok()) return status;
    return values;
  }

  std::string name_;
  ParameterStore store_;
  Tables tables_{TablesOptions()};
  Dispatcher dispatcher_{&store_, &tables_, 0};
  PlacementGate gate_{0, Placement::Jump(2, 1)};
};

TEST_F(DispatcherPlacementTest, OwnedBlocksAreServedMovedOnesRedirectedWithNothingApplied) {
  ASSERT_OK(Push(1));
  ASSERT_OK_AND_ASSIGN(std::vector<float> w, Read());
  EXPECT_EQ(w, (std::vector<float>{1, 2}));

  gate_.Set(Placement::Jump(3, 2));  // the block is server 2's now
  absl::Status moved = Push(2);
  EXPECT_EQ(PlacementMovedVersion(moved), std::optional<uint64_t>(2)) << moved;
  EXPECT_EQ(PlacementMovedVersion(Read().status()), std::optional<uint64_t>(2));
  // A duplicate of push 1 (its reply lost before the move) is acknowledged,
  // not redirected: the client must not apply it again elsewhere.
  EXPECT_OK(Push(1));
  // The refused push 2 was not used up: its retry is redirected again...
  EXPECT_EQ(PlacementMovedVersion(Push(2)), std::optional<uint64_t>(2));

  gate_.Set(Placement::Jump(2, 3));  // ... and applied once the block is ours again.
  ASSERT_OK(Push(2));
  EXPECT_OK(Push(2));  // now a duplicate
  ASSERT_OK_AND_ASSIGN(w, Read());
  EXPECT_EQ(w, (std::vector<float>{2, 4}));
}

}  // namespace
}  // namespace pserver
