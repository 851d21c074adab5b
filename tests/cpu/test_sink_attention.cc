// Sink attention of one query (SPEC.md 3.2 step 4, 5, 5a): against a double-precision softmax with
// the sink in the denominator, the bf16 rounding of the probabilities, key order / duplicates,
// pointer vs contiguous keys, threads.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "common/thread_pool.h"
#include "cpu/sink_attention.h"
#include "cpu_test_util.h"
#include "numerics/exp_float.h"

namespace dsv4 {
namespace {

// o_h = sum_i e^{s_i - m} v_i / (sum_i e^{s_i - m} + e^{sink - m}) in double; also the scale
// sum_i p_i |v_i| / den of the bf16-probability error per channel.
void reference(const std::vector<float>& q, std::int64_t heads, std::int64_t d, const std::vector<float>& kv,
               const std::vector<float>& sink, double scale, std::vector<double>& out, std::vector<double>& mag) {
  const std::size_t n = kv.size() / static_cast<std::size_t>(d);
  out.assign(q.size(), 0.0);
  mag.assign(q.size(), 0.0);
  for (std::int64_t h = 0; h < heads; ++h) {
    std::vector<double> s(n);
    double m = -1e300;
    for (std::size_t i = 0; i < n; ++i) {
      s[i] = test::dot_d(q.data() + h * d, kv.data() + i * static_cast<std::size_t>(d), d) * scale;
      m = std::max(m, s[i]);
    }
    double den = std::exp(static_cast<double>(sink[static_cast<std::size_t>(h)]) - m);
    for (std::size_t i = 0; i < n; ++i) den += std::exp(s[i] - m);
    for (std::size_t i = 0; i < n; ++i) {
      const double p = std::exp(s[i] - m) / den;
      for (std::int64_t c = 0; c < d; ++c) {
        out[static_cast<std::size_t>(h * d + c)] +=
            p * kv[i * static_cast<std::size_t>(d) + static_cast<std::size_t>(c)];
        mag[static_cast<std::size_t>(h * d + c)] +=
            p * std::fabs(kv[i * static_cast<std::size_t>(d) + static_cast<std::size_t>(c)]);
      }
    }
  }
}

TEST(SinkAttention, MatchesDoubleSoftmaxWithSink) {
  std::mt19937 rng(51);
  const std::int64_t heads = 4, d = 128, n_keys = 37;
  const std::vector<float> q = test::random_bf16(rng, static_cast<std::size_t>(heads * d), -2.0f, 2.0f);
  const std::vector<float> kv = test::random_bf16(rng, static_cast<std::size_t>(n_keys * d), -2.0f, 2.0f);
  const std::vector<float> sink = {-1.0f, 0.5f, 2.0f, 6.0f};
  const float scale = attention_softmax_scale(d);
  EXPECT_EQ(scale, static_cast<float>(1.0 / std::sqrt(128.0)));
  std::vector<float> o(q.size());
  sink_attention(q, heads, d, kv, sink, scale, o);
  std::vector<double> ref, mag;
  reference(q, heads, d, kv, sink, scale, ref, mag);
  for (std::size_t i = 0; i < o.size(); ++i) {
    ASSERT_EQ(round_to_bf16(o[i]), o[i]);
    // bf16 probabilities: relative 2^-9 per term; bf16 output: one ulp.
    ASSERT_LE(std::fabs(o[i] - ref[i]), test::bf16_ulp(ref[i]) + std::ldexp(mag[i], -8) + 1e-6) << i;
  }
  // The sink shrinks the output: head 3 (sink 6) against the same head without a sink.
  std::vector<float> no_sink(sink.size(), -1e30f), o2(q.size());
  sink_attention(q, heads, d, kv, no_sink, scale, o2);
  reference(q, heads, d, kv, no_sink, scale, ref, mag);
  double norm_with = 0, norm_without = 0;
  for (std::int64_t c = 0; c < d; ++c) {
    norm_with += std::fabs(o[static_cast<std::size_t>(3 * d + c)]);
    norm_without += std::fabs(o2[static_cast<std::size_t>(3 * d + c)]);
    ASSERT_LE(std::fabs(o2[static_cast<std::size_t>(3 * d + c)] - ref[static_cast<std::size_t>(3 * d + c)]),
              test::bf16_ulp(ref[static_cast<std::size_t>(3 * d + c)]) +
                  std::ldexp(mag[static_cast<std::size_t>(3 * d + c)], -8) + 1e-6);
  }
  EXPECT_LT(norm_with, 0.9 * norm_without);
}

TEST(SinkAttention, ProbabilitiesRoundToBf16BeforePV) {
  // scale 1, q = e0: key 0 = zero vector (score 0, the maximum), key 1 = (x, 0, .., 0, 1) with
  // x < 0 a bf16 value (score x). Channel 7: o = bf16(bf16(e^x) / (1 + e^x + e^sink)), where the
  // denominator keeps the fp32 e^x. Pick the first x where that differs from bf16(e^x / den).
  const std::int64_t d = 8;
  const std::vector<float> sink = {0.25f};
  float x = 0.0f, p = 0.0f, den = 0.0f;
  for (int k = 1; k < 200; ++k) {
    x = round_to_bf16(-0.0137f * static_cast<float>(k));
    p = std::exp(x);
    den = (1.0f + p) + std::exp(0.25f);
    if (round_to_bf16(round_to_bf16(p) / den) != round_to_bf16(p / den)) break;
  }
  ASSERT_NE(round_to_bf16(round_to_bf16(p) / den), round_to_bf16(p / den));
  std::vector<float> q(d, 0.0f), kv(2 * d, 0.0f);
  q[0] = 1.0f;
  kv[d + 0] = x;
  kv[d + 7] = 1.0f;
  std::vector<float> o(d);
  sink_attention(q, 1, d, kv, sink, 1.0f, o);
  EXPECT_EQ(o[7], round_to_bf16(round_to_bf16(p) / den));
  EXPECT_EQ(o[0], round_to_bf16(round_to_bf16(p) * x / den));
  for (int c = 1; c < 7; ++c) EXPECT_EQ(o[static_cast<std::size_t>(c)], 0.0f);
}

TEST(SinkAttention, KeyListFormsThreadsDuplicatesAndEmpty) {
  std::mt19937 rng(52);
  const std::int64_t heads = 3, d = 64, n_keys = 9;
  const std::vector<float> q = test::random_bf16(rng, static_cast<std::size_t>(heads * d), -3.0f, 3.0f);
  const std::vector<float> kv = test::random_bf16(rng, static_cast<std::size_t>(n_keys * d), -3.0f, 3.0f);
  const std::vector<float> sink = {0.0f, 1.0f, -2.0f};
  const float scale = attention_softmax_scale(d);
  std::vector<float> a(q.size()), b(q.size()), c(q.size());
  sink_attention(q, heads, d, kv, sink, scale, a);
  std::vector<const float*> ptrs;
  for (std::int64_t i = 0; i < n_keys; ++i) ptrs.push_back(kv.data() + i * d);
  ThreadPool pool(2);
  sink_attention(q, heads, d, ptrs, sink, scale, b, &pool);
  EXPECT_EQ(a, b);

  // A key listed twice counts twice (nothing is de-duplicated).
  std::vector<float> kv_dup = kv;
  kv_dup.insert(kv_dup.end(), kv.begin() + 2 * d, kv.begin() + 3 * d);
  sink_attention(q, heads, d, kv_dup, sink, scale, c);
  std::vector<double> ref, mag;
  reference(q, heads, d, kv_dup, sink, scale, ref, mag);
  int changed = 0;
  for (std::size_t i = 0; i < c.size(); ++i) {
    ASSERT_LE(std::fabs(c[i] - ref[i]), test::bf16_ulp(ref[i]) + std::ldexp(mag[i], -8) + 1e-6) << i;
    changed += c[i] != a[i];
  }
  EXPECT_GT(changed, 0);

  std::vector<float> empty_out(q.size(), 5.0f);
  sink_attention(q, heads, d, std::span<const float* const>(), sink, scale, empty_out);
  for (float v : empty_out) EXPECT_EQ(v, 0.0f);
  EXPECT_THROW(sink_attention(q, heads, d, kv, std::vector<float>(2), scale, a), std::invalid_argument);
  EXPECT_THROW(sink_attention(q, heads, d, std::span<const float>(kv).first(10), sink, scale, a),
               std::invalid_argument);
}

TEST(SinkAttention, RunningMaximumOverBlocksOf64Keys) {
  // 130 keys (blocks of 64, 64, 2), scale 1, q = e0. Key 0 scores x < 0 (its block's maximum),
  // key 129 scores 0 (the overall maximum, in the last, partial block), every other key -1000
  // (exp underflows to 0). Key 0 was weighted bf16(exp(x - x)) = 1 in its block and then scaled
  // by the fp32 correction exp(x - 0) when key 129 raised the maximum -- so channel 7 (1 in key 0
  // only) is bf16(e / (e + 1 + exp(sink))) with the UNROUNDED fp32 e = exp(x), where one softmax
  // over the global maximum would give bf16(bf16(e) / ...). Pick x where the two differ.
  const std::int64_t d = 8, n_keys = 130;
  const float sink = 0.5f;
  float x = 0.0f, e = 0.0f, den = 0.0f;
  for (int k = 1; k < 400; ++k) {
    x = round_to_bf16(-0.0113f * static_cast<float>(k));
    e = exp_float(x);
    den = (e + 1.0f) + exp_float(sink);
    if (round_to_bf16(e / den) != round_to_bf16(round_to_bf16(e) / den)) break;
  }
  ASSERT_NE(round_to_bf16(e / den), round_to_bf16(round_to_bf16(e) / den));
  std::vector<float> q(d, 0.0f), kv(static_cast<std::size_t>(n_keys * d), 0.0f);
  q[0] = 1.0f;
  for (std::int64_t i = 0; i < n_keys; ++i) kv[static_cast<std::size_t>(i * d)] = -1000.0f;
  kv[0] = x;
  kv[7] = 1.0f;
  kv[static_cast<std::size_t>(129 * d)] = 0.0f;
  kv[static_cast<std::size_t>(129 * d + 6)] = 1.0f;
  std::vector<float> o(d);
  sink_attention(q, 1, d, kv, std::vector<float>{sink}, 1.0f, o);
  EXPECT_EQ(o[7], round_to_bf16(e / den));
  EXPECT_EQ(o[6], round_to_bf16(1.0f / den));
  EXPECT_EQ(o[0], round_to_bf16(e * x / den));
}

}  // namespace
}  // namespace dsv4
