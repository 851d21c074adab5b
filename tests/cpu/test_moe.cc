// MoE (SPEC.md 3.5, 5a): gate scores sqrt(softplus), score routing (bias steers, weights from the
// unbiased scores) vs hash routing, the asymmetric SwiGLU clamp at +-limit, expert and full MoE
// against compositions written out in the test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

#include "cpu/linear.h"
#include "cpu/moe.h"
#include "cpu_test_util.h"

namespace dsv4 {
namespace {

double softplus_d(double z) { return std::log1p(std::exp(z)); }
double silu_d(double z) { return z / (1.0 + std::exp(-z)); }

TEST(Moe, GateScoresAreSqrtSoftplus) {
  std::mt19937 rng(81);
  const std::int64_t D = 64, E = 16;
  const DenseWeight gate = test::random_bf16_weight(rng, "ffn.gate.weight", E, D, 1.0f);
  const std::vector<float> x = test::random_bf16(rng, static_cast<std::size_t>(D), -2.0f, 2.0f);
  std::vector<float> s(static_cast<std::size_t>(E));
  moe_gate_scores(x, gate, s);
  for (std::int64_t e = 0; e < E; ++e) {
    const double ref = std::sqrt(softplus_d(test::dot_d(x.data(), gate.row(e).data(), D)));
    EXPECT_NEAR(s[static_cast<std::size_t>(e)], ref, 1e-5 * (1 + ref)) << e;
  }
  // Large logits: softplus(z) = z above 20.
  const DenseWeight big = make_dense_weight("g", 2, 1, WeightKind::kBf16, {30.0f, -30.0f});
  const std::vector<float> one = {1.0f};
  std::vector<float> s2(2);
  moe_gate_scores(one, big, s2);
  EXPECT_EQ(s2[0], std::sqrt(30.0f));
  EXPECT_NEAR(s2[1], std::sqrt(std::exp(-30.0)), 1e-12);
}

TEST(Moe, ScoreRoutingVersusHashRouting) {
  MoeParams p;
  p.n_routed_experts = 8;
  p.top_k = 3;
  p.routed_scaling_factor = 1.5f;
  const std::vector<float> s = {0.9f, 0.1f, 0.8f, 0.3f, 0.7f, 0.2f, 0.6f, 0.5f};
  const std::vector<float> no_bias(8, 0.0f);
  const MoeRouting plain = moe_route_scores(s, no_bias, p);
  EXPECT_EQ(plain.experts, (std::vector<std::int64_t>{0, 2, 4}));
  // The bias steers the choice (experts 1 and 5 win) but the weights use the unbiased scores.
  const std::vector<float> bias = {0.0f, 1.0f, 0.0f, 0.0f, 0.0f, 0.75f, 0.0f, 0.0f};
  const MoeRouting steered = moe_route_scores(s, bias, p);
  EXPECT_EQ(steered.experts, (std::vector<std::int64_t>{1, 5, 0}));
  const float sum = 0.1f + 0.2f + 0.9f;
  EXPECT_EQ(steered.weights[0], (0.1f / sum) * 1.5f);
  EXPECT_EQ(steered.weights[1], (0.2f / sum) * 1.5f);
  EXPECT_EQ(steered.weights[2], (0.9f / sum) * 1.5f);
  EXPECT_NEAR(steered.weights[0] + steered.weights[1] + steered.weights[2], 1.5, 1e-6);
  // Ties: the lower expert id wins.
  const std::vector<float> tied = {0.5f, 0.7f, 0.5f, 0.7f, 0.5f, 0.1f, 0.5f, 0.7f};
  EXPECT_EQ(moe_route_scores(tied, no_bias, p).experts, (std::vector<std::int64_t>{1, 3, 7}));
  p.top_k = 2;
  EXPECT_EQ(moe_route_scores(tied, no_bias, p).experts, (std::vector<std::int64_t>{1, 3}));
  p.top_k = 3;

  // Hash routing: the table's ids in its order, whatever the scores.
  const std::vector<std::int64_t> ids = {6, 1, 3};
  const MoeRouting hashed = moe_route_hash(s, ids, p);
  EXPECT_EQ(hashed.experts, ids);
  const float hsum = 0.6f + 0.1f + 0.3f;
  EXPECT_EQ(hashed.weights[0], (0.6f / hsum) * 1.5f);
  EXPECT_EQ(hashed.weights[2], (0.3f / hsum) * 1.5f);
  EXPECT_THROW(moe_route_hash(s, std::vector<std::int64_t>{6, 1, 8}, p), std::invalid_argument);
  EXPECT_THROW(moe_route_hash(s, std::vector<std::int64_t>{6, 1}, p), std::invalid_argument);
  EXPECT_THROW(moe_route_scores(s, std::vector<float>(7), p), std::invalid_argument);
}

TEST(Moe, SwigluClampIsUpperOnlyForTheGate) {
  const std::vector<float> g = {12.0f, -12.0f, 5.0f, 10.0f, -3.0f};
  const std::vector<float> u = {12.0f, -12.0f, -3.0f, 10.5f, 11.0f};
  std::vector<float> h(5);
  swiglu_clamped(g, u, 10.0f, 0.5f, h);
  const double expected[5] = {0.5 * silu_d(10) * 10, 0.5 * silu_d(-12) * -10, 0.5 * silu_d(5) * -3,
                              0.5 * silu_d(10) * 10, 0.5 * silu_d(-3) * 10};
  for (int i = 0; i < 5; ++i)
    EXPECT_NEAR(h[static_cast<std::size_t>(i)], expected[i], 1e-6 * (1 + std::fabs(expected[i]))) << i;
  // A symmetric gate clamp would give silu(-10) * -10 * 0.5 = 2.27e-3 instead of 3.7e-4.
  EXPECT_LT(std::fabs(h[1]), 5e-4f);
  // limit 0: no clamp at all.
  swiglu_clamped(g, u, 0.0f, 1.0f, h);
  EXPECT_NEAR(h[0], silu_d(12) * 12, 1e-4);
  EXPECT_NEAR(h[1], silu_d(-12) * -12, 1e-8);
}

// Identity-like FP8 weights: w[o][i] = (o == i) * v.
DenseWeight diagonal(const std::string& name, std::int64_t n, float v) {
  std::vector<float> w(static_cast<std::size_t>(n * n), 0.0f);
  for (std::int64_t i = 0; i < n; ++i) w[static_cast<std::size_t>(i * n + i)] = v;
  return make_dense_weight(name, n, n, WeightKind::kFp8, std::move(w));
}

TEST(Moe, ClampEndToEndThroughTheExpert) {
  // D = I = 128, w1 = w3 = w2 = identity: g = u = x exactly (x's values are FP8-exact at the
  // block scale 2^-5 set by |12|), so the clamp acts on known values.
  const std::int64_t n = 128;
  const DenseWeight w1 = diagonal("w1", n, 1.0f), w2 = diagonal("w2", n, 1.0f), w3 = diagonal("w3", n, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(n));
  const float pattern[4] = {12.0f, -12.0f, 3.0f, -0.5f};
  for (std::int64_t i = 0; i < n; ++i) x[static_cast<std::size_t>(i)] = pattern[i % 4];
  std::vector<float> out(static_cast<std::size_t>(n));
  const ExpertWeights e{&w1, &w2, &w3};
  expert_forward(x, e, 0.75f, 10.0f, out);
  // Expected: h = 0.75 * silu(min(x, 10)) * clamp(x, +-10) -> bf16 -> FP8 (blocks of 128) -> bf16.
  std::vector<float> h(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const double xi = x[static_cast<std::size_t>(i)];
    h[static_cast<std::size_t>(i)] =
        static_cast<float>(0.75 * silu_d(std::min(xi, 10.0)) * std::clamp(xi, -10.0, 10.0));
  }
  fp8_simulate_activation(h);
  for (std::int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(out[static_cast<std::size_t>(i)], h[static_cast<std::size_t>(i)],
                1e-2 * std::fabs(h[static_cast<std::size_t>(i)]) + 1e-7)
        << i;
  }
  // 0.75 * silu(10) * 10 = 74.9966; the FP8 block scale 2^-2 puts it at 299.99 -> e4m3 288 -> 72.
  EXPECT_EQ(out[0], 72.0f);
  EXPECT_GT(out[1], 0.0f);  // silu(-12) * (-10) > 0, small
  EXPECT_LT(out[1], 1e-3f);
}

TEST(Moe, ForwardIsTheSumOfExpertsInIdOrderPlusShared) {
  std::mt19937 rng(82);
  const std::int64_t D = 128, I = 64, E = 6;
  MoeParams p;
  p.n_routed_experts = E;
  p.top_k = 3;
  p.routed_scaling_factor = 2.5f;
  p.swiglu_limit = 10.0f;
  std::vector<DenseWeight> store;
  store.reserve(3 * E + 3);
  std::vector<ExpertWeights> experts;
  for (std::int64_t e = 0; e < E; ++e) {
    store.push_back(test::random_fp4_weight(rng, "w1", I, D, 1.0f));
    store.push_back(test::random_fp4_weight(rng, "w2", D, I, 1.0f));
    store.push_back(test::random_fp4_weight(rng, "w3", I, D, 1.0f));
    experts.push_back({&store[store.size() - 3], &store[store.size() - 2], &store[store.size() - 1]});
  }
  store.push_back(test::random_fp8_weight(rng, "s1", I, D, 1.0f));
  store.push_back(test::random_fp8_weight(rng, "s2", D, I, 1.0f));
  store.push_back(test::random_fp8_weight(rng, "s3", I, D, 1.0f));
  const ExpertWeights shared{&store[store.size() - 3], &store[store.size() - 2], &store[store.size() - 1]};
  const DenseWeight gate = test::random_bf16_weight(rng, "gate", E, D);
  const std::vector<float> x = test::random_bf16(rng, static_cast<std::size_t>(D), -2.0f, 2.0f);

  std::vector<float> s(static_cast<std::size_t>(E));
  moe_gate_scores(x, gate, s);
  const MoeRouting by_score = moe_route_scores(s, std::vector<float>(static_cast<std::size_t>(E), 0.0f), p);
  const std::vector<std::int64_t> table = {5, 2, 0};  // not in id order
  const MoeRouting by_hash = moe_route_hash(s, table, p);
  ASSERT_NE(std::set<std::int64_t>(by_score.experts.begin(), by_score.experts.end()),
            std::set<std::int64_t>(by_hash.experts.begin(), by_hash.experts.end()));

  for (const MoeRouting* routing : {&by_score, &by_hash}) {
    std::vector<float> out(static_cast<std::size_t>(D));
    moe_forward(x, *routing, experts, shared, p, out);
    // Routed outputs accumulated in ascending expert id, then the shared expert, then bf16.
    std::vector<std::size_t> order = {0, 1, 2};
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return routing->experts[a] < routing->experts[b]; });
    // (The order only shows in rare last-bit cases after the bf16 rounding.)
    std::vector<float> acc(static_cast<std::size_t>(D), 0.0f), y(static_cast<std::size_t>(D));
    for (std::size_t k = 0; k < 3; ++k) {
      expert_forward(x, experts[static_cast<std::size_t>(routing->experts[order[k]])], routing->weights[order[k]],
                     10.0f, y);
      for (std::int64_t i = 0; i < D; ++i) acc[static_cast<std::size_t>(i)] += y[static_cast<std::size_t>(i)];
    }
    expert_forward(x, shared, 1.0f, 10.0f, y);
    for (std::int64_t i = 0; i < D; ++i) {
      const auto ii = static_cast<std::size_t>(i);
      EXPECT_EQ(out[ii], round_to_bf16(acc[ii] + y[ii])) << i;
    }

    // One expert against double: w2(bf16(r * silu(min(g, L)) * clamp(u))) with g, u the bf16 GEMM outputs.
    const std::int64_t e0 = routing->experts[0];
    std::vector<float> g(static_cast<std::size_t>(I)), u(static_cast<std::size_t>(I));
    linear(x, 1, *experts[static_cast<std::size_t>(e0)].w1, g);
    linear(x, 1, *experts[static_cast<std::size_t>(e0)].w3, u);
    std::vector<float> hid(static_cast<std::size_t>(I));
    for (std::int64_t i = 0; i < I; ++i) {
      const double gi = g[static_cast<std::size_t>(i)], ui = u[static_cast<std::size_t>(i)];
      hid[static_cast<std::size_t>(i)] =
          static_cast<float>(routing->weights[0] * silu_d(std::min(gi, 10.0)) * std::clamp(ui, -10.0, 10.0));
    }
    fp8_simulate_activation(hid);
    expert_forward(x, experts[static_cast<std::size_t>(e0)], routing->weights[0], 10.0f, y);
    for (std::int64_t i = 0; i < D; ++i) {
      const float* w2row = experts[static_cast<std::size_t>(e0)].w2->row(i).data();
      const double ref = test::dot_d(hid.data(), w2row, I);
      ASSERT_TRUE(test::bf16_near(y[static_cast<std::size_t>(i)], ref, test::dot_mag(hid.data(), w2row, I) * 1.01))
          << i;
    }
  }
}

}  // namespace
}  // namespace dsv4
