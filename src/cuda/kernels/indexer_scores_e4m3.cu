// Indexer scores on FP8 tensor cores, for FP4 and FP8 indexer keys (indexer.h, SPEC.md 3.4, 5a).
//
// The product q_h . k_j is exact in e4m3 when both sides are: the queries are FP4-simulated (every
// value an e2m1 value times its block's power of two), FP4 keys are e2m1 values times a UE8M0
// scale a block of 32, FP8 keys are e4m3 codes times one fp32 scale. Folding a row's block scales
// into one power of two a row keeps every value an e4m3 value as long as the row's values span
// few enough binades (queries: exponents within 16 of the row's largest; FP4 keys: block scales
// within 13 of the largest), so
//   q_h . k_j = 2^Rq_h * 2^Rk_j * (q8_h . k8_j)        (q8, k8 e4m3; one mma product)
// and, the powers of two commuting with every bf16 rounding of the score,
//   bf16(ReLU(bf16(q.k)) * w_h) = 2^Rk_j * bf16(ReLU(bf16(q8.k8 [* fp8 key scale])) * (w_h 2^Rq_h)).
// The score sums those terms over the heads and rounds to bf16. Blocks with a row outside the
// folding's range (or an FP4 scale byte of NaN) take an exact fp32 path for their 64 entries.
//
// Layout: a CTA is one warpgroup and scores a cache block (64 entries) at a time with four
// wgmma.m64n64k32.e4m3 products: A = the block's 64 entries, B = the token's 64 heads (converted
// once a token by fold_queries_kernel, copied into shared memory once a CTA), both K-major core
// matrices without swizzle. FP8 entries are copied straight into that layout (cp.async); an FP4
// block (its page is contiguous) is one bulk copy counted on the stage's mbarrier, converted by
// the threads into that layout (byte permutes through tables of e2m1 x 2^d). The
// terms ReLU(...) * w leave the accumulators as bf16 pairs laid out as the A operand of a bf16
// mma.m16n8k16 with a B of ones, which sums them over the heads in fp32. A ring of four stages
// keeps three blocks' copies in flight; each warp resolves the pages of the CTA's next 32 blocks
// in one batch, a lane each. The loop is software-pipelined: a block's products run while the
// threads wait for and convert the next block. The three kernels of a call (the fold, the scores, then the top-k's)
// are launched dependent (dependent_launch.cuh): a scores CTA resolves its pages and starts its
// first copies while the fold still runs. (mma.sync on e4m3 is no FP8 instruction on sm_90:
// ptxas widens it to f16 in software, which cost 890 instructions a 16 entries in a first version
// of this kernel.)
#include "cuda/kernels/indexer_scores_e4m3.h"

#include <algorithm>
#include <cstring>

#include "cuda/device.h"
#include "cuda/kernels/dependent_launch.cuh"
#include "cuda/kernels/launch_check.h"
#include "cuda/kernels/numerics.cuh"
#include "cuda/kernels/top_k_key.cuh"

namespace dsv4::gpu {
namespace {

constexpr int kDim = 128;
constexpr int kHeads = 64;          // B covers 64 heads; rows past `heads` are zero
constexpr int kTile = 64;           // entries of one indexer cache block: the product's 64 rows
constexpr int kThreads = 128;       // one warpgroup
constexpr int kStages = 4;          // ring of raw blocks; kStages - 1 in flight
constexpr int kQBytes = kHeads * kDim;                  // e4m3 queries of a token (8 KB)
constexpr int kOpBytes = kTile * kDim;                  // an e4m3 operand tile (8 KB)
constexpr int kCore = 128, kRowGroup = 8 * kCore;       // core matrix; 8 rows x 128 dims
constexpr int kFoldTables = 14;     // e2m1 x 2^d as e4m3 bytes, d = -7..6

template <IndexerFormat kFormat>
struct Layout {
  static constexpr int kData = kFormat == IndexerFormat::kFp4 ? 64 : 128;  // bytes an entry
  static constexpr int kStage = kTile * kData + kTile * 4;                  // a block's page bytes
  // shared memory: queries | FP4: two converted tiles, two factor rows | the ring
  static constexpr int kRing = kQBytes + (kFormat == IndexerFormat::kFp4 ? 2 * kOpBytes + 2 * kTile * 4 : 0);
  static constexpr int kSmem = kRing + kStages * kStage;
};

// Offset of 16-byte chunk c (dims 16c .. 16c + 15) of row r in a K-major operand tile.
__host__ __device__ constexpr int core_offset(int r, int c) { return (r / 8) * kRowGroup + c * kCore + (r % 8) * 16; }

// q_work of a token: [64][128] e4m3 (folded), w_fold[64], w_plain[64] (floats), ok[64] (ints:
// the head's folding is exact).
constexpr std::int64_t kQWorkBytes = kQBytes + 3 * kHeads * 4;
__device__ __forceinline__ std::uint8_t* q_work_of(const IndexerArgs& a, int i) {
  return a.q_work + static_cast<std::int64_t>(i) * kQWorkBytes;
}

// ---- queries folded to e4m3 (grid: tokens x 8, a warp a head, a lane 4 dims) --------------------
__global__ void __launch_bounds__(256) fold_queries_kernel(IndexerArgs a, float weight_scale) {
  // (Launched dependent: the queries and weights may come from the kernels just before; the scores
  // kernel may start as soon as every CTA is past this point.)
  grid_dependency_wait();
  grid_dependents_launch();
  const DeviceStep& st = *a.step;
  const int i = blockIdx.x;
  const int t = a.token0 + i;
  if (t >= st.n_tokens) return;
  std::uint8_t* work = q_work_of(a, i);
  float* w_fold = reinterpret_cast<float*>(work + kQBytes);
  float* w_plain = w_fold + kHeads;
  int* head_ok = reinterpret_cast<int*>(w_plain + kHeads);
  const int lane = threadIdx.x & 31, h = static_cast<int>(blockIdx.y) * 8 + static_cast<int>(threadIdx.x >> 5);
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float w = 0.0f;
  if (h < a.heads) {
    const uint2 raw = *reinterpret_cast<const uint2*>(a.q + (static_cast<std::int64_t>(t) * a.heads + h) * kDim + lane * 4);
    v[0] = bf16_value(static_cast<std::uint16_t>(raw.x & 0xffffu));
    v[1] = bf16_value(static_cast<std::uint16_t>(raw.x >> 16));
    v[2] = bf16_value(static_cast<std::uint16_t>(raw.y & 0xffffu));
    v[3] = bf16_value(static_cast<std::uint16_t>(raw.y >> 16));
    w = round_bf16(bf16_value(a.weights[static_cast<std::int64_t>(t) * a.heads + h]) * weight_scale);
  }
  // Biased exponents of the nonzero values (a subnormal counts as 0: outside the range).
  unsigned emax = 0, emin = 255;
  DSV4_UNROLL
  for (int e = 0; e < 4; ++e) {
    const std::uint32_t u = __float_as_uint(v[e]) & 0x7fffffffu;
    if (u != 0) {
      emax = max(emax, u >> 23);
      emin = min(emin, u >> 23);
    }
  }
  emax = __reduce_max_sync(0xffffffffu, emax);
  emin = __reduce_min_sync(0xffffffffu, emin);
  // 2^Rq = 2^(emax - 127 - 8): the largest values land in binade 8 (<= 384), the smallest
  // allowed in binade -8 (e4m3 subnormals are multiples of 2^-9; values have 2 significant bits).
  bool ok = true;
  float down = 1.0f, up = 1.0f;
  if (emax != 0) {
    ok = emin >= 1 && emax - emin <= 16 && emax >= 9 && emax <= 250;
    if (ok) {
      down = __uint_as_float((127u + 135u - emax) << 23);  // 2^(135 - emax)
      up = __uint_as_float((emax - 8u) << 23);             // 2^(emax - 135)
    }
  }
  std::uint32_t codes = 0;
  DSV4_UNROLL
  for (int e = 0; e < 4; ++e) {
    const float scaled = mul_rn(v[e], down);
    const std::uint8_t code = e4m3_code(scaled);
    ok = ok && e4m3_value(code) == scaled;  // (values not FP4-simulated take the exact path)
    codes |= static_cast<std::uint32_t>(code) << (8 * e);
  }
  *reinterpret_cast<std::uint32_t*>(work + h * kDim + lane * 4) = codes;
  const float wf = mul_rn(w, up);
  ok = __all_sync(0xffffffffu, ok && round_bf16(wf) == wf && mul_rn(wf, down) == w);
  if (lane == 0) {
    w_fold[h] = wf;
    w_plain[h] = w;
    head_ok[h] = ok ? 1 : 0;
  }
}

// ---- scores -------------------------------------------------------------------------------------
// ReLU then the product with w of two bf16 (a bf16x2 word), each rounded once: as the CPU's
// round_bf16(max(x, 0) * w) (a product of two bf16 is exact in fp32).
__device__ __forceinline__ std::uint32_t relu_times_bf16x2(std::uint32_t x, std::uint32_t w) {
#if defined(__CUDA_ARCH__)
  std::uint32_t r;
  asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(x), "r"(0u));
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(r), "r"(w));
  return r;
#else
  const float lo = round_bf16(fmaxf(bf16_value(static_cast<std::uint16_t>(x & 0xffffu)), 0.0f) *
                              bf16_value(static_cast<std::uint16_t>(w & 0xffffu)));
  const float hi = round_bf16(fmaxf(bf16_value(static_cast<std::uint16_t>(x >> 16)), 0.0f) *
                              bf16_value(static_cast<std::uint16_t>(w >> 16)));
  return static_cast<std::uint32_t>(bf16_bits(lo)) | (static_cast<std::uint32_t>(bf16_bits(hi)) << 16);
#endif
}

// Eight e2m1 codes (a word, lowest dim in the lowest nibble) as eight e4m3 bytes in two words,
// through the byte table of e2m1 magnitudes times 2^d (`tab`); signs from a second permute.
__device__ __forceinline__ void e2m1x8_to_e4m3(std::uint32_t w, uint2 tab, std::uint32_t& lo, std::uint32_t& hi) {
  const std::uint32_t mag = w & 0x77777777u, sgn = (w >> 1) & 0x44444444u;  // selector 4: 0x80
  lo = __byte_perm(tab.x, tab.y, mag & 0xffffu) | __byte_perm(0u, 0x80808080u, sgn & 0xffffu);
  hi = __byte_perm(tab.x, tab.y, mag >> 16) | __byte_perm(0u, 0x80808080u, sgn >> 16);
}

// The exact fp32 dots (the CPU's order) of the thread's 32 accumulator places -- entries
// 16 w + g + 8 (c / 2 % 2) of the block, heads 8 j + 2 q + c % 2 (c = 4 j + e) -- from the bf16
// queries and the keys decoded as the CPU decodes them (FP4: the raw stage; FP8: the operand
// layout). Blocks the folding cannot hold, rarely: out of line, so the fast path keeps its
// registers.
__device__ __noinline__ void exact_dots(float* dots, const std::uint16_t* q_token, int heads, const std::uint8_t* stage,
                                        IndexerFormat format) {
  const int t = static_cast<int>(threadIdx.x), w = t / 32, g = (t % 32) / 4, q4 = t % 4;
  const std::uint8_t* scales = stage + kTile * (format == IndexerFormat::kFp4 ? 64 : 128);
  for (int c = 0; c < 32; ++c) {
    const int e = 16 * w + g + 8 * ((c % 4) / 2), h = 8 * (c / 4) + 2 * q4 + c % 2;
    float dot = 0.0f;
    if (h < heads) {
      const std::uint16_t* q = q_token + h * kDim;
      float s = 0.0f;
      if (format == IndexerFormat::kFp8) std::memcpy(&s, scales + e * 4, 4);
      for (int k = 0; k < kDim; ++k) {
        float key;
        if (format == IndexerFormat::kFp4) {
          const std::uint8_t byte = stage[e * 64 + k / 2];
          key = mul_rn(e2m1_value(static_cast<std::uint8_t>((k & 1) ? byte >> 4 : byte & 0xf)), ue8m0_value(scales[e * 4 + k / 32]));
        } else {
          key = mul_rn(e4m3_value(stage[core_offset(e, k / 16) + k % 16]), s);
        }
        dot = add_rn(dot, mul_rn(bf16_value(q[k]), key));
      }
    }
    dots[c] = dot;
  }
}

// count_segments > 0: the written scores' high key bytes are counted into the token's row of
// a.key_counts (a shared histogram a CTA, added with atomics at its end); the token's last CTA to
// add its counts picks B1 into the top-k workspace's sel and zeroes the row.
template <IndexerFormat kFormat>
__global__ void __launch_bounds__(kThreads, 5) scores_e4m3_kernel(IndexerArgs a, int count_segments) {
  using L = Layout<kFormat>;
  DSV4_DYNAMIC_SMEM(std::uint8_t, smem);
  std::uint8_t* qs = smem;                    // [64 heads][128] e4m3, operand layout
  std::uint8_t* ops = smem + kQBytes;         // FP4: [2][64][128] e4m3 tiles, then [2][64] factors
  std::uint8_t* ring = smem + L::kRing;       // [kStages] raw blocks (FP8: data in operand layout)
  __shared__ uint2 fold_tab[kFoldTables];
  __shared__ int key_count[256];
  __shared__ int last_arrival;
  const DeviceStep& st = *a.step;
  const int i = blockIdx.y;
  const int t = a.token0 + i;
  if (t >= st.n_tokens) return;
  const std::int64_t n = (static_cast<std::int64_t>(st.positions[t]) + 1) / 4;
  const std::int64_t tiles = (n + kTile - 1) / kTile;
  const std::int64_t first = blockIdx.x, stride = gridDim.x;
  if (first >= tiles) return;  // (CTA-uniform)
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
  // Blocks of this CTA (at most 2^31: 32-bit counters, whose / and % by powers of two are shifts).
  const int mine = static_cast<int>((tiles - first + stride - 1) / stride);

  // Pages: lane l of every warp holds the page of the CTA's block (batch * 32 + l).
  const int row = st.token_row[t];
  const DeviceCacheGroup& kg = st.groups[a.key_group];
  // (A trap without a message: the printf of DSV4_DEVICE_ASSERT is a call, and a call in the
  // kernel makes ptxas serialize the wgmma products.)
  if (kg.entries_per_block != kTile) __trap();
  const std::int64_t table_base = kg.table_base[row];
  const std::int32_t table_begin = kg.table_start[row], table_end = kg.table_start[row + 1];
  auto resolve = [&](int batch) -> std::int64_t {  // this lane's page in `batch` (-1: none)
    const int k = batch * 32 + lane;
    if (k >= mine) return -1;
    const std::int64_t tile = first + k * stride - table_base;
    const bool in = tile >= 0 && table_begin + tile < table_end;
    const std::int32_t block = load_global_or(kg.block_ids + (in ? table_begin + tile : 0), in, -1);
    const bool ok = block >= 0;
    return load_global_or(kg.page_table + (ok ? static_cast<std::int64_t>(block) * kg.layers + a.layer_slot : 0), ok, -1);
  };
  std::int64_t pages_cur = resolve(0), pages_next = resolve(1);
  const std::uint8_t* nowhere = reinterpret_cast<const std::uint8_t*>(a.q_work);
  // FP4: a block's page bytes are one bulk copy into its stage, counted on the stage's mbarrier.
  __shared__ __align__(8) std::uint64_t landed[kStages];
  if (kFormat == IndexerFormat::kFp4 && tid < kFoldTables * 8) {
    // byte m of table d: e2m1 magnitude m times 2^(d - 7), as e4m3 (exact: binades -8..8)
    const int d = tid / 8, m = tid % 8;
    const std::uint32_t byte =
        e4m3_code(e2m1_value(static_cast<std::uint8_t>(m)) * __uint_as_float(static_cast<std::uint32_t>(120 + d) << 23));
    reinterpret_cast<std::uint8_t*>(fold_tab)[d * 8 + m] = static_cast<std::uint8_t>(byte);
  }
  if (kFormat == IndexerFormat::kFp4 && tid == 0)
    for (int b = 0; b < kStages; ++b) mbarrier_init(&landed[b], 1);
  // Copy the CTA's k-th block into stage k % kStages (FP8: one cp.async commit group a call,
  // empty past the end; a block without a page reads as zeros).
  auto issue = [&](int k) {
    if (k < mine) {
      if (k % 32 == 0 && k > 0) {
        pages_cur = pages_next;
        pages_next = resolve(k / 32 + 1);
      }
      const std::int64_t page = __shfl_sync(0xffffffffu, pages_cur, static_cast<int>(k % 32));
      const bool ok = page >= 0;
      const std::uint8_t* base = kg.pool + (ok ? page : 0) * kg.page_bytes;
      std::uint8_t* dst = ring + (k % kStages) * L::kStage;
      if constexpr (kFormat == IndexerFormat::kFp4) {
        if (tid == 0) {
          std::uint64_t* bar = &landed[k % kStages];
          if (ok) {
            mbarrier_arrive_expect_tx(bar, L::kStage);
            bulk_copy_to_shared(dst, base, L::kStage, bar);
          } else {
            for (int c = 0; c < L::kStage / 16; ++c) reinterpret_cast<uint4*>(dst)[c] = make_uint4(0, 0, 0, 0);
            mbarrier_arrive(bar);
          }
        }
      } else {
        constexpr int kChunks = L::kStage / 16;
        for (int c = tid; c < kChunks; c += kThreads) {
          const int at = c < kTile * 8 ? core_offset(c / 8, c % 8) : c * 16;  // data into the operand layout, scales after it
          cp_async_16_zfill(dst + at, ok ? base + c * 16 : nowhere, ok);
        }
      }
    }
    if constexpr (kFormat == IndexerFormat::kFp8) cp_async_commit();
  };
  if (kFormat == IndexerFormat::kFp4) __syncthreads();  // the mbarriers and the tables, before anyone uses them
  // (Launched dependent on the fold: until the wait, only the step's tables and the cache, whose
  // writers ran before the fold, are read.)
  DSV4_UNROLL
  for (int k = 0; k < kStages - 1; ++k) issue(k);
  grid_dependency_wait();

  for (int b = tid; b < 256; b += kThreads) key_count[b] = 0;  // (ordered by the loop's barriers)
  // The token's folded queries into the B tile; the weights of this thread's heads as pairs.
  const std::uint8_t* work = q_work_of(a, i);
  for (int c = tid; c < kHeads * 8; c += kThreads)
    *reinterpret_cast<uint4*>(qs + core_offset(c / 8, c % 8)) = *reinterpret_cast<const uint4*>(work + c * 16);
  const float* w_fold = reinterpret_cast<const float*>(work + kQBytes);
  const float* w_plain = w_fold + kHeads;
  const int* head_ok = reinterpret_cast<const int*>(w_plain + kHeads);
  const bool q_fast = head_ok[tid % kHeads] != 0;  // (every head is some thread's; ANDed at the barriers)
  std::uint32_t wf[8];
  DSV4_UNROLL
  for (int j = 0; j < 8; ++j) wf[j] = pack_bf16x2(w_fold[8 * j + 2 * tig], w_fold[8 * j + 2 * tig + 1]);

  const std::uint64_t q_desc = wgmma_descriptor(qs, kCore, kRowGroup);
  auto advanced = [](std::uint64_t desc, int bytes) { return desc + static_cast<std::uint64_t>(bytes >> 4); };
  constexpr std::uint32_t kOnes = 0x3f803f80u;  // bf16 1.0, 1.0
  float* out = a.scores + static_cast<std::int64_t>(i) * a.max_entries;
  // Block k's raw bytes landed (this thread's copies, FP8; the stage's mbarrier, FP4), and for FP4
  // converted into tile k % 2 with its factors. Returns whether this thread's part of the block
  // (and its head) can take the fast path.
  auto prepare = [&](int k) -> bool {
    if constexpr (kFormat == IndexerFormat::kFp4) mbarrier_wait(&landed[k % kStages], static_cast<unsigned>((k / kStages) & 1));
    else cp_async_wait<kStages - 2>();  // (blocks up to k + 2 are committed: k landed)
    bool ok = q_fast;
    if constexpr (kFormat == IndexerFormat::kFp4) {
      const std::uint8_t* stage = ring + (k % kStages) * L::kStage;
      float* factor = reinterpret_cast<float*>(ops + 2 * kOpBytes) + (k % 2) * kTile;  // 2^Rk an entry
      // Units (entry u / 4, scale block u % 4), u = tid and tid + 128: the quad of lanes of an
      // entry finds the largest scale of its nonzero blocks and folds the blocks to one power of two.
      std::uint8_t* tile = ops + (k % 2) * kOpBytes;
      DSV4_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int u = tid + h * kThreads, e = u / 4, b = u % 4;
        const uint4 raw = *reinterpret_cast<const uint4*>(stage + e * 64 + 16 * b);
        const unsigned s = stage[kTile * 64 + e * 4 + b];
        // A block of zeros does not count towards the largest scale (0: no nonzero block).
        const bool zero = ((raw.x | raw.y | raw.z | raw.w) & 0x77777777u) == 0u;
        unsigned smax = zero ? 0u : s;
        smax = max(smax, __shfl_xor_sync(0xffffffffu, smax, 1));
        smax = max(smax, __shfl_xor_sync(0xffffffffu, smax, 2));
        // Nonzero blocks' scales within 13 binades of the largest: e2m1 x 2^(s - smax + 6) is an
        // e4m3 value (each unit checks its own; the barrier ANDs them). A NaN scale byte makes
        // even zeros NaN: the exact path.
        ok = ok && s != 255u && (zero || s + 13u >= smax);
        if (b == 0) factor[e] = mul_rn(ue8m0_value(static_cast<std::uint8_t>(smax)), 0x1p-6f);  // 2^(smax - 133)
        const int d = static_cast<int>(s) - static_cast<int>(smax) + 6;
        const uint2 tab = fold_tab[min(max(d, -7), 6) + 7];
        uint4 lo, hi;
        e2m1x8_to_e4m3(raw.x, tab, lo.x, lo.y);
        e2m1x8_to_e4m3(raw.y, tab, lo.z, lo.w);
        e2m1x8_to_e4m3(raw.z, tab, hi.x, hi.y);
        e2m1x8_to_e4m3(raw.w, tab, hi.z, hi.w);
        *reinterpret_cast<uint4*>(tile + core_offset(e, 2 * b)) = lo;
        *reinterpret_cast<uint4*>(tile + core_offset(e, 2 * b + 1)) = hi;
      }
    }
    return ok;
  };
  // The four products of block k (A: its converted tile, FP4, or its stage, FP8), issued and
  // committed; the caller waits.
  auto products = [&](int k, float (&d)[32]) {
    const std::uint8_t* op = kFormat == IndexerFormat::kFp4 ? ops + (k % 2) * kOpBytes : ring + (k % kStages) * L::kStage;
    const std::uint64_t a_desc = wgmma_descriptor(op, kCore, kRowGroup);
    wgmma_fence();
    DSV4_UNROLL
    for (int kk = 0; kk < 4; ++kk) wgmma_m64n64k32_e4m3(d, advanced(a_desc, kk * 2 * kCore), advanced(q_desc, kk * 2 * kCore), kk > 0);
    wgmma_commit();
  };

  // Software pipeline: block k's products run while the threads prepare block k + 1; a barrier a
  // block (after both) publishes block k + 1's tile and frees block k's stage for block k + 4.
  const bool first_ok = prepare(0);
  fence_proxy_async_shared();  // the queries and tile 0 (written by threads) are read by the products
  bool fast = __syncthreads_and(first_ok) != 0;
  issue(kStages - 1);
  for (int k = 0; k < mine; ++k) {
    const std::uint8_t* stage = ring + (k % kStages) * L::kStage;
    // (The products are issued and waited for on both paths, outside any branch: a wgmma in a
    // divergent-looking path makes ptxas serialize them. The exact path overwrites d.)
    float d[32];
    products(k, d);
    const bool next_ok = k + 1 < mine ? prepare(k + 1) : true;
    wgmma_wait<0>();
    wgmma_fence_operands(d);
    std::uint32_t wp[8];
    if (fast) {
      if constexpr (kFormat == IndexerFormat::kFp8) {  // bf16(q8.k8 * key scale) before the ReLU
        const float* sc = reinterpret_cast<const float*>(stage + kTile * 128);
        const float s0 = sc[16 * warp + g], s1 = sc[16 * warp + g + 8];
        DSV4_UNROLL
        for (int j = 0; j < 8; ++j) {
          d[4 * j] = mul_rn(d[4 * j], s0);
          d[4 * j + 1] = mul_rn(d[4 * j + 1], s0);
          d[4 * j + 2] = mul_rn(d[4 * j + 2], s1);
          d[4 * j + 3] = mul_rn(d[4 * j + 3], s1);
        }
      }
      DSV4_UNROLL
      for (int j = 0; j < 8; ++j) wp[j] = wf[j];
    } else {
      // Exact fp32 dots from the bf16 queries and the decoded keys (the raw stage stays until the
      // barrier below), the true weights, no factors.
      float exact[32];  // (its own array: d stays in registers on the fast path)
      exact_dots(exact, a.q + static_cast<std::int64_t>(t) * a.heads * kDim, a.heads, stage, kFormat);
      DSV4_UNROLL
      for (int c = 0; c < 32; ++c) d[c] = exact[c];
      DSV4_UNROLL
      for (int j = 0; j < 8; ++j) wp[j] = pack_bf16x2(w_plain[8 * j + 2 * tig], w_plain[8 * j + 2 * tig + 1]);
    }

    // Terms bf16(ReLU(bf16(dot)) * w) as bf16 pairs, summed over the heads by products with ones.
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const std::uint32_t ones[2] = {kOnes, kOnes};
    DSV4_UNROLL
    for (int np = 0; np < 4; ++np) {
      const int j0 = 2 * np, j1 = 2 * np + 1;
      const std::uint32_t af[4] = {relu_times_bf16x2(pack_bf16x2(d[4 * j0], d[4 * j0 + 1]), wp[j0]),
                                   relu_times_bf16x2(pack_bf16x2(d[4 * j0 + 2], d[4 * j0 + 3]), wp[j0]),
                                   relu_times_bf16x2(pack_bf16x2(d[4 * j1], d[4 * j1 + 1]), wp[j1]),
                                   relu_times_bf16x2(pack_bf16x2(d[4 * j1 + 2], d[4 * j1 + 3]), wp[j1])};
      mma_m16n8k16_bf16(sum, af, ones, sum);
    }
    // sum[0]: entry 16 w + g, sum[2]: entry 16 w + g + 8 (every column holds the same total).
    if (tig < 2) {
      const int e = 16 * warp + g + 8 * tig;
      const std::int64_t j = (first + k * stride) * kTile + e;
      float total = tig == 0 ? sum[0] : sum[2];
      if (kFormat == IndexerFormat::kFp4 && fast)
        total = mul_rn(total, reinterpret_cast<const float*>(ops + 2 * kOpBytes)[(k % 2) * kTile + e]);
      if (j < n) {
        const float score = round_bf16(total);
        out[j] = score;
        if (count_segments > 0) atomicAdd(&key_count[score_key(score) >> 8], 1);
      }
    }
    // Block k + 1's tile and factors written; every thread done with block k's stage and tile.
    fence_proxy_async_shared();
    fast = __syncthreads_and(next_ok) != 0;
    issue(k + kStages);
  }
  grid_dependents_launch();  // the top-k's CTAs may start taking their places
  if (count_segments > 0) {
    // The last of the token's CTAs (those with blocks to score) to add its counts picks B1 for the
    // top-k and leaves the row zero for the next call.
    int* counts = a.key_counts + static_cast<std::int64_t>(i) * kKeyCountInts;
    const int ctas = static_cast<int>(tiles < stride ? tiles : stride);
    if (add_counts_and_arrive(key_count, counts, ctas, &last_arrival))
      finish_first_pass(counts, a.top_k, a.top_k_work + static_cast<std::int64_t>(i) * top_k_work_ints_per_token(count_segments));
  }
  if constexpr (kFormat == IndexerFormat::kFp8) cp_async_wait_all();  // no copy outlives the CTA
}

}  // namespace

std::int64_t indexer_q_work_bytes(std::int64_t tokens) {
  return std::max<std::int64_t>(tokens, 0) * kQWorkBytes;
}

void indexer_scores_e4m3(const IndexerArgs& args, float weight_scale, gpu_stream_t stream) {
  const int count_segments = indexer_scores_count_keys(args) ? indexer_top_k_segments(args) : 0;
  launch_dependent(fold_queries_kernel, dim3(static_cast<unsigned>(args.capacity), kHeads / 8), dim3(256), 0, stream, args,
                   weight_scale);
  // About 5 CTAs a SM (as many as fit) over the call's tokens, at most one a cache block.
  const std::int64_t max_tiles = (args.max_entries + kTile - 1) / kTile;
  const std::int64_t per_token = args.ctas_per_token > 0 ? args.ctas_per_token
                                                         : (5 * static_cast<std::int64_t>(args.sm_count) + args.capacity - 1) / args.capacity;
  const auto grid_x = static_cast<unsigned>(std::clamp<std::int64_t>(per_token, 1, max_tiles));
  const dim3 grid(grid_x, static_cast<unsigned>(args.capacity));
  if (args.format == IndexerFormat::kFp4) {
    constexpr int kSmem = Layout<IndexerFormat::kFp4>::kSmem;
    static const bool set = (set_max_dynamic_smem(scores_e4m3_kernel<IndexerFormat::kFp4>, kSmem), true);
    (void)set;
    launch_dependent(scores_e4m3_kernel<IndexerFormat::kFp4>, grid, dim3(kThreads), kSmem, stream, args, count_segments);
  } else {
    constexpr int kSmem = Layout<IndexerFormat::kFp8>::kSmem;
    static const bool set = (set_max_dynamic_smem(scores_e4m3_kernel<IndexerFormat::kFp8>, kSmem), true);
    (void)set;
    launch_dependent(scores_e4m3_kernel<IndexerFormat::kFp8>, grid, dim3(kThreads), kSmem, stream, args, count_segments);
  }
}

}  // namespace dsv4::gpu
