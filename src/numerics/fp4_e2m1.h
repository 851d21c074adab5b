// FP4 e2m1: 1 sign, 2 exponent, 1 mantissa bit (exponent bias 1, no inf, no NaN);
// magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6. Codes are 4 bits (sign in bit 3), so +0 = 0x0 and
// -0 = 0x8. Encoding rounds to nearest even and saturates to +-6.
// Packed tensors hold two codes per byte: the low nibble is the even element.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace dsv4 {

inline constexpr float kFp4E2m1Max = 6.0f;

// Returns a code 0..15. |x| > 6 (and +-inf) -> +-6. The sign of zero is kept.
// The format has no NaN: a NaN input gives 0x7 (+6); callers never pass NaN.
std::uint8_t f32_to_e2m1(float x);
float e2m1_to_f32(std::uint8_t code);  // uses the low 4 bits

// Packs codes (one per byte, values 0..15) two per byte: packed[i] = codes[2i] | codes[2i+1] << 4.
// codes.size() must be even and packed.size() == codes.size() / 2; throws std::invalid_argument
// otherwise or when a code is above 15.
void pack_e2m1(std::span<const std::uint8_t> codes, std::span<std::uint8_t> packed);
// Unpacks packed.size()*2 codes; codes.size() must be packed.size() * 2.
void unpack_e2m1(std::span<const std::uint8_t> packed, std::span<std::uint8_t> codes);

}  // namespace dsv4
