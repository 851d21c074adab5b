// What the indexer's scores kernel and its top-k share (indexer.cu, indexer_scores_e4m3.cu): the
// radix key of a bf16 score and where a token's first histogram lives in the top-k workspace.
#pragma once

#include <cstdint>

#include "cuda/device.h"

namespace dsv4::gpu {

// The 16-bit key of a bf16 score, ordered as the scores (NaN ranks as -inf, as top_k_indices;
// -0 ties with +0).
__device__ __forceinline__ std::uint32_t score_key(float f) {
  std::uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) u = 0xff800000u;
  if ((u & 0x7fffffffu) == 0) u = 0;
  const std::uint32_t k = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return k >> 16;  // bf16 values: the low half is zero
}

// A token's top-k workspace (ints) with S segments: sel[4], hist0[S][256] (counts of the keys'
// high bytes: one row a segment, or row 0 alone when the scores kernel counted them),
// hist1[S][256], above[S].
__host__ __device__ constexpr std::int64_t top_k_work_ints_per_token(int segments) {
  return 4 + static_cast<std::int64_t>(segments) * (2 * 256 + 1);
}
inline constexpr int kTopKHist0 = 4;  // offset of hist0 in a token's workspace

}  // namespace dsv4::gpu
