// The MoE feed-forward's kernels besides the expert products (SPEC.md 3.5, 5a). CPU twins:
// cpu/moe.h (moe_gate_scores, moe_route_scores, moe_route_hash, swiglu_clamped, moe_forward).
//
//   moe_gate         the gate's fp32 logits (the gate GEMM; at decode its k split into partials
//                    that moe_route adds).
//   moe_route        scores s = sqrt(softplus(gate logits)); experts from tid2eid[token] (hash
//                    layers) or the top-k of s + bias (ties to the lower id); weights = the
//                    chosen s (without bias) normalised in choice order, times the scaling factor.
//   moe_permute      groups the (token, choice) pairs by expert: permuted row i reads token
//                    source_row[i]; slot_of[t * k + c] is pair (t, c)'s permuted row; and the
//                    tile map the expert GEMMs run over (gemm.h ExpertTiles).
//   swiglu_quantize  h = weight * silu(min(g, limit)) * clamp(u, -limit, limit) in fp32 from the
//                    [rows][2 * inter] product (g then u), rounded to bf16 and quantized to e4m3
//                    in blocks of 128 for the w2 product.
//   moe_combine      out[t] = bf16(sum of the token's expert outputs in ascending expert id, in
//                    fp32, plus the shared expert's output).
#pragma once

#include <cstdint>

#include "cuda/device_step.h"
#include "cuda/kernels/gemm.h"
#include "cuda/stream_handle.h"

namespace dsv4::gpu {

// The gate's logits of `rows` rows of x (bf16 [rows][gate.k]) against the bf16 gate [experts][k]:
// at decode (path kAuto) its k split over CTAs into gemm_k_splits fp32 partials
// (gemm_bf16_k_partials), else one product (gemm_bf16). Returns the number of partials, for
// MoeRouteArgs::logit_splits, with split_stride rows * experts. `logits` holds
// moe_gate_logit_floats(rows, experts) floats; a buffer sized for the most rows serves fewer.
std::int64_t moe_gate_logit_floats(std::int64_t rows, std::int64_t experts);
int moe_gate(const std::uint16_t* x, std::int64_t rows, const DeviceWeight& gate, float* logits,
             const std::int32_t* rows_dev, GemmPath path, gpu_stream_t stream);

struct MoeRouteArgs {
  const DeviceStep* step = nullptr;
  std::int32_t capacity = 0;
  const float* logits = nullptr;       // [tokens][experts] fp32
  // The logits as the sum of `logit_splits` partials (gemm.h gemm_bf16_k_partials), partial p at
  // logits + p * split_stride, added in p order.
  std::int32_t logit_splits = 1;
  std::int64_t split_stride = 0;
  std::int32_t experts = 0, top_k = 0;
  float routed_scale = 1.0f;
  const float* bias = nullptr;         // score-routed layers
  const std::int32_t* tid2eid = nullptr;  // hash layers: [vocab][top_k]
  std::int32_t* route_expert = nullptr;   // [tokens][top_k]
  float* route_weight = nullptr;          // [tokens][top_k]
};
void moe_route(const MoeRouteArgs& args, gpu_stream_t stream);

struct MoePermuteArgs {
  const DeviceStep* step = nullptr;
  std::int32_t experts = 0, top_k = 0;
  const std::int32_t* route_expert = nullptr;
  const float* route_weight = nullptr;
  std::int32_t tile_m = 8;
  std::int32_t* source_row = nullptr;   // [tokens * top_k]
  std::int32_t* slot_of = nullptr;      // [tokens * top_k]
  float* slot_weight = nullptr;         // [tokens * top_k]
  std::int32_t* num_rows = nullptr;     // tokens * top_k of this step
  std::int32_t* tile_expert = nullptr;  // [max_tiles]
  std::int32_t* tile_row0 = nullptr;
  std::int32_t* tile_rows = nullptr;
  std::int32_t* num_tiles = nullptr;
  std::int32_t* expert_scratch = nullptr;  // [3 * experts] ints of workspace
};
void moe_permute(const MoePermuteArgs& args, gpu_stream_t stream);
// Expert tiles the permuted rows of `tokens * top_k` pairs need at most.
std::int32_t moe_max_tiles(std::int64_t tokens, std::int64_t top_k, std::int64_t experts, std::int32_t tile_m);

// gu [rows][2 * inter] bf16 -> codes [rows][inter], scales [rows][ceil(inter/128)]. row_weight
// (per row, fp32) may be null (weight 1, the shared expert).
void swiglu_quantize(const std::uint16_t* gu, std::int64_t rows, const std::int32_t* rows_dev, std::int64_t inter,
                     float limit, const float* row_weight, std::uint8_t* codes, float* scales, gpu_stream_t stream);

void moe_combine(const DeviceStep* step, std::int32_t capacity, std::int32_t top_k, const std::int32_t* route_expert,
                 const std::int32_t* slot_of, const std::uint16_t* y_routed, const std::uint16_t* y_shared,
                 std::int64_t dim, std::uint16_t* out, gpu_stream_t stream);

}  // namespace dsv4::gpu
