#include "cc/core/memory_budget.h"

#include "gtest/gtest.h"

namespace pserver {
namespace {

TEST(MemoryBudgetTest, ReservesWithinTheLimitAndGivesBack) {
  MemoryBudget budget(100);
  EXPECT_TRUE(budget.TryReserve(60));
  EXPECT_FALSE(budget.TryReserve(41));  // 101: refused, nothing taken
  EXPECT_EQ(budget.used(), 60u);
  EXPECT_TRUE(budget.TryReserve(40));  // exactly the limit
  EXPECT_FALSE(budget.TryReserve(1));
  budget.Release(50);
  EXPECT_EQ(budget.used(), 50u);
  EXPECT_FALSE(budget.TryReserve(MemoryBudget::kUnlimited));  // no overflow
  budget.Settle(/*reserved=*/0, /*used=*/70);  // taken whole: past the limit
  EXPECT_EQ(budget.used(), 120u);
  EXPECT_FALSE(budget.TryReserve(1));
  budget.Settle(/*reserved=*/30, /*used=*/0);
  EXPECT_EQ(budget.used(), 90u);
  EXPECT_GT(PhysicalMemoryBytes(), 0u);
}

}  // namespace
}  // namespace pserver
