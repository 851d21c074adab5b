// The fp4 expert product through FP8 wgmma with the weight in registers (gemm_experts_fp8.h).
#include "cuda/kernels/gemm_experts_fp8.h"

#include <cstdint>

#include "cuda/device.h"
#include "cuda/kernels/dependent_launch.cuh"
#include "cuda/kernels/expert_tile.cuh"
#include "cuda/kernels/gemm_experts_wgmma.h"
#include "cuda/kernels/launch_check.h"
#include "cuda/kernels/numerics.cuh"

namespace dsv4::gpu {
namespace {

// The shape of a CTA for tiles of kTokens tokens (the wgmma's N). A stage is one 128-wide unit of
// k: the warps' 1,024-byte weight blocks, their 64-byte scale blocks, then the tokens' e4m3 codes
// in wgmma's K-major layout: value (m, l) of the unit at (m / 8) * 1024 + (l / 16) * 128 + (m % 8)
// * 16 + l % 16 (core matrices adjacent along k 128 bytes apart, lbo; groups of 8 tokens 1,024,
// sbo), so the 32-wide block s starts 256 s bytes in. A CTA-wide barrier covers kStep units; the
// ring holds three steps.
template <int kTokens>
struct Fp8Cta {
  static constexpr int kWarpgroups = kTokens >= 64 ? 3 : 2;
  static constexpr int kThreads = 128 * kWarpgroups, kWarps = 4 * kWarpgroups;
  static constexpr int kStep = 2, kStages = 3 * kStep;
  static constexpr int kWeightBytes = kWarps * 1024, kScaleBytes = kWarps * 64, kTokenBytes = kTokens * 128;
  static constexpr int kStageBytes = kWeightBytes + kScaleBytes + kTokenBytes;
  static constexpr int kTokenChunks = kTokens * 8;  // 16-byte chunks of the tokens' codes a unit
  static constexpr int kChunksPerThread = (kTokenChunks + kThreads - 1) / kThreads;
  static_assert(kStageBytes % 128 == 0);
  // Dynamic shared memory: the stages, then the tile's activation scales [unit][token].
  static constexpr std::int64_t smem_bytes(int units) {
    return static_cast<std::int64_t>(kStages) * kStageBytes + static_cast<std::int64_t>(units) * kTokens * 4;
  }
};

template <bool kNormalScales, int kTokens>
__global__ void __launch_bounds__(Fp8Cta<kTokens>::kThreads, kTokens >= 64 ? 1 : 2)
    experts_fp4_fp8_kernel(ExpertProductArgs args) {
  using C = Fp8Cta<kTokens>;
  DSV4_DYNAMIC_SMEM(std::uint8_t, smem);
  __shared__ std::uint64_t landed[C::kStages];
  const auto [first, count, expert] = tile_rows(args.tiles, static_cast<int>(blockIdx.y));
  if (count <= 0) return;
  if (count > kTokens) __trap();  // (a tile map built for taller tiles)
  // (the warp index broadcast from lane 0, so the compiler knows the copy addresses warp-uniform)
  const int tid = static_cast<int>(threadIdx.x), warp = __shfl_sync(0xffffffffu, tid >> 5, 0), lane = tid & 31;
  const int g = lane >> 2, q = lane & 3;
  const std::int64_t k = args.k;
  const int units = static_cast<int>(k / 128);
  const std::int64_t group = static_cast<std::int64_t>(blockIdx.x) * C::kWarps + warp;  // the warp's 16 rows
  const WarpRows rows = warp_rows(args.w, expert, group, units);
  float* sas = reinterpret_cast<float*>(smem + static_cast<std::int64_t>(C::kStages) * C::kStageBytes);

  // This thread's token chunks of every unit (expert_tile.cuh TokenChunks), to their places in a stage.
  TokenChunks<C::kChunksPerThread> chunks;
  token_chunks<kTokens>(chunks, args.tiles, args.a_codes, k, first, count, tid, C::kThreads, [](int m, int j) {
    return C::kWeightBytes + C::kScaleBytes + (m >> 3) * 1024 + j * 128 + (m & 7) * 16;
  });
  // Unit u into stage u % kStages: its weights (bulk copies on the stage's barrier) and its tokens.
  const auto stage_of = [&](int u) { return smem + (u % C::kStages) * C::kStageBytes; };
  const auto issue_weights = [&](int u) {
    copy_warp_unit(stage_of(u), stage_of(u) + C::kWeightBytes, &landed[u % C::kStages], rows, u, warp, lane);
  };
  const auto issue_tokens = [&](int u) { copy_token_chunks(stage_of(u), chunks, u); };
  if (tid == 0) {
    for (int s = 0; s < C::kStages; ++s) mbarrier_init(&landed[s], C::kThreads / 32);  // one arrival a warp
  }
  __syncthreads();
  // Two steps of units ahead. A group is committed per unit (empty past the last), so that waiting
  // for all but the newest kStep groups waits for the units of the next step. Launched dependent:
  // the tile map and the weights were complete before the kernel before this one began
  // (gemm_quantized_experts), so the first weight copies go out while that kernel ends; the
  // activations and their scales may come from it.
  for (int u = 0; u < 2 * C::kStep && u < units; ++u) issue_weights(u);
  grid_dependency_wait();
  grid_dependents_launch();
  for (int u = 0; u < 2 * C::kStep; ++u) {
    if (u < units) issue_tokens(u);
    cp_async_commit();
  }
  // The tile's activation scales [unit][token] (zero past its rows), while the first units land.
  load_tile_scales<kTokens>(sas, args.a_scales, args.tiles, first, count, units, tid, C::kThreads);

  // Thread (warp w, g, q) holds A rows g and g + 8 of its warp's 16. In a 32-wide block s, a[0]
  // (row g) and a[1] (row g + 8) are k 4 q .. 4 q + 3: half q % 2 of the block's word q / 2; a[2]
  // and a[3] are k 16 + 4 q ..: half q % 2 of word 2 + q / 2 (word t holds k 8 t .. 8 t + 7; word s
  // of the row's 16-byte chunk t, gemm.h). A half is one e4m3 rebuild, byte i holding k + i.
  const unsigned r1 = (q & 1) ? 30u : 2u, r2 = (q & 1) ? 0u : 4u;
  const int c0 = 16 * (q >> 1), c2 = 16 * (2 + (q >> 1));
  float acc[kTokens / 2];
  DSV4_UNROLL
  for (int i = 0; i < kTokens / 2; ++i) acc[i] = 0.0f;
  const auto compute_unit = [&](int u) {
    const int stage = u % C::kStages;
    mbarrier_wait(&landed[stage], static_cast<unsigned>((u / C::kStages) & 1));
    const std::uint8_t* st = smem + stage * C::kStageBytes;
    const std::uint8_t* wb = st + warp * 1024;
    const uint4 lo_g = *reinterpret_cast<const uint4*>(wb + 64 * g + c0);
    const uint4 hi_g = *reinterpret_cast<const uint4*>(wb + 64 * g + c2);
    const uint4 lo_h = *reinterpret_cast<const uint4*>(wb + 64 * (g + 8) + c0);
    const uint4 hi_h = *reinterpret_cast<const uint4*>(wb + 64 * (g + 8) + c2);
    float ws_g[4], ws_h[4];
    ue8m0x4_values<kNormalScales>(*reinterpret_cast<const std::uint32_t*>(st + C::kWeightBytes + warp * 64 + 4 * g),
                                  ws_g);
    ue8m0x4_values<kNormalScales>(
        *reinterpret_cast<const std::uint32_t*>(st + C::kWeightBytes + warp * 64 + 4 * (g + 8)), ws_h);
    const std::uint64_t desc = wgmma_descriptor(st + C::kWeightBytes + C::kScaleBytes, 128, 1024);
    // Two blocks in flight: block s + 1 is issued before block s's product is waited for and added
    // (times its weight scale) into the unit's sum, so the tensor cores work while it is added.
    // Each block's product starts from zero: the reference sums each 32-wide block on its own.
    std::uint32_t a[2][4];
    float part[2][kTokens / 2], unit[kTokens / 2] = {};  // (set by block 0; the zeros quiet a warning)
    const auto issue_block = [&](int s) {
      std::uint32_t(&ab)[4] = a[s & 1];
      ab[0] = e2m1_half_as_e4m3(word_of(lo_g, s), r1, r2);
      ab[1] = e2m1_half_as_e4m3(word_of(lo_h, s), r1, r2);
      ab[2] = e2m1_half_as_e4m3(word_of(hi_g, s), r1, r2);
      ab[3] = e2m1_half_as_e4m3(word_of(hi_h, s), r1, r2);
      wgmma_fence();
      wgmma_m64k32_e4m3_rs<kTokens>(part[s & 1], ab, desc + static_cast<std::uint64_t>((256 * s) >> 4), false);
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
  for (int u0 = 0; u0 < units; u0 += C::kStep) {
    cp_async_wait<C::kStep>();   // this thread's token chunks of the step's units
    fence_proxy_async_shared();  // (read by wgmma, the async proxy)
    __syncthreads();             // every thread's chunks are in; the last step's stages are free
    for (int j = 0; j < C::kStep; ++j) {
      if (u0 + 2 * C::kStep + j < units) {
        issue_weights(u0 + 2 * C::kStep + j);
        issue_tokens(u0 + 2 * C::kStep + j);
      }
      cp_async_commit();
    }
    for (int j = 0; j < C::kStep && u0 + j < units; ++j) compute_unit(u0 + j);
  }
  cp_async_wait_all();  // (only empty groups are left)
  if (!rows.active) return;
  store_tile(args.out, acc, first, count, group, g, q);
}

template <int kTokens>
void launch_fp8(const ExpertProductArgs& args, const ExpertTiles& tiles, const DeviceWeight& w, gpu_stream_t stream) {
  using C = Fp8Cta<kTokens>;
  static const bool smem_set = [] {
    set_max_dynamic_smem(experts_fp4_fp8_kernel<true, kTokens>,
                         static_cast<std::size_t>(C::smem_bytes(kMaxExpertUnits)));
    set_max_dynamic_smem(experts_fp4_fp8_kernel<false, kTokens>,
                         static_cast<std::size_t>(C::smem_bytes(kMaxExpertUnits)));
    return true;
  }();
  (void)smem_set;
  const dim3 grid(static_cast<unsigned>((w.n / 16 + C::kWarps - 1) / C::kWarps),
                  static_cast<unsigned>(tiles.max_tiles));
  const auto bytes = static_cast<std::size_t>(C::smem_bytes(static_cast<int>(w.k / 128)));
  launch_dependent(w.fp4_scales_normal ? experts_fp4_fp8_kernel<true, kTokens> : experts_fp4_fp8_kernel<false, kTokens>,
                   grid, dim3(C::kThreads), bytes, stream, args);
}

}  // namespace

bool experts_fp8_opted_in() {
  static const bool on = env_is("DSV4_EXPERTS_FP8", "1");
  return on;
}

void gemm_experts_fp4_fp8(const QuantizedRows& a, const ExpertTiles& tiles, const DeviceWeight& w,
                          const GemmOutput& out, gpu_stream_t stream) {
  if (!experts_fp4_wgmma_supported(w))
    launch_error("gemm_experts_fp4_fp8: needs tiled fp4 experts (n {} a multiple of 16, k {} of 128 up to 8192)",
                 {w.n, w.k});
  if (tiles.tile_m != kSmallRows && tiles.tile_m != kWgmmaExpertRows)
    launch_error("gemm_experts_fp4_fp8: tiles of {} rows (takes {} or {})",
                 {tiles.tile_m, kSmallRows, kWgmmaExpertRows});
  if (a.k != w.k) launch_error("gemm_experts_fp4_fp8: activations of {} columns for a weight of {}", {a.k, w.k});
  if (tiles.max_tiles <= 0) return;
  const ExpertProductArgs args{a.codes, a.scales, w.k, w, out, tiles};
  if (tiles.tile_m == kSmallRows)
    launch_fp8<kSmallRows>(args, tiles, w, stream);
  else
    launch_fp8<kWgmmaExpertRows>(args, tiles, w, stream);
}

}  // namespace dsv4::gpu
