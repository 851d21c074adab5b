// Compressor state and compressed-entry kernels (compressor.h).
#include "cuda/kernels/compressor.h"

#include "cuda/kernels/launch_check.h"
#include "cuda/device.h"
#include "cuda/kernels/cache_access.cuh"
#include "cuda/kernels/numerics.cuh"
#include "cuda/kernels/reduce.cuh"
#include "numerics/exp_float.h"

namespace dsv4::gpu {
namespace {

constexpr int kStateThreads = 256;
constexpr int kRopeDims = 64;

__device__ __forceinline__ const DeviceCompression& compression_of(const CompressorArgs& a) {
  return a.ratio == 4 ? a.step->c4 : a.step->c128;
}

__global__ void __launch_bounds__(kStateThreads) state_kernel(CompressorArgs a) {
  const DeviceStep& st = *a.step;
  const int t = blockIdx.x;
  if (t >= st.n_tokens) return;
  const int coff = a.ratio == 4 ? 2 : 1;
  const int pd = coff * a.head_dim, sf = 2 * pd;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= sf) return;
  float* row = a.state + static_cast<std::int64_t>(t) * sf;
  float v = row[c];
  if (c >= pd) {
    v = add_rn(v, a.ape[static_cast<std::int64_t>(st.positions[t] % a.ratio) * pd + (c - pd)]);
    row[c] = v;
  }
  const DeviceCacheGroup& g = st.groups[a.state_group];
  const std::int64_t slot = g.slot_mapping[t];
  if (slot >= 0) reinterpret_cast<float*>(entry_bytes(g, slot, a.state_layer_slot).data)[c] = v;
}

__global__ void entries_kernel(CompressorArgs a) {
  __shared__ float buf[512];
  __shared__ float blocks[512 / kSumBlock];
  __shared__ float scratch[32];
  const DeviceStep& st = *a.step;
  const DeviceCompression& cp = compression_of(a);
  const int w = blockIdx.x;
  if (w >= cp.writes) return;
  const int c = threadIdx.x, hd = a.head_dim;
  const int coff = a.ratio == 4 ? 2 : 1;
  const int pd = coff * hd, sf = 2 * pd;
  const int slots = a.ratio == 4 ? 8 : a.ratio;
  const DeviceCacheGroup& sg = st.groups[a.state_group];

  // Pooling (compressor_pool): per channel, softmax of the slots' scores, weights applied in
  // slot order. Sources: this step's state rows, or the state cache for earlier positions.
  auto source = [&](int k, int* value_off, int* score_off) -> const float* {
    const std::int32_t u = cp.source[static_cast<std::int64_t>(w) * slots + k];
    if (u == -2) return nullptr;
    const int half = (a.ratio == 4 && k >= 4) ? hd : 0;  // ratio 4: this block's second halves
    *value_off = half + c;
    *score_off = pd + half + c;
    if (u >= 0) return a.state + static_cast<std::int64_t>(u) * sf;
    const std::int64_t slot = cp.state_slot[a.state_index][static_cast<std::int64_t>(w) * slots + k];
    return reinterpret_cast<const float*>(entry_bytes(sg, slot, a.state_layer_slot).data);
  };
  float mx = -INFINITY;
  for (int k = 0; k < slots; ++k) {
    int vo = 0, so = 0;
    const float* p = source(k, &vo, &so);
    if (p != nullptr) mx = fmaxf(mx, p[so]);
  }
  float sum = 0.0f;
  for (int k = 0; k < slots; ++k) {
    int vo = 0, so = 0;
    const float* p = source(k, &vo, &so);
    if (p != nullptr) sum += exp_float(p[so] - mx);
  }
  float acc = 0.0f;
  for (int k = 0; k < slots; ++k) {
    int vo = 0, so = 0;
    const float* p = source(k, &vo, &so);
    if (p != nullptr) acc = add_rn(acc, mul_rn(p[vo], exp_float(p[so] - mx) / sum));
  }

  // compressor_finish: bf16, RMSNorm (bf16), RoPE at j * r on the last 64 dims (bf16).
  // (the sum of squares in the CPU's blocked order: bit-identical)
  const float x = round_bf16(acc);
  buf[c] = x;
  const float total = blocked_sum([&](std::int64_t k) { return mul_rn(buf[k], buf[k]); }, hd, blocks);
  const float inv = 1.0f / sqrtf(total / static_cast<float>(hd) + a.eps);
  buf[c] = round_bf16(a.norm[c] * (x * inv));  // every buf read of blocked_sum precedes its last barrier
  __syncthreads();
  float v = buf[c];
  if (c >= hd - kRopeDims) {
    const int p0 = c & ~1;
    const int i = (p0 - (hd - kRopeDims)) / 2;
    const float* cs = cp.rope + static_cast<std::int64_t>(w) * 2 * kRopeHalf;
    const float x0 = buf[p0], x1 = buf[p0 + 1], cs_c = cs[i], cs_s = cs[kRopeHalf + i];
    v = (c & 1) == 0 ? sub_rn(mul_rn(x0, cs_c), mul_rn(x1, cs_s)) : add_rn(mul_rn(x0, cs_s), mul_rn(x1, cs_c));
    v = round_bf16(v);
  }
  const DeviceCacheGroup& eg = st.groups[a.entry_group];
  const std::int64_t slot = eg.slot_mapping[cp.token[w]];
  const EntryBytes e = entry_bytes(eg, slot < 0 ? 0 : slot, a.entry_layer_slot);

  if (a.target == CompressorTarget::kMainKv) {
    // Quantize once: e4m3 no-rope dims in blocks of 64 (2 warps each), bf16 rope dims.
    const int nope = hd - kRopeDims;
    __syncthreads();
    const float wmax = warp_max(fabsf(v));
    if ((c & 31) == 0) scratch[c >> 5] = wmax;
    __syncthreads();
    if (slot < 0) return;
    if (c < nope) {
      const int blk = c / 64;
      const float amax = fmaxf(scratch[2 * blk], scratch[2 * blk + 1]);
      const float scale = fp8_scale(amax);
      const std::uint8_t code = fp8_encode_scaled(v, 1.0f / scale);
      if (a.kv_fp8) {
        e.data[c] = code;
        if (c % 64 == 0) e.scales[blk] = ue8m0_byte(scale);
        if (c == 0) e.scales[nope / 64] = 0;
      } else {
        store_bf16(reinterpret_cast<std::uint16_t*>(e.data) + c, e4m3_value(code) * scale);
      }
    } else {
      std::uint16_t* dst = a.kv_fp8 ? reinterpret_cast<std::uint16_t*>(e.data + nope) + (c - nope)
                                    : reinterpret_cast<std::uint16_t*>(e.data) + c;
      store_bf16(dst, v);
    }
    return;
  }

  // Indexer key: Hadamard over the 128 dims (the CPU's butterfly order: strides 1, 2, 4, ...),
  // times 128^-0.5, bf16; then the cache format.
  __syncthreads();
  buf[c] = v;
  __syncthreads();
  for (int h = 1; h < hd; h *= 2) {
    if (c < hd / 2) {
      const int i = (c / h) * 2 * h + (c % h);
      const float p = buf[i], q = buf[i + h];
      buf[i] = add_rn(p, q);
      buf[i + h] = sub_rn(p, q);
    }
    __syncthreads();
  }
  const float key = round_bf16(mul_rn(buf[c], static_cast<float>(1.0 / sqrt(static_cast<double>(hd)))));
  // FP4 blocks of 32 = one warp.
  const float scale4 = fp4_scale(warp_max(fabsf(key)));
  const std::uint8_t code4 = fp4_encode_scaled(key, 1.0f / scale4);
  const float simulated = e2m1_value(code4) * scale4;
  if (a.index_format == IndexerFormat::kFp4) {
    const std::uint32_t odd = __shfl_down_sync(0xffffffffu, static_cast<std::uint32_t>(code4), 1);
    if (slot < 0) return;
    if ((c & 1) == 0) e.data[c / 2] = static_cast<std::uint8_t>(code4 | (odd << 4));
    if ((c & 31) == 0) e.scales[c / 32] = ue8m0_byte(scale4);
  } else if (a.index_format == IndexerFormat::kBf16) {
    if (slot < 0) return;
    store_bf16(reinterpret_cast<std::uint16_t*>(e.data) + c, simulated);
  } else {
    // fp8: one power-of-two fp32 scale per 128 dims over the FP4-simulated key.
    const float amax = block_max(fabsf(simulated), scratch);
    const float scale8 = fp8_scale(amax);
    if (slot < 0) return;
    e.data[c] = e4m3_code(simulated / scale8);
    if (c == 0) *reinterpret_cast<float*>(e.scales) = scale8;
  }
}

}  // namespace

void finish_compressor_state(const CompressorArgs& args, gpu_stream_t stream) {
  if (args.capacity <= 0) return;
  const int sf = 2 * (args.ratio == 4 ? 2 : 1) * args.head_dim;
  launch(state_kernel, dim3(static_cast<unsigned>(args.capacity), static_cast<unsigned>((sf + kStateThreads - 1) / kStateThreads)),
         dim3(kStateThreads), 0, stream, args);
}

void write_compressed_entries(const CompressorArgs& args, std::int32_t max_writes, gpu_stream_t stream) {
  if (max_writes <= 0) return;
  if (args.head_dim != 512 && args.head_dim != 128) launch_error("GPU compressor: head dim {} (512 or 128 supported)", {args.head_dim});
  if (args.target == CompressorTarget::kIndexerKey && args.head_dim != 128)
    launch_error("GPU indexer compressor: index_head_dim must be 128, found {}", {args.head_dim});
  launch(entries_kernel, dim3(static_cast<unsigned>(max_writes)), dim3(static_cast<unsigned>(args.head_dim)), 0, stream, args);
}

}  // namespace dsv4::gpu
