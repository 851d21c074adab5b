// Power-of-two block scales (SPEC.md 5), block quantize / simulate, and the 128x128 FP8 and
// 1x32 FP4 weight layouts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "common/error.h"
#include "numerics/block_quant.h"
#include "numerics/fp4_e2m1.h"
#include "numerics/fp8_e4m3.h"
#include "numerics/ue8m0.h"

namespace dsv4 {
namespace {

constexpr QuantFormat kFp8 = QuantFormat::kFp8E4m3;
constexpr QuantFormat kFp4 = QuantFormat::kFp4E2m1;
constexpr float kInf = std::numeric_limits<float>::infinity();

// Independent statement of the rule: p = fp32(max(amax, floor) * fp32(1/max)); the scale is
// the smallest power of two >= p, found with frexp (p = m * 2^e, m in [0.5, 1)).
float expected_scale(float amax, float fmt_max, float floor_value) {
  const float inv = 1.0f / fmt_max;
  volatile float p = std::max(amax, floor_value) * inv;  // one fp32 rounding
  int e = 0;
  const float m = std::frexp(static_cast<float>(p), &e);
  return m == 0.5f ? std::ldexp(1.0f, e - 1) : std::ldexp(1.0f, e);
}

// Half an ulp of the format at |v| (v = x / scale, |v| <= fmt max).
double half_ulp(double v, QuantFormat format) {
  const double a = std::fabs(v);
  const int min_exp = format == kFp8 ? -6 : 0;
  const int mant_bits = format == kFp8 ? 3 : 1;
  int e = min_exp;
  if (a > 0) e = std::max(min_exp, static_cast<int>(std::floor(std::log2(a))));
  return std::ldexp(0.5, e - mant_bits);
}

// Random non-zero data; every block gets its own magnitude 2^[lo, hi].
std::vector<float> random_blocks(std::size_t n, std::size_t block, int lo, int hi, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> mag(lo, hi);
  std::vector<float> x(n);
  for (std::size_t b = 0; b < n; b += block) {
    const int e = mag(rng);
    for (std::size_t i = b; i < b + block && i < n; ++i) {
      float v = 0.0f;
      while (v == 0.0f) v = std::ldexp(normal(rng), e);
      x[i] = v;
    }
  }
  return x;
}

// ---------------------------------------------------------------- scale rule

TEST(Pow2BlockScale, FormatConstants) {
  EXPECT_EQ(quant_format_max(kFp8), 448.0f);
  EXPECT_EQ(quant_format_max(kFp4), 6.0f);
  EXPECT_EQ(quant_amax_floor(kFp8), 1e-4f);
  EXPECT_EQ(quant_amax_floor(kFp4), 6.0f * 0x1p-126f);
}

TEST(Pow2BlockScale, Fp8ExactPowersAndJustAbove) {
  // amax = 448 * 2^k: scale exactly 2^k; one fp32 step above: 2^(k+1); one step below: 2^k.
  for (int k = -22; k <= 119; ++k) {
    const float amax = std::ldexp(448.0f, k);
    EXPECT_EQ(pow2_block_scale(amax, kFp8), std::ldexp(1.0f, k)) << k;
    if (k < 119) {
      EXPECT_EQ(pow2_block_scale(std::nextafter(amax, kInf), kFp8), std::ldexp(1.0f, k + 1)) << k;
    }
    if (k > -22) {
      EXPECT_EQ(pow2_block_scale(std::nextafter(amax, 0.0f), kFp8), std::ldexp(1.0f, k)) << k;
    }
  }
  EXPECT_EQ(pow2_block_scale(448.0f, kFp8), 1.0f);
  EXPECT_EQ(pow2_block_scale(449.0f, kFp8), 2.0f);
  EXPECT_EQ(pow2_block_scale(224.0f, kFp8), 0.5f);
  EXPECT_EQ(pow2_block_scale(300.0f, kFp8), 1.0f);
}

TEST(Pow2BlockScale, Fp4ExactPowersAndJustAbove) {
  for (int k = -126; k <= 124; ++k) {
    const float amax = std::ldexp(6.0f, k);
    EXPECT_EQ(pow2_block_scale(amax, kFp4), std::ldexp(1.0f, k)) << k;
    EXPECT_EQ(pow2_block_scale(std::nextafter(amax, kInf), kFp4), std::ldexp(1.0f, k + 1)) << k;
    if (k > -126) {
      EXPECT_EQ(pow2_block_scale(std::nextafter(amax, 0.0f), kFp4), std::ldexp(1.0f, k)) << k;
    }
  }
  EXPECT_EQ(pow2_block_scale(6.0f, kFp4), 1.0f);
  EXPECT_EQ(pow2_block_scale(6.5f, kFp4), 2.0f);
  EXPECT_EQ(pow2_block_scale(3.0f, kFp4), 0.5f);
  EXPECT_EQ(pow2_block_scale(4.0f, kFp4), 1.0f);
}

TEST(Pow2BlockScale, AmaxFloor) {
  // FP8: fp32(1e-4) * fp32(1/448) = 2.23e-7, in (2^-23, 2^-22]: scale 2^-22 at and below the
  // floor, and up to amax = 448 * 2^-22 = 1.068e-4.
  for (float amax : {0.0f, 1e-30f, 1e-6f, 5e-5f, 1e-4f, 1.05e-4f, 448.0f * 0x1p-22f}) {
    EXPECT_EQ(pow2_block_scale(amax, kFp8), 0x1p-22f) << amax;
  }
  EXPECT_EQ(pow2_block_scale(std::nextafter(448.0f * 0x1p-22f, kInf), kFp8), 0x1p-21f);
  // FP4: floor 6 * 2^-126 gives exactly 2^-126.
  for (float amax : {0.0f, std::numeric_limits<float>::denorm_min(), 1e-40f, 0x1p-126f, 6.0f * 0x1p-126f}) {
    EXPECT_EQ(pow2_block_scale(amax, kFp4), 0x1p-126f) << amax;
  }
  EXPECT_EQ(pow2_block_scale(std::nextafter(6.0f * 0x1p-126f, kInf), kFp4), 0x1p-125f);
}

TEST(Pow2BlockScale, LargestAmax) {
  const float big = std::numeric_limits<float>::max();
  EXPECT_EQ(pow2_block_scale(big, kFp8), expected_scale(big, 448.0f, 1e-4f));
  EXPECT_EQ(pow2_block_scale(big, kFp4), 0x1p126f);
  EXPECT_THROW(pow2_block_scale(kInf, kFp8), std::invalid_argument);
  EXPECT_THROW(pow2_block_scale(std::numeric_limits<float>::quiet_NaN(), kFp4), std::invalid_argument);
  EXPECT_THROW(pow2_block_scale(-1.0f, kFp8), std::invalid_argument);
}

TEST(Pow2BlockScale, BruteForceAgainstFrexpFormula) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-140, 120);
  std::uniform_int_distribution<std::uint32_t> bits(0, 0x7f7fffffu);  // any finite positive
  for (int t = 0; t < 200000; ++t) {
    const float amax = (t % 2 == 0) ? std::ldexp(mant(rng), expo(rng)) : std::bit_cast<float>(bits(rng));
    for (QuantFormat f : {kFp8, kFp4}) {
      const float fmax = quant_format_max(f);
      const float s = pow2_block_scale(amax, f);
      ASSERT_EQ(s, expected_scale(amax, fmax, quant_amax_floor(f))) << amax;
      // And it is (up to the one fp32 rounding of the product) 2^ceil(log2(amax / max)).
      const double ratio = std::max<double>(amax, quant_amax_floor(f)) / fmax;
      ASSERT_GE(s, ratio * (1 - 0x1p-23)) << amax;
      ASSERT_LT(s, 2 * ratio * (1 + 0x1p-23)) << amax;
    }
  }
}

// ---------------------------------------------------------------- blocks

class BlockQuant : public ::testing::TestWithParam<std::tuple<QuantFormat, std::size_t>> {};

TEST_P(BlockQuant, RandomDataWithinHalfUlpAndSimulateMatches) {
  const auto [format, block] = GetParam();
  const std::size_t n = block * 97;
  // Magnitudes from far below the amax floor (FP8: 2^-30) to large.
  const std::vector<float> x = random_blocks(n, block, -30, 40, static_cast<std::uint32_t>(block) + 7);
  std::vector<std::uint8_t> codes(n);
  std::vector<float> scales(n / block);
  quantize_blocks(x, block, format, codes, scales);
  std::vector<float> sim = x;
  simulate_quant_blocks(sim, block, format);

  const float fmax = quant_format_max(format);
  for (std::size_t b = 0; b < n / block; ++b) {
    float amax = 0;
    for (std::size_t i = b * block; i < (b + 1) * block; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float s = scales[b];
    ASSERT_EQ(s, expected_scale(amax, fmax, quant_amax_floor(format))) << b;
    for (std::size_t i = b * block; i < (b + 1) * block; ++i) {
      const float dec = quant_decode(codes[i], format);
      ASSERT_FALSE(std::isnan(dec));
      if (format == kFp4) {
        ASSERT_LT(codes[i], 16);
      }
      const double v = static_cast<double>(x[i]) / s;
      ASSERT_LE(std::fabs(v), fmax) << i;
      const double err = std::fabs(static_cast<double>(dec) - v);
      ASSERT_LE(err, half_ulp(v, format)) << "element " << i << " x " << x[i] << " scale " << s;
      ASSERT_EQ(std::signbit(dec), std::signbit(x[i])) << i;
      ASSERT_EQ(sim[i], dec * s) << i;  // simulate == dequantize(quantize)
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, BlockQuant,
                         ::testing::Combine(::testing::Values(QuantFormat::kFp8E4m3, QuantFormat::kFp4E2m1),
                                            ::testing::Values(std::size_t{32}, std::size_t{64}, std::size_t{128})));

TEST(BlockQuantFixed, KnownBlock) {
  // FP8, block 4: amax 896 -> scale 2; 300/2 = 150 -> 144 or 160? e4m3 step at 128..256 is 16:
  // 150 -> 144. 1/2 = 0.5 exact. -896/2 = -448.
  const std::vector<float> x = {896.0f, 300.0f, 1.0f, -896.0f};
  std::vector<std::uint8_t> codes(4);
  std::vector<float> scales(1);
  quantize_blocks(x, 4, kFp8, codes, scales);
  EXPECT_EQ(scales[0], 2.0f);
  EXPECT_EQ(e4m3_to_f32(codes[0]), 448.0f);
  EXPECT_EQ(e4m3_to_f32(codes[1]), 144.0f);
  EXPECT_EQ(e4m3_to_f32(codes[2]), 0.5f);
  EXPECT_EQ(e4m3_to_f32(codes[3]), -448.0f);
  // FP4, block 4: amax 12 -> scale 2; 5/2 = 2.5 -> 2 (tie to even); 7/2 = 3.5 -> 4 (tie);
  // 0.2/2 = 0.1 -> 0.
  std::vector<float> y = {12.0f, 5.0f, -7.0f, 0.2f};
  quantize_blocks(y, 4, kFp4, codes, scales);
  EXPECT_EQ(scales[0], 2.0f);
  EXPECT_EQ(e2m1_to_f32(codes[0]), 6.0f);
  EXPECT_EQ(e2m1_to_f32(codes[1]), 2.0f);
  EXPECT_EQ(e2m1_to_f32(codes[2]), -4.0f);
  EXPECT_EQ(e2m1_to_f32(codes[3]), 0.0f);
  simulate_quant_blocks(y, 4, kFp4);
  EXPECT_EQ(y, (std::vector<float>{12.0f, 4.0f, -8.0f, 0.0f}));
}

TEST(BlockQuantFixed, ExactValuesAreKept) {
  // Values already on the grid of their block's scale survive simulate unchanged.
  std::mt19937 rng(5);
  for (QuantFormat f : {kFp8, kFp4}) {
    const std::uint8_t max_code = f == kFp8 ? 0x7e : 0x7;
    std::uniform_int_distribution<int> code(0, f == kFp8 ? 0xfe : 0xf);
    std::vector<float> x(64 * 8);
    for (std::size_t b = 0; b < 8; ++b) {
      const float s = std::ldexp(1.0f, static_cast<int>(b) * 5 - 12);
      for (std::size_t i = 0; i < 64; ++i) {
        int c = code(rng);
        if ((c & 0x7f) == 0x7f) c = 0;
        x[b * 64 + i] = quant_decode(static_cast<std::uint8_t>(c), f) * s;
      }
      x[b * 64 + 3] = quant_decode(max_code, f) * s;  // amax = fmt_max * s
    }
    std::vector<float> y = x;
    simulate_quant_blocks(y, 64, f);
    EXPECT_EQ(y, x);
  }
}

TEST(BlockQuantFixed, RejectsBadArguments) {
  std::vector<float> x(64, 1.0f);
  std::vector<std::uint8_t> codes(64);
  std::vector<float> scales(2);
  EXPECT_THROW(quantize_blocks(x, 0, kFp8, codes, scales), std::invalid_argument);
  EXPECT_THROW(quantize_blocks(x, 48, kFp8, codes, scales), std::invalid_argument);
  EXPECT_THROW(quantize_blocks(x, 32, kFp8, codes, std::span<float>(scales.data(), 1)), std::invalid_argument);
  EXPECT_THROW(quantize_blocks(x, 32, kFp8, std::span<std::uint8_t>(codes.data(), 63), scales),
               std::invalid_argument);
  EXPECT_THROW(simulate_quant_blocks(x, 48, kFp4), std::invalid_argument);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(quantize_blocks(x, 32, kFp8, codes, scales), std::invalid_argument);
  x[5] = kInf;
  EXPECT_THROW(simulate_quant_blocks(x, 32, kFp4), std::invalid_argument);
}

// ---------------------------------------------------------------- weights

float tile_amax(const std::vector<float>& w, std::size_t cols, std::size_t r0, std::size_t r1,
                std::size_t c0, std::size_t c1) {
  float amax = 0;
  for (std::size_t r = r0; r < r1; ++r)
    for (std::size_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
  return amax;
}

TEST(WeightFp8, RoundTripWithEdgeTiles) {
  const std::size_t rows = 300, cols = 200;  // edge tiles: 44 rows, 72 cols
  const std::size_t tr = 3, tc = 2;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(rows * cols);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < cols; ++c) {
      // Tiles get different magnitudes; the bottom-right edge tile is tiny.
      float mag = std::ldexp(1.0f, static_cast<int>((r / 128) * 3 + (c / 128) * 7) - 6);
      if (r >= 256 && c >= 128) mag = 1e-3f;
      float v = 0;
      while (v == 0) v = normal(rng) * mag;
      w[r * cols + c] = v;
    }
  }
  std::vector<std::uint8_t> codes(rows * cols), scales(tr * tc);
  quantize_weight_fp8_128x128(w.data(), rows, cols, codes.data(), scales.data());
  std::vector<float> back(rows * cols);
  dequantize_weight_fp8_128x128(codes.data(), scales.data(), rows, cols, back.data());

  for (std::size_t i = 0; i < tr; ++i) {
    for (std::size_t j = 0; j < tc; ++j) {
      const float amax = tile_amax(w, cols, i * 128, std::min(rows, i * 128 + 128), j * 128,
                                   std::min(cols, j * 128 + 128));
      EXPECT_EQ(ue8m0_to_f32(scales[i * tc + j]), expected_scale(amax, 448.0f, 1e-4f)) << i << "," << j;
    }
  }
  EXPECT_LT(ue8m0_to_f32(scales[2 * tc + 1]), ue8m0_to_f32(scales[2 * tc + 0]));
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < cols; ++c) {
      const float s = ue8m0_to_f32(scales[(r / 128) * tc + c / 128]);
      const std::size_t i = r * cols + c;
      ASSERT_EQ(back[i], e4m3_to_f32(codes[i]) * s);
      const double v = static_cast<double>(w[i]) / s;
      ASSERT_LE(std::fabs(back[i] / s - v), half_ulp(v, kFp8)) << r << "," << c;
    }
  }
}

TEST(WeightFp8, ExactGridSurvives) {
  const std::size_t rows = 130, cols = 257;
  const std::size_t tc = 3;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> code(0, 0xfe);
  std::vector<float> w(rows * cols);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < cols; ++c) {
      int k = code(rng);
      if ((k & 0x7f) == 0x7f) k = 0x7e;
      if (r % 128 == 1 && c % 128 == 0) k = 0xfe;  // every tile reaches -448 * s
      const float s = std::ldexp(1.0f, static_cast<int>((r / 128) * tc + c / 128) - 3);
      w[r * cols + c] = e4m3_to_f32(static_cast<std::uint8_t>(k)) * s;
    }
  }
  std::vector<std::uint8_t> codes(rows * cols), scales(2 * tc);
  quantize_weight_fp8_128x128(w.data(), rows, cols, codes.data(), scales.data());
  for (std::size_t t = 0; t < 2 * tc; ++t) EXPECT_EQ(scales[t], 127 - 3 + t) << t;
  std::vector<float> back(rows * cols);
  dequantize_weight_fp8_128x128(codes.data(), scales.data(), rows, cols, back.data());
  EXPECT_EQ(back, w);
}

TEST(WeightFp4, RoundTripAndPacking) {
  const std::size_t rows = 5, cols = 96;
  const std::size_t groups = cols / 32;
  std::vector<float> w = random_blocks(rows * cols, 32, -10, 10, 99);
  std::vector<std::uint8_t> packed(rows * cols / 2), scales(rows * groups);
  quantize_weight_fp4_1x32(w.data(), rows, cols, packed.data(), scales.data());
  std::vector<float> back(rows * cols);
  dequantize_weight_fp4_1x32(packed.data(), scales.data(), rows, cols, back.data());
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t g = 0; g < groups; ++g) {
      const float amax = tile_amax(w, cols, r, r + 1, g * 32, g * 32 + 32);
      const float s = ue8m0_to_f32(scales[r * groups + g]);
      ASSERT_EQ(s, expected_scale(amax, 6.0f, 6.0f * 0x1p-126f));
      for (std::size_t c = g * 32; c < g * 32 + 32; ++c) {
        const std::size_t i = r * cols + c;
        const std::uint8_t code = (c % 2 == 0) ? (packed[i / 2] & 0xf) : (packed[i / 2] >> 4);
        // Low nibble = even element: the code must be the encoding of this very element.
        ASSERT_EQ(code, f32_to_e2m1(std::clamp(w[i] / s, -6.0f, 6.0f))) << r << "," << c;
        ASSERT_EQ(back[i], e2m1_to_f32(code) * s);
        const double v = static_cast<double>(w[i]) / s;
        ASSERT_LE(std::fabs(back[i] / s - v), half_ulp(v, kFp4)) << r << "," << c;
      }
    }
  }
}

TEST(WeightFp4, ExactGridSurvives) {
  const std::size_t rows = 3, cols = 64;
  std::mt19937 rng(8);
  std::uniform_int_distribution<int> code(0, 15);
  std::vector<float> w(rows * cols);
  for (std::size_t i = 0; i < w.size(); ++i) {
    const float s = std::ldexp(1.0f, static_cast<int>(i / 32) * 2 - 5);
    w[i] = e2m1_to_f32(static_cast<std::uint8_t>(i % 32 == 7 ? 0xf : code(rng))) * s;  // -6 * s in each group
  }
  std::vector<std::uint8_t> packed(rows * cols / 2), scales(rows * 2);
  quantize_weight_fp4_1x32(w.data(), rows, cols, packed.data(), scales.data());
  for (std::size_t g = 0; g < scales.size(); ++g) EXPECT_EQ(scales[g], 127 - 5 + 2 * g);
  std::vector<float> back(w.size());
  dequantize_weight_fp4_1x32(packed.data(), scales.data(), rows, cols, back.data());
  EXPECT_EQ(back, w);
}

TEST(WeightQuant, RejectsBadArguments) {
  std::vector<float> w(64 * 3, 1.0f);
  std::vector<std::uint8_t> out(64 * 3), scales(8);
  EXPECT_THROW(quantize_weight_fp4_1x32(w.data(), 3, 48, out.data(), scales.data()), std::invalid_argument);
  EXPECT_THROW(dequantize_weight_fp4_1x32(out.data(), scales.data(), 3, 48, w.data()), std::invalid_argument);
  EXPECT_THROW(quantize_weight_fp8_128x128(nullptr, 3, 64, out.data(), scales.data()), std::invalid_argument);
  EXPECT_NO_THROW(quantize_weight_fp8_128x128(nullptr, 0, 64, nullptr, nullptr));
  std::vector<std::uint8_t> bad_scale = {127, 0xff};
  std::vector<std::uint8_t> codes(3 * 64, 0x38);
  EXPECT_THROW(dequantize_weight_fp4_1x32(codes.data(), bad_scale.data(), 1, 64, w.data()), Error);
  EXPECT_THROW(dequantize_weight_fp8_128x128(codes.data(), bad_scale.data() + 1, 1, 64, w.data()), Error);
}

}  // namespace
}  // namespace dsv4
