// Compressor (SPEC.md 3.3): softmax pooling against double, the c4 overlap windows with
// distinguishable slots, the state ring token by token against the SPEC formula on the whole
// sequence, and the entry finish (norm, RoPE at j*r, FP8 on dims [0, 448) only / Hadamard + FP4).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "cpu/compressor.h"
#include "cpu/linear.h"
#include "cpu/rms_norm.h"
#include "cpu_test_util.h"
#include "numerics/hadamard.h"

namespace dsv4 {
namespace {

CompressorParams small_params(std::int64_t ratio, std::int64_t hd = 8) {
  CompressorParams p;
  p.ratio = ratio;
  p.head_dim = hd;
  p.rope_dim = 4;
  return p;
}

float& slot_value(std::vector<float>& ring, const CompressorParams& p, std::int64_t slot, std::int64_t k) {
  return ring[static_cast<std::size_t>(slot * p.slot_floats() + k)];
}
float& slot_score(std::vector<float>& ring, const CompressorParams& p, std::int64_t slot, std::int64_t k) {
  return ring[static_cast<std::size_t>(slot * p.slot_floats() + p.proj_dim() + k)];
}

// entry[c] = sum_s a_s softmax_s(g_s) over (a, g) pairs, in double.
double pool_d(const std::vector<std::pair<double, double>>& ag) {
  double m = -1e300, den = 0, num = 0;
  for (const auto& [a, g] : ag) m = std::max(m, g);
  for (const auto& [a, g] : ag) {
    den += std::exp(g - m);
    num += a * std::exp(g - m);
  }
  return num / den;
}

TEST(Compressor, PoolingMatchesDoubleSoftmax) {
  std::mt19937 rng(61);
  for (std::int64_t ratio : {4, 128}) {
    const CompressorParams p = small_params(ratio);
    std::vector<float> ring = test::random_floats(rng, static_cast<std::size_t>(p.ring_floats()), -3.0f, 3.0f);
    for (bool prev : {false, true}) {
      std::vector<float> entry(static_cast<std::size_t>(p.head_dim));
      compressor_pool(ring, prev, p, entry);
      for (std::int64_t c = 0; c < p.head_dim; ++c) {
        std::vector<std::pair<double, double>> ag;
        if (ratio == 4) {
          for (std::int64_t s = 0; s < 4 && prev; ++s)
            ag.emplace_back(slot_value(ring, p, s, c), slot_score(ring, p, s, c));
          for (std::int64_t s = 4; s < 8; ++s)
            ag.emplace_back(slot_value(ring, p, s, p.head_dim + c), slot_score(ring, p, s, p.head_dim + c));
        } else {
          for (std::int64_t s = 0; s < 128; ++s) ag.emplace_back(slot_value(ring, p, s, c), slot_score(ring, p, s, c));
        }
        EXPECT_NEAR(entry[static_cast<std::size_t>(c)], pool_d(ag), 2e-6) << ratio << " " << prev << " " << c;
      }
    }
  }
}

TEST(Compressor, OverlapWindowsUseTheRightHalves) {
  // Values name their origin: a = 1000 * slot + (second half ? 500 : 0) + channel. Per channel one
  // slot gets score 0 and every other (slot, half) -30 (weight ~1e-13), except traps: the halves
  // the pooling must NOT read get +40.
  const CompressorParams p = small_params(4);
  const std::int64_t hd = p.head_dim;
  std::vector<float> ring(static_cast<std::size_t>(p.ring_floats()));
  for (std::int64_t s = 0; s < 8; ++s) {
    for (std::int64_t k = 0; k < 2 * hd; ++k) {
      slot_value(ring, p, s, k) = static_cast<float>(1000 * s + (k >= hd ? 500 : 0) + k % hd);
      const bool read = (s < 4) == (k < hd);  // previous block: first halves; this block: second halves
      slot_score(ring, p, s, k) = read ? -30.0f : 40.0f;
    }
  }
  std::vector<float> entry(static_cast<std::size_t>(hd));
  for (std::int64_t c = 0; c < hd; ++c) {
    const std::int64_t winner = c % 8;  // channel c is dominated by slot c mod 8
    slot_score(ring, p, winner, winner < 4 ? c : hd + c) = 0.0f;
  }
  compressor_pool(ring, /*has_previous=*/true, p, entry);
  for (std::int64_t c = 0; c < hd; ++c) {
    const std::int64_t winner = c % 8;
    EXPECT_NEAR(entry[static_cast<std::size_t>(c)], 1000 * winner + (winner < 4 ? 0 : 500) + c, 1e-6 * 8000) << c;
  }
  // j = 0: the previous-block slots carry weight 0 even where they would win.
  compressor_pool(ring, /*has_previous=*/false, p, entry);
  for (std::int64_t c = 0; c < hd; ++c) {
    const std::int64_t winner = c % 8;
    if (winner >= 4) {
      EXPECT_NEAR(entry[static_cast<std::size_t>(c)], 1000 * winner + 500 + c, 1e-6 * 8000) << c;
    } else {
      // All four current-block second halves score -30: their plain mean.
      EXPECT_NEAR(entry[static_cast<std::size_t>(c)], (4000 + 5000 + 6000 + 7000) / 4.0 + 500 + c, 1e-3) << c;
    }
  }
}

// SPEC 3.3 on a whole sequence, in double: a_t = wkv x_t, g_t = wgate x_t + ape[t mod r].
std::vector<std::vector<double>> spec_entries(const std::vector<float>& x, std::int64_t T, std::int64_t D,
                                              const DenseWeight& wkv, const DenseWeight& wgate,
                                              const std::vector<float>& ape, const CompressorParams& p) {
  const std::int64_t pd = p.proj_dim(), hd = p.head_dim, r = p.ratio;
  std::vector<std::vector<double>> a(static_cast<std::size_t>(T), std::vector<double>(static_cast<std::size_t>(pd))),
      g = a;
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t k = 0; k < pd; ++k) {
      a[t][k] = test::dot_d(x.data() + t * D, wkv.row(k).data(), D);
      g[t][k] = test::dot_d(x.data() + t * D, wgate.row(k).data(), D) + ape[static_cast<std::size_t>((t % r) * pd + k)];
    }
  }
  std::vector<std::vector<double>> entries;
  for (std::int64_t j = 0; (j + 1) * r <= T; ++j) {
    std::vector<double> e(static_cast<std::size_t>(hd));
    for (std::int64_t c = 0; c < hd; ++c) {
      std::vector<std::pair<double, double>> ag;
      if (r == 4) {
        for (std::int64_t t = 4 * (j - 1); j > 0 && t < 4 * j; ++t) ag.emplace_back(a[t][c], g[t][c]);
        for (std::int64_t t = 4 * j; t < 4 * j + 4; ++t) ag.emplace_back(a[t][hd + c], g[t][hd + c]);
      } else {
        for (std::int64_t t = r * j; t < r * (j + 1); ++t) ag.emplace_back(a[t][c], g[t][c]);
      }
      e[c] = pool_d(ag);
    }
    entries.push_back(e);
  }
  return entries;
}

TEST(Compressor, StateRingTokenByTokenMatchesSpecOnTheSequence) {
  std::mt19937 rng(62);
  const std::int64_t D = 48;
  for (std::int64_t ratio : {4, 128}) {
    const CompressorParams p = small_params(ratio, 16);
    const std::int64_t T = ratio == 4 ? 23 : 300;
    const DenseWeight wkv = test::random_bf16_weight(rng, "wkv", p.proj_dim(), D);
    const DenseWeight wgate = test::random_bf16_weight(rng, "wgate", p.proj_dim(), D);
    const std::vector<float> ape = test::random_floats(rng, static_cast<std::size_t>(ratio * p.proj_dim()));
    const std::vector<float> x = test::random_bf16(rng, static_cast<std::size_t>(T * D), -1.5f, 1.5f);
    const auto expected = spec_entries(x, T, D, wkv, wgate, ape, p);
    ASSERT_EQ(static_cast<std::int64_t>(expected.size()), T / ratio);

    // One-shot projection of all tokens, then the ring fed token by token.
    std::vector<std::int64_t> positions(static_cast<std::size_t>(T));
    for (std::int64_t t = 0; t < T; ++t) positions[static_cast<std::size_t>(t)] = t;
    std::vector<float> all(static_cast<std::size_t>(T * p.slot_floats()));
    compressor_project(x, T, positions, wkv, wgate, ape, p, all);
    std::vector<float> ring(static_cast<std::size_t>(p.ring_floats()), 0.0f);
    std::size_t emitted = 0;
    for (std::int64_t t = 0; t < T; ++t) {
      // The per-token projection is the same whether projected alone or in the batch.
      std::vector<float> one(static_cast<std::size_t>(p.slot_floats()));
      const std::int64_t pos[1] = {t};
      compressor_project(
          std::span<const float>(x).subspan(static_cast<std::size_t>(t * D), static_cast<std::size_t>(D)), 1, pos, wkv,
          wgate, ape, p, one);
      ASSERT_TRUE(std::equal(one.begin(), one.end(), all.begin() + t * p.slot_floats()));
      std::copy(one.begin(), one.end(), ring.begin() + compressor_slot(t, p) * p.slot_floats());
      if (!compressor_block_complete(t, p)) continue;
      const std::int64_t j = t / ratio;
      std::vector<float> entry(static_cast<std::size_t>(p.head_dim));
      compressor_pool(ring, j > 0, p, entry);
      compressor_shift(ring, p);
      for (std::int64_t c = 0; c < p.head_dim; ++c) {
        ASSERT_NEAR(entry[static_cast<std::size_t>(c)],
                    expected[static_cast<std::size_t>(j)][static_cast<std::size_t>(c)], 2e-5)
            << ratio << " entry " << j << " channel " << c;
      }
      ++emitted;
    }
    EXPECT_EQ(emitted, expected.size());
  }
}

RopeTable compressed_rope() {
  RopeParams rp;
  rp.rope_dim = 64;
  rp.base = 160000;
  rp.yarn = true;
  rp.factor = 16;
  rp.original_max_position = 65536;
  return RopeTable(rp);
}

TEST(Compressor, AttentionFinishQuantizesOnlyTheNoRopeDims) {
  std::mt19937 rng(63);
  CompressorParams p;
  p.ratio = 4;
  p.head_dim = 512;
  p.kind = CompressorKind::kAttention;
  const RopeTable rope = compressed_rope();
  const std::vector<float> norm = test::random_bf16(rng, 512, 0.5f, 1.5f);
  const std::vector<float> pooled = test::random_floats(rng, 512, -2.0f, 2.0f);
  const std::int64_t j = 37;
  std::vector<float> entry = pooled;
  compressor_finish(entry, norm, rope, j, p);

  // Composition: bf16, norm, RoPE at j*4 (bf16), then FP8 of dims [0, 448) in blocks of 64.
  std::vector<float> ref(pooled);
  for (float& v : ref) v = round_to_bf16(v);
  rms_norm(ref, 1, norm, p.norm_eps, ref);
  std::vector<float> tail(ref.begin() + 448, ref.end());
  rope.apply(tail, j * 4);
  for (float& v : tail) v = round_to_bf16(v);
  for (int c = 0; c < 64; ++c)
    EXPECT_EQ(entry[static_cast<std::size_t>(448 + c)], tail[static_cast<std::size_t>(c)]) << c;
  // RoPE at the block's first token, not its last.
  std::vector<float> tail_last(ref.begin() + 448, ref.end());
  rope.apply(tail_last, j * 4 + 3);
  int differ = 0;
  for (int c = 0; c < 64; ++c)
    differ += round_to_bf16(tail_last[static_cast<std::size_t>(c)]) != entry[static_cast<std::size_t>(448 + c)];
  EXPECT_GT(differ, 0);
  // Dims [0, 448): FP8 per 64-block of the normed values (and actually changed by it).
  int changed = 0;
  for (int b = 0; b < 7; ++b) {
    std::vector<float> blk(ref.begin() + 64 * b, ref.begin() + 64 * (b + 1));
    float amax = 0;
    for (float v : blk) amax = std::max(amax, std::fabs(v));
    const float scale = pow2_block_scale(amax, QuantFormat::kFp8E4m3);
    for (int c = 0; c < 64; ++c) {
      const float got = entry[static_cast<std::size_t>(64 * b + c)];
      ASSERT_TRUE(test::representable(got, scale, QuantFormat::kFp8E4m3)) << b << " " << c;
      ASSERT_LE(std::fabs(got - blk[static_cast<std::size_t>(c)]), scale * 16.0f);  // half an e4m3 step at the top
      changed += got != blk[static_cast<std::size_t>(c)];
    }
  }
  EXPECT_GT(changed, 100);

  // The window-kv helper does the same quantization.
  std::vector<float> kv(ref);
  std::copy(tail.begin(), tail.end(), kv.begin() + 448);
  fp8_simulate_kv_nope(kv, 64);
  EXPECT_EQ(kv, entry);
}

TEST(Compressor, IndexerFinishHadamardThenFp4) {
  std::mt19937 rng(64);
  CompressorParams p;
  p.ratio = 4;
  p.head_dim = 128;
  p.kind = CompressorKind::kIndexer;
  const RopeTable rope = compressed_rope();
  const std::vector<float> norm = test::random_bf16(rng, 128, 0.5f, 1.5f);
  const std::vector<float> pooled = test::random_floats(rng, 128, -2.0f, 2.0f);
  std::vector<float> entry = pooled;
  compressor_finish(entry, norm, rope, 5, p);

  std::vector<float> ref(pooled);
  for (float& v : ref) v = round_to_bf16(v);
  rms_norm(ref, 1, norm, p.norm_eps, ref);
  rope.apply(std::span<float>(ref).last(64), 20);
  for (float& v : ref) v = round_to_bf16(v);
  hadamard_transform(ref);
  for (float& v : ref) v = round_to_bf16(v);
  for (int b = 0; b < 4; ++b) {
    float amax = 0;
    for (int c = 0; c < 32; ++c) amax = std::max(amax, std::fabs(ref[static_cast<std::size_t>(32 * b + c)]));
    const float scale = pow2_block_scale(amax, QuantFormat::kFp4E2m1);
    for (int c = 0; c < 32; ++c) {
      const float got = entry[static_cast<std::size_t>(32 * b + c)];
      ASSERT_TRUE(test::representable(got, scale, QuantFormat::kFp4E2m1));
      ASSERT_LE(std::fabs(got - ref[static_cast<std::size_t>(32 * b + c)]), scale * 1.0f);  // half of the top step 2
    }
  }
  simulate_quant_blocks(ref, 32, QuantFormat::kFp4E2m1);
  EXPECT_EQ(entry, ref);

  // compressor_entry = pool + finish.
  CompressorParams pi = p;
  std::vector<float> ring = test::random_floats(rng, static_cast<std::size_t>(pi.ring_floats()));
  std::vector<float> e1(128), e2(128);
  compressor_entry(ring, 0, norm, rope, pi, e1);
  compressor_pool(ring, false, pi, e2);
  compressor_finish(e2, norm, rope, 0, pi);
  EXPECT_EQ(e1, e2);
  EXPECT_THROW(compressor_finish(e2, std::vector<float>(64), rope, 0, pi), std::invalid_argument);
}

TEST(Compressor, SlotsAndShift) {
  const CompressorParams c4 = small_params(4), c128 = small_params(128);
  EXPECT_EQ(compressor_slot(0, c4), 4);
  EXPECT_EQ(compressor_slot(7, c4), 7);
  EXPECT_EQ(compressor_slot(130, c128), 2);
  EXPECT_TRUE(compressor_block_complete(3, c4));
  EXPECT_FALSE(compressor_block_complete(4, c4));
  EXPECT_TRUE(compressor_block_complete(255, c128));
  EXPECT_EQ(c4.num_slots(), 8);
  EXPECT_EQ(c4.slot_floats(), 2 * 2 * 8);
  EXPECT_EQ(c128.num_slots(), 128);
  std::vector<float> ring(static_cast<std::size_t>(c4.ring_floats()));
  for (std::size_t i = 0; i < ring.size(); ++i) ring[i] = static_cast<float>(i);
  compressor_shift(ring, c4);
  const std::size_t half = ring.size() / 2;
  for (std::size_t i = 0; i < half; ++i) EXPECT_EQ(ring[i], static_cast<float>(half + i));
}

}  // namespace
}  // namespace dsv4
