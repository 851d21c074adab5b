#include "server/byte_budget.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace dsv4::server {
namespace {

TEST(ByteBudget, LeasesFitTheLimitAndGiveBack) {
  ByteBudget budget(100);
  ByteBudget::Lease a = budget.take(60);
  ASSERT_TRUE(a);
  EXPECT_EQ(a.bytes(), 60u);
  EXPECT_FALSE(budget.take(41));  // 60 + 41 > 100: refused, nothing taken
  EXPECT_EQ(budget.used(), 60u);
  ByteBudget::Lease b = budget.take(40);
  ASSERT_TRUE(b);
  EXPECT_EQ(budget.used(), 100u);
  EXPECT_TRUE(budget.take(0));  // an empty body always fits
  EXPECT_FALSE(budget.take(101));
  a.reset();
  EXPECT_EQ(budget.used(), 40u);
  {
    ByteBudget::Lease moved = std::move(b);
    EXPECT_FALSE(b);  // NOLINT(bugprone-use-after-move): a moved-from lease holds nothing
    EXPECT_EQ(budget.used(), 40u);
    b = budget.take(10);  // assigning over an empty lease
    EXPECT_EQ(budget.used(), 50u);
  }
  EXPECT_EQ(budget.used(), 10u);
  b = ByteBudget::Lease();  // assigning gives the old bytes back
  EXPECT_EQ(budget.used(), 0u);
  EXPECT_FALSE(budget.take(static_cast<std::size_t>(-1)));  // no overflow in the fit check
}

TEST(ByteBudget, ConcurrentTakersNeverExceedTheLimit) {
  ByteBudget budget(1000);
  std::atomic<bool> over{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&budget, &over, t] {
      for (int i = 0; i < 20000; ++i) {
        ByteBudget::Lease lease = budget.take(static_cast<std::size_t>(1 + (i * 7 + t) % 400));
        if (budget.used() > budget.limit()) over = true;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_FALSE(over.load());
  EXPECT_EQ(budget.used(), 0u);
}

}  // namespace
}  // namespace dsv4::server
