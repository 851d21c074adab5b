// Attention of one query token over an explicit key list, with a per-head sink (SPEC.md 3.2
// steps 4-5, 5, 5a; DeepSeek-V4 inference/kernel.py sparse_attn_kernel).
//
// q [H, d] and the K key/value vectors (K = V, d values each) hold bf16 values. Per head h:
//   s_i  = fp32(q_h . kv_i) * scale          (sequential fp32 dot over d; scale = d^-0.5 in fp32)
//   m    = max_i s_i
//   p_i  = exp(s_i - m)                      (fp32)
//   den  = (sum_i p_i, in key order) + exp(sink_h - m)
//   acc  = sum_i bf16(p_i) * kv_i            (fp32, in key order)
//   o_h  = bf16(acc / den)
// This is the reference kernel's arithmetic -- unnormalized exponentials rounded to bf16 before
// the P.V product, the fp32 exponentials (not rounded) in the denominator, the sink only in the
// denominator, one division at the end -- with the final maximum taken up front instead of the
// kernel's running maximum over blocks of 64 keys (identical whenever the first block holds the
// maximum). Keys are used in the order given; duplicates count twice; nothing is masked.
// With no keys the output is zero. The output is NOT inverse-rotated (the caller does SPEC 3.2
// step 5 with RopeTable::apply_heads(..., inverse=true) and rounds to bf16).
#pragma once

#include <cstdint>
#include <span>

#include "common/thread_pool.h"

namespace dsv4 {

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
