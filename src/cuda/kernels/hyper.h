// Residual-stream kernels: embedding into the hc streams, hyper-connection mixing before and
// after each sub-layer (with the sub-layer's RMSNorm fused in), the head's pre-only mixing with
// the final norm, plain RMSNorm over rows, and the MTP block's input streams (SPEC.md 3.1, 3.6).
// CPU twins: cpu/hyper_connections.h, cpu/rms_norm.h, CpuExecutor::mtp_block.
// Streams h are bf16 [rows][hc][dim]; rows past *rows_dev (when given) are left alone.
#pragma once

#include <cstdint>

#include "cuda/device_step.h"
#include "cuda/stream_handle.h"

namespace dsv4::gpu {

struct HcWeights {
  const float* fn = nullptr;    // [n_mix][hc * dim] fp32 (n_mix = (2 + hc) * hc, or hc for the head)
  const float* base = nullptr;  // [n_mix]
  const float* scale = nullptr; // [3] (head: [1])
};

struct HcShape {
  int hc = 4;
  std::int64_t dim = 0;
  int sinkhorn_iters = 20;
  float norm_eps = 1e-6f;  // rms_norm_eps: the mixes' rsqrt and the fused RMSNorm
  float hc_eps = 1e-6f;
};

// h[t][i] = embed[step->token_ids[t]] for every stream i and step token t (shape.hc streams).
// Kernels that take the DeviceStep read its arrays at run time, so a captured graph replays
// for any step of its bucket.
void embed_streams(const DeviceStep* step, std::int32_t capacity, const std::uint16_t* embed, std::uint16_t* h,
                   const HcShape& shape, gpu_stream_t stream);

// Scratch floats hc_pre and hc_head need for up to `rows` rows (the raw mixes of each row and
// the block sums of HcMixPath::kRows: (n_mix + 1) * ceil(hc * dim / 128) floats a row). The
// mixes and the RMSNorm sums of squares are summed in the CPU's blocked order (blocks of 128,
// cpu/linear.h blocked_dot), so x and y are bit-identical to the CPU's.
std::int64_t hc_scratch_floats(std::int64_t rows, const HcShape& shape);

// How hc_pre and hc_head form a row's raw mixes (the same bits either way): kBlocks gives a
// thread to each 128-term block of a row and sum, then adds the block sums of a row and sum on one
// thread (reads each row once per sum); kRows gives a thread to each row and 128-term block for
// all sums at once, stores the block sums, and adds them in a second pass (reads each row once).
// kAuto takes kRows from kHcRowsFrom rows on.
enum class HcMixPath { kAuto, kBlocks, kRows };
inline constexpr std::int64_t kHcRowsFrom = 128;

// Sub-layer input: x[r] = bf16(norm_w * rmsnorm(bf16(sum_i pre_i h[r][i]))) with pre / post /
// comb from the mixes and Sinkhorn; post [rows][hc], comb [rows][hc * hc] for hc_post.
void hc_pre(const std::uint16_t* h, const HcWeights& w, const float* norm_w, const HcShape& shape, std::int64_t rows,
            std::uint16_t* x, float* post, float* comb, const std::int32_t* rows_dev, float* scratch,
            gpu_stream_t stream, HcMixPath path = HcMixPath::kAuto);

// h_new[r][j] = bf16(post[r][j] * out[r] + sum_i comb[r][i][j] * h[r][i]).
void hc_post(const std::uint16_t* out, const std::uint16_t* h, const float* post, const float* comb,
             const HcShape& shape, std::int64_t rows, std::uint16_t* h_new, const std::int32_t* rows_dev,
             gpu_stream_t stream);

// The head's input of the step's logits tokens (all_tokens: of every step token, in order):
// y[i] = bf16(norm_w * rmsnorm(bf16(sum_j pre_j h[row_i][j]))), pre_j = sigmoid(mixes_j * scale +
// base_j) + hc_eps. `capacity` bounds the grid.
void hc_head(const std::uint16_t* h, const DeviceStep* step, bool all_tokens, std::int32_t capacity, const HcWeights& w,
             const float* norm_w, const HcShape& shape, std::uint16_t* y, float* scratch, gpu_stream_t stream,
             HcMixPath path = HcMixPath::kAuto);

// y[r] = bf16(w * x[r] / sqrt(mean(x[r]^2) + eps)) for bf16 rows of `dim` (x and y may alias).
void rms_norm_rows(const std::uint16_t* x, const float* w, std::int64_t rows, std::int64_t dim, float eps,
                   std::uint16_t* y, const std::int32_t* rows_dev, gpu_stream_t stream);

// MTP input streams: h[r][j] = bf16(hp[r][j] + ep[r]) with hp [rows][hc][dim], ep [rows][dim].
void mtp_streams(const std::uint16_t* hp, const std::uint16_t* ep, const HcShape& shape, std::int64_t rows,
                 std::uint16_t* h, gpu_stream_t stream);

// MTP sub-step: dst[i] = src[step->mtp_source[i]] for its tokens, rows of `width` bf16 values.
void gather_mtp_rows(const std::uint16_t* src, const DeviceStep* step, std::int32_t capacity, std::int64_t width,
                     std::uint16_t* dst, gpu_stream_t stream);

}  // namespace dsv4::gpu
