// What the indexer's scores kernel and its top-k share (indexer.cu, indexer_scores_e4m3.cu): the
// radix key of a bf16 score, the layout of the top-k workspace and of the scores kernel's key
// counts, and the pick of the bin that holds the k-th largest key.
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

// A token's top-k workspace (ints) with S segments: sel[4] (sel[0]: the high byte B1 of the k-th
// largest key, sel[1]: how many keys of B1 are still needed), hist0[S][256] (counts of the keys'
// high bytes, a segment a row; unused when the scores kernel counted them), hist1[S][256],
// above[S].
__host__ __device__ constexpr std::int64_t top_k_work_ints_per_token(int segments) {
  return 4 + static_cast<std::int64_t>(segments) * (2 * 256 + 1);
}
inline constexpr int kTopKHist0 = 4;  // offset of hist0 in a token's workspace

// A token's row of IndexerArgs::key_counts: the counts of its scores' high key bytes [256], then
// how many of its scores CTAs have added theirs. Zero between calls: the token's last CTA reads
// it, picks B1 into sel and zeroes it.
inline constexpr int kKeyCountInts = 257;

// The bin holding the `need`-th largest key among 256 bins of counts, and how many keys of it are
// still needed (`need` less the keys in the bins above). One warp, every lane gets the answer: lane
// l holds the counts of bins 255 - 8l - u (u = 0..7) in c[u]; a scan finds the lane whose bins hold
// the need-th key, and that lane walks its eight. Fewer than `need` keys in all: bin 0, all still
// needed (callers only ask when there are at least `need`).
__device__ __forceinline__ void pick_high_bin(const int (&c)[8], int need, int& bin, int& still) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  int sum = 0;
  DSV4_UNROLL
  for (int u = 0; u < 8; ++u) sum += c[u];
  int incl = sum;
  DSV4_UNROLL
  for (int d = 1; d < 32; d *= 2) {
    const int v = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += v;
  }
  int above = incl - sum, b = 0, left = need;
  const bool mine = above < need && incl >= need;
  if (mine) {
    DSV4_UNROLL
    for (int u = 0; u < 8; ++u) {
      if (above + c[u] >= need) {
        b = 255 - 8 * lane - u;
        left = need - above;
        break;
      }
      above += c[u];
    }
  }
  const unsigned who = __ballot_sync(0xffffffffu, mine);
  const int src = who != 0u ? __ffs(static_cast<int>(who)) - 1 : 0;
  bin = __shfl_sync(0xffffffffu, b, src);
  still = __shfl_sync(0xffffffffu, left, src);
  if (who == 0u) {
    bin = 0;
    still = need;
  }
}

}  // namespace dsv4::gpu
