// UE8M0: an unsigned exponent-only byte, value 2^(e-127). Used for every block scale.
// 0xff is NaN in the format; we never produce it. (e = 0 is 2^-127, an fp32 subnormal.)
#pragma once

#include <cstdint>

namespace dsv4 {

float ue8m0_to_f32(std::uint8_t e);  // 0xff -> NaN
// `scale` must be a positive power of two in [2^-127, 2^127]; throws std::invalid_argument otherwise.
std::uint8_t f32_to_ue8m0(float scale);

}  // namespace dsv4
