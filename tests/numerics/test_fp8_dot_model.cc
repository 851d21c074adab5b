// The FP8 tensor-core dot-product model (numerics/fp8_dot_model.h): each parameter changes the
// result where it should, on operands worked out by hand, and the widest setting is the exact sum.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "numerics/fp8_dot_model.h"
#include "numerics/fp8_e4m3.h"

namespace dsv4 {
namespace {

constexpr std::uint8_t kOne = 0x38;          // 1.0
constexpr std::uint8_t kMax = 0x7e;          // 448
constexpr std::uint8_t kTiny = 0x01;         // 2^-9, the smallest subnormal
constexpr std::uint8_t kEighth = 0x20;       // 0.125
constexpr std::uint8_t kSmallNormal = 0x08;  // 2^-6

// 32 values: `first` pairs in front, zeros after.
struct Operands {
  std::vector<std::uint8_t> a = std::vector<std::uint8_t>(32, 0), b = std::vector<std::uint8_t>(32, 0);
  void set(int i, std::uint8_t x, std::uint8_t y) {
    a[static_cast<std::size_t>(i)] = x;
    b[static_cast<std::size_t>(i)] = y;
  }
  float dot(const Fp8DotModel& m, float c = 0.0f) const { return fp8_dot(m, c, a, b); }
};

// Window 13, cut toward zero, field alignment, C joint, groups of 32, 13 result bits toward zero:
// the starting point each test changes one parameter of.
Fp8DotModel base() {
  return Fp8DotModel{13, false, true, Fp8DotModel::Accumulator::kJoint, 32, 13, Fp8DotModel::Rounding::kTowardZero};
}

Fp8DotModel exact() {
  Fp8DotModel m;
  m.window_bits = 40;
  m.result_bits = 23;
  m.result_rounding = Fp8DotModel::Rounding::kNearestEven;
  m.accumulator = Fp8DotModel::Accumulator::kAfterNearest;
  return m;
}

TEST(Fp8DotModel, SmallIntegersAreExactUnderEveryCandidate) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> pick(-8, 8);
  std::vector<std::uint8_t> a(32), b(32);
  int want = 0;
  for (int i = 0; i < 32; ++i) {
    const int x = pick(rng), y = pick(rng);
    a[static_cast<std::size_t>(i)] = f32_to_e4m3(static_cast<float>(x));
    b[static_cast<std::size_t>(i)] = f32_to_e4m3(static_cast<float>(y));
    want += x * y;
  }
  ASSERT_NE(want, 0);
  for (const Fp8DotModel& m : fp8_dot_candidates())
    ASSERT_EQ(fp8_dot(m, 0.0f, a, b), static_cast<float>(want)) << describe(m);
}

TEST(Fp8DotModel, WindowCutsProductsFarBelowTheLargest) {
  Operands o;
  o.set(0, kMax, kOne);   // 448
  o.set(1, kTiny, kOne);  // 2^-9
  EXPECT_EQ(o.dot(exact()), 448.0f + std::ldexp(1.0f, -9));
  EXPECT_EQ(o.dot(base()), 448.0f);  // 448's field top is 2^10: 13 bits keep down to 2^-3
  Fp8DotModel wide = base();
  wide.window_bits = 19;  // down to 2^-9
  wide.result_bits = 23;
  EXPECT_EQ(o.dot(wide), 448.0f + std::ldexp(1.0f, -9));
}

TEST(Fp8DotModel, FloorShiftsPullNegativeRemaindersDown) {
  Operands o;
  o.set(0, kMax, kOne);                                      // 448
  o.set(1, static_cast<std::uint8_t>(kTiny | 0x80u), kOne);  // -2^-9
  EXPECT_EQ(o.dot(base()), 448.0f);                          // cut toward zero: gone
  Fp8DotModel floor = base();
  floor.floor_shifts = true;
  EXPECT_EQ(o.dot(floor), 448.0f - 0.125f);  // one unit of 2^-3 below
}

TEST(Fp8DotModel, AlignmentOnTheFieldOrOnTheLeadingOne) {
  Operands o;
  o.set(0, kOne, kOne);      // 1.0: significand product 64 (leading one at 2^1), field top 2^2
  o.set(1, kTiny, kEighth);  // 2^-12
  Fp8DotModel m = base();
  EXPECT_EQ(o.dot(m), 1.0f);  // window 13 below 2^2 ends at 2^-11
  m.align_on_field = false;
  EXPECT_EQ(o.dot(m), 1.0f + std::ldexp(1.0f, -12));  // below 2^1 it ends at 2^-12
}

TEST(Fp8DotModel, AccumulatorJoinsTheCutOrIsAddedAfter) {
  Operands o;
  o.set(0, kTiny, kTiny);  // 2^-18
  const float c = 1.0f + std::ldexp(1.0f, -20);
  Fp8DotModel m = base();
  EXPECT_EQ(o.dot(m, c), 1.0f);  // C aligned with the products and cut to 13 bits
  m.accumulator = Fp8DotModel::Accumulator::kAfterNearest;
  EXPECT_EQ(o.dot(m, c), c + std::ldexp(1.0f, -18));  // C kept whole, the product added in fp32
  // The fp32 addition after the products, to nearest or toward zero: C = 2^24 + 2 (fp32 values
  // are 2 apart there) plus a product of 1.5.
  Operands p;
  p.set(0, f32_to_e4m3(1.5f), kOne);
  const float big = 16777218.0f;
  Fp8DotModel after = base();
  after.accumulator = Fp8DotModel::Accumulator::kAfterNearest;
  EXPECT_EQ(p.dot(after, big), 16777220.0f);  // 2^24 + 3.5 rounds to the nearest (+4)
  after.accumulator = Fp8DotModel::Accumulator::kAfterTowardZero;
  EXPECT_EQ(p.dot(after, big), 16777218.0f);  // toward zero (+2)
}

TEST(Fp8DotModel, GroupsChainThroughTheAccumulator) {
  std::vector<std::uint8_t> a(32, 0), b(32, 0);
  a[0] = kMax, b[0] = kOne;  // 448 in the first group of 16
  for (int i = 16; i < 20; ++i)
    a[static_cast<std::size_t>(i)] = kTiny, b[static_cast<std::size_t>(i)] = kOne;  // 4 x 2^-9 in the second
  Fp8DotModel m = base();
  m.accumulator = Fp8DotModel::Accumulator::kAfterNearest;
  m.result_bits = 23;
  EXPECT_EQ(fp8_dot(m, 0.0f, a, b), 448.0f);  // one sum of 32: the tiny products are cut
  m.group = 16;
  EXPECT_EQ(fp8_dot(m, 0.0f, a, b), 448.0f + std::ldexp(1.0f, -7));  // their own group keeps them
}

TEST(Fp8DotModel, ResultRounding) {
  Operands o;
  o.set(0, kOne, kOne);                                        // 1
  for (int i = 1; i <= 3; ++i) o.set(i, kTiny, kSmallNormal);  // 3 x 2^-15: 1 + 0.75 x 2^-13
  Fp8DotModel m = exact();
  m.accumulator = Fp8DotModel::Accumulator::kJoint;
  m.result_bits = 13;
  m.result_rounding = Fp8DotModel::Rounding::kTowardZero;
  EXPECT_EQ(o.dot(m), 1.0f);
  m.result_rounding = Fp8DotModel::Rounding::kNearestEven;
  EXPECT_EQ(o.dot(m), 1.0f + std::ldexp(1.0f, -13));
  // Floor differs from toward zero on negative sums only.
  for (int i = 0; i <= 3; ++i) o.a[static_cast<std::size_t>(i)] |= 0x80u;
  m.result_rounding = Fp8DotModel::Rounding::kFloor;
  EXPECT_EQ(o.dot(m), -1.0f - std::ldexp(1.0f, -13));
  m.result_rounding = Fp8DotModel::Rounding::kTowardZero;
  EXPECT_EQ(o.dot(m), -1.0f);
}

TEST(Fp8DotModel, WidestSettingIsTheExactSumRoundedOnce) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> code(0, 255);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<std::uint8_t> a(32), b(32);
    double sum = 0.0;  // exact: 32 products between 2^-18 and 2^18
    for (int i = 0; i < 32; ++i) {
      std::uint8_t x = 0, y = 0;
      do x = static_cast<std::uint8_t>(code(rng));
      while ((x & 0x7f) == 0x7f);
      do y = static_cast<std::uint8_t>(code(rng));
      while ((y & 0x7f) == 0x7f);
      a[static_cast<std::size_t>(i)] = x, b[static_cast<std::size_t>(i)] = y;
      sum += static_cast<double>(e4m3_to_f32(x)) * e4m3_to_f32(y);
    }
    ASSERT_EQ(fp8_dot(exact(), 0.0f, a, b), static_cast<float>(sum)) << "trial " << trial;
  }
}

TEST(Fp8DotModel, NanCodesBadSizesAndTheCandidateList) {
  Operands o;
  o.set(3, 0x7f, kOne);
  EXPECT_TRUE(std::isnan(o.dot(base())));
  const std::vector<std::uint8_t> a(24, kOne), b(24, kOne);
  EXPECT_THROW(fp8_dot(base(), 0.0f, a, b), std::invalid_argument);  // 24 is no multiple of 32
  const auto all = fp8_dot_candidates();
  EXPECT_NE(std::find(all.begin(), all.end(), kHopperFp8Dot), all.end());
  EXPECT_EQ(describe(base()),
            "window 13, cut toward zero, field alignment, C joint, groups of 32, result 13 bits toward zero");
  EXPECT_EQ(describe(kHopperFp8Dot),
            "window 14, cut floor, field alignment, C joint, groups of 32, result 13 bits toward zero");
}

TEST(Fp8DotModel, MismatchesAreCountedAndStopEarly) {
  Operands o;
  o.set(0, kMax, kOne);
  o.set(1, kTiny, kOne);
  std::vector<Fp8DotCase> cases(5, Fp8DotCase{0.0f, o.a.data(), o.b.data(), 32, 448.0f});
  cases[1].d = cases[3].d = 448.0f + std::ldexp(1.0f, -9);
  cases[4].d = 0.0f;  // wrong for both models
  EXPECT_EQ(fp8_dot_mismatches(base(), cases, 100), 3);
  EXPECT_EQ(fp8_dot_mismatches(base(), cases, 2), 2);
  EXPECT_EQ(fp8_dot_mismatches(exact(), cases, 100), 3);
}

}  // namespace
}  // namespace dsv4
