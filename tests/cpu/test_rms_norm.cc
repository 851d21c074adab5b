// RMSNorm (fp32 from bf16, times weight, bf16) and the weightless per-head q norm in bf16
// arithmetic (SPEC.md 3.2 step 1, 5a).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "cpu/rms_norm.h"
#include "cpu_test_util.h"

namespace dsv4 {
namespace {

TEST(RmsNorm, MatchesDoubleFormulaRowByRow) {
  std::mt19937 rng(31);
  const std::int64_t rows = 6, n = 320;
  const std::vector<float> x = test::random_bf16(rng, static_cast<std::size_t>(rows * n), -3.0f, 3.0f);
  const std::vector<float> w = test::random_bf16(rng, static_cast<std::size_t>(n), 0.5f, 1.5f);
  const float eps = 1e-6f;
  std::vector<float> y(x.size());
  rms_norm(x, rows, w, eps, y);
  for (std::int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (std::int64_t k = 0; k < n; ++k)
      ms += static_cast<double>(x[static_cast<std::size_t>(r * n + k)]) * x[static_cast<std::size_t>(r * n + k)];
    ms /= n;
    const double inv = 1.0 / std::sqrt(ms + eps);
    for (std::int64_t k = 0; k < n; ++k) {
      const double ref = w[static_cast<std::size_t>(k)] * x[static_cast<std::size_t>(r * n + k)] * inv;
      const float got = y[static_cast<std::size_t>(r * n + k)];
      ASSERT_EQ(round_to_bf16(got), got);
      ASSERT_LE(std::fabs(got - ref), test::bf16_ulp(ref)) << r << " " << k;
    }
    // One row alone gives the same bits; in place too.
    std::vector<float> single(x.begin() + r * n, x.begin() + (r + 1) * n);
    rms_norm(single, 1, w, eps, single);
    for (std::int64_t k = 0; k < n; ++k)
      ASSERT_EQ(single[static_cast<std::size_t>(k)], y[static_cast<std::size_t>(r * n + k)]);
  }
  // eps matters for tiny inputs: x = 1e-3 everywhere, eps 1e-6 -> 1e-3 / sqrt(2e-6).
  std::vector<float> tiny(8, round_to_bf16(1e-3f)), ones(8, 1.0f), out(8);
  rms_norm(tiny, 1, ones, 1e-6f, out);
  const double t = round_to_bf16(1e-3f);
  EXPECT_LE(std::fabs(out[0] - t / std::sqrt(t * t + 1e-6)), test::bf16_ulp(0.7));
  EXPECT_THROW(rms_norm(x, rows, std::vector<float>(n - 1), eps, y), std::invalid_argument);
}

TEST(RmsNorm, HeadNormInBf16Arithmetic) {
  std::mt19937 rng(32);
  const std::int64_t heads = 4, d = 512;
  std::vector<float> q = test::random_bf16(rng, static_cast<std::size_t>(heads * d), -4.0f, 4.0f);
  const std::vector<float> q0 = q;
  const float eps = 1e-6f;
  head_rms_norm_bf16(q, d, eps);
  for (std::int64_t h = 0; h < heads; ++h) {
    const float* in = q0.data() + h * d;
    // Step by step: each elementwise result rounded to bf16; the mean's sum in fp32.
    float sum = 0.0f;
    double ms = 0.0;
    for (std::int64_t k = 0; k < d; ++k) {
      sum += round_to_bf16(in[k] * in[k]);
      ms += static_cast<double>(in[k]) * in[k];
    }
    const float r = round_to_bf16(1.0f / std::sqrt(round_to_bf16(round_to_bf16(sum / d) + eps)));
    const double r_exact = 1.0 / std::sqrt(ms / d + eps);
    int differs_from_fp32 = 0;
    for (std::int64_t k = 0; k < d; ++k) {
      const float got = q[static_cast<std::size_t>(h * d + k)];
      ASSERT_EQ(got, round_to_bf16(in[k] * r)) << h << " " << k;
      ASSERT_NEAR(got, in[k] * r_exact, 3 * test::bf16_ulp(in[k] * r_exact));
      differs_from_fp32 += got != round_to_bf16(static_cast<float>(in[k] * r_exact));
    }
    // The bf16 rounding of the rsqrt is visible against an fp32 norm.
    EXPECT_GT(differs_from_fp32, 0) << h;
  }
  EXPECT_THROW(head_rms_norm_bf16(q, 500, eps), std::invalid_argument);
}

}  // namespace
}  // namespace dsv4
