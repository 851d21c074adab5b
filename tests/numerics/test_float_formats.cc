// bf16, FP8 e4m3fn, FP4 e2m1 and UE8M0 encodings: exhaustive round trips, ties to even,
// saturation and the subnormal edge.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "numerics/bf16.h"
#include "numerics/fp4_e2m1.h"
#include "numerics/fp8_e4m3.h"
#include "numerics/ue8m0.h"

namespace dsv4 {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

bool is_nan_bf16(std::uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x007f) != 0; }

// Independent encoder: the nearest of the format's positive values by exhaustive search (ties
// to the even code, i.e. the even mantissa), saturating above the largest; sign copied.
std::uint8_t nearest_code(float x, float (*decode)(std::uint8_t), int max_code, std::uint8_t sign_bit) {
  const double a = std::fabs(static_cast<double>(x));
  int best = 0;
  double best_d = a;
  for (int c = 1; c <= max_code; ++c) {
    const double d = std::fabs(a - decode(static_cast<std::uint8_t>(c)));
    if (d < best_d || (d == best_d && c % 2 == 0)) {
      best = c;
      best_d = d;
    }
  }
  if (a >= decode(static_cast<std::uint8_t>(max_code))) best = max_code;
  return static_cast<std::uint8_t>(best | (std::signbit(x) ? sign_bit : 0));
}

std::vector<float> random_floats(int n, int min_exp, int max_exp, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> expo(min_exp, max_exp);
  std::uniform_int_distribution<std::uint32_t> mant(0, 0x7fffff);
  std::uniform_int_distribution<int> coin(0, 3);
  std::vector<float> out;
  for (int i = 0; i < n; ++i) {
    std::uint32_t m = mant(rng);
    if (coin(rng) == 0) m &= 0x7f0000u;  // short mantissas: many exact ties and grid points
    const std::uint32_t bits = (static_cast<std::uint32_t>(expo(rng) + 127) << 23) | m |
                               (coin(rng) % 2 == 0 ? 0x80000000u : 0u);
    out.push_back(std::bit_cast<float>(bits));
  }
  return out;
}

// ---------------------------------------------------------------- bf16

TEST(Bf16, EveryNonNanPatternRoundTrips) {
  int checked = 0;
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    if (is_nan_bf16(bits)) continue;
    const float f = bf16_bits_to_f32(bits);
    ASSERT_EQ(f32_to_bf16_bits(f), bits) << std::hex << b;
    ASSERT_EQ(std::bit_cast<std::uint32_t>(f), b << 16);
    ++checked;
  }
  EXPECT_EQ(checked, 65536 - 2 * 127);
}

TEST(Bf16, NanStaysNan) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    if (!is_nan_bf16(bits)) continue;
    ASSERT_TRUE(std::isnan(bf16_bits_to_f32(bits)));
    ASSERT_TRUE(is_nan_bf16(f32_to_bf16_bits(bf16_bits_to_f32(bits))));
  }
  // fp32 NaNs whose payload lives only in the low 16 bits must not become infinities.
  for (std::uint32_t u : {0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7fffffffu, 0x7f80ffffu}) {
    const float f = std::bit_cast<float>(u);
    ASSERT_TRUE(std::isnan(f));
    EXPECT_TRUE(is_nan_bf16(f32_to_bf16_bits(f))) << std::hex << u;
    EXPECT_TRUE(std::isnan(round_to_bf16(f)));
  }
}

TEST(Bf16, TiesRoundToEven) {
  int ties = 0;
  for (std::uint32_t b = 0; b < 0x10000; b += 7) {
    const auto bits = static_cast<std::uint16_t>(b);
    if ((bits & 0x7f80) == 0x7f80) continue;  // inf/NaN
    if ((bits & 0x7fff) == 0x7f7f) continue;  // largest finite: its upper neighbour is inf
    const std::uint32_t base = b << 16;
    const auto up = static_cast<std::uint16_t>(b + 1);  // next magnitude, same sign
    const std::uint16_t even = (bits % 2 == 0) ? bits : up;
    EXPECT_EQ(f32_to_bf16_bits(std::bit_cast<float>(base | 0x8000u)), even) << std::hex << b;
    EXPECT_EQ(f32_to_bf16_bits(std::bit_cast<float>(base | 0x7fffu)), bits) << std::hex << b;
    EXPECT_EQ(f32_to_bf16_bits(std::bit_cast<float>(base | 0x8001u)), up) << std::hex << b;
    ++ties;
  }
  EXPECT_GT(ties, 9000);
  // Concrete: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: goes to 1 (even mantissa).
  EXPECT_EQ(round_to_bf16(1.0f + 0x1p-8f), 1.0f);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6: goes up.
  EXPECT_EQ(round_to_bf16(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);
}

TEST(Bf16, OverflowAndSubnormals) {
  EXPECT_EQ(f32_to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  EXPECT_EQ(f32_to_bf16_bits(-kInf), 0xff80);
  EXPECT_EQ(f32_to_bf16_bits(0x1p-133f), 0x0001);  // smallest bf16 subnormal
  EXPECT_EQ(f32_to_bf16_bits(0x1p-134f), 0x0000);  // tie to even (zero)
  EXPECT_EQ(f32_to_bf16_bits(3 * 0x1p-134f), 0x0002);  // tie between 1 and 2 -> 2
  EXPECT_EQ(f32_to_bf16_bits(-0.0f), 0x8000);
}

// ---------------------------------------------------------------- FP8 e4m3fn

TEST(Fp8E4m3, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    const float v = e4m3_to_f32(code);
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    ASSERT_FALSE(std::isnan(v)) << c;
    EXPECT_EQ(f32_to_e4m3(v), code) << c << " value " << v;
    EXPECT_EQ(std::signbit(v), c >= 0x80) << c;
  }
}

TEST(Fp8E4m3, KnownValues) {
  EXPECT_EQ(e4m3_to_f32(0x00), 0.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), 0x1p-9f);           // smallest subnormal
  EXPECT_EQ(e4m3_to_f32(0x07), 7 * 0x1p-9f);       // largest subnormal
  EXPECT_EQ(e4m3_to_f32(0x08), 0x1p-6f);           // smallest normal
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_f32(0x3c), 1.5f);
  EXPECT_EQ(e4m3_to_f32(0x78), 256.0f);
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(e4m3_to_f32(0xb8), -1.0f);
  EXPECT_TRUE(std::signbit(e4m3_to_f32(0x80)));
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_e4m3(0.0f), 0x00);
  // Strictly increasing over the positive codes.
  for (int c = 0; c < 0x7e; ++c) {
    EXPECT_LT(e4m3_to_f32(static_cast<std::uint8_t>(c)), e4m3_to_f32(static_cast<std::uint8_t>(c + 1)));
  }
}

TEST(Fp8E4m3, MidpointsRoundToEvenCode) {
  // Every pair of adjacent positive values, subnormal, across the subnormal/normal boundary
  // and normal: the exact midpoint goes to the even code (even mantissa), values just off the
  // midpoint go to the nearer neighbour. Same for negatives.
  for (int c = 0; c < 0x7e; ++c) {
    const auto lo = static_cast<std::uint8_t>(c);
    const auto hi = static_cast<std::uint8_t>(c + 1);
    const float a = e4m3_to_f32(lo);
    const float b = e4m3_to_f32(hi);
    const float mid = (a + b) / 2;  // exact in fp32
    ASSERT_GT(mid, a);
    ASSERT_LT(mid, b);
    const std::uint8_t even = (c % 2 == 0) ? lo : hi;
    EXPECT_EQ(f32_to_e4m3(mid), even) << "between codes " << c << " and " << c + 1;
    EXPECT_EQ(f32_to_e4m3(-mid), even | 0x80) << c;
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 0.0f)), lo) << c;
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, kInf)), hi) << c;
  }
  EXPECT_EQ(f32_to_e4m3(1.0f + 1.0f / 16), 0x38);  // between 1 and 1.125: to 1 (even)
  EXPECT_EQ(f32_to_e4m3(1.125f + 1.0f / 16), 0x3a);  // between 1.125 (odd) and 1.25
  EXPECT_EQ(f32_to_e4m3(7.5f * 0x1p-9f), 0x08);  // largest subnormal vs smallest normal
}

TEST(Fp8E4m3, MatchesExhaustiveNearestSearch) {
  for (float x : random_floats(100000, -13, 9, 42)) {
    ASSERT_EQ(f32_to_e4m3(x), nearest_code(x, e4m3_to_f32, 0x7e, 0x80)) << x;
  }
}

TEST(Fp8E4m3, SaturatesAboveMax) {
  for (float v : {448.0f, 449.0f, 464.0f, 480.0f, 512.0f, 1e6f, 3e38f, kInf}) {
    EXPECT_EQ(f32_to_e4m3(v), 0x7e) << v;
    EXPECT_EQ(f32_to_e4m3(-v), 0xfe) << v;
  }
  EXPECT_EQ(f32_to_e4m3(432.0f), 0x7e);   // midpoint 416/448: 448 has even mantissa (6)
  EXPECT_EQ(f32_to_e4m3(431.0f), 0x7d);   // 416
  EXPECT_EQ(f32_to_e4m3(kNaN), 0x7f);
  EXPECT_EQ(f32_to_e4m3(-kNaN), 0x7f);
}

TEST(Fp8E4m3, SmallestSubnormal) {
  EXPECT_EQ(f32_to_e4m3(0x1p-9f), 0x01);
  EXPECT_EQ(f32_to_e4m3(0x1p-10f), 0x00);                        // tie with zero -> zero
  EXPECT_EQ(f32_to_e4m3(-0x1p-10f), 0x80);                       // keeps the sign
  EXPECT_EQ(f32_to_e4m3(std::nextafter(0x1p-10f, 1.0f)), 0x01);  // just above half -> 2^-9
  EXPECT_EQ(f32_to_e4m3(1.5f * 0x1p-9f), 0x02);                  // tie between 1 and 2 -> 2
  EXPECT_EQ(f32_to_e4m3(1e-30f), 0x00);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
}

// ---------------------------------------------------------------- FP4 e2m1

TEST(Fp4E2m1, AllSixteenCodes) {
  const float expected[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    const float v = e2m1_to_f32(code);
    EXPECT_EQ(v, expected[c]) << c;
    EXPECT_EQ(std::signbit(v), c >= 8) << c;  // -0 is code 8
    EXPECT_EQ(f32_to_e2m1(v), code) << c;
    EXPECT_EQ(e2m1_to_f32(static_cast<std::uint8_t>(c | 0xf0)), v) << "high bits ignored";
  }
}

TEST(Fp4E2m1, MidpointsRoundToEvenCode) {
  for (int c = 0; c < 7; ++c) {
    const auto lo = static_cast<std::uint8_t>(c);
    const auto hi = static_cast<std::uint8_t>(c + 1);
    const float mid = (e2m1_to_f32(lo) + e2m1_to_f32(hi)) / 2;
    const std::uint8_t even = (c % 2 == 0) ? lo : hi;
    EXPECT_EQ(f32_to_e2m1(mid), even) << c;
    EXPECT_EQ(f32_to_e2m1(-mid), even | 0x8) << c;
    EXPECT_EQ(f32_to_e2m1(std::nextafter(mid, 0.0f)), lo) << c;
    EXPECT_EQ(f32_to_e2m1(std::nextafter(mid, kInf)), hi) << c;
  }
  // The same, spelled out.
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(0.25f)), 0.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(0.75f)), 1.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(1.25f)), 1.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(1.75f)), 2.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(2.5f)), 2.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(3.5f)), 4.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(5.0f)), 4.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(5.01f)), 6.0f);
}

TEST(Fp4E2m1, MatchesExhaustiveNearestSearch) {
  for (float x : random_floats(100000, -4, 3, 43)) {
    ASSERT_EQ(f32_to_e2m1(x), nearest_code(x, e2m1_to_f32, 0x7, 0x8)) << x;
  }
}

TEST(Fp4E2m1, SaturationAndSmallValues) {
  for (float v : {6.0f, 6.5f, 7.0f, 100.0f, 3e38f, kInf}) {
    EXPECT_EQ(f32_to_e2m1(v), 0x7) << v;
    EXPECT_EQ(f32_to_e2m1(-v), 0xf) << v;
  }
  EXPECT_EQ(f32_to_e2m1(kNaN), 0x7);
  EXPECT_EQ(f32_to_e2m1(0.25f), 0x0);  // half the smallest subnormal: tie -> 0
  EXPECT_EQ(f32_to_e2m1(-0.25f), 0x8);
  EXPECT_EQ(f32_to_e2m1(std::nextafter(0.25f, 1.0f)), 0x1);
  EXPECT_EQ(f32_to_e2m1(1e-30f), 0x0);
  EXPECT_EQ(f32_to_e2m1(-0.0f), 0x8);
}

TEST(Fp4E2m1, PackLowNibbleIsEvenElement) {
  const std::vector<std::uint8_t> codes = {0x1, 0x2, 0xf, 0x0, 0x7, 0x8};
  std::vector<std::uint8_t> packed(3);
  pack_e2m1(codes, packed);
  EXPECT_EQ(packed, (std::vector<std::uint8_t>{0x21, 0x0f, 0x87}));
  std::vector<std::uint8_t> back(6);
  unpack_e2m1(packed, back);
  EXPECT_EQ(back, codes);
  // Every byte value unpacks and repacks to itself.
  std::vector<std::uint8_t> all(256), two(512), again(256);
  for (int i = 0; i < 256; ++i) all[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i);
  unpack_e2m1(all, two);
  pack_e2m1(two, again);
  EXPECT_EQ(again, all);
}

TEST(Fp4E2m1, PackRejectsBadArguments) {
  std::vector<std::uint8_t> packed(2), codes3(3), codes4(4);
  EXPECT_THROW(pack_e2m1(codes3, packed), std::invalid_argument);
  EXPECT_THROW(pack_e2m1(codes4, std::span<std::uint8_t>(packed.data(), 1)), std::invalid_argument);
  codes4[3] = 16;
  EXPECT_THROW(pack_e2m1(codes4, packed), std::invalid_argument);
  EXPECT_THROW(unpack_e2m1(packed, codes3), std::invalid_argument);
}

// ---------------------------------------------------------------- UE8M0

TEST(Ue8m0, AllExponents) {
  for (int e = 0; e < 255; ++e) {
    const auto byte = static_cast<std::uint8_t>(e);
    const float v = ue8m0_to_f32(byte);
    EXPECT_EQ(v, std::ldexp(1.0f, e - 127)) << e;
    EXPECT_GT(v, 0.0f);
    EXPECT_EQ(f32_to_ue8m0(v), byte) << e;
  }
  EXPECT_EQ(ue8m0_to_f32(127), 1.0f);
  EXPECT_EQ(ue8m0_to_f32(0), 0x1p-127f);
  EXPECT_EQ(ue8m0_to_f32(254), 0x1p127f);
  EXPECT_TRUE(std::isnan(ue8m0_to_f32(255)));
}

TEST(Ue8m0, RejectsNonPowersOfTwo) {
  for (float v : {0.0f, -0.0f, -1.0f, 3.0f, 1.5f, 0x1p-128f, 0x1.8p-127f, kInf, kNaN,
                  std::numeric_limits<float>::denorm_min()}) {
    EXPECT_THROW(f32_to_ue8m0(v), std::invalid_argument) << v;
  }
}

}  // namespace
}  // namespace dsv4
