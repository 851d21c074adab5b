// Sparse attention with the sink (attention.h).
#include "cuda/kernels/attention.h"

#include <algorithm>

#include "cuda/kernels/launch_check.h"
#include "cuda/device.h"
#include "cuda/kernels/cache_access.cuh"
#include "cuda/kernels/dependent_launch.cuh"
#include "cuda/kernels/numerics.cuh"
#include "numerics/exp_float.h"

namespace dsv4::gpu {
namespace {

constexpr int kDim = 512, kNope = 448;
constexpr int kHeads = 64;         // heads of a CTA: the M of one warpgroup mma
constexpr int kKeys = 64;          // keys per chunk
constexpr int kConsumers = 256;    // warpgroups 0 and 1: the products and the softmax
constexpr int kProducers = 128;    // warpgroup 2: key addresses, loads, dequantization
constexpr int kThreads = kConsumers + kProducers;
// Register budgets after the split (setmaxnreg). The CTA starts with kLaunchRegs a thread (what
// __launch_bounds__ leaves: 64K / 384, a multiple of 8); the consumers' increase must come out of
// what the producer's decrease frees, or their setmaxnreg_inc waits forever.
constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
constexpr int kConsumerRegs = 184, kProducerRegs = 136;
static_assert(kConsumers * (kConsumerRegs - kLaunchRegs) <= kProducers * (kLaunchRegs - kProducerRegs),
              "the consumers' registers must come from the producer's");
constexpr int kAhead = 4;          // key addresses are resolved over 4 chunks ahead (see below)
constexpr int kMaxSplitTokens = 256;  // splits * tokens bound of the partial buffers
constexpr int kMaxSplits = 32;        // a split's state a lane of the combine's first warp
constexpr unsigned kConsumerBarrier = 1;  // the named barrier of the two consumer warpgroups
// Probabilities inside the key loop are exp2((s - max) log2 e): the hardware's exp2 (about 2 ulp
// in fp32, like exp_float) instead of exp_float's 30-odd operations per key and head; the sink
// term and the split merge keep exp_float. The probabilities are rounded to bf16 before P.V.
constexpr float kLog2e = 1.4426950408889634f;

// Shared-memory tiles in the warpgroup mma's unswizzled layout (device.h): core matrices of 8 rows
// x 8 bf16 values (128 contiguous bytes). Queries [64 heads][512 dims] and keys [64 keys][512 dims]
// put the 64 core matrices along the dims of 8 rows side by side (128 bytes apart) and the 8-row
// groups 8 KB apart; the probabilities [64 heads][64 keys] 128 and 1024 bytes apart. The key tile
// serves Q.K^T as a K-major B (rows = keys) and P.V as an MN-major B (the same bytes, transposed).
constexpr int kCore = 128, kRowGroup = (kDim / 8) * kCore, kPRowGroup = (kKeys / 8) * kCore;
template <int kGroupBytes = kRowGroup>
__device__ __forceinline__ int tile_offset(int row, int col) {
  return (row / 8) * kGroupBytes + (col / 8) * kCore + (row % 8) * 16 + (col % 8) * 2;
}

// Shared memory: queries, two bf16 key tiles (the producer fills one while the consumers read the
// other), the chunk's probabilities, row maxima (by chunk parity) and row sums of the two consumer
// warpgroups, the RoPE table, and the full / empty mbarriers of the two key tiles.
constexpr int kQBytes = kHeads * kDim * 2, kKBytes = kKeys * kDim * 2, kPBytes = kHeads * kKeys * 2;
// The producer's staging of its next key's raw entry (asynchronous copies, a thread's own slots):
// 9 units of 16 bytes and the 16 aligned bytes holding the key's 8 scale bytes.
constexpr int kStageUnits = 9, kStageBytes = kProducers * kStageUnits * 16, kStageScaleBytes = kProducers * 16;
constexpr int kSmemBytes =
    kQBytes + 2 * kKBytes + kPBytes + 6 * kHeads * 4 + 2 * kRopeHalf * 4 + 4 * 8 + kStageBytes + kStageScaleBytes;
static_assert(kSmemBytes <= 227 * 1024, "the CTA must fit the SM's shared memory");
static_assert(kNope == 448 && kDim - kNope == 64, "the dequantization's split of an entry into 16-byte units");

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

// A row's block table in one cache group (executor/step_plan.cc table_slot).
struct RowTable {
  std::int64_t base = 0;
  std::int32_t begin = 0, end = 0;
};
__device__ __forceinline__ RowTable row_table(const DeviceCacheGroup& g, int row) {
  return {g.table_base[row], g.table_start[row], g.table_start[row + 1]};
}

// Entries of a cache block: a power of two in every V4 layout (a shift and a mask), else divided.
struct EntriesPerBlock {
  std::int32_t n = 1, shift = -1;
  __device__ __forceinline__ void set(std::int32_t entries) {
    n = max(entries, 1);
    const int s = __ffs(n) - 1;
    shift = n == (1 << s) ? s : -1;
  }
  __device__ __forceinline__ std::int32_t block_of(std::int32_t index) const {
    return shift >= 0 ? index >> shift : index / n;
  }
  __device__ __forceinline__ std::int32_t entry_of(std::int32_t index) const {
    return shift >= 0 ? index & (n - 1) : index % n;
  }
};

// The reads that find a token's key i (the producer's address chain in attention_kernel).
// Indices are positions or entries of one sequence: 32-bit.
struct KeyLookup {
  const DeviceCacheGroup* win_group;   // copies of the two groups in shared memory
  const DeviceCacheGroup* comp_group;
  const std::int32_t* top_idx;         // CSA: this token's list
  std::int32_t win_slot, comp_slot, ratio;
  KeySet keys;
  RowTable win, comp;
  EntriesPerBlock win_epb, comp_epb;
  __device__ __forceinline__ bool in_window(int i) const { return i < keys.n_window; }
  __device__ __forceinline__ const DeviceCacheGroup& group(int i) const { return in_window(i) ? *win_group : *comp_group; }
  __device__ __forceinline__ EntriesPerBlock epb(int i) const { return in_window(i) ? win_epb : comp_epb; }
  // The index of key i (-1: past the token's keys). Reads top_idx on CSA layers. The reads below
  // are predicated loads (load_global_or): their results are waited for where they are used, a
  // chunk later, not at the select an early return would make.
  __device__ __forceinline__ std::int32_t index(int i) const {
    const std::int32_t plain = i >= keys.n_keys ? -1 : in_window(i) ? keys.first + i : i - keys.n_window;
    if (ratio != 4) return plain;
    return load_global_or(top_idx + (in_window(i) ? 0 : i - keys.n_window), !in_window(i) && i < keys.n_keys, plain);
  }
  // The block id holding it (-1: not held).
  __device__ __forceinline__ std::int32_t block(int i, std::int32_t index) const {
    const bool w = in_window(i);
    const std::int64_t k = epb(i).block_of(index) - (w ? win.base : comp.base);
    const std::int32_t begin = w ? win.begin : comp.begin, end = w ? win.end : comp.end;
    const bool held = index >= 0 && k >= 0 && begin + k < end;
    return load_global_or(group(i).block_ids + (held ? begin + k : 0), held, -1);
  }
  // Its page (-1: not held).
  __device__ __forceinline__ std::int32_t page(int i, std::int32_t block) const {
    const DeviceCacheGroup& g = group(i);
    const std::int64_t at = static_cast<std::int64_t>(block) * g.layers + (in_window(i) ? win_slot : comp_slot);
    return load_global_or(g.page_table + (block >= 0 ? at : 0), block >= 0, -1);
  }
};

// The inverse RoPE of rope pair i (dims 448 + 2 i, + 1) of bf16 values, rounded to bf16.
__device__ __forceinline__ void rope_back_pair(float& x0, float& x1, int i, const float* cs) {
  const float c = cs[i], s = cs[kRopeHalf + i];
  const float y0 = add_rn(mul_rn(x0, c), mul_rn(x1, s));
  const float y1 = sub_rn(mul_rn(x1, c), mul_rn(x0, s));
  x0 = round_bf16(y0);
  x1 = round_bf16(y1);
}

// Output value of dims (d, d + 1) of a head: bf16, then the inverse RoPE on rope dims, bf16.
__device__ __forceinline__ void finish_pair(float v0, float v1, int d, const float* cs, std::uint16_t* out) {
  float x0 = round_bf16(v0), x1 = round_bf16(v1);
  if (d >= kNope) rope_back_pair(x0, x1, (d - kNope) / 2, cs);
  out[d] = bf16_bits(x0);
  out[d + 1] = bf16_bits(x1);
}

// A CTA takes the 64 heads of one token (blockIdx.x = token x head groups + head group: the CTAs of
// a token's head groups run side by side, so the second finds the keys in L2) and a range of its
// key chunks (split blockIdx.z), with three warpgroups in two roles that hand the two key tiles
// back and forth through mbarriers:
//   producer (warpgroup 2): resolves key addresses, loads chunk c's fp8 entries into registers,
//      waits until the consumers released the tile of chunk c - 2 ("empty"), dequantizes into it
//      (exact: fp8 code x power-of-two scale; rope dims copied) and marks it "full"
//   consumers (warpgroups 0 and 1): warpgroup w owns keys 32 w .. 32 w + 31 of a chunk for Q.K^T and
//      output dims 256 w .. 256 w + 255 for P.V. Per chunk, once its tile is full:
//      1. S = Q K^T: 32 asynchronous m64n32k16 products per warpgroup from shared memory
//      2. online softmax: the chunk's row maxima through shared memory (both warpgroups then hold
//         the same running max), P = exp(S - max) rounded to bf16 into the probability tile; each
//         thread keeps the sum of its own probabilities
//      3. O += P V: 4 m64n256k16 products per warpgroup, V read as the transposed key tile; then the
//         tile is released to the producer
// So the loads and dequantization of the next chunk run beside the products of this one. bf16
// caches skip the dequantization: the producer copies their entries into the tile.
__global__ void __launch_bounds__(kThreads, 1) attention_kernel(AttentionArgs a) {
  DSV4_DYNAMIC_SMEM(std::uint8_t, smem);
  std::uint8_t* qs = smem;                          // [64 heads][512] tile
  std::uint8_t* ks = qs + kQBytes;                  // [2][64 keys][512] tiles
  std::uint8_t* ps = ks + 2 * kKBytes;              // [64 heads][64 keys] tile
  float* red_max = reinterpret_cast<float*>(ps + kPBytes);  // [chunk parity][warpgroup][kHeads]
  float* red_sum = red_max + 4 * kHeads;                     // [warpgroup][kHeads]
  float* rope_s = red_sum + 2 * kHeads;                      // [2 * kRopeHalf] cos, sin
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(rope_s + 2 * kRopeHalf);  // [2] tile written
  std::uint64_t* empty = full + 2;                                                   // [2] tile read
  std::uint8_t* key_stage = reinterpret_cast<std::uint8_t*>(empty + 2);             // producer: [thread][9][16]
  std::uint8_t* key_stage_scales = key_stage + kStageBytes;                         // producer: [thread][16]

  __shared__ DeviceCacheGroup groups_s[2];  // the window's and the compressed entries'

  const DeviceStep& st = *a.step;
  const int groups = (a.heads + kHeads - 1) / kHeads;
  const int t = static_cast<int>(blockIdx.x) / groups;
  if (t >= st.n_tokens) return;
  const int hg = static_cast<int>(blockIdx.x) % groups, split = blockIdx.z;
  const int tid = threadIdx.x;
  const int row = st.token_row[t];

  if (tid == 0) {
    groups_s[0] = st.groups[a.window_group];
    groups_s[1] = st.groups[a.compressed_group];
    for (int b = 0; b < 2; ++b) {
      mbarrier_init(&full[b], kProducers);
      mbarrier_init(&empty[b], kConsumers);
    }
  }
  KeyLookup look;
  look.win_group = &groups_s[0];
  look.comp_group = &groups_s[1];
  look.top_idx = a.top_idx + static_cast<std::int64_t>(t) * a.top_k;
  look.win_slot = a.window_layer_slot;
  look.comp_slot = a.compressed_layer_slot;
  look.ratio = a.ratio;
  look.keys = key_set(a, st, t);
  look.win = row_table(st.groups[a.window_group], row);
  if (a.ratio != 0) look.comp = row_table(st.groups[a.compressed_group], row);
  look.win_epb.set(st.groups[a.window_group].entries_per_block);
  look.comp_epb.set(st.groups[a.compressed_group].entries_per_block);
  const int chunks = (look.keys.n_keys + kKeys - 1) / kKeys;
  const int per_split = (chunks + a.splits - 1) / a.splits;
  const int c_begin = min(chunks, split * per_split), c_end = min(chunks, c_begin + per_split);
  // Copies of absent heads or keys read nothing (zero fill) but still name a global address.
  const std::uint8_t* nowhere = reinterpret_cast<const std::uint8_t*>(a.q);
  __syncthreads();  // groups_s, the mbarriers; from here on the roles never meet at __syncthreads

  if (tid >= kConsumers) {
    // ---- producer ----
    setmaxnreg_dec<kProducerRegs>();
    // Thread p handles keys lane_key and lane_key + 32 of each chunk, and of their entries the
    // 16-byte units part, part + 4, ..., part + 24 of the 28 fp8 units (unit part + 4 q has scale
    // byte q: every thread uses the 7 scales, one a unit) and units part, part + 4 of the 8 bf16
    // rope units. So every lane of a warp does the same work (no divergent paths). A warp takes 8
    // keys, lane l key l % 8 and part l / 8: the four lanes of a key read 64 contiguous bytes an
    // instruction (8 keys, 8 cache lines an instruction; 32 keys a warp made each touch 32 lines
    // and cost about 20%), and a quarter warp's 16-byte stores fill the 8 rows of one core matrix.
    const int p = tid - kConsumers, part = (p % 32) / 8, lane_key = 8 * (p / 32) + p % 8;
    // Key i of a token is found in three dependent reads -- its index (a window position, a CSA
    // top-k entry, an HCA entry), the block id from the row's block table, the page from the page
    // table -- then its bytes are loaded. Each read is issued one chunk before its result is used,
    // so the chain runs kAhead chunks ahead of the loads and its latency hides behind them; the
    // pages of chunk c + 1 are known while chunk c is dequantized.
    // (32-bit page ids: a page read is used one chunk later, so nothing may consume it at once.)
    std::int32_t idx[2] = {-1, -1}, blk_index[2] = {-1, -1}, blk[2] = {-1, -1}, next_pg[2] = {-1, -1},
                 next_pg_index[2] = {-1, -1}, pg[2] = {-1, -1}, pg_index[2] = {-1, -1};
    // Address step of chunk c: chunk c + 1 takes its pages, c + 2 paged, c + 3 blocked, c + 4 indexed.
    auto address_step = [&](int c) {
      DSV4_UNROLL
      for (int k = 0; k < 2; ++k) {
        const int i2 = (c + 2) * kKeys + lane_key + 32 * k, i3 = i2 + kKeys, i4 = i3 + kKeys;
        if (c + 1 >= c_begin && c + 1 < c_end) {
          pg[k] = next_pg[k];
          pg_index[k] = next_pg_index[k];
        }
        if (c + 2 >= c_begin && c + 2 < c_end) {
          next_pg[k] = look.page(i2, blk[k]);
          next_pg_index[k] = blk_index[k];
        }
        if (c + 3 >= c_begin && c + 3 < c_end) {
          blk[k] = look.block(i3, idx[k]);
          blk_index[k] = idx[k];
        }
        if (c + 4 >= c_begin && c + 4 < c_end) idx[k] = look.index(i4);
      }
    };
    // Where the thread's key k of chunk c lives (pg / pg_index hold chunk c's pages): its data and
    // scales, or `nowhere` when it is not held (false).
    auto entry_of = [&](int c, int k, const std::uint8_t*& data, const std::uint8_t*& scales) {
      const int i = c * kKeys + lane_key + 32 * k;
      const DeviceCacheGroup& grp = look.group(i);
      const bool held = pg[k] >= 0;
      const std::int64_t e = held ? look.epb(i).entry_of(pg_index[k]) : 0;
      const std::uint8_t* base = grp.pool + static_cast<std::int64_t>(held ? pg[k] : 0) * grp.page_bytes;
      data = held ? base + e * grp.data_bytes : nowhere;
      scales = held ? base + static_cast<std::int64_t>(grp.entries_per_block) * grp.data_bytes + e * grp.scale_bytes : nowhere;
      return held;
    };
    for (int c = c_begin - kAhead; c < c_begin; ++c) address_step(c);
    if (a.kv_fp8) {
      // A thread's 16-byte units of a key: 7 fp8 (unit part + 4 q: dims 16 (part + 4 q) ..., scale
      // byte q), then 2 of rope (part, part + 4 of the 8).
      constexpr int kFp8Units = kNope / 16 / 4, kRopeUnits = (kDim - kNope) * 2 / 16 / 4;  // 7, 2
      static_assert(kFp8Units + kRopeUnits == kStageUnits);
      auto unit_offset = [&](int q) { return q < kFp8Units ? (part + 4 * q) * 16 : kNope + (part + 4 * (q - kFp8Units)) * 16; };
      // Key 0 of a chunk goes through the thread's stage slots by asynchronous copies (no registers,
      // no load scoreboards), key 1 through registers: so each key's loads are in flight while the
      // other key is dequantized. The scale bytes come in the aligned 16 bytes that hold them (an
      // entry has 8, and a page's scale array starts 16-byte aligned).
      std::uint8_t* my_stage = key_stage + (tid - kConsumers) * kStageUnits * 16;
      std::uint8_t* my_scales = key_stage_scales + (tid - kConsumers) * 16;
      auto stage_key0 = [&](int c) {
        const std::uint8_t* data;
        const std::uint8_t* scales;
        const bool ok = entry_of(c, 0, data, scales);
        DSV4_UNROLL
        for (int q = 0; q < kStageUnits; ++q) cp_async_16_zfill(my_stage + q * 16, ok ? data + unit_offset(q) : nowhere, ok);
        const std::uint8_t* scale16 = reinterpret_cast<const std::uint8_t*>(reinterpret_cast<std::uintptr_t>(scales) & ~std::uintptr_t{15});
        cp_async_16_zfill(my_scales, ok ? scale16 : nowhere, ok);
        cp_async_commit();
        return static_cast<int>(reinterpret_cast<std::uintptr_t>(scales) & 8u);  // where its 8 bytes sit
      };
      // Key `key` of the tile from its units and scale bytes: exact (fp8 code x power-of-two scale,
      // rope dims copied).
      auto dequantize_key = [&](const uint4 (&v)[kStageUnits], uint2 sc, std::uint8_t* tile, int key) {
        // Scale exponents in [15, 142] (every real one) take the five-instruction conversion. (The
        // entry's 8th scale byte is padding: tested as 127.)
        const std::uint32_t lo = sc.x, hi = (sc.y & 0xffffffu) | 0x7f000000u;
        const bool fast = ue8m0x4_in_pow2_range(lo) && ue8m0x4_in_pow2_range(hi);
        // FP8 unit q (16 codes: dims 16 u .. 16 u + 15, u = part + 4 q), each code pair through
        // `pair` (the codes in the low 16 bits -> two bf16), into the tile.
        auto convert_unit = [&](int q, auto pair) {
          const std::uint32_t w[4] = {v[q].x, v[q].y, v[q].z, v[q].w};
          std::uint32_t o8[8];
          DSV4_UNROLL
          for (int j = 0; j < 4; ++j) {
            o8[2 * j] = pair(w[j] & 0xffffu);
            o8[2 * j + 1] = pair(w[j] >> 16);
          }
          const int u = part + 4 * q;
          *reinterpret_cast<uint4*>(tile + tile_offset(key, 16 * u)) = make_uint4(o8[0], o8[1], o8[2], o8[3]);
          *reinterpret_cast<uint4*>(tile + tile_offset(key, 16 * u + 8)) = make_uint4(o8[4], o8[5], o8[6], o8[7]);
        };
        auto scale_byte = [&](int q) { return (q < 4 ? lo >> (8 * q) : hi >> (8 * (q - 4))) & 0xffu; };
        if (fast) {
          DSV4_UNROLL
          for (int q = 0; q < kFp8Units; ++q) {
            const std::uint32_t factor = ue8m0_pow2_factor(scale_byte(q));
            convert_unit(q, [factor](std::uint32_t codes) { return e4m3x2_to_bf16x2_pow2(codes, factor); });
          }
        } else {
          DSV4_UNROLL
          for (int q = 0; q < kFp8Units; ++q) {
            const float scale = ue8m0_value(static_cast<std::uint8_t>(scale_byte(q)));
            convert_unit(q, [scale](std::uint32_t codes) { return e4m3x2_to_bf16x2(codes, scale); });
          }
        }
        DSV4_UNROLL
        for (int r = 0; r < kRopeUnits; ++r)  // 8 bf16 rope dims as stored
          *reinterpret_cast<uint4*>(tile + tile_offset(key, kNope + 8 * (part + 4 * r))) = v[kFp8Units + r];
      };
      int scale_offset = c_begin < c_end ? stage_key0(c_begin) : 0;  // of key 0's 8 scale bytes in its 16
      for (int c = c_begin; c < c_end; ++c) {
        const int n = c - c_begin, b = n & 1;
        std::uint8_t* tile = ks + b * kKBytes;
        // The address step first: it uses loads of the last step, which are complete. Issued after
        // key 1's loads, it waited for them (loads share scoreboards), and so did the stage.
        const std::uint8_t* data1;
        const std::uint8_t* scales1;
        const bool ok1 = entry_of(c, 1, data1, scales1);
        address_step(c);  // pg: chunk c + 1's pages
        uint4 v1[kStageUnits];
        DSV4_UNROLL
        for (int q = 0; q < kStageUnits; ++q) v1[q] = load_global_v4_or_zero(data1 + unit_offset(q), ok1);
        const uint2 sc1 = load_global_v2_or_zero(scales1, ok1);
        if (n >= 2) mbarrier_wait(&empty[b], ((n >> 1) & 1) ^ 1);  // chunk n - 2's tile released
        cp_async_wait_all();  // key 0's stage (this thread's own copies)
        {
          uint4 v0[kStageUnits];
          DSV4_UNROLL
          for (int q = 0; q < kStageUnits; ++q) v0[q] = *reinterpret_cast<const uint4*>(my_stage + q * 16);
          const uint2 sc0 = *reinterpret_cast<const uint2*>(my_scales + scale_offset);
          dequantize_key(v0, sc0, tile, lane_key);
        }
        if (c + 1 < c_end) scale_offset = stage_key0(c + 1);  // (its slots were read above)
        dequantize_key(v1, sc1, tile, lane_key + 32);
        fence_proxy_async_shared();  // the tile, written by threads, is read by the products
        mbarrier_arrive(&full[b]);
      }
    } else {
      // bf16 caches: the entries are copied into the tile as they are.
      for (int c = c_begin; c < c_end; ++c) {
        const int n = c - c_begin, b = n & 1;
        std::uint8_t* tile = ks + b * kKBytes;
        const std::uint8_t* data[2];
        const std::uint8_t* scales[2];
        bool ok[2];
        DSV4_UNROLL
        for (int k = 0; k < 2; ++k) ok[k] = entry_of(c, k, data[k], scales[k]);
        address_step(c);
        if (n >= 2) mbarrier_wait(&empty[b], ((n >> 1) & 1) ^ 1);
        DSV4_UNROLL
        for (int k = 0; k < 2; ++k)
          for (int u = part * 16; u < part * 16 + 16; ++u)
            cp_async_16_zfill(tile + tile_offset(lane_key + 32 * k, 8 * u), ok[k] ? data[k] + u * 16 : nowhere, ok[k]);
        cp_async_wait_all();
        fence_proxy_async_shared();
        mbarrier_arrive(&full[b]);
      }
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<kConsumerRegs>();
  const int lane = tid & 31, g = lane >> 2, tig = lane & 3;
  // Warpgroup and warp within it (rows 16 wq ..), broadcast from lane 0 so that the compiler knows
  // them warp-uniform: the products' descriptors then stay in uniform registers.
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0), wq = __shfl_sync(0xffffffffu, (tid >> 5) & 3, 0);

  // Queries, copied asynchronously: a warp fills four whole core matrices (8 heads x 4 x 8 dims)
  // per pass. And the token's RoPE cos / sin for the epilogue's inverse rotation.
  for (int idx = tid; idx < kHeads * (kDim / 8); idx += kConsumers) {
    const int h = (idx / 512) * 8 + idx % 8, part = (idx / 8) % 64;
    const int head = hg * kHeads + h;
    const bool ok = head < a.heads;
    cp_async_16_zfill(qs + tile_offset(h, part * 8),
                      ok ? reinterpret_cast<const std::uint8_t*>(
                               a.q + (static_cast<std::int64_t>(t) * a.heads + head) * kDim + part * 8)
                         : nowhere,
                      ok);
  }
  if (tid < 2 * kRopeHalf / 4) {
    const float* cs =
        (a.compressed_rope ? st.rope_compressed : st.rope_window) + static_cast<std::int64_t>(t) * 2 * kRopeHalf;
    cp_async_16(rope_s + 4 * tid, cs + 4 * tid);
  }
  cp_async_commit();

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[128];  // O[16 wq + g + 8 (e / 2)][256 wg + 8 j + 2 tig + e % 2] = o[4 j + e]
  DSV4_UNROLL
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;

  // Descriptors of the products' operands at their first k step (device.h, wgmma_descriptor), in
  // key tile 0; tile 1 is kKBytes further.
  const std::uint64_t q_desc = wgmma_descriptor(qs, kCore, kRowGroup);
  const std::uint64_t k_desc = wgmma_descriptor(ks + (32 * wg / 8) * kRowGroup, kCore, kRowGroup);
  const std::uint64_t p_desc = wgmma_descriptor(ps, kCore, kPRowGroup);
  const std::uint64_t v_desc = wgmma_descriptor(ks + (256 * wg / 8) * kCore, kRowGroup, kCore);
  // A descriptor's start address counts 16-byte units in its low bits.
  auto advanced = [](std::uint64_t desc, int bytes) { return desc + static_cast<std::uint64_t>(bytes >> 4); };

  cp_async_wait<0>();
  fence_proxy_async_shared();  // the query tile, copied by threads, is read by the products
  named_barrier_sync(kConsumerBarrier, kConsumers);
  for (int c = c_begin; c < c_end; ++c) {
    const int n = c - c_begin, b = n & 1;
    mbarrier_wait(&full[b], (n >> 1) & 1);  // the producer's tile of this chunk

    // S = Q K^T for this warpgroup's 32 keys.
    float s[16];
    DSV4_UNROLL
    for (int i = 0; i < 16; ++i) s[i] = 0.0f;
    wgmma_fence();
    DSV4_UNROLL
    for (int kk = 0; kk < kDim / 16; ++kk)
      wgmma_m64n32k16_bf16(s, advanced(q_desc, kk * 2 * kCore), advanced(k_desc, b * kKBytes + kk * 2 * kCore), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(s);

    // Online softmax over the chunk (rows g and g + 8 of the warp's 16; a row's values sit in one
    // quad). The maxima alternate between two buffers by chunk, so a warpgroup a chunk ahead never
    // overwrites what the other still reads.
    float* chunk_max = red_max + (n & 1) * 2 * kHeads;
    float mx[2] = {-INFINITY, -INFINITY};
    if ((c + 1) * kKeys <= look.keys.n_keys) {  // (every chunk but a token's last: no key to mask)
      DSV4_UNROLL
      for (int i = 0; i < 16; ++i) {
        s[i] *= a.scale;
        mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
      }
    } else {
      DSV4_UNROLL
      for (int i = 0; i < 16; ++i) {
        const int key = c * kKeys + 32 * wg + 8 * (i / 4) + tig * 2 + (i & 1);
        s[i] = key < look.keys.n_keys ? s[i] * a.scale : -INFINITY;
        mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
      }
    }
    DSV4_UNROLL
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      if (tig == 0) chunk_max[wg * kHeads + wq * 16 + g + 8 * r] = mx[r];
    }
    named_barrier_sync(kConsumerBarrier, kConsumers);
    float corr[2];
    DSV4_UNROLL
    for (int r = 0; r < 2; ++r) {
      const int h = wq * 16 + g + 8 * r;
      const float m_new = fmaxf(m[r], fmaxf(chunk_max[h], chunk_max[kHeads + h]));
      corr[r] = m[r] == -INFINITY ? 0.0f : exp2f((m[r] - m_new) * kLog2e);
      m[r] = m_new;
    }
    // P into the probability tile (the other warpgroup's products of the last chunk, which read
    // it, are done: it passed the barrier above after them); each thread sums its own
    // probabilities (its row sums are completed across the quad and the two warpgroups after the
    // last chunk). The running maxima are finite here: every chunk has a key below n_keys.
    float psum[2] = {0.0f, 0.0f};
    DSV4_UNROLL
    for (int j = 0; j < 4; ++j) {
      float pr[4];
      DSV4_UNROLL
      for (int e = 0; e < 4; ++e) pr[e] = exp2f((s[4 * j + e] - m[e >> 1]) * kLog2e);  // masked keys: exp2(-inf) = 0
      const int key = 32 * wg + 8 * j + tig * 2;
      *reinterpret_cast<std::uint32_t*>(ps + tile_offset<kPRowGroup>(wq * 16 + g, key)) = pack_bf16x2(pr[0], pr[1]);
      *reinterpret_cast<std::uint32_t*>(ps + tile_offset<kPRowGroup>(wq * 16 + g + 8, key)) = pack_bf16x2(pr[2], pr[3]);
      psum[0] += pr[0] + pr[1];
      psum[1] += pr[2] + pr[3];
    }
    fence_proxy_async_shared();  // the probability tile is read by the products
    named_barrier_sync(kConsumerBarrier, kConsumers);
    l[0] = l[0] * corr[0] + psum[0];
    l[1] = l[1] * corr[1] + psum[1];
    // (Skipped while no row max of the warp moved: a factor of 1 changes nothing.)
    if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
      DSV4_UNROLL
      for (int j = 0; j < 32; ++j) {
        o[4 * j] *= corr[0];
        o[4 * j + 1] *= corr[0];
        o[4 * j + 2] *= corr[1];
        o[4 * j + 3] *= corr[1];
      }
    }
    // O += P V over this warpgroup's 256 output dims (V = the chunk's key tile).
    wgmma_fence();
    DSV4_UNROLL
    for (int kk = 0; kk < kKeys / 16; ++kk)
      wgmma_m64n256k16_bf16_bt(o, advanced(p_desc, kk * 2 * kCore), advanced(v_desc, b * kKBytes + kk * 2 * kRowGroup),
                               true);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(o);
    mbarrier_arrive(&empty[b]);  // the tile is free for chunk n + 2
  }
  // The split-K combine (launched dependent) may be scheduled once every CTA is past its keys: its
  // CTAs then wait at grid_dependency_wait instead of behind a launch gap.
  if (tid == 0) grid_dependents_launch();
  // The row sums: across the quad, then the two warpgroups' halves through shared memory.
  DSV4_UNROLL
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    if (tig == 0) red_sum[wg * kHeads + wq * 16 + g + 8 * r] = l[r];
  }

  // Epilogue through shared memory (the key tiles and the probability tile, no longer read once
  // both consumer warpgroups are here; the producer wrote its last tile before they read it), so
  // global stores are whole 16-byte pieces of a head's row: the bf16 output (rows of 520 values: a
  // warp's 8 rows fall on different banks), or with splits the fp32 partial sums (rows of 520
  // floats) and the row max / sum.
  named_barrier_sync(kConsumerBarrier, kConsumers);
  DSV4_UNROLL
  for (int r = 0; r < 2; ++r) l[r] = red_sum[wq * 16 + g + 8 * r] + red_sum[kHeads + wq * 16 + g + 8 * r];
  const int valid_heads = min(kHeads, a.heads - hg * kHeads);
  if (a.splits == 1) {
    constexpr int kOutRow = kDim + 8;
    std::uint16_t* stage = reinterpret_cast<std::uint16_t*>(ks);
    DSV4_UNROLL
    for (int r = 0; r < 2; ++r) {
      const int h = wq * 16 + g + 8 * r;
      if (h >= valid_heads) continue;
      // Times the reciprocal of the denominator (the CPU twin divides: within 1.5 ulp of fp32 before
      // the bf16 rounding, which that rarely moves).
      const float inv = 1.0f / (l[r] + exp_float(a.sink[hg * kHeads + h] - m[r]));
      DSV4_UNROLL
      for (int j = 0; j < 32; ++j) {
        const int d = 256 * wg + 8 * j + 2 * tig;  // a rope pair's two dims sit in one thread
        std::uint32_t pair = pack_bf16x2(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
        if (8 * j >= kNope - 256 && wg == 1) {
          float x0 = __uint_as_float(pair << 16), x1 = __uint_as_float(pair & 0xffff0000u);
          rope_back_pair(x0, x1, (d - kNope) / 2, rope_s);
          pair = static_cast<std::uint32_t>(bf16_bits(x0)) | (static_cast<std::uint32_t>(bf16_bits(x1)) << 16);
        }
        *reinterpret_cast<std::uint32_t*>(stage + h * kOutRow + d) = pair;
      }
    }
    named_barrier_sync(kConsumerBarrier, kConsumers);
    for (int idx = tid; idx < valid_heads * (kDim / 8); idx += kConsumers) {
      const int h = idx / (kDim / 8), part = idx % (kDim / 8);
      *reinterpret_cast<uint4*>(a.out + (static_cast<std::int64_t>(t) * a.heads + hg * kHeads + h) * kDim + part * 8) =
          *reinterpret_cast<const uint4*>(stage + h * kOutRow + part * 8);
    }
  } else {
    constexpr int kAccRow = kDim + 8;
    float* stage = reinterpret_cast<float*>(ks);
    static_assert(kHeads * kAccRow * 4 <= 2 * kKBytes + kPBytes, "the fp32 stage must fit the key and probability tiles");
    DSV4_UNROLL
    for (int r = 0; r < 2; ++r) {
      const int h = wq * 16 + g + 8 * r;
      if (h >= valid_heads) continue;
      DSV4_UNROLL
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<float2*>(stage + h * kAccRow + 256 * wg + 8 * j + 2 * tig) =
            make_float2(o[4 * j + 2 * r], o[4 * j + 2 * r + 1]);
      if (wg == 0 && tig == 0) {
        const std::int64_t base = (static_cast<std::int64_t>(split) * a.capacity + t) * a.heads + hg * kHeads + h;
        a.part_ml[base * 2] = m[r];
        a.part_ml[base * 2 + 1] = l[r];
      }
    }
    named_barrier_sync(kConsumerBarrier, kConsumers);
    for (int idx = tid; idx < valid_heads * (kDim / 4); idx += kConsumers) {
      const int h = idx / (kDim / 4), part = idx % (kDim / 4);
      const std::int64_t base = (static_cast<std::int64_t>(split) * a.capacity + t) * a.heads + hg * kHeads + h;
      *reinterpret_cast<float4*>(a.part_acc + base * kDim + part * 4) =
          *reinterpret_cast<const float4*>(stage + h * kAccRow + part * 4);
    }
  }
}

// Merges the split states of one (token, head): 128 threads, 4 dims each. The splits' maxima and
// sums are read at once (a lane of the first warp a split) and their weights shared, so the only
// serial reads are each thread's partial sums, eight splits in flight. The sums still run in
// split order, so a result does not depend on timing.
__global__ void combine_kernel(AttentionArgs a) {
  __shared__ float weight_s[kMaxSplits], sum_s[kMaxSplits];
  __shared__ float den_s;
  grid_dependency_wait();  // (launched dependent: the partial states come from attention_kernel)
  const DeviceStep& st = *a.step;
  const int t = blockIdx.x, head = blockIdx.y, tid = threadIdx.x;
  if (t >= st.n_tokens) return;
  auto state_of = [&](int s) { return (static_cast<std::int64_t>(s) * a.capacity + t) * a.heads + head; };
  if (tid < 32) {
    const bool held = tid < a.splits;
    const float ms = held ? a.part_ml[state_of(tid) * 2] : -INFINITY;
    const float ls = held ? a.part_ml[state_of(tid) * 2 + 1] : 0.0f;
    float big = ms;
    DSV4_UNROLL
    for (int off = 16; off > 0; off >>= 1) big = fmaxf(big, __shfl_xor_sync(0xffffffffu, big, off));
    const float w = ms == -INFINITY ? 0.0f : exp_float(ms - big);  // a split without keys: weight 0
    weight_s[tid] = w;
    sum_s[tid] = ls * w;
    __syncwarp();
    if (tid == 0) {
      float total = 0.0f;
      for (int s = 0; s < a.splits; ++s) total += sum_s[s];
      den_s = total + exp_float(a.sink[head] - big);
    }
  }
  __syncthreads();
  const int d0 = tid * 4;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  DSV4_UNROLL_8
  for (int s = 0; s < a.splits; ++s) {
    const float w = weight_s[s];
    const float4 part = *reinterpret_cast<const float4*>(a.part_acc + state_of(s) * kDim + d0);
    if (w == 0.0f) continue;  // no keys in that split (m = -inf)
    acc[0] += part.x * w;
    acc[1] += part.y * w;
    acc[2] += part.z * w;
    acc[3] += part.w * w;
  }
  const float den = den_s;
  const float* cs = (a.compressed_rope ? st.rope_compressed : st.rope_window) + static_cast<std::int64_t>(t) * 2 * kRopeHalf;
  std::uint16_t* out = a.out + (static_cast<std::int64_t>(t) * a.heads + head) * kDim;
  finish_pair(acc[0] / den, acc[1] / den, d0, cs, out);
  finish_pair(acc[2] / den, acc[3] / den, d0 + 2, cs, out);
}

}  // namespace

// The split count with the fewest chunk times on the busiest SM: waves of CTAs (one CTA an SM)
// times the chunks of a split, plus one chunk's time for the combine step; the fewest splits
// among equals.
int attention_splits(std::int64_t tokens, std::int64_t heads, std::int64_t max_keys, int sm_count) {
  if (tokens <= 0 || sm_count <= 0) return 1;
  const std::int64_t ctas = tokens * ((heads + kHeads - 1) / kHeads);
  const std::int64_t chunks = std::max<std::int64_t>(1, (max_keys + kKeys - 1) / kKeys);
  const std::int64_t most = std::min<std::int64_t>({chunks, kMaxSplits, std::max<std::int64_t>(1, kMaxSplitTokens / tokens)});
  std::int64_t best = 1, best_cost = -1;
  for (std::int64_t s = 1; s <= most; ++s) {
    const std::int64_t waves = (ctas * s + sm_count - 1) / sm_count;
    const std::int64_t cost = waves * ((chunks + s - 1) / s) + (s > 1 ? 1 : 0);
    if (best_cost < 0 || cost < best_cost) {
      best = s;
      best_cost = cost;
    }
  }
  return static_cast<int>(best);
}

void sparse_attention(const AttentionArgs& args, gpu_stream_t stream) {
  if (args.capacity <= 0) return;
  if (args.splits < 1 || (args.splits > 1 && (args.part_acc == nullptr || args.part_ml == nullptr)))
    launch_error("sparse_attention: {} splits without partial buffers", {args.splits});
  if (args.splits > kMaxSplits) launch_error("sparse_attention: {} splits (at most {})", {args.splits, kMaxSplits});
  if (args.splits > 1 && args.splits * args.capacity > kMaxSplitTokens)
    launch_error("sparse_attention: {} splits x {} tokens exceed the partial buffers", {args.splits, args.capacity});
  const unsigned groups = static_cast<unsigned>((args.heads + kHeads - 1) / kHeads);
  const dim3 grid(static_cast<unsigned>(args.capacity) * groups, 1, static_cast<unsigned>(args.splits));
  static const bool smem_set = (set_max_dynamic_smem(attention_kernel, kSmemBytes), true);
  (void)smem_set;
  launch(attention_kernel, grid, dim3(kThreads), kSmemBytes, stream, args);
  if (args.splits > 1) {
    launch_dependent(combine_kernel, dim3(static_cast<unsigned>(args.capacity), static_cast<unsigned>(args.heads)),
                     dim3(kDim / 4), 0, stream, args);
  }
}

}  // namespace dsv4::gpu
