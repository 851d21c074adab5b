#include "numerics/block_quant.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "common/error.h"
#include "numerics/fp4_e2m1.h"
#include "numerics/fp8_e4m3.h"
#include "numerics/ue8m0.h"

namespace dsv4 {
namespace {

constexpr std::size_t kFp8Tile = 128;
constexpr std::size_t kFp4Group = 32;

// fp32(1/fmt_max), as the kernels hold it (a Python float constant lowered to fp32).
float inv_format_max(QuantFormat format) {
  return format == QuantFormat::kFp8E4m3 ? 1.0f / kFp8E4m3Max : 1.0f / kFp4E2m1Max;
}

// Absolute maximum of a run of values; throws on NaN or inf.
float abs_max(const float* x, std::size_t n, const char* who) {
  float amax = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) {
      throw std::invalid_argument(fmt::format("{}: non-finite input value {}", who, x[i]));
    }
    amax = std::max(amax, std::fabs(x[i]));
  }
  return amax;
}

// The code of x / scale (clamped to +-fmt_max). The scale is a power of two in
// [2^-126, 2^126], so 1/scale is exact and x * (1/scale) equals x / scale bit for bit.
template <QuantFormat F>
inline std::uint8_t encode_scaled(float x, float inv_scale) {
  if constexpr (F == QuantFormat::kFp8E4m3) {
    return f32_to_e4m3(std::clamp(x * inv_scale, -kFp8E4m3Max, kFp8E4m3Max));
  } else {
    return f32_to_e2m1(std::clamp(x * inv_scale, -kFp4E2m1Max, kFp4E2m1Max));
  }
}

template <QuantFormat F>
void encode_run(const float* x, std::size_t n, float scale, std::uint8_t* codes) {
  const float inv = 1.0f / scale;
  for (std::size_t i = 0; i < n; ++i) codes[i] = encode_scaled<F>(x[i], inv);
}

template <QuantFormat F>
void simulate_run(float* x, std::size_t n, float scale) {
  const float inv = 1.0f / scale;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint8_t code = encode_scaled<F>(x[i], inv);
    x[i] = (F == QuantFormat::kFp8E4m3 ? e4m3_to_f32(code) : e2m1_to_f32(code)) * scale;
  }
}

void encode_run(QuantFormat f, const float* x, std::size_t n, float scale, std::uint8_t* codes) {
  if (f == QuantFormat::kFp8E4m3) {
    encode_run<QuantFormat::kFp8E4m3>(x, n, scale, codes);
  } else {
    encode_run<QuantFormat::kFp4E2m1>(x, n, scale, codes);
  }
}

void check_weight_args(const void* in, const void* out, const void* scales, std::size_t rows,
                       std::size_t cols, const char* who) {
  if (rows != 0 && cols != 0 && (in == nullptr || out == nullptr || scales == nullptr)) {
    throw std::invalid_argument(fmt::format("{}: null pointer for a {}x{} weight", who, rows, cols));
  }
}

float scale_from_byte(std::uint8_t e, const char* who, std::size_t index) {
  if (e == 0xff) fail("{}: UE8M0 scale {} is 0xff (NaN)", who, index);
  return ue8m0_to_f32(e);
}

}  // namespace

float quant_format_max(QuantFormat format) {
  return format == QuantFormat::kFp8E4m3 ? kFp8E4m3Max : kFp4E2m1Max;
}

float quant_amax_floor(QuantFormat format) {
  return format == QuantFormat::kFp8E4m3 ? 1e-4f : 6.0f * 0x1p-126f;
}

std::uint8_t quant_encode(float x, QuantFormat format) {
  return format == QuantFormat::kFp8E4m3 ? f32_to_e4m3(x) : f32_to_e2m1(x);
}

float quant_decode(std::uint8_t code, QuantFormat format) {
  return format == QuantFormat::kFp8E4m3 ? e4m3_to_f32(code) : e2m1_to_f32(code);
}

float pow2_block_scale(float amax, QuantFormat format) {
  if (!std::isfinite(amax) || amax < 0.0f) {
    throw std::invalid_argument(
        fmt::format("pow2_block_scale: amax must be finite and >= 0, got {}", amax));
  }
  const float p = std::max(amax, quant_amax_floor(format)) * inv_format_max(format);
  // p >= 2^-126 (normal) and <= FLT_MAX / 6 < 2^126, so the result is a normal power of two.
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(p);
  const std::uint32_t exp = (bits >> 23) & 0xff;
  const std::uint32_t mant = bits & 0x7fffffu;
  const std::uint32_t scale_exp = exp + (mant != 0 ? 1u : 0u);
  return std::bit_cast<float>(scale_exp << 23);
}

void quantize_blocks(std::span<const float> x, std::size_t block, QuantFormat format,
                     std::span<std::uint8_t> codes, std::span<float> scales) {
  if (block == 0 || x.size() % block != 0) {
    throw std::invalid_argument(fmt::format(
        "quantize_blocks: size {} is not a multiple of the block {}", x.size(), block));
  }
  const std::size_t nblocks = x.size() / block;
  if (codes.size() != x.size() || scales.size() != nblocks) {
    throw std::invalid_argument(fmt::format(
        "quantize_blocks: expected {} codes and {} scales, got {} and {}", x.size(), nblocks,
        codes.size(), scales.size()));
  }
  for (std::size_t b = 0; b < nblocks; ++b) {
    const float* xb = x.data() + b * block;
    const float scale = pow2_block_scale(abs_max(xb, block, "quantize_blocks"), format);
    scales[b] = scale;
    encode_run(format, xb, block, scale, codes.data() + b * block);
  }
}

void simulate_quant_blocks(std::span<float> x, std::size_t block, QuantFormat format) {
  if (block == 0 || x.size() % block != 0) {
    throw std::invalid_argument(fmt::format(
        "simulate_quant_blocks: size {} is not a multiple of the block {}", x.size(), block));
  }
  for (std::size_t start = 0; start < x.size(); start += block) {
    float* xb = x.data() + start;
    const float scale = pow2_block_scale(abs_max(xb, block, "simulate_quant_blocks"), format);
    if (format == QuantFormat::kFp8E4m3) {
      simulate_run<QuantFormat::kFp8E4m3>(xb, block, scale);
    } else {
      simulate_run<QuantFormat::kFp4E2m1>(xb, block, scale);
    }
  }
}

void quantize_weight_fp8_128x128(const float* w, std::size_t rows, std::size_t cols,
                                 std::uint8_t* codes, std::uint8_t* ue8m0_scales) {
  constexpr const char* kWho = "quantize_weight_fp8_128x128";
  check_weight_args(w, codes, ue8m0_scales, rows, cols, kWho);
  const std::size_t tile_cols = (cols + kFp8Tile - 1) / kFp8Tile;
  for (std::size_t r0 = 0; r0 < rows; r0 += kFp8Tile) {
    const std::size_t r1 = std::min(rows, r0 + kFp8Tile);
    for (std::size_t c0 = 0; c0 < cols; c0 += kFp8Tile) {
      const std::size_t c1 = std::min(cols, c0 + kFp8Tile);
      float amax = 0.0f;
      for (std::size_t r = r0; r < r1; ++r) {
        amax = std::max(amax, abs_max(w + r * cols + c0, c1 - c0, kWho));
      }
      const float scale = pow2_block_scale(amax, QuantFormat::kFp8E4m3);
      ue8m0_scales[(r0 / kFp8Tile) * tile_cols + c0 / kFp8Tile] = f32_to_ue8m0(scale);
      for (std::size_t r = r0; r < r1; ++r) {
        encode_run<QuantFormat::kFp8E4m3>(w + r * cols + c0, c1 - c0, scale, codes + r * cols + c0);
      }
    }
  }
}

void quantize_weight_fp4_1x32(const float* w, std::size_t rows, std::size_t cols,
                              std::uint8_t* packed, std::uint8_t* ue8m0_scales) {
  constexpr const char* kWho = "quantize_weight_fp4_1x32";
  if (cols % kFp4Group != 0) {
    throw std::invalid_argument(fmt::format("{}: cols {} is not a multiple of 32", kWho, cols));
  }
  check_weight_args(w, packed, ue8m0_scales, rows, cols, kWho);
  std::uint8_t group_codes[kFp4Group];
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t g = 0; g < cols / kFp4Group; ++g) {
      const float* src = w + r * cols + g * kFp4Group;
      const float scale = pow2_block_scale(abs_max(src, kFp4Group, kWho), QuantFormat::kFp4E2m1);
      ue8m0_scales[r * (cols / kFp4Group) + g] = f32_to_ue8m0(scale);
      encode_run<QuantFormat::kFp4E2m1>(src, kFp4Group, scale, group_codes);
      pack_e2m1(group_codes, std::span<std::uint8_t>(packed + (r * cols + g * kFp4Group) / 2,
                                                     kFp4Group / 2));
    }
  }
}

void dequantize_weight_fp8_128x128(const std::uint8_t* codes, const std::uint8_t* ue8m0_scales,
                                   std::size_t rows, std::size_t cols, float* w) {
  constexpr const char* kWho = "dequantize_weight_fp8_128x128";
  check_weight_args(codes, w, ue8m0_scales, rows, cols, kWho);
  const std::size_t tile_cols = (cols + kFp8Tile - 1) / kFp8Tile;
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < cols; ++c) {
      const std::size_t s = (r / kFp8Tile) * tile_cols + c / kFp8Tile;
      w[r * cols + c] = e4m3_to_f32(codes[r * cols + c]) * scale_from_byte(ue8m0_scales[s], kWho, s);
    }
  }
}

void dequantize_weight_fp4_1x32(const std::uint8_t* packed, const std::uint8_t* ue8m0_scales,
                                std::size_t rows, std::size_t cols, float* w) {
  constexpr const char* kWho = "dequantize_weight_fp4_1x32";
  if (cols % kFp4Group != 0) {
    throw std::invalid_argument(fmt::format("{}: cols {} is not a multiple of 32", kWho, cols));
  }
  check_weight_args(packed, w, ue8m0_scales, rows, cols, kWho);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < cols; ++c) {
      const std::size_t i = r * cols + c;
      const std::uint8_t code = (c % 2 == 0) ? (packed[i / 2] & 0xf) : (packed[i / 2] >> 4);
      const std::size_t s = r * (cols / kFp4Group) + c / kFp4Group;
      w[i] = e2m1_to_f32(code) * scale_from_byte(ue8m0_scales[s], kWho, s);
    }
  }
}

}  // namespace dsv4
