// RMSNorm with the reference numerics (SPEC.md 3.2 step 1, 5a; DeepSeek-V4 inference/model.py
// RMSNorm and the per-head q normalisation in Attention.forward).
//
// rms_norm (attn_norm, ffn_norm, q_norm, kv_norm, compressor norms, final norm, enorm/hnorm):
//   x is the bf16 input held as fp32. In fp32: ms = blocked_dot(x, x, n, 128) / n (blocks of
//   128 summed left to right, block sums left to right: the order the GPU reproduces exactly);
//   r = 1 / sqrt(ms + eps); y_k = bf16(w_k * (x_k * r))   -- the reference's
//   `(weight * (x * rsqrt(var + eps))).to(bf16)` with the weight (a bf16 value) in fp32.
//
// head_rms_norm_bf16 (the weightless q head norm, `q *= rsqrt(q.square().mean(-1) + eps)` on a
// bf16 tensor, so every elementwise step rounds to bf16):
//   s_k = bf16(q_k * q_k); m = bf16((sum_k s_k, fp32 in the blocked order) / n); a = bf16(m + eps);
//   r = bf16(1 / sqrt(a)); q_k = bf16(q_k * r).
// Both work row by row (one row = one token or one head), so results never depend on batching.
#pragma once

#include <cstdint>
#include <span>

namespace dsv4 {

// x [rows, n], weight [n], out [rows, n] (out may alias x). Throws std::invalid_argument on sizes.
void rms_norm(std::span<const float> x, std::int64_t rows, std::span<const float> weight, float eps,
              std::span<float> out);

// In place on consecutive heads of head_dim values (q.size() a multiple of head_dim).
void head_rms_norm_bf16(std::span<float> q, std::int64_t head_dim, float eps);

}  // namespace dsv4
