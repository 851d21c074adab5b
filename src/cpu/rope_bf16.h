// RoPE on bf16 tensors (SPEC.md 3.7, 5a: "RoPE and inverse RoPE rotate in fp32 and store bf16";
// DeepSeek-V4 inference/model.py apply_rotary_emb on a bf16 tensor): RopeTable rotates the last
// rope_dim dims of every head in fp32, then those dims are rounded to bf16; the other dims are
// untouched. Used for q, the window kv, compressor entries, the indexer q and (inverse = true)
// the attention output.
#pragma once

#include <cstdint>
#include <span>

#include "numerics/rope.h"

namespace dsv4 {

// x holds consecutive heads of head_dim values (head_dim >= rope.rope_dim()).
void rope_heads_bf16(std::span<float> x, std::int64_t head_dim, const RopeTable& rope, std::int64_t position,
                     bool inverse = false);

}  // namespace dsv4
