// The fp4 expert product through wgmma with the weight in registers (gemm_experts_wgmma.h).
#include "cuda/kernels/gemm_experts_wgmma.h"

#include <cstdint>

#include "cuda/device.h"
#include "cuda/kernels/expert_tile.cuh"
#include "cuda/kernels/launch_check.h"
#include "cuda/kernels/numerics.cuh"

namespace dsv4::gpu {
namespace {

constexpr int kTokens = kWgmmaExpertRows;     // the wgmma's N
constexpr int kStep = 2;                      // units a CTA-wide barrier covers
constexpr int kStages = 3 * kStep;            // units in the ring (two steps ahead of the one at work)
constexpr int kTokenChunks = kTokens * 8;     // 16-byte chunks of the tokens' codes a unit
// A CTA of kWarpgroups warpgroups takes 64 of them weight rows (outputs): groups of 16, a warp each.
// One stage (one 128-wide unit of k): the warps' 1,024-byte weight blocks, their 64-byte scale
// blocks, then the tokens' e4m3 codes as they are in memory (token m's 128 bytes at 128 m). The
// tokens are widened to f16 (exact) into one of two buffers in wgmma's K-major layout, value (m,
// l) at (m / 8) * 2048 + (l / 8) * 128 + (m % 8) * 16 + (l % 8) * 2 (core matrices adjacent along
// k 128 bytes apart, lbo; along the tokens 2,048, sbo), where the product's k position l holds
// the code at k(l): inside each 16-wide step, positions 2 q + i and 8 + 2 q + i (q = 0..3, i = 0, 1)
// hold k 8 (q / 2) + 4 (q % 2) + i and that + 2. The weight's A fragments follow the same order
// (a dot product's terms may come in any order), which gives thread q four adjacent fp4 values.
// Three warpgroups fill an SM's registers (168 a thread). Measured on the FP8 form of the kernel
// (docs/perf.md, thirteenth session): three ran Flash's routed layer at 4096 tokens in 6.9 ms
// where two took 7.7.
constexpr int kWarpgroups = 3;
constexpr int kThreads = 128 * kWarpgroups, kWarps = 4 * kWarpgroups;
constexpr int kWeightBytes = kWarps * 1024, kScaleBytes = kWarps * 64, kTokenBytes = kTokens * 128;
constexpr int kStageBytes = kWeightBytes + kScaleBytes + kTokenBytes;
constexpr int kHalfBytes = kTokens * 128 * 2;  // one f16 token buffer
constexpr int kChunksPerThread = (kTokenChunks + kThreads - 1) / kThreads;
static_assert(kStageBytes % 128 == 0);
// Dynamic shared memory: the stages, the f16 token buffers of two steps, the tile's activation
// scales [unit][token].
constexpr std::int64_t smem_bytes(int units) {
  return static_cast<std::int64_t>(kStages) * kStageBytes + 2 * kStep * kHalfBytes + units * kTokens * 4;
}

template <bool kNormalScales>
__global__ void __launch_bounds__(kThreads, 1) experts_fp4_wgmma_kernel(ExpertProductArgs args) {
  DSV4_DYNAMIC_SMEM(std::uint8_t, smem);
  __shared__ std::uint64_t landed[kStages];
  const int tile = static_cast<int>(blockIdx.y);
  if (tile >= *args.tiles.num_tiles) return;
  const std::int64_t first = args.tiles.tile_row0[tile];
  const int count = args.tiles.tile_rows[tile];
  const int expert = args.tiles.tile_expert[tile];
  if (count <= 0) return;
  if (count > kTokens) __trap();  // (a tile map built for taller tiles)
  // (the warp index broadcast from lane 0, so the compiler knows the copy addresses warp-uniform)
  const int tid = static_cast<int>(threadIdx.x), warp = __shfl_sync(0xffffffffu, tid >> 5, 0), lane = tid & 31;
  const int g = lane >> 2, q = lane & 3;
  const std::int64_t k = args.k;
  const int units = static_cast<int>(k / 128);
  const std::int64_t group = static_cast<std::int64_t>(blockIdx.x) * kWarps + warp;  // the warp's 16 rows
  // (warp_rows, expert_tile.cuh, written out: the call compiled to other code, and this kernel's
  // speed was measured with this one)
  const std::int64_t groups = args.w.n / 16;
  const bool active = group < groups;
  const std::int64_t src_group = active ? group : groups - 1;
  const WarpRows rows{
      active, static_cast<const std::uint8_t*>(args.w.data) + expert * args.w.expert_stride + src_group * units * 1024,
      static_cast<const std::uint8_t*>(args.w.scale) + expert * args.w.scale_stride + src_group * units * 64};
  float* sas = reinterpret_cast<float*>(smem + static_cast<std::int64_t>(kStages) * kStageBytes + 2 * kStep * kHalfBytes);

  // This thread's token chunks of every unit (expert_tile.cuh TokenChunks), to their places in a stage.
  TokenChunks<kChunksPerThread> chunks;
  token_chunks<kTokens>(chunks, args.tiles, args.a_codes, k, first, count, tid, kThreads,
                        [](int m, int j) { return kWeightBytes + kScaleBytes + m * 128 + j * 16; });
  const auto issue = [&](int u) {  // unit u into stage u % kStages
    std::uint8_t* st = smem + (u % kStages) * kStageBytes;
    copy_warp_unit(st, st + kWeightBytes, &landed[u % kStages], rows, u, warp, lane);
    copy_token_chunks(st, chunks, u);
  };
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) mbarrier_init(&landed[s], kThreads / 32);  // one arrival a warp
  }
  __syncthreads();
  // Widens this thread's token chunks of unit v (landed: its own copies, waited for) to f16 in
  // the buffer of unit v (step parity, then unit in the step): chunk j of token m holds k 16 j ..
  // 16 j + 15, core matrices 2 j and 2 j + 1.
  std::uint8_t* halves = smem + static_cast<std::int64_t>(kStages) * kStageBytes;
  const auto widen = [&](int v) {
    const std::uint8_t* st = smem + (v % kStages) * kStageBytes;
    std::uint8_t* h = halves + (v % (2 * kStep)) * kHalfBytes;
    DSV4_UNROLL
    for (int i = 0; i < kChunksPerThread; ++i) {
      if (chunks.dst[i] < 0) continue;
      const int c = tid + kThreads * i, m = c >> 3, j = c & 7;
      const uint4 codes = *reinterpret_cast<const uint4*>(st + chunks.dst[i]);
      std::uint8_t* to = h + (m >> 3) * 2048 + 2 * j * 128 + (m & 7) * 16;
      // positions 0..7 <- k 0, 1, 4, 5, 8, 9, 12, 13; positions 8..15 <- k 2, 3, 6, 7, 10, 11, 14, 15
      *reinterpret_cast<uint4*>(to) = make_uint4(e4m3x2_to_f16x2(codes.x), e4m3x2_to_f16x2(codes.y),
                                                 e4m3x2_to_f16x2(codes.z), e4m3x2_to_f16x2(codes.w));
      *reinterpret_cast<uint4*>(to + 128) = make_uint4(e4m3x2_to_f16x2(codes.x >> 16), e4m3x2_to_f16x2(codes.y >> 16),
                                                       e4m3x2_to_f16x2(codes.z >> 16), e4m3x2_to_f16x2(codes.w >> 16));
    }
  };
  // Two steps of units ahead. A group is committed per unit (empty past the last), so that waiting
  // for all but the newest kStep groups waits for the units of the next step.
  for (int u = 0; u < 2 * kStep; ++u) {
    if (u < units) issue(u);
    cp_async_commit();
  }
  cp_async_wait<kStep>();
  for (int u = 0; u < kStep && u < units; ++u) widen(u);
  // The tile's activation scales [unit][token] (zero past its rows), while the first units land.
  load_tile_scales<kTokens>(sas, args.a_scales, args.tiles, first, count, units, tid, kThreads);

  // Thread (warp w, g, q) holds A rows g and g + 8 of its group. In the k16 step h of a 32-wide
  // block s its positions 2 q, 2 q + 1 and 8 + 2 q, 8 + 2 q + 1 (a[0] and a[2] for row g) are
  // values 0..3 of half q % 2 of the block's word 2 h + q / 2 (word t holds k 8 t .. 8 t + 7; word
  // s of the row's 16-byte chunk t, gemm.h): one e4m3 rebuild of the half and two widenings.
  const unsigned r1 = (q & 1) ? 30u : 2u, r2 = (q & 1) ? 0u : 4u;
  const int c0 = 16 * (q >> 1), c2 = 16 * (2 + (q >> 1));
  float acc[kTokens / 2];
  DSV4_UNROLL
  for (int i = 0; i < kTokens / 2; ++i) acc[i] = 0.0f;
  const auto compute_unit = [&](int u) {
    const int stage = u % kStages;
    mbarrier_wait(&landed[stage], static_cast<unsigned>((u / kStages) & 1));
    const std::uint8_t* st = smem + stage * kStageBytes;
    const std::uint8_t* wb = st + warp * 1024;
    const uint4 lo_g = *reinterpret_cast<const uint4*>(wb + 64 * g + c0);
    const uint4 hi_g = *reinterpret_cast<const uint4*>(wb + 64 * g + c2);
    const uint4 lo_h = *reinterpret_cast<const uint4*>(wb + 64 * (g + 8) + c0);
    const uint4 hi_h = *reinterpret_cast<const uint4*>(wb + 64 * (g + 8) + c2);
    float ws_g[4], ws_h[4];
    ue8m0x4_values<kNormalScales>(*reinterpret_cast<const std::uint32_t*>(st + kWeightBytes + warp * 64 + 4 * g), ws_g);
    ue8m0x4_values<kNormalScales>(*reinterpret_cast<const std::uint32_t*>(st + kWeightBytes + warp * 64 + 4 * (g + 8)), ws_h);
    const std::uint64_t desc = wgmma_descriptor(halves + (u % (2 * kStep)) * kHalfBytes, 128, 2048);
    // Two blocks in flight: block s + 1 is issued before block s's product is waited for and added
    // (times its weight scale) into the unit's sum, so the tensor cores work while it is added.
    std::uint32_t a[2][8];
    float part[2][kTokens / 2], unit[kTokens / 2];
    const auto issue_block = [&](int s) {
      std::uint32_t(&ab)[8] = a[s & 1];
      const std::uint32_t e[4] = {e2m1_half_as_e4m3(word_of(lo_g, s), r1, r2), e2m1_half_as_e4m3(word_of(lo_h, s), r1, r2),
                                  e2m1_half_as_e4m3(word_of(hi_g, s), r1, r2), e2m1_half_as_e4m3(word_of(hi_h, s), r1, r2)};
      DSV4_UNROLL
      for (int h = 0; h < 2; ++h) {  // step h: rows g, g + 8 from e[2 h], e[2 h + 1]
        ab[4 * h + 0] = e4m3x2_to_f16x2(e[2 * h]);
        ab[4 * h + 1] = e4m3x2_to_f16x2(e[2 * h + 1]);
        ab[4 * h + 2] = e4m3x2_to_f16x2(e[2 * h] >> 16);
        ab[4 * h + 3] = e4m3x2_to_f16x2(e[2 * h + 1] >> 16);
      }
      wgmma_fence();
      DSV4_UNROLL
      for (int h = 0; h < 2; ++h) {
        // k 32 s + 16 h: core matrices 4 s + 2 h and 4 s + 2 h + 1 along k (256 bytes each step)
        const std::uint32_t(&ah)[4] = *reinterpret_cast<const std::uint32_t(*)[4]>(ab + 4 * h);
        wgmma_m64k16_f16_rs<kTokens>(part[s & 1], ah, desc + static_cast<std::uint64_t>((256 * (2 * s + h)) >> 4), h > 0);
      }
      wgmma_commit();
    };
    const auto add_block = [&](int s) {  // after the wait that covers block s
      wgmma_fence_operands(a[s & 1]);
      wgmma_fence_operands(part[s & 1]);
      add_scaled_block(unit, part[s & 1], s, ws_g[s], ws_h[s]);
    };
    four_blocks_two_in_flight(issue_block, add_block);
    add_unit(acc, unit, sas + u * kTokens + 2 * q);
  };
  for (int u0 = 0; u0 < units; u0 += kStep) {
    fence_proxy_async_shared();  // (this thread's f16 tokens of the step are read by wgmma, the async proxy)
    __syncthreads();             // the step's tokens are all widened; the last step's stages and buffers are free
    for (int j = 0; j < kStep; ++j) {
      if (u0 + 2 * kStep + j < units) issue(u0 + 2 * kStep + j);
      cp_async_commit();
    }
    for (int j = 0; j < kStep && u0 + j < units; ++j) compute_unit(u0 + j);
    // the next step's tokens (their chunks are all but the newest kStep groups)
    if (u0 + kStep < units) {
      cp_async_wait<kStep>();
      for (int j = 0; j < kStep && u0 + kStep + j < units; ++j) widen(u0 + kStep + j);
    }
  }
  cp_async_wait_all();  // (only empty groups are left)
  if (!rows.active) return;
  store_tile(args.out, acc, first, count, group, g, q);
}

}  // namespace

bool experts_fp4_wgmma_supported(const DeviceWeight& w) {
  return w.format == WeightFormat::kFp4 && fp4_tiled(w.n, w.k) && w.n > 0;
}

void gemm_experts_fp4_wgmma(const QuantizedRows& a, const ExpertTiles& tiles, const DeviceWeight& w, const GemmOutput& out,
                            gpu_stream_t stream) {
  if (!experts_fp4_wgmma_supported(w))
    launch_error("gemm_experts_fp4_wgmma: needs tiled fp4 experts (n {} a multiple of 16, k {} of 128 up to 8192)", {w.n, w.k});
  if (tiles.tile_m != kWgmmaExpertRows) launch_error("gemm_experts_fp4_wgmma: tiles of {} rows", {tiles.tile_m});
  if (a.k != w.k) launch_error("gemm_experts_fp4_wgmma: activations of {} columns for a weight of {}", {a.k, w.k});
  if (tiles.max_tiles <= 0) return;
  static const bool smem_set = [] {
    set_max_dynamic_smem(experts_fp4_wgmma_kernel<true>, static_cast<std::size_t>(smem_bytes(kMaxExpertUnits)));
    set_max_dynamic_smem(experts_fp4_wgmma_kernel<false>, static_cast<std::size_t>(smem_bytes(kMaxExpertUnits)));
    return true;
  }();
  (void)smem_set;
  const ExpertProductArgs args{a.codes, a.scales, w.k, w, out, tiles};
  const dim3 grid(static_cast<unsigned>((w.n / 16 + kWarps - 1) / kWarps), static_cast<unsigned>(tiles.max_tiles));
  const auto bytes = static_cast<std::size_t>(smem_bytes(static_cast<int>(w.k / 128)));
  launch(w.fp4_scales_normal ? experts_fp4_wgmma_kernel<true> : experts_fp4_wgmma_kernel<false>, grid, dim3(kThreads), bytes, stream, args);
}

}  // namespace dsv4::gpu
