// FP8 e4m3 (the "fn" variant: exponent bias 7, no infinities, max 448, NaN = S.1111.111).
// Encoding saturates to +-448 and rounds to nearest even; subnormals are kept (min 2^-9).
// The sign of zero is kept (-0 -> 0x80).
#pragma once

#include <cstdint>

namespace dsv4 {

inline constexpr float kFp8E4m3Max = 448.0f;

std::uint8_t f32_to_e4m3(float x);  // NaN -> 0x7f; |x| > 448 (and inf) -> +-448
float e4m3_to_f32(std::uint8_t code);  // 0x7f and 0xff decode to NaN

}  // namespace dsv4
