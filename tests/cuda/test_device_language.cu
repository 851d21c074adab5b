// Every primitive of cuda/device.h against answers computed on the host. The same file runs on the
// GPU (test_device_language, label gpu) and on the SIMT simulator (test_device_language_sim):
// passing both is what shows the simulator behaves like the hardware. (No fmt here: nvcc 13 cannot
// compile fmt 9 in C++20, so .cu files catch dsv4::Error as the std::runtime_error it derives from.)
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda/kernels/numerics.cuh"
#include "cuda/runtime.h"
#include "numerics/bf16.h"
#include "numerics/fp8_dot_model.h"
#include "numerics/fp8_e4m3.h"

namespace gpu = dsv4::gpu;

namespace {

gpu::Stream& test_stream() {
  static gpu::Stream stream;
  return stream;
}

// A typed device array with host round trips.
template <class T>
class DeviceVector {
 public:
  explicit DeviceVector(std::size_t n) : buffer_(std::max<std::size_t>(n, 1) * sizeof(T)), n_(n) {}
  explicit DeviceVector(const std::vector<T>& host) : DeviceVector(host.size()) {
    gpu::copy_to_device(buffer_.data(), host.data(), n_ * sizeof(T), test_stream());
  }
  T* get() { return buffer_.as<T>(); }
  std::vector<T> to_host() {
    std::vector<T> host(n_);
    gpu::copy_to_host(host.data(), buffer_.data(), n_ * sizeof(T), test_stream());
    test_stream().synchronize();
    return host;
  }
  void fill(const std::vector<T>& host) {
    gpu::copy_to_device(buffer_.data(), host.data(), n_ * sizeof(T), test_stream());
  }

 private:
  gpu::DeviceBuffer buffer_;
  std::size_t n_;
};

// =================================================================================================
// Kernels
// =================================================================================================

__global__ void __launch_bounds__(256) block_sum_kernel(const int* __restrict__ in, int* __restrict__ out, int n) {
  __shared__ int partial[256];
  const int tid = static_cast<int>(threadIdx.x);
  const int i = static_cast<int>(blockIdx.x * blockDim.x) + tid;
  partial[tid] = i < n ? in[i] : 0;
  __syncthreads();
  for (int stride = static_cast<int>(blockDim.x) / 2; stride > 0; stride /= 2) {
    if (tid < stride) partial[tid] += partial[tid + stride];
    __syncthreads();
  }
  DSV4_DEVICE_ASSERT(tid < 256);
  if (tid == 0) out[blockIdx.x] = partial[0];
}

__global__ void barrier_reduce_kernel(int* out) {
  const int t = static_cast<int>(threadIdx.x);
  const int count = __syncthreads_count(t % 3 == 0);
  const int all_true = __syncthreads_and(t < 1000);
  const int any_true = __syncthreads_or(t == 77);
  const int all_false = __syncthreads_and(t != 5);
  const int any_false = __syncthreads_or(t > 1000);
  if (t == 0) {
    out[0] = count;
    out[1] = all_true;
    out[2] = any_true;
    out[3] = all_false;
    out[4] = any_false;
  }
}

__device__ __forceinline__ unsigned pack3(unsigned x, unsigned y, unsigned z) { return x | (y << 8) | (z << 16); }

__global__ void index_kernel(uint4* out) {
  const unsigned block_linear = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
  const unsigned thread_linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const dim3 grid = gridDim;
  out[block_linear * threads + thread_linear] =
      make_uint4(pack3(threadIdx.x, threadIdx.y, threadIdx.z), pack3(blockIdx.x, blockIdx.y, blockIdx.z),
                 pack3(blockDim.x, blockDim.y, blockDim.z), pack3(grid.x, grid.y, grid.z) | (warpSize << 24));
}

enum ShflMode : int { kIdx = 0, kUp = 1, kDown = 2, kXor = 3 };
struct ShflCase {
  int mode;
  int width;
  int arg;
};

// One warp runs every case, with the same value functions of the lane as the host reference.
__global__ void shfl_kernel(const ShflCase* cases, int ncases, int* out_i, unsigned* out_u, float* out_f,
                            long long* out_ll, unsigned long long* out_ull, double* out_d) {
  const int lane = static_cast<int>(threadIdx.x);
  const int vi = lane * 7 - 50;
  const unsigned vu = 0x80000000u + static_cast<unsigned>(lane) * 3u;
  const float vf = static_cast<float>(lane) * 0.5f - 3.0f;
  const long long vll = (static_cast<long long>(lane) << 40) - lane;
  const unsigned long long vull = (static_cast<unsigned long long>(lane) << 50) | static_cast<unsigned>(lane);
  const double vd = lane * 1.25 + 1e10;
  for (int c = 0; c < ncases; ++c) {
    const ShflCase sc = cases[c];
    const unsigned m = 0xffffffffu;
    int ri = 0;
    unsigned ru = 0;
    float rf = 0;
    long long rll = 0;
    unsigned long long rull = 0;
    double rd = 0;
    const unsigned delta = static_cast<unsigned>(sc.arg);
    switch (sc.mode) {
      case kIdx:
        ri = __shfl_sync(m, vi, sc.arg, sc.width);
        ru = __shfl_sync(m, vu, sc.arg, sc.width);
        rf = __shfl_sync(m, vf, sc.arg, sc.width);
        rll = __shfl_sync(m, vll, sc.arg, sc.width);
        rull = __shfl_sync(m, vull, sc.arg, sc.width);
        rd = __shfl_sync(m, vd, sc.arg, sc.width);
        break;
      case kUp:
        ri = __shfl_up_sync(m, vi, delta, sc.width);
        ru = __shfl_up_sync(m, vu, delta, sc.width);
        rf = __shfl_up_sync(m, vf, delta, sc.width);
        rll = __shfl_up_sync(m, vll, delta, sc.width);
        rull = __shfl_up_sync(m, vull, delta, sc.width);
        rd = __shfl_up_sync(m, vd, delta, sc.width);
        break;
      case kDown:
        ri = __shfl_down_sync(m, vi, delta, sc.width);
        ru = __shfl_down_sync(m, vu, delta, sc.width);
        rf = __shfl_down_sync(m, vf, delta, sc.width);
        rll = __shfl_down_sync(m, vll, delta, sc.width);
        rull = __shfl_down_sync(m, vull, delta, sc.width);
        rd = __shfl_down_sync(m, vd, delta, sc.width);
        break;
      default:
        ri = __shfl_xor_sync(m, vi, sc.arg, sc.width);
        ru = __shfl_xor_sync(m, vu, sc.arg, sc.width);
        rf = __shfl_xor_sync(m, vf, sc.arg, sc.width);
        rll = __shfl_xor_sync(m, vll, sc.arg, sc.width);
        rull = __shfl_xor_sync(m, vull, sc.arg, sc.width);
        rd = __shfl_xor_sync(m, vd, sc.arg, sc.width);
        break;
    }
    out_i[c * 32 + lane] = ri;
    out_u[c * 32 + lane] = ru;
    out_f[c * 32 + lane] = rf;
    out_ll[c * 32 + lane] = rll;
    out_ull[c * 32 + lane] = rull;
    out_d[c * 32 + lane] = rd;
  }
}

// Two half-warps shuffle independently with their own masks; then bf16 values travel.
__global__ void shfl_partial_kernel(int* out, float* out_bf16) {
  const int lane = static_cast<int>(threadIdx.x);
  int r;
  if (lane < 16) {
    r = __shfl_xor_sync(0x0000ffffu, lane * 10, 3);
  } else {
    r = __shfl_down_sync(0xffff0000u, lane * 10, 2, 16);
  }
  out[lane] = r;
  const __nv_bfloat16 h = __float2bfloat16(static_cast<float>(lane) + 0.5f);
  out_bf16[lane] = __bfloat162float(__shfl_sync(0xffffffffu, h, 31 - lane));
}

__global__ void vote_kernel(unsigned* out) {
  const int lane = static_cast<int>(threadIdx.x);
  const unsigned full = 0xffffffffu;
  const unsigned ballot = __ballot_sync(full, lane % 3 == 0);
  const int any_yes = __any_sync(full, lane == 31);
  const int any_no = __any_sync(full, lane > 31);
  const int all_yes = __all_sync(full, lane < 32);
  const int all_no = __all_sync(full, lane != 7);
  unsigned partial = 0;
  if (lane % 2 == 0) {
    partial = __ballot_sync(0x55555555u, lane % 4 == 0);
  } else {
    partial = static_cast<unsigned>(__all_sync(0xaaaaaaaau, lane > 0)) + 100u;
  }
  if (lane == 0) {
    out[0] = ballot;
    out[1] = static_cast<unsigned>(any_yes);
    out[2] = static_cast<unsigned>(any_no);
    out[3] = static_cast<unsigned>(all_yes);
    out[4] = static_cast<unsigned>(all_no);
  }
  out[5 + lane] = partial;
}

__global__ void reduce_match_kernel(unsigned* out_u, int* out_i) {
  const unsigned lane = threadIdx.x;
  const unsigned full = 0xffffffffu;
  const unsigned v = lane * lane + 1u;
  const int s = static_cast<int>(lane) * 37 - 500;
  out_u[lane * 8 + 0] = __reduce_add_sync(full, v);
  out_u[lane * 8 + 1] = __reduce_min_sync(full, v + 5u);
  out_u[lane * 8 + 2] = __reduce_max_sync(full, v);
  out_u[lane * 8 + 3] = __reduce_and_sync(full, 0xfffffff0u | lane);
  out_u[lane * 8 + 4] = __reduce_or_sync(full, 1u << lane);
  out_u[lane * 8 + 5] = __reduce_xor_sync(full, lane);
  out_u[lane * 8 + 6] = __match_any_sync(full, static_cast<int>(lane % 5));
  int pred = -1;
  out_u[lane * 8 + 7] = __match_all_sync(full, 42u, &pred);
  out_i[lane * 4 + 0] = __reduce_add_sync(full, s);
  out_i[lane * 4 + 1] = __reduce_min_sync(full, s);
  out_i[lane * 4 + 2] = __reduce_max_sync(full, s);
  out_i[lane * 4 + 3] = pred;
}

// Lanes exchange through shared memory around __syncwarp (two warps, each on its own half).
__global__ void syncwarp_kernel(int* out) {
  __shared__ int slots[64];
  const int t = static_cast<int>(threadIdx.x);
  const int warp_base = t & ~31;
  slots[t] = t * 3;
  __syncwarp();
  const int neighbour = slots[warp_base + ((t + 1) & 31)];
  __syncwarp();
  slots[t] = neighbour + 1;
  __syncwarp(0xffffffffu);
  out[t] = slots[warp_base + ((t + 31) & 31)];
}

struct AtomicsOut {
  int i_sum;
  unsigned u_sum;
  unsigned long long ull_sum;
  float f_sum;
  double d_sum;
  int i_max, i_min;
  unsigned u_max, u_min;
  long long ll_max, ll_min;
  unsigned long long ull_max, ull_min;
  unsigned bits_or[4];
  unsigned bits_and;
  unsigned bits_xor;
  int cas_counter;
  int exch;
  unsigned inc_counter;
  unsigned ticket;
  int sub;
};

__global__ void atomics_kernel(AtomicsOut* o, int* exch_old, unsigned* tickets, unsigned short* cas16) {
  const int g = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  atomicAdd(&o->i_sum, g % 2 ? -g : g);
  atomicAdd(&o->u_sum, static_cast<unsigned>(g));
  atomicAdd(&o->ull_sum, static_cast<unsigned long long>(g) << 30);
  atomicAdd(&o->f_sum, static_cast<float>(g % 4));
  atomicAdd(&o->d_sum, 0.5 * g);
  const int scrambled = (g * 37) % 2048 - 1000;
  atomicMax(&o->i_max, scrambled);
  atomicMin(&o->i_min, scrambled);
  atomicMax(&o->u_max, static_cast<unsigned>(g * 3));
  atomicMin(&o->u_min, static_cast<unsigned>(g + 7));
  atomicMax(&o->ll_max, static_cast<long long>(scrambled) << 33);
  atomicMin(&o->ll_min, static_cast<long long>(scrambled) << 33);
  atomicMax(&o->ull_max, static_cast<unsigned long long>(g) << 40);
  atomicMin(&o->ull_min, (static_cast<unsigned long long>(g) << 40) + 9);
  atomicOr(&o->bits_or[(g / 32) % 4], 1u << (g % 32));
  atomicAnd(&o->bits_and, ~(1u << (g % 32)));
  atomicXor(&o->bits_xor, 1u << (g % 32));
  int old = o->cas_counter;
  for (;;) {
    const int assumed = old;
    old = atomicCAS(&o->cas_counter, assumed, assumed + 1);
    if (old == assumed) break;
  }
  unsigned short old16 = *cas16;
  for (;;) {
    const unsigned short assumed = old16;
    old16 = atomicCAS(cas16, assumed, static_cast<unsigned short>(assumed + 1));
    if (old16 == assumed) break;
  }
  exch_old[g] = atomicExch(&o->exch, g);
  atomicInc(&o->inc_counter, 0xffffffffu);
  tickets[g] = atomicAdd(&o->ticket, 1u);
  atomicSub(&o->sub, 2);
}

__global__ void dynamic_smem_kernel(const float* in, float* out, unsigned* first_bits, unsigned* aligned16, int n) {
  DSV4_DYNAMIC_SMEM(float, buffer);
  const int t = static_cast<int>(threadIdx.x);
  if (t == 0) {
    first_bits[blockIdx.x] = __float_as_uint(buffer[n - 1]);  // nobody wrote it yet
    aligned16[blockIdx.x] = (reinterpret_cast<std::uintptr_t>(buffer) % 16 == 0) ? 1u : 0u;
  }
  __syncthreads();
  const float* src = in + static_cast<std::size_t>(blockIdx.x) * n;
  for (int i = t; i < n; i += static_cast<int>(blockDim.x)) buffer[i] = src[i];
  __syncthreads();
  float* dst = out + static_cast<std::size_t>(blockIdx.x) * n;
  for (int i = t; i < n; i += static_cast<int>(blockDim.x)) dst[i] = buffer[n - 1 - i];
}

__device__ __forceinline__ std::uint32_t load_u8x4(const std::uint8_t* p) {
  return std::uint32_t{p[0]} | (std::uint32_t{p[1]} << 8) | (std::uint32_t{p[2]} << 16) | (std::uint32_t{p[3]} << 24);
}
__device__ __forceinline__ std::uint32_t load_u16x2(const std::uint16_t* p) {
  return std::uint32_t{p[0]} | (std::uint32_t{p[1]} << 16);
}

// Each warp multiplies its own tile: A 16x32 row-major, Bt = B^T 8x32 row-major (B column-major),
// C and D 16x8 row-major.
__global__ void mma_e4m3_kernel(const std::uint8_t* A, const std::uint8_t* Bt, const float* C, float* D) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane >> 2, t = lane & 3;
  const std::uint8_t* a_tile = A + warp * 16 * 32;
  const std::uint8_t* b_tile = Bt + warp * 8 * 32;
  const float* c_tile = C + warp * 16 * 8;
  float* d_tile = D + warp * 16 * 8;
  const std::uint32_t a[4] = {load_u8x4(a_tile + g * 32 + 4 * t), load_u8x4(a_tile + (g + 8) * 32 + 4 * t),
                              load_u8x4(a_tile + g * 32 + 16 + 4 * t),
                              load_u8x4(a_tile + (g + 8) * 32 + 16 + 4 * t)};
  const std::uint32_t b[2] = {load_u8x4(b_tile + g * 32 + 4 * t), load_u8x4(b_tile + g * 32 + 16 + 4 * t)};
  const float c[4] = {c_tile[g * 8 + 2 * t], c_tile[g * 8 + 2 * t + 1], c_tile[(g + 8) * 8 + 2 * t],
                      c_tile[(g + 8) * 8 + 2 * t + 1]};
  float d[4];
  gpu::mma_m16n8k32_e4m3(d, a, b, c);
  d_tile[g * 8 + 2 * t] = d[0];
  d_tile[g * 8 + 2 * t + 1] = d[1];
  d_tile[(g + 8) * 8 + 2 * t] = d[2];
  d_tile[(g + 8) * 8 + 2 * t + 1] = d[3];
}

// As above for bf16 bit patterns: A 16x16, Bt 8x16.
__global__ void mma_bf16_kernel(const std::uint16_t* A, const std::uint16_t* Bt, const float* C, float* D) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane >> 2, t = lane & 3;
  const std::uint16_t* a_tile = A + warp * 16 * 16;
  const std::uint16_t* b_tile = Bt + warp * 8 * 16;
  const float* c_tile = C + warp * 16 * 8;
  float* d_tile = D + warp * 16 * 8;
  const std::uint32_t a[4] = {load_u16x2(a_tile + g * 16 + 2 * t), load_u16x2(a_tile + (g + 8) * 16 + 2 * t),
                              load_u16x2(a_tile + g * 16 + 8 + 2 * t),
                              load_u16x2(a_tile + (g + 8) * 16 + 8 + 2 * t)};
  const std::uint32_t b[2] = {load_u16x2(b_tile + g * 16 + 2 * t), load_u16x2(b_tile + g * 16 + 8 + 2 * t)};
  float c[4] = {c_tile[g * 8 + 2 * t], c_tile[g * 8 + 2 * t + 1], c_tile[(g + 8) * 8 + 2 * t],
                c_tile[(g + 8) * 8 + 2 * t + 1]};
  gpu::mma_m16n8k16_bf16(c, a, b, c);  // D may be C
  d_tile[g * 8 + 2 * t] = c[0];
  d_tile[g * 8 + 2 * t + 1] = c[1];
  d_tile[(g + 8) * 8 + 2 * t] = c[2];
  d_tile[(g + 8) * 8 + 2 * t + 1] = c[3];
}

// cp.async round trips: two committed groups (the second half zero-filled on odd threads), waits
// for one and then both, then a wait_all on uncommitted copies.
__global__ void cp_async_kernel(const uint4* src, uint4* dst) {
  DSV4_DYNAMIC_SMEM(uint4, stage);
  const int n = static_cast<int>(blockDim.x), t = static_cast<int>(threadIdx.x);
  gpu::cp_async_16(&stage[t], &src[t]);
  gpu::cp_async_commit();
  gpu::cp_async_16_zfill(&stage[n + t], &src[n + t], t % 2 == 0);
  gpu::cp_async_commit();
  gpu::cp_async_wait<1>();
  __syncthreads();
  dst[t] = stage[(t + 1) % n];
  gpu::cp_async_wait<0>();
  __syncthreads();
  dst[n + t] = stage[n + (t + 5) % n];
  __syncthreads();
  gpu::cp_async_16(&stage[t], &src[2 * n + t]);
  gpu::cp_async_wait_all();
  __syncthreads();
  dst[2 * n + t] = stage[(t + 3) % n];
}

// ldmatrix x4 and x4.trans from a 32 x 40 tile of 16-bit values in shared memory (row stride 40
// values = 80 bytes, so rows are 16-byte aligned and not contiguous): lane l points at row
// (l % 8) + 8 (l / 8) of the tile, columns `col0` ..; every lane writes its four words of each.
__global__ void ldmatrix_kernel(const std::uint16_t* tile, int col0, std::uint32_t* out) {
  __shared__ __align__(16) std::uint16_t s[32 * 40];
  const int lane = static_cast<int>(threadIdx.x);
  for (int i = lane; i < 32 * 40; i += 32) s[i] = tile[i];
  __syncthreads();
  const std::uint16_t* row = s + ((lane % 8) + 8 * (lane / 8)) * 40 + col0;
  std::uint32_t r[4], rt[4];
  gpu::ldmatrix_x4(r, row);
  gpu::ldmatrix_x4_trans(rt, row);
  for (int m = 0; m < 4; ++m) {
    out[lane * 8 + m] = r[m];
    out[lane * 8 + 4 + m] = rt[m];
  }
}

// wgmma: one warpgroup multiplies A [64 x 32] by B [64 x 32]^T in two k16 steps. The operands
// sit in the no-swizzle K-major layout with different arrangements of their core matrices -- A's
// K neighbours adjacent (lbo 128, sbo 512), B's row neighbours adjacent (sbo 128, lbo 1024) -- so
// a descriptor that swapped lbo and sbo would read the wrong values.
__device__ __forceinline__ int core_offset(int r, int k, int lbo, int sbo) { return (r / 8) * sbo + (k / 8) * lbo + (r % 8) * 16 + (k % 8) * 2; }

__global__ void wgmma_kernel(const std::uint16_t* a, const std::uint16_t* b, float* d) {
  DSV4_DYNAMIC_SMEM(std::uint8_t, smem);
  std::uint8_t* sa = smem;
  std::uint8_t* sb = smem + 4096;
  const int t = static_cast<int>(threadIdx.x);
  for (int i = t; i < 64 * 32; i += 128) {
    const int r = i / 32, k = i % 32;
    *reinterpret_cast<std::uint16_t*>(sa + core_offset(r, k, 128, 512)) = a[i];
    *reinterpret_cast<std::uint16_t*>(sb + core_offset(r, k, 1024, 128)) = b[i];
  }
  gpu::fence_proxy_async_shared();
  __syncthreads();
  float acc[32];
  for (float& v : acc) v = 0.0f;
  gpu::wgmma_fence();
  for (int ks = 0; ks < 2; ++ks) {  // k 16 ks .. 16 ks + 15: K core matrices 2 ks and 2 ks + 1
    const std::uint64_t da = gpu::wgmma_descriptor(sa + 2 * ks * 128, 128, 512);
    const std::uint64_t db = gpu::wgmma_descriptor(sb + 2 * ks * 1024, 1024, 128);
    gpu::wgmma_m64n64k16_bf16(acc, da, db, ks > 0);
  }
  gpu::wgmma_commit();
  gpu::wgmma_wait<0>();
  const int w = t / 32, g = (t % 32) / 4, q = t % 4;
  for (int i = 0; i < 32; ++i) d[(16 * w + g + 8 * ((i % 4) / 2)) * 64 + 8 * (i / 4) + 2 * q + i % 2] = acc[i];
}

// wgmma with A from registers (f16, m64nNk16): thread t of the warpgroup loads its four A words from
// the row-major A [64][16] (warp w rows 16 w.., a[0] row g k 2 q, 2 q + 1; a[1] row g + 8; a[2] row g
// k 8 + 2 q ..; a[3] row g + 8 k 8 + 2 q ..); B [64][16] goes K-major into shared memory (sbo 256,
// lbo 128). Two products on the same A: D64 = A B^T and D8 = A B[0..8)^T.
__global__ void wgmma_f16_rs_kernel(const std::uint16_t* a, const std::uint16_t* b, float* d8, float* d64) {
  DSV4_DYNAMIC_SMEM(std::uint8_t, smem);
  const int t = static_cast<int>(threadIdx.x);
  for (int i = t; i < 64 * 16; i += 128) {
    const int n = i / 16, k = i % 16;
    *reinterpret_cast<std::uint16_t*>(smem + (n / 8) * 256 + (k / 8) * 128 + (n % 8) * 16 + (k % 8) * 2) = b[i];
  }
  gpu::fence_proxy_async_shared();
  __syncthreads();
  const int w = t / 32, g = (t % 32) / 4, q = t % 4;
  std::uint32_t frag[4];
  for (int j = 0; j < 4; ++j) {
    const int row = 16 * w + g + 8 * (j % 2), k0 = 2 * q + 8 * (j / 2);
    frag[j] = static_cast<std::uint32_t>(a[row * 16 + k0]) | (static_cast<std::uint32_t>(a[row * 16 + k0 + 1]) << 16);
  }
  float acc8[4], acc64[32];
  gpu::wgmma_fence();
  const std::uint64_t db = gpu::wgmma_descriptor(smem, 128, 256);
  gpu::wgmma_m64k16_f16_rs<8>(acc8, frag, db, false);
  gpu::wgmma_m64k16_f16_rs<64>(acc64, frag, db, false);
  gpu::wgmma_commit();
  gpu::wgmma_wait<0>();
  gpu::wgmma_fence_operands(acc8);
  gpu::wgmma_fence_operands(acc64);
  for (int i = 0; i < 4; ++i) d8[(16 * w + g + 8 * ((i % 4) / 2)) * 8 + 2 * q + i % 2] = acc8[i];
  for (int i = 0; i < 32; ++i) d64[(16 * w + g + 8 * ((i % 4) / 2)) * 64 + 8 * (i / 4) + 2 * q + i % 2] = acc64[i];
}

// The two other wgmma shapes on the same A (64 x 32): D1 = A Bk^T with Bk [32 n][32 k] K-major
// (m64n32k16), D2 = A Bt with Bt [32 k][256 n] stored MN-major (m64n256k16, B transposed): core
// matrices of 8 k-rows x 8 n-values, n-blocks 128 bytes apart, k-blocks 4096.
__device__ __forceinline__ int mn_core_offset(int k, int n, int lbo, int sbo) { return (n / 8) * sbo + (k / 8) * lbo + (k % 8) * 16 + (n % 8) * 2; }

__global__ void wgmma_wide_kernel(const std::uint16_t* a, const std::uint16_t* bk, const std::uint16_t* bt, float* d1, float* d2) {
  DSV4_DYNAMIC_SMEM(std::uint8_t, smem);
  std::uint8_t* sa = smem;
  std::uint8_t* sk = smem + 4096;
  std::uint8_t* st = smem + 6144;
  const int t = static_cast<int>(threadIdx.x);
  for (int i = t; i < 64 * 32; i += 128) *reinterpret_cast<std::uint16_t*>(sa + core_offset(i / 32, i % 32, 128, 512)) = a[i];
  for (int i = t; i < 32 * 32; i += 128) *reinterpret_cast<std::uint16_t*>(sk + core_offset(i / 32, i % 32, 512, 128)) = bk[i];
  for (int i = t; i < 32 * 256; i += 128) *reinterpret_cast<std::uint16_t*>(st + mn_core_offset(i / 256, i % 256, 4096, 128)) = bt[i];
  gpu::fence_proxy_async_shared();
  __syncthreads();
  float acc1[16], acc2[128];
  for (float& v : acc1) v = 0.0f;
  for (float& v : acc2) v = 0.0f;
  gpu::wgmma_fence();
  for (int ks = 0; ks < 2; ++ks) {
    const std::uint64_t da = gpu::wgmma_descriptor(sa + 2 * ks * 128, 128, 512);
    gpu::wgmma_m64n32k16_bf16(acc1, da, gpu::wgmma_descriptor(sk + 2 * ks * 512, 512, 128), ks > 0);
    gpu::wgmma_m64n256k16_bf16_bt(acc2, da, gpu::wgmma_descriptor(st + 2 * ks * 4096, 4096, 128), ks > 0);
  }
  gpu::wgmma_commit();
  gpu::wgmma_wait<0>();
  gpu::wgmma_fence_operands(acc1);
  gpu::wgmma_fence_operands(acc2);
  const int w = t / 32, g = (t % 32) / 4, q = t % 4;
  for (int i = 0; i < 16; ++i) d1[(16 * w + g + 8 * ((i % 4) / 2)) * 32 + 8 * (i / 4) + 2 * q + i % 2] = acc1[i];
  for (int i = 0; i < 128; ++i) d2[(16 * w + g + 8 * ((i % 4) / 2)) * 256 + 8 * (i / 4) + 2 * q + i % 2] = acc2[i];
}

// wgmma with an e4m3 A from registers (m64nNk32): thread t of the warpgroup loads its four A words
// from the row-major A [64][32] (a[0] row g k 4 q .. 4 q + 3, a[1] row g + 8, a[2] row g k 16 + 4 q ..,
// a[3] row g + 8 k 16 + 4 q ..); B [64][32] goes K-major into shared memory (sbo 256, lbo 128). D8 =
// A B[0..8)^T accumulated twice, D64 = A B^T.
__global__ void wgmma_e4m3_rs_kernel(const std::uint8_t* a, const std::uint8_t* b, float* d8, float* d64) {
  DSV4_DYNAMIC_SMEM(std::uint8_t, smem);
  const int t = static_cast<int>(threadIdx.x);
  for (int i = t; i < 64 * 32; i += 128) {
    const int n = i / 32, k = i % 32;
    smem[(n / 8) * 256 + (k / 16) * 128 + (n % 8) * 16 + k % 16] = b[i];
  }
  gpu::fence_proxy_async_shared();
  __syncthreads();
  const int w = t / 32, g = (t % 32) / 4, q = t % 4;
  std::uint32_t frag[4];
  for (int j = 0; j < 4; ++j) {
    const int row = 16 * w + g + 8 * (j % 2), k0 = 4 * q + 16 * (j / 2);
    frag[j] = *reinterpret_cast<const std::uint32_t*>(a + row * 32 + k0);
  }
  float acc8[4], acc64[32];
  for (float& v : acc8) v = 0.0f;
  gpu::wgmma_fence();
  const std::uint64_t db = gpu::wgmma_descriptor(smem, 128, 256);
  gpu::wgmma_m64k32_e4m3_rs<8>(acc8, frag, db, false);
  gpu::wgmma_m64k32_e4m3_rs<8>(acc8, frag, db, true);
  gpu::wgmma_m64k32_e4m3_rs<64>(acc64, frag, db, false);
  gpu::wgmma_commit();
  gpu::wgmma_wait<0>();
  gpu::wgmma_fence_operands(acc8);
  gpu::wgmma_fence_operands(acc64);
  gpu::wgmma_fence_operands(frag);
  for (int i = 0; i < 4; ++i) d8[(16 * w + g + 8 * ((i % 4) / 2)) * 8 + 2 * q + i % 2] = acc8[i];
  for (int i = 0; i < 32; ++i) d64[(16 * w + g + 8 * ((i % 4) / 2)) * 64 + 8 * (i / 4) + 2 * q + i % 2] = acc64[i];
}

// FP8 wgmma as the tensor core sums it (numerics/fp8_dot_model.h): tile blockIdx.x of
// D [64 x 64] = C + A [64 x k] B [64 x k]^T, k = 32 or 128, one wgmma.m64n64k32.e4m3 per 32 values
// chained through the accumulator (C null: the first product starts from zero). Each 32-wide
// chunk of A and of B sits K-major without swizzle (sbo 256, lbo 128), 2 KB after the one before.
__global__ void wgmma_e4m3_probe_kernel(const std::uint8_t* a, const std::uint8_t* b, const float* c, float* d, int k) {
  DSV4_DYNAMIC_SMEM(std::uint8_t, smem);
  std::uint8_t* sa = smem;
  std::uint8_t* sb = smem + 64 * k;
  const std::int64_t tile = blockIdx.x;
  const int t = static_cast<int>(threadIdx.x);
  for (int i = t; i < 64 * k; i += 128) {
    const int r = i / k, kk = i % k;
    const int offset = (kk / 32) * 2048 + (r / 8) * 256 + ((kk % 32) / 16) * 128 + (r % 8) * 16 + kk % 16;
    sa[offset] = a[tile * 64 * k + i];
    sb[offset] = b[tile * 64 * k + i];
  }
  gpu::fence_proxy_async_shared();
  __syncthreads();
  const int w = t / 32, g = (t % 32) / 4, q = t % 4;
  const auto at = [&](int i) {
    return tile * 4096 + (16 * w + g + 8 * ((i % 4) / 2)) * 64 + 8 * (i / 4) + 2 * q + i % 2;
  };
  float acc[32];
  for (int i = 0; i < 32; ++i) acc[i] = c == nullptr ? 0.0f : c[at(i)];
  gpu::wgmma_fence();
  for (int j = 0; j < k / 32; ++j)
    gpu::wgmma_m64n64k32_e4m3(acc, gpu::wgmma_descriptor(sa + j * 2048, 128, 256),
                              gpu::wgmma_descriptor(sb + j * 2048, 128, 256), c != nullptr || j > 0);
  gpu::wgmma_commit();
  gpu::wgmma_wait<0>();
  gpu::wgmma_fence_operands(acc);
  for (int i = 0; i < 32; ++i) d[at(i)] = acc[i];
}

// Bulk copies completed on an mbarrier, two phases of the same barrier: thread 0 announces the
// bytes and issues the copies in four pieces, every thread waits for the phase and reads.
__global__ void bulk_copy_kernel(const uint4* src, uint4* dst) {
  DSV4_DYNAMIC_SMEM(uint4, stage);
  __shared__ __align__(8) std::uint64_t bar;
  const int n = static_cast<int>(blockDim.x), t = static_cast<int>(threadIdx.x);
  if (t == 0) gpu::mbarrier_init(&bar, 1);
  __syncthreads();
  for (int phase = 0; phase < 2; ++phase) {
    if (t == 0) {
      gpu::mbarrier_arrive_expect_tx(&bar, static_cast<unsigned>(n) * 16u);
      for (int q = 0; q < 4; ++q)
        gpu::bulk_copy_to_shared(stage + q * (n / 4), src + phase * n + q * (n / 4), static_cast<unsigned>(n / 4) * 16u,
                                 &bar);
    }
    gpu::mbarrier_wait(&bar, static_cast<unsigned>(phase & 1));
    dst[phase * n + t] = stage[(t + 7 * (phase + 1)) % n];
    __syncthreads();  // every read of this phase done before the next overwrites the stage
  }
}

// Warp specialization: warpgroup 2 (setmaxnreg_dec) produces four rounds of 128 uint4 into two
// shared tiles with predicated loads (every third one reads nothing and gives zeros), handing them
// over through full / empty mbarriers; warpgroups 0 and 1 (setmaxnreg_inc) consume them and
// exchange values among themselves on named barrier 1, which warpgroup 2 never joins.
__global__ void __launch_bounds__(384, 1)
    warp_specialized_kernel(const uint4* src, const uint2* src2, uint4* dst, uint2* dst2) {
  __shared__ uint4 tile[2][128];
  __shared__ unsigned slot[256];
  __shared__ __align__(8) std::uint64_t full[2], empty[2];
  const int t = static_cast<int>(threadIdx.x);
  if (t == 0) {
    for (int b = 0; b < 2; ++b) {
      gpu::mbarrier_init(&full[b], 128);
      gpu::mbarrier_init(&empty[b], 256);
    }
  }
  __syncthreads();
  if (t >= 256) {
    gpu::setmaxnreg_dec<56>();
    const int p = t - 256;
    for (int r = 0; r < 4; ++r) {
      const int b = r & 1, i = r * 128 + p;
      const uint4 v = gpu::load_global_v4_or_zero(src + i, i % 3 != 0);
      if (r >= 2) gpu::mbarrier_wait(&empty[b], static_cast<unsigned>(((r >> 1) & 1) ^ 1));
      tile[b][p] = v;
      gpu::mbarrier_arrive(&full[b]);
    }
    dst2[p] = gpu::load_global_v2_or_zero(src2 + p, p % 2 == 0);
    return;
  }
  gpu::setmaxnreg_inc<224>();
  for (int r = 0; r < 4; ++r) {
    const int b = r & 1;
    gpu::mbarrier_wait(&full[b], static_cast<unsigned>((r >> 1) & 1));
    uint4 v = tile[b][(t * 5 + r) % 128];
    slot[t] = v.x + static_cast<unsigned>(r);
    gpu::named_barrier_sync(1, 256);
    v.w += slot[(t + 1) % 256];
    gpu::named_barrier_sync(1, 256);  // every read of slot done before the next round's writes
    dst[r * 256 + t] = v;
    gpu::mbarrier_arrive(&empty[b]);
  }
}

// Thread block clusters: thread t of the block of rank r writes a value naming it into the next
// block's (rank r + 1, cyclically) shared memory through cluster_map; after cluster_sync each
// thread reads what the previous block wrote. Thread 0 also reports the rank and cluster size.
__global__ void cluster_exchange_kernel(unsigned* out, unsigned* ranks) {
  DSV4_DYNAMIC_SMEM(unsigned, buf);
  const unsigned t = threadIdx.x, n = blockDim.x, r = gpu::cluster_rank(), c = gpu::cluster_blocks();
  unsigned* next = gpu::cluster_map(buf, (r + 1) % c);
  next[t] = r * 100000u + blockIdx.x * 1000u + t;
  gpu::cluster_sync();
  out[blockIdx.x * n + t] = buf[(t + 3) % n];
  if (t == 0) ranks[blockIdx.x] = r | (c << 8);
  gpu::cluster_sync();  // no block exits while its peer may still write into it
}

// Remote mbarrier arrivals, two phases: every thread of a block stores into its peer's (rank ^ 1)
// buffer and arrives on the peer's barrier (count: the block's threads); each block waits for its
// own barrier's phase (acquire at cluster scope) and reads what the peer stored.
__global__ void cluster_mbarrier_kernel(unsigned* out) {
  DSV4_DYNAMIC_SMEM(std::uint64_t, bar);
  unsigned* buf = reinterpret_cast<unsigned*>(bar + 1);
  const unsigned t = threadIdx.x, n = blockDim.x, r = gpu::cluster_rank(), peer = r ^ 1u;
  if (t == 0) gpu::mbarrier_init(bar, n);
  gpu::cluster_sync();  // both barriers initialized before any remote arrival
  unsigned* peer_buf = gpu::cluster_map(buf, peer);
  for (unsigned phase = 0; phase < 2; ++phase) {
    peer_buf[t] = phase * 7u + r * 1000u + t * 3u;
    gpu::mbarrier_arrive_remote(bar, peer);
    gpu::mbarrier_wait_cluster(bar, phase & 1u);
    out[(phase * gridDim.x + blockIdx.x) * n + t] = buf[(t + 1) % n];
    gpu::cluster_sync();  // both blocks read this phase's values before the next one's stores
  }
}

__global__ void bf16_kernel(const float* in, int n, unsigned short* bits, unsigned short* bits_rn, float* back,
                            float2* pair, float* lows, float* highs) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  const __nv_bfloat16 h = __float2bfloat16(in[i]);
  const __nv_bfloat16 h_rn = __float2bfloat16_rn(in[i]);
  bits[i] = __bfloat16_as_ushort(h);
  bits_rn[i] = __bfloat16_as_ushort(h_rn);
  back[i] = __bfloat162float(h);
  const __nv_bfloat162 p = __floats2bfloat162_rn(in[i], in[n - 1 - i]);
  pair[i] = __bfloat1622float2(p);
  lows[i] = __low2float(p);
  highs[i] = __high2float(p);
}

// Thread i converts the code pair i (0 .. 65535) with every exponent of exps[] both ways (the
// five-instruction power-of-two path and the fp32 one) and counts differing bits, NaN codes
// aside; threads 0 .. 1023 also test the range check on byte i % 256 at position i / 256.
__global__ void e4m3_pow2_kernel(const unsigned* exps, int n_exps, unsigned* mismatches, unsigned* in_range) {
  const unsigned codes = blockIdx.x * blockDim.x + threadIdx.x;
  if (codes >= 65536u) return;
  const bool nan = (codes & 0x7fu) == 0x7fu || ((codes >> 8) & 0x7fu) == 0x7fu;
  for (int i = 0; i < n_exps; ++i) {
    const unsigned got = gpu::e4m3x2_to_bf16x2_pow2(codes, gpu::ue8m0_pow2_factor(exps[i]));
    const unsigned want = gpu::e4m3x2_to_bf16x2(codes, gpu::ue8m0_value(static_cast<std::uint8_t>(exps[i])));
    if (!nan && got != want) atomicAdd(mismatches, 1u);
  }
  if (codes < 1024u) {
    const unsigned shift = 8u * (codes / 256u);
    const unsigned word = (0x7f7f7f7fu & ~(0xffu << shift)) | ((codes % 256u) << shift);
    in_range[codes] = gpu::ue8m0x4_in_pow2_range(word) ? 1u : 0u;
  }
}

constexpr int kMathFloats = 34;
constexpr int kMathInts = 30;

__global__ void math_kernel(const float* x, const unsigned* u, int n, float* out_f, long long* out_i) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  const float v = x[i];
  const float a = fabsf(v);
  float* f = out_f + i * kMathFloats;
  f[0] = expf(v);
  f[1] = logf(a + 1.0f);
  f[2] = log1pf(a);
  f[3] = sqrtf(a);
  f[4] = fabsf(v);
  f[5] = fmaxf(v, 0.5f);
  f[6] = fminf(v, 0.5f);
  f[7] = floorf(v);
  f[8] = ceilf(v);
  f[9] = exp2f(v);
  f[10] = log2f(a + 1.0f);
  f[11] = sinf(v);
  f[12] = cosf(v);
  float s, c;
  sincosf(v, &s, &c);
  f[13] = s;
  f[14] = c;
  f[15] = tanhf(v);
  f[16] = powf(a + 1.0f, 1.5f);
  f[17] = ldexpf(v, 3);
  int e = 0;
  f[18] = frexpf(v, &e);
  f[19] = static_cast<float>(e);
  f[20] = rsqrtf(a + 1.0f);
  f[21] = __expf(v);
  f[22] = __logf(a + 1.0f);
  f[23] = __fdividef(v, 3.0f);
  f[24] = __frcp_rn(v + 20.0f);
  f[25] = __fsqrt_rn(a);
  f[26] = __fadd_rn(v, 1.0f / 3.0f);
  f[27] = __fmul_rn(v, 1.0f / 3.0f);
  f[28] = __fmaf_rn(v, 1.0f / 3.0f, 0.25f);
  f[29] = __saturatef(v);
  f[30] = min(v, 0.25f);
  f[31] = max(v, 0.25f);
  f[32] = __uint_as_float(__float_as_uint(v) ^ 0x80000000u);
  f[33] = __int_as_float(__float_as_int(v) & 0x7fffffff);

  const unsigned w = u[i];
  const unsigned w2 = u[(i + 1) % n];
  const unsigned long long wide = (static_cast<unsigned long long>(w2) << 32) | w;
  long long* o = out_i + i * kMathInts;
  o[0] = __clz(static_cast<int>(w));
  o[1] = __clzll(static_cast<long long>(wide >> (w2 % 64)));
  o[2] = __popc(w);
  o[3] = __popcll(wide);
  o[4] = __ffs(static_cast<int>(w));
  o[5] = __ffsll(static_cast<long long>(wide));
  o[6] = __brev(w);
  o[7] = static_cast<long long>(__brevll(wide) >> 1);
  o[8] = __byte_perm(w, w2, 0x3210u);
  o[9] = __byte_perm(w, w2, 0x7654u);
  o[10] = __byte_perm(w, w2, (w2 & 0x7777u));  // selector nibbles 0..7
  o[11] = __funnelshift_l(w, w2, w2 % 40);
  o[12] = __funnelshift_r(w, w2, w2 % 40);
  o[13] = __umulhi(w, w2);
  o[14] = __float_as_uint(v);
  o[15] = __float_as_int(v);
  o[16] = min(static_cast<int>(w), static_cast<int>(w2));
  o[17] = max(static_cast<int>(w), static_cast<int>(w2));
  o[18] = min(w, w2);
  o[19] = max(w, w2);
  o[20] = min(static_cast<long long>(wide), -5ll);
  o[21] = static_cast<long long>(max(wide, 12345ull));
  o[22] = __float2int_rn(v * 3.0f);
  o[23] = __float2int_rz(v * 3.0f);
  o[24] = __popcll(0ull);
  o[25] = warpSize;
  o[26] = __clz(0);
  o[27] = __ffs(0);
  o[28] = __funnelshift_l(w, w2, 0);
  o[29] = __funnelshift_r(w, w2, 32);
}

// =================================================================================================
// Host references
// =================================================================================================

int reference_source_lane(int mode, int lane, int arg, int width) {
  const int seg = lane - lane % width;  // first lane of the lane's segment
  switch (mode) {
    case kIdx:
      return seg + arg % width;
    case kUp:
      return lane % width >= arg ? lane - arg : lane;
    case kDown:
      return lane % width + arg < width ? lane + arg : lane;
    default: {
      const int j = lane ^ arg;
      return j < seg + width ? j : lane;  // earlier segments are reachable, later ones are not
    }
  }
}

float decode_e4m3_reference(std::uint8_t code) {
  const int sign = code >> 7, exponent = (code >> 3) & 15, mantissa = code & 7;
  const double magnitude =
      exponent == 0 ? mantissa * std::pow(2.0, -9) : (1.0 + mantissa / 8.0) * std::pow(2.0, exponent - 7);
  return static_cast<float>(sign ? -magnitude : magnitude);
}

std::uint8_t encode_small_int_e4m3(int v) {  // exact for |v| <= 8
  if (v == 0) return 0;
  const int a = std::abs(v);
  int exponent = 0;
  while ((2 << exponent) <= a) ++exponent;  // 2^exponent <= a < 2^(exponent+1)
  const int mantissa = (a * 8 >> exponent) - 8;
  return static_cast<std::uint8_t>((v < 0 ? 0x80 : 0) | ((exponent + 7) << 3) | mantissa);
}

// =================================================================================================
// Tests
// =================================================================================================

TEST(DeviceLanguage, BlockReductionWithSyncthreads) {
  const int n = 5000, threads = 256, blocks = (n + threads - 1) / threads;
  std::vector<int> in(n);
  for (int i = 0; i < n; ++i) in[i] = (i * 7919) % 1000 - 500;
  DeviceVector<int> d_in(in), d_out(blocks);
  gpu::launch(block_sum_kernel, dim3(blocks), dim3(threads), 0, test_stream().handle(), d_in.get(), d_out.get(), n);
  const auto out = d_out.to_host();
  for (int b = 0; b < blocks; ++b) {
    int want = 0;
    for (int i = b * threads; i < std::min(n, (b + 1) * threads); ++i) want += in[i];
    EXPECT_EQ(out[b], want) << "block " << b;
  }
}

TEST(DeviceLanguage, SyncthreadsCountAndOr) {
  DeviceVector<int> out(5);
  gpu::launch(barrier_reduce_kernel, dim3(1), dim3(128), 0, test_stream().handle(), out.get());
  EXPECT_EQ(out.to_host(), (std::vector<int>{43, 1, 1, 0, 0}));
}

TEST(DeviceLanguage, MultiDimensionalGridsAndBlocks) {
  const dim3 grid(3, 2, 2), block(4, 3, 2);
  const unsigned threads = block.x * block.y * block.z, blocks = grid.x * grid.y * grid.z;
  DeviceVector<uint4> out(threads * blocks);
  gpu::launch(index_kernel, grid, block, 0, test_stream().handle(), out.get());
  const auto got = out.to_host();
  auto pack = [](unsigned x, unsigned y, unsigned z) { return x | (y << 8) | (z << 16); };
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx)
        for (unsigned tz = 0; tz < block.z; ++tz)
          for (unsigned ty = 0; ty < block.y; ++ty)
            for (unsigned tx = 0; tx < block.x; ++tx) {
              const unsigned b = bx + grid.x * (by + grid.y * bz), t = tx + block.x * (ty + block.y * tz);
              const uint4 v = got[b * threads + t];
              ASSERT_EQ(v.x, pack(tx, ty, tz));
              ASSERT_EQ(v.y, pack(bx, by, bz));
              ASSERT_EQ(v.z, pack(block.x, block.y, block.z));
              ASSERT_EQ(v.w, pack(grid.x, grid.y, grid.z) | (32u << 24));
            }
}

TEST(DeviceLanguage, EveryShuffleVariantAndWidth) {
  std::vector<ShflCase> cases;
  for (int mode : {kIdx, kUp, kDown, kXor}) {
    for (int width : {32, 16, 8, 4, 2, 1}) {
      for (int arg : {0, 1, 2, 3, 5, 8, 13, 16, 31}) cases.push_back({mode, width, arg});
    }
  }
  for (int width : {32, 16, 4}) cases.push_back({kIdx, width, 37});  // source lanes beyond the width wrap
  const int nc = static_cast<int>(cases.size());
  DeviceVector<ShflCase> d_cases(cases);
  DeviceVector<int> out_i(nc * 32);
  DeviceVector<unsigned> out_u(nc * 32);
  DeviceVector<float> out_f(nc * 32);
  DeviceVector<long long> out_ll(nc * 32);
  DeviceVector<unsigned long long> out_ull(nc * 32);
  DeviceVector<double> out_d(nc * 32);
  gpu::launch(shfl_kernel, dim3(1), dim3(32), 0, test_stream().handle(), d_cases.get(), nc, out_i.get(),
              out_u.get(), out_f.get(), out_ll.get(), out_ull.get(), out_d.get());
  const auto gi = out_i.to_host();
  const auto gu = out_u.to_host();
  const auto gf = out_f.to_host();
  const auto gll = out_ll.to_host();
  const auto gull = out_ull.to_host();
  const auto gd = out_d.to_host();
  for (int c = 0; c < nc; ++c) {
    for (int lane = 0; lane < 32; ++lane) {
      const int src = reference_source_lane(cases[c].mode, lane, cases[c].arg, cases[c].width);
      const int k = c * 32 + lane;
      SCOPED_TRACE(testing::Message() << "mode " << cases[c].mode << " width " << cases[c].width << " arg "
                                      << cases[c].arg << " lane " << lane);
      ASSERT_EQ(gi[k], src * 7 - 50);
      ASSERT_EQ(gu[k], 0x80000000u + static_cast<unsigned>(src) * 3u);
      ASSERT_EQ(gf[k], static_cast<float>(src) * 0.5f - 3.0f);
      ASSERT_EQ(gll[k], (static_cast<long long>(src) << 40) - src);
      ASSERT_EQ(gull[k], (static_cast<unsigned long long>(src) << 50) | static_cast<unsigned>(src));
      ASSERT_EQ(gd[k], src * 1.25 + 1e10);
    }
  }
}

TEST(DeviceLanguage, ShufflesWithPartialMasksAndBf16) {
  DeviceVector<int> out(32);
  DeviceVector<float> out_bf16(32);
  gpu::launch(shfl_partial_kernel, dim3(1), dim3(32), 0, test_stream().handle(), out.get(), out_bf16.get());
  const auto got = out.to_host();
  const auto got_bf16 = out_bf16.to_host();
  for (int lane = 0; lane < 32; ++lane) {
    const int want = lane < 16 ? (lane ^ 3) * 10 : reference_source_lane(kDown, lane, 2, 16) * 10;
    EXPECT_EQ(got[lane], want) << "lane " << lane;
    EXPECT_EQ(got_bf16[lane], static_cast<float>(31 - lane) + 0.5f) << "lane " << lane;
  }
}

TEST(DeviceLanguage, BallotAnyAll) {
  DeviceVector<unsigned> out(37);
  gpu::launch(vote_kernel, dim3(1), dim3(32), 0, test_stream().handle(), out.get());
  const auto got = out.to_host();
  unsigned ballot = 0;
  for (int lane = 0; lane < 32; lane += 3) ballot |= 1u << lane;
  EXPECT_EQ(got[0], ballot);
  EXPECT_EQ(got[1], 1u);
  EXPECT_EQ(got[2], 0u);
  EXPECT_EQ(got[3], 1u);
  EXPECT_EQ(got[4], 0u);
  for (int lane = 0; lane < 32; ++lane) {
    EXPECT_EQ(got[5 + lane], lane % 2 == 0 ? 0x11111111u : 101u) << "lane " << lane;
  }
}

TEST(DeviceLanguage, WarpReducesAndMatch) {
  DeviceVector<unsigned> out_u(32 * 8);
  DeviceVector<int> out_i(32 * 4);
  gpu::launch(reduce_match_kernel, dim3(1), dim3(32), 0, test_stream().handle(), out_u.get(), out_i.get());
  const auto gu = out_u.to_host();
  const auto gi = out_i.to_host();
  unsigned sum = 0, mn = ~0u, mx = 0, x = 0;
  int ssum = 0, smin = std::numeric_limits<int>::max(), smax = std::numeric_limits<int>::min();
  for (unsigned lane = 0; lane < 32; ++lane) {
    const unsigned v = lane * lane + 1u;
    sum += v;
    mn = std::min(mn, v + 5u);
    mx = std::max(mx, v);
    x ^= lane;
    const int s = static_cast<int>(lane) * 37 - 500;
    ssum += s;
    smin = std::min(smin, s);
    smax = std::max(smax, s);
  }
  for (unsigned lane = 0; lane < 32; ++lane) {
    SCOPED_TRACE(lane);
    EXPECT_EQ(gu[lane * 8 + 0], sum);
    EXPECT_EQ(gu[lane * 8 + 1], mn);
    EXPECT_EQ(gu[lane * 8 + 2], mx);
    EXPECT_EQ(gu[lane * 8 + 3], 0xfffffff0u);
    EXPECT_EQ(gu[lane * 8 + 4], 0xffffffffu);
    EXPECT_EQ(gu[lane * 8 + 5], x);
    unsigned same = 0;
    for (unsigned other = 0; other < 32; ++other) same |= (other % 5 == lane % 5) ? 1u << other : 0u;
    EXPECT_EQ(gu[lane * 8 + 6], same);
    EXPECT_EQ(gu[lane * 8 + 7], 0xffffffffu);
    EXPECT_EQ(gi[lane * 4 + 0], ssum);
    EXPECT_EQ(gi[lane * 4 + 1], smin);
    EXPECT_EQ(gi[lane * 4 + 2], smax);
    EXPECT_EQ(gi[lane * 4 + 3], 1);
  }
}

TEST(DeviceLanguage, SyncwarpOrdersSharedMemory) {
  DeviceVector<int> out(64);
  gpu::launch(syncwarp_kernel, dim3(1), dim3(64), 0, test_stream().handle(), out.get());
  const auto got = out.to_host();
  for (int t = 0; t < 64; ++t) {
    const int base = t & ~31;
    const int reader = base + ((t + 31) & 31);       // slot read at the end
    const int read_by_it = base + ((reader + 1) & 31);  // what that slot holds: its neighbour's first value + 1
    EXPECT_EQ(got[t], read_by_it * 3 + 1) << "thread " << t;
  }
}

TEST(DeviceLanguage, AtomicsFromManyThreads) {
  const int blocks = 8, threads = 256, n = blocks * threads;
  AtomicsOut init{};
  init.i_max = std::numeric_limits<int>::min();
  init.i_min = std::numeric_limits<int>::max();
  init.u_max = 0;
  init.u_min = ~0u;
  init.ll_max = std::numeric_limits<long long>::min();
  init.ll_min = std::numeric_limits<long long>::max();
  init.ull_max = 0;
  init.ull_min = ~0ull;
  init.bits_and = ~0u;
  init.exch = -1;
  init.sub = 10;
  DeviceVector<AtomicsOut> d(std::vector<AtomicsOut>{init});
  DeviceVector<int> exch_old(n);
  DeviceVector<unsigned> tickets(n);
  DeviceVector<unsigned short> cas16(std::vector<unsigned short>{7});
  gpu::launch(atomics_kernel, dim3(blocks), dim3(threads), 0, test_stream().handle(), d.get(), exch_old.get(),
              tickets.get(), cas16.get());
  const AtomicsOut o = d.to_host()[0];
  long long i_sum = 0;
  unsigned u_sum = 0;
  unsigned long long ull_sum = 0;
  int i_max = std::numeric_limits<int>::min(), i_min = std::numeric_limits<int>::max();
  for (int g = 0; g < n; ++g) {
    i_sum += g % 2 ? -g : g;
    u_sum += static_cast<unsigned>(g);
    ull_sum += static_cast<unsigned long long>(g) << 30;
    i_max = std::max(i_max, (g * 37) % 2048 - 1000);
    i_min = std::min(i_min, (g * 37) % 2048 - 1000);
  }
  EXPECT_EQ(o.i_sum, i_sum);
  EXPECT_EQ(o.u_sum, u_sum);
  EXPECT_EQ(o.ull_sum, ull_sum);
  EXPECT_EQ(o.f_sum, 3072.0f);  // (0+1+2+3) * 512, exact in any order
  EXPECT_EQ(o.d_sum, 0.5 * n * (n - 1) / 2);
  EXPECT_EQ(o.i_max, i_max);
  EXPECT_EQ(o.i_min, i_min);
  EXPECT_EQ(o.u_max, static_cast<unsigned>((n - 1) * 3));
  EXPECT_EQ(o.u_min, 7u);
  EXPECT_EQ(o.ll_max, static_cast<long long>(i_max) * (1ll << 33));
  EXPECT_EQ(o.ll_min, static_cast<long long>(i_min) * (1ll << 33));
  EXPECT_EQ(o.ull_max, static_cast<unsigned long long>(n - 1) << 40);
  EXPECT_EQ(o.ull_min, 9ull);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(o.bits_or[k], 0xffffffffu);
  EXPECT_EQ(o.bits_and, 0u);
  EXPECT_EQ(o.bits_xor, 0u);  // every bit flipped n/32 = 64 times
  EXPECT_EQ(o.cas_counter, n);
  EXPECT_EQ(cas16.to_host()[0], 7 + n);
  EXPECT_EQ(o.inc_counter, static_cast<unsigned>(n));
  EXPECT_EQ(o.ticket, static_cast<unsigned>(n));
  EXPECT_EQ(o.sub, 10 - 2 * n);
  // atomicExch: the old values and the final value are -1 and 0..n-1, each exactly once.
  std::vector<int> seen = exch_old.to_host();
  seen.push_back(o.exch);
  std::sort(seen.begin(), seen.end());
  for (int k = 0; k <= n; ++k) ASSERT_EQ(seen[k], k - 1);
  // atomicAdd's returned old values are a permutation of 0..n-1.
  std::vector<unsigned> t = tickets.to_host();
  std::sort(t.begin(), t.end());
  for (int k = 0; k < n; ++k) ASSERT_EQ(t[k], static_cast<unsigned>(k));
}

TEST(DeviceLanguage, DynamicSharedMemoryAboveTheDefaultLimit) {
  const int n = 16384, blocks = 3;  // 64 KB of floats per block
  const std::size_t smem = n * sizeof(float);
  gpu::set_max_dynamic_smem(dynamic_smem_kernel, smem);
  std::vector<float> in(static_cast<std::size_t>(n) * blocks);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) * 0.25f;
  DeviceVector<float> d_in(in), d_out(in.size());
  DeviceVector<unsigned> first_bits(blocks), aligned(blocks);
  gpu::launch(dynamic_smem_kernel, dim3(blocks), dim3(256), smem, test_stream().handle(), d_in.get(), d_out.get(),
              first_bits.get(), aligned.get(), n);
  const auto out = d_out.to_host();
  for (int b = 0; b < blocks; ++b) {
    for (int i = 0; i < n; ++i) ASSERT_EQ(out[b * n + i], in[b * n + n - 1 - i]);
  }
  const auto bits = first_bits.to_host();
  const auto align = aligned.to_host();
  for (int b = 0; b < blocks; ++b) {
    EXPECT_EQ(align[b], 1u);
    // Only the simulator promises anything about never-written shared memory: 0xFF bytes (NaN).
    if (gpu::simulated()) {
      EXPECT_EQ(bits[b], 0xffffffffu) << "block " << b;
    }
  }
}

TEST(DeviceLanguage, MmaE4m3SmallIntegersExact) {
  const int warps = 4;
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> small(-8, 8), cdist(-100, 100);
  std::vector<int> a(warps * 16 * 32), bt(warps * 8 * 32);
  std::vector<std::uint8_t> a8(a.size()), bt8(bt.size());
  for (std::size_t i = 0; i < a.size(); ++i) a8[i] = encode_small_int_e4m3(a[i] = small(rng));
  for (std::size_t i = 0; i < bt.size(); ++i) bt8[i] = encode_small_int_e4m3(bt[i] = small(rng));
  std::vector<float> c(warps * 16 * 8);
  for (auto& v : c) v = static_cast<float>(cdist(rng));
  for (std::size_t i = 0; i < a8.size(); ++i) ASSERT_EQ(decode_e4m3_reference(a8[i]), static_cast<float>(a[i]));
  DeviceVector<std::uint8_t> d_a(a8), d_bt(bt8);
  DeviceVector<float> d_c(c), d_d(c.size());
  gpu::launch(mma_e4m3_kernel, dim3(1), dim3(32 * warps), 0, test_stream().handle(), d_a.get(), d_bt.get(),
              d_c.get(), d_d.get());
  const auto d = d_d.to_host();
  for (int w = 0; w < warps; ++w)
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 8; ++n) {
        long long want = static_cast<long long>(c[(w * 16 + m) * 8 + n]);
        for (int k = 0; k < 32; ++k) want += a[(w * 16 + m) * 32 + k] * bt[(w * 8 + n) * 32 + k];
        ASSERT_EQ(d[(w * 16 + m) * 8 + n], static_cast<float>(want)) << "warp " << w << " m " << m << " n " << n;
      }
}

TEST(DeviceLanguage, MmaE4m3RandomCodes) {
  const int warps = 2;
  std::mt19937 rng(2);
  std::uniform_int_distribution<int> code(0, 255);
  auto draw = [&] {
    for (;;) {
      const int v = code(rng);
      if ((v & 0x7f) != 0x7f) return static_cast<std::uint8_t>(v);  // not NaN
    }
  };
  std::vector<std::uint8_t> a8(warps * 16 * 32), bt8(warps * 8 * 32);
  for (auto& v : a8) v = draw();
  for (auto& v : bt8) v = draw();
  std::normal_distribution<float> cdist(0.0f, 1000.0f);
  std::vector<float> c(warps * 16 * 8);
  for (auto& v : c) v = cdist(rng);
  DeviceVector<std::uint8_t> d_a(a8), d_bt(bt8);
  DeviceVector<float> d_c(c), d_d(c.size());
  gpu::launch(mma_e4m3_kernel, dim3(1), dim3(32 * warps), 0, test_stream().handle(), d_a.get(), d_bt.get(),
              d_c.get(), d_d.get());
  const auto d = d_d.to_host();
  for (int w = 0; w < warps; ++w)
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 8; ++n) {
        double want = c[(w * 16 + m) * 8 + n], scale = std::fabs(want);
        for (int k = 0; k < 32; ++k) {
          const double p = static_cast<double>(decode_e4m3_reference(a8[(w * 16 + m) * 32 + k])) *
                           decode_e4m3_reference(bt8[(w * 8 + n) * 32 + k]);
          want += p;
          scale += std::fabs(p);
        }
        // The tensor core sums in its own order and precision: allow 2^-10 of the magnitudes.
        ASSERT_NEAR(d[(w * 16 + m) * 8 + n], want, scale * 0x1p-10) << "warp " << w << " m " << m << " n " << n;
      }
}

TEST(DeviceLanguage, MmaBf16SmallIntegersExactAndRandom) {
  const int warps = 3;
  std::mt19937 rng(3);
  for (bool exact : {true, false}) {
    SCOPED_TRACE(exact ? "small integers" : "random normal values");
    std::uniform_int_distribution<int> small(-20, 20);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    auto draw = [&] { return exact ? static_cast<float>(small(rng)) : normal(rng); };
    std::vector<std::uint16_t> a(warps * 16 * 16), bt(warps * 8 * 16);
    for (auto& v : a) v = dsv4::f32_to_bf16_bits(draw());
    for (auto& v : bt) v = dsv4::f32_to_bf16_bits(draw());
    std::vector<float> c(warps * 16 * 8);
    for (auto& v : c) v = exact ? static_cast<float>(small(rng)) : normal(rng);
    DeviceVector<std::uint16_t> d_a(a), d_bt(bt);
    DeviceVector<float> d_c(c), d_d(c.size());
    gpu::launch(mma_bf16_kernel, dim3(1), dim3(32 * warps), 0, test_stream().handle(), d_a.get(), d_bt.get(),
                d_c.get(), d_d.get());
    const auto d = d_d.to_host();
    for (int w = 0; w < warps; ++w)
      for (int m = 0; m < 16; ++m)
        for (int n = 0; n < 8; ++n) {
          double want = c[(w * 16 + m) * 8 + n], scale = std::fabs(want);
          for (int k = 0; k < 16; ++k) {
            const double p = static_cast<double>(dsv4::bf16_bits_to_f32(a[(w * 16 + m) * 16 + k])) *
                             dsv4::bf16_bits_to_f32(bt[(w * 8 + n) * 16 + k]);
            want += p;
            scale += std::fabs(p);
          }
          const float got = d[(w * 16 + m) * 8 + n];
          if (exact) {
            ASSERT_EQ(got, static_cast<float>(want)) << "warp " << w << " m " << m << " n " << n;
          } else {
            ASSERT_NEAR(got, want, scale * 0x1p-16) << "warp " << w << " m " << m << " n " << n;
          }
        }
  }
}

TEST(DeviceLanguage, CpAsyncRoundTrips) {
  const int threads = 64;
  std::vector<uint4> src(3 * threads);
  for (int i = 0; i < 3 * threads; ++i) {
    const auto u = static_cast<unsigned>(i);
    src[i] = make_uint4(u, u * 3 + 1, ~u, 0xabcd0000u | u);
  }
  DeviceVector<uint4> d_src(src), d_dst(3 * threads);
  gpu::launch(cp_async_kernel, dim3(1), dim3(threads), 2 * threads * sizeof(uint4), test_stream().handle(),
              d_src.get(), d_dst.get());
  const auto dst = d_dst.to_host();
  auto same = [](const uint4& a, const uint4& b) { return a.x == b.x && a.y == b.y && a.z == b.z && a.w == b.w; };
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int t = 0; t < threads; ++t) {
    EXPECT_TRUE(same(dst[t], src[(t + 1) % threads])) << t;
    const int j = (t + 5) % threads;  // chunk n + j: copied by thread j, zero-filled when j is odd
    EXPECT_TRUE(same(dst[threads + t], j % 2 == 0 ? src[threads + j] : zero)) << t;
    EXPECT_TRUE(same(dst[2 * threads + t], src[2 * threads + (t + 3) % threads])) << t;
  }
}

TEST(DeviceLanguage, LdmatrixDeliversMmaFragments) {
  std::mt19937 rng(11);
  std::vector<std::uint16_t> tile(32 * 40);
  for (auto& v : tile) v = static_cast<std::uint16_t>(rng());
  for (int col0 : {0, 8, 32}) {
    DeviceVector<std::uint16_t> d_tile(tile);
    DeviceVector<std::uint32_t> d_out(32 * 8);
    gpu::launch(ldmatrix_kernel, dim3(1), dim3(32), 0, test_stream().handle(), d_tile.get(), col0, d_out.get());
    const auto out = d_out.to_host();
    // element (row, col) of matrix m: tile row 8 m + row, column col0 + col
    auto at = [&](int m, int row, int col) { return static_cast<std::uint32_t>(tile[(8 * m + row) * 40 + col0 + col]); };
    for (int l = 0; l < 32; ++l)
      for (int m = 0; m < 4; ++m) {
        const std::uint32_t want = at(m, l / 4, 2 * (l % 4)) | (at(m, l / 4, 2 * (l % 4) + 1) << 16);
        const std::uint32_t want_t = at(m, 2 * (l % 4), l / 4) | (at(m, 2 * (l % 4) + 1, l / 4) << 16);
        EXPECT_EQ(out[l * 8 + m], want) << "col0 " << col0 << " lane " << l << " matrix " << m;
        EXPECT_EQ(out[l * 8 + 4 + m], want_t) << "col0 " << col0 << " lane " << l << " matrix " << m << " (trans)";
      }
  }
}

TEST(DeviceLanguage, WgmmaMultipliesSharedOperands) {
  std::mt19937 rng(13);
  std::uniform_int_distribution<int> small(-4, 4);
  std::vector<int> a(64 * 32), b(64 * 32);
  std::vector<std::uint16_t> a16(a.size()), b16(b.size());
  for (std::size_t i = 0; i < a.size(); ++i) a16[i] = dsv4::f32_to_bf16_bits(static_cast<float>(a[i] = small(rng)));
  for (std::size_t i = 0; i < b.size(); ++i) b16[i] = dsv4::f32_to_bf16_bits(static_cast<float>(b[i] = small(rng)));
  DeviceVector<std::uint16_t> d_a(a16), d_b(b16);
  DeviceVector<float> d_d(64 * 64);
  gpu::launch(wgmma_kernel, dim3(1), dim3(128), 8192, test_stream().handle(), d_a.get(), d_b.get(), d_d.get());
  const auto d = d_d.to_host();
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < 64; ++n) {
      int want = 0;
      for (int k = 0; k < 32; ++k) want += a[m * 32 + k] * b[n * 32 + k];
      ASSERT_EQ(d[m * 64 + n], static_cast<float>(want)) << "row " << m << " column " << n;
    }
}

TEST(DeviceLanguage, WgmmaNarrowAndTransposedShapes) {
  std::mt19937 rng(17);
  std::uniform_int_distribution<int> small(-4, 4);
  std::vector<int> a(64 * 32), bk(32 * 32), bt(32 * 256);
  auto bits = [&](std::vector<int>& v) {
    std::vector<std::uint16_t> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = dsv4::f32_to_bf16_bits(static_cast<float>(v[i] = small(rng)));
    return out;
  };
  DeviceVector<std::uint16_t> d_a(bits(a)), d_bk(bits(bk)), d_bt(bits(bt));
  DeviceVector<float> d1(64 * 32), d2(64 * 256);
  gpu::launch(wgmma_wide_kernel, dim3(1), dim3(128), 6144 + 16384, test_stream().handle(), d_a.get(), d_bk.get(), d_bt.get(),
              d1.get(), d2.get());
  const auto h1 = d1.to_host();
  const auto h2 = d2.to_host();
  for (int m = 0; m < 64; ++m) {
    for (int n = 0; n < 32; ++n) {
      int want = 0;
      for (int k = 0; k < 32; ++k) want += a[m * 32 + k] * bk[n * 32 + k];
      ASSERT_EQ(h1[m * 32 + n], static_cast<float>(want)) << "n32: row " << m << " column " << n;
    }
    for (int n = 0; n < 256; ++n) {
      int want = 0;
      for (int k = 0; k < 32; ++k) want += a[m * 32 + k] * bt[k * 256 + n];
      ASSERT_EQ(h2[m * 256 + n], static_cast<float>(want)) << "n256 (B transposed): row " << m << " column " << n;
    }
  }
}

TEST(DeviceLanguage, WgmmaF16WithRegisterA) {
  std::mt19937 rng(23);
  std::uniform_int_distribution<int> small(-8, 8);
  std::vector<int> a(64 * 16), b(64 * 16);
  std::vector<std::uint16_t> a16(a.size()), b16(b.size());
  // small integers in f16: 1 sign, 5 exponent (bias 15), 10 mantissa bits
  const auto f16_bits = [](int v) -> std::uint16_t {
    if (v == 0) return 0;
    const unsigned m = static_cast<unsigned>(v < 0 ? -v : v);
    int e = 0;
    while ((m >> (e + 1)) != 0) ++e;
    return static_cast<std::uint16_t>((v < 0 ? 0x8000u : 0u) | static_cast<unsigned>(e + 15) << 10 | ((m << (10 - e)) & 0x3FFu));
  };
  for (std::size_t i = 0; i < a.size(); ++i) a16[i] = f16_bits(a[i] = small(rng));
  for (std::size_t i = 0; i < b.size(); ++i) b16[i] = f16_bits(b[i] = small(rng));
  DeviceVector<std::uint16_t> d_a(a16), d_b(b16);
  DeviceVector<float> d8(64 * 8), d64(64 * 64);
  gpu::launch(wgmma_f16_rs_kernel, dim3(1), dim3(128), 2048, test_stream().handle(), d_a.get(), d_b.get(), d8.get(), d64.get());
  const auto h8 = d8.to_host();
  const auto h64 = d64.to_host();
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < 64; ++n) {
      int want = 0;
      for (int k = 0; k < 16; ++k) want += a[m * 16 + k] * b[n * 16 + k];
      ASSERT_EQ(h64[m * 64 + n], static_cast<float>(want)) << "n64: row " << m << " column " << n;
      if (n < 8) {
        ASSERT_EQ(h8[m * 8 + n], static_cast<float>(want)) << "n8: row " << m << " column " << n;
      }
    }
}

// The register-A e4m3 product: small integers (exact under any summation, so this checks the
// fragment layout), then random codes against the model of the tensor core's sums.
TEST(DeviceLanguage, WgmmaE4m3WithRegisterA) {
  std::mt19937 rng(19);
  std::uniform_int_distribution<int> small(-8, 8);
  std::vector<int> a(64 * 32), b(64 * 32);
  std::vector<std::uint8_t> a8(a.size()), b8(b.size());
  for (std::size_t i = 0; i < a.size(); ++i) a8[i] = encode_small_int_e4m3(a[i] = small(rng));
  for (std::size_t i = 0; i < b.size(); ++i) b8[i] = encode_small_int_e4m3(b[i] = small(rng));
  DeviceVector<std::uint8_t> d_a(a8), d_b(b8);
  DeviceVector<float> d8(64 * 8), d64(64 * 64);
  gpu::launch(wgmma_e4m3_rs_kernel, dim3(1), dim3(128), 2048, test_stream().handle(), d_a.get(), d_b.get(), d8.get(),
              d64.get());
  const auto h8 = d8.to_host();
  const auto h64 = d64.to_host();
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < 64; ++n) {
      int want = 0;
      for (int k = 0; k < 32; ++k) want += a[m * 32 + k] * b[n * 32 + k];
      ASSERT_EQ(h64[m * 64 + n], static_cast<float>(want)) << "n64: row " << m << " column " << n;
      if (n < 8) {
        ASSERT_EQ(h8[m * 8 + n], static_cast<float>(2 * want)) << "n8: row " << m << " column " << n;
      }
    }
  std::uniform_int_distribution<int> code(0, 255);
  for (auto* v : {&a8, &b8})
    for (std::uint8_t& c : *v) do
        c = static_cast<std::uint8_t>(code(rng));
      while ((c & 0x7f) == 0x7f);
  d_a.fill(a8);
  d_b.fill(b8);
  gpu::launch(wgmma_e4m3_rs_kernel, dim3(1), dim3(128), 2048, test_stream().handle(), d_a.get(), d_b.get(), d8.get(),
              d64.get());
  const auto r8 = d8.to_host();
  const auto r64 = d64.to_host();
  int wrong = 0;
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < 64; ++n) {
      const std::span<const std::uint8_t> row(&a8[static_cast<std::size_t>(m) * 32], 32),
          col(&b8[static_cast<std::size_t>(n) * 32], 32);
      const float once = dsv4::fp8_dot(dsv4::kHopperFp8Dot, 0.0f, row, col);
      if (r64[m * 64 + n] != once) ++wrong;
      if (n < 8 && r8[m * 8 + n] != dsv4::fp8_dot(dsv4::kHopperFp8Dot, once, row, col)) ++wrong;
    }
  EXPECT_EQ(wrong, 0) << "outputs of random codes that the model (" << dsv4::describe(dsv4::kHopperFp8Dot)
                      << ") gets wrong";
}

// The tensor core's FP8 sums against numerics/fp8_dot_model.h. Six sets of operands, random and
// crafted so that each undocumented choice of the model shows in some outputs: wide exponent
// ranges (the window and the cut), a random accumulator (whether C joins the alignment), a pair
// of products that cancel above small ones (whether the alignment uses them), realistic
// activations times fp4 weights and chains of four products (k = 128, the reference's fp8 block).
// Every candidate of fp8_dot_candidates() is scored; the test asserts that kHopperFp8Dot
// reproduces every output bit and prints the candidates that do (the simulator runs
// kHopperFp8Dot itself, so there the test checks the plumbing). DSV4_FP8_DOT_DUMP=<file> also
// writes every set (name, tiles, k, whether C is given, then A, B, C and D) for fitting offline,
// and DSV4_FP8_DOT_REPLAY=<file> scores such a file instead of running the products.
struct Fp8ProbeSet {
  std::string name;
  int tiles = 8, k = 32;
  bool with_c = false;
  std::vector<std::uint8_t> a, b;
  std::vector<float> c, d;
};

std::uint8_t fp8_code_in(std::mt19937& rng, int exponent_lo, int exponent_hi) {
  std::uniform_int_distribution<int> e(exponent_lo, exponent_hi), m(0, 7), sign(0, 1);
  for (;;) {
    const int code = (sign(rng) << 7) | (e(rng) << 3) | m(rng);
    if ((code & 0x7f) != 0x7f) return static_cast<std::uint8_t>(code);
  }
}

float random_accumulator(std::mt19937& rng) {
  std::uniform_int_distribution<std::uint32_t> significand(1u << 23, (1u << 24) - 1);
  std::uniform_int_distribution<int> exponent(-12, 16), sign(0, 1);
  const float v = std::ldexp(static_cast<float>(significand(rng)), exponent(rng) - 23);
  return sign(rng) != 0 ? -v : v;
}

std::vector<Fp8ProbeSet> fp8_probe_sets() {
  std::mt19937 rng(2026);
  std::vector<Fp8ProbeSet> sets;
  const auto add = [&](std::string name, int k, bool with_c, auto a_code, auto b_code) {
    Fp8ProbeSet s;
    s.name = std::move(name);
    s.k = k;
    s.with_c = with_c;
    const std::size_t n = static_cast<std::size_t>(s.tiles) * 64 * static_cast<std::size_t>(k);
    s.a.resize(n);
    s.b.resize(n);
    for (std::size_t i = 0; i < n; ++i) s.a[i] = a_code(i);
    for (std::size_t i = 0; i < n; ++i) s.b[i] = b_code(i);
    if (with_c) {
      s.c.resize(static_cast<std::size_t>(s.tiles) * 4096);
      for (float& v : s.c) v = random_accumulator(rng);
    }
    sets.push_back(std::move(s));
  };
  const auto any = [&](std::size_t) { return fp8_code_in(rng, 0, 15); };
  add("uniform codes, C = 0", 32, false, any, any);
  add("uniform codes, random C", 32, true, any, any);
  add("uniform codes, k 128, random C", 128, true, any, any);
  const auto narrow = [&](std::size_t) { return fp8_code_in(rng, 5, 8); };
  add("four binades, C = 0", 32, false, narrow, narrow);
  // Values 0 and 1 of every row: X and -X against Y and Y (the products cancel); the rest small.
  std::vector<std::uint8_t> big(8 * 64);
  for (auto& v : big) v = fp8_code_in(rng, 11, 15);
  add(
      "cancelling pair over small products", 32, false,
      [&](std::size_t i) {
        const std::size_t kk = i % 32;
        return kk == 0   ? static_cast<std::uint8_t>(big[i / 32] & 0x7f)
               : kk == 1 ? static_cast<std::uint8_t>(big[i / 32] | 0x80)
                         : fp8_code_in(rng, 0, 6);
      },
      [&](std::size_t i) {
        const std::size_t kk = i % 32;
        return kk <= 1 ? static_cast<std::uint8_t>(big[(i / 32 + 7) % big.size()] & 0x7f) : fp8_code_in(rng, 0, 9);
      });
  // Activations as linear() quantizes them (a 128 block scaled so its largest is near 448) times
  // fp4 weights widened to e4m3 (what the reference's fp4 product feeds the tensor core).
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::uniform_int_distribution<int> e2m1(0, 15);
  std::vector<float> block(128);
  std::vector<std::uint8_t> act;
  for (int r = 0; r < 8 * 64; ++r) {
    float amax = 0.0f;
    for (float& v : block) amax = std::max(amax, std::fabs(v = gauss(rng) * (r % 7 == 0 ? 30.0f : 1.0f)));
    const float scale = std::exp2(std::ceil(std::log2(amax / 448.0f)));
    for (float v : block) act.push_back(dsv4::f32_to_e4m3(v / scale));
  }
  const float fp4_values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  add(
      "activations x fp4 weights, k 128", 128, false, [&](std::size_t i) { return act[i]; },
      [&](std::size_t) {
        const int v = e2m1(rng);
        return dsv4::f32_to_e4m3((v & 8) != 0 ? -fp4_values[v & 7] : fp4_values[v & 7]);
      });
  return sets;
}

// The sets a DSV4_FP8_DOT_DUMP file holds (written by the test below on a GPU).
std::vector<Fp8ProbeSet> read_fp8_probe_dump(const char* path) {
  std::vector<Fp8ProbeSet> sets;
  std::FILE* f = std::fopen(path, "rb");
  if (f == nullptr) throw std::runtime_error(std::string("cannot open ") + path);
  char name[64];
  while (std::fread(name, 1, sizeof(name), f) == sizeof(name)) {
    Fp8ProbeSet s;
    std::int32_t head[3];
    bool ok = std::fread(head, sizeof(head), 1, f) == 1 && head[0] > 0 && head[0] <= 4096 &&
              (head[1] == 32 || head[1] == 128);
    if (ok) {
      name[sizeof(name) - 1] = '\0';
      s.name = name;
      s.tiles = head[0], s.k = head[1], s.with_c = head[2] != 0;
      const std::size_t n = static_cast<std::size_t>(s.tiles) * 64 * static_cast<std::size_t>(s.k),
                        outs = static_cast<std::size_t>(s.tiles) * 4096;
      s.a.resize(n), s.b.resize(n), s.d.resize(outs);
      if (s.with_c) s.c.resize(outs);
      ok = std::fread(s.a.data(), 1, n, f) == n && std::fread(s.b.data(), 1, n, f) == n &&
           (!s.with_c || std::fread(s.c.data(), sizeof(float), outs, f) == outs) &&
           std::fread(s.d.data(), sizeof(float), outs, f) == outs;
    }
    if (!ok) {
      std::fclose(f);
      throw std::runtime_error(std::string("truncated or malformed probe dump ") + path);
    }
    sets.push_back(std::move(s));
  }
  std::fclose(f);
  return sets;
}

TEST(DeviceLanguage, WgmmaE4m3SumsMatchTheFp8DotModel) {
  // DSV4_FP8_DOT_REPLAY=<dump>: score the outputs a GPU wrote instead of running the products (to
  // fit the model offline, on any build).
  const char* replay = std::getenv("DSV4_FP8_DOT_REPLAY");
  auto sets = replay != nullptr ? read_fp8_probe_dump(replay) : fp8_probe_sets();
  for (Fp8ProbeSet& s : sets) {
    if (replay != nullptr) break;
    DeviceVector<std::uint8_t> d_a(s.a), d_b(s.b);
    DeviceVector<float> d_c(s.with_c ? s.c : std::vector<float>(1)), d_d(static_cast<std::size_t>(s.tiles) * 4096);
    gpu::launch(wgmma_e4m3_probe_kernel, dim3(static_cast<unsigned>(s.tiles)), dim3(128),
                static_cast<std::size_t>(128 * s.k), test_stream().handle(), d_a.get(), d_b.get(),
                s.with_c ? d_c.get() : nullptr, d_d.get(), s.k);
    s.d = d_d.to_host();
    for (float v : s.d) ASSERT_TRUE(std::isfinite(v)) << s.name;
  }
  if (const char* path = std::getenv("DSV4_FP8_DOT_DUMP"); path != nullptr && replay == nullptr) {
    std::FILE* f = std::fopen(path, "wb");
    ASSERT_NE(f, nullptr) << path;
    for (const Fp8ProbeSet& s : sets) {
      char name[64] = {};
      std::strncpy(name, s.name.c_str(), sizeof(name) - 1);
      const std::int32_t head[3] = {s.tiles, s.k, s.with_c ? 1 : 0};
      std::fwrite(name, 1, sizeof(name), f);
      std::fwrite(head, sizeof(head), 1, f);
      std::fwrite(s.a.data(), 1, s.a.size(), f);
      std::fwrite(s.b.data(), 1, s.b.size(), f);
      if (s.with_c) std::fwrite(s.c.data(), sizeof(float), s.c.size(), f);
      std::fwrite(s.d.data(), sizeof(float), s.d.size(), f);
    }
    std::fclose(f);
  }
  std::vector<std::vector<dsv4::Fp8DotCase>> cases(sets.size());
  for (std::size_t i = 0; i < sets.size(); ++i) {
    const Fp8ProbeSet& s = sets[i];
    for (int tile = 0; tile < s.tiles; ++tile)
      for (int m = 0; m < 64; ++m)
        for (int n = 0; n < 64; ++n) {
          const std::size_t out =
              (static_cast<std::size_t>(tile) * 64 + static_cast<std::size_t>(m)) * 64 + static_cast<std::size_t>(n);
          const std::size_t row_a =
              (static_cast<std::size_t>(tile) * 64 + static_cast<std::size_t>(m)) * static_cast<std::size_t>(s.k);
          const std::size_t row_b =
              (static_cast<std::size_t>(tile) * 64 + static_cast<std::size_t>(n)) * static_cast<std::size_t>(s.k);
          cases[i].push_back({s.with_c ? s.c[out] : 0.0f, &s.a[row_a], &s.b[row_b], s.k, s.d[out]});
        }
  }
  // Score every candidate: the sets in order, until 20 outputs are wrong (the sets after that are
  // not run: "-"), so that only the candidates that fit run every output.
  struct Score {
    dsv4::Fp8DotModel model;
    std::vector<std::int64_t> wrong;
    std::int64_t total = 0;
  };
  std::vector<Score> scores;
  for (const dsv4::Fp8DotModel& m : dsv4::fp8_dot_candidates()) {
    Score sc{m, std::vector<std::int64_t>(cases.size(), -1), 0};
    for (std::size_t i = 0; i < cases.size() && sc.total < 20; ++i) {
      sc.wrong[i] = dsv4::fp8_dot_mismatches(m, cases[i], 20 - sc.total);
      sc.total += sc.wrong[i];
    }
    scores.push_back(std::move(sc));
  }
  const auto sets_run = [](const Score& x) {
    return std::count_if(x.wrong.begin(), x.wrong.end(), [](std::int64_t w) { return w >= 0; });
  };
  std::stable_sort(scores.begin(), scores.end(), [&](const Score& x, const Score& y) {
    return x.total != y.total ? x.total < y.total : sets_run(x) > sets_run(y);
  });
  std::printf("FP8 wgmma sums: wrong outputs per set (scored until 20 are wrong)");
  for (const Fp8ProbeSet& s : sets) std::printf(" | %s", s.name.c_str());
  std::printf("\n");
  for (std::size_t i = 0; i < scores.size() && (i < 8 || scores[i].total == 0); ++i) {
    std::printf("  %s:", dsv4::describe(scores[i].model).c_str());
    for (std::int64_t w : scores[i].wrong) w >= 0 ? std::printf(" %lld", static_cast<long long>(w)) : std::printf(" -");
    std::printf("\n");
  }
  // kHopperFp8Dot: every output, with the first wrong ones shown.
  for (std::size_t i = 0; i < sets.size(); ++i) {
    int shown = 0;
    for (const dsv4::Fp8DotCase& c : cases[i]) {
      const float want = dsv4::fp8_dot(dsv4::kHopperFp8Dot, c.c, {c.a, static_cast<std::size_t>(c.k)},
                                       {c.b, static_cast<std::size_t>(c.k)});
      if (want == c.d) continue;
      std::string products;
      for (int kk = 0; kk < c.k; ++kk) {
        const double p = static_cast<double>(dsv4::e4m3_to_f32(c.a[kk])) * dsv4::e4m3_to_f32(c.b[kk]);
        if (p != 0.0) {
          products += ' ';
          products += std::to_string(p);
        }
      }
      ADD_FAILURE() << sets[i].name << ": the tensor core gave " << c.d << " (0x" << std::hex
                    << std::bit_cast<std::uint32_t>(c.d) << "), the model " << want << " (0x"
                    << std::bit_cast<std::uint32_t>(want) << std::dec << "); C = " << c.c << ", products:" << products;
      if (++shown == 3) break;
    }
  }
}

TEST(DeviceLanguage, BulkCopiesCompleteOnAnMbarrier) {
  const int threads = 128;
  std::vector<uint4> src(2 * threads);
  for (int i = 0; i < 2 * threads; ++i)
    src[i] =
        make_uint4(static_cast<unsigned>(i), static_cast<unsigned>(i * 7), 0xabcd0000u + static_cast<unsigned>(i), 5u);
  DeviceVector<uint4> d_src(src), d_dst(2 * threads);
  gpu::launch(bulk_copy_kernel, dim3(1), dim3(threads), threads * sizeof(uint4), test_stream().handle(), d_src.get(),
              d_dst.get());
  const auto dst = d_dst.to_host();
  for (int phase = 0; phase < 2; ++phase) {
    for (int t = 0; t < threads; ++t) {
      const uint4 want = src[phase * threads + (t + 7 * (phase + 1)) % threads];
      const uint4 got = dst[phase * threads + t];
      EXPECT_TRUE(got.x == want.x && got.y == want.y && got.z == want.z && got.w == want.w)
          << "phase " << phase << " thread " << t;
    }
  }
}

TEST(DeviceLanguage, WarpSpecializedRolesHandOverThroughMbarriersAndNamedBarriers) {
  std::vector<uint4> src(4 * 128);
  for (int i = 0; i < 4 * 128; ++i)
    src[i] = make_uint4(static_cast<unsigned>(i * 3 + 1), static_cast<unsigned>(i), 0x5a5a0000u + static_cast<unsigned>(i),
                        static_cast<unsigned>(i * i));
  std::vector<uint2> src2(128);
  for (int i = 0; i < 128; ++i) src2[i] = make_uint2(static_cast<unsigned>(1000 + i), static_cast<unsigned>(7 * i + 1));
  DeviceVector<uint4> d_src(src), d_dst(4 * 256);
  DeviceVector<uint2> d_src2(src2), d_dst2(128);
  d_dst.fill(std::vector<uint4>(4 * 256, make_uint4(0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu)));
  d_dst2.fill(std::vector<uint2>(128, make_uint2(0xdeadbeefu, 0xdeadbeefu)));
  gpu::launch(warp_specialized_kernel, dim3(1), dim3(384), 0, test_stream().handle(), d_src.get(), d_src2.get(),
              d_dst.get(), d_dst2.get());
  const auto dst = d_dst.to_host();
  const auto dst2 = d_dst2.to_host();
  auto loaded = [&](int r, int idx) {
    const int i = r * 128 + idx;
    return i % 3 != 0 ? src[i] : make_uint4(0u, 0u, 0u, 0u);
  };
  for (int r = 0; r < 4; ++r) {
    for (int t = 0; t < 256; ++t) {
      uint4 want = loaded(r, (t * 5 + r) % 128);
      want.w += loaded(r, (((t + 1) % 256) * 5 + r) % 128).x + static_cast<unsigned>(r);
      const uint4 got = dst[r * 256 + t];
      EXPECT_TRUE(got.x == want.x && got.y == want.y && got.z == want.z && got.w == want.w)
          << "round " << r << " thread " << t;
    }
  }
  for (int p = 0; p < 128; ++p) {
    const uint2 want = p % 2 == 0 ? src2[p] : make_uint2(0u, 0u);
    EXPECT_TRUE(dst2[p].x == want.x && dst2[p].y == want.y) << p;
  }
}

TEST(DeviceLanguage, ClusterBlocksReachEachOthersSharedMemory) {
  const unsigned threads = 96;
  for (unsigned cluster : {1u, 2u, 4u}) {
    const unsigned blocks = 8;
    DeviceVector<unsigned> d_out(blocks * threads), d_ranks(blocks);
    d_out.fill(std::vector<unsigned>(blocks * threads, 0xdeadbeefu));
    gpu::launch_cluster(cluster_exchange_kernel, dim3(blocks), dim3(threads), threads * sizeof(unsigned), cluster,
                        test_stream().handle(), d_out.get(), d_ranks.get());
    const auto out = d_out.to_host();
    const auto ranks = d_ranks.to_host();
    for (unsigned b = 0; b < blocks; ++b) {
      const unsigned r = b % cluster, prev_rank = (r + cluster - 1) % cluster, prev = b - r + prev_rank;
      EXPECT_EQ(ranks[b], r | (cluster << 8)) << "cluster " << cluster << " block " << b;
      for (unsigned t = 0; t < threads; ++t) {
        const unsigned from = (t + 3) % threads;
        ASSERT_EQ(out[b * threads + t], prev_rank * 100000u + prev * 1000u + from)
            << "cluster " << cluster << " block " << b << " thread " << t;
      }
    }
  }
}

TEST(DeviceLanguage, ClusterRemoteMbarrierArrivalsPublishStores) {
  const unsigned threads = 128, blocks = 6;
  DeviceVector<unsigned> d_out(2 * blocks * threads);
  d_out.fill(std::vector<unsigned>(2 * blocks * threads, 0xdeadbeefu));
  gpu::launch_cluster(cluster_mbarrier_kernel, dim3(blocks), dim3(threads), 8 + threads * sizeof(unsigned), 2,
                      test_stream().handle(), d_out.get());
  const auto out = d_out.to_host();
  for (unsigned phase = 0; phase < 2; ++phase)
    for (unsigned b = 0; b < blocks; ++b)
      for (unsigned t = 0; t < threads; ++t) {
        const unsigned peer_rank = (b % 2) ^ 1u, from = (t + 1) % threads;
        ASSERT_EQ(out[(phase * blocks + b) * threads + t], phase * 7u + peer_rank * 1000u + from * 3u)
            << "phase " << phase << " block " << b << " thread " << t;
      }
}

TEST(DeviceLanguage, Bf16ConversionsMatchTheReference) {
  std::vector<float> in;
  auto from_bits = [](std::uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
  };
  for (std::uint32_t u : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
                          0x7f800001u, 0x7fbfffffu, 0xff812345u, 0x3f808000u, 0x3f818000u, 0x3f807fffu,
                          0x3f808001u, 0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x7f7f7fffu, 0x00000001u,
                          0x00008000u, 0x00018000u, 0x007fffffu, 0x80008000u, 0x00800000u, 0x3f800000u}) {
    in.push_back(from_bits(u));
  }
  std::mt19937 rng(4);
  for (int i = 0; i < 1 << 16; ++i) in.push_back(from_bits(static_cast<std::uint32_t>(rng())));
  for (int i = 0; i < 4096; ++i) {  // exact ties: low 16 bits 0x8000
    in.push_back(from_bits((static_cast<std::uint32_t>(rng()) & 0xffff0000u) | 0x8000u));
  }
  const int n = static_cast<int>(in.size());
  DeviceVector<float> d_in(in), back(n), lows(n), highs(n);
  DeviceVector<unsigned short> bits(n), bits_rn(n);
  DeviceVector<float2> pair(n);
  gpu::launch(bf16_kernel, dim3((n + 255) / 256), dim3(256), 0, test_stream().handle(), d_in.get(), n, bits.get(),
              bits_rn.get(), back.get(), pair.get(), lows.get(), highs.get());
  const auto g_bits = bits.to_host();
  const auto g_bits_rn = bits_rn.to_host();
  const auto g_back = back.to_host();
  const auto g_pair = pair.to_host();
  const auto g_lows = lows.to_host();
  const auto g_highs = highs.to_host();
  auto same_value = [](float got, float want) {
    return std::isnan(want) ? std::isnan(got) : std::memcmp(&got, &want, sizeof(float)) == 0;
  };
  for (int i = 0; i < n; ++i) {
    const float x = in[i];
    SCOPED_TRACE(testing::Message() << "input bits " << std::hex << std::bit_cast<std::uint32_t>(x));
    if (std::isnan(x)) {
      // NaN stays NaN (CUDA returns its canonical NaN; numerics/bf16.h keeps the payload).
      ASSERT_GT(g_bits[i] & 0x7fffu, 0x7f80u);
      ASSERT_GT(g_bits_rn[i] & 0x7fffu, 0x7f80u);
    } else {
      ASSERT_EQ(g_bits[i], dsv4::f32_to_bf16_bits(x));
      ASSERT_EQ(g_bits_rn[i], dsv4::f32_to_bf16_bits(x));
    }
    ASSERT_TRUE(same_value(g_back[i], dsv4::round_to_bf16(x)));
    const float y = in[n - 1 - i];
    ASSERT_TRUE(same_value(g_pair[i].x, dsv4::round_to_bf16(x)));
    ASSERT_TRUE(same_value(g_pair[i].y, dsv4::round_to_bf16(y)));
    ASSERT_TRUE(same_value(g_lows[i], dsv4::round_to_bf16(x)));
    ASSERT_TRUE(same_value(g_highs[i], dsv4::round_to_bf16(y)));
  }
}

// The attention kernel's dequantization: e4m3 codes times a UE8M0 scale through a bf16x2
// multiply gives the bits of the fp32 route for every code pair and every exponent the range
// check admits, and the check admits exactly [15, 142].
TEST(DeviceLanguage, E4m3PowerOfTwoDequantizationIsExact) {
  std::vector<unsigned> exps;
  if (gpu::simulated()) {
    exps = {15, 16, 100, 127, 142};
  } else {
    for (unsigned e = 15; e <= 142; ++e) exps.push_back(e);
  }
  DeviceVector<unsigned> d_exps(exps), mismatches(std::vector<unsigned>{0u}), in_range(1024);
  gpu::launch(e4m3_pow2_kernel, dim3(256), dim3(256), 0, test_stream().handle(), d_exps.get(), static_cast<int>(exps.size()),
              mismatches.get(), in_range.get());
  EXPECT_EQ(mismatches.to_host()[0], 0u);
  const auto range = in_range.to_host();
  for (unsigned i = 0; i < 1024; ++i) {
    const unsigned b = i % 256;
    EXPECT_EQ(range[i], (b >= 15 && b <= 142) ? 1u : 0u) << "byte " << b << " at position " << i / 256;
  }
}

TEST(DeviceLanguage, MathAndIntegerIntrinsics) {
  std::vector<float> x = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, -2.75f, 3.14159f, 7.5f, -9.25f, 0.001f, 2.5f, -0.5f,
                          1.5f, 10.0f, -3.5f, 0.3f};
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> udist(-10.0f, 10.0f);
  for (int i = 0; i < 48; ++i) x.push_back(udist(rng));
  const int n = static_cast<int>(x.size());
  std::vector<unsigned> u(n);
  for (int i = 0; i < n; ++i) u[i] = i < 3 ? static_cast<unsigned>(i) * 0x80000000u : static_cast<unsigned>(rng());
  DeviceVector<float> d_x(x), out_f(n * kMathFloats);
  DeviceVector<unsigned> d_u(u);
  DeviceVector<long long> out_i(n * kMathInts);
  gpu::launch(math_kernel, dim3(1), dim3(n), 0, test_stream().handle(), d_x.get(), d_u.get(), n, out_f.get(),
              out_i.get());
  const auto f = out_f.to_host();
  const auto o = out_i.to_host();
  for (int i = 0; i < n; ++i) {
    const float v = x[i];
    const double a = std::fabs(static_cast<double>(v));
    SCOPED_TRACE(testing::Message() << "x = " << v);
    const float* r = &f[i * kMathFloats];
    auto near = [](float got, double want, double rel) {
      return std::fabs(got - want) <= rel * std::max(1.0, std::fabs(want));
    };
    EXPECT_TRUE(near(r[0], std::exp(static_cast<double>(v)), 1e-6));
    EXPECT_TRUE(near(r[1], std::log(a + 1.0), 1e-6));
    EXPECT_TRUE(near(r[2], std::log1p(a), 1e-6));
    EXPECT_EQ(r[3], std::sqrt(std::fabs(v)));  // correctly rounded in both
    EXPECT_EQ(r[4], std::fabs(v));
    EXPECT_EQ(r[5], std::fmax(v, 0.5f));
    EXPECT_EQ(r[6], std::fmin(v, 0.5f));
    EXPECT_EQ(r[7], std::floor(v));
    EXPECT_EQ(r[8], std::ceil(v));
    EXPECT_TRUE(near(r[9], std::exp2(static_cast<double>(v)), 1e-6));
    EXPECT_TRUE(near(r[10], std::log2(a + 1.0), 1e-6));
    EXPECT_TRUE(near(r[11], std::sin(static_cast<double>(v)), 1e-6));
    EXPECT_TRUE(near(r[12], std::cos(static_cast<double>(v)), 1e-6));
    EXPECT_TRUE(near(r[13], std::sin(static_cast<double>(v)), 1e-6));
    EXPECT_TRUE(near(r[14], std::cos(static_cast<double>(v)), 1e-6));
    EXPECT_TRUE(near(r[15], std::tanh(static_cast<double>(v)), 1e-6));
    EXPECT_TRUE(near(r[16], std::pow(a + 1.0, 1.5), 1e-6));
    EXPECT_EQ(r[17], std::ldexp(v, 3));
    int e = 0;
    EXPECT_EQ(r[18], std::frexp(v, &e));
    EXPECT_EQ(r[19], static_cast<float>(e));
    EXPECT_TRUE(near(r[20], 1.0 / std::sqrt(a + 1.0), 1e-6));
    EXPECT_TRUE(near(r[21], std::exp(static_cast<double>(v)), 1e-5));  // fast-math intrinsics
    EXPECT_TRUE(near(r[22], std::log(a + 1.0), 1e-5));
    EXPECT_TRUE(near(r[23], v / 3.0, 1e-6));
    EXPECT_EQ(r[24], 1.0f / (v + 20.0f));
    EXPECT_EQ(r[25], std::sqrt(std::fabs(v)));
    EXPECT_EQ(r[26], v + 1.0f / 3.0f);
    EXPECT_EQ(r[27], v * (1.0f / 3.0f));
    EXPECT_EQ(r[28], std::fma(v, 1.0f / 3.0f, 0.25f));
    EXPECT_EQ(r[29], std::min(std::max(v, 0.0f), 1.0f));
    EXPECT_EQ(r[30], std::min(v, 0.25f));
    EXPECT_EQ(r[31], std::max(v, 0.25f));
    EXPECT_EQ(std::bit_cast<std::uint32_t>(r[32]), std::bit_cast<std::uint32_t>(-v));
    EXPECT_EQ(r[33], std::fabs(v));

    const unsigned w = u[i], w2 = u[(i + 1) % n];
    const unsigned long long wide = (static_cast<unsigned long long>(w2) << 32) | w;
    const long long* q = &o[i * kMathInts];
    auto clz64 = [](unsigned long long z) {
      int c = 0;
      for (int b = 63; b >= 0 && ((z >> b) & 1) == 0; --b) ++c;
      return c;
    };
    auto popc64 = [](unsigned long long z) {
      int c = 0;
      for (; z != 0; z &= z - 1) ++c;
      return c;
    };
    auto ffs64 = [](unsigned long long z) {
      for (int b = 0; b < 64; ++b)
        if ((z >> b) & 1) return b + 1;
      return 0;
    };
    auto rev32 = [](unsigned z) {
      unsigned acc = 0;
      for (int b = 0; b < 32; ++b) acc = (acc << 1) | ((z >> b) & 1);
      return acc;
    };
    auto perm = [](unsigned lo, unsigned hi, unsigned s) {
      unsigned char bytes[8];
      for (int b = 0; b < 4; ++b) {
        bytes[b] = static_cast<unsigned char>(lo >> (8 * b));
        bytes[4 + b] = static_cast<unsigned char>(hi >> (8 * b));
      }
      unsigned acc = 0;
      for (int b = 0; b < 4; ++b) acc |= static_cast<unsigned>(bytes[(s >> (4 * b)) & 7]) << (8 * b);
      return acc;
    };
    EXPECT_EQ(q[0], clz64(w) - 32);
    EXPECT_EQ(q[1], clz64(wide >> (w2 % 64)));
    EXPECT_EQ(q[2], popc64(w));
    EXPECT_EQ(q[3], popc64(wide));
    EXPECT_EQ(q[4], ffs64(w));
    EXPECT_EQ(q[5], ffs64(wide));
    EXPECT_EQ(q[6], rev32(w));
    EXPECT_EQ(q[7], static_cast<long long>(((static_cast<unsigned long long>(rev32(w)) << 32) | rev32(w2)) >> 1));
    EXPECT_EQ(q[8], w);
    EXPECT_EQ(q[9], w2);
    EXPECT_EQ(q[10], perm(w, w2, w2 & 0x7777u));
    const unsigned sh = (w2 % 40) & 31;
    EXPECT_EQ(q[11], static_cast<unsigned>((wide << sh) >> 32));
    EXPECT_EQ(q[12], static_cast<unsigned>(wide >> sh));
    EXPECT_EQ(q[13], static_cast<unsigned>((static_cast<unsigned long long>(w) * w2) >> 32));
    EXPECT_EQ(q[14], std::bit_cast<unsigned>(v));
    EXPECT_EQ(q[15], std::bit_cast<int>(v));
    EXPECT_EQ(q[16], std::min(static_cast<int>(w), static_cast<int>(w2)));
    EXPECT_EQ(q[17], std::max(static_cast<int>(w), static_cast<int>(w2)));
    EXPECT_EQ(q[18], std::min(w, w2));
    EXPECT_EQ(q[19], std::max(w, w2));
    EXPECT_EQ(q[20], std::min(static_cast<long long>(wide), -5ll));
    EXPECT_EQ(q[21], static_cast<long long>(std::max(wide, 12345ull)));
    EXPECT_EQ(q[22], static_cast<long long>(std::nearbyint(v * 3.0f)));
    EXPECT_EQ(q[23], static_cast<long long>(std::trunc(v * 3.0f)));
    EXPECT_EQ(q[24], 0);
    EXPECT_EQ(q[25], 32);
    EXPECT_EQ(q[26], 32);
    EXPECT_EQ(q[27], 0);
    EXPECT_EQ(q[28], w2);
    EXPECT_EQ(q[29], w);  // a shift of 32 is taken & 31 = 0: the low word
  }
}

TEST(DeviceLanguage, InvalidLaunchThrows) {
  DeviceVector<int> in(1), out(1);
  EXPECT_THROW(gpu::launch(block_sum_kernel, dim3(1), dim3(2048), 0, test_stream().handle(), in.get(), out.get(), 1),
               std::runtime_error);
  // The stream still works afterwards.
  std::vector<int> one{5};
  in.fill(one);
  gpu::launch(block_sum_kernel, dim3(1), dim3(256), 0, test_stream().handle(), in.get(), out.get(), 1);
  EXPECT_EQ(out.to_host()[0], 5);
}

TEST(Runtime, BuffersStreamsEventsAndCopies) {
  const gpu::DeviceInfo info = gpu::device_info();
  EXPECT_FALSE(info.name.empty());
  EXPECT_GE(info.cc_major, 9);
  EXPECT_GT(info.sm_count, 0);
  EXPECT_GT(info.total_bytes, 0);
  EXPECT_GE(info.max_smem_optin, 227 * 1024);

  gpu::Stream stream;
  gpu::DeviceBuffer a(4096);
  EXPECT_EQ(a.size(), 4096u);
  gpu::DeviceBuffer b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(b.size(), 4096u);
  gpu::DeviceBuffer c(4096);
  gpu::PinnedBuffer host(4096);
  gpu::Event start, end;
  start.record(stream);
  gpu::fill_bytes(b.data(), 0x5a, 4096, stream);
  gpu::copy_on_device(c.data(), b.data(), 4096, stream);
  gpu::copy_to_host(host.data(), c.data(), 4096, stream);
  end.record(stream);
  gpu::Stream other;
  end.wait(other);
  other.synchronize();
  end.synchronize();
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(host.as<unsigned char>()[i], 0x5a);
  EXPECT_GE(gpu::Event::elapsed_ms(start, end), 0.0f);
  gpu::synchronize_device();
}

TEST(Runtime, GraphsCaptureAndReplay) {
  gpu::Stream stream;
  DeviceVector<int> in(std::vector<int>{1, 2, 3}), out(1);
  gpu::Graph graph;
  EXPECT_TRUE(graph.empty());
  if (gpu::simulated()) {
    EXPECT_THROW(graph.begin_capture(stream), std::runtime_error);
    return;
  }
  test_stream().synchronize();
  graph.begin_capture(stream);
  gpu::launch(block_sum_kernel, dim3(1), dim3(256), 0, stream.handle(), in.get(), out.get(), 3);
  graph.end_capture(stream);
  EXPECT_FALSE(graph.empty());
  graph.replay(stream);
  stream.synchronize();
  EXPECT_EQ(out.to_host()[0], 6);
}

}  // namespace
