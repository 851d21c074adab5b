// Sparse attention with the sink over the FP8 paged cache (SPEC.md 3.2 steps 3-5, 5, 7).
// CPU twins: cpu/sink_attention.h (sink_attention), numerics/rope.h (inverse RoPE) and the key
// sets of CpuExecutor::attention_layer.
//
// For every step token t at position p of row r, the keys are the window positions
// max(0, p - window + 1) .. p (window cache) followed by the compressed entries: CSA the
// indexer's top-k list, HCA every complete block j < (p + 1) / 128. All keys are read from their
// cache pages (fp8 entries dequantized to bf16 exactly, bf16 entries as stored); one softmax over
// them with the per-head sink in the denominator, probabilities rounded to bf16 before P.V, the
// output rounded to bf16, rotated back by the inverse RoPE at p, rounded again.
//
// A CTA takes one token, 64 heads and a share of the token's keys (split-K over `splits` CTAs
// when keys are many and tokens few: partial softmax states, merged by a combine kernel), 64 keys
// at a time, by three warpgroups: a producer resolves the keys' cache addresses chunks ahead,
// loads their raw fp8 entries into registers and dequantizes them into one of two bf16 key tiles
// in shared memory while two consumers compute on the other; Q.K^T and P.V are Hopper warpgroup
// mma (wgmma) products from shared memory, the consumers splitting the keys for Q.K^T and the
// output dims for P.V (attention.cu).
#pragma once

#include <cstdint>

#include "cuda/device_step.h"
#include "cuda/stream_handle.h"

namespace dsv4::gpu {

struct AttentionArgs {
  const DeviceStep* step = nullptr;
  std::int32_t capacity = 0;           // tokens the grid covers
  const std::uint16_t* q = nullptr;    // [tokens][heads][512] bf16 (finished: normed, rotated)
  std::int32_t heads = 0;
  const float* sink = nullptr;         // [heads]
  float scale = 0;                     // softmax scale (512^-0.5)
  std::int32_t window = 128;
  std::int32_t window_group = 0, window_layer_slot = 0;
  std::int32_t ratio = 0;              // 0, 4 (CSA) or 128 (HCA)
  std::int32_t compressed_group = 0, compressed_layer_slot = 0;
  const std::int32_t* top_idx = nullptr;    // CSA: [tokens][top_k]
  const std::int32_t* top_count = nullptr;  // CSA: [tokens]
  std::int32_t top_k = 0;
  bool kv_fp8 = true;
  bool compressed_rope = false;        // the layer's RoPE table for the inverse rotation
  std::uint16_t* out = nullptr;        // [tokens][heads][512] bf16
  // Split-K partial states (splits > 1): acc [splits][tokens][heads][512], max/sum [splits][tokens][heads][2].
  std::int32_t splits = 1;
  float* part_acc = nullptr;
  float* part_ml = nullptr;
};

// Keys of a token at most: window + max(top_k, complete c128 entries).
void sparse_attention(const AttentionArgs& args, gpu_stream_t stream);

// The split count worth using for `tokens` tokens with up to `max_keys` keys each (1 = none).
int attention_splits(std::int64_t tokens, std::int64_t heads, std::int64_t max_keys, int sm_count);

}  // namespace dsv4::gpu
