// The portable kernel language: every .cu file includes this header and uses only what it
// provides, so the same source builds two ways (cmake/Dsv4Gpu.cmake does both):
//
//   real: nvcc (__CUDACC__): CUDA itself, plus the dsv4::gpu wrappers below as inline PTX.
//   sim:  the host C++ compiler with DSV4_SIM=1: cuda/sim/simt.h provides the same names and runs
//         kernels on the SIMT simulator (docs/gpu-simulator.md), so kernel logic is tested on
//         machines without a GPU.
//
// Provided in both modes (global namespace, as CUDA has them):
//   keywords   __global__ __device__ __host__ __forceinline__ __restrict__ __shared__
//              __launch_bounds__(...) __align__(n); __CUDA_ARCH__ is defined only in nvcc's
//              device pass (never in the simulator).
//   built-ins  threadIdx blockIdx blockDim gridDim, dim3, uint3, the vector types (float2, float4,
//              int4, uint2, uint4, ... with make_*), warpSize
//   barriers   __syncthreads (+ _count/_and/_or), __syncwarp(mask), __threadfence(_block)
//   warp ops   __shfl_sync/__shfl_up_sync/__shfl_down_sync/__shfl_xor_sync (int, unsigned, long,
//              long long and unsigned variants, float, double, bf16, bf162; width), __ballot_sync,
//              __any_sync, __all_sync, __reduce_{add,min,max}_sync (int/unsigned),
//              __reduce_{and,or,xor}_sync, __match_any_sync, __match_all_sync
//   atomics    atomicAdd/Sub/Exch/Min/Max/And/Or/Xor/Inc/Dec/CAS (CUDA's overloads)
//   math       <cmath>'s float functions unqualified, rsqrtf, __expf, __logf, __fdividef,
//              __frcp_rn, __fsqrt_rn, __fadd_rn, __fmul_rn, __fmaf_rn, __saturatef, bit casts
//              (__float_as_uint, ...), __clz, __popc, __ffs, __brev, __byte_perm, __funnelshift_*,
//              __umulhi, min/max overloads, __ldg
//   bf16       __nv_bfloat16, __nv_bfloat162, __float2bfloat16(_rn), __bfloat162float,
//              __floats2bfloat162_rn, __bfloat1622float2, __low2float, __high2float
//   macros     DSV4_DYNAMIC_SMEM(T, name), DSV4_DEVICE_ASSERT(cond)
// and in namespace dsv4::gpu: launch, set_max_dynamic_smem, the mma wrappers, ldmatrix, cp.async,
// load_global_or and load_global_v{2,4}_or_zero (predicated loads), load_global_l2_v4,
// named_barrier_sync, setmaxnreg_inc / setmaxnreg_dec (warpgroup register budgets),
// Hopper's mbarriers with bulk copies into shared memory (mbarrier_init, mbarrier_arrive,
// mbarrier_arrive_expect_tx, bulk_copy_to_shared, mbarrier_wait), thread block clusters
// (launch_cluster, cluster_rank, cluster_blocks, cluster_sync, cluster_map, mbarrier_arrive_remote,
// mbarrier_wait_cluster), and warpgroup mma (wgmma_descriptor,
// fence_proxy_async_shared, wgmma_fence, wgmma_m64n{32,64}k16_bf16, wgmma_m64n256k16_bf16_bt,
// wgmma_m64n64k32_e4m3, wgmma_m64k32_e4m3_rs<N> and wgmma_m64k16_f16_rs<N> (A from registers),
// wgmma_m64k16_f16<N>,
// wgmma_commit, wgmma_wait, wgmma_fence_operands).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "cuda/stream_handle.h"

#if defined(__CUDACC__)
// =====================================================================================
// real: nvcc
// =====================================================================================
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "cuda/runtime.h"

// T* name = the block's dynamic shared memory (128-byte aligned).
#define DSV4_DYNAMIC_SMEM(T, name)                                      \
  extern __shared__ __align__(128) unsigned char dsv4_dyn_smem[];      \
  T* name = reinterpret_cast<T*>(dsv4_dyn_smem)

// Prints the condition with block and thread, then traps (the launch's stream fails).
#define DSV4_DEVICE_ASSERT(cond)                                                                      \
  do {                                                                                                \
    if (!(cond)) {                                                                                    \
      printf("%s:%d: device assertion `%s` failed in block (%u,%u,%u) thread (%u,%u,%u)\n", __FILE__, \
             __LINE__, #cond, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y,          \
             threadIdx.z);                                                                            \
      __trap();                                                                                       \
    }                                                                                                 \
  } while (0)

namespace dsv4::gpu {

inline constexpr bool kSimulated = false;

// kernel<<<grid, block, smem_bytes, stream>>>(args...), then a check of cudaGetLastError() that
// throws dsv4::Error naming the kernel and the launch configuration.
template <class... P, class... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, std::size_t smem_bytes, gpu_stream_t stream,
            A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "gpu::launch: wrong number of kernel arguments");
  kernel<<<grid, block, smem_bytes, stream>>>(std::forward<A>(args)...);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    const unsigned g[3] = {grid.x, grid.y, grid.z};
    const unsigned b[3] = {block.x, block.y, block.z};
    detail::launch_failed(reinterpret_cast<const void*>(kernel), static_cast<int>(err), g, b, smem_bytes);
  }
}

namespace detail {
// cudaLaunchKernelEx with one launch attribute, then the same check as launch.
template <class... P, class... A>
void launch_with(const cudaLaunchAttribute& attribute, void (*kernel)(P...), dim3 grid, dim3 block,
                 std::size_t smem_bytes, gpu_stream_t stream, A&&... args) {
  cudaLaunchAttribute attributes[1] = {attribute};
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = 1;
  cudaError_t err = cudaLaunchKernelEx(&config, kernel, std::forward<A>(args)...);
  if (err == cudaSuccess) err = cudaGetLastError();
  if (err != cudaSuccess) {
    const unsigned g[3] = {grid.x, grid.y, grid.z};
    const unsigned b[3] = {block.x, block.y, block.z};
    launch_failed(reinterpret_cast<const void*>(kernel), static_cast<int>(err), g, b, smem_bytes);
  }
}
}  // namespace detail

// As launch, in clusters of `cluster` blocks along x (1 to 8, dividing grid.x): see cluster_sync.
template <class... P, class... A>
void launch_cluster(void (*kernel)(P...), dim3 grid, dim3 block, std::size_t smem_bytes, unsigned cluster,
                    gpu_stream_t stream, A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "gpu::launch_cluster: wrong number of kernel arguments");
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = cluster;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  detail::launch_with(attribute, kernel, grid, block, smem_bytes, stream, std::forward<A>(args)...);
}

// Allows launches of `kernel` with up to `bytes` of dynamic shared memory (above the default
// 48 KB; at most the device's max_smem_optin, 227 KB on H100/H200).
template <class... P>
void set_max_dynamic_smem(void (*kernel)(P...), std::size_t bytes) {
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    detail::set_max_dynamic_smem_failed(reinterpret_cast<const void*>(kernel), static_cast<int>(err), bytes);
  }
}

// D = A * B + C for one warp: A 16x32 e4m3 (row), B 32x8 e4m3 (col), C and D 16x8 fp32. On sm_90
// this is no FP8 tensor-core instruction: ptxas widens both operands to f16 (F2FP) and issues two
// f16 HMMA and FADDs (an indexer kernel built on it ran 890 instructions a 16 x 64 x 128 product,
// docs/perf.md); Hopper's FP8 tensor cores are wgmma only (wgmma_m64n64k32_e4m3). Fragments
// per the PTX ISA "Matrix Fragments for mma.m16n8k32" (g = lane / 4, t = lane % 4):
//   a[0]: row g, k 4t..4t+3; a[1]: row g+8, k 4t..; a[2]: row g, k 16+4t..; a[3]: row g+8, k 16+4t..
//   b[0]: col g, k 4t..4t+3; b[1]: col g, k 16+4t..     (lowest k in the lowest byte)
//   c/d[0..1]: row g, cols 2t, 2t+1; c/d[2..3]: row g+8, cols 2t, 2t+1
__device__ __forceinline__ void mma_m16n8k32_e4m3(float (&d)[4], const std::uint32_t (&a)[4],
                                                  const std::uint32_t (&b)[2], const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
}

// D = A * B + C for one warp: A 16x16 bf16 (row), B 16x8 bf16 (col), C and D 16x8 fp32. Fragments
// per the PTX ISA "Matrix Fragments for mma.m16n8k16 with floating point type":
//   a[0]: row g, k 2t, 2t+1; a[1]: row g+8, k 2t..; a[2]: row g, k 8+2t..; a[3]: row g+8, k 8+2t..
//   b[0]: col g, k 2t, 2t+1; b[1]: col g, k 8+2t, 8+2t+1   (lower k in the low half)
//   c/d as for the e4m3 shape.
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const std::uint32_t (&a)[4],
                                                  const std::uint32_t (&b)[2], const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
}

// Four 8x8 matrices of 16-bit values from shared memory into a warp's registers (ldmatrix):
// lane l gives the address of row l % 8 of matrix l / 8 (16 contiguous bytes, 16-byte aligned).
// Lane l receives in r[m] the 32-bit word at row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of
// matrix m (the lower column in the low half) -- an mma A or B fragment. _trans delivers the
// transposed matrices: r[m] = (row 2 (l % 4), column l / 4) | (row 2 (l % 4) + 1, column l / 4) << 16.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(static_cast<unsigned>(__cvta_generic_to_shared(row)))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(static_cast<unsigned>(__cvta_generic_to_shared(row)))
               : "memory");
}

// Asynchronous 16-byte copy global -> shared (both 16-byte aligned), cached in L2 only.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
// *p if `ok`, else `fallback`: a predicated global load whose result nothing consumes until the
// caller does (a select after a plain load would wait for the load at once). p must point into
// global memory when ok.
__device__ __forceinline__ std::int32_t load_global_or(const std::int32_t* p, bool ok, std::int32_t fallback) {
  std::int32_t v = fallback;
  asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %2, 0;\n@q ld.global.s32 %0, [%1];\n}\n"
               : "+r"(v)
               : "l"(p), "r"(static_cast<int>(ok))
               : "memory");
  return v;
}
// 16 bytes at p (16-byte aligned) if `ok`, else zeros, through the non-coherent path (data no
// kernel writes while it runs); predicated like load_global_or.
__device__ __forceinline__ uint4 load_global_v4_or_zero(const void* p, bool ok) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %5, 0;\n@q ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
               : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
               : "l"(p), "r"(static_cast<int>(ok))
               : "memory");
  return v;
}
// 16 bytes at p (16-byte aligned) through L2 only (ld.global.cg): data other CTAs of the running
// kernel wrote before a fence and an atomic this thread has seen (split-K partial sums).
__device__ __forceinline__ float4 load_global_l2_v4(const void* p) {
  float4 v;
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p) : "memory");
  return v;
}
// 8 bytes at p (8-byte aligned) if `ok`, else zeros, as load_global_v4_or_zero.
__device__ __forceinline__ uint2 load_global_v2_or_zero(const void* p, bool ok) {
  uint2 v = make_uint2(0u, 0u);
  asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %3, 0;\n@q ld.global.nc.v2.u32 {%0, %1}, [%2];\n}\n"
               : "+r"(v.x), "+r"(v.y)
               : "l"(p), "r"(static_cast<int>(ok))
               : "memory");
  return v;
}
// As cp_async_16, but writes 16 zero bytes (and reads nothing) when !valid.
__device__ __forceinline__ void cp_async_16_zfill(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
}
// Closes the group of this thread's copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are pending. Other threads see the data
// only after a barrier that follows the wait.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// Waits for all of this thread's copies, committed or not.
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Named barrier `id` (1..15; 0 is __syncthreads'): waits until `threads` threads (whole warps, a
// multiple of 32) have arrived, so a subset of the block's warps can synchronize among themselves.
__device__ __forceinline__ void named_barrier_sync(unsigned id, unsigned threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// The register budget of the calling warpgroup (all its threads call it, N a multiple of 8 in
// 24..256): warp-specialized kernels move registers from a producer warpgroup to the consumers.
// The compiler allocates the code after the call within the new budget. An increase takes
// registers only from what decreases in the same CTA freed (not from what the launch left
// unallocated); it waits until they are there, so increases beyond the decreases hang the CTA.
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// mbarriers (a 64-bit object in shared memory, 8-byte aligned) and bulk copies. One thread
// initializes a barrier for `count` arrivals per phase, then a __syncthreads makes it visible. A
// phase completes when `count` arrivals came and every byte announced by
// mbarrier_arrive_expect_tx was delivered by bulk copies naming the barrier; the next phase then
// starts with the same count. mbarrier_wait(bar, parity) returns once the phase of that parity
// (0 for the first, 1 for the second, ...) has completed; the copies' bytes are visible then.
__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbarrier_init(std::uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count) : "memory");
  // the barrier's initialization visible to the bulk copy engine (the async proxy)
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive(std::uint64_t* bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(smem_address(bar))
               : "memory");
}
// An arrival that also announces `bytes` of bulk copies the current phase waits for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(std::uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}
// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared memory by the
// bulk copy engine, counted on `bar` when they land.
__device__ __forceinline__ void bulk_copy_to_shared(void* smem, const void* gmem, unsigned bytes, std::uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_address(smem)),
               "l"(gmem), "r"(bytes), "r"(smem_address(bar))
               : "memory");
}
__device__ __forceinline__ void mbarrier_wait(std::uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n@!done bra "
      "WAIT_%=;\n}\n" ::"r"(smem_address(bar)),
      "r"(parity)
      : "memory");
}

// Thread block clusters (sm_90; launch_cluster): `cluster` consecutive blocks along x run at the
// same time on one GPC and can reach each other's shared memory. cluster_rank() is the block's
// rank in its cluster, cluster_blocks() the cluster's size. cluster_sync() waits until every
// thread of the cluster arrived (release / acquire at cluster scope: shared-memory writes before
// it, the peers' included, are visible after it). cluster_map(p, rank) is the address at p's offset
// in block `rank`'s shared memory (p points into the block's own): plain loads and stores through
// it reach that block (distributed shared memory). mbarrier_arrive_remote(bar, rank) arrives on the
// barrier at bar's offset in block `rank`, releasing at cluster scope the caller's earlier stores;
// mbarrier_wait_cluster is mbarrier_wait acquiring at cluster scope, so a phase completed by
// remote arrivals makes their stores visible. A block must not exit while a peer may still touch
// its shared memory (end with cluster_sync).
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_blocks() {
  unsigned n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
  return n;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
template <class T>
__device__ __forceinline__ T* cluster_map(T* p, unsigned rank) {
  std::uint64_t out;
  asm volatile("mapa.u64 %0, %1, %2;\n" : "=l"(out) : "l"(reinterpret_cast<std::uint64_t>(p)), "r"(rank));
  return reinterpret_cast<T*>(out);
}
__device__ __forceinline__ void mbarrier_arrive_remote(std::uint64_t* bar, unsigned rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_address(bar)), "r"(rank));
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}
__device__ __forceinline__ void mbarrier_wait_cluster(std::uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n@!done "
      "bra WAIT_%=;\n}\n" ::"r"(smem_address(bar)),
      "r"(parity)
      : "memory");
}

// Warpgroup mma (wgmma, sm_90a): the four warps of a warpgroup (threads 128 w .. 128 w + 127,
// all of them, converged) compute D[64 x 64] (+)= A[64 x 16] B[64 x 16]^T in fp32 from bf16
// operands in shared memory, asynchronously. Operands are described by wgmma_descriptor and stored
// K-major without swizzle: the matrix is made of core matrices of 8 rows x 8 values (8 x 16 bytes,
// row after row, 128 contiguous bytes); element (r, k) lives at
//   start + (r / 8) * sbo + (k / 8) * lbo + (r % 8) * 16 + (k % 8) * 2
// (lbo: bytes between core matrices adjacent along K; sbo: along the rows). Thread t of the
// warpgroup (warp w = t / 32, g = lane / 4, q = lane % 4) holds d[4 j + e] = D[16 w + g + 8 (e / 2)]
// [8 j + 2 q + e % 2], j = 0..7 -- the mma.sync accumulator layout, eight n-tiles wide.
// Order: shared-memory writes, fence_proxy_async_shared, a barrier, wgmma_fence, the products,
// wgmma_commit, wgmma_wait<0> (then d may be read, and the operands' shared memory reused).
__device__ __forceinline__ std::uint64_t wgmma_descriptor(const void* smem, unsigned lbo_bytes, unsigned sbo_bytes) {
  return static_cast<std::uint64_t>((smem_address(smem) & 0x3FFFFu) >> 4) |
         (static_cast<std::uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16) |
         (static_cast<std::uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32);
}
// Shared-memory writes of this thread made visible to the asynchronous proxy (wgmma, bulk copies).
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// accumulate = false: D = A B^T (d's values ignored).
__device__ __forceinline__ void wgmma_m64n64k16_bf16(float (&d)[32], std::uint64_t desc_a, std::uint64_t desc_b,
                                                     bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate))
      : "memory");
}
// D[64 x N] (+)= A[64 x 16] B[N x 16]^T from f16 operands (both K-major, laid out as the bf16
// ones of wgmma_m64n64k16_bf16), N = 8, 16, 32, 64; d[N / 2] as there (j < N / 8).
template <int N>
__device__ __forceinline__ void wgmma_m64k16_f16(float (&d)[N / 2], std::uint64_t desc_a, std::uint64_t desc_b, bool accumulate) {
  static_assert(N == 8 || N == 16 || N == 32 || N == 64);
  if constexpr (N == 8) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 "
        "{%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate))
        : "memory");
  } else if constexpr (N == 16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate))
        : "memory");
  } else if constexpr (N == 32) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate))
        : "memory");
  } else if constexpr (N == 64) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate))
        : "memory");
  }
}
// D[64 x 64] (+)= A[64 x 32] B[64 x 32]^T from e4m3 operands (both K-major, the only layout
// FP8 wgmma reads): core matrices of 8 rows x 16 values (16 bytes a row), element (r, k) at
//   start + (r / 8) * sbo + (k / 16) * lbo + (r % 8) * 16 + k % 16.
// d as for wgmma_m64n64k16_bf16.
__device__ __forceinline__ void wgmma_m64n64k32_e4m3(float (&d)[32], std::uint64_t desc_a, std::uint64_t desc_b,
                                                     bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate))
      : "memory");
}
// D[64 x N] (+)= A[64 x 32] B[N x 32]^T, e4m3, with A from registers (N = 8, 16, 32, 64): warp w of
// the warpgroup holds rows 16 w .. 16 w + 15 as mma_m16n8k32_e4m3 holds its A -- a[0] row g, k
// 4 q .. 4 q + 3; a[1] row g + 8, the same k; a[2] row g, k 16 + 4 q ..; a[3] row g + 8, k 16 + 4 q
// .. (g = lane / 4, q = lane % 4, byte i of a word is k + i). B as for wgmma_m64n64k32_e4m3 (K-major,
// 16 values a core-matrix row); d as for wgmma_m64n64k16_bf16 (j < N / 8). The registers of a and d
// must not change until the product's wgmma_wait.
template <int N>
__device__ __forceinline__ void wgmma_m64k32_e4m3_rs(float (&d)[N / 2], const std::uint32_t (&a)[4],
                                                     std::uint64_t desc_b, bool accumulate) {
  static_assert(N == 8 || N == 16 || N == 32 || N == 64);
  if constexpr (N == 8) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate))
        : "memory");
  } else if constexpr (N == 16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate))
        : "memory");
  } else if constexpr (N == 32) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, "
        "1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate))
        : "memory");
  } else if constexpr (N == 64) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
        "%23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate))
        : "memory");
  }
}
// D[64 x N] (+)= A[64 x 16] B[N x 16]^T, f16, with A from registers (N = 8, 16, 32, 64): warp w of
// the warpgroup holds rows 16 w .. 16 w + 15 as mma.m16n8k16 holds its A -- a[0] row g, k 2 q and
// 2 q + 1 (low half first); a[1] row g + 8, the same k; a[2] row g, k 8 + 2 q ..; a[3] row g + 8,
// k 8 + 2 q .. . B as for wgmma_m64k16_f16 (K-major). The registers of a and d must not change
// until the product's wgmma_wait.
template <int N>
__device__ __forceinline__ void wgmma_m64k16_f16_rs(float (&d)[N / 2], const std::uint32_t (&a)[4], std::uint64_t desc_b,
                                                    bool accumulate) {
  static_assert(N == 8 || N == 16 || N == 32 || N == 64);
  if constexpr (N == 8) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate))
        : "memory");
  } else if constexpr (N == 16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate))
        : "memory");
  } else if constexpr (N == 32) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate))
        : "memory");
  } else if constexpr (N == 64) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate))
        : "memory");
  }
}
// The same with D[64 x 32] (B: 32 x 16, K-major).
__device__ __forceinline__ void wgmma_m64n32k16_bf16(float (&d)[16], std::uint64_t desc_a, std::uint64_t desc_b,
                                                    bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate))
      : "memory");
}
// D[64 x 256] (+)= A[64 x 16] B[16 x 256] with B stored MN-major ("transposed"): core matrices of
// 8 K-rows x 8 N-values (16 bytes along N), element (k, n) at
//   start + (n / 8) * sbo + (k / 8) * lbo + (k % 8) * 16 + (n % 8) * 2.
// A K-major [keys][dims] tile read this way is its own transpose: the product P V with V = K.
// d[4 j + e] = D[16 w + g + 8 (e / 2)][8 j + 2 q + e % 2], j = 0..31.
__device__ __forceinline__ void wgmma_m64n256k16_bf16_bt(float (&d)[128], std::uint64_t desc_a, std::uint64_t desc_b,
                                                        bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate))
      : "memory");
}
// After wgmma_wait: tells the compiler the accumulators may have changed under it, so it neither
// reads them early nor keeps copies from before the wait.
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// The same for register A fragments (wgmma_m64k16_f16_rs, wgmma_m64k32_e4m3_rs): called after the wait, it keeps their
// registers from being reused while the product may still read them.
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(std::uint32_t (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(a[i])::"memory");
}
}  // namespace dsv4::gpu

#elif defined(DSV4_SIM)
// =====================================================================================
// sim: the host compiler against the SIMT simulator
// =====================================================================================
#include <tuple>
#include <type_traits>

#include "cuda/sim/simt.h"
#include "numerics/fp8_dot_model.h"

#define DSV4_DYNAMIC_SMEM(T, name) T* name = reinterpret_cast<T*>(::dsv4::gpu::sim::dynamic_smem())

#define DSV4_DEVICE_ASSERT(cond)                                                 \
  do {                                                                           \
    if (!(cond)) ::dsv4::gpu::sim::device_assert_failed(#cond, __FILE__, __LINE__); \
  } while (0)

namespace dsv4::gpu {

inline constexpr bool kSimulated = true;

// Runs the whole grid on the simulator before returning (the stream is ignored: everything is
// synchronous), the blocks of a cluster together. The arguments are converted to the kernel's
// parameter types once, as CUDA copies them into parameter space; every simulated thread gets its
// own copy.
template <class... P, class... A>
void launch_cluster(void (*kernel)(P...), dim3 grid, dim3 block, std::size_t smem_bytes, unsigned cluster,
                    gpu_stream_t stream, A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "gpu::launch_cluster: wrong number of kernel arguments");
  (void)stream;
  using Params = std::tuple<std::decay_t<P>...>;
  Params params(std::forward<A>(args)...);
  struct Context {
    void (*kernel)(P...);
    Params* params;
  } context{kernel, &params};
  sim::LaunchRequest request{reinterpret_cast<sim::KernelId>(kernel),
                             grid,
                             block,
                             smem_bytes,
                             [](void* c) {
                               auto* ctx = static_cast<Context*>(c);
                               std::apply(ctx->kernel, *ctx->params);
                             },
                             &context,
                             cluster};
  sim::run_grid(request);
}
template <class... P, class... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, std::size_t smem_bytes, gpu_stream_t stream, A&&... args) {
  launch_cluster(kernel, grid, block, smem_bytes, 1, stream, std::forward<A>(args)...);
}

template <class... P>
void set_max_dynamic_smem(void (*kernel)(P...), std::size_t bytes) {
  sim::set_max_dynamic_smem(reinterpret_cast<sim::KernelId>(kernel), bytes);
}

// Warp collectives in the simulator: exact e4m3 / bf16 inputs, exact products, and fp32 sums in
// k order starting from C (the tensor core's internal summation order and precision differ:
// compare with a tolerance).
inline void mma_m16n8k32_e4m3(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2],
                              const float (&c)[4],
                              std::source_location loc = std::source_location::current()) {
  sim::mma_m16n8k32_e4m3(d, a, b, c, loc);
}
inline void mma_m16n8k16_bf16(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2],
                              const float (&c)[4],
                              std::source_location loc = std::source_location::current()) {
  sim::mma_m16n8k16_bf16(d, a, b, c, loc);
}

// ldmatrix through shuffles of the lanes' row addresses (the same rows and words as the device);
// the lane is threadIdx.x % 32 (kernels that use it have 1-D blocks).
inline void ldmatrix_x4_impl(std::uint32_t (&r)[4], const void* row, bool trans, const std::source_location& loc) {
  const unsigned lane = threadIdx.x & 31u;
  const auto mine = reinterpret_cast<std::uint64_t>(row);
  auto row_of = [&](unsigned src) {
    return reinterpret_cast<const std::uint8_t*>(
        sim::shfl_as(sim::ShflMode::kIdx, 0xffffffffu, mine, static_cast<int>(src), 32, loc));
  };
  for (unsigned m = 0; m < 4; ++m) {
    if (!trans) {
      std::memcpy(&r[m], row_of(8 * m + lane / 4) + 4 * (lane % 4), 4);
    } else {
      std::uint16_t lo, hi;
      const std::uint8_t* r0 = row_of(8 * m + 2 * (lane % 4));
      const std::uint8_t* r1 = row_of(8 * m + 2 * (lane % 4) + 1);
      std::memcpy(&lo, r0 + 2 * (lane / 4), 2);
      std::memcpy(&hi, r1 + 2 * (lane / 4), 2);
      r[m] = static_cast<std::uint32_t>(lo) | (static_cast<std::uint32_t>(hi) << 16);
    }
  }
}
inline void ldmatrix_x4(std::uint32_t (&r)[4], const void* row, std::source_location loc = std::source_location::current()) {
  ldmatrix_x4_impl(r, row, false, loc);
}
inline void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* row,
                              std::source_location loc = std::source_location::current()) {
  ldmatrix_x4_impl(r, row, true, loc);
}

inline void cp_async_16(void* smem, const void* gmem, std::source_location loc = std::source_location::current()) {
  sim::cp_async_16(smem, gmem, true, loc);
}
inline std::int32_t load_global_or(const std::int32_t* p, bool ok, std::int32_t fallback) { return ok ? *p : fallback; }
inline uint4 load_global_v4_or_zero(const void* p, bool ok, std::source_location loc = std::source_location::current()) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if (ok) sim::vector_load(&v, p, sizeof(v), loc);
  return v;
}
inline float4 load_global_l2_v4(const void* p, std::source_location loc = std::source_location::current()) {
  float4 v;
  sim::vector_load(&v, p, sizeof(v), loc);
  return v;
}
inline uint2 load_global_v2_or_zero(const void* p, bool ok, std::source_location loc = std::source_location::current()) {
  uint2 v = make_uint2(0u, 0u);
  if (ok) sim::vector_load(&v, p, sizeof(v), loc);
  return v;
}
inline void named_barrier_sync(unsigned id, unsigned threads, std::source_location loc = std::source_location::current()) {
  sim::named_barrier_sync(id, threads, loc);
}
template <int N>
inline void setmaxnreg_inc(std::source_location loc = std::source_location::current()) {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256);
  sim::setmaxnreg(N, true, loc);
}
template <int N>
inline void setmaxnreg_dec(std::source_location loc = std::source_location::current()) {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256);
  sim::setmaxnreg(N, false, loc);
}
inline void cp_async_16_zfill(void* smem, const void* gmem, bool valid,
                              std::source_location loc = std::source_location::current()) {
  sim::cp_async_16(smem, gmem, valid, loc);
}
inline void cp_async_commit() { sim::cp_async_commit(); }
template <int N>
inline void cp_async_wait() {
  static_assert(N >= 0);
  sim::cp_async_wait(N);
}
inline void cp_async_wait_all() { sim::cp_async_wait(-1); }

// wgmma in the simulator: a descriptor's start address is the offset in the block's dynamic shared
// memory (operands must live there), so descriptors add and compare as on the device. Each thread
// computes its own accumulators when it issues the product, from the operands as they are then
// (one behaviour the asynchronous instruction allows), exact products summed in k order from d in
// fp32. The operands must not change from the warpgroup's first issue to its last wait: the
// simulator checksums them at every issue and at the last wait and reports a change
// (sim::wgmma_issue / wgmma_wait). The warpgroup thread is threadIdx.x % 128 (1-D blocks).
inline std::uint64_t wgmma_descriptor(const void* smem, unsigned lbo_bytes, unsigned sbo_bytes) {
  const auto offset = static_cast<std::uint64_t>(static_cast<const unsigned char*>(smem) - sim::dynamic_smem());
  return ((offset & 0x3FFFFu) >> 4) | (static_cast<std::uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16) |
         (static_cast<std::uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32);
}
inline void fence_proxy_async_shared() {}
inline void wgmma_fence() {}
inline void wgmma_commit() { sim::wgmma_commit(); }
template <int N>
inline void wgmma_wait(std::source_location loc = std::source_location::current()) {
  static_assert(N >= 0);
  sim::wgmma_wait(N, loc);
}
// The 16 bits of element (r, k) of a 16-bit K-major operand (bf16, f16), and of element (k, n) of
// an MN-major one (B of wgmma_m64n256k16_bf16_bt).
inline std::uint16_t wgmma_bits16(std::uint64_t desc, int r, int k) {
  const std::uint64_t start = (desc & 0x3FFFu) << 4, lbo = ((desc >> 16) & 0x3FFFu) << 4, sbo = ((desc >> 32) & 0x3FFFu) << 4;
  std::uint16_t bits;
  std::memcpy(&bits, sim::dynamic_smem() + start + (r / 8) * sbo + (k / 8) * lbo + (r % 8) * 16 + (k % 8) * 2, 2);
  return bits;
}
inline std::uint16_t wgmma_bits16_mn(std::uint64_t desc, int k, int n) {
  const std::uint64_t start = (desc & 0x3FFFu) << 4, lbo = ((desc >> 16) & 0x3FFFu) << 4, sbo = ((desc >> 32) & 0x3FFFu) << 4;
  std::uint16_t bits;
  std::memcpy(&bits, sim::dynamic_smem() + start + (n / 8) * sbo + (k / 8) * lbo + (k % 8) * 16 + (n % 8) * 2, 2);
  return bits;
}
inline float bf16_bits_value(std::uint16_t bits) {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}
inline float f16_bits_value(std::uint16_t bits) {
  const unsigned exponent = (bits >> 10) & 31u, mantissa = bits & 1023u;
  float magnitude;
  if (exponent == 31u) magnitude = mantissa != 0 ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else if (exponent == 0u) magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  else magnitude = std::ldexp(static_cast<float>(1024u + mantissa), static_cast<int>(exponent) - 25);
  return (bits & 0x8000u) != 0 ? -magnitude : magnitude;
}
// Every product, modeled: D[64 x N] (+)= A[64 x K] B[N x K]^T with a(r, k) and b(n, k) the operands'
// values, each thread's accumulators in the device's layout.
template <int N, int K, class AValue, class BValue>
inline void wgmma_model(float (&d)[N / 2], std::uint64_t desc_a, std::uint64_t desc_b, bool accumulate,
                        const std::source_location& loc, AValue a, BValue b) {
  sim::wgmma_issue(desc_a, desc_b, N / 8, loc);
  const int t = static_cast<int>(threadIdx.x % 128u), w = t / 32, g = (t % 32) / 4, q = t % 4;
  for (int i = 0; i < N / 2; ++i) {
    const int row = 16 * w + g + 8 * ((i % 4) / 2), col = 8 * (i / 4) + 2 * q + i % 2;
    float acc = accumulate ? d[i] : 0.0f;
    for (int k = 0; k < K; ++k) acc += a(row, k) * b(col, k);
    d[i] = acc;
  }
}
template <int N, bool kTransposedB>
inline void wgmma_m64k16_bf16(float (&d)[N / 2], std::uint64_t desc_a, std::uint64_t desc_b, bool accumulate,
                              const std::source_location& loc) {
  wgmma_model<N, 16>(
      d, desc_a, desc_b, accumulate, loc, [&](int r, int k) { return bf16_bits_value(wgmma_bits16(desc_a, r, k)); },
      [&](int n, int k) { return bf16_bits_value(kTransposedB ? wgmma_bits16_mn(desc_b, k, n) : wgmma_bits16(desc_b, n, k)); });
}
template <int N>
inline void wgmma_m64k16_f16(float (&d)[N / 2], std::uint64_t desc_a, std::uint64_t desc_b, bool accumulate,
                             std::source_location loc = std::source_location::current()) {
  static_assert(N == 8 || N == 16 || N == 32 || N == 64);
  wgmma_model<N, 16>(
      d, desc_a, desc_b, accumulate, loc, [&](int r, int k) { return f16_bits_value(wgmma_bits16(desc_a, r, k)); },
      [&](int n, int k) { return f16_bits_value(wgmma_bits16(desc_b, n, k)); });
}
// The code at (r, k) of an e4m3 operand (K-major, 16 values a core-matrix row).
inline std::uint8_t wgmma_code_e4m3(std::uint64_t desc, int r, int k) {
  const std::uint64_t start = (desc & 0x3FFFu) << 4, lbo = ((desc >> 16) & 0x3FFFu) << 4,
                      sbo = ((desc >> 32) & 0x3FFFu) << 4;
  return sim::dynamic_smem()[start + (r / 8) * sbo + (k / 16) * lbo + (r % 8) * 16 + k % 16];
}
// The FP8 product sums as the tensor core does (not in fp32): each output is fp8_dot with the
// project's model of Hopper, kHopperFp8Dot (numerics/fp8_dot_model.h).
inline void wgmma_m64n64k32_e4m3(float (&d)[32], std::uint64_t desc_a, std::uint64_t desc_b, bool accumulate,
                                 std::source_location loc = std::source_location::current()) {
  sim::wgmma_issue(desc_a, desc_b, 64 / 8, loc);
  const int t = static_cast<int>(threadIdx.x % 128u), w = t / 32, g = (t % 32) / 4, q = t % 4;
  std::uint8_t a[32], b[32];
  for (int i = 0; i < 32; ++i) {
    const int row = 16 * w + g + 8 * ((i % 4) / 2), col = 8 * (i / 4) + 2 * q + i % 2;
    for (int k = 0; k < 32; ++k) {
      a[k] = wgmma_code_e4m3(desc_a, row, k);
      b[k] = wgmma_code_e4m3(desc_b, col, k);
    }
    d[i] = ::dsv4::fp8_dot(::dsv4::kHopperFp8Dot, accumulate ? d[i] : 0.0f, a, b);
  }
}
// A from registers, e4m3: the warpgroup's fragments meet in a table of the running block between
// two named barriers (ids 15 - warpgroup, as below); the sums as wgmma_m64n64k32_e4m3's.
template <int N>
inline void wgmma_m64k32_e4m3_rs(float (&d)[N / 2], const std::uint32_t (&a)[4], std::uint64_t desc_b, bool accumulate,
                                 std::source_location loc = std::source_location::current()) {
  static_assert(N == 8 || N == 16 || N == 32 || N == 64);
  static std::uint32_t table[8][128][4];
  const unsigned wg = threadIdx.x / 128u, t = threadIdx.x % 128u;
  for (int i = 0; i < 4; ++i) table[wg][t][i] = a[i];
  sim::named_barrier_sync(15u - wg, 128u, loc);
  sim::wgmma_issue(sim::kRegisterA, desc_b, N / 8, loc);
  const int w = static_cast<int>(t) / 32, g = (static_cast<int>(t) % 32) / 4, q = static_cast<int>(t) % 4;
  std::uint8_t ac[32], bc[32];
  for (int i = 0; i < N / 2; ++i) {
    const int row = 16 * w + g + 8 * ((i % 4) / 2), col = 8 * (i / 4) + 2 * q + i % 2;
    for (int k = 0; k < 32; ++k) {
      const int holder = 32 * (row / 16) + 4 * (row % 8) + (k % 16) / 4, reg = (row % 16) / 8 + 2 * (k / 16);
      ac[k] = static_cast<std::uint8_t>(table[wg][holder][reg] >> (8 * (k % 4)));
      bc[k] = wgmma_code_e4m3(desc_b, col, k);
    }
    d[i] = ::dsv4::fp8_dot(::dsv4::kHopperFp8Dot, accumulate ? d[i] : 0.0f, ac, bc);
  }
  sim::named_barrier_sync(15u - wg, 128u, loc);
}
// A from registers: the warpgroup's fragments meet in a table of the running block, between two
// named barriers (ids 15 - warpgroup: kernels using this product leave those ids alone).
template <int N>
inline void wgmma_m64k16_f16_rs(float (&d)[N / 2], const std::uint32_t (&a)[4], std::uint64_t desc_b, bool accumulate,
                                std::source_location loc = std::source_location::current()) {
  static_assert(N == 8 || N == 16 || N == 32 || N == 64);
  static std::uint32_t table[8][128][4];
  const unsigned wg = threadIdx.x / 128u, t = threadIdx.x % 128u;
  for (int i = 0; i < 4; ++i) table[wg][t][i] = a[i];
  sim::named_barrier_sync(15u - wg, 128u, loc);
  const auto a_value = [&](int r, int k) {
    const int holder = 32 * (r / 16) + 4 * (r % 8) + (k % 8) / 2, reg = (r % 16) / 8 + 2 * (k / 8);
    return f16_bits_value(static_cast<std::uint16_t>(table[wg][holder][reg] >> (16 * (k % 2))));
  };
  wgmma_model<N, 16>(d, sim::kRegisterA, desc_b, accumulate, loc, a_value,
                     [&](int n, int k) { return f16_bits_value(wgmma_bits16(desc_b, n, k)); });
  sim::named_barrier_sync(15u - wg, 128u, loc);
}
inline void wgmma_m64n64k16_bf16(float (&d)[32], std::uint64_t desc_a, std::uint64_t desc_b, bool accumulate,
                                 std::source_location loc = std::source_location::current()) {
  wgmma_m64k16_bf16<64, false>(d, desc_a, desc_b, accumulate, loc);
}
inline void wgmma_m64n32k16_bf16(float (&d)[16], std::uint64_t desc_a, std::uint64_t desc_b, bool accumulate,
                                 std::source_location loc = std::source_location::current()) {
  wgmma_m64k16_bf16<32, false>(d, desc_a, desc_b, accumulate, loc);
}
inline void wgmma_m64n256k16_bf16_bt(float (&d)[128], std::uint64_t desc_a, std::uint64_t desc_b, bool accumulate,
                                     std::source_location loc = std::source_location::current()) {
  wgmma_m64k16_bf16<256, true>(d, desc_a, desc_b, accumulate, loc);
}
template <int N>
inline void wgmma_fence_operands(float (&)[N]) {}
template <int N>
inline void wgmma_fence_operands(std::uint32_t (&)[N]) {}

inline void mbarrier_init(std::uint64_t* bar, unsigned count,
                          std::source_location loc = std::source_location::current()) {
  sim::mbarrier_init(bar, count, loc);
}
inline void mbarrier_arrive(std::uint64_t* bar, std::source_location loc = std::source_location::current()) {
  sim::mbarrier_arrive(bar, 0, loc);
}
inline void mbarrier_arrive_expect_tx(std::uint64_t* bar, unsigned bytes,
                                      std::source_location loc = std::source_location::current()) {
  sim::mbarrier_arrive(bar, bytes, loc);
}
inline void bulk_copy_to_shared(void* smem, const void* gmem, unsigned bytes, std::uint64_t* bar,
                                std::source_location loc = std::source_location::current()) {
  sim::bulk_copy_to_shared(smem, gmem, bytes, bar, loc);
}
inline void mbarrier_wait(std::uint64_t* bar, unsigned parity,
                          std::source_location loc = std::source_location::current()) {
  sim::mbarrier_wait(bar, parity, loc);
}

inline unsigned cluster_rank(std::source_location loc = std::source_location::current()) {
  return sim::cluster_rank(loc);
}
inline unsigned cluster_blocks(std::source_location loc = std::source_location::current()) {
  return sim::cluster_blocks(loc);
}
inline void cluster_sync(std::source_location loc = std::source_location::current()) { sim::cluster_sync(loc); }
template <class T>
inline T* cluster_map(T* p, unsigned rank, std::source_location loc = std::source_location::current()) {
  return static_cast<T*>(sim::cluster_map(p, rank, loc));
}
inline void mbarrier_arrive_remote(std::uint64_t* bar, unsigned rank,
                                   std::source_location loc = std::source_location::current()) {
  sim::mbarrier_arrive_remote(bar, rank, loc);
}
inline void mbarrier_wait_cluster(std::uint64_t* bar, unsigned parity,
                                  std::source_location loc = std::source_location::current()) {
  sim::mbarrier_wait(bar, parity, loc);
}

}  // namespace dsv4::gpu

#else
#error "cuda/device.h is for .cu files: compile with nvcc, or with DSV4_SIM=1 for the simulator"
#endif
