// DenseWeight: a linear layer's weight dequantized exactly to fp32, for the CPU reference ops
// (SPEC.md section 2 for the stored formats, 5a for how each kind is used by linear.h).
//
// Stored formats accepted:
//   FP8:  F8_E4M3 [out, in] + scale [ceil(out/128), ceil(in/128)] (F8_E8M0 bytes, or F32 values)
//   FP4:  I8/U8 [out, in/2] packed e2m1 (low nibble = even element) + scale [out, in/32]
//         (F8_E8M0 or F32); in must be a multiple of 32
//   BF16: [out, in]                 -> kind kBf16
//   F32 / F16: [out, in]            -> kind kF32
// Dequantization is exact: an e4m3 or e2m1 value times a power-of-two scale is an fp32 (and a
// bf16) value. (F32 scales that are not powers of two are accepted; then each weight is one
// fp32 rounding of code * scale.) Layout: w[o * in + i], row-major, one row per output.
// `packed` is a second copy of the same values in the k-major tile layout the CPU GEMM kernels
// read (linear.h): output features in tiles of kPackTile, tile t stored as [in][kPackTile]
// (packed[(t * in + i) * kPackTile + j] = w[(t * kPackTile + j) * in + i]), the last tile padded
// with zeros (it doubles the weight's memory). Every function here that makes or changes a
// DenseWeight rebuilds it; code that edits `w` in place afterwards must call pack_dense_weight
// again (linear() packs on the fly, per call, when `packed` has the wrong size, but cannot see
// in-place edits of `w`).
// Shape or dtype problems throw dsv4::Error naming the tensor.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/safetensors.h"

namespace dsv4 {

enum class WeightKind { kFp8, kFp4, kBf16, kF32 };

std::string_view weight_kind_name(WeightKind kind);  // "fp8", "fp4", "bf16", "f32"

struct DenseWeight {
  std::string name;
  std::int64_t out = 0;
  std::int64_t in = 0;
  WeightKind kind = WeightKind::kF32;
  std::vector<float> w;         // [out, in]
  std::vector<float> packed{};  // [ceil(out / kPackTile), in, kPackTile]: see above

  static constexpr std::int64_t kPackTile = 16;
  static std::size_t packed_size(std::int64_t n_out, std::int64_t n_in) {
    return static_cast<std::size_t>((n_out + kPackTile - 1) / kPackTile * kPackTile * n_in);
  }
  // packed has the size of w's packed layout (its contents are not checked).
  bool has_packed() const {
    return packed.size() == packed_size(out, in) && w.size() == static_cast<std::size_t>(out * in);
  }

  std::span<const float> row(std::int64_t o) const {
    return std::span<const float>(w).subspan(static_cast<std::size_t>(o * in), static_cast<std::size_t>(in));
  }
};

// From stored tensors. `scale` is required for F8_E4M3 and I8/U8 weights and must be null for
// float weights. The overload with out/in also checks the logical shape ([out, in]).
DenseWeight load_dense_weight(const TensorView& weight, const TensorView* scale);
DenseWeight load_dense_weight(const TensorView& weight, const TensorView* scale, std::int64_t out, std::int64_t in);

// From values already in fp32 (tests, synthetic weights): checks values.size() == out * in and,
// for kinds fp8 / fp4 / bf16, that every value is a finite bf16 value (what such weights hold).
DenseWeight make_dense_weight(std::string name, std::int64_t out, std::int64_t in, WeightKind kind,
                              std::vector<float> values);

// (Re)builds weight.packed from weight.w.
void pack_dense_weight(DenseWeight& weight);
// The packed layout of w [out, in] (what pack_dense_weight stores).
std::vector<float> packed_weight_layout(std::span<const float> w, std::int64_t out, std::int64_t in);

// Rounds every value to bf16 and sets kind = kBf16: what the reference does when it loads an
// F32/F16-stored tensor into a bf16 parameter (e.g. a bf16 linear stored as F32).
void round_weight_to_bf16(DenseWeight& weight);

// Any float tensor (F32, BF16, F16) as numel fp32 values, in storage order. The overload with a
// shape also checks it. Other dtypes throw dsv4::Error.
std::vector<float> read_float_tensor(const TensorView& view);
std::vector<float> read_float_tensor(const TensorView& view, std::span<const std::int64_t> shape);

// IEEE half -> float (exact).
float f16_bits_to_f32(std::uint16_t bits);

}  // namespace dsv4
