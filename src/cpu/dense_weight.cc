#include "cpu/dense_weight.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <utility>

#include "common/error.h"
#include "numerics/bf16.h"
#include "numerics/fp4_e2m1.h"
#include "numerics/fp8_e4m3.h"
#include "numerics/ue8m0.h"

namespace dsv4 {
namespace {

constexpr std::int64_t kFp8Tile = 128;
constexpr std::int64_t kFp4Group = 32;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

std::string shape_str(const std::vector<std::int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

void check_bytes(const TensorView& v) {
  const std::int64_t n = v.numel();
  if (static_cast<std::int64_t>(v.bytes.size()) != n * static_cast<std::int64_t>(dtype_size(v.dtype))) {
    fail("tensor '{}': {} bytes for shape {} of {}", v.name, v.bytes.size(), shape_str(v.shape), dtype_name(v.dtype));
  }
}

void check_2d(const TensorView& v, std::int64_t rows, std::int64_t cols, const char* what) {
  if (v.shape.size() != 2 || v.shape[0] != rows || v.shape[1] != cols) {
    fail("tensor '{}': {} shape {}, expected [{}, {}]", v.name, what, shape_str(v.shape), rows, cols);
  }
}

template <typename T>
T load_le(const std::uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));  // little-endian hosts only (as the safetensors reader)
  return value;
}

// Scale values as fp32, from F8_E8M0 bytes or F32 values; rejects NaN (0xff) and non-positive.
std::vector<float> read_scales(const TensorView& scale) {
  check_bytes(scale);
  const auto n = static_cast<std::size_t>(scale.numel());
  std::vector<float> s(n);
  if (scale.dtype == DType::kF8E8M0) {
    for (std::size_t i = 0; i < n; ++i) {
      if (scale.bytes[i] == 0xff) fail("tensor '{}': UE8M0 scale {} is 0xff (NaN)", scale.name, i);
      s[i] = ue8m0_to_f32(scale.bytes[i]);
    }
  } else if (scale.dtype == DType::kF32) {
    for (std::size_t i = 0; i < n; ++i) {
      s[i] = load_le<float>(scale.bytes.data() + 4 * i);
      if (!(s[i] > 0.0f) || !std::isfinite(s[i])) fail("tensor '{}': scale {} is {}", scale.name, i, s[i]);
    }
  } else {
    fail("tensor '{}': scale dtype {}, expected F8_E8M0 or F32", scale.name, dtype_name(scale.dtype));
  }
  return s;
}

DenseWeight load_fp8(const TensorView& weight, const TensorView& scale) {
  if (weight.shape.size() != 2)
    fail("tensor '{}': FP8 weight shape {} is not 2-D", weight.name, shape_str(weight.shape));
  check_bytes(weight);
  const std::int64_t out = weight.shape[0], in = weight.shape[1];
  check_2d(scale, ceil_div(out, kFp8Tile), ceil_div(in, kFp8Tile), "FP8 block scale");
  const std::vector<float> s = read_scales(scale);
  DenseWeight dw{weight.name, out, in, WeightKind::kFp8, std::vector<float>(static_cast<std::size_t>(out * in)), {}};
  const std::int64_t tile_cols = ceil_div(in, kFp8Tile);
  for (std::int64_t o = 0; o < out; ++o) {
    for (std::int64_t i = 0; i < in; ++i) {
      const auto k = static_cast<std::size_t>(o * in + i);
      const float sc = s[static_cast<std::size_t>((o / kFp8Tile) * tile_cols + i / kFp8Tile)];
      dw.w[k] = e4m3_to_f32(weight.bytes[k]) * sc;
    }
  }
  pack_dense_weight(dw);
  return dw;
}

DenseWeight load_fp4(const TensorView& weight, const TensorView& scale) {
  if (weight.shape.size() != 2)
    fail("tensor '{}': FP4 weight shape {} is not 2-D", weight.name, shape_str(weight.shape));
  check_bytes(weight);
  const std::int64_t out = weight.shape[0], in = weight.shape[1] * 2;
  if (in % kFp4Group != 0) {
    fail("tensor '{}': packed FP4 shape {} gives {} inputs, not a multiple of 32", weight.name, shape_str(weight.shape),
         in);
  }
  check_2d(scale, out, in / kFp4Group, "FP4 scale");
  const std::vector<float> s = read_scales(scale);
  DenseWeight dw{weight.name, out, in, WeightKind::kFp4, std::vector<float>(static_cast<std::size_t>(out * in)), {}};
  for (std::int64_t o = 0; o < out; ++o) {
    for (std::int64_t i = 0; i < in; ++i) {
      const std::uint8_t byte = weight.bytes[static_cast<std::size_t>((o * in + i) / 2)];
      const std::uint8_t code = (i % 2 == 0) ? (byte & 0xf) : (byte >> 4);
      const float sc = s[static_cast<std::size_t>(o * (in / kFp4Group) + i / kFp4Group)];
      dw.w[static_cast<std::size_t>(o * in + i)] = e2m1_to_f32(code) * sc;
    }
  }
  pack_dense_weight(dw);
  return dw;
}

}  // namespace

std::string_view weight_kind_name(WeightKind kind) {
  switch (kind) {
    case WeightKind::kFp8:
      return "fp8";
    case WeightKind::kFp4:
      return "fp4";
    case WeightKind::kBf16:
      return "bf16";
    case WeightKind::kF32:
      return "f32";
  }
  return "?";
}

float f16_bits_to_f32(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exp = (bits >> 10) & 0x1fu;
  const std::uint32_t mant = bits & 0x3ffu;
  float mag;
  if (exp == 0) {
    mag = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal: mant * 2^-24
  } else if (exp == 31) {
    mag = mant == 0 ? INFINITY : NAN;
  } else {
    mag = std::bit_cast<float>(((exp + 112u) << 23) | (mant << 13));
  }
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(mag) | sign);
}

std::vector<float> read_float_tensor(const TensorView& view) {
  check_bytes(view);
  const auto n = static_cast<std::size_t>(view.numel());
  std::vector<float> v(n);
  const std::uint8_t* p = view.bytes.data();
  switch (view.dtype) {
    case DType::kF32:
      for (std::size_t i = 0; i < n; ++i) v[i] = load_le<float>(p + 4 * i);
      break;
    case DType::kBF16:
      for (std::size_t i = 0; i < n; ++i) v[i] = bf16_bits_to_f32(load_le<std::uint16_t>(p + 2 * i));
      break;
    case DType::kF16:
      for (std::size_t i = 0; i < n; ++i) v[i] = f16_bits_to_f32(load_le<std::uint16_t>(p + 2 * i));
      break;
    default:
      fail("tensor '{}': dtype {} is not a float dtype (F32, BF16, F16)", view.name, dtype_name(view.dtype));
  }
  return v;
}

std::vector<float> read_float_tensor(const TensorView& view, std::span<const std::int64_t> shape) {
  if (!std::equal(view.shape.begin(), view.shape.end(), shape.begin(), shape.end())) {
    fail("tensor '{}': shape {}, expected [{}]", view.name, shape_str(view.shape), fmt::join(shape, ", "));
  }
  return read_float_tensor(view);
}

DenseWeight load_dense_weight(const TensorView& weight, const TensorView* scale) {
  const bool quantized = weight.dtype == DType::kF8E4M3 || weight.dtype == DType::kI8 || weight.dtype == DType::kU8;
  if (quantized && scale == nullptr) {
    fail("tensor '{}': {} weight without a scale tensor", weight.name, dtype_name(weight.dtype));
  }
  if (!quantized && scale != nullptr) {
    fail("tensor '{}': {} weight with a scale tensor '{}'", weight.name, dtype_name(weight.dtype), scale->name);
  }
  if (weight.dtype == DType::kF8E4M3) return load_fp8(weight, *scale);
  if (quantized) return load_fp4(weight, *scale);
  if (!dtype_is_float(weight.dtype)) {
    fail("tensor '{}': dtype {} is not a weight dtype (F8_E4M3, I8/U8 packed FP4, BF16, F32, F16)", weight.name,
         dtype_name(weight.dtype));
  }
  if (weight.shape.size() != 2) fail("tensor '{}': weight shape {} is not 2-D", weight.name, shape_str(weight.shape));
  DenseWeight dw;
  dw.name = weight.name;
  dw.out = weight.shape[0];
  dw.in = weight.shape[1];
  dw.kind = weight.dtype == DType::kBF16 ? WeightKind::kBf16 : WeightKind::kF32;
  dw.w = read_float_tensor(weight);
  pack_dense_weight(dw);
  return dw;
}

DenseWeight load_dense_weight(const TensorView& weight, const TensorView* scale, std::int64_t out, std::int64_t in) {
  DenseWeight dw = load_dense_weight(weight, scale);
  if (dw.out != out || dw.in != in) {
    fail("tensor '{}': logical weight shape [{}, {}] (stored {} {}), expected [{}, {}]", weight.name, dw.out, dw.in,
         dtype_name(weight.dtype), shape_str(weight.shape), out, in);
  }
  return dw;
}

DenseWeight make_dense_weight(std::string name, std::int64_t out, std::int64_t in, WeightKind kind,
                              std::vector<float> values) {
  if (out < 0 || in < 0 || static_cast<std::int64_t>(values.size()) != out * in) {
    fail("weight '{}': {} values for shape [{}, {}]", name, values.size(), out, in);
  }
  if (kind != WeightKind::kF32) {
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (!std::isfinite(values[i]) || round_to_bf16(values[i]) != values[i]) {
        fail("weight '{}': value {} ({}) is not a finite bf16 value, as a {} weight must be", name, i, values[i],
             weight_kind_name(kind));
      }
    }
  }
  DenseWeight dw{std::move(name), out, in, kind, std::move(values), {}};
  pack_dense_weight(dw);
  return dw;
}

std::vector<float> packed_weight_layout(std::span<const float> w, std::int64_t out, std::int64_t in) {
  constexpr std::int64_t T = DenseWeight::kPackTile;
  if (out < 0 || in < 0 || static_cast<std::int64_t>(w.size()) != out * in) {
    fail("packed_weight_layout: {} values for shape [{}, {}]", w.size(), out, in);
  }
  std::vector<float> p(DenseWeight::packed_size(out, in), 0.0f);
  for (std::int64_t o = 0; o < out; ++o) {
    const float* src = w.data() + o * in;
    float* dst = p.data() + (o / T) * in * T + o % T;
    for (std::int64_t i = 0; i < in; ++i) dst[i * T] = src[i];
  }
  return p;
}

void pack_dense_weight(DenseWeight& weight) { weight.packed = packed_weight_layout(weight.w, weight.out, weight.in); }

void round_weight_to_bf16(DenseWeight& weight) {
  for (float& v : weight.w) v = round_to_bf16(v);
  weight.kind = WeightKind::kBf16;
  pack_dense_weight(weight);
}

}  // namespace dsv4
