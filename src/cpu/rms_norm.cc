#include "cpu/rms_norm.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "cpu/linear.h"
#include "numerics/bf16.h"

namespace dsv4 {

void rms_norm(std::span<const float> x, std::int64_t rows, std::span<const float> weight, float eps,
              std::span<float> out) {
  const auto n = static_cast<std::int64_t>(weight.size());
  if (n == 0 || rows < 0 || static_cast<std::int64_t>(x.size()) != rows * n || out.size() != x.size()) {
    throw std::invalid_argument(fmt::format("rms_norm: {} rows of {} values need x and out of {} values, got {} and {}",
                                            rows, n, rows * n, x.size(), out.size()));
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data() + r * n;
    float* yr = out.data() + r * n;
    // Blocked order (blocked_dot): the GPU's RMSNorm adds in exactly this order.
    const float sum = blocked_dot(xr, xr, n, kActQuantBlock);
    const float ms = sum / static_cast<float>(n);
    const float inv = 1.0f / std::sqrt(ms + eps);
    for (std::int64_t k = 0; k < n; ++k) yr[k] = round_to_bf16(weight[static_cast<std::size_t>(k)] * (xr[k] * inv));
  }
}

void head_rms_norm_bf16(std::span<float> q, std::int64_t head_dim, float eps) {
  if (head_dim <= 0 || q.size() % static_cast<std::size_t>(head_dim) != 0) {
    throw std::invalid_argument(
        fmt::format("head_rms_norm_bf16: {} values are not whole heads of {}", q.size(), head_dim));
  }
  for (std::size_t h = 0; h < q.size(); h += static_cast<std::size_t>(head_dim)) {
    float* qh = q.data() + h;
    // Blocked order as blocked_dot (blocks of 128 left to right): the GPU adds in exactly this order.
    float sum = 0.0f;
    for (std::int64_t start = 0; start < head_dim; start += kActQuantBlock) {
      float part = 0.0f;
      for (std::int64_t k = start; k < std::min(head_dim, start + kActQuantBlock); ++k) part += round_to_bf16(qh[k] * qh[k]);
      sum += part;
    }
    const float mean = round_to_bf16(sum / static_cast<float>(head_dim));
    const float a = round_to_bf16(mean + eps);
    const float r = round_to_bf16(1.0f / std::sqrt(a));
    for (std::int64_t k = 0; k < head_dim; ++k) qh[k] = round_to_bf16(qh[k] * r);
  }
}

}  // namespace dsv4
