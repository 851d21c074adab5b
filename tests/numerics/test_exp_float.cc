// exp_float against the exponential in double precision: within 2 ulp everywhere it is finite
// and normal, the special values as expf, and one rounding per operation (the same bits on the
// GPU, which tests/cuda/test_gpu_ops.cc checks there).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "numerics/exp_float.h"

namespace dsv4 {
namespace {

// Distance in ulps between two positive finite floats.
std::int64_t ulps(float a, float b) {
  return std::llabs(static_cast<std::int64_t>(std::bit_cast<std::uint32_t>(a)) -
                    static_cast<std::int64_t>(std::bit_cast<std::uint32_t>(b)));
}

TEST(ExpFloat, WithinTwoUlpOfTheTrueValue) {
  std::int64_t worst = 0, total = 0, exact = 0;
  float worst_x = 0;
  // Every 97th float of [-87, 88] (normal results), both signs.
  for (std::uint32_t u = 0; u < 0x42b00000u; u += 97) {
    for (float x : {std::bit_cast<float>(u), -std::bit_cast<float>(u)}) {
      if (x < -87.0f) continue;
      const float want = static_cast<float>(std::exp(static_cast<double>(x)));
      const float got = exp_float(x);
      const std::int64_t d = ulps(got, want);
      if (d > worst) {
        worst = d;
        worst_x = x;
      }
      exact += d == 0;
      ++total;
    }
  }
  EXPECT_LE(worst, 2) << "at x = " << worst_x;
  EXPECT_GT(static_cast<double>(exact) / static_cast<double>(total), 0.9);
}

TEST(ExpFloat, SpecialValuesAndRanges) {
  EXPECT_EQ(exp_float(0.0f), 1.0f);
  EXPECT_EQ(exp_float(-0.0f), 1.0f);
  EXPECT_EQ(exp_float(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(exp_float(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(exp_float(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(exp_float(89.0f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(exp_float(-105.0f), 0.0f);
  EXPECT_LE(ulps(exp_float(88.72f), static_cast<float>(std::exp(static_cast<double>(88.72f)))), 2);
  // Subnormal results are the exact scaling of a float, rounded once.
  const float tiny = exp_float(-100.0f);
  EXPECT_GT(tiny, 0.0f);
  EXPECT_NEAR(tiny / static_cast<float>(std::exp(-100.0)), 1.0f, 1e-3f);
}

}  // namespace
}  // namespace dsv4
