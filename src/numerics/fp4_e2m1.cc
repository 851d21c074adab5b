#include "numerics/fp4_e2m1.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "numerics/minifloat.h"

namespace dsv4 {
namespace {

constexpr float kE2m1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

}  // namespace

std::uint8_t f32_to_e2m1(float x) {
  if (std::isnan(x)) return 0x7;
  const std::uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  const float a = std::fabs(x);
  if (a >= kFp4E2m1Max) return sign | 0x7;  // saturate (inf included)
  return static_cast<std::uint8_t>(sign | detail::round_to_minifloat<1, 0>(a));
}

float e2m1_to_f32(std::uint8_t code) { return kE2m1Values[code & 0xf]; }

void pack_e2m1(std::span<const std::uint8_t> codes, std::span<std::uint8_t> packed) {
  if (codes.size() % 2 != 0 || packed.size() != codes.size() / 2) {
    throw std::invalid_argument("pack_e2m1: need an even number of codes and codes/2 packed bytes, got " +
                                std::to_string(codes.size()) + " codes and " +
                                std::to_string(packed.size()) + " bytes");
  }
  for (std::size_t i = 0; i < packed.size(); ++i) {
    const std::uint8_t lo = codes[2 * i];
    const std::uint8_t hi = codes[2 * i + 1];
    if ((lo | hi) > 0xf) {
      throw std::invalid_argument("pack_e2m1: code above 15 at index " + std::to_string(lo > 0xf ? 2 * i : 2 * i + 1));
    }
    packed[i] = static_cast<std::uint8_t>(lo | (hi << 4));
  }
}

void unpack_e2m1(std::span<const std::uint8_t> packed, std::span<std::uint8_t> codes) {
  if (codes.size() != packed.size() * 2) {
    throw std::invalid_argument("unpack_e2m1: need 2 codes per packed byte, got " +
                                std::to_string(packed.size()) + " bytes and " +
                                std::to_string(codes.size()) + " codes");
  }
  for (std::size_t i = 0; i < packed.size(); ++i) {
    codes[2 * i] = packed[i] & 0xf;
    codes[2 * i + 1] = packed[i] >> 4;
  }
}

}  // namespace dsv4
