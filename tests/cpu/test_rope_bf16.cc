// rope_heads_bf16 (SPEC.md 3.7, 5a): fp32 rotation of the last rope dims of each head via
// RopeTable, stored as bf16; other dims untouched; inverse undoes it up to bf16 rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cpu/rope_bf16.h"
#include "cpu_test_util.h"

namespace dsv4 {
namespace {

TEST(RopeBf16, RotatesTheLastDimsOfEachHeadAndRounds) {
  std::mt19937 rng(91);
  RopeParams rp;
  rp.base = 10000;
  const RopeTable rope(rp);
  const std::int64_t heads = 3, hd = 128;
  const std::vector<float> x0 = test::random_bf16(rng, static_cast<std::size_t>(heads * hd), -2.0f, 2.0f);
  std::vector<float> x = x0;
  rope_heads_bf16(x, hd, rope, 1234);
  std::vector<float> cs(32), sn(32);
  for (std::int64_t h = 0; h < heads; ++h) {
    for (std::int64_t k = 0; k < 64; ++k)
      EXPECT_EQ(x[static_cast<std::size_t>(h * hd + k)], x0[static_cast<std::size_t>(h * hd + k)]);
    for (std::int64_t i = 0; i < 32; ++i) {
      // Double-precision rotation by 1234 * base^(-2i/64).
      const double ang = 1234.0 * std::pow(10000.0, -2.0 * static_cast<double>(i) / 64.0);
      const double a = x0[static_cast<std::size_t>(h * hd + 64 + 2 * i)],
                   b = x0[static_cast<std::size_t>(h * hd + 64 + 2 * i + 1)];
      const double re = a * std::cos(ang) - b * std::sin(ang), im = a * std::sin(ang) + b * std::cos(ang);
      const float gr = x[static_cast<std::size_t>(h * hd + 64 + 2 * i)],
                  gi = x[static_cast<std::size_t>(h * hd + 64 + 2 * i + 1)];
      EXPECT_EQ(round_to_bf16(gr), gr);
      EXPECT_EQ(round_to_bf16(gi), gi);
      // fp32 angle rounding at position 1234 (~1e-4 rad) plus one bf16 ulp.
      EXPECT_NEAR(gr, re, test::bf16_ulp(re) + 1e-3 * (std::fabs(a) + std::fabs(b))) << h << " " << i;
      EXPECT_NEAR(gi, im, test::bf16_ulp(im) + 1e-3 * (std::fabs(a) + std::fabs(b))) << h << " " << i;
    }
  }
  // Exactly RopeTable's fp32 result rounded.
  std::vector<float> y = x0;
  rope.apply_heads(y, hd, 1234);
  for (std::size_t k = 0; k < y.size(); ++k) EXPECT_EQ(x[k], round_to_bf16(y[k]));
  // Inverse: back to the input within bf16 rounding.
  rope_heads_bf16(x, hd, rope, 1234, /*inverse=*/true);
  for (std::size_t k = 0; k < x.size(); ++k) EXPECT_NEAR(x[k], x0[k], 2 * test::bf16_ulp(2.0));
  EXPECT_THROW(rope_heads_bf16(x, 100, rope, 0), std::invalid_argument);
}

}  // namespace
}  // namespace dsv4
