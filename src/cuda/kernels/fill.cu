// Pseudo-random device fills (fill.h).
#include "cuda/kernels/fill.h"

#include "cuda/device.h"
#include "cuda/kernels/numerics.cuh"

namespace dsv4::gpu {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ std::uint64_t mix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// Uniform in [0, 1).
__device__ __forceinline__ float unit(std::uint64_t seed, std::int64_t i) {
  return static_cast<float>(mix64(seed ^ mix64(static_cast<std::uint64_t>(i))) >> 40) * 0x1p-24f;
}

__device__ __forceinline__ std::int64_t index() { return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }

__global__ void uniform_f32_kernel(float* dst, std::int64_t n, std::uint64_t seed, float lo, float hi) {
  const std::int64_t i = index();
  if (i < n) dst[i] = lo + (hi - lo) * unit(seed, i);
}
__global__ void uniform_bf16_kernel(std::uint16_t* dst, std::int64_t n, std::uint64_t seed, float lo, float hi) {
  const std::int64_t i = index();
  if (i < n) dst[i] = bf16_bits(lo + (hi - lo) * unit(seed, i));
}
__global__ void fp8_kernel(std::uint8_t* dst, std::int64_t n, std::uint64_t seed) {
  const std::int64_t i = index();
  if (i < n) dst[i] = e4m3_code((2.0f * unit(seed, i) - 1.0f) * 440.0f);
}
__global__ void fp4_kernel(std::uint8_t* dst, std::int64_t n, std::uint64_t seed) {
  const std::int64_t i = index();
  if (i < n) dst[i] = static_cast<std::uint8_t>(mix64(seed ^ mix64(static_cast<std::uint64_t>(i))) & 0xffu);
}
__global__ void byte_range_kernel(std::uint8_t* dst, std::int64_t n, std::uint64_t seed, std::uint32_t lo, std::uint32_t span) {
  const std::int64_t i = index();
  if (i < n) dst[i] = static_cast<std::uint8_t>(lo + mix64(seed ^ mix64(static_cast<std::uint64_t>(i))) % span);
}
__global__ void const_f32_kernel(float* dst, std::int64_t n, float v) {
  const std::int64_t i = index();
  if (i < n) dst[i] = v;
}
__global__ void const_u8_kernel(std::uint8_t* dst, std::int64_t n, std::uint8_t v) {
  const std::int64_t i = index();
  if (i < n) dst[i] = v;
}
__global__ void expert_ids_kernel(std::int32_t* dst, std::int64_t rows, std::int32_t k, std::int32_t experts,
                                  std::uint64_t seed) {
  const std::int64_t r = index();
  if (r >= rows) return;
  // A random start and a stride coprime with `experts` give k distinct ids.
  const std::uint64_t h = mix64(seed ^ mix64(static_cast<std::uint64_t>(r)));
  const std::int32_t start = static_cast<std::int32_t>(h % static_cast<std::uint64_t>(experts));
  std::int32_t stride = 1 + static_cast<std::int32_t>((h >> 32) % static_cast<std::uint64_t>(experts));
  auto gcd = [](std::int32_t a, std::int32_t b) {
    while (b != 0) {
      const std::int32_t t = a % b;
      a = b;
      b = t;
    }
    return a;
  };
  while (gcd(stride, experts) != 1) ++stride;
  for (std::int32_t c = 0; c < k; ++c) dst[r * k + c] = static_cast<std::int32_t>((start + static_cast<std::int64_t>(c) * stride) % experts);
}

unsigned blocks(std::int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

void fill_uniform_f32(float* dst, std::int64_t n, std::uint64_t seed, float lo, float hi, gpu_stream_t stream) {
  if (n > 0) launch(uniform_f32_kernel, dim3(blocks(n)), dim3(kThreads), 0, stream, dst, n, seed, lo, hi);
}
void fill_uniform_bf16(std::uint16_t* dst, std::int64_t n, std::uint64_t seed, float lo, float hi, gpu_stream_t stream) {
  if (n > 0) launch(uniform_bf16_kernel, dim3(blocks(n)), dim3(kThreads), 0, stream, dst, n, seed, lo, hi);
}
void fill_fp8_codes(std::uint8_t* dst, std::int64_t n, std::uint64_t seed, gpu_stream_t stream) {
  if (n > 0) launch(fp8_kernel, dim3(blocks(n)), dim3(kThreads), 0, stream, dst, n, seed);
}
void fill_fp4_bytes(std::uint8_t* dst, std::int64_t n, std::uint64_t seed, gpu_stream_t stream) {
  if (n > 0) launch(fp4_kernel, dim3(blocks(n)), dim3(kThreads), 0, stream, dst, n, seed);
}
void fill_bytes_in_range(std::uint8_t* dst, std::int64_t n, std::uint64_t seed, std::uint8_t lo, std::uint8_t hi,
                         gpu_stream_t stream) {
  if (n > 0) launch(byte_range_kernel, dim3(blocks(n)), dim3(kThreads), 0, stream, dst, n, seed, static_cast<std::uint32_t>(lo),
                    static_cast<std::uint32_t>(hi - lo + 1));
}
void fill_const_f32(float* dst, std::int64_t n, float value, gpu_stream_t stream) {
  if (n > 0) launch(const_f32_kernel, dim3(blocks(n)), dim3(kThreads), 0, stream, dst, n, value);
}
void fill_const_u8(std::uint8_t* dst, std::int64_t n, std::uint8_t value, gpu_stream_t stream) {
  if (n > 0) launch(const_u8_kernel, dim3(blocks(n)), dim3(kThreads), 0, stream, dst, n, value);
}
void fill_expert_ids(std::int32_t* dst, std::int64_t rows, std::int32_t k, std::int32_t experts, std::uint64_t seed,
                     gpu_stream_t stream) {
  if (rows > 0) launch(expert_ids_kernel, dim3(blocks(rows)), dim3(kThreads), 0, stream, dst, rows, k, experts, seed);
}

}  // namespace dsv4::gpu
