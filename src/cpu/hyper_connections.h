// Hyper-connections (mHC) of one token (SPEC.md 3.1, 5a; DeepSeek-V4 inference/model.py
// Block.hc_pre / hc_post, ParallelHead.hc_head, kernel.py hc_split_sinkhorn).
//
// The residual stream h is [hc, dim] (bf16 values), stream i at h[i * dim].
//   hc_mixes:   X = h as fp32 [hc*dim]; r = 1 / sqrt(blocked_dot(X, X) / (hc*dim) + norm_eps);
//               mixes[m] = blocked_dot(X, fn[m]) * r          (fn [n_mix, hc*dim], fp32)
//   hc_split_sinkhorn (fp32, the kernel's order of operations):
//               pre_i  = sigmoid(mixes[i] * scale[0] + base[i]) + eps
//               post_j = 2 * sigmoid(mixes[hc+j] * scale[1] + base[hc+j])
//               c[i][j] = mixes[2hc + i*hc + j] * scale[2] + base[2hc + i*hc + j]
//               c = row softmax (exp(c - rowmax) / rowsum) + eps; c /= (column sum + eps);
//               then (iters - 1) times: c /= (row sum + eps); c /= (column sum + eps).
//               sigmoid(z) = 1 / (1 + exp(-z)). Sums run over the index in order.
//   hc_weighted_sum: y = bf16(sum_i pre_i * h_i) (fp32, i ascending).
//   hc_post:    h'_j = bf16(post_j * out + sum_i comb[i][j] * h_i) (fp32, i ascending).
//   hc_head:    the model head's pre-only mixing with hc_head_{fn,base,scale} (scale has one
//               value): pre_i = sigmoid(mixes[i] * scale + base[i]) + hc_eps, y = hc_weighted_sum.
// comb is row-major [hc, hc]: comb[i * hc + j] is what stream i gives to new stream j.
// Size mismatches throw std::invalid_argument.
#pragma once

#include <cstdint>
#include <span>

namespace dsv4 {

struct HcParams {
  std::int64_t hc = 4;   // hc_mult
  std::int64_t dim = 0;  // D
  std::int64_t sinkhorn_iters = 20;
  float norm_eps = 1e-6f;  // rms_norm_eps (the rsqrt of the mixes)
  float hc_eps = 1e-6f;
};

// fn [n_mix, hc*dim] row-major; mixes [n_mix].
void hc_mixes(std::span<const float> h, std::span<const float> fn, const HcParams& params, std::span<float> mixes);

// mixes, base [(2+hc)*hc]; scale [3]; pre, post [hc]; comb [hc*hc].
void hc_split_sinkhorn(std::span<const float> mixes, std::span<const float> scale, std::span<const float> base,
                       const HcParams& params, std::span<float> pre, std::span<float> post, std::span<float> comb);

// y [dim] = bf16(sum_i pre_i * h_i).
void hc_weighted_sum(std::span<const float> h, std::span<const float> pre, const HcParams& params, std::span<float> y);

// hc_mixes + hc_split_sinkhorn + hc_weighted_sum: the sub-layer input y [dim] (before its norm),
// and post [hc], comb [hc*hc] for hc_post.
void hc_pre(std::span<const float> h, std::span<const float> fn, std::span<const float> scale,
            std::span<const float> base, const HcParams& params, std::span<float> y, std::span<float> post,
            std::span<float> comb);

// out [dim] (the sub-layer output), h [hc*dim] (its input stream) -> h_new [hc*dim] (may not alias h).
void hc_post(std::span<const float> out, std::span<const float> h, std::span<const float> post,
             std::span<const float> comb, const HcParams& params, std::span<float> h_new);

// fn [hc, hc*dim], scale [1], base [hc] -> y [dim] (bf16; the caller applies the final norm).
void hc_head(std::span<const float> h, std::span<const float> fn, std::span<const float> scale,
             std::span<const float> base, const HcParams& params, std::span<float> y);

}  // namespace dsv4
