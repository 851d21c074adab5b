// Lightning indexer (SPEC.md 3.4, 5a): query (RoPE, Hadamard, FP4), weights scaling, bf16 scores
// against double, ReLU, and top-k compared as a set against a sort-based reference with ties.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

#include "cpu/indexer.h"
#include "cpu/linear.h"
#include "cpu_test_util.h"
#include "numerics/hadamard.h"

namespace dsv4 {
namespace {

RopeTable yarn_rope() {
  RopeParams rp;
  rp.base = 160000;
  rp.yarn = true;
  rp.factor = 16;
  rp.original_max_position = 65536;
  return RopeTable(rp);
}

IndexerParams small_params() {
  IndexerParams p;
  p.n_heads = 4;
  p.head_dim = 128;
  p.topk = 8;
  return p;
}

TEST(Indexer, QueryIsRopeHadamardFp4PerHead) {
  std::mt19937 rng(71);
  const IndexerParams p = small_params();
  const std::int64_t q_lora = 96, rows = 3;
  const DenseWeight wq_b = test::random_fp8_weight(rng, "indexer.wq_b", p.n_heads * p.head_dim, q_lora);
  const std::vector<float> qr = test::random_bf16(rng, static_cast<std::size_t>(rows * q_lora), -2.0f, 2.0f);
  const std::vector<std::int64_t> positions = {0, 17, 70000};
  const RopeTable rope = yarn_rope();
  const std::int64_t width = p.n_heads * p.head_dim;
  std::vector<float> q(static_cast<std::size_t>(rows * width));
  indexer_query(qr, rows, positions, wq_b, rope, p, q);

  std::vector<float> ref(q.size());
  linear(qr, rows, wq_b, ref);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t h = 0; h < p.n_heads; ++h) {
      std::span<float> head = std::span<float>(ref).subspan(static_cast<std::size_t>(r * width + h * p.head_dim), 128);
      std::vector<float> before(head.begin(), head.end());
      rope.apply(head.last(64), positions[static_cast<std::size_t>(r)]);
      for (float& v : head) v = round_to_bf16(v);
      if (r > 0) {
        EXPECT_NE(std::vector<float>(head.begin(), head.end()), before);  // rotated
      }
      hadamard_transform(head);
      for (float& v : head) v = round_to_bf16(v);
      for (int b = 0; b < 4; ++b) {
        float amax = 0;
        for (int c = 0; c < 32; ++c) amax = std::max(amax, std::fabs(head[static_cast<std::size_t>(32 * b + c)]));
        const float scale = pow2_block_scale(amax, QuantFormat::kFp4E2m1);
        for (int c = 0; c < 32; ++c) {
          ASSERT_TRUE(test::representable(q[static_cast<std::size_t>(r * width + h * 128 + 32 * b + c)], scale,
                                          QuantFormat::kFp4E2m1));
        }
      }
      simulate_quant_blocks(head, 32, QuantFormat::kFp4E2m1);
    }
  }
  EXPECT_EQ(q, ref);
}

TEST(Indexer, WeightsAreScaledBf16) {
  std::mt19937 rng(72);
  const IndexerParams p = small_params();
  EXPECT_EQ(indexer_weight_scale(p), static_cast<float>(1.0 / std::sqrt(128.0 * 4.0)));
  const std::int64_t D = 64, rows = 2;
  const DenseWeight wp = test::random_bf16_weight(rng, "weights_proj", p.n_heads, D);
  const std::vector<float> x = test::random_bf16(rng, static_cast<std::size_t>(rows * D));
  std::vector<float> w(static_cast<std::size_t>(rows * p.n_heads));
  indexer_weights(x, rows, wp, p, w);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t h = 0; h < p.n_heads; ++h) {
      const double ref = test::dot_d(x.data() + r * D, wp.row(h).data(), D) / std::sqrt(512.0);
      const float got = w[static_cast<std::size_t>(r * p.n_heads + h)];
      ASSERT_EQ(round_to_bf16(got), got);
      ASSERT_LE(std::fabs(got - ref), 2 * test::bf16_ulp(ref) + 1e-6);  // two bf16 roundings
    }
  }
}

TEST(Indexer, ScoresAreReluWeightedBf16Sums) {
  std::mt19937 rng(73);
  const IndexerParams p = small_params();
  const std::int64_t n_keys = 40, hd = 128;
  const std::vector<float> q = test::random_bf16(rng, static_cast<std::size_t>(p.n_heads * hd), -1.0f, 1.0f);
  std::vector<float> keys = test::random_bf16(rng, static_cast<std::size_t>(n_keys * hd), -1.0f, 1.0f);
  const std::vector<float> w = {round_to_bf16(0.3f), round_to_bf16(-0.2f), round_to_bf16(0.7f), round_to_bf16(0.05f)};
  std::vector<float> scores(static_cast<std::size_t>(n_keys));
  indexer_scores(q, w, keys, p, scores);
  int relu_active = 0;
  for (std::int64_t j = 0; j < n_keys; ++j) {
    double ref = 0, mag = 0;
    for (std::int64_t h = 0; h < p.n_heads; ++h) {
      const double dot = test::dot_d(q.data() + h * hd, keys.data() + j * hd, hd);
      relu_active += dot < 0;
      ref += w[static_cast<std::size_t>(h)] * std::max(dot, 0.0);
      mag += std::fabs(w[static_cast<std::size_t>(h)] * dot);
    }
    const float got = scores[static_cast<std::size_t>(j)];
    ASSERT_EQ(round_to_bf16(got), got);
    // Three bf16 roundings per term plus the final one.
    ASSERT_LE(std::fabs(got - ref), test::bf16_ulp(ref) + std::ldexp(mag, -7) + 1e-6) << j;
  }
  EXPECT_GT(relu_active, 10);  // the ReLU mattered for some (head, key) pairs

  // Negating a key flips every dot: with all weights positive, key j and -key j share no head.
  const std::vector<float> wpos = {1.0f, 1.0f, 1.0f, 1.0f};
  std::vector<float> pair(2 * hd);
  std::copy(keys.begin(), keys.begin() + hd, pair.begin());
  for (std::int64_t c = 0; c < hd; ++c) pair[static_cast<std::size_t>(hd + c)] = -keys[static_cast<std::size_t>(c)];
  std::vector<float> s2(2);
  indexer_scores(q, wpos, pair, p, s2);
  double total = 0;
  for (std::int64_t h = 0; h < p.n_heads; ++h) total += std::fabs(test::dot_d(q.data() + h * hd, keys.data(), hd));
  EXPECT_LE(std::fabs(s2[0] + s2[1] - total), 0.02 * total);
  EXPECT_THROW(indexer_scores(q, w, std::span<const float>(keys).first(100), p, s2), std::invalid_argument);
}

// Sort-based reference: stable sort by descending score keeps lower indices first among ties.
std::vector<std::int64_t> sort_top_k(const std::vector<float>& s, std::int64_t k) {
  std::vector<std::int64_t> idx(s.size());
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<std::int64_t>(i);
  std::stable_sort(idx.begin(), idx.end(), [&](std::int64_t a, std::int64_t b) {
    return s[static_cast<std::size_t>(a)] > s[static_cast<std::size_t>(b)];
  });
  idx.resize(std::min<std::size_t>(idx.size(), static_cast<std::size_t>(k)));
  return idx;
}

TEST(Indexer, TopKAsSetsWithTies) {
  std::mt19937 rng(74);
  std::uniform_int_distribution<int> level(0, 6);
  for (int trial = 0; trial < 50; ++trial) {
    const std::size_t n = 1 + static_cast<std::size_t>(trial * 7 % 90);
    std::vector<float> s(n);
    for (float& v : s) v = 0.5f * static_cast<float>(level(rng)) - 1.0f;  // many ties
    for (std::int64_t k : {0, 1, 5, 8, 200}) {
      const std::vector<std::int64_t> got = top_k_indices(s, k);
      const std::vector<std::int64_t> ref = sort_top_k(s, k);
      ASSERT_EQ(got.size(), std::min<std::size_t>(n, static_cast<std::size_t>(k)));
      EXPECT_EQ(std::set<std::int64_t>(got.begin(), got.end()), std::set<std::int64_t>(ref.begin(), ref.end()));
      EXPECT_EQ(got, ref);  // order too: descending score, then ascending index
      // A valid top-k whatever the tie rule: nothing left out beats anything chosen.
      const std::set<std::int64_t> chosen(got.begin(), got.end());
      float worst_in = INFINITY, best_out = -INFINITY;
      for (std::size_t i = 0; i < n; ++i) {
        if (chosen.count(static_cast<std::int64_t>(i))) {
          worst_in = std::min(worst_in, s[i]);
        } else {
          best_out = std::max(best_out, s[i]);
        }
      }
      if (!got.empty() && got.size() < n) {
        EXPECT_GE(worst_in, best_out);
      }
    }
  }
  const std::vector<float> with_nan = {1.0f, NAN, -INFINITY, 2.0f};
  EXPECT_EQ(top_k_indices(with_nan, 3), (std::vector<std::int64_t>{3, 0, 1}));
  EXPECT_THROW(top_k_indices(with_nan, -1), std::invalid_argument);
}

}  // namespace
}  // namespace dsv4
