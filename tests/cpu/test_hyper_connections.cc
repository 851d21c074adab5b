// Hyper-connections (SPEC.md 3.1): Sinkhorn against a straightforward double implementation of the
// same iteration, doubly-stochastic after 20 iterations, hc_pre / hc_post / hc_head against
// double-precision formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "cpu/hyper_connections.h"
#include "cpu_test_util.h"

namespace dsv4 {
namespace {

using Mat = std::vector<std::vector<double>>;

double sigmoid_d(double z) { return 1.0 / (1.0 + std::exp(-z)); }

// SPEC 3.1 step 3 in double.
Mat sinkhorn_d(const std::vector<float>& mixes, const std::vector<float>& scale, const std::vector<float>& base, int hc,
               int iters, double eps) {
  Mat c(hc, std::vector<double>(hc));
  for (int i = 0; i < hc; ++i) {
    double mx = -1e300;
    for (int j = 0; j < hc; ++j) {
      c[i][j] = static_cast<double>(mixes[2 * hc + i * hc + j]) * scale[2] + base[2 * hc + i * hc + j];
      mx = std::max(mx, c[i][j]);
    }
    double s = 0;
    for (int j = 0; j < hc; ++j) s += std::exp(c[i][j] - mx);
    for (int j = 0; j < hc; ++j) c[i][j] = std::exp(c[i][j] - mx) / s + eps;
  }
  const auto cols = [&] {
    for (int j = 0; j < hc; ++j) {
      double s = 0;
      for (int i = 0; i < hc; ++i) s += c[i][j];
      for (int i = 0; i < hc; ++i) c[i][j] /= s + eps;
    }
  };
  cols();
  for (int it = 1; it < iters; ++it) {
    for (int i = 0; i < hc; ++i) {
      double s = 0;
      for (int j = 0; j < hc; ++j) s += c[i][j];
      for (int j = 0; j < hc; ++j) c[i][j] /= s + eps;
    }
    cols();
  }
  return c;
}

struct HcFixture {
  HcParams p;
  std::vector<float> h, fn, scale, base;
  explicit HcFixture(unsigned seed) {
    std::mt19937 rng(seed);
    p.hc = 4;
    p.dim = 96;
    p.sinkhorn_iters = 20;
    h = test::random_bf16(rng, static_cast<std::size_t>(p.hc * p.dim), -2.0f, 2.0f);
    fn = test::random_floats(rng, static_cast<std::size_t>((2 + p.hc) * p.hc * p.hc * p.dim), -0.2f, 0.2f);
    scale = test::random_floats(rng, 3, 0.5f, 2.0f);
    base = test::random_floats(rng, static_cast<std::size_t>((2 + p.hc) * p.hc), -1.0f, 1.0f);
  }
  std::vector<double> mixes_d() const {
    const std::int64_t n = p.hc * p.dim;
    double ms = 0;
    for (float v : h) ms += static_cast<double>(v) * v;
    const double r = 1.0 / std::sqrt(ms / n + p.norm_eps);
    std::vector<double> m(static_cast<std::size_t>((2 + p.hc) * p.hc));
    for (std::size_t k = 0; k < m.size(); ++k) m[k] = test::dot_d(h.data(), fn.data() + k * n, n) * r;
    return m;
  }
};

TEST(HyperConnections, SinkhornMatchesDoubleAndIsDoublyStochastic) {
  std::mt19937 rng(41);
  HcParams p;
  p.hc = 4;
  for (int trial = 0; trial < 20; ++trial) {
    // Logits of a few units (a peaked softmax converges slowly: 20 iterations then leave the rows
    // further from 1).
    const std::vector<float> mixes = test::random_floats(rng, 24, -1.5f, 1.5f);
    const std::vector<float> scale = test::random_floats(rng, 3, 0.5f, 1.0f);
    const std::vector<float> base = test::random_floats(rng, 24, -1.0f, 1.0f);
    for (int iters : {1, 2, 20}) {
      p.sinkhorn_iters = iters;
      std::vector<float> pre(4), post(4), comb(16);
      hc_split_sinkhorn(mixes, scale, base, p, pre, post, comb);
      const Mat ref = sinkhorn_d(mixes, scale, base, 4, iters, 1e-6);
      for (int i = 0; i < 4; ++i) {
        EXPECT_NEAR(pre[static_cast<std::size_t>(i)],
                    sigmoid_d(static_cast<double>(mixes[static_cast<std::size_t>(i)]) * scale[0] +
                              base[static_cast<std::size_t>(i)]) +
                        1e-6,
                    1e-6);
        EXPECT_NEAR(post[static_cast<std::size_t>(i)],
                    2 * sigmoid_d(static_cast<double>(mixes[static_cast<std::size_t>(4 + i)]) * scale[1] +
                                  base[static_cast<std::size_t>(4 + i)]),
                    1e-6);
        for (int j = 0; j < 4; ++j) ASSERT_NEAR(comb[static_cast<std::size_t>(i * 4 + j)], ref[i][j], 1e-6) << iters;
      }
      if (iters == 20) {
        for (int k = 0; k < 4; ++k) {
          double row = 0, col = 0;
          for (int m = 0; m < 4; ++m) {
            row += comb[static_cast<std::size_t>(k * 4 + m)];
            col += comb[static_cast<std::size_t>(m * 4 + k)];
          }
          EXPECT_NEAR(col, 1.0, 1e-5);
          EXPECT_NEAR(row, 1.0, 1e-3);
        }
      }
    }
  }
}

TEST(HyperConnections, SinkhornStepOrder) {
  // With one iteration the columns are normalized last (sum 1 - eps-ish) but the rows are not.
  HcParams p;
  p.hc = 4;
  p.sinkhorn_iters = 1;
  std::vector<float> mixes(24, 0.0f), scale = {1.0f, 1.0f, 1.0f}, base(24, 0.0f);
  for (int j = 0; j < 4; ++j) base[static_cast<std::size_t>(8 + j)] = 3.0f;  // row 0 large everywhere
  base[8 + 4 * 1 + 0] = 2.0f;
  std::vector<float> pre(4), post(4), comb(16);
  hc_split_sinkhorn(mixes, scale, base, p, pre, post, comb);
  double col0 = 0, row1 = 0;
  for (int i = 0; i < 4; ++i) {
    col0 += comb[static_cast<std::size_t>(i * 4)];
    row1 += comb[static_cast<std::size_t>(4 + i)];
  }
  EXPECT_NEAR(col0, 1.0, 1e-5);
  EXPECT_GT(std::fabs(row1 - 1.0), 0.05);
  EXPECT_EQ(pre[0], 0.5f + 1e-6f);
  EXPECT_EQ(post[0], 1.0f);
}

TEST(HyperConnections, PrePostHeadAgainstDouble) {
  HcFixture f(42);
  const HcParams& p = f.p;
  const std::vector<double> md = f.mixes_d();
  std::vector<float> mixes(24);
  hc_mixes(f.h, f.fn, p, mixes);
  for (std::size_t k = 0; k < 24; ++k) EXPECT_NEAR(mixes[k], md[k], 1e-5 * (1 + std::fabs(md[k])));

  std::vector<float> y(static_cast<std::size_t>(p.dim)), post(4), comb(16);
  hc_pre(f.h, f.fn, f.scale, f.base, p, y, post, comb);
  std::vector<float> pre(4), post2(4), comb2(16);
  hc_split_sinkhorn(mixes, f.scale, f.base, p, pre, post2, comb2);
  EXPECT_EQ(post, post2);
  EXPECT_EQ(comb, comb2);
  for (std::int64_t k = 0; k < p.dim; ++k) {
    double ref = 0, mag = 0;
    for (int i = 0; i < 4; ++i) {
      const double term =
          static_cast<double>(pre[static_cast<std::size_t>(i)]) * f.h[static_cast<std::size_t>(i * p.dim + k)];
      ref += term;
      mag += std::fabs(term);
    }
    ASSERT_EQ(round_to_bf16(y[static_cast<std::size_t>(k)]), y[static_cast<std::size_t>(k)]);
    ASSERT_TRUE(test::bf16_near(y[static_cast<std::size_t>(k)], ref, mag)) << k;
  }

  std::mt19937 rng(43);
  const std::vector<float> out = test::random_bf16(rng, static_cast<std::size_t>(p.dim), -2.0f, 2.0f);
  std::vector<float> h_new(f.h.size());
  hc_post(out, f.h, post, comb, p, h_new);
  for (int j = 0; j < 4; ++j) {
    for (std::int64_t k = 0; k < p.dim; ++k) {
      double ref = static_cast<double>(post[static_cast<std::size_t>(j)]) * out[static_cast<std::size_t>(k)];
      double mag = std::fabs(ref);
      for (int i = 0; i < 4; ++i) {
        const double term = static_cast<double>(comb[static_cast<std::size_t>(i * 4 + j)]) *
                            f.h[static_cast<std::size_t>(i * p.dim + k)];
        ref += term;
        mag += std::fabs(term);
      }
      const float got = h_new[static_cast<std::size_t>(j * p.dim + k)];
      ASSERT_EQ(round_to_bf16(got), got);
      ASSERT_TRUE(test::bf16_near(got, ref, mag)) << j << " " << k;
    }
  }

  // Head: pre only, with one scale.
  std::vector<float> head_fn(f.fn.begin(), f.fn.begin() + 4 * 4 * p.dim);
  const std::vector<float> head_scale = {0.7f}, head_base = {0.1f, -0.2f, 0.3f, 0.0f};
  std::vector<float> yh(static_cast<std::size_t>(p.dim));
  hc_head(f.h, head_fn, head_scale, head_base, p, yh);
  for (std::int64_t k = 0; k < p.dim; ++k) {
    double ref = 0, mag = 0;
    for (int i = 0; i < 4; ++i) {
      const double w =
          sigmoid_d(md[static_cast<std::size_t>(i)] * 0.7f + head_base[static_cast<std::size_t>(i)]) + 1e-6;
      ref += w * f.h[static_cast<std::size_t>(i * p.dim + k)];
      mag += std::fabs(w * f.h[static_cast<std::size_t>(i * p.dim + k)]);
    }
    ASSERT_TRUE(test::bf16_near(yh[static_cast<std::size_t>(k)], ref, mag)) << k;
  }
  EXPECT_THROW(hc_head(f.h, head_fn, f.scale, head_base, p, yh), std::invalid_argument);  // scale has 3 values
  EXPECT_THROW(hc_post(out, f.h, post, comb, p, std::span<float>(h_new).first(10)), std::invalid_argument);
}

}  // namespace
}  // namespace dsv4
