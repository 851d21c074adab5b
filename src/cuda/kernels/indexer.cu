// Lightning indexer kernels (indexer.h).
#include "cuda/kernels/indexer.h"
#include "cuda/kernels/indexer_scores_e4m3.h"

#include <algorithm>
#include <cmath>

#include "cuda/kernels/launch_check.h"
#include "cuda/device.h"
#include "cuda/kernels/cache_access.cuh"
#include "cuda/kernels/dependent_launch.cuh"
#include "cuda/kernels/fragments.cuh"
#include "cuda/kernels/numerics.cuh"
#include "cuda/kernels/reduce.cuh"
#include "cuda/kernels/top_k_key.cuh"

namespace dsv4::gpu {
namespace {

constexpr int kDim = 128, kRopeDims = 64;
constexpr int kMaxHeads = 64;

// ---- query: RoPE, Hadamard, FP4 simulation (one block of 128 threads per token and head) ------
__global__ void __launch_bounds__(kDim) query_kernel(IndexerArgs a) {
  __shared__ float buf[kDim];
  const DeviceStep& st = *a.step;
  const int t = a.token0 + static_cast<int>(blockIdx.x);
  if (t >= st.n_tokens) return;
  const int c = threadIdx.x;
  std::uint16_t* q = a.q + (static_cast<std::int64_t>(t) * a.heads + blockIdx.y) * kDim;
  buf[c] = bf16_value(q[c]);
  __syncthreads();
  float v = buf[c];
  if (c >= kDim - kRopeDims) {
    const float* cs = st.rope_compressed + static_cast<std::int64_t>(t) * 2 * kRopeHalf;
    const int p0 = c & ~1, i = (p0 - (kDim - kRopeDims)) / 2;
    const float x0 = buf[p0], x1 = buf[p0 + 1], co = cs[i], si = cs[kRopeHalf + i];
    v = (c & 1) == 0 ? sub_rn(mul_rn(x0, co), mul_rn(x1, si)) : add_rn(mul_rn(x0, si), mul_rn(x1, co));
    v = round_bf16(v);
  }
  __syncthreads();
  buf[c] = v;
  __syncthreads();
  for (int h = 1; h < kDim; h *= 2) {
    if (c < kDim / 2) {
      const int i = (c / h) * 2 * h + (c % h);
      const float p = buf[i], r = buf[i + h];
      buf[i] = add_rn(p, r);
      buf[i + h] = sub_rn(p, r);
    }
    __syncthreads();
  }
  const float x = round_bf16(mul_rn(buf[c], static_cast<float>(1.0 / sqrt(static_cast<double>(kDim)))));
  const float scale = fp4_scale(warp_max(fabsf(x)));
  store_bf16(q + c, e2m1_value(fp4_encode_scaled(x, 1.0f / scale)) * scale);
}

// ---- scores of bf16 keys: a CTA per (token, share of its entry tiles); 4 warps of 16 heads, bf16
// mma (FP4 / FP8 keys: indexer_scores_e4m3.cu) -------------------------------------------------
// A tile is the 64 entries of one cache block (the indexer group holds 256 / 4 = 64 entries a
// block), so its bytes are one page's: 64 entries' data, then their scales, each contiguous. The
// CTA keeps its token's queries as mma fragments in registers, copies its next tile's raw bytes
// (cp.async, double-buffered) while decoding and scoring the current one, and reads the block ids
// and pages of the tiles after that ahead of their use.
constexpr int kTile = 64;
constexpr int kKeyRow = kDim + 8;          // bf16 row stride of decoded keys (ldmatrix, no conflicts)
constexpr int kRawTile = kTile * 2 * kDim;  // a tile of bf16 keys (16 KB; no scales)
constexpr int kScoreThreads = 128;
constexpr int kScoreSmem = 2 * kRawTile + kTile * kKeyRow * 2 + 4 * kTile * 4;

__global__ void __launch_bounds__(kScoreThreads) scores_kernel(IndexerArgs a, float weight_scale) {
  DSV4_DYNAMIC_SMEM(std::uint8_t, smem);
  std::uint8_t* raw = smem;                                                         // [2][kRawTile]
  std::uint16_t* ks = reinterpret_cast<std::uint16_t*>(smem + 2 * kRawTile);       // [kTile][kKeyRow]
  float* colsum = reinterpret_cast<float*>(ks + kTile * kKeyRow);                   // [4][kTile]
  __shared__ float wts[kMaxHeads];
  const DeviceStep& st = *a.step;
  const int i = blockIdx.y;
  const int t = a.token0 + i;
  if (t >= st.n_tokens) return;
  const std::int64_t n = (static_cast<std::int64_t>(st.positions[t]) + 1) / 4;
  const std::int64_t tiles = (n + kTile - 1) / kTile;
  if (static_cast<std::int64_t>(blockIdx.x) >= tiles) return;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
  const int row = st.token_row[t];
  const DeviceCacheGroup& kg = st.groups[a.key_group];
  DSV4_DEVICE_ASSERT(kg.entries_per_block == kTile && kg.data_bytes == 2 * kDim && kg.scale_bytes == 0);
  const std::int64_t table_base = kg.table_base[row];
  const std::int32_t table_begin = kg.table_start[row], table_end = kg.table_start[row + 1];
  const int layer_slot = a.layer_slot;

  // This warp's 16 heads as A fragments (rows past `heads` zero), the rows' weights.
  std::uint32_t qf[kDim / 16][4];
  {
    const int h0 = warp * 16 + g, h1 = h0 + 8;
    const std::uint16_t* q0 = a.q + (static_cast<std::int64_t>(t) * a.heads + h0) * kDim + tig * 2;
    const std::uint16_t* q1 = a.q + (static_cast<std::int64_t>(t) * a.heads + h1) * kDim + tig * 2;
    DSV4_UNROLL
    for (int kk = 0; kk < kDim / 16; ++kk) {
      qf[kk][0] = h0 < a.heads ? *reinterpret_cast<const std::uint32_t*>(q0 + kk * 16) : 0u;
      qf[kk][1] = h1 < a.heads ? *reinterpret_cast<const std::uint32_t*>(q1 + kk * 16) : 0u;
      qf[kk][2] = h0 < a.heads ? *reinterpret_cast<const std::uint32_t*>(q0 + kk * 16 + 8) : 0u;
      qf[kk][3] = h1 < a.heads ? *reinterpret_cast<const std::uint32_t*>(q1 + kk * 16 + 8) : 0u;
    }
  }
  if (tid < kMaxHeads) {
    wts[tid] = tid < a.heads ? round_bf16(bf16_value(a.weights[static_cast<std::int64_t>(t) * a.heads + tid]) * weight_scale)
                             : 0.0f;
  }

  // Tiles of this CTA: blockIdx.x, + gridDim.x, ...; the block id of tile b is read one tile
  // ahead of its page, the page one tile ahead of the copy.
  const std::int64_t stride = gridDim.x;
  auto block_of = [&](std::int64_t b) -> std::int32_t {
    const std::int64_t k = b - table_base;
    if (b >= tiles || k < 0 || table_begin + k >= table_end) return -1;
    return kg.block_ids[table_begin + k];
  };
  auto page_of = [&](std::int32_t block) -> std::int64_t {
    return block < 0 ? -1 : kg.page_table[static_cast<std::int64_t>(block) * kg.layers + layer_slot];
  };
  const std::uint8_t* nowhere = reinterpret_cast<const std::uint8_t*>(a.q);
  auto issue = [&](std::int64_t b, std::int64_t page, int buf) {
    if (b < tiles) {
      const bool ok = page >= 0;
      const std::uint8_t* src = kg.pool + (ok ? page : 0) * kg.page_bytes;
      std::uint8_t* dst = raw + buf * kRawTile;
      for (int u = tid; u < kRawTile / 16; u += kScoreThreads) cp_async_16_zfill(dst + u * 16, ok ? src + u * 16 : nowhere, ok);
    }
    cp_async_commit();
  };

  std::int64_t b = blockIdx.x;
  issue(b, page_of(block_of(b)), 0);
  std::int64_t page_next = page_of(block_of(b + stride));   // tile b + stride
  std::int32_t block_after = block_of(b + 2 * stride);        // tile b + 2 stride
  for (int it = 0; b < tiles; ++it, b += stride) {
    // Copy tile b + stride (its page was read one tile ago), read tile b + 2 stride's page (its
    // block id came one tile ago) and tile b + 3 stride's block id.
    issue(b + stride, page_next, (it + 1) & 1);
    page_next = page_of(block_after);
    block_after = block_of(b + 3 * stride);
    cp_async_wait<1>();
    __syncthreads();  // tile b's bytes visible; the previous tile's keys and sums no longer read

    // The tile's bf16 keys into rows of kKeyRow (ldmatrix without bank conflicts): 4 units of 32
    // dims per entry.
    const std::uint8_t* src = raw + (it & 1) * kRawTile;
    for (int u = tid; u < kTile * 4; u += kScoreThreads) {
      const int e = u >> 2, part = u & 3;
      uint4* dst = reinterpret_cast<uint4*>(ks + e * kKeyRow + part * 32);
      const uint4* v = reinterpret_cast<const uint4*>(src + e * 256 + part * 64);
      DSV4_UNROLL
      for (int j = 0; j < 4; ++j) dst[j] = v[j];
    }
    __syncthreads();

    // q . k for this warp's 16 heads and the tile's 64 entries.
    float acc[8][4];
    DSV4_UNROLL
    for (int ni = 0; ni < 8; ++ni)
      DSV4_UNROLL
      for (int e = 0; e < 4; ++e) acc[ni][e] = 0.0f;
    const LaneOffset bl = b_rows_n_lane(lane);
    const std::uint16_t* kb = ks + bl.row * kKeyRow + bl.col;
    DSV4_UNROLL
    for (int kk = 0; kk < kDim / 16; ++kk) {
      DSV4_UNROLL
      for (int np = 0; np < 4; ++np) {
        std::uint32_t bf[4];
        ldmatrix_x4(bf, kb + np * 16 * kKeyRow + kk * 16);
        mma_bf16_two_tiles(acc[2 * np], acc[2 * np + 1], qf[kk], bf);
      }
    }
    // Per entry: sum over heads of bf16(ReLU(bf16(q.k)) * w), rounded to bf16.
    const float w0 = wts[warp * 16 + g], w1 = wts[warp * 16 + g + 8];
    DSV4_UNROLL
    for (int ni = 0; ni < 8; ++ni) {
      DSV4_UNROLL
      for (int e = 0; e < 2; ++e) {
        const float p0 = round_bf16(fmaxf(round_bf16(acc[ni][e]), 0.0f) * w0);
        const float p1 = round_bf16(fmaxf(round_bf16(acc[ni][2 + e]), 0.0f) * w1);
        float s = p0 + p1;
        s += __shfl_xor_sync(0xffffffffu, s, 4);
        s += __shfl_xor_sync(0xffffffffu, s, 8);
        s += __shfl_xor_sync(0xffffffffu, s, 16);
        if (g == 0) colsum[warp * kTile + ni * 8 + tig * 2 + e] = s;
      }
    }
    __syncthreads();
    const std::int64_t j = b * kTile + tid;
    if (tid < kTile && j < n) {
      const float total = ((colsum[tid] + colsum[kTile + tid]) + colsum[2 * kTile + tid]) + colsum[3 * kTile + tid];
      a.scores[static_cast<std::int64_t>(i) * a.max_entries + j] = round_bf16(total);
    }
  }
  cp_async_wait_all();  // no copy outlives the CTA
}

// ---- top-k: radix select on the 16-bit keys of bf16 scores, then an ordered compaction --------

constexpr int kTopThreads = 1024;

// Exclusive prefix sum of `v` over the block in thread order, and the block's total; `warp_tot`
// is 32 ints of shared memory. Every warp scans the warps' totals itself (a lane each).
__device__ __forceinline__ int block_exclusive_sum(int v, int* warp_tot, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = static_cast<int>(blockDim.x >> 5);
  int incl = v;
  DSV4_UNROLL
  for (int d = 1; d < 32; d *= 2) {
    const int u = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += u;
  }
  __syncthreads();  // warp_tot free
  if (lane == 31) warp_tot[warp] = incl;
  __syncthreads();
  const int tot = lane < warps ? warp_tot[lane] : 0;
  int scan = tot;
  DSV4_UNROLL
  for (int d = 1; d < 32; d *= 2) {
    const int u = __shfl_up_sync(0xffffffffu, scan, d);
    if (lane >= d) scan += u;
  }
  *total = __shfl_sync(0xffffffffu, scan, 31);
  return __shfl_sync(0xffffffffu, scan - tot, warp) + incl - v;
}

// Scores j..j+3 of a row (entries at or past n read as -inf): one 16-byte load where the row is
// 16-byte aligned and padded to a multiple of 4 (kVec4), else four loads.
template <bool kVec4>
__device__ __forceinline__ void load_quad(const float* sc, std::int64_t j, std::int64_t n, float (&v)[4]) {
  if constexpr (kVec4) {
    const float4 q = *reinterpret_cast<const float4*>(sc + j);
    v[0] = q.x;
    v[1] = q.y;
    v[2] = q.z;
    v[3] = q.w;
    DSV4_UNROLL
    for (int e = 0; e < 4; ++e)
      if (j + e >= n) v[e] = -INFINITY;  // the row's padding
  } else {
    DSV4_UNROLL
    for (int e = 0; e < 4; ++e) v[e] = j + e < n ? sc[j + e] : -INFINITY;
  }
}

// Adds the quads [q_lo, q_hi) of a row of n scores to the block's shared histogram `hist`: pass 0
// bins keys by their high byte; pass 1 bins the low byte of the keys whose high byte is `high`
// and returns this thread's count of keys above `high`. Quads go kInFlight a thread in flight
// (a segment of 8192 entries is one round of 512 threads); scores cluster in few bins, so the
// lanes of a warp that hit the same bin add once, together. Every thread of the block calls it
// (the loop bounds are the block's).
template <bool kVec4>
__device__ __forceinline__ int add_to_histogram(const float* sc, std::int64_t n, std::int64_t q_lo, std::int64_t q_hi, int pass,
                                                std::uint32_t high, int* hist) {
  constexpr int kInFlight = 4;
  int above = 0;
  for (std::int64_t base = q_lo; base < q_hi; base += kInFlight * static_cast<std::int64_t>(blockDim.x)) {
    float v[kInFlight][4];
    DSV4_UNROLL
    for (int h = 0; h < kInFlight; ++h) {
      const std::int64_t q = base + h * blockDim.x + threadIdx.x;
      if (q < q_hi) load_quad<kVec4>(sc, 4 * q, n, v[h]);
      else
        DSV4_UNROLL
        for (int e = 0; e < 4; ++e) v[h][e] = -INFINITY;
    }
    DSV4_UNROLL
    for (int h = 0; h < kInFlight; ++h) {
      const std::int64_t q = base + h * blockDim.x + threadIdx.x;
      DSV4_UNROLL
      for (int e = 0; e < 4; ++e) {
        int bin = -1;
        if (q < q_hi && 4 * q + e < n) {
          const std::uint32_t key = score_key(v[h][e]);
          if (pass == 0) bin = static_cast<int>(key >> 8);
          else if ((key >> 8) == high) bin = static_cast<int>(key & 0xff);
          else above += (key >> 8) > high;
        }
        if (__ballot_sync(0xffffffffu, bin >= 0) == 0u) continue;  // warp-uniform
        const unsigned peers = __match_any_sync(0xffffffffu, bin);
        if (bin >= 0 && static_cast<int>(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
      }
    }
  }
  return above;
}

// Writes the entries of quads [q_lo, q_hi) above `threshold`, and those equal to it while fewer
// than `need` equal ones come before them, ascending from out[base]; `eq_before` equal entries
// precede the range. Thread u takes the contiguous quads [u seg, (u + 1) seg): it counts its
// entries above and equal to the threshold, two block scans place its selections, and it writes
// them in order (a handful of barriers, not two per blockDim entries). Up to kKept quads a thread
// (a segment of 8192 entries over 512 threads) are loaded once, together, and kept in registers
// for the writing; longer ranges are read twice. Every thread calls it.
template <bool kVec4>
__device__ __forceinline__ void write_selected(const float* sc, std::int64_t n, std::int64_t q_lo, std::int64_t q_hi,
                                               std::uint32_t threshold, int need, int base, int eq_before, int* warp_tot,
                                               std::int32_t* out) {
  constexpr int kKept = 4;
  const std::int64_t seg = (q_hi - q_lo + blockDim.x - 1) / blockDim.x;
  const std::int64_t my_lo = min(q_hi, q_lo + static_cast<std::int64_t>(threadIdx.x) * seg), my_hi = min(q_hi, my_lo + seg);
  const bool kept = seg <= kKept;  // (block-uniform)
  float v_kept[kKept][4];
  if (kept) {
    DSV4_UNROLL
    for (int c = 0; c < kKept; ++c)
      if (my_lo + c < my_hi) load_quad<kVec4>(sc, 4 * (my_lo + c), n, v_kept[c]);
  }
  // f(q, scores of quad q) for the thread's quads in order, kept or loaded.
  auto for_each_quad = [&](auto&& f) {
    if (kept) {
      DSV4_UNROLL
      for (int c = 0; c < kKept; ++c)
        if (my_lo + c < my_hi) f(my_lo + c, v_kept[c]);
    } else {
      for (std::int64_t q = my_lo; q < my_hi; ++q) {
        float v[4];
        load_quad<kVec4>(sc, 4 * q, n, v);
        f(q, v);
      }
    }
  };
  int gt = 0, eq = 0;
  for_each_quad([&](std::int64_t q, const float (&v)[4]) {
    DSV4_UNROLL
    for (int e = 0; e < 4; ++e) {
      const std::uint32_t key = score_key(v[e]);
      gt += 4 * q + e < n && key > threshold;
      eq += 4 * q + e < n && key == threshold;
    }
  });
  int total = 0;
  int eq_rank = eq_before + block_exclusive_sum(eq, warp_tot, &total);
  const int eq_taken = max(0, min(eq, need - eq_rank));
  int pos = base + block_exclusive_sum(gt + eq_taken, warp_tot, &total);
  for_each_quad([&](std::int64_t q, const float (&v)[4]) {
    DSV4_UNROLL
    for (int e = 0; e < 4; ++e) {
      const std::int64_t j = 4 * q + e;
      const std::uint32_t key = score_key(v[e]);
      const bool take = j < n && (key > threshold || (key == threshold && eq_rank++ < need));
      if (take) out[pos++] = static_cast<std::int32_t>(j);
    }
  });
}

// One CTA per token. Entries go in quads (four scores per load, four quads in flight per thread
// in the histogram passes) so that the passes over a long row are not bound by load latency.
template <bool kVec4>
__global__ void __launch_bounds__(kTopThreads) top_k_kernel(IndexerArgs a) {
  __shared__ int hist[256];
  __shared__ int warp_tot[32];
  __shared__ int pick[2];
  const DeviceStep& st = *a.step;
  const int i = blockIdx.x;
  const int t = a.token0 + i;
  if (t >= st.n_tokens) return;
  const std::int64_t n = (static_cast<std::int64_t>(st.positions[t]) + 1) / 4;
  const int k = a.top_k;
  const float* sc = a.scores + static_cast<std::int64_t>(i) * a.max_entries;
  std::int32_t* out = a.top_idx + static_cast<std::int64_t>(i) * k;
  if (n <= k) {
    for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x) out[j] = static_cast<std::int32_t>(j);
    if (threadIdx.x == 0) a.top_count[i] = static_cast<std::int32_t>(n);
    return;
  }
  const std::int64_t quads = (n + 3) / 4;
  // Two 8-bit radix passes find the k-th largest key T and how many entries equal to T to take.
  std::uint32_t prefix = 0;
  int need = k;
  for (int pass = 0; pass < 2; ++pass) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    add_to_histogram<kVec4>(sc, n, 0, quads, pass, prefix, hist);
    __syncthreads();
    if (threadIdx.x < 32) {  // the bin of the need-th largest key, and how many of it are still needed
      int c[8], bin = 0, still = 0;
      DSV4_UNROLL
      for (int u = 0; u < 8; ++u) c[u] = hist[255 - 8 * static_cast<int>(threadIdx.x) - u];
      pick_high_bin(c, need, bin, still);
      if (threadIdx.x == 0) {
        pick[0] = bin;
        pick[1] = still;
      }
    }
    __syncthreads();
    prefix = pass == 0 ? static_cast<std::uint32_t>(pick[0]) : (prefix << 8) | static_cast<std::uint32_t>(pick[0]);
    need = pick[1];
    __syncthreads();
  }
  const std::uint32_t threshold = prefix;  // entries above it all go; `need` of those equal, lowest index first
  write_selected<kVec4>(sc, n, 0, quads, threshold, need, 0, 0, warp_tot, out);
  if (threadIdx.x == 0) a.top_count[i] = k;
}


// ---- top-k over several CTAs a token: long rows, few tokens --------------------------------------
// The same radix select as top_k_kernel, its passes spread over S segments of the row (segment s:
// quads [s seg, (s + 1) seg), seg = ceil(quads / S)), kernels of S CTAs a token:
//   hist0   (only where the scores kernel did not count the high bytes itself) each segment adds
//           its keys' high-byte counts to the token's first key-count row; the last CTA to add
//           picks B1, the high byte of the k-th largest key, and how many keys of B1 are still
//           needed (sel[0..1])
//   hist1   each segment counts the low bytes of its keys in B1 (kept as suffix sums, ge) and its
//           keys above B1, and adds the counts to the second key-count row; the last CTA to add
//           picks B2, so the threshold T = B1 B2 and how many keys equal to T to take (sel[2..3]),
//           and from every segment's counts above and equal to T where each segment's selections
//           start in the list (base) and how many equal keys come before it (eq_before)
//   write   each segment's selections, ascending, at its place
// The last CTAs do the picks once, so no pass repeats them and no kernel clears a row
// (top_k_key.cuh: workspace and rows).
constexpr int kSegThreads = 512;
constexpr int kMaxSegments = 256;                 // (at most kSegThreads: a thread a segment in hist1's last CTA)
constexpr std::int64_t kMinSegmentEntries = 2048;  // a quad a thread
static_assert(kMaxSegments <= kSegThreads);

struct TopKWork {
  int* sel;
  int* seg;  // [S][kTopKSegmentInts]
};

__device__ __forceinline__ TopKWork top_k_work(const IndexerArgs& a, int i, int segments) {
  int* w = a.top_k_work + static_cast<std::int64_t>(i) * top_k_work_ints_per_token(segments);
  return TopKWork{w, w + kTopKSel};
}

// The quads [lo, hi) of segment s of a row of n entries.
__device__ __forceinline__ void segment_quads(std::int64_t n, int s, int segments, std::int64_t& lo, std::int64_t& hi) {
  const std::int64_t quads = (n + 3) / 4, seg = (quads + segments - 1) / segments;
  lo = min(quads, static_cast<std::int64_t>(s) * seg);
  hi = min(quads, lo + seg);
}

// The complete entries of call token i's row, or -1 past the step's tokens.
__device__ __forceinline__ std::int64_t complete_entries(const IndexerArgs& a, int i) {
  const DeviceStep& st = *a.step;
  const int t = a.token0 + i;
  return t < st.n_tokens ? (static_cast<std::int64_t>(st.positions[t]) + 1) / 4 : -1;
}

// hist0 of segment blockIdx.x; the last CTA of a token picks B1.
template <bool kVec4>
__global__ void __launch_bounds__(kSegThreads) top_k_hist0_kernel(IndexerArgs a) {
  __shared__ int hist[256];
  __shared__ int last;
  const int i = blockIdx.y, s = blockIdx.x, segments = gridDim.x;
  const std::int64_t n = complete_entries(a, i);
  if (n <= a.top_k) return;  // (no token, or every entry goes: the write pass)
  grid_dependency_wait();  // (launched dependent: the scores come from the kernel before)
  for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
  __syncthreads();
  std::int64_t q_lo, q_hi;
  segment_quads(n, s, segments, q_lo, q_hi);
  add_to_histogram<kVec4>(a.scores + static_cast<std::int64_t>(i) * a.max_entries, n, q_lo, q_hi, 0, 0, hist);
  grid_dependents_launch();
  int* row = a.key_counts + static_cast<std::int64_t>(i) * kKeyCountInts;
  if (add_counts_and_arrive(hist, row, segments, &last)) finish_first_pass(row, a.top_k, top_k_work(a, i, segments).sel);
}

// hist1 of segment blockIdx.x; the last CTA of a token picks T and places the segments.
template <bool kVec4>
__global__ void __launch_bounds__(kSegThreads) top_k_hist1_kernel(IndexerArgs a) {
  __shared__ int hist[256];
  __shared__ int warp_tot[32];
  __shared__ int above, last;
  __shared__ int pick[2];
  const int i = blockIdx.y, s = blockIdx.x, segments = gridDim.x;
  const std::int64_t n = complete_entries(a, i);
  if (n <= a.top_k) return;  // (no token, or every entry goes: the write pass)
  const TopKWork w = top_k_work(a, i, segments);
  grid_dependency_wait();  // (launched dependent: the scores and sel come from the kernels before)
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5;
  const std::uint32_t b1 = static_cast<std::uint32_t>(w.sel[0]);
  for (int b = tid; b < 256; b += blockDim.x) hist[b] = 0;
  if (tid == 0) above = 0;
  __syncthreads();
  std::int64_t q_lo, q_hi;
  segment_quads(n, s, segments, q_lo, q_hi);
  int my_above = add_to_histogram<kVec4>(a.scores + static_cast<std::int64_t>(i) * a.max_entries, n, q_lo, q_hi, 1, b1, hist);
  // The write pass may start taking places now (not earlier: its CTAs would hold registers that
  // this pass's later CTAs need).
  grid_dependents_launch();
  my_above = __reduce_add_sync(0xffffffffu, my_above);
  if ((tid & 31) == 0 && my_above > 0) atomicAdd(&above, my_above);
  __syncthreads();
  // The segment's suffix sums: thread u < 256 takes bin 255 - u, so its exclusive prefix is the
  // count of the bins above.
  int total = 0;
  const int v = tid < 256 ? hist[255 - tid] : 0;
  const int ex = block_exclusive_sum(v, warp_tot, &total);
  int* ge = w.seg + static_cast<std::int64_t>(s) * kTopKSegmentInts;
  if (tid < 256) ge[255 - tid] = ex + v;
  if (tid == 0) {
    ge[256] = 0;
    ge[kTopKAbove] = above;
  }
  int* row = a.key_counts + static_cast<std::int64_t>(i) * kKeyCountInts + kKeyCountRow;
  if (!add_counts_and_arrive(hist, row, segments, &last)) return;

  // The last CTA: T, and the places of the segments (a thread each).
  if (warp == 0) {
    int b2 = 0, need = 0;
    pick_high_bin_of_row(row, __ldcg(w.sel + 1), b2, need);
    if (tid == 0) {
      pick[0] = b2;
      pick[1] = need;
      w.sel[2] = static_cast<int>((b1 << 8) | static_cast<std::uint32_t>(b2));
      w.sel[3] = need;
    }
  }
  __syncthreads();
  const int b2 = pick[0], need = pick[1];
  int gt = 0, eq = 0;
  const int* seg = w.seg + static_cast<std::int64_t>(tid) * kTopKSegmentInts;
  if (tid < segments) {
    const int ge_b2 = __ldcg(seg + b2), gt_b2 = __ldcg(seg + b2 + 1);
    gt = __ldcg(seg + kTopKAbove) + gt_b2;
    eq = ge_b2 - gt_b2;
  }
  const int eq_before = block_exclusive_sum(eq, warp_tot, &total);
  const int taken = gt + max(0, min(eq, need - eq_before));
  const int base = block_exclusive_sum(tid < segments ? taken : 0, warp_tot, &total);
  if (tid < segments) {
    w.seg[static_cast<std::int64_t>(tid) * kTopKSegmentInts + kTopKBase] = base;
    w.seg[static_cast<std::int64_t>(tid) * kTopKSegmentInts + kTopKEqBefore] = eq_before;
  }
  clear_key_count_row(row);  // (warp 0 read it before the barriers above)
}

// Segment blockIdx.x's selections in ascending order at its place in the list (rows of n <= k:
// every entry of the segment).
template <bool kVec4>
__global__ void __launch_bounds__(kSegThreads) top_k_write_kernel(IndexerArgs a) {
  __shared__ int warp_tot[32];
  const int i = blockIdx.y, s = blockIdx.x, segments = gridDim.x;
  const std::int64_t n = complete_entries(a, i);
  if (n < 0) return;
  std::int32_t* out = a.top_idx + static_cast<std::int64_t>(i) * a.top_k;
  std::int64_t q_lo, q_hi;
  segment_quads(n, s, segments, q_lo, q_hi);
  grid_dependency_wait();  // (launched dependent: the places come from the kernel before)
  if (n <= a.top_k) {
    for (std::int64_t j = 4 * q_lo + threadIdx.x; j < min(n, 4 * q_hi); j += blockDim.x) out[j] = static_cast<std::int32_t>(j);
    if (s == 0 && threadIdx.x == 0) a.top_count[i] = static_cast<std::int32_t>(n);
    return;
  }
  const TopKWork w = top_k_work(a, i, segments);
  const int* seg = w.seg + static_cast<std::int64_t>(s) * kTopKSegmentInts;
  write_selected<kVec4>(a.scores + static_cast<std::int64_t>(i) * a.max_entries, n, q_lo, q_hi,
                        static_cast<std::uint32_t>(w.sel[2]), w.sel[3], seg[kTopKBase], seg[kTopKEqBefore], warp_tot, out);
  if (s == 0 && threadIdx.x == 0) a.top_count[i] = a.top_k;
}

}  // namespace

void indexer_query(const IndexerArgs& args, gpu_stream_t stream) {
  if (args.capacity <= 0) return;
  if (args.heads < 1 || args.heads > kMaxHeads) launch_error("GPU indexer: {} heads (1..{} supported)", {args.heads, kMaxHeads});
  launch(query_kernel, dim3(static_cast<unsigned>(args.capacity), static_cast<unsigned>(args.heads)), dim3(kDim), 0, stream,
         args);
}

void indexer_scores(const IndexerArgs& args, gpu_stream_t stream) {
  if (args.capacity <= 0 || args.max_entries <= 0) return;
  if (args.capacity > 65535) launch_error("GPU indexer: {} tokens in one call (at most 65535)", {args.capacity});
  if (args.heads < 1 || args.heads > kMaxHeads) launch_error("GPU indexer: {} heads (1..{} supported)", {args.heads, kMaxHeads});
  // indexer_weight_scale: the product taken in double, then fp32.
  const float weight_scale =
      static_cast<float>(std::pow(static_cast<double>(kDim), -0.5) * std::pow(static_cast<double>(args.heads), -0.5));
  if (args.format != IndexerFormat::kBf16) {
    if (args.q_work == nullptr) launch_error("GPU indexer: FP4 / FP8 keys are scored on FP8 tensor cores and need q_work ({} bytes)", {indexer_q_work_bytes(args.capacity)});
    indexer_scores_e4m3(args, weight_scale, stream);
    return;
  }
  // CTAs per token: about 8 per SM over the call's tokens, at most one per tile; each takes every
  // gridDim.x-th tile of its token.
  const std::int64_t max_tiles = (args.max_entries + kTile - 1) / kTile;
  const std::int64_t per_token = args.ctas_per_token > 0 ? args.ctas_per_token
                                                         : (8 * static_cast<std::int64_t>(args.sm_count) + args.capacity - 1) / args.capacity;
  const auto grid_x = static_cast<unsigned>(std::clamp<std::int64_t>(per_token, 1, max_tiles));
  static const bool smem_set = (set_max_dynamic_smem(scores_kernel, kScoreSmem), true);
  (void)smem_set;
  launch(scores_kernel, dim3(grid_x, static_cast<unsigned>(args.capacity)), dim3(kScoreThreads), kScoreSmem, stream, args,
         weight_scale);
}

std::int32_t indexer_top_k_segments(std::int64_t capacity, std::int64_t max_entries, std::int32_t sm_count) {
  if (capacity <= 0 || max_entries <= 0) return 1;
  // At most two CTAs a SM over the call's tokens (rounded down, so the 512-thread CTAs are one
  // wave: rounded up, batch 64 took 5 segments a token, 320 CTAs), segments of at least
  // kMinSegmentEntries entries.
  const std::int64_t want = std::max<std::int64_t>(1, 2 * static_cast<std::int64_t>(std::max(sm_count, 1)) / capacity);
  const std::int64_t most = (max_entries + kMinSegmentEntries - 1) / kMinSegmentEntries;
  return static_cast<std::int32_t>(std::clamp<std::int64_t>(std::min(want, most), 1, kMaxSegments));
}

std::int64_t indexer_key_count_ints(std::int64_t tokens) { return std::max<std::int64_t>(tokens, 0) * kKeyCountInts; }

std::int64_t indexer_top_k_work_ints(std::int64_t capacity, std::int32_t segments) {
  return segments <= 1 ? 0 : std::max<std::int64_t>(capacity, 0) * top_k_work_ints_per_token(segments);
}

std::int32_t indexer_top_k_segments(const IndexerArgs& args) {
  return args.top_k_segments > 0 ? args.top_k_segments : indexer_top_k_segments(args.capacity, args.max_entries, args.sm_count);
}

void indexer_top_k(const IndexerArgs& args, gpu_stream_t stream) {
  if (args.capacity <= 0) return;
  if (args.capacity > 65535) launch_error("GPU indexer top-k: {} tokens in one call (at most 65535)", {args.capacity});
  // 16-byte loads where every row starts 16-byte aligned (the executor pads rows to 4 scores).
  const bool vec4 = reinterpret_cast<std::uintptr_t>(args.scores) % 16 == 0 && args.max_entries % 4 == 0;
  const std::int32_t segments = indexer_top_k_segments(args);
  if (segments <= 1 || args.top_k_work == nullptr || args.key_counts == nullptr) {
    if (vec4) launch(top_k_kernel<true>, dim3(static_cast<unsigned>(args.capacity)), dim3(kTopThreads), 0, stream, args);
    else launch(top_k_kernel<false>, dim3(static_cast<unsigned>(args.capacity)), dim3(kTopThreads), 0, stream, args);
    return;
  }
  if (segments > kMaxSegments) launch_error("GPU indexer top-k: {} segments a token (at most {})", {segments, kMaxSegments});
  const dim3 grid(static_cast<unsigned>(segments), static_cast<unsigned>(args.capacity));
  // The FP8 tensor-core scores kernel may have done the first pass (sel holds B1).
  const bool counted = indexer_scores_count_keys(args);
  if (vec4) {
    if (!counted) launch_dependent(top_k_hist0_kernel<true>, grid, dim3(kSegThreads), 0, stream, args);
    launch_dependent(top_k_hist1_kernel<true>, grid, dim3(kSegThreads), 0, stream, args);
    launch_dependent(top_k_write_kernel<true>, grid, dim3(kSegThreads), 0, stream, args);
  } else {
    if (!counted) launch_dependent(top_k_hist0_kernel<false>, grid, dim3(kSegThreads), 0, stream, args);
    launch_dependent(top_k_hist1_kernel<false>, grid, dim3(kSegThreads), 0, stream, args);
    launch_dependent(top_k_write_kernel<false>, grid, dim3(kSegThreads), 0, stream, args);
  }
}

}  // namespace dsv4::gpu
