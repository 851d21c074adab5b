// The weight-streaming product of dense fp8 weights for few rows (gemm_stream.h): f16 wgmma on
// the exact f16 values of the e4m3 codes. CPU twin: cpu/linear.cc linear().
#include "cuda/kernels/gemm_stream.h"

#include <algorithm>
#include <cstdint>

#include "cuda/device.h"
#include "cuda/kernels/launch_check.h"
#include "cuda/kernels/numerics.cuh"

namespace dsv4::gpu {
namespace {

constexpr int kWarpgroups = 2;      // a CTA's warpgroups: each streams its own tiles; the activations are shared
constexpr int kWgThreads = 128;
constexpr int kThreads = kWarpgroups * kWgThreads;
constexpr int kWeightTile = 64;     // weight rows of a tile (wgmma's M)
constexpr int kUnitK = 128;         // k of a unit: one weight-scale block, one activation scale
constexpr int kSmemLimit = 225 * 1024;  // dynamic shared memory a CTA may take (227 KiB less the static part)
constexpr std::int64_t kPartialBudget = std::int64_t{8} << 20;  // fp32 partials (32 MiB)

constexpr int kDepth = 4;           // units of weight a thread has in flight (its registers)
// CTAs a multiprocessor holds by registers (the plan in gemm_stream_fp8 counts on it): ptxas
// gave 188 registers a thread at 64 rows and 177 at 32 (one CTA of 256 threads), at most 128
// below (two).
template <int NT>
inline constexpr int kCtasPerSm = NT >= 32 ? 1 : 2;

struct StreamArgs {
  const std::uint8_t* codes;   // activations [rows][k] e4m3
  const float* a_scales;       // [rows][units]
  std::int64_t k;
  const std::uint8_t* w;       // weight [n][k] e4m3
  const float* w_scales;       // [ceil(n / 128)][units]
  std::int64_t n;
  GemmOutput out;
  std::int64_t rows;
  const std::int32_t* rows_dev;
  int tiles, units, units_per_split, splits, token_blocks;
  float* partial;              // [tile][token block][split][64 x NT] when splits > 1
  std::int32_t* counters;      // [tile][token block]
};

// Shared memory of a CTA whose split has `units` units: the split's activations as f16 (the B
// operand) and their scales [unit][NT]. The weight never passes through shared memory.
// Then each warpgroup's output stage: a tile's [NT rows][64 outputs], rows padded (bf16: 72
// values, 144 bytes; fp32: 68, 272 bytes) so that the fragment writes meet every bank once.
__host__ __device__ constexpr int stage_row_bytes(bool f32) { return f32 ? 272 : 144; }
__host__ __device__ constexpr int smem_bytes(int nt, int units, bool f32, bool fp8 = false) {
  return units * (nt * kUnitK * (fp8 ? 1 : 2) + nt * 4) + kWarpgroups * nt * stage_row_bytes(f32);
}

// The k order of a unit. wgmma's A fragment gives thread q of a row the positions 2q, 2q + 1,
// 2q + 8, 2q + 9 of every k16 step; any order of k that both operands share gives the same sums, so
// position p of step j holds k = 64 (j / 4) + 16 q + 4 (j % 4) + i with q = (p % 8) / 2 and i =
// p % 2 + 2 (p / 8). Then a thread's four weight values of a step are one 32-bit word of a row: word
// j % 4 of the row's 16-byte chunk q + 4 (j / 4).
//
// B (activations), K-major without swizzle (device.h wgmma_m64k16_f16; f16 core matrices of 8 rows
// x 8 positions): unit u, row r, position group pg (8 positions) at u * NT * 256 + pg * NT * 16 +
// (r / 8) * 128 + (r % 8) * 16 (step j starts at group 2 j: lbo NT * 16, sbo 128).
//
// kFp8 (StreamProducts::kFp8): the products are FP8 wgmma on the codes themselves, four k32 steps a
// unit chained through the accumulator, the reference's fp8_gemm arithmetic (each 128-wide block's
// sum as the tensor core forms it, numerics/fp8_dot_model.h). Step s holds exactly k 32 s .. 32 s +
// 31 of the unit (the tensor core's sum depends on which products meet), in an order that gives
// thread q the 8 contiguous codes 32 s + 8 q .. 32 s + 8 q + 7 of each of its rows: positions 4 q ..
// 4 q + 3 (a[0], a[1]) are k 32 s + 8 q + i, positions 16 + 4 q + i (a[2], a[3]) k 32 s + 8 q + 4 + i.
// B takes the same order, as e4m3 codes (core matrices of 8 rows x 16 positions): unit u, row r,
// position group pg (16 positions) at u * NT * 128 + pg * NT * 16 + (r / 8) * 128 + (r % 8) * 16
// (step s starts at group 2 s: lbo NT * 16, sbo 128).

template <int NT, bool kFp8>
__global__ void __launch_bounds__(kThreads, kCtasPerSm<NT>) stream_fp8_kernel(StreamArgs args) {
  DSV4_DYNAMIC_SMEM(std::uint8_t, smem);
  __shared__ int last_arrival[kWarpgroups];
  const std::int64_t limit = args.rows_dev == nullptr ? args.rows
                                                      : (args.rows < *args.rows_dev ? args.rows : static_cast<std::int64_t>(*args.rows_dev));
  const std::int64_t tok0 = static_cast<std::int64_t>(blockIdx.z) * NT;
  if (tok0 >= limit) return;  // the whole CTA (and every split of this token block) leaves
  const int count = static_cast<int>(limit - tok0 < NT ? limit - tok0 : NT);
  const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, q = lane & 3;
  // Warpgroup and its thread / warp (wg broadcast from lane 0, so the compiler knows it warp-uniform).
  const int wg = __shfl_sync(0xffffffffu, tid / kWgThreads, 0), wtid = tid % kWgThreads, warp = wtid >> 5;
  const int split = blockIdx.y;
  const int u_begin = split * args.units_per_split;
  const int n_units = (args.units - u_begin < args.units_per_split ? args.units - u_begin : args.units_per_split);
  const std::int64_t k = args.k;
  std::uint8_t* b_smem = smem;
  float* sa_smem = reinterpret_cast<float*>(b_smem + n_units * NT * kUnitK * (kFp8 ? 1 : 2));
  std::uint8_t* out_stage = reinterpret_cast<std::uint8_t*>(sa_smem + n_units * NT) + wg * NT * stage_row_bytes(args.out.f32);

  // The warpgroup's tiles: worker = kWarpgroups blockIdx.x + wg, + workers, ...; items = (tile,
  // unit) pairs in that order.
  const int worker = kWarpgroups * static_cast<int>(blockIdx.x) + wg, workers = kWarpgroups * static_cast<int>(gridDim.x);
  const int my_tiles = worker < args.tiles ? (args.tiles - worker + workers - 1) / workers : 0;
  const int items = my_tiles * n_units;
  auto tile_of = [&](int item) { return worker + (item / n_units) * workers; };
  // Thread (warp, g, q) holds weight rows 16 warp + g and + 8 (its rows of wgmma's A fragment),
  // 16-byte chunks q and q + 4 of each: raw[0], raw[1] row g, raw[2], raw[3] row g + 8. Each load
  // instruction of a warp reads 64 contiguous bytes of 8 rows. Units go from global memory into
  // the registers kDepth ahead.
  auto chunk_row = [&](int i) { return 16 * warp + g + 8 * (i >> 1); };
  auto chunk_col = [&](int i) { return q + 4 * (i & 1); };
  // The unit's weight-scale block comes with it (read where it is used, its latency stalled every
  // unit).
  // (kFp8: raw[i] holds rows g (i < 2) and g + 8, the 8 codes of thread q in steps 2 (i % 2) and
  // 2 (i % 2) + 1, each an 8-byte load: a warp's load reads 32 contiguous bytes of 8 rows.)
  auto load_unit = [&](int item, uint4 (&raw)[4], float& scale) {
    const int tile = tile_of(item), unit = u_begin + item % n_units;
    scale = args.w_scales[static_cast<std::int64_t>(tile / 2) * args.units + unit];
    const std::int64_t row0 = static_cast<std::int64_t>(tile) * kWeightTile;
    const std::int64_t k0 = static_cast<std::int64_t>(unit) * kUnitK;
    if constexpr (kFp8) {
      DSV4_UNROLL
      for (int h = 0; h < 2; ++h) {  // rows g and g + 8
        const int r = 16 * warp + g + 8 * h;
        const std::uint8_t* p = args.w + (row0 + r) * k + k0 + 8 * q;
        const bool row_ok = row0 + r < args.n;
        uint2 v[4];
        DSV4_UNROLL
        for (int st = 0; st < 4; ++st) v[st] = load_global_v2_or_zero(p + 32 * st, row_ok && k0 + 32 * st + 8 * q < k);
        raw[2 * h] = make_uint4(v[0].x, v[0].y, v[1].x, v[1].y);
        raw[2 * h + 1] = make_uint4(v[2].x, v[2].y, v[3].x, v[3].y);
      }
    } else {
      DSV4_UNROLL
      for (int i = 0; i < 4; ++i) {
        const int r = chunk_row(i), c = chunk_col(i);
        raw[i] = load_global_v4_or_zero(args.w + (row0 + r) * k + k0 + 16 * c, row0 + r < args.n && k0 + 16 * c < k);
      }
    }
  };

  uint4 buf[kDepth][4];
  float buf_scale[kDepth];
  DSV4_UNROLL
  for (int d = 0; d < kDepth; ++d)
    if (d < items) load_unit(d, buf[d], buf_scale[d]);
  // Meanwhile the split's activations, as f16 in the unit's k order: chunk c = 4 h + cq of a row
  // (16 codes, code 4 s + i) is step 4 h + s, positions 2 cq + i (i < 2) and 8 + 2 cq + i - 2. A
  // warp takes chunks cq = 0..3 of 8 rows (lane 4 (r % 8) + cq): its loads read 64 contiguous bytes
  // of each row, and each of its 4-byte stores covers the 32 banks once. Each thread has kBatch
  // loads in flight (one at a time cost a latency per chunk: ~15 us at 64 rows and k 1024).
  constexpr int kBatch = 8;
  const int total = NT * n_units * 8;
  auto chunk_of = [&](int i, int& r, int& ul, int& c) {
    const int group = i >> 5;
    r = 8 * (group % (NT / 8)) + ((i >> 2) & 7);
    ul = (group / (NT / 8)) >> 1;
    c = 4 * ((group / (NT / 8)) & 1) + (i & 3);
  };
  for (int i0 = tid; i0 < total; i0 += kThreads * kBatch) {
    uint4 v[kBatch];
    DSV4_UNROLL
    for (int b = 0; b < kBatch; ++b) {
      const int i = i0 + b * kThreads;
      int r, ul, c;
      chunk_of(i, r, ul, c);
      const std::int64_t kk = static_cast<std::int64_t>(u_begin + ul) * kUnitK + 16 * c;
      v[b] = load_global_v4_or_zero(args.codes + (tok0 + r) * k + kk, i < total && r < count && kk < k);
    }
    DSV4_UNROLL
    for (int b = 0; b < kBatch; ++b) {
      const int i = i0 + b * kThreads;
      if (i >= total) break;
      int r, ul, c;
      chunk_of(i, r, ul, c);
      const std::uint32_t w[4] = {v[b].x, v[b].y, v[b].z, v[b].w};
      if constexpr (kFp8) {
        // Chunk c of the unit is k 16 c ..: step c / 2, codes 16 (c % 2) + 4 gi + i: thread q' = 2 (c %
        // 2) + gi / 2, its half gi % 2 -- position 16 (gi % 2) + 4 q' + i.
        std::uint8_t* dst = b_smem + ul * (NT * 128) + (r >> 3) * 128 + (r & 7) * 16 + 8 * (c & 1);
        DSV4_UNROLL
        for (int gi = 0; gi < 4; ++gi)
          *reinterpret_cast<std::uint32_t*>(dst + (2 * (c >> 1) + (gi & 1)) * (NT * 16) + 4 * (gi >> 1)) = w[gi];
      } else {
        std::uint8_t* dst = b_smem + ul * (NT * 256) + (r >> 3) * 128 + (r & 7) * 16 + 4 * (c & 3);
        DSV4_UNROLL
        for (int s = 0; s < 4; ++s) {
          const int j = 4 * (c >> 2) + s;
          *reinterpret_cast<std::uint32_t*>(dst + (2 * j) * (NT * 16)) = e4m3x2_to_f16x2(w[s] & 0xffffu);
          *reinterpret_cast<std::uint32_t*>(dst + (2 * j + 1) * (NT * 16)) = e4m3x2_to_f16x2(w[s] >> 16);
        }
      }
    }
  }
  for (int i = tid; i < NT * n_units; i += kThreads) {
    const int ul = i / NT, r = i % NT;
    sa_smem[i] = r < count ? args.a_scales[(tok0 + r) * args.units + u_begin + ul] : 0.0f;
  }
  fence_proxy_async_shared();  // the activations, written by threads, are read by the products
  __syncthreads();  // (the last CTA-wide barrier: from here on each warpgroup runs alone)

  const int row_in_tile = 16 * warp + g;
  // A finished tile (v[4 m + e]: output row 16 warp + g + 8 (e / 2) of the tile, activation row
  // 8 m + 2 q + e % 2) goes out through the warpgroup's stage, so that the stores are 16-byte
  // pieces of an activation row (scalar stores per value took a fifth of the time at 64 rows).
  auto write_tile = [&](const float (&v)[NT / 2], int tile) {
    named_barrier_sync(1 + wg, kWgThreads);  // the stage's readers of the last tile are done
    const bool f32 = args.out.f32;
    const int row_bytes = stage_row_bytes(f32);
    DSV4_UNROLL
    for (int i = 0; i < NT / 2; ++i) {
      const int r = 8 * (i >> 2) + 2 * q + (i & 1), c = row_in_tile + 8 * ((i & 3) >> 1);
      if (f32) *reinterpret_cast<float*>(out_stage + r * row_bytes + 4 * c) = v[i];
      else *reinterpret_cast<std::uint16_t*>(out_stage + r * row_bytes + 2 * c) = bf16_bits(v[i]);
    }
    named_barrier_sync(1 + wg, kWgThreads);
    const std::int64_t n0 = static_cast<std::int64_t>(tile) * kWeightTile;
    const int per = f32 ? 4 : 8;  // values of a 16-byte piece
    const bool whole = n0 + kWeightTile <= args.n && args.out.ld % per == 0 &&
                       reinterpret_cast<std::uintptr_t>(args.out.data) % 16 == 0;
    const int pieces = kWeightTile / per;
    for (int t = wtid; t < NT * pieces; t += kWgThreads) {
      const int r = t / pieces, j = t % pieces;
      if (r >= count) break;  // (rows ascend with t)
      const std::uint8_t* src = out_stage + r * row_bytes + 16 * j;
      const std::int64_t at = (tok0 + r) * args.out.ld + n0 + per * j;
      if (whole) {
        std::uint8_t* dst = static_cast<std::uint8_t*>(args.out.data) + at * (f32 ? 4 : 2);
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
      } else {
        for (int e = 0; e < per && n0 + per * j + e < args.n; ++e) {
          if (f32) static_cast<float*>(args.out.data)[at + e] = reinterpret_cast<const float*>(src)[e];
          else static_cast<std::uint16_t*>(args.out.data)[at + e] = reinterpret_cast<const std::uint16_t*>(src)[e];
        }
      }
    }
  };
  float acc[NT / 2], part[NT / 2];
  DSV4_UNROLL
  for (int i = 0; i < NT / 2; ++i) acc[i] = part[i] = 0.0f;

  for (int base = 0; base < items; base += kDepth) {
    DSV4_UNROLL
    for (int d = 0; d < kDepth; ++d) {
      const int item = base + d;
      if (item >= items) break;
      const int ul = item % n_units, tile = tile_of(item);
      // The unit's A fragments, converted from the registers (exact), and its eight k16 steps in
      // one chain: f16 products are exact and f16 wgmma sums in fp32 (FP8 wgmma keeps fewer bits:
      // about 1e-4 relative on the H200, docs/perf.md). kFp8: the codes as they are, four k32 steps.
      std::uint32_t af[kFp8 ? 4 : 8][4];
      if constexpr (kFp8) {
        DSV4_UNROLL
        for (int st = 0; st < 4; ++st) {
          const uint4& rg = buf[d][st >> 1];
          const uint4& rh = buf[d][2 + (st >> 1)];
          af[st][0] = (st & 1) ? rg.z : rg.x;
          af[st][1] = (st & 1) ? rh.z : rh.x;
          af[st][2] = (st & 1) ? rg.w : rg.y;
          af[st][3] = (st & 1) ? rh.w : rh.y;
        }
        wgmma_fence();
        DSV4_UNROLL
        for (int st = 0; st < 4; ++st) {
          const std::uint64_t db = wgmma_descriptor(b_smem + ul * (NT * 128) + 2 * st * (NT * 16), NT * 16, 128);
          wgmma_m64k32_e4m3_rs<NT>(part, af[st], db, st != 0);
        }
      } else {
        DSV4_UNROLL
        for (int j = 0; j < 8; ++j) {
          const uint4& lo = buf[d][j >> 2];
          const uint4& hi = buf[d][2 + (j >> 2)];
          const std::uint32_t wl = (j & 3) == 0 ? lo.x : (j & 3) == 1 ? lo.y : (j & 3) == 2 ? lo.z : lo.w;
          const std::uint32_t wh = (j & 3) == 0 ? hi.x : (j & 3) == 1 ? hi.y : (j & 3) == 2 ? hi.z : hi.w;
          af[j][0] = e4m3x2_to_f16x2(wl & 0xffffu);
          af[j][1] = e4m3x2_to_f16x2(wh & 0xffffu);
          af[j][2] = e4m3x2_to_f16x2(wl >> 16);
          af[j][3] = e4m3x2_to_f16x2(wh >> 16);
        }
        wgmma_fence();
        DSV4_UNROLL
        for (int j = 0; j < 8; ++j) {
          const std::uint64_t db = wgmma_descriptor(b_smem + ul * (NT * 256) + 2 * j * (NT * 16), NT * 16, 128);
          wgmma_m64k16_f16_rs<NT>(part, af[j], db, j != 0);
        }
      }
      wgmma_commit();
      // The registers take the unit kDepth ahead while the products run.
      const float ws = buf_scale[d];
      if (item + kDepth < items) load_unit(item + kDepth, buf[d], buf_scale[d]);
      wgmma_wait<0>();
      wgmma_fence_operands(part);
      DSV4_UNROLL
      for (int j = 0; j < (kFp8 ? 4 : 8); ++j) wgmma_fence_operands(af[j]);
      // acc += the unit's sum x (weight block scale x activation scale); part[4 m + e]: weight row
      // 16 warp + g + 8 (e / 2), activation row 8 m + 2 q + e % 2.
      DSV4_UNROLL
      for (int m = 0; m < NT / 8; ++m) {
        const float2 sa = *reinterpret_cast<const float2*>(sa_smem + ul * NT + 8 * m + 2 * q);
        const float f0 = ws * sa.x, f1 = ws * sa.y;
        acc[4 * m + 0] += part[4 * m + 0] * f0;
        acc[4 * m + 1] += part[4 * m + 1] * f1;
        acc[4 * m + 2] += part[4 * m + 2] * f0;
        acc[4 * m + 3] += part[4 * m + 3] * f1;
      }
      if (ul != n_units - 1) continue;

      // The tile's k range is done: write it (one split), or hand it to the workspace.
      if (args.splits == 1) {
        write_tile(acc, tile);
      } else {
        const std::int64_t slot_index = static_cast<std::int64_t>(tile) * args.token_blocks + blockIdx.z;
        float* mine = args.partial + (slot_index * args.splits + split) * (kWeightTile * NT);
        DSV4_UNROLL
        for (int i = 0; i < NT / 2; i += 4)
          *reinterpret_cast<float4*>(mine + (i / 4) * (4 * kWgThreads) + 4 * wtid) = make_float4(acc[i], acc[i + 1], acc[i + 2], acc[i + 3]);
        __threadfence();
        named_barrier_sync(1 + wg, kWgThreads);
        if (wtid == 0) last_arrival[wg] = atomicAdd(args.counters + slot_index, 1) == args.splits - 1;
        named_barrier_sync(1 + wg, kWgThreads);
        if (last_arrival[wg]) {
          __threadfence();
          float sum[NT / 2];
          DSV4_UNROLL
          for (int i = 0; i < NT / 2; ++i) sum[i] = 0.0f;
          for (int s = 0; s < args.splits; ++s) {
            const float* other = args.partial + (slot_index * args.splits + s) * (kWeightTile * NT);
            DSV4_UNROLL
            for (int i = 0; i < NT / 2; i += 4) {
              const float4 v = load_global_l2_v4(other + (i / 4) * (4 * kWgThreads) + 4 * wtid);
              sum[i] += v.x, sum[i + 1] += v.y, sum[i + 2] += v.z, sum[i + 3] += v.w;
            }
          }
          write_tile(sum, tile);
          if (wtid == 0) args.counters[slot_index] = 0;  // ready for the next product
        }
      }
      DSV4_UNROLL
      for (int i = 0; i < NT / 2; ++i) acc[i] = 0.0f;
    }
  }
}

template <int NT, bool kFp8>
void launch_stream(StreamArgs args, int grid_x, int smem, gpu_stream_t stream) {
  static const bool smem_set = (set_max_dynamic_smem(stream_fp8_kernel<NT, kFp8>, kSmemLimit), true);
  (void)smem_set;
  launch(
      stream_fp8_kernel<NT, kFp8>,
      dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(args.splits), static_cast<unsigned>(args.token_blocks)),
      dim3(kThreads), static_cast<std::size_t>(smem), stream, args);
}

}  // namespace

StreamProducts stream_products() {
  static const StreamProducts chosen =
      env_is("DSV4_GEMM_STREAM_FP8", "1") ? StreamProducts::kFp8 : StreamProducts::kF16;
  return chosen;
}

namespace {

// The plan of a product (the CTAs' split of k and of the tiles). Units per split (`per`), and CTAs
// along the tiles (grid_x; each of a CTA's warpgroups takes tiles_per_worker tiles: one wave of
// CTAs -- a second, partial wave would cost a whole CTA time). Chosen by a cost in units of weight
// a warpgroup streams: waves x (tiles a warpgroup x (units + partial write/read) + fixed start),
// over every `per` that fits shared memory, the partials within the workspace budget where any
// plan allows it. Ties go to fewer splits.
struct StreamPlan {
  int nt = 0, units = 0, tiles = 0, token_blocks = 0, per = 0, splits = 0, grid_x = 0, smem = 0;
};
StreamPlan plan_stream(std::int64_t rows, std::int64_t n, std::int64_t k, bool f32, bool fp8) {
  StreamPlan plan;
  plan.nt = rows <= 8 ? 8 : rows <= 16 ? 16 : rows <= 32 ? 32 : 64;
  const int nt = plan.nt;
  plan.units = static_cast<int>((k + kUnitK - 1) / kUnitK);
  plan.tiles = static_cast<int>((n + kWeightTile - 1) / kWeightTile);
  plan.token_blocks = static_cast<int>((rows + nt - 1) / nt);
  const std::int64_t sms = stream_sm_count();
  const std::int64_t work = static_cast<std::int64_t>(plan.tiles) * plan.token_blocks;
  struct Choice {
    double cost = 0;
    int per = 0, grid_x = 0;
  };
  auto best_choice = [&](bool within_budget) {
    Choice best;
    for (int p = 1; p <= plan.units && smem_bytes(nt, p, f32, fp8) <= kSmemLimit; ++p) {
      const std::int64_t splits = (plan.units + p - 1) / p;
      if (within_budget && splits > 1 && work * splits * kWeightTile * nt > kPartialBudget) continue;
      // CTAs resident at once: by shared memory, and by registers (kCtasPerSm).
      const int by_regs = nt >= 32 ? kCtasPerSm<32> : kCtasPerSm<16>;
      const std::int64_t slots = std::clamp(kSmemLimit / (smem_bytes(nt, p, f32, fp8) + 1024), 1, by_regs) * sms;
      const std::int64_t along = std::max<std::int64_t>(1, slots / (splits * plan.token_blocks));
      const std::int64_t tiles_per_worker = (plan.tiles + kWarpgroups * along - 1) / (kWarpgroups * along);
      const std::int64_t grid_x = (plan.tiles + kWarpgroups * tiles_per_worker - 1) / (kWarpgroups * tiles_per_worker);
      const std::int64_t waves = (grid_x * splits * plan.token_blocks + slots - 1) / slots;
      const double cost = static_cast<double>(waves) *
                          (static_cast<double>(tiles_per_worker) * (p + (splits > 1 ? nt / 8.0 : 0.0)) + 2.0);
      if (best.per == 0 || cost <= best.cost) best = Choice{cost, p, static_cast<int>(grid_x)};
    }
    return best;
  };
  Choice choice = best_choice(true);
  if (choice.per == 0) choice = best_choice(false);
  if (choice.per == 0)
    launch_error("gemm_stream_fp8: {} activation rows of k {} do not fit in shared memory", {rows, k});
  plan.per = choice.per;
  plan.splits = (plan.units + choice.per - 1) / choice.per;
  plan.grid_x = choice.grid_x;
  plan.smem = smem_bytes(nt, choice.per, f32, fp8);
  return plan;
}

}  // namespace

int gemm_stream_units_per_split(std::int64_t rows, const DeviceWeight& w, const GemmOutput& out,
                                StreamProducts products) {
  return plan_stream(rows, w.n, w.k, out.f32, products == StreamProducts::kFp8).per;
}

void gemm_stream_fp8(const QuantizedRows& a, std::int64_t rows, const DeviceWeight& w, const GemmOutput& out,
                     const std::int32_t* rows_dev, gpu_stream_t stream, StreamProducts products) {
  const bool fp8 = products == StreamProducts::kFp8;
  if (w.format != WeightFormat::kFp8) launch_error("gemm_stream_fp8: the weight is not fp8");
  if (w.k <= 0 || w.k % 32 != 0) launch_error("gemm_stream_fp8: the reduction length {} must be a positive multiple of 32", {w.k});
  if (a.k != w.k) launch_error("gemm_stream_fp8: activations of {} columns for a weight of {}", {a.k, w.k});
  if (rows <= 0 || w.n <= 0) return;
  if (reinterpret_cast<std::uintptr_t>(a.codes) % 16 != 0 || reinterpret_cast<std::uintptr_t>(w.data) % 16 != 0)
    launch_error("gemm_stream_fp8: activation codes and weights must be 16-byte aligned");
  const StreamPlan plan = plan_stream(rows, w.n, w.k, out.f32, fp8);
  StreamArgs args{};
  args.codes = a.codes;
  args.a_scales = a.scales;
  args.k = w.k;
  args.w = static_cast<const std::uint8_t*>(w.data);
  args.w_scales = static_cast<const float*>(w.scale);
  args.n = w.n;
  args.out = out;
  args.rows = rows;
  args.rows_dev = rows_dev;
  args.units = plan.units;
  args.tiles = plan.tiles;
  args.token_blocks = plan.token_blocks;
  args.units_per_split = plan.per;
  args.splits = plan.splits;
  if (args.splits > 1) {
    const std::int64_t work = static_cast<std::int64_t>(plan.tiles) * plan.token_blocks;
    const StreamWorkspace ws = stream_workspace(stream, work * args.splits * kWeightTile * plan.nt, work);
    args.partial = ws.partial;
    args.counters = ws.counters;
  }
  const int grid_x = plan.grid_x, smem = plan.smem;
  switch (plan.nt) {
    case 8:
      fp8 ? launch_stream<8, true>(args, grid_x, smem, stream) : launch_stream<8, false>(args, grid_x, smem, stream);
      break;
    case 16:
      fp8 ? launch_stream<16, true>(args, grid_x, smem, stream) : launch_stream<16, false>(args, grid_x, smem, stream);
      break;
    case 32:
      fp8 ? launch_stream<32, true>(args, grid_x, smem, stream) : launch_stream<32, false>(args, grid_x, smem, stream);
      break;
    default:
      fp8 ? launch_stream<64, true>(args, grid_x, smem, stream) : launch_stream<64, false>(args, grid_x, smem, stream);
      break;
  }
}

}  // namespace dsv4::gpu
