// RoPE tables (plain and YaRN) and the interleaved-pair rotation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>
#include <stdexcept>
#include <vector>

#include "numerics/rope.h"

namespace dsv4 {
namespace {

RopeParams yarn_params() {
  RopeParams p;
  p.rope_dim = 64;
  p.base = 160000.0;
  p.yarn = true;
  p.factor = 16.0;
  p.original_max_position = 65536.0;
  p.beta_fast = 32.0;
  p.beta_slow = 1.0;
  return p;
}

std::vector<float> random_vector(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

// ---------------------------------------------------------------- tables

TEST(RopeTable, PlainBase10000) {
  RopeParams p;  // rope_dim 64, base 10000, no YaRN
  const RopeTable t(p);
  ASSERT_EQ(t.rope_dim(), 64);
  ASSERT_EQ(t.inv_freq().size(), 32u);
  // Goldens computed with Python, emulating the fp32 ops: 1 / fp32(10000 ** (2i/64)).
  EXPECT_FLOAT_EQ(t.inv_freq()[0], 1.0f);
  EXPECT_FLOAT_EQ(t.inv_freq()[1], 0x1.7ff222p-1f);   // 0.7498942017555237
  EXPECT_FLOAT_EQ(t.inv_freq()[5], 0x1.e5a846p-3f);   // 0.23713736236095428
  EXPECT_FLOAT_EQ(t.inv_freq()[16], 0x1.47ae14p-7f);  // 0.009999999776482582 (= 1/100)
  EXPECT_FLOAT_EQ(t.inv_freq()[31], 0x1.17a8e4p-13f); // 0.0001333521504420787
  for (std::size_t i = 0; i < 32; ++i) {
    EXPECT_NEAR(t.inv_freq()[i], std::pow(10000.0, -static_cast<double>(i) / 32), 1e-7 * t.inv_freq()[i] + 1e-12);
  }
}

TEST(RopeTable, YarnCorrectionRange) {
  // corr(32) = 64 ln(65536 / (64 pi)) / (2 ln 160000) = 15.4533 -> low = 15;
  // corr(1)  = 64 ln(65536 / (2 pi))  / (2 ln 160000) = 24.7084 -> high = 25.
  const YarnRange r = yarn_correction_range(yarn_params());
  EXPECT_EQ(r.low, 15);
  EXPECT_EQ(r.high, 25);
  // Base 10000 with the same L0: corr(32) = 20.105 -> 20, corr(1) = 32.146 -> 33.
  RopeParams p = yarn_params();
  p.base = 10000.0;
  const YarnRange r2 = yarn_correction_range(p);
  EXPECT_EQ(r2.low, 20);
  EXPECT_EQ(r2.high, 33);
  // Clamping: a tiny L0 pushes corr(32) below 0; a huge one pushes corr(1) above 63.
  p.original_max_position = 10.0;
  EXPECT_EQ(yarn_correction_range(p).low, 0);
  p.original_max_position = 1e30;
  EXPECT_EQ(yarn_correction_range(p).high, 63);
}

TEST(RopeTable, YarnInvFreq) {
  const RopeTable t(yarn_params());
  const RopeTable plain([] {
    RopeParams p = yarn_params();
    p.yarn = false;
    return p;
  }());
  const auto f = t.inv_freq();
  const auto g = plain.inv_freq();
  // Goldens from Python (fp32 emulation of the reference's operation order).
  // Below low (ramp 0): unchanged.
  EXPECT_FLOAT_EQ(f[0], 1.0f);
  EXPECT_FLOAT_EQ(f[3], 0x1.4cfa02p-2f);   // 0.32517245411872864
  EXPECT_FLOAT_EQ(f[15], 0x1.dc846ep-9f);  // 0.0036355385091155767
  // Between (ramp (i - 15) / 10): freq * (ramp / 16 + 1 - ramp).
  EXPECT_FLOAT_EQ(f[16], 0x1.28f5c2p-9f);   // 0.0022656249348074198 (ratio 0.90625)
  EXPECT_FLOAT_EQ(f[20], 0x1.37675ep-12f);  // 0.0002969777851831168 (ratio 0.53125)
  EXPECT_FLOAT_EQ(f[22], 0x1.7d209ap-14f);  // 9.08678412088193e-05 (ratio 0.34375)
  EXPECT_FLOAT_EQ(f[24], 0x1.47ae18p-16f);  // 1.953125320142135e-05 (ratio 0.15625)
  // From high on (ramp 1): divided by the factor.
  EXPECT_FLOAT_EQ(f[25], 0x1.6887ap-18f);   // 5.372312443796545e-06
  EXPECT_FLOAT_EQ(f[31], 0x1.30f89ap-21f);  // 5.680529397977807e-07
  for (std::size_t i = 0; i < 32; ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - 15.0) / 10.0, 0.0, 1.0);
    const double expect = std::pow(160000.0, -static_cast<double>(i) / 32) * (ramp / 16 + (1 - ramp));
    EXPECT_NEAR(f[i], expect, 4e-7 * expect) << i;
    EXPECT_NEAR(f[i] / g[i], ramp / 16 + (1 - ramp), 1e-6) << i;
  }
}

TEST(RopeTable, YarnEqualLowHighUsesOffset) {
  // rope_dim 4, base 10000, L0 = pi: corr(1) = 4 ln(1/2) / (2 ln 1e4) = -0.15 -> ceil 0, and
  // corr(32) < 0 -> low 0. So low == high == 0 and the reference's ramp uses high + 0.001:
  // ramp_0 = 0 / 0.001 = 0 (a 0/0 would give NaN), ramp_1 = 1 / 0.001 -> clamped to 1.
  RopeParams p;
  p.rope_dim = 4;
  p.base = 10000.0;
  p.yarn = true;
  p.factor = 4.0;
  p.original_max_position = std::numbers::pi;
  const YarnRange r = yarn_correction_range(p);
  ASSERT_EQ(r.low, 0);
  ASSERT_EQ(r.high, 0);
  const RopeTable t(p);
  EXPECT_EQ(t.inv_freq()[0], 1.0f);
  EXPECT_FLOAT_EQ(t.inv_freq()[1], 0.01f / 4);
}

TEST(RopeTable, RejectsBadParams) {
  RopeParams p;
  p.rope_dim = 63;
  EXPECT_THROW(RopeTable{p}, std::invalid_argument);
  p.rope_dim = 0;
  EXPECT_THROW(RopeTable{p}, std::invalid_argument);
  p = RopeParams{};
  p.base = 1.0;
  EXPECT_THROW(RopeTable{p}, std::invalid_argument);
  p = yarn_params();
  p.original_max_position = 0;
  EXPECT_THROW(RopeTable{p}, std::invalid_argument);
  EXPECT_THROW(yarn_correction_range(p), std::invalid_argument);
  p = yarn_params();
  p.factor = 0;
  EXPECT_THROW(RopeTable{p}, std::invalid_argument);
}

// ---------------------------------------------------------------- rotation

TEST(RopeApply, PositionZeroIsIdentity) {
  for (const RopeParams& p : {RopeParams{}, yarn_params()}) {
    const RopeTable t(p);
    const std::vector<float> x = random_vector(64, 1);
    std::vector<float> y = x;
    t.apply(y, 0);
    EXPECT_EQ(y, x);
    t.apply(y, 0, /*inverse=*/true);
    EXPECT_EQ(y, x);
  }
}

// Independent formula: angle = fp32(pos) * inv_freq[i] in fp32 (as the reference), then cos/sin
// and the rotation of (x[2i], x[2i+1]) in double.
std::vector<double> rotate_reference(const std::vector<float>& x, std::span<const float> inv_freq,
                                     std::int64_t pos, bool inverse) {
  std::vector<double> y(x.size());
  for (std::size_t i = 0; i < x.size() / 2; ++i) {
    const float angle = static_cast<float>(pos) * inv_freq[i];
    const double c = std::cos(static_cast<double>(angle));
    const double s = (inverse ? -1.0 : 1.0) * std::sin(static_cast<double>(angle));
    y[2 * i] = x[2 * i] * c - x[2 * i + 1] * s;
    y[2 * i + 1] = x[2 * i] * s + x[2 * i + 1] * c;
  }
  return y;
}

TEST(RopeApply, MatchesIndependentFormula) {
  for (const RopeParams& p : {RopeParams{}, yarn_params()}) {
    const RopeTable t(p);
    for (std::int64_t pos : {std::int64_t{1}, std::int64_t{7}, std::int64_t{4095}, std::int64_t{65537},
                             std::int64_t{1000000}, std::int64_t{1000003}}) {
      for (bool inverse : {false, true}) {
        const std::vector<float> x = random_vector(64, static_cast<std::uint32_t>(pos));
        std::vector<float> y = x;
        t.apply(y, pos, inverse);
        const std::vector<double> expect = rotate_reference(x, t.inv_freq(), pos, inverse);
        for (std::size_t i = 0; i < 64; ++i) {
          EXPECT_NEAR(y[i], expect[i], 2e-6 * (std::fabs(x[i & ~std::size_t{1}]) + std::fabs(x[i | 1])) + 1e-7)
              << "pos " << pos << " dim " << i << " inverse " << inverse;
        }
      }
    }
  }
}

TEST(RopeApply, SmallPositionMatchesExactAngles) {
  // At small positions the fp32 angle is accurate: compare with angles in double.
  const RopeTable t(RopeParams{});
  const std::vector<float> x = random_vector(64, 3);
  std::vector<float> y = x;
  t.apply(y, 3);
  for (std::size_t i = 0; i < 32; ++i) {
    const double theta = 3.0 * std::pow(10000.0, -static_cast<double>(i) / 32);
    EXPECT_NEAR(y[2 * i], x[2 * i] * std::cos(theta) - x[2 * i + 1] * std::sin(theta), 1e-5) << i;
    EXPECT_NEAR(y[2 * i + 1], x[2 * i] * std::sin(theta) + x[2 * i + 1] * std::cos(theta), 1e-5) << i;
  }
  // Pair (0, 1) at position 1 rotates by exactly 1 radian: (1, 0) -> (cos 1, sin 1).
  std::vector<float> e(64, 0.0f);
  e[0] = 1.0f;
  t.apply(e, 1);
  EXPECT_FLOAT_EQ(e[0], static_cast<float>(std::cos(1.0)));
  EXPECT_FLOAT_EQ(e[1], static_cast<float>(std::sin(1.0)));
}

TEST(RopeApply, InverseUndoesForwardAndPairNormsKept) {
  for (const RopeParams& p : {RopeParams{}, yarn_params()}) {
    const RopeTable t(p);
    for (std::int64_t pos : {std::int64_t{1}, std::int64_t{123}, std::int64_t{99999}, std::int64_t{1000000}}) {
      const std::vector<float> x = random_vector(64, 17);
      std::vector<float> y = x;
      t.apply(y, pos);
      bool changed = false;
      for (std::size_t i = 0; i < 32; ++i) {
        const double n0 = std::hypot(x[2 * i], x[2 * i + 1]);
        const double n1 = std::hypot(y[2 * i], y[2 * i + 1]);
        EXPECT_NEAR(n1, n0, 1e-6 * n0 + 1e-7) << "pos " << pos << " pair " << i;
        changed |= y[2 * i] != x[2 * i];
      }
      EXPECT_TRUE(changed);
      t.apply(y, pos, /*inverse=*/true);
      for (std::size_t i = 0; i < 64; ++i) EXPECT_NEAR(y[i], x[i], 2e-6) << "pos " << pos << " dim " << i;
    }
  }
}

TEST(RopeApply, HeadsRotateTheirLastDims) {
  const RopeTable t(yarn_params());
  const std::size_t head_dim = 128, heads = 3;
  const std::vector<float> x = random_vector(head_dim * heads, 21);
  std::vector<float> y = x;
  t.apply_heads(y, head_dim, 777);
  for (std::size_t h = 0; h < heads; ++h) {
    for (std::size_t i = 0; i < head_dim - 64; ++i) EXPECT_EQ(y[h * head_dim + i], x[h * head_dim + i]);
    std::vector<float> slice(x.begin() + static_cast<std::ptrdiff_t>(h * head_dim + 64),
                             x.begin() + static_cast<std::ptrdiff_t>((h + 1) * head_dim));
    t.apply(slice, 777);
    for (std::size_t i = 0; i < 64; ++i) EXPECT_EQ(y[h * head_dim + 64 + i], slice[i]);
  }
  EXPECT_THROW(t.apply_heads(y, 32, 1), std::invalid_argument);
  EXPECT_THROW(t.apply_heads(y, 100, 1), std::invalid_argument);
  std::vector<float> wrong(65);
  EXPECT_THROW(t.apply(wrong, 1), std::invalid_argument);
  std::vector<float> ok(64);
  EXPECT_THROW(t.apply(ok, -1), std::invalid_argument);
}

}  // namespace
}  // namespace dsv4
