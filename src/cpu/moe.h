// Mixture-of-experts feed-forward of one token (SPEC.md 3.5, 5a; DeepSeek-V4 inference/model.py
// Gate, Expert, MoE).
//
//   moe_gate_scores: logits = gate . x (linear_f32: fp32 on the bf16-valued x);
//                    s_e = sqrt(softplus(logits_e)), softplus(z) = z > 20 ? z : log1p(exp(z)) (fp32).
//   moe_route_scores: the top_k experts by s_e + bias_e (ties: lower expert id wins);
//   moe_route_hash:   the experts tid2eid[token] gives (hash layers), in that order;
//                    both: weight_k = fp32(fp32(s_k / sum_k s_k) * routed_scaling_factor), with the
//                    chosen s WITHOUT the bias, summed in routing order.
//   expert_forward:  g = linear(w1, x), u = linear(w3, x) (FP8 activations, bf16 outputs); in
//                    fp32: h = silu(min(g, limit)) * clamp(u, -limit, limit) (no clamp when
//                    limit <= 0), silu(z) = z / (1 + exp(-z)); h = route_weight * h; then
//                    linear(w2, bf16(h)) -> bf16. Note the asymmetry: the gate branch is clamped
//                    from above only, the up branch on both sides.
//   moe_forward:     y = bf16( (sum of routed expert outputs, in ascending expert id, fp32)
//                    + shared expert output (weight 1) ).
// Size mismatches and bad expert ids throw std::invalid_argument.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/thread_pool.h"
#include "cpu/dense_weight.h"

namespace dsv4 {

struct MoeParams {
  std::int64_t n_routed_experts = 0;
  std::int64_t top_k = 0;  // num_experts_per_tok
  float routed_scaling_factor = 1.0f;
  float swiglu_limit = 0.0f;  // <= 0: no clamp
};

struct MoeRouting {
  std::vector<std::int64_t> experts;  // top_k expert ids
  std::vector<float> weights;         // top_k routing weights
};

struct ExpertWeights {
  const DenseWeight* w1 = nullptr;  // [I, D]
  const DenseWeight* w2 = nullptr;  // [D, I]
  const DenseWeight* w3 = nullptr;  // [I, D]
};

// x [D] -> scores [E] (s = sqrt(softplus(gate . x))).
void moe_gate_scores(std::span<const float> x, const DenseWeight& gate, std::span<float> scores,
                     ThreadPool* pool = nullptr);
MoeRouting moe_route_scores(std::span<const float> scores, std::span<const float> bias, const MoeParams& params);
MoeRouting moe_route_hash(std::span<const float> scores, std::span<const std::int64_t> expert_ids,
                          const MoeParams& params);

// In place: h = route_weight * silu(min(g, limit)) * clamp(u, -limit, limit), fp32 (h may alias g).
void swiglu_clamped(std::span<const float> gate, std::span<const float> up, float limit, float route_weight,
                    std::span<float> h);

// x [D] -> out [D] (bf16), one expert with its routing weight.
void expert_forward(std::span<const float> x, const ExpertWeights& expert, float route_weight, float swiglu_limit,
                    std::span<float> out, ThreadPool* pool = nullptr);

// experts [n_routed_experts] (only the routed ones are read), shared -> out [D].
void moe_forward(std::span<const float> x, const MoeRouting& routing, std::span<const ExpertWeights> experts,
                 const ExpertWeights& shared, const MoeParams& params, std::span<float> out,
                 ThreadPool* pool = nullptr);

}  // namespace dsv4
