// Sparse attention with the sink (attention.h).
#include "cuda/kernels/attention.h"

#include <algorithm>

#include "cuda/kernels/launch_check.h"
#include "cuda/device.h"
#include "cuda/kernels/cache_access.cuh"
#include "cuda/kernels/numerics.cuh"
#include "cuda/kernels/reduce.cuh"
#include "numerics/exp_float.h"

namespace dsv4::gpu {
namespace {

constexpr int kDim = 512, kNope = 448;
constexpr int kKeys = 64;         // keys per chunk
constexpr int kRow = kDim + 8;    // shared row stride in bf16 values (bank spread)
constexpr int kThreads = 256;     // 8 warps: row tiles of 16 heads x output column groups
// Shared memory of a CTA of kHeads heads: its queries and one chunk of keys.
constexpr int smem_bytes(int heads) { return (heads + kKeys) * kRow * 2; }
constexpr int kMaxSplitTokens = 256;  // splits * tokens bound of the partial buffers

struct KeySet {
  int n_window = 0, first = 0, n_keys = 0;
};

__device__ __forceinline__ KeySet key_set(const AttentionArgs& a, const DeviceStep& st, int t) {
  KeySet k;
  const int p = st.positions[t];
  k.n_window = min(a.window, p + 1);
  k.first = p + 1 - k.n_window;
  int n_comp = 0;
  if (a.ratio == 4) n_comp = a.top_count[t];
  else if (a.ratio == 128) n_comp = (p + 1) / 128;
  k.n_keys = k.n_window + n_comp;
  return k;
}

// The cache entry of key i of token t (window positions first, then compressed entries).
__device__ __forceinline__ EntryBytes key_entry(const AttentionArgs& a, const DeviceStep& st, int t, int row,
                                                const KeySet& ks, int i, bool* ok) {
  std::int64_t slot;
  const DeviceCacheGroup* g;
  int layer_slot;
  if (i < ks.n_window) {
    g = &st.groups[a.window_group];
    layer_slot = a.window_layer_slot;
    slot = table_slot(*g, row, ks.first + i);
  } else {
    g = &st.groups[a.compressed_group];
    layer_slot = a.compressed_layer_slot;
    const int c = i - ks.n_window;
    const std::int64_t entry = a.ratio == 4 ? a.top_idx[static_cast<std::int64_t>(t) * a.top_k + c] : c;
    slot = table_slot(*g, row, entry);
  }
  *ok = slot >= 0;
  return entry_bytes(*g, slot < 0 ? 0 : slot, layer_slot);
}

// Dims [128 * part, 128 * part + 128) of a key as bf16 bits (fp8 nope dims times their block
// scale: exact in bf16).
__device__ void load_key_part(const EntryBytes& e, bool fp8, int part, std::uint16_t* dst) {
  const int d0 = part * 128;
  if (!fp8) {
    const uint4* src = reinterpret_cast<const uint4*>(e.data + d0 * 2);
    uint4* out = reinterpret_cast<uint4*>(dst);
    DSV4_UNROLL
    for (int i = 0; i < 16; ++i) out[i] = src[i];
    return;
  }
  for (int d = d0; d < d0 + 128; d += 16) {
    if (d < kNope) {
      const uint4 raw = *reinterpret_cast<const uint4*>(e.data + d);
      const float s = ue8m0_value(e.scales[d / 64]);
      DSV4_UNROLL
      for (int j = 0; j < 16; ++j) dst[d - d0 + j] = bf16_bits(e4m3_value(static_cast<std::uint8_t>(byte_of(raw, j))) * s);
    } else {
      const uint4* src = reinterpret_cast<const uint4*>(e.data + kNope + (d - kNope) * 2);
      uint4* out = reinterpret_cast<uint4*>(dst + (d - d0));
      out[0] = src[0];
      out[1] = src[1];
    }
  }
}

__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
  return static_cast<std::uint32_t>(bf16_bits(lo)) | (static_cast<std::uint32_t>(bf16_bits(hi)) << 16);
}
__device__ __forceinline__ std::uint32_t pack_bits(std::uint16_t lo, std::uint16_t hi) {
  return static_cast<std::uint32_t>(lo) | (static_cast<std::uint32_t>(hi) << 16);
}

// Output value of dims (d, d + 1) of a head: bf16, then the inverse RoPE on rope dims, bf16.
__device__ __forceinline__ void finish_pair(float v0, float v1, int d, const float* cs, std::uint16_t* out) {
  float x0 = round_bf16(v0), x1 = round_bf16(v1);
  if (d >= kNope) {
    const int i = (d - kNope) / 2;
    const float c = cs[i], s = cs[kRopeHalf + i];
    const float y0 = add_rn(mul_rn(x0, c), mul_rn(x1, s));
    const float y1 = sub_rn(mul_rn(x1, c), mul_rn(x0, s));
    x0 = round_bf16(y0);
    x1 = round_bf16(y1);
  }
  out[d] = bf16_bits(x0);
  out[d + 1] = bf16_bits(x1);
}

// A CTA takes kHeads heads (64: 4 row tiles x 2 column halves of warps; 16, for steps with few
// tokens: 1 row tile x 8 column groups, every warp computing the same scores) -- the same
// arithmetic per head either way.
template <int kHeads>
__global__ void __launch_bounds__(kThreads, 1) attention_kernel(AttentionArgs a) {
  constexpr int kRowTiles = kHeads / 16, kColGroups = 8 / kRowTiles;
  constexpr int kWarpDims = kDim / kColGroups, kNTiles = kWarpDims / 8;
  DSV4_DYNAMIC_SMEM(std::uint16_t, smem);
  std::uint16_t* qs = smem;                  // [kHeads][kRow]
  std::uint16_t* ks = smem + kHeads * kRow;  // [64 keys][kRow]
  const DeviceStep& st = *a.step;
  const int t = blockIdx.x;
  if (t >= st.n_tokens) return;
  const int hg = blockIdx.y, split = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
  const int wr = warp % kRowTiles, wc = warp / kRowTiles;
  const int row = st.token_row[t];
  const KeySet keys = key_set(a, st, t);
  const int chunks = (keys.n_keys + kKeys - 1) / kKeys;
  const int per_split = (chunks + a.splits - 1) / a.splits;
  const int c_begin = split * per_split, c_end = min(chunks, c_begin + per_split);

  for (int idx = tid; idx < kHeads * (kDim / 8); idx += kThreads) {
    const int h = idx / (kDim / 8), part = idx % (kDim / 8);
    const int head = hg * kHeads + h;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (head < a.heads) v = *reinterpret_cast<const uint4*>(a.q + (static_cast<std::int64_t>(t) * a.heads + head) * kDim + part * 8);
    *reinterpret_cast<uint4*>(qs + h * kRow + part * 8) = v;
  }

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[kNTiles][4];
  DSV4_UNROLL
  for (int nj = 0; nj < kNTiles; ++nj)
    DSV4_UNROLL
    for (int e = 0; e < 4; ++e) o[nj][e] = 0.0f;

  for (int c = c_begin; c < c_end; ++c) {
    __syncthreads();  // the previous chunk's keys are no longer read
    {
      const int key = tid >> 2, part = tid & 3;
      const int i = c * kKeys + key;
      std::uint16_t* dst = ks + key * kRow + part * 128;
      bool ok = false;
      EntryBytes e{nullptr, nullptr};
      if (i < keys.n_keys) e = key_entry(a, st, t, row, keys, i, &ok);
      if (ok) {
        load_key_part(e, a.kv_fp8, part, dst);
      } else {
        for (int d = 0; d < 128; d += 8) *reinterpret_cast<uint4*>(dst + d) = make_uint4(0, 0, 0, 0);
      }
    }
    __syncthreads();

    // S = Q K^T for this warp's 16 heads and the chunk's 64 keys.
    float s[8][4];
    DSV4_UNROLL
    for (int ni = 0; ni < 8; ++ni)
      DSV4_UNROLL
      for (int e = 0; e < 4; ++e) s[ni][e] = 0.0f;
    const std::uint16_t* qa = qs + (wr * 16 + g) * kRow + tig * 2;
    DSV4_UNROLL
    for (int kk = 0; kk < kDim / 16; ++kk) {
      std::uint32_t af[4];
      af[0] = *reinterpret_cast<const std::uint32_t*>(qa + kk * 16);
      af[1] = *reinterpret_cast<const std::uint32_t*>(qa + 8 * kRow + kk * 16);
      af[2] = *reinterpret_cast<const std::uint32_t*>(qa + kk * 16 + 8);
      af[3] = *reinterpret_cast<const std::uint32_t*>(qa + 8 * kRow + kk * 16 + 8);
      DSV4_UNROLL
      for (int ni = 0; ni < 8; ++ni) {
        const std::uint16_t* kb = ks + (ni * 8 + g) * kRow + kk * 16 + tig * 2;
        std::uint32_t bf[2];
        bf[0] = *reinterpret_cast<const std::uint32_t*>(kb);
        bf[1] = *reinterpret_cast<const std::uint32_t*>(kb + 8);
        mma_m16n8k16_bf16(s[ni], af, bf, s[ni]);
      }
    }
    // Online softmax over the chunk (rows g and g + 8; a row's values sit in one quad).
    float mx[2] = {-INFINITY, -INFINITY};
    DSV4_UNROLL
    for (int ni = 0; ni < 8; ++ni) {
      DSV4_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int key = c * kKeys + ni * 8 + tig * 2 + (e & 1);
        s[ni][e] = key < keys.n_keys ? s[ni][e] * a.scale : -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[ni][e]);
      }
    }
    float corr[2], sum[2] = {0.0f, 0.0f};
    DSV4_UNROLL
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m[r], mx[r]);
      corr[r] = m[r] == -INFINITY ? 0.0f : exp_float(m[r] - m_new);
      m[r] = m_new;
    }
    std::uint32_t pf[8][2];  // P as bf16 pairs: [n-tile][row half]
    DSV4_UNROLL
    for (int ni = 0; ni < 8; ++ni) {
      float p[4];
      DSV4_UNROLL
      for (int e = 0; e < 4; ++e) {
        p[e] = s[ni][e] == -INFINITY ? 0.0f : exp_float(s[ni][e] - m[e >> 1]);
        sum[e >> 1] += p[e];
      }
      pf[ni][0] = pack_bf16(p[0], p[1]);
      pf[ni][1] = pack_bf16(p[2], p[3]);
    }
    DSV4_UNROLL
    for (int r = 0; r < 2; ++r) {
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
      l[r] = l[r] * corr[r] + sum[r];
    }
    DSV4_UNROLL
    for (int nj = 0; nj < kNTiles; ++nj) {
      o[nj][0] *= corr[0];
      o[nj][1] *= corr[0];
      o[nj][2] *= corr[1];
      o[nj][3] *= corr[1];
    }
    // O += P V over this warp's 256 output dims (V = the same keys).
    DSV4_UNROLL
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const std::uint32_t af[4] = {pf[2 * kk][0], pf[2 * kk][1], pf[2 * kk + 1][0], pf[2 * kk + 1][1]};
      const std::uint16_t* v0 = ks + (kk * 16 + tig * 2) * kRow + wc * kWarpDims + g;
      DSV4_UNROLL
      for (int nj = 0; nj < kNTiles; ++nj) {
        const std::uint16_t* vb = v0 + nj * 8;
        std::uint32_t bf[2];
        bf[0] = pack_bits(vb[0], vb[kRow]);
        bf[1] = pack_bits(vb[8 * kRow], vb[9 * kRow]);
        mma_m16n8k16_bf16(o[nj], af, bf, o[nj]);
      }
    }
  }

  const float* cs = (a.compressed_rope ? st.rope_compressed : st.rope_window) + static_cast<std::int64_t>(t) * 2 * kRopeHalf;
  DSV4_UNROLL
  for (int r = 0; r < 2; ++r) {
    const int head = hg * kHeads + wr * 16 + g + 8 * r;
    if (head < a.heads && a.splits == 1) {
      const float den = l[r] + exp_float(a.sink[head] - m[r]);
      std::uint16_t* out = a.out + (static_cast<std::int64_t>(t) * a.heads + head) * kDim;
      DSV4_UNROLL
      for (int nj = 0; nj < kNTiles; ++nj) {
        const int d = wc * kWarpDims + nj * 8 + tig * 2;
        finish_pair(o[nj][2 * r] / den, o[nj][2 * r + 1] / den, d, cs, out);
      }
    } else if (head < a.heads) {
      const std::int64_t base = (static_cast<std::int64_t>(split) * a.capacity + t) * a.heads + head;
      float* acc = a.part_acc + base * kDim;
      DSV4_UNROLL
      for (int nj = 0; nj < kNTiles; ++nj) {
        const int d = wc * kWarpDims + nj * 8 + tig * 2;
        acc[d] = o[nj][2 * r];
        acc[d + 1] = o[nj][2 * r + 1];
      }
      if (wc == 0 && tig == 0) {
        a.part_ml[base * 2] = m[r];
        a.part_ml[base * 2 + 1] = l[r];
      }
    }
  }
}

// Merges the split states of one (token, head): 128 threads, 4 dims each.
__global__ void combine_kernel(AttentionArgs a) {
  const DeviceStep& st = *a.step;
  const int t = blockIdx.x, head = blockIdx.y;
  if (t >= st.n_tokens) return;
  float big = -INFINITY;
  for (int s = 0; s < a.splits; ++s) {
    const std::int64_t base = (static_cast<std::int64_t>(s) * a.capacity + t) * a.heads + head;
    big = fmaxf(big, a.part_ml[base * 2]);
  }
  const int d0 = threadIdx.x * 4;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, total = 0.0f;
  for (int s = 0; s < a.splits; ++s) {
    const std::int64_t base = (static_cast<std::int64_t>(s) * a.capacity + t) * a.heads + head;
    const float ms = a.part_ml[base * 2];
    if (ms == -INFINITY) continue;
    const float w = exp_float(ms - big);
    total += a.part_ml[base * 2 + 1] * w;
    DSV4_UNROLL
    for (int j = 0; j < 4; ++j) acc[j] += a.part_acc[base * kDim + d0 + j] * w;
  }
  const float den = total + exp_float(a.sink[head] - big);
  const float* cs = (a.compressed_rope ? st.rope_compressed : st.rope_window) + static_cast<std::int64_t>(t) * 2 * kRopeHalf;
  std::uint16_t* out = a.out + (static_cast<std::int64_t>(t) * a.heads + head) * kDim;
  finish_pair(acc[0] / den, acc[1] / den, d0, cs, out);
  finish_pair(acc[2] / den, acc[3] / den, d0 + 2, cs, out);
}

}  // namespace

int attention_splits(std::int64_t tokens, std::int64_t heads, std::int64_t max_keys, int sm_count) {
  const std::int64_t ctas = tokens * ((heads + 63) / 64);
  if (tokens <= 0 || ctas >= sm_count) return 1;
  const std::int64_t chunks = (max_keys + kKeys - 1) / kKeys;
  std::int64_t splits = std::min<std::int64_t>((2 * sm_count + ctas - 1) / ctas, chunks);
  splits = std::min<std::int64_t>(splits, std::max<std::int64_t>(1, kMaxSplitTokens / tokens));
  return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(splits, 32)));
}

void sparse_attention(const AttentionArgs& args, gpu_stream_t stream) {
  if (args.capacity <= 0) return;
  if (args.splits < 1 || (args.splits > 1 && (args.part_acc == nullptr || args.part_ml == nullptr)))
    launch_error("sparse_attention: {} splits without partial buffers", {args.splits});
  if (args.splits > 1 && args.splits * args.capacity > kMaxSplitTokens)
    launch_error("sparse_attention: {} splits x {} tokens exceed the partial buffers", {args.splits, args.capacity});
  // Few CTAs at 64 heads each (decode): 16 heads a CTA, four times the CTAs.
  const std::int64_t ctas64 = static_cast<std::int64_t>(args.capacity) * ((args.heads + 63) / 64) * args.splits;
  const int heads_per_cta = args.heads_per_cta != 0 ? args.heads_per_cta : (ctas64 < args.sm_count ? 16 : 64);
  if (heads_per_cta != 16 && heads_per_cta != 64) launch_error("sparse_attention: {} heads a CTA (16 or 64)", {heads_per_cta});
  const unsigned head_groups = static_cast<unsigned>((args.heads + heads_per_cta - 1) / heads_per_cta);
  const dim3 grid(static_cast<unsigned>(args.capacity), head_groups, static_cast<unsigned>(args.splits));
  if (heads_per_cta == 16) {
    static const bool smem_set = (set_max_dynamic_smem(attention_kernel<16>, smem_bytes(16)), true);
    (void)smem_set;
    launch(attention_kernel<16>, grid, dim3(kThreads), smem_bytes(16), stream, args);
  } else {
    static const bool smem_set = (set_max_dynamic_smem(attention_kernel<64>, smem_bytes(64)), true);
    (void)smem_set;
    launch(attention_kernel<64>, grid, dim3(kThreads), smem_bytes(64), stream, args);
  }
  if (args.splits > 1) {
    launch(combine_kernel, dim3(static_cast<unsigned>(args.capacity), static_cast<unsigned>(args.heads)), dim3(kDim / 4), 0,
           stream, args);
  }
}

}  // namespace dsv4::gpu
