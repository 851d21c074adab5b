// Warp and block reductions (fp32 sums and maxima) for the kernels. A block reduction needs
// blockDim.x to be a multiple of 32 and every thread of the block to call it.
#pragma once

#include <cstdint>

#include "cuda/device.h"
#include "cuda/kernels/numerics.cuh"

namespace dsv4::gpu {

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// `scratch` holds at least 32 floats of shared memory; it may be reused after the call.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total += scratch[w];  // fixed order: the same in every thread
  return total;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float m = scratch[0];
  for (int w = 1; w < warps; ++w) m = fmaxf(m, scratch[w]);
  return m;
}

// The sum of f(k) over k in [0, n) in the CPU's blocked order (cpu/linear.h blocked_dot): blocks
// of kSumBlock consecutive terms, each added left to right, the block sums added left to right,
// every addition rounded on its own -- so the GPU's sums of squares (RMSNorm, the hc mixes) are
// bit-identical to the CPU's. Threads take blocks (thread b: blocks b, b + blockDim.x, ...), then
// every thread adds the block sums itself (the same order, the same result). Every thread of the
// block calls it; `blocks` is shared memory for ceil(n / kSumBlock) floats. f should read shared
// memory: each thread's terms come one after another.
inline constexpr int kSumBlock = 128;
template <class F>
__device__ float blocked_sum(F f, std::int64_t n, float* blocks) {
  const int nb = static_cast<int>((n + kSumBlock - 1) / kSumBlock);
  __syncthreads();  // blocks may still be read by a previous call; inputs written before are visible
  for (int b = threadIdx.x; b < nb; b += blockDim.x) {
    const std::int64_t k1 = static_cast<std::int64_t>(b + 1) * kSumBlock < n ? static_cast<std::int64_t>(b + 1) * kSumBlock : n;
    float s = 0.0f;
    DSV4_UNROLL_8
    for (std::int64_t k = static_cast<std::int64_t>(b) * kSumBlock; k < k1; ++k) s = add_rn(s, f(k));
    blocks[b] = s;
  }
  __syncthreads();
  float total = 0.0f;
  for (int b = 0; b < nb; ++b) total = add_rn(total, blocks[b]);
  return total;
}

}  // namespace dsv4::gpu
