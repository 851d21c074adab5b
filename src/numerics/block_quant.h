// Block quantization with power-of-two (UE8M0) scales, exactly as the reference kernels
// compute it (SPEC.md section 5; kernel.py fast_round_scale):
//   p = fp32(max(amax, floor) * fp32(1/fmt_max)); scale = 2^(unbiased exponent of p), doubled
//   when p's mantissa bits are not zero (so scale = 2^ceil(log2(p)); exact powers of two stay);
//   q = round_to_format(clamp(x / scale, +-fmt_max)) with round-to-nearest-even.
// FP8 e4m3: fmt_max 448, amax floor 1e-4. FP4 e2m1: fmt_max 6, amax floor 6 * 2^-126.
// "Simulate" = quantize then dequantize in place (all in fp32; x / scale and code * scale are
// exact because the scale is a power of two).
// Bad sizes, null pointers with non-zero sizes, and non-finite inputs throw std::invalid_argument.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace dsv4 {

enum class QuantFormat { kFp8E4m3, kFp4E2m1 };

// 448 or 6.
float quant_format_max(QuantFormat format);
// The amax floor: fp32(1e-4) or 6 * 2^-126.
float quant_amax_floor(QuantFormat format);
// One value's code (e4m3 code, or e2m1 code 0..15) and back.
std::uint8_t quant_encode(float x, QuantFormat format);
float quant_decode(std::uint8_t code, QuantFormat format);

// The power-of-two scale for a block whose absolute maximum is `amax` (>= 0 and finite).
float pow2_block_scale(float amax, QuantFormat format);

// Quantizes x in consecutive blocks of `block` values (x.size() must be a multiple of block).
// codes: one byte per value (e4m3 code, or e2m1 code 0..15); scales: one per block.
void quantize_blocks(std::span<const float> x, std::size_t block, QuantFormat format,
                     std::span<std::uint8_t> codes, std::span<float> scales);

// In place: x <- dequantize(quantize(x)) per block of `block` values.
void simulate_quant_blocks(std::span<float> x, std::size_t block, QuantFormat format);

// Weight quantization for synthetic checkpoints, in the official layouts, with the same scale
// rule (FP8: amax floor 1e-4; FP4: 6 * 2^-126):
// FP8 [rows, cols] row-major with one UE8M0 scale per 128x128 tile
// (scales [ceil(rows/128), ceil(cols/128)] row-major); edge tiles use only their valid elements.
void quantize_weight_fp8_128x128(const float* w, std::size_t rows, std::size_t cols,
                                 std::uint8_t* codes, std::uint8_t* ue8m0_scales);
// FP4 [rows, cols] (cols a multiple of 32), packed [rows, cols/2] (low nibble = even column),
// one UE8M0 scale per 32 inputs of a row ([rows, cols/32]).
void quantize_weight_fp4_1x32(const float* w, std::size_t rows, std::size_t cols,
                              std::uint8_t* packed, std::uint8_t* ue8m0_scales);

// Inverses, for loading: value = decode(code) * scale. A scale byte of 0xff (NaN) throws
// dsv4::Error; NaN FP8 codes decode to NaN.
void dequantize_weight_fp8_128x128(const std::uint8_t* codes, const std::uint8_t* ue8m0_scales,
                                   std::size_t rows, std::size_t cols, float* w);
void dequantize_weight_fp4_1x32(const std::uint8_t* packed, const std::uint8_t* ue8m0_scales,
                                std::size_t rows, std::size_t cols, float* w);

}  // namespace dsv4
