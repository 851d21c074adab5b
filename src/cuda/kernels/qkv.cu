// Query head norm + RoPE, kv norm + RoPE + window-cache insert (qkv.h).
#include "cuda/kernels/qkv.h"

#include "cuda/device.h"
#include "cuda/kernels/cache_access.cuh"
#include "cuda/kernels/numerics.cuh"
#include "cuda/kernels/reduce.cuh"

namespace dsv4::gpu {
namespace {

constexpr int kDim = 512, kRope = 64, kNope = kDim - kRope, kThreads = 128, kPer = kDim / kThreads;  // 4 dims a thread

// Rotates the thread's 4 dims (two pairs) when they are rope dims, with cos/sin `cs` (cos[32], sin[32]).
__device__ __forceinline__ void rope4(float* v, int d0, const float* cs) {
  if (d0 < kNope) return;
  for (int p = 0; p < 2; ++p) {
    const int i = (d0 - kNope) / 2 + p;
    const float c = cs[i], s = cs[kRopeHalf + i];
    const float a = v[2 * p], b = v[2 * p + 1];
    v[2 * p] = sub_rn(mul_rn(a, c), mul_rn(b, s));
    v[2 * p + 1] = add_rn(mul_rn(a, s), mul_rn(b, c));
  }
}

__global__ void __launch_bounds__(kThreads) qkv_kernel(QkvArgs a) {
  __shared__ float vals[kDim];
  __shared__ float blocks[kDim / kSumBlock];
  const DeviceStep& st = *a.step;
  const int t = blockIdx.x;
  if (t >= st.n_tokens) return;
  const float* cs = (a.compressed_rope ? st.rope_compressed : st.rope_window) + static_cast<std::int64_t>(t) * 2 * kRopeHalf;
  const int d0 = threadIdx.x * kPer;
  float v[kPer];
  if (static_cast<int>(blockIdx.y) < a.heads) {
    // Query head: weightless RMS norm in bf16 arithmetic, then RoPE, bf16.
    std::uint16_t* qh = a.q + (static_cast<std::int64_t>(t) * a.heads + blockIdx.y) * kDim;
    for (int j = 0; j < kPer; ++j) {
      v[j] = bf16_value(qh[d0 + j]);
      vals[d0 + j] = v[j];
    }
    // bf16 squares in the CPU's blocked order (bit-identical)
    const float sum = blocked_sum([&](std::int64_t k) { return round_bf16(mul_rn(vals[k], vals[k])); }, kDim, blocks);
    const float mean = round_bf16(sum / static_cast<float>(kDim));
    const float r = round_bf16(1.0f / sqrtf(round_bf16(mean + a.eps)));
    for (int j = 0; j < kPer; ++j) v[j] = round_bf16(v[j] * r);
    rope4(v, d0, cs);
    for (int j = 0; j < kPer; ++j) store_bf16(qh + d0 + j, v[j]);
    return;
  }
  // The shared kv: RMSNorm with kv_norm, RoPE, bf16, then the window-cache entry.
  std::uint16_t* kvr = a.kv + static_cast<std::int64_t>(t) * kDim;
  for (int j = 0; j < kPer; ++j) {
    v[j] = bf16_value(kvr[d0 + j]);
    vals[d0 + j] = v[j];
  }
  // the sum of squares in the CPU's blocked order (bit-identical)
  const float total = blocked_sum([&](std::int64_t k) { return mul_rn(vals[k], vals[k]); }, kDim, blocks);
  const float inv = 1.0f / sqrtf(total / static_cast<float>(kDim) + a.eps);
  for (int j = 0; j < kPer; ++j) v[j] = round_bf16(a.kv_norm[d0 + j] * (v[j] * inv));
  rope4(v, d0, cs);
  for (int j = 0; j < kPer; ++j) {
    v[j] = round_bf16(v[j]);
    store_bf16(kvr + d0 + j, v[j]);
  }
  // FP8 blocks of 64 no-rope dims: 16 threads each (lanes 0-15 / 16-31 of a warp).
  float amax = 0.0f;
  for (int j = 0; j < kPer; ++j) amax = fmaxf(amax, fabsf(v[j]));
  for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const DeviceCacheGroup& g = st.groups[a.window_group];
  const std::int64_t slot = g.slot_mapping[t];
  if (slot < 0) return;
  const EntryBytes e = entry_bytes(g, slot, a.layer_slot);
  if (d0 < kNope) {
    const float scale = fp8_scale(amax), inv_scale = 1.0f / scale;
    for (int j = 0; j < kPer; ++j) {
      const std::uint8_t code = fp8_encode_scaled(v[j], inv_scale);
      if (a.kv_fp8) {
        e.data[d0 + j] = code;
      } else {
        store_bf16(reinterpret_cast<std::uint16_t*>(e.data) + d0 + j, e4m3_value(code) * scale);
      }
    }
    if (a.kv_fp8 && (d0 % 64) == 0) e.scales[d0 / 64] = ue8m0_byte(scale);
    if (a.kv_fp8 && threadIdx.x == 0) e.scales[kNope / 64] = 0;  // pad byte
  } else {
    // fp8 entries keep the rope dims as bf16 after the 448 codes; bf16 entries are all bf16.
    for (int j = 0; j < kPer; ++j) {
      std::uint16_t* dst = a.kv_fp8 ? reinterpret_cast<std::uint16_t*>(e.data + kNope) + (d0 + j - kNope)
                                    : reinterpret_cast<std::uint16_t*>(e.data) + d0 + j;
      store_bf16(dst, v[j]);
    }
  }
}

}  // namespace

void finish_q_and_window_kv(const QkvArgs& args, gpu_stream_t stream) {
  if (args.capacity <= 0) return;
  launch(qkv_kernel, dim3(static_cast<unsigned>(args.capacity), static_cast<unsigned>(args.heads + 1)), dim3(kThreads), 0,
         stream, args);
}

}  // namespace dsv4::gpu
