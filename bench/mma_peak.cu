// mma.sync throughput (mma_peak.h): every warp runs kChains independent accumulator chains.
#include "mma_peak.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda/device.h"
#include "cuda/runtime.h"

namespace dsv4::bench {
namespace {

constexpr int kChains = 8;
constexpr int kIters = 4096;

template <bool kFp8>
__global__ void __launch_bounds__(256) mma_loop_kernel(float* sink, std::uint32_t seed) {
  std::uint32_t a[4], b[2];
  for (int i = 0; i < 4; ++i) a[i] = seed * (threadIdx.x + 3 * i + 1);
  for (int i = 0; i < 2; ++i) b[i] = seed ^ (threadIdx.x * 7 + i);
  float acc[kChains][4] = {};
  for (int it = 0; it < kIters; ++it) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      if constexpr (kFp8) gpu::mma_m16n8k32_e4m3(acc[c], a, b, acc[c]);
      else gpu::mma_m16n8k16_bf16(acc[c], a, b, acc[c]);
    }
  }
  float s = 0.0f;
  for (int c = 0; c < kChains; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  if (s == 12345.0f) sink[blockIdx.x] = s;  // keeps the loop alive
}

}  // namespace

double measure_mma_peak_tflops(bool fp8) {
  const int sms = gpu::device_info().sm_count;
  const int blocks = sms * 4;
  gpu::DeviceBuffer sink(static_cast<std::size_t>(blocks) * sizeof(float));
  gpu::Stream stream;
  gpu::Event start, stop;
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    start.record(stream);
    if (fp8) gpu::launch(mma_loop_kernel<true>, dim3(blocks), dim3(256), 0, stream.handle(), sink.as<float>(), 0x9e3779b9u);
    else gpu::launch(mma_loop_kernel<false>, dim3(blocks), dim3(256), 0, stream.handle(), sink.as<float>(), 0x9e3779b9u);
    stop.record(stream);
    stop.synchronize();
    const double ms = gpu::Event::elapsed_ms(start, stop);
    const double flops = 2.0 * (fp8 ? 16 * 8 * 32 : 16 * 8 * 16) * kChains * kIters * (blocks * 8.0);
    if (rep > 0) best = std::max(best, flops / (ms * 1e-3) / 1e12);
  }
  return best;
}

}  // namespace dsv4::bench
