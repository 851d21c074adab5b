#include "numerics/fp8_e4m3.h"

#include <array>
#include <cmath>
#include <limits>

#include "numerics/minifloat.h"

namespace dsv4 {
namespace {

constexpr std::array<float, 256> make_e4m3_table() {
  std::array<float, 256> t{};
  for (int code = 0; code < 256; ++code) {
    const int exp = (code >> 3) & 0xf;
    const int mant = code & 7;
    float mag = 0.0f;
    if (exp == 15 && mant == 7) {
      mag = std::numeric_limits<float>::quiet_NaN();
    } else {
      // exp 0: mant * 2^-9; otherwise (8 + mant) * 2^(exp - 10).
      mag = static_cast<float>(exp == 0 ? mant : 8 + mant);
      for (int i = 0; i < (exp == 0 ? 9 : 10 - exp); ++i) mag *= 0.5f;
      for (int i = 0; i < exp - 10; ++i) mag *= 2.0f;
    }
    t[static_cast<std::size_t>(code)] = (code & 0x80) ? -mag : mag;
  }
  return t;
}

constexpr std::array<float, 256> kE4m3Values = make_e4m3_table();

}  // namespace

std::uint8_t f32_to_e4m3(float x) {
  if (std::isnan(x)) return 0x7f;
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (a >= kFp8E4m3Max) return sign | 0x7e;  // saturate (inf included)
  return static_cast<std::uint8_t>(sign | detail::round_to_minifloat<3, -6>(a));
}

float e4m3_to_f32(std::uint8_t code) { return kE4m3Values[code]; }

}  // namespace dsv4
