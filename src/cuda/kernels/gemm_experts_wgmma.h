// Routed-expert products on fp4 weights for steps where experts get many tokens (prompts), on
// Hopper's warpgroup mma (wgmma), which the mma.sync tile kernels cannot use. CPU twin:
// cpu/linear.h linear() per expert (the numerics of the other fp4 products, SPEC.md 5a: e4m3
// activations with one scale per row and 128 k; each 32-wide block's product times the weight's
// UE8M0 scale, each 128-wide unit's sum times the activation scale, all in fp32; bf16 or fp32
// output). On the H200 its bf16 outputs matched the CPU's but where a sum sits on a rounding
// boundary (the GPU tests: 0 of 143,360 products, 1 of 307,200 MoE layer outputs).
//
// How (gemm_experts_wgmma.cu): a CTA takes one expert tile of up to kWgmmaExpertRows tokens and 192
// weight rows, three warpgroups of 64 rows each. The weight is the product's A operand, in
// registers: every thread rebuilds exactly the fp4 values its A fragment holds (the few-rows
// kernel's e4m3 bit trick, numerics.cuh, then widened to f16) from 16-row unit blocks that the bulk
// copy engine puts into a ring of shared-memory stages (the tiled fp4 layout, gemm.h fp4_tiled).
// The tile's tokens are B: their e4m3 codes are copied per unit (cp.async, zeros past the tile's
// rows) and widened to f16 in the K-major layout wgmma reads. The products are f16 wgmma
// (m64n64k16, two a 32-wide scale block, two blocks in flight) on exact f16 values, summed in fp32
// and added into the unit's sum times the block's weight scale. FP8 wgmma (m64n64k32 on the e4m3
// bytes) ran 1.44x faster, but the FP8 tensor core sums with fewer bits than fp32: 2% of the bf16
// outputs differed from the CPU's and the GPU model test's chunked-vs-whole-prompt agreement fell
// below its bound (docs/perf.md). What bounds the kernel is instruction issue (the per-block
// scaling, one FFMA per accumulator per 32 k, and the rebuilds), not the tensor cores.
#pragma once

#include "cuda/kernels/gemm.h"

namespace dsv4::gpu {

// Tokens an expert tile of this kernel holds (ExpertTiles::tile_m).
inline constexpr int kWgmmaExpertRows = 64;

// Whether the kernel runs products on `w`: stacked fp4 experts in the tiled layout.
bool experts_fp4_wgmma_supported(const DeviceWeight& w);

// gemm_quantized_experts over tiles of kWgmmaExpertRows rows (gemm.h ExpertTiles).
void gemm_experts_fp4_wgmma(const QuantizedRows& a, const ExpertTiles& tiles, const DeviceWeight& w, const GemmOutput& out,
                            gpu_stream_t stream);

}  // namespace dsv4::gpu
