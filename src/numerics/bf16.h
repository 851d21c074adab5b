// bfloat16: the top 16 bits of an IEEE float32. Conversion rounds to nearest even and
// keeps NaN a (quiet) NaN. SPEC.md section 5a says where the reference rounds to bf16.
#pragma once

#include <bit>
#include <cstdint>

namespace dsv4 {

inline std::uint16_t f32_to_bf16_bits(float x) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

inline float bf16_bits_to_f32(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

// x rounded to the nearest bf16 value, returned as float.
inline float round_to_bf16(float x) { return bf16_bits_to_f32(f32_to_bf16_bits(x)); }

}  // namespace dsv4
