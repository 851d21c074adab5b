#include "cpu/hyper_connections.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "cpu/linear.h"
#include "numerics/bf16.h"
#include "numerics/exp_float.h"

namespace dsv4 {
namespace {

void expect(bool ok, const char* who, const char* what, std::size_t got, std::int64_t want) {
  if (!ok) throw std::invalid_argument(fmt::format("{}: {} has {} values, expected {}", who, what, got, want));
}

void check_params(const HcParams& p, const char* who, bool need_dim = true) {
  if (p.hc <= 0 || (need_dim && p.dim <= 0) || p.sinkhorn_iters < 1) {
    throw std::invalid_argument(
        fmt::format("{}: bad params hc {} dim {} iters {}", who, p.hc, p.dim, p.sinkhorn_iters));
  }
}

float sigmoid(float z) { return 1.0f / (1.0f + exp_float(-z)); }

}  // namespace

void hc_mixes(std::span<const float> h, std::span<const float> fn, const HcParams& p, std::span<float> mixes) {
  check_params(p, "hc_mixes");
  const std::int64_t n = p.hc * p.dim;
  const auto n_mix = static_cast<std::int64_t>(mixes.size());
  expect(static_cast<std::int64_t>(h.size()) == n, "hc_mixes", "h", h.size(), n);
  expect(static_cast<std::int64_t>(fn.size()) == n_mix * n, "hc_mixes", "fn", fn.size(), n_mix * n);
  // Blocked order (blocked_dot) for the sum of squares as for the dot products: the GPU adds in
  // exactly this order.
  const float sum = blocked_dot(h.data(), h.data(), n, kActQuantBlock);
  const float r = 1.0f / std::sqrt(sum / static_cast<float>(n) + p.norm_eps);
  for (std::int64_t m = 0; m < n_mix; ++m) {
    mixes[static_cast<std::size_t>(m)] = blocked_dot(h.data(), fn.data() + m * n, n, kActQuantBlock) * r;
  }
}

void hc_split_sinkhorn(std::span<const float> mixes, std::span<const float> scale, std::span<const float> base,
                       const HcParams& p, std::span<float> pre, std::span<float> post, std::span<float> comb) {
  check_params(p, "hc_split_sinkhorn", /*need_dim=*/false);
  const std::int64_t hc = p.hc, n_mix = (2 + hc) * hc;
  const char* who = "hc_split_sinkhorn";
  expect(static_cast<std::int64_t>(mixes.size()) == n_mix, who, "mixes", mixes.size(), n_mix);
  expect(static_cast<std::int64_t>(base.size()) == n_mix, who, "base", base.size(), n_mix);
  expect(scale.size() == 3, who, "scale", scale.size(), 3);
  expect(static_cast<std::int64_t>(pre.size()) == hc, who, "pre", pre.size(), hc);
  expect(static_cast<std::int64_t>(post.size()) == hc, who, "post", post.size(), hc);
  expect(static_cast<std::int64_t>(comb.size()) == hc * hc, who, "comb", comb.size(), hc * hc);
  const float eps = p.hc_eps;
  const auto at = [](std::span<const float> s, std::int64_t i) { return s[static_cast<std::size_t>(i)]; };
  for (std::int64_t i = 0; i < hc; ++i) {
    pre[static_cast<std::size_t>(i)] = sigmoid(at(mixes, i) * scale[0] + at(base, i)) + eps;
    post[static_cast<std::size_t>(i)] = 2.0f * sigmoid(at(mixes, hc + i) * scale[1] + at(base, hc + i));
  }
  float* c = comb.data();
  for (std::int64_t k = 0; k < hc * hc; ++k) c[k] = at(mixes, 2 * hc + k) * scale[2] + at(base, 2 * hc + k);

  const auto normalize_rows = [&](bool softmax) {
    for (std::int64_t i = 0; i < hc; ++i) {
      float* row = c + i * hc;
      if (softmax) {
        const float mx = *std::max_element(row, row + hc);
        float sum = 0.0f;
        for (std::int64_t j = 0; j < hc; ++j) {
          row[j] = exp_float(row[j] - mx);
          sum += row[j];
        }
        for (std::int64_t j = 0; j < hc; ++j) row[j] = row[j] / sum + eps;
      } else {
        float sum = 0.0f;
        for (std::int64_t j = 0; j < hc; ++j) sum += row[j];
        for (std::int64_t j = 0; j < hc; ++j) row[j] = row[j] / (sum + eps);
      }
    }
  };
  const auto normalize_columns = [&] {
    for (std::int64_t j = 0; j < hc; ++j) {
      float sum = 0.0f;
      for (std::int64_t i = 0; i < hc; ++i) sum += c[i * hc + j];
      for (std::int64_t i = 0; i < hc; ++i) c[i * hc + j] = c[i * hc + j] / (sum + eps);
    }
  };
  normalize_rows(/*softmax=*/true);
  normalize_columns();
  for (std::int64_t it = 1; it < p.sinkhorn_iters; ++it) {
    normalize_rows(/*softmax=*/false);
    normalize_columns();
  }
}

void hc_weighted_sum(std::span<const float> h, std::span<const float> pre, const HcParams& p, std::span<float> y) {
  check_params(p, "hc_weighted_sum");
  expect(static_cast<std::int64_t>(h.size()) == p.hc * p.dim, "hc_weighted_sum", "h", h.size(), p.hc * p.dim);
  expect(static_cast<std::int64_t>(pre.size()) == p.hc, "hc_weighted_sum", "pre", pre.size(), p.hc);
  expect(static_cast<std::int64_t>(y.size()) == p.dim, "hc_weighted_sum", "y", y.size(), p.dim);
  for (std::int64_t k = 0; k < p.dim; ++k) {
    float acc = 0.0f;
    for (std::int64_t i = 0; i < p.hc; ++i)
      acc += pre[static_cast<std::size_t>(i)] * h[static_cast<std::size_t>(i * p.dim + k)];
    y[static_cast<std::size_t>(k)] = round_to_bf16(acc);
  }
}

void hc_pre(std::span<const float> h, std::span<const float> fn, std::span<const float> scale,
            std::span<const float> base, const HcParams& p, std::span<float> y, std::span<float> post,
            std::span<float> comb) {
  check_params(p, "hc_pre");
  std::vector<float> mixes(static_cast<std::size_t>((2 + p.hc) * p.hc));
  std::vector<float> pre(static_cast<std::size_t>(p.hc));
  hc_mixes(h, fn, p, mixes);
  hc_split_sinkhorn(mixes, scale, base, p, pre, post, comb);
  hc_weighted_sum(h, pre, p, y);
}

void hc_post(std::span<const float> out, std::span<const float> h, std::span<const float> post,
             std::span<const float> comb, const HcParams& p, std::span<float> h_new) {
  check_params(p, "hc_post");
  const char* who = "hc_post";
  expect(static_cast<std::int64_t>(out.size()) == p.dim, who, "out", out.size(), p.dim);
  expect(static_cast<std::int64_t>(h.size()) == p.hc * p.dim, who, "h", h.size(), p.hc * p.dim);
  expect(static_cast<std::int64_t>(h_new.size()) == p.hc * p.dim, who, "h_new", h_new.size(), p.hc * p.dim);
  expect(static_cast<std::int64_t>(post.size()) == p.hc, who, "post", post.size(), p.hc);
  expect(static_cast<std::int64_t>(comb.size()) == p.hc * p.hc, who, "comb", comb.size(), p.hc * p.hc);
  for (std::int64_t j = 0; j < p.hc; ++j) {
    for (std::int64_t k = 0; k < p.dim; ++k) {
      float mixed = 0.0f;
      for (std::int64_t i = 0; i < p.hc; ++i) {
        mixed += comb[static_cast<std::size_t>(i * p.hc + j)] * h[static_cast<std::size_t>(i * p.dim + k)];
      }
      h_new[static_cast<std::size_t>(j * p.dim + k)] =
          round_to_bf16(post[static_cast<std::size_t>(j)] * out[static_cast<std::size_t>(k)] + mixed);
    }
  }
}

void hc_head(std::span<const float> h, std::span<const float> fn, std::span<const float> scale,
             std::span<const float> base, const HcParams& p, std::span<float> y) {
  check_params(p, "hc_head");
  expect(scale.size() == 1, "hc_head", "scale", scale.size(), 1);
  expect(static_cast<std::int64_t>(base.size()) == p.hc, "hc_head", "base", base.size(), p.hc);
  std::vector<float> mixes(static_cast<std::size_t>(p.hc));
  hc_mixes(h, fn, p, mixes);
  std::vector<float> pre(static_cast<std::size_t>(p.hc));
  for (std::size_t i = 0; i < pre.size(); ++i) pre[i] = sigmoid(mixes[i] * scale[0] + base[i]) + p.hc_eps;
  hc_weighted_sum(h, pre, p, y);
}

}  // namespace dsv4
