// Shared helpers for the CPU reference op tests: seeded random data, bf16 ulps, TensorViews
// over owned bytes, and synthetic quantized weights.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/dense_weight.h"
#include "model/safetensors.h"
#include "numerics/bf16.h"
#include "numerics/block_quant.h"

namespace dsv4::test {

inline std::vector<float> random_floats(std::mt19937& rng, std::size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) {
    do {
      x = dist(rng);
    } while (x == 0.0f);
  }
  return v;
}

inline std::vector<float> random_bf16(std::mt19937& rng, std::size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v = random_floats(rng, n, lo, hi);
  for (float& x : v) x = round_to_bf16(x);
  return v;
}

// The spacing of bf16 values at |x| (for x != 0): 2^(exponent - 7).
inline double bf16_ulp(double x) {
  if (x == 0.0) return std::ldexp(1.0, -133);
  int e = 0;
  std::frexp(x, &e);  // x = m * 2^e, m in [0.5, 1)
  return std::ldexp(1.0, e - 1 - 7);
}

// Owns the bytes a TensorView points at.
struct OwnedTensor {
  std::vector<std::uint8_t> bytes;
  TensorView view;
};

inline OwnedTensor make_tensor(std::string name, DType dtype, std::vector<std::int64_t> shape,
                               std::vector<std::uint8_t> bytes) {
  OwnedTensor t;
  t.bytes = std::move(bytes);
  t.view.name = std::move(name);
  t.view.dtype = dtype;
  t.view.shape = std::move(shape);
  t.view.bytes = std::span<const std::uint8_t>(t.bytes);
  return t;
}

inline std::vector<std::uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<std::uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

inline std::vector<std::uint8_t> bf16_bytes(const std::vector<float>& v) {
  std::vector<std::uint8_t> b(v.size() * 2);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::uint16_t bits = f32_to_bf16_bits(v[i]);
    std::memcpy(b.data() + 2 * i, &bits, 2);
  }
  return b;
}

// A random FP8 weight [out, in] (quantized then dequantized through the official layout).
inline DenseWeight random_fp8_weight(std::mt19937& rng, const std::string& name, std::int64_t out, std::int64_t in,
                                     float range = 0.5f) {
  const std::vector<float> w = random_floats(rng, static_cast<std::size_t>(out * in), -range, range);
  std::vector<std::uint8_t> codes(w.size());
  std::vector<std::uint8_t> scales(static_cast<std::size_t>(((out + 127) / 128) * ((in + 127) / 128)));
  quantize_weight_fp8_128x128(w.data(), static_cast<std::size_t>(out), static_cast<std::size_t>(in), codes.data(),
                              scales.data());
  std::vector<float> deq(w.size());
  dequantize_weight_fp8_128x128(codes.data(), scales.data(), static_cast<std::size_t>(out),
                                static_cast<std::size_t>(in), deq.data());
  return make_dense_weight(name, out, in, WeightKind::kFp8, std::move(deq));
}

// A random FP4 weight [out, in] (in a multiple of 32).
inline DenseWeight random_fp4_weight(std::mt19937& rng, const std::string& name, std::int64_t out, std::int64_t in,
                                     float range = 0.5f) {
  const std::vector<float> w = random_floats(rng, static_cast<std::size_t>(out * in), -range, range);
  std::vector<std::uint8_t> packed(w.size() / 2), scales(w.size() / 32);
  quantize_weight_fp4_1x32(w.data(), static_cast<std::size_t>(out), static_cast<std::size_t>(in), packed.data(),
                           scales.data());
  std::vector<float> deq(w.size());
  dequantize_weight_fp4_1x32(packed.data(), scales.data(), static_cast<std::size_t>(out), static_cast<std::size_t>(in),
                             deq.data());
  return make_dense_weight(name, out, in, WeightKind::kFp4, std::move(deq));
}

inline DenseWeight random_bf16_weight(std::mt19937& rng, const std::string& name, std::int64_t out, std::int64_t in,
                                      float range = 0.5f) {
  return make_dense_weight(name, out, in, WeightKind::kBf16,
                           random_bf16(rng, static_cast<std::size_t>(out * in), -range, range));
}

// Double-precision dot product.
inline double dot_d(const float* a, const float* b, std::int64_t n) {
  double s = 0;
  for (std::int64_t k = 0; k < n; ++k) s += static_cast<double>(a[k]) * b[k];
  return s;
}

// x is a finite value of the block-quantized format at `scale`: x / scale is a code's value.
inline bool representable(float x, float scale, QuantFormat format) {
  const float q = x / scale;
  return quant_decode(quant_encode(q, format), format) == q;
}

}  // namespace dsv4::test

namespace dsv4::test {

// Sum of |a_k * b_k|: the scale of the fp32 accumulation error of a dot product.
inline double dot_mag(const float* a, const float* b, std::int64_t n) {
  double s = 0;
  for (std::int64_t k = 0; k < n; ++k) s += std::fabs(static_cast<double>(a[k]) * b[k]);
  return s;
}

// A bf16 result of an fp32 computation of ref: one bf16 ulp, plus fp32 accumulation slack for
// sums of terms of total magnitude mag.
inline bool bf16_near(double got, double ref, double mag) { return std::fabs(got - ref) <= bf16_ulp(ref) + 4e-6 * mag; }

}  // namespace dsv4::test
