#include "numerics/ue8m0.h"

#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

namespace dsv4 {

float ue8m0_to_f32(std::uint8_t e) {
  if (e == 0xff) return std::numeric_limits<float>::quiet_NaN();
  if (e == 0) return std::bit_cast<float>(0x00400000u);  // 2^-127, subnormal
  return std::bit_cast<float>(static_cast<std::uint32_t>(e) << 23);
}

std::uint8_t f32_to_ue8m0(float scale) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(scale);
  if (u == 0x00400000u) return 0;  // 2^-127
  const std::uint32_t exp = (u >> 23) & 0xff;
  const std::uint32_t mant = u & 0x7fffffu;
  if ((u >> 31) != 0 || exp == 0 || exp == 0xff || mant != 0) {
    throw std::invalid_argument(
        fmt::format("f32_to_ue8m0: {} is not a positive power of two in [2^-127, 2^127]", scale));
  }
  return static_cast<std::uint8_t>(exp);
}

}  // namespace dsv4
