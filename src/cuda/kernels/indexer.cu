// Lightning indexer kernels (indexer.h).
#include "cuda/kernels/indexer.h"

#include <cmath>

#include "cuda/kernels/launch_check.h"
#include "cuda/device.h"
#include "cuda/kernels/cache_access.cuh"
#include "cuda/kernels/numerics.cuh"
#include "cuda/kernels/reduce.cuh"

namespace dsv4::gpu {
namespace {

constexpr int kDim = 128, kRopeDims = 64;
constexpr int kMaxHeads = 64;
constexpr int kKeysPerBlock = 64;
constexpr int kPad = 8;  // bf16 values of padding per shared row (bank spread)

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

// ---- scores: one block per (token, 64 entries); 4 warps of 16 heads, bf16 mma ----------------
__device__ void load_key(const IndexerArgs& a, const EntryBytes& e, int half, std::uint16_t* dst /* 64 values */) {
  const int d0 = half * 64;
  if (a.format == IndexerFormat::kBf16) {
    const std::uint16_t* src = reinterpret_cast<const std::uint16_t*>(e.data) + d0;
    for (int d = 0; d < 64; ++d) dst[d] = src[d];
  } else if (a.format == IndexerFormat::kFp4) {
    for (int d = 0; d < 64; d += 2) {
      const std::uint8_t byte = e.data[(d0 + d) / 2];
      const float s = ue8m0_value(e.scales[(d0 + d) / 32]);
      dst[d] = bf16_bits(e2m1_value(byte & 0xf) * s);
      dst[d + 1] = bf16_bits(e2m1_value(byte >> 4) * s);
    }
  } else {
    const float s = *reinterpret_cast<const float*>(e.scales);
    for (int d = 0; d < 64; ++d) dst[d] = bf16_bits(e4m3_value(e.data[d0 + d]) * s);
  }
}

__global__ void __launch_bounds__(128) scores_kernel(IndexerArgs a, float weight_scale) {
  __shared__ __align__(16) std::uint16_t qs[kMaxHeads][kDim + kPad];
  __shared__ __align__(16) std::uint16_t ks[kKeysPerBlock][kDim + kPad];
  __shared__ float wts[kMaxHeads];
  __shared__ float colsum[4][kKeysPerBlock];
  const DeviceStep& st = *a.step;
  const int i = blockIdx.y;
  const int t = a.token0 + i;
  if (t >= st.n_tokens) return;
  const std::int64_t n = (static_cast<std::int64_t>(st.positions[t]) + 1) / 4;
  const std::int64_t j0 = static_cast<std::int64_t>(blockIdx.x) * kKeysPerBlock;
  if (j0 >= n) return;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
  const int row = st.token_row[t];
  // Queries (rows past `heads` are zero) and weights.
  for (int idx = tid; idx < kMaxHeads * kDim; idx += 128) {
    const int h = idx / kDim, d = idx % kDim;
    qs[h][d] = h < a.heads ? a.q[(static_cast<std::int64_t>(t) * a.heads + h) * kDim + d] : std::uint16_t{0};
  }
  if (tid < kMaxHeads) {
    wts[tid] = tid < a.heads ? round_bf16(bf16_value(a.weights[static_cast<std::int64_t>(t) * a.heads + tid]) * weight_scale)
                             : 0.0f;
  }
  // Keys: two threads per entry, 64 dims each.
  {
    const int key = tid >> 1, half = tid & 1;
    const std::int64_t j = j0 + key;
    std::uint16_t* dst = &ks[key][half * 64];
    const DeviceCacheGroup& g_keys = st.groups[a.key_group];
    const std::int64_t slot = j < n ? table_slot(g_keys, row, j) : -1;
    if (slot >= 0) {
      load_key(a, entry_bytes(g_keys, slot, a.layer_slot), half, dst);
    } else {
      for (int d = 0; d < 64; ++d) dst[d] = 0;
    }
  }
  __syncthreads();
  float acc[8][4];
  DSV4_UNROLL
  for (int ni = 0; ni < 8; ++ni)
    DSV4_UNROLL
    for (int e = 0; e < 4; ++e) acc[ni][e] = 0.0f;
  DSV4_UNROLL
  for (int kk = 0; kk < kDim / 16; ++kk) {
    std::uint32_t af[4];
    const std::uint16_t* qa = &qs[warp * 16 + g][kk * 16 + tig * 2];
    af[0] = *reinterpret_cast<const std::uint32_t*>(qa);
    af[1] = *reinterpret_cast<const std::uint32_t*>(qa + 8 * (kDim + kPad));
    af[2] = *reinterpret_cast<const std::uint32_t*>(qa + 8);
    af[3] = *reinterpret_cast<const std::uint32_t*>(qa + 8 * (kDim + kPad) + 8);
    DSV4_UNROLL
    for (int ni = 0; ni < 8; ++ni) {
      std::uint32_t bf[2];
      const std::uint16_t* kb = &ks[ni * 8 + g][kk * 16 + tig * 2];
      bf[0] = *reinterpret_cast<const std::uint32_t*>(kb);
      bf[1] = *reinterpret_cast<const std::uint32_t*>(kb + 8);
      mma_m16n8k16_bf16(acc[ni], af, bf, acc[ni]);
    }
  }
  // Per entry: sum over heads of bf16(ReLU(bf16(q.k)) * w), rounded to bf16.
  DSV4_UNROLL
  for (int ni = 0; ni < 8; ++ni) {
    DSV4_UNROLL
    for (int e = 0; e < 2; ++e) {
      const int h0 = warp * 16 + g, h1 = h0 + 8;
      const float p0 = round_bf16(fmaxf(round_bf16(acc[ni][e]), 0.0f) * wts[h0]);
      const float p1 = round_bf16(fmaxf(round_bf16(acc[ni][2 + e]), 0.0f) * wts[h1]);
      float s = p0 + p1;
      s += __shfl_xor_sync(0xffffffffu, s, 4);
      s += __shfl_xor_sync(0xffffffffu, s, 8);
      s += __shfl_xor_sync(0xffffffffu, s, 16);
      if (g == 0) colsum[warp][ni * 8 + tig * 2 + e] = s;
    }
  }
  __syncthreads();
  if (tid < kKeysPerBlock && j0 + tid < n) {
    const float total = ((colsum[0][tid] + colsum[1][tid]) + colsum[2][tid]) + colsum[3][tid];
    a.scores[static_cast<std::int64_t>(i) * a.max_entries + j0 + tid] = round_bf16(total);
  }
}

// ---- top-k: radix select on the 16-bit keys of bf16 scores, then an ordered compaction --------
__device__ __forceinline__ std::uint32_t score_key(float f) {
  std::uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) u = 0xff800000u;  // NaN ranks as -inf (top_k_indices)
  if ((u & 0x7fffffffu) == 0) u = 0;               // -0 ties with +0
  const std::uint32_t k = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return k >> 16;  // bf16 values: the low half is zero
}

constexpr int kTopThreads = 1024;

// Exclusive prefix of `flag` over the block (in thread order) plus the block total; `warp_tot`
// is 32 ints of shared memory.
__device__ __forceinline__ int block_exclusive(bool flag, int* warp_tot, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned mask = __ballot_sync(0xffffffffu, flag);
  const int before = __popc(mask & ((1u << lane) - 1u));
  __syncthreads();
  if (lane == 0) warp_tot[warp] = __popc(mask);
  __syncthreads();
  int offset = 0, sum = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) {
    if (w < warp) offset += warp_tot[w];
    sum += warp_tot[w];
  }
  *total = sum;
  return offset + before;
}

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
  // Two 8-bit radix passes find the k-th largest key T and how many entries equal to T to take.
  std::uint32_t prefix = 0;
  int need = k;
  for (int pass = 0; pass < 2; ++pass) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const std::uint32_t key = score_key(sc[j]);
      if (pass == 0) {
        atomicAdd(&hist[key >> 8], 1);
      } else if ((key >> 8) == prefix) {
        atomicAdd(&hist[key & 0xff], 1);
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0, b = 255;
      for (; b > 0; --b) {
        if (above + hist[b] >= need) break;
        above += hist[b];
      }
      pick[0] = b;
      pick[1] = need - above;  // entries of this bin still needed
    }
    __syncthreads();
    prefix = pass == 0 ? static_cast<std::uint32_t>(pick[0]) : (prefix << 8) | static_cast<std::uint32_t>(pick[0]);
    need = pick[1];
    __syncthreads();
  }
  const std::uint32_t threshold = prefix;  // entries above it all go; `need` of those equal, lowest index first
  int eq_carry = 0, out_carry = 0;
  for (std::int64_t base = 0; base < n; base += blockDim.x) {
    const std::int64_t j = base + threadIdx.x;
    const std::uint32_t key = j < n ? score_key(sc[j]) : 0u;
    const bool gt = j < n && key > threshold;
    const bool eq = j < n && key == threshold;
    int eq_total = 0;
    const int eq_rank = eq_carry + block_exclusive(eq, warp_tot, &eq_total);
    const bool sel = gt || (eq && eq_rank < need);
    int sel_total = 0;
    const int pos = out_carry + block_exclusive(sel, warp_tot, &sel_total);
    if (sel) out[pos] = static_cast<std::int32_t>(j);
    eq_carry += eq_total;
    out_carry += sel_total;
  }
  if (threadIdx.x == 0) a.top_count[i] = k;
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
  // indexer_weight_scale: the product taken in double, then fp32.
  const float weight_scale =
      static_cast<float>(std::pow(static_cast<double>(kDim), -0.5) * std::pow(static_cast<double>(args.heads), -0.5));
  launch(scores_kernel,
         dim3(static_cast<unsigned>((args.max_entries + kKeysPerBlock - 1) / kKeysPerBlock), static_cast<unsigned>(args.capacity)),
         dim3(128), 0, stream, args, weight_scale);
}

void indexer_top_k(const IndexerArgs& args, gpu_stream_t stream) {
  if (args.capacity <= 0) return;
  launch(top_k_kernel, dim3(static_cast<unsigned>(args.capacity)), dim3(kTopThreads), 0, stream, args);
}

}  // namespace dsv4::gpu
