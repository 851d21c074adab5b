// Routed-expert products on fp4 weights through Hopper's FP8 warpgroup mma, the arithmetic of the
// reference's own fp4 product (DeepSeek's inference/kernel.py fp4_gemm_kernel): the fp4 weights
// are widened to e4m3, each 32-wide scale block is one FP8 tensor-core product (summed as the
// tensor core sums, docs/NUMERICS.md "The FP8 tensor core's sums"), scaled by the block's weight
// scale into fp32, each 128-wide unit's sum by the activation scale. One kernel for the decode
// tiles (kSmallRows tokens) and the prompt tiles (kWgmmaExpertRows tokens), so that every step
// size gets the same bits for a token.
//
// Opt-in (DSV4_EXPERTS_FP8=1 in the environment) until it is measured: the default products (the
// few-rows kernel and gemm_experts_wgmma.h) keep the CPU executor's fp32 block sums bit for bit.
// Its op test compares it bit for bit with fp8_dot_model.h's model of the tensor core
// (GpuOps.GemmExpertsFp8), and with the CPU executor within the GEMM tolerance.
//
// How: a CTA takes one expert tile and 64 weight rows a warpgroup (three warpgroups for prompt
// tiles, two for decode tiles). The 16-row unit blocks of the tiled fp4 layout (gemm.h fp4_tiled)
// and their scales come by bulk copy into a ring of shared-memory stages; each thread rebuilds
// its A fragment's e4m3 bytes from them (numerics.cuh e2m1_half_as_e4m3: the values times 2^-6,
// exact; the product is multiplied by 64 at the end). The tile's tokens are B: their e4m3 codes are
// copied per unit (cp.async, zeros past the tile's rows) straight into wgmma's K-major layout.
#pragma once

#include "cuda/kernels/gemm.h"

namespace dsv4::gpu {

// DSV4_EXPERTS_FP8=1 in the environment (read once): gemm_quantized_experts takes this kernel for
// tiled fp4 experts.
bool experts_fp8_opted_in();

// gemm_quantized_experts on the FP8 form: tiles of kSmallRows or kWgmmaExpertRows rows, tiled fp4
// experts (experts_fp4_wgmma_supported).
void gemm_experts_fp4_fp8(const QuantizedRows& a, const ExpertTiles& tiles, const DeviceWeight& w,
                          const GemmOutput& out, gpu_stream_t stream);

}  // namespace dsv4::gpu
