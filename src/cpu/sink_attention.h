// Attention of one query token over an explicit key list, with a per-head sink (SPEC.md 3.2
// steps 4-5, 5, 5a; DeepSeek-V4 inference/kernel.py sparse_attn_kernel).
//
// q [H, d] and the K key/value vectors (K = V, d values each) hold bf16 values. Per head h, the
// keys in blocks of 64 (in the order given), with a running maximum as the reference kernel
// keeps it (online softmax):
//   s_i  = fp32(q_h . kv_i) * scale          (sequential fp32 dot over d; scale = d^-0.5 in fp32)
//   per block b: m' = max(m, max_{i in b} s_i); c = exp(m - m') (0 for the first block);
//     sum = sum * c + sum_{i in b} exp(s_i - m')              (fp32, unrounded exponentials)
//     acc = acc * c + sum_{i in b} bf16(exp(s_i - m')) * kv_i (fp32, in key order)
//     m = m'
//   o_h  = bf16(acc / (sum + exp(sink_h - m)))
// So the probabilities are rounded to bf16 relative to the running maximum of their block, as in
// the reference kernel (and the GPU kernel, cuda/kernels/attention.h), the fp32 exponentials
// (not rounded) form the denominator, the sink only enters the denominator, one division at the
// end. Keys are used in the order given; duplicates count twice; nothing is masked. With no keys
// the output is zero. The output is NOT inverse-rotated (the caller does SPEC 3.2 step 5 with
// RopeTable::apply_heads(..., inverse=true) and rounds to bf16).
#pragma once

#include <cstdint>
#include <span>

#include "common/thread_pool.h"

namespace dsv4 {

inline constexpr std::int64_t kAttentionKeyBlock = 64;  // keys per block of the running maximum

// float(1 / sqrt(head_dim)), computed in double like the reference's Python scalar.
float attention_softmax_scale(std::int64_t head_dim);

// q [n_heads * head_dim]; kv: K pointers to head_dim values each; sink [n_heads];
// out [n_heads * head_dim]. Parallel over heads when a pool is given (same result).
void sink_attention(std::span<const float> q, std::int64_t n_heads, std::int64_t head_dim,
                    std::span<const float* const> kv, std::span<const float> sink, float scale, std::span<float> out,
                    ThreadPool* pool = nullptr);

// The same with the keys contiguous: kv [K, head_dim].
void sink_attention(std::span<const float> q, std::int64_t n_heads, std::int64_t head_dim, std::span<const float> kv,
                    std::span<const float> sink, float scale, std::span<float> out, ThreadPool* pool = nullptr);

}  // namespace dsv4
