// Residual-stream kernels (hyper.h). CPU twins: cpu/hyper_connections.cc, cpu/rms_norm.cc.
#include "cuda/kernels/hyper.h"

#include <algorithm>

#include "cuda/kernels/launch_check.h"
#include "cuda/device.h"
#include "cuda/kernels/numerics.cuh"
#include "cuda/kernels/reduce.cuh"
#include "numerics/exp_float.h"

namespace dsv4::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxHc = 4;
constexpr int kMaxSumBlocks = 256;  // blocked sums over at most 256 * 128 values

__device__ __forceinline__ bool row_live(std::int64_t row, std::int64_t rows, const std::int32_t* rows_dev) {
  return row < rows && (rows_dev == nullptr || row < *rows_dev);
}

__global__ void embed_kernel(const DeviceStep* step, const std::uint16_t* embed, std::uint16_t* h, int hc,
                             std::int64_t dim) {
  const std::int64_t row = blockIdx.y;
  if (row >= step->n_tokens) return;
  const std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= dim) return;
  const std::uint16_t v = embed[static_cast<std::int64_t>(step->token_ids[row]) * dim + k];
  for (int i = 0; i < hc; ++i) h[(row * hc + i) * dim + k] = v;
}

// Which stream row a mixing computation reads: row i of h (limited by rows / *rows_dev), or the
// head's rows (the step's logits tokens, or every step token).
struct RowSource {
  std::int64_t rows = 0;
  const std::int32_t* rows_dev = nullptr;
  const DeviceStep* step = nullptr;  // head: set
  bool all_tokens = false;
};

__device__ __forceinline__ bool source_row(const RowSource& src, std::int64_t i, std::int64_t* row) {
  if (src.step == nullptr) {
    *row = i;
    return row_live(i, src.rows, src.rows_dev);
  }
  if (i >= (src.all_tokens ? src.step->n_tokens : src.step->n_logits)) return false;
  *row = src.all_tokens ? i : static_cast<std::int64_t>(src.step->logits_tokens[i]);
  return true;
}

// The raw mixes of hc_mixes in the CPU's blocked order (reduce.cuh blocked_sum): block (group of
// kMixRows rows, m) computes, for m < kMix, row i's dot product of its flattened streams with fn
// row m, and for m == kMix the sum of squares -- thread b the left-to-right sum of the 128-term
// block b for each of the group's rows (fn read once for them), then thread r adds row r's block
// sums left to right. raw[i * (kMix + 1) + m]. Rows of a group are live in order.
constexpr int kMixRows = 8;
template <int kMix>
__global__ void __launch_bounds__(kThreads) mix_sums_kernel(const std::uint16_t* h, const float* fn, std::int64_t n,
                                                            RowSource src, float* raw) {
  __shared__ float part[kMixRows][kThreads];
  const int m = blockIdx.y;
  const std::int64_t i0 = static_cast<std::int64_t>(blockIdx.x) * kMixRows;
  const std::uint16_t* rows[kMixRows];
  int live = 0;
  for (int r = 0; r < kMixRows; ++r) {
    std::int64_t row = 0;
    if (!source_row(src, i0 + r, &row)) break;
    rows[r] = h + row * n;
    live = r + 1;
  }
  if (live == 0) return;
  const int nb = static_cast<int>((n + kSumBlock - 1) / kSumBlock);
  const int b = threadIdx.x;
  if (b < nb) {
    const std::int64_t k0 = static_cast<std::int64_t>(b) * kSumBlock, k1 = k0 + kSumBlock < n ? k0 + kSumBlock : n;
    float acc[kMixRows];
    DSV4_UNROLL
    for (int r = 0; r < kMixRows; ++r) acc[r] = 0.0f;
    const float* f = fn + static_cast<std::int64_t>(m) * n;
    DSV4_UNROLL_8
    for (std::int64_t k = k0; k < k1; k += 4) {
      float4 w = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (m < kMix) w = *reinterpret_cast<const float4*>(f + k);
      DSV4_UNROLL
      for (int r = 0; r < kMixRows; ++r) {
        if (r >= live) break;
        const uint2 raw4 = *reinterpret_cast<const uint2*>(rows[r] + k);
        const float v0 = bf16_value(static_cast<std::uint16_t>(raw4.x & 0xffffu)), v1 = bf16_value(static_cast<std::uint16_t>(raw4.x >> 16));
        const float v2 = bf16_value(static_cast<std::uint16_t>(raw4.y & 0xffffu)), v3 = bf16_value(static_cast<std::uint16_t>(raw4.y >> 16));
        if (m < kMix) {
          acc[r] = add_rn(add_rn(add_rn(add_rn(acc[r], mul_rn(v0, w.x)), mul_rn(v1, w.y)), mul_rn(v2, w.z)), mul_rn(v3, w.w));
        } else {
          acc[r] = add_rn(add_rn(add_rn(add_rn(acc[r], mul_rn(v0, v0)), mul_rn(v1, v1)), mul_rn(v2, v2)), mul_rn(v3, v3));
        }
      }
    }
    DSV4_UNROLL
    for (int r = 0; r < kMixRows; ++r) part[r][b] = acc[r];
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < live) {
    float total = 0.0f;
    for (int q = 0; q < nb; ++q) total = add_rn(total, part[threadIdx.x][q]);
    raw[(i0 + threadIdx.x) * (kMix + 1) + m] = total;
  }
}

// The same raw mixes in two passes, the form for many rows (mix_sums_kernel reads each row
// kMix + 1 times). Pass 1: thread (lane = row of a 32-row group, warp = one 128-term block) sums
// its row's block left to right for every one of the kMix + 1 sums at once, so h is read once; a
// warp's lanes read the same fn words (one broadcast load). The block sums go to
// bsum[(m * nb + b) * cap + i]. Pass 2: thread (row, sum) adds its nb block sums left to right --
// the CPU's blocked order, so both forms give the same bits.
constexpr int kBlockWarps = 8;
template <int kMix>
__global__ void __launch_bounds__(32 * kBlockWarps)
    mix_block_sums_kernel(const std::uint16_t* h, const float* fn, std::int64_t n, RowSource src, std::int64_t cap,
                          float* bsum) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * 32 + (threadIdx.x & 31);
  const int nb = static_cast<int>((n + kSumBlock - 1) / kSumBlock);
  const int b = static_cast<int>(blockIdx.y) * kBlockWarps + static_cast<int>(threadIdx.x >> 5);
  std::int64_t row = 0;
  if (b >= nb || !source_row(src, i, &row)) return;
  const std::uint16_t* hr = h + row * n;
  float acc[kMix + 1];
  DSV4_UNROLL
  for (int m = 0; m <= kMix; ++m) acc[m] = 0.0f;
  const std::int64_t k0 = static_cast<std::int64_t>(b) * kSumBlock, k1 = k0 + kSumBlock < n ? k0 + kSumBlock : n;
  for (std::int64_t k = k0; k < k1; k += 8) {  // n % 8 == 0 (check_shape): no step crosses a block
    const uint4 raw8 = __ldg(reinterpret_cast<const uint4*>(hr + k));
    float v[8];
    DSV4_UNROLL
    for (int j = 0; j < 8; ++j) {
      const std::uint32_t word = word_of(raw8, j / 2);
      v[j] = bf16_value(static_cast<std::uint16_t>((j & 1) ? word >> 16 : word & 0xffffu));
    }
    DSV4_UNROLL
    for (int m = 0; m < kMix; ++m) {
      const float4 wa = __ldg(reinterpret_cast<const float4*>(fn + m * n + k));
      const float4 wb = __ldg(reinterpret_cast<const float4*>(fn + m * n + k + 4));
      const float w8[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
      DSV4_UNROLL
      for (int j = 0; j < 8; ++j) acc[m] = add_rn(acc[m], mul_rn(v[j], w8[j]));
    }
    DSV4_UNROLL
    for (int j = 0; j < 8; ++j) acc[kMix] = add_rn(acc[kMix], mul_rn(v[j], v[j]));
  }
  DSV4_UNROLL
  for (int m = 0; m <= kMix; ++m) bsum[(static_cast<std::int64_t>(m) * nb + b) * cap + i] = acc[m];
}

template <int kMix>
__global__ void __launch_bounds__(kThreads)
    mix_block_totals_kernel(const float* bsum, std::int64_t n, RowSource src, std::int64_t cap, float* raw) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int m = static_cast<int>(blockIdx.y);
  std::int64_t row = 0;
  if (i >= cap || !source_row(src, i, &row)) return;
  const int nb = static_cast<int>((n + kSumBlock - 1) / kSumBlock);
  const float* p = bsum + static_cast<std::int64_t>(m) * nb * cap + i;
  float total = 0.0f;
  for (int b = 0; b < nb; ++b) total = add_rn(total, p[static_cast<std::int64_t>(b) * cap]);
  raw[i * (kMix + 1) + m] = total;
}

// The mixes of row i from its raw sums: mixes[m] = dot_m * (1 / sqrt(sumsq / n + eps)).
template <int kMix>
__device__ void finish_mixes(const float* raw, std::int64_t i, std::int64_t n, float eps, float* mixes) {
  if (threadIdx.x == 0) {
    const float* ri = raw + i * (kMix + 1);
    const float r = 1.0f / sqrtf(ri[kMix] / static_cast<float>(n) + eps);
    for (int m = 0; m < kMix; ++m) mixes[m] = ri[m] * r;
  }
  __syncthreads();
}

// y = bf16(sum_i pre_i h_i) then x = bf16(w * y * rsqrt(mean(y^2) + eps)) over `dim`; ybuf: [dim] floats.
// The sum of squares in the CPU's blocked order (bit-identical); blocks: ceil(dim / 128) floats.
__device__ void weighted_sum_norm(const std::uint16_t* hrow, const float* pre, int hc, std::int64_t dim,
                                  const float* norm_w, float eps, float* ybuf, float* blocks, std::uint16_t* xrow) {
  // Eight values a thread per pass, every stream's 16 bytes loaded before any is used (dim % 8 == 0).
  for (std::int64_t k = 8 * static_cast<std::int64_t>(threadIdx.x); k < dim; k += 8 * static_cast<std::int64_t>(blockDim.x)) {
    uint4 raw[kMaxHc] = {};  // zeroed: the compiler cannot see that only i < hc are read
    DSV4_UNROLL
    for (int i = 0; i < kMaxHc; ++i)
      if (i < hc) raw[i] = *reinterpret_cast<const uint4*>(hrow + i * dim + k);
    DSV4_UNROLL
    for (int j = 0; j < 8; ++j) {
      float acc = 0.0f;
      DSV4_UNROLL
      for (int i = 0; i < kMaxHc; ++i) {
        if (i >= hc) break;
        const std::uint32_t word = word_of(raw[i], j / 2);
        acc = add_rn(acc, mul_rn(pre[i], bf16_value(static_cast<std::uint16_t>((j & 1) ? word >> 16 : word & 0xffffu))));
      }
      ybuf[k + j] = round_bf16(acc);
    }
  }
  const float total = blocked_sum([&](std::int64_t k) { return mul_rn(ybuf[k], ybuf[k]); }, dim, blocks);
  const float inv = 1.0f / sqrtf(total / static_cast<float>(dim) + eps);
  for (std::int64_t k = threadIdx.x; k < dim; k += blockDim.x) store_bf16(xrow + k, norm_w[k] * (ybuf[k] * inv));
}

template <int kMix>
__global__ void __launch_bounds__(kThreads) hc_pre_kernel(const std::uint16_t* h, HcWeights w, const float* norm_w,
                                                          HcShape s, std::int64_t rows, std::uint16_t* x, float* post,
                                                          float* comb, const std::int32_t* rows_dev, const float* raw) {
  DSV4_DYNAMIC_SMEM(float, ybuf);
  __shared__ float red[kMaxSumBlocks];
  __shared__ float mixes[kMix];
  __shared__ float pre[kMaxHc];
  const std::int64_t row = blockIdx.x;
  if (!row_live(row, rows, rows_dev)) return;
  const int hc = s.hc;
  const std::int64_t n = hc * s.dim;
  const std::uint16_t* hrow = h + row * n;
  finish_mixes<kMix>(raw, row, n, s.norm_eps, mixes);
  if (threadIdx.x < 32) {
    // hc_split_sinkhorn on warp 0 in the CPU's order of operations: lane i * hc + j holds c[i][j];
    // a row or column sum gathers its hc terms by shuffles and adds them in index order.
    const int lane = threadIdx.x, hc2 = hc * hc, i = lane / hc, j = lane % hc;
    const float eps = s.hc_eps;
    if (lane < hc) {
      pre[lane] = sigmoid_ref(add_rn(mul_rn(mixes[lane], w.scale[0]), w.base[lane])) + eps;
      post[row * hc + lane] = 2.0f * sigmoid_ref(add_rn(mul_rn(mixes[hc + lane], w.scale[1]), w.base[hc + lane]));
    }
    float c = lane < hc2 ? add_rn(mul_rn(mixes[2 * hc + lane], w.scale[2]), w.base[2 * hc + lane]) : 0.0f;
    auto row_sum = [&](float v) {
      float sum = 0.0f;
      for (int q = 0; q < hc; ++q) sum += __shfl_sync(0xffffffffu, v, (i * hc + q) & 31);
      return sum;
    };
    auto column_sum = [&](float v) {
      float sum = 0.0f;
      for (int q = 0; q < hc; ++q) sum += __shfl_sync(0xffffffffu, v, (q * hc + j) & 31);
      return sum;
    };
    // Iteration 0: row softmax (+ eps), then columns; later iterations: rows, then columns.
    float mx = __shfl_sync(0xffffffffu, c, (i * hc) & 31);
    for (int q = 1; q < hc; ++q) mx = fmaxf(mx, __shfl_sync(0xffffffffu, c, (i * hc + q) & 31));
    c = exp_float(c - mx);
    c = c / row_sum(c) + eps;
    c = c / (column_sum(c) + eps);
    for (int it = 1; it < s.sinkhorn_iters; ++it) {
      c = c / (row_sum(c) + eps);
      c = c / (column_sum(c) + eps);
    }
    if (lane < hc2) comb[row * hc2 + lane] = c;
  }
  __syncthreads();
  weighted_sum_norm(hrow, pre, hc, s.dim, norm_w, s.norm_eps, ybuf, red, x + row * s.dim);
}

template <int kMix>
__global__ void __launch_bounds__(kThreads) hc_head_kernel(const std::uint16_t* h, RowSource src, HcWeights w,
                                                           const float* norm_w, HcShape s, std::uint16_t* y,
                                                           const float* raw) {
  DSV4_DYNAMIC_SMEM(float, ybuf);
  __shared__ float red[kMaxSumBlocks];
  __shared__ float mixes[kMix];
  __shared__ float pre[kMaxHc];
  const std::int64_t i = blockIdx.x;
  std::int64_t row = 0;
  if (!source_row(src, i, &row)) return;
  const int hc = s.hc;
  const std::int64_t n = hc * s.dim;
  const std::uint16_t* hrow = h + row * n;
  finish_mixes<kMix>(raw, i, n, s.norm_eps, mixes);
  if (static_cast<int>(threadIdx.x) < hc)
    pre[threadIdx.x] = sigmoid_ref(add_rn(mul_rn(mixes[threadIdx.x], w.scale[0]), w.base[threadIdx.x])) + s.hc_eps;
  __syncthreads();
  weighted_sum_norm(hrow, pre, hc, s.dim, norm_w, s.norm_eps, ybuf, red, y + i * s.dim);
}

// Eight consecutive values of a row a thread: 16-byte loads and stores of out, h and h_new.
__global__ void hc_post_kernel(const std::uint16_t* out, const std::uint16_t* h, const float* post, const float* comb,
                               int hc, std::int64_t dim, std::int64_t rows, std::uint16_t* h_new,
                               const std::int32_t* rows_dev) {
  const std::int64_t row = blockIdx.y;
  if (!row_live(row, rows, rows_dev)) return;
  const std::int64_t k = 8 * (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x);
  if (k >= dim) return;     // dim % 8 == 0 (check_shape)
  uint4 hraw[kMaxHc] = {};  // zeroed: the compiler cannot see that only i < hc are read
  DSV4_UNROLL
  for (int i = 0; i < kMaxHc; ++i)
    if (i < hc) hraw[i] = *reinterpret_cast<const uint4*>(h + (row * hc + i) * dim + k);
  const uint4 oraw = *reinterpret_cast<const uint4*>(out + row * dim + k);
  float cm[kMaxHc * kMaxHc] = {}, pj[kMaxHc] = {};
  DSV4_UNROLL
  for (int q = 0; q < kMaxHc * kMaxHc; ++q)
    if (q < hc * hc) cm[q] = comb[row * hc * hc + q];
  DSV4_UNROLL
  for (int j = 0; j < kMaxHc; ++j)
    if (j < hc) pj[j] = post[row * hc + j];
  DSV4_UNROLL
  for (int j = 0; j < kMaxHc; ++j) {
    if (j >= hc) break;
    std::uint32_t words[4];
    DSV4_UNROLL
    for (int e = 0; e < 8; e += 2) {
      float pair[2];
      DSV4_UNROLL
      for (int t = 0; t < 2; ++t) {
        const int x = e + t;
        auto value = [&](const uint4& v) {
          const std::uint32_t word = word_of(v, x / 2);
          return bf16_value(static_cast<std::uint16_t>((x & 1) ? word >> 16 : word & 0xffffu));
        };
        float mixed = 0.0f;
        DSV4_UNROLL
        for (int i = 0; i < kMaxHc; ++i) {
          if (i >= hc) break;
          mixed = add_rn(mixed, mul_rn(cm[i * hc + j], value(hraw[i])));
        }
        pair[t] = add_rn(mul_rn(pj[j], value(oraw)), mixed);
      }
      words[e / 2] = pack_bf16x2(pair[0], pair[1]);
    }
    *reinterpret_cast<uint4*>(h_new + (row * hc + j) * dim + k) = make_uint4(words[0], words[1], words[2], words[3]);
  }
}

// The row goes to shared memory first (coalesced), then the blocked sum of squares reads it there.
__global__ void __launch_bounds__(kThreads) rms_norm_kernel(const std::uint16_t* x, const float* w, std::int64_t rows,
                                                            std::int64_t dim, float eps, std::uint16_t* y,
                                                            const std::int32_t* rows_dev) {
  DSV4_DYNAMIC_SMEM(float, xbuf);
  __shared__ float blocks[kMaxSumBlocks];
  const std::int64_t row = blockIdx.x;
  if (!row_live(row, rows, rows_dev)) return;
  for (std::int64_t k = threadIdx.x; k < dim; k += blockDim.x) xbuf[k] = bf16_value(x[row * dim + k]);
  const float total = blocked_sum([&](std::int64_t k) { return mul_rn(xbuf[k], xbuf[k]); }, dim, blocks);
  const float inv = 1.0f / sqrtf(total / static_cast<float>(dim) + eps);
  // x was read into xbuf before blocked_sum's barriers: y may alias x.
  for (std::int64_t k = threadIdx.x; k < dim; k += blockDim.x) store_bf16(y + row * dim + k, w[k] * (xbuf[k] * inv));
}

__global__ void mtp_streams_kernel(const std::uint16_t* hp, const std::uint16_t* ep, int hc, std::int64_t dim,
                                   std::int64_t rows, std::uint16_t* h) {
  const std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * hc * dim) return;
  const std::int64_t row = idx / (hc * dim), k = idx % dim;
  store_bf16(h + idx, add_rn(bf16_value(hp[idx]), bf16_value(ep[row * dim + k])));
}

__global__ void gather_mtp_kernel(const std::uint16_t* src, const DeviceStep* step, std::int64_t width,
                                  std::uint16_t* dst) {
  const std::int64_t i = blockIdx.y;
  if (i >= step->n_tokens) return;
  const std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k < width) dst[i * width + k] = src[static_cast<std::int64_t>(step->mtp_source[i]) * width + k];
}

// Floats of hc scratch before the block sums: the raw mixes of `rows` rows.
std::int64_t raw_floats(std::int64_t rows, int n_mix) {
  return (std::max<std::int64_t>(rows, 1) + kMixRows) * (n_mix + 1);
}

// The raw mixes (kMix + 1 sums a row) of rows [0, rows) of src by `path`, into scratch (the block
// sums of HcMixPath::kRows after them).
template <int kMix>
void launch_mix_sums(const std::uint16_t* h, const float* fn, std::int64_t n, const RowSource& src, std::int64_t rows,
                     HcMixPath path, float* scratch, gpu_stream_t stream) {
  if (path == HcMixPath::kAuto) path = rows >= kHcRowsFrom ? HcMixPath::kRows : HcMixPath::kBlocks;
  if (path == HcMixPath::kRows) {
    const std::int64_t nb = (n + kSumBlock - 1) / kSumBlock;
    float* bsum = scratch + raw_floats(rows, kMix);
    launch(mix_block_sums_kernel<kMix>,
           dim3(static_cast<unsigned>((rows + 31) / 32), static_cast<unsigned>((nb + kBlockWarps - 1) / kBlockWarps)),
           dim3(32 * kBlockWarps), 0, stream, h, fn, n, src, rows, bsum);
    launch(mix_block_totals_kernel<kMix>,
           dim3(static_cast<unsigned>((rows + kThreads - 1) / kThreads), static_cast<unsigned>(kMix + 1)),
           dim3(kThreads), 0, stream, static_cast<const float*>(bsum), n, src, rows, scratch);
  } else {
    launch(mix_sums_kernel<kMix>,
           dim3(static_cast<unsigned>((rows + kMixRows - 1) / kMixRows), static_cast<unsigned>(kMix + 1)),
           dim3(kThreads), 0, stream, h, fn, n, src, scratch);
  }
}

unsigned blocks_for(std::int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

void check_shape(const HcShape& s) {
  if (s.hc < 1 || s.hc > kMaxHc) launch_error("GPU hyper-connections support hc_mult 1..{}, found {}", {kMaxHc, s.hc});
  if (s.dim <= 0 || s.dim % 8 != 0 || s.hc * s.dim > kMaxSumBlocks * kSumBlock)
    launch_error("GPU hyper-connections: hidden size {} (a multiple of 8, hc x hidden at most 32768)", {s.dim});
}

std::size_t ybuf_bytes(const HcShape& s) { return static_cast<std::size_t>(s.dim) * sizeof(float); }

}  // namespace

void embed_streams(const DeviceStep* step, std::int32_t capacity, const std::uint16_t* embed, std::uint16_t* h,
                   const HcShape& shape, gpu_stream_t stream) {
  check_shape(shape);
  if (capacity <= 0) return;
  launch(embed_kernel, dim3(blocks_for(shape.dim), static_cast<unsigned>(capacity)), dim3(kThreads), 0, stream, step, embed, h,
         shape.hc, shape.dim);
}

namespace {

template <int kHc>
void launch_pre(const std::uint16_t* h, const HcWeights& w, const float* norm_w, const HcShape& shape,
                std::int64_t rows, std::uint16_t* x, float* post, float* comb, const std::int32_t* rows_dev,
                float* scratch, gpu_stream_t stream, HcMixPath path) {
  constexpr int kMix = (2 + kHc) * kHc;
  const std::int64_t n = kHc * shape.dim;
  RowSource src;
  src.rows = rows;
  src.rows_dev = rows_dev;
  launch_mix_sums<kMix>(h, w.fn, n, src, rows, path, scratch, stream);
  static const bool smem_set = (set_max_dynamic_smem(hc_pre_kernel<kMix>, 64 * 1024), true);
  (void)smem_set;
  launch(hc_pre_kernel<kMix>, dim3(static_cast<unsigned>(rows)), dim3(kThreads), ybuf_bytes(shape), stream, h, w, norm_w, shape,
         rows, x, post, comb, rows_dev, static_cast<const float*>(scratch));
}

template <int kHc>
void launch_head(const std::uint16_t* h, const DeviceStep* step, bool all_tokens, std::int32_t capacity,
                 const HcWeights& w, const float* norm_w, const HcShape& shape, std::uint16_t* y, float* scratch,
                 gpu_stream_t stream, HcMixPath path) {
  const std::int64_t n = kHc * shape.dim;
  RowSource src;
  src.step = step;
  src.all_tokens = all_tokens;
  launch_mix_sums<kHc>(h, w.fn, n, src, capacity, path, scratch, stream);
  static const bool smem_set = (set_max_dynamic_smem(hc_head_kernel<kHc>, 64 * 1024), true);
  (void)smem_set;
  launch(hc_head_kernel<kHc>, dim3(static_cast<unsigned>(capacity)), dim3(kThreads), ybuf_bytes(shape), stream, h, src, w,
         norm_w, shape, y, static_cast<const float*>(scratch));
}

}  // namespace

std::int64_t hc_scratch_floats(std::int64_t rows, const HcShape& shape) {
  const int n_mix = (2 + shape.hc) * shape.hc;  // hc_head's hc sums need less
  const std::int64_t nb = (shape.hc * shape.dim + kSumBlock - 1) / kSumBlock;
  return raw_floats(rows, n_mix) + (n_mix + 1) * nb * std::max<std::int64_t>(rows, 1);
}

void hc_pre(const std::uint16_t* h, const HcWeights& w, const float* norm_w, const HcShape& shape, std::int64_t rows,
            std::uint16_t* x, float* post, float* comb, const std::int32_t* rows_dev, float* scratch,
            gpu_stream_t stream, HcMixPath path) {
  check_shape(shape);
  if (rows <= 0) return;
  if (ybuf_bytes(shape) > 64 * 1024) launch_error("hc_pre: hidden size {} is too large for one block", {shape.dim});
  switch (shape.hc) {
    case 1: return launch_pre<1>(h, w, norm_w, shape, rows, x, post, comb, rows_dev, scratch, stream, path);
    case 2: return launch_pre<2>(h, w, norm_w, shape, rows, x, post, comb, rows_dev, scratch, stream, path);
    case 3: return launch_pre<3>(h, w, norm_w, shape, rows, x, post, comb, rows_dev, scratch, stream, path);
    default: return launch_pre<4>(h, w, norm_w, shape, rows, x, post, comb, rows_dev, scratch, stream, path);
  }
}

void hc_post(const std::uint16_t* out, const std::uint16_t* h, const float* post, const float* comb,
             const HcShape& shape, std::int64_t rows, std::uint16_t* h_new, const std::int32_t* rows_dev,
             gpu_stream_t stream) {
  check_shape(shape);
  if (rows <= 0) return;
  launch(hc_post_kernel, dim3(blocks_for(shape.dim / 8), static_cast<unsigned>(rows)), dim3(kThreads), 0, stream, out,
         h, post, comb, shape.hc, shape.dim, rows, h_new, rows_dev);
}

void hc_head(const std::uint16_t* h, const DeviceStep* step, bool all_tokens, std::int32_t capacity, const HcWeights& w,
             const float* norm_w, const HcShape& shape, std::uint16_t* y, float* scratch, gpu_stream_t stream,
             HcMixPath path) {
  check_shape(shape);
  if (capacity <= 0) return;
  switch (shape.hc) {
    case 1: return launch_head<1>(h, step, all_tokens, capacity, w, norm_w, shape, y, scratch, stream, path);
    case 2: return launch_head<2>(h, step, all_tokens, capacity, w, norm_w, shape, y, scratch, stream, path);
    case 3: return launch_head<3>(h, step, all_tokens, capacity, w, norm_w, shape, y, scratch, stream, path);
    default: return launch_head<4>(h, step, all_tokens, capacity, w, norm_w, shape, y, scratch, stream, path);
  }
}

void rms_norm_rows(const std::uint16_t* x, const float* w, std::int64_t rows, std::int64_t dim, float eps,
                   std::uint16_t* y, const std::int32_t* rows_dev, gpu_stream_t stream) {
  if (rows <= 0) return;
  if (dim <= 0 || dim > 16384) launch_error("rms_norm_rows: {} values a row (at most 16384)", {dim});
  static const bool smem_set = (set_max_dynamic_smem(rms_norm_kernel, 64 * 1024), true);
  (void)smem_set;
  launch(rms_norm_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), static_cast<std::size_t>(dim) * sizeof(float), stream, x, w,
         rows, dim, eps, y, rows_dev);
}

void mtp_streams(const std::uint16_t* hp, const std::uint16_t* ep, const HcShape& shape, std::int64_t rows,
                 std::uint16_t* h, gpu_stream_t stream) {
  if (rows <= 0) return;
  launch(mtp_streams_kernel, dim3(blocks_for(rows * shape.hc * shape.dim)), dim3(kThreads), 0, stream, hp, ep, shape.hc,
         shape.dim, rows, h);
}

void gather_mtp_rows(const std::uint16_t* src, const DeviceStep* step, std::int32_t capacity, std::int64_t width,
                     std::uint16_t* dst, gpu_stream_t stream) {
  if (capacity <= 0) return;
  launch(gather_mtp_kernel, dim3(blocks_for(width), static_cast<unsigned>(capacity)), dim3(kThreads), 0, stream, src, step, width,
         dst);
}

}  // namespace dsv4::gpu
