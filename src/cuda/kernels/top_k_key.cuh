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

// A token's top-k workspace (ints) with S segments: sel[4], then kTopKSegmentInts a segment.
//   sel[0]  B1, the high byte of the k-th largest key; sel[1] how many keys of B1 are still needed
//   sel[2]  the threshold T, the k-th largest key (B1 B2); sel[3] how many keys equal to T to take
//   segment s: ge[257] (ge[b]: the segment's keys of B1 whose low byte is b or more; ge[256] = 0),
//   above (its keys above B1), base (where its selections start in the list), eq_before (keys
//   equal to T in the segments before it)
inline constexpr int kTopKSel = 4;
inline constexpr int kTopKSegmentInts = 257 + 3;
inline constexpr int kTopKAbove = 257, kTopKBase = 258, kTopKEqBefore = 259;
__host__ __device__ constexpr std::int64_t top_k_work_ints_per_token(int segments) {
  return kTopKSel + static_cast<std::int64_t>(segments) * kTopKSegmentInts;
}

// A token's rows of IndexerArgs::key_counts: two rows of 256 counts and an arrival count, the
// first for the keys' high bytes (the first radix pass), the second for the low bytes of the keys
// in B1 (the second). Zero between calls: the last CTA of a pass to add its counts reads its row,
// picks, and zeroes it.
inline constexpr int kKeyCountRow = 257;
inline constexpr int kKeyCountInts = 2 * kKeyCountRow;

// Adds the CTA's histogram `hist` (shared memory, 256 bins) to a key-count row (global: 256
// counts, then the arrival count) and tells every thread whether this CTA is the last of `ctas` to
// do so; the last CTA then sees every CTA's counts (and whatever each stored before it arrived).
// Every thread calls it; `flag` is an int of shared memory. (Thread 0's fence after the barrier is
// cumulative: it orders the CTA's count atomics and stores before its arrival.)
__device__ __forceinline__ bool add_counts_and_arrive(const int* hist, int* row, int ctas, int* flag) {
  __syncthreads();  // the CTA's histogram (and its other stores) complete
  for (int b = static_cast<int>(threadIdx.x); b < 256; b += static_cast<int>(blockDim.x))
    if (hist[b] != 0) atomicAdd(&row[b], hist[b]);
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    *flag = atomicAdd(&row[256], 1) == ctas - 1 ? 1 : 0;
  }
  __syncthreads();
  const bool last = *flag != 0;
  if (last) __threadfence();
  return last;
}

// Zeroes a key-count row (its counts and arrival count) for the next call: the last CTA, after
// every read of the row.
__device__ __forceinline__ void clear_key_count_row(int* row) {
  for (int b = static_cast<int>(threadIdx.x); b < kKeyCountRow; b += static_cast<int>(blockDim.x)) row[b] = 0;
}

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

// pick_high_bin over a key-count row that other CTAs added to with atomics (read at L2). One warp.
__device__ __forceinline__ void pick_high_bin_of_row(const int* row, int need, int& bin, int& still) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  int c[8];
  DSV4_UNROLL
  for (int u = 0; u < 8; ++u) c[u] = __ldcg(row + 255 - 8 * lane - u);
  pick_high_bin(c, need, bin, still);
}

// The first radix pass's end, in the last CTA of a token to add its counts to `row` (the first
// key-count row): B1 and how many keys of B1 are still needed into sel[0..1], and the row
// cleared. Every thread of the CTA calls it.
__device__ __forceinline__ void finish_first_pass(int* row, int top_k, int* sel) {
  if (threadIdx.x < 32) {
    int bin = 0, still = 0;
    pick_high_bin_of_row(row, top_k, bin, still);
    if (threadIdx.x == 0) {
      sel[0] = bin;
      sel[1] = still;
    }
  }
  __syncthreads();  // (warp 0 has read the row)
  clear_key_count_row(row);
}

}  // namespace dsv4::gpu
