// Internal helpers shared by the FP8 e4m3 and FP4 e2m1 codecs: round a non-negative fp32
// value to a small float format with round-to-nearest-even, by integer arithmetic on the bits
// (independent of the floating-point rounding mode). Not part of the public API.
#pragma once

#include <bit>
#include <cstdint>

namespace dsv4::detail {

// Magnitude code (exponent and mantissa fields, no sign) of `a` in a format with `kMantBits`
// mantissa bits whose smallest normal exponent is `kMinExp` (e4m3: 3, -6; e2m1: 1, 0).
// `a` must be finite, >= 0 (+0 only) and below the format's largest value rounded up, so the
// caller handles saturation and NaN. Carries from the mantissa move into the exponent.
template <int kMantBits, int kMinExp>
inline std::uint32_t round_to_minifloat(float a) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(a);
  const int biased = static_cast<int>(u >> 23);  // a >= 0: no sign bit
  const int e = biased - 127;
  if (e >= kMinExp) {
    // Normal in the target: keep kMantBits of the 23, rounding half to even.
    constexpr int kShift = 23 - kMantBits;
    const std::uint32_t r = u + ((1u << (kShift - 1)) - 1u) + ((u >> kShift) & 1u);
    return (r >> kShift) - (static_cast<std::uint32_t>(127 + kMinExp - 1) << kMantBits);
  }
  // Subnormal in the target: count quanta of 2^(kMinExp - kMantBits).
  const std::uint32_t sig = biased == 0 ? (u & 0x7fffffu) : ((u & 0x7fffffu) | 0x800000u);
  const int exp = biased == 0 ? -126 : e;
  const int k = 23 + kMinExp - kMantBits - exp;  // right shift from the 24-bit significand
  if (k > 24) return 0;                          // below half a quantum (sig < 2^24)
  const std::uint32_t q = sig >> k;
  const std::uint32_t rem = sig & ((1u << k) - 1u);
  const std::uint32_t half = 1u << (k - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

}  // namespace dsv4::detail
