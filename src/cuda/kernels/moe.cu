// MoE routing, permutation, SwiGLU and combine kernels (moe.h).
#include "cuda/kernels/moe.h"

#include <algorithm>

#include "cuda/kernels/dependent_launch.cuh"
#include "cuda/kernels/launch_check.h"
#include "cuda/device.h"
#include "cuda/kernels/numerics.cuh"
#include "cuda/kernels/reduce.cuh"
#include "numerics/exp_float.h"

namespace dsv4::gpu {
namespace {

constexpr int kMaxExperts = 1024;
constexpr int kMaxTopK = 16;

// ---- routing: one block of 128 threads per token ----------------------------------------------
__global__ void __launch_bounds__(128) route_kernel(MoeRouteArgs a) {
  grid_dependency_wait();  // (launched dependent: the logits come from the kernel before)
  __shared__ float score[kMaxExperts];
  __shared__ float biased[kMaxExperts];
  __shared__ float best_v[4];
  __shared__ int best_i[4];
  __shared__ int chosen[kMaxTopK];
  __shared__ int taken[kMaxExperts];
  const DeviceStep& st = *a.step;
  const int t = blockIdx.x;
  if (t >= st.n_tokens) return;
  const int E = a.experts, k = a.top_k;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    float z = a.logits[static_cast<std::int64_t>(t) * E + e];
    for (int p = 1; p < a.logit_splits; ++p) z += a.logits[p * a.split_stride + static_cast<std::int64_t>(t) * E + e];
    const float sp = z > 20.0f ? z : log1pf(exp_float(z));
    score[e] = sqrtf(sp);
    if (a.bias != nullptr) {
      const float b = score[e] + a.bias[e];
      biased[e] = b != b ? -INFINITY : b;  // NaN ranks as -inf (top_k_indices)
    }
  }
  __syncthreads();
  if (a.tid2eid != nullptr) {
    if (static_cast<int>(threadIdx.x) < k) chosen[threadIdx.x] = a.tid2eid[static_cast<std::int64_t>(st.token_ids[t]) * k + threadIdx.x];
  } else {
    // k rounds of a block argmax over the experts not yet taken: highest biased score, ties
    // (and -inf / NaN scores) to the lower id -- the order top_k_indices returns.
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int e = threadIdx.x; e < E; e += blockDim.x) taken[e] = 0;
    __syncthreads();
    for (int c = 0; c < k; ++c) {
      float bv = -INFINITY;
      int bi = kMaxExperts;
      for (int e = threadIdx.x; e < E; e += blockDim.x) {
        if (taken[e]) continue;
        const float v = biased[e];
        if (bi == kMaxExperts || v > bv || (v == bv && e < bi)) {
          bv = v;
          bi = e;
        }
      }
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi != kMaxExperts && (bi == kMaxExperts || ov > bv || (ov == bv && oi < bi))) {
          bv = ov;
          bi = oi;
        }
      }
      if (lane == 0) {
        best_v[warp] = bv;
        best_i[warp] = bi;
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        float v = best_v[0];
        int idx = best_i[0];
        for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) {
          const int oi = best_i[w];
          if (oi != kMaxExperts && (idx == kMaxExperts || best_v[w] > v || (best_v[w] == v && oi < idx))) {
            v = best_v[w];
            idx = oi;
          }
        }
        chosen[c] = idx;
        taken[idx] = 1;
      }
      __syncthreads();
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int c = 0; c < k; ++c) sum += score[chosen[c]];
    for (int c = 0; c < k; ++c) {
      a.route_expert[static_cast<std::int64_t>(t) * k + c] = chosen[c];
      a.route_weight[static_cast<std::int64_t>(t) * k + c] = score[chosen[c]] / sum * a.routed_scale;
    }
  }
}

// ---- permutation and tile map: one block ----------------------------------------------------------
__global__ void __launch_bounds__(1024) permute_kernel(MoePermuteArgs a) {
  grid_dependency_wait();  // (launched dependent)
  __shared__ int count[kMaxExperts];
  __shared__ int offset[kMaxExperts];
  __shared__ int tile_offset[kMaxExperts];
  __shared__ int fill[kMaxExperts];
  const int E = a.experts, k = a.top_k;
  const int pairs = a.step->n_tokens * k;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    count[e] = 0;
    fill[e] = 0;
  }
  __syncthreads();
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) atomicAdd(&count[a.route_expert[p]], 1);
  __syncthreads();
  // Offsets of each expert's rows and tiles: an exclusive scan over the experts (thread e holds
  // expert e; warp scans by shuffles, then a scan of the warp totals).
  {
    __shared__ int warp_rows[32], warp_tiles[32];
    const int e = threadIdx.x, lane = e & 31, warp = e >> 5;
    const int c = e < E ? count[e] : 0;
    int r = c, t = (c + a.tile_m - 1) / a.tile_m;
    for (int o = 1; o < 32; o <<= 1) {
      const int rr = __shfl_up_sync(0xffffffffu, r, o), tt = __shfl_up_sync(0xffffffffu, t, o);
      if (lane >= o) {
        r += rr;
        t += tt;
      }
    }
    if (lane == 31) {
      warp_rows[warp] = r;
      warp_tiles[warp] = t;
    }
    __syncthreads();
    if (warp == 0) {
      const int n_warps = static_cast<int>(blockDim.x >> 5);
      int wr = lane < n_warps ? warp_rows[lane] : 0, wt = lane < n_warps ? warp_tiles[lane] : 0;
      for (int o = 1; o < 32; o <<= 1) {
        const int rr = __shfl_up_sync(0xffffffffu, wr, o), tt = __shfl_up_sync(0xffffffffu, wt, o);
        if (lane >= o) {
          wr += rr;
          wt += tt;
        }
      }
      if (lane < n_warps) {
        warp_rows[lane] = wr;  // inclusive totals through warp `lane`
        warp_tiles[lane] = wt;
      }
    }
    __syncthreads();
    const int before_rows = warp == 0 ? 0 : warp_rows[warp - 1], before_tiles = warp == 0 ? 0 : warp_tiles[warp - 1];
    if (e < E) {
      offset[e] = before_rows + r - c;
      tile_offset[e] = before_tiles + t - (c + a.tile_m - 1) / a.tile_m;
    }
    if (e == static_cast<int>(blockDim.x) - 1) {
      *a.num_rows = before_rows + r;
      *a.num_tiles = before_tiles + t;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const int n_tiles = (count[e] + a.tile_m - 1) / a.tile_m;
    for (int j = 0; j < n_tiles; ++j) {
      const int tile = tile_offset[e] + j;
      a.tile_expert[tile] = e;
      a.tile_row0[tile] = offset[e] + j * a.tile_m;
      a.tile_rows[tile] = min(a.tile_m, count[e] - j * a.tile_m);
    }
  }
  // Row order within an expert does not change any value (each row's product is its own).
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int e = a.route_expert[p];
    const int slot = offset[e] + atomicAdd(&fill[e], 1);
    a.source_row[slot] = p / k;
    a.slot_of[p] = slot;
    a.slot_weight[slot] = a.route_weight[p];
  }
}

// ---- SwiGLU + FP8 quantization: one warp per (row, 128 hidden values) ----------------------------
__global__ void swiglu_kernel(const std::uint16_t* gu, std::int64_t rows, const std::int32_t* rows_dev,
                              std::int64_t inter, float limit, const float* row_weight, std::uint8_t* codes,
                              float* scales) {
  grid_dependency_wait();  // (launched dependent: the products come from the kernel before)
  const std::int64_t blocks_per_row = (inter + 127) / 128;
  const std::int64_t warp_id = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const std::int64_t row = warp_id / blocks_per_row, kb = warp_id % blocks_per_row;
  const std::int64_t limit_rows = rows_dev == nullptr ? rows : min(rows, static_cast<std::int64_t>(*rows_dev));
  if (row >= limit_rows) return;
  const float w = row_weight == nullptr ? 1.0f : row_weight[row];
  float h[4];
  float amax = 0.0f;
  DSV4_UNROLL
  for (int i = 0; i < 4; ++i) {
    const std::int64_t c = kb * 128 + lane * 4 + i;
    h[i] = 0.0f;
    if (c < inter) {
      float g = bf16_value(gu[row * 2 * inter + c]);
      float u = bf16_value(gu[row * 2 * inter + inter + c]);
      if (limit > 0.0f) {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
      }
      h[i] = round_bf16(mul_rn(w, mul_rn(silu_ref(g), u)));
    }
    amax = fmaxf(amax, fabsf(h[i]));
  }
  amax = warp_max(amax);
  const float scale = fp8_scale(amax), inv = 1.0f / scale;
  DSV4_UNROLL
  for (int i = 0; i < 4; ++i) {
    const std::int64_t c = kb * 128 + lane * 4 + i;
    if (c < inter) codes[row * inter + c] = fp8_encode_scaled(h[i], inv);
  }
  if (lane == 0) scales[row * blocks_per_row + kb] = scale;
}

// ---- combine: experts in ascending id, then the shared expert ---------------------------------------
__global__ void combine_kernel(const DeviceStep* step, std::int32_t top_k, const std::int32_t* route_expert,
                               const std::int32_t* slot_of, const std::uint16_t* y_routed, const std::uint16_t* y_shared,
                               std::int64_t dim, std::uint16_t* out) {
  const int t = blockIdx.y;
  if (t >= step->n_tokens) return;
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  int order[kMaxTopK];
  for (int i = 0; i < top_k; ++i) order[i] = i;
  const std::int32_t* ex = route_expert + static_cast<std::int64_t>(t) * top_k;
  for (int i = 1; i < top_k; ++i) {  // stable insertion sort by expert id
    const int o = order[i];
    int j = i;
    while (j > 0 && ex[order[j - 1]] > ex[o]) {
      order[j] = order[j - 1];
      --j;
    }
    order[j] = o;
  }
  float acc = 0.0f;
  for (int i = 0; i < top_k; ++i) {
    const std::int64_t slot = slot_of[static_cast<std::int64_t>(t) * top_k + order[i]];
    acc = add_rn(acc, bf16_value(y_routed[slot * dim + c]));
  }
  store_bf16(out + static_cast<std::int64_t>(t) * dim + c, add_rn(acc, bf16_value(y_shared[static_cast<std::int64_t>(t) * dim + c])));
}

}  // namespace

std::int64_t moe_gate_logit_floats(std::int64_t rows, std::int64_t experts) {
  return std::max(rows, kMaxKSplits * std::min(rows, kKSplitMaxRows)) * experts;
}

int moe_gate(const std::uint16_t* x, std::int64_t rows, const DeviceWeight& gate, float* logits,
             const std::int32_t* rows_dev, GemmPath path, gpu_stream_t stream) {
  const int splits = path == GemmPath::kAuto ? gemm_k_splits(rows, gate) : 1;
  if (splits > 1) gemm_bf16_k_partials(x, gate.k, rows, gate, splits, logits, rows * gate.n, rows_dev, stream);
  else gemm_bf16(x, gate.k, rows, gate, 1, GemmOutput{logits, gate.n, true}, rows_dev, stream, path);
  return splits;
}

void moe_route(const MoeRouteArgs& args, gpu_stream_t stream) {
  if (args.capacity <= 0) return;
  if (args.experts > kMaxExperts || args.top_k > kMaxTopK || args.top_k > args.experts)
    launch_error("GPU MoE: {} experts, top {} (at most {} / {})", {args.experts, args.top_k, kMaxExperts, kMaxTopK});
  if (args.logit_splits < 1 || (args.logit_splits > 1 && args.split_stride < static_cast<std::int64_t>(args.capacity) * args.experts))
    launch_error("GPU MoE: {} logit partials {} floats apart", {args.logit_splits, args.split_stride});
  launch_dependent(route_kernel, dim3(static_cast<unsigned>(args.capacity)), dim3(128), 0, stream, args);
}

void moe_permute(const MoePermuteArgs& args, gpu_stream_t stream) {
  if (args.experts > kMaxExperts) launch_error("GPU MoE: {} experts (at most {})", {args.experts, kMaxExperts});
  launch_dependent(permute_kernel, dim3(1), dim3(kMaxExperts), 0, stream, args);
}

std::int32_t moe_max_tiles(std::int64_t tokens, std::int64_t top_k, std::int64_t experts, std::int32_t tile_m) {
  const std::int64_t pairs = tokens * top_k;
  return static_cast<std::int32_t>((pairs + tile_m - 1) / tile_m + std::min(experts, pairs));
}

void swiglu_quantize(const std::uint16_t* gu, std::int64_t rows, const std::int32_t* rows_dev, std::int64_t inter,
                     float limit, const float* row_weight, std::uint8_t* codes, float* scales, gpu_stream_t stream) {
  if (rows <= 0) return;
  const std::int64_t warps = rows * ((inter + 127) / 128);
  launch_dependent(swiglu_kernel, dim3(static_cast<unsigned>((warps * 32 + 255) / 256)), dim3(256), 0, stream, gu, rows, rows_dev,
         inter, limit, row_weight, codes, scales);
}

void moe_combine(const DeviceStep* step, std::int32_t capacity, std::int32_t top_k, const std::int32_t* route_expert,
                 const std::int32_t* slot_of, const std::uint16_t* y_routed, const std::uint16_t* y_shared,
                 std::int64_t dim, std::uint16_t* out, gpu_stream_t stream) {
  if (capacity <= 0) return;
  launch(combine_kernel, dim3(static_cast<unsigned>((dim + 255) / 256), static_cast<unsigned>(capacity)), dim3(256), 0,
         stream, step, top_k, route_expert, slot_of, y_routed, y_shared, dim, out);
}

}  // namespace dsv4::gpu
