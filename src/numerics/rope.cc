#include "numerics/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

#include <fmt/format.h>

namespace dsv4 {
namespace {

void check_params(const RopeParams& p, bool need_yarn) {
  if (p.rope_dim <= 0 || p.rope_dim % 2 != 0) {
    throw std::invalid_argument(fmt::format("rope: rope_dim must be positive and even, got {}", p.rope_dim));
  }
  if (!(p.base > 1.0) || !std::isfinite(p.base)) {
    throw std::invalid_argument(fmt::format("rope: base must be > 1, got {}", p.base));
  }
  if (!need_yarn) return;
  if (!(p.factor > 0.0) || !std::isfinite(p.factor)) {
    throw std::invalid_argument(fmt::format("rope: yarn factor must be > 0, got {}", p.factor));
  }
  if (!(p.original_max_position > 0.0) || !std::isfinite(p.original_max_position)) {
    throw std::invalid_argument(fmt::format(
        "rope: yarn original_max_position must be > 0, got {}", p.original_max_position));
  }
  if (!(p.beta_fast > 0.0) || !(p.beta_slow > 0.0)) {
    throw std::invalid_argument(fmt::format(
        "rope: yarn betas must be > 0, got beta_fast {} and beta_slow {}", p.beta_fast, p.beta_slow));
  }
}

// The dimension index at which a frequency completes `rotations` turns over L0 positions.
double correction_dim(double rotations, const RopeParams& p) {
  return p.rope_dim * std::log(p.original_max_position / (rotations * 2.0 * std::numbers::pi)) /
         (2.0 * std::log(p.base));
}

}  // namespace

YarnRange yarn_correction_range(const RopeParams& params) {
  check_params(params, /*need_yarn=*/true);
  const double low = std::floor(correction_dim(params.beta_fast, params));
  const double high = std::ceil(correction_dim(params.beta_slow, params));
  // The reference clamps low from below and high from above only.
  return YarnRange{static_cast<int>(std::max(low, 0.0)),
                   static_cast<int>(std::min(high, static_cast<double>(params.rope_dim - 1)))};
}

RopeTable::RopeTable(const RopeParams& params) : rope_dim_(params.rope_dim) {
  check_params(params, params.yarn);
  const int half = rope_dim_ / 2;
  inv_freq_.resize(static_cast<std::size_t>(half));
  // fp32, as the reference: 1.0 / (base ** (arange(0, dim, 2, float32) / dim)). The power is
  // taken in double and rounded once (torch's fp32 pow is within an ulp of that).
  const float base_f = static_cast<float>(params.base);
  for (int i = 0; i < half; ++i) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(rope_dim_);
    const float denom = static_cast<float>(std::pow(static_cast<double>(base_f), static_cast<double>(expo)));
    inv_freq_[static_cast<std::size_t>(i)] = 1.0f / denom;
  }
  if (!params.yarn) return;

  const YarnRange range = yarn_correction_range(params);
  double high = range.high;
  if (range.low == range.high) high += 0.001;  // as the reference's linear_ramp_factor
  const float span = static_cast<float>(high - range.low);
  const float low_f = static_cast<float>(range.low);
  const float factor = static_cast<float>(params.factor);
  for (int i = 0; i < half; ++i) {
    const float ramp = std::clamp((static_cast<float>(i) - low_f) / span, 0.0f, 1.0f);
    // Reference order of fp32 operations: smooth = 1 - ramp;
    // freq = freq / factor * (1 - smooth) + freq * smooth.
    const float smooth = 1.0f - ramp;
    const float f = inv_freq_[static_cast<std::size_t>(i)];
    const float scaled = f / factor * (1.0f - smooth);
    const float kept = f * smooth;
    inv_freq_[static_cast<std::size_t>(i)] = scaled + kept;
  }
}

void RopeTable::cos_sin(std::int64_t position, std::span<float> cos, std::span<float> sin) const {
  const std::size_t half = inv_freq_.size();
  if (cos.size() != half || sin.size() != half) {
    throw std::invalid_argument(fmt::format("RopeTable::cos_sin: need {} cos and sin values, got {} and {}",
                                            half, cos.size(), sin.size()));
  }
  if (position < 0) {
    throw std::invalid_argument(fmt::format("RopeTable: negative position {}", position));
  }
  const float pos = static_cast<float>(position);
  for (std::size_t i = 0; i < half; ++i) {
    const float angle = pos * inv_freq_[i];  // fp32 product, like torch.outer on fp32
    cos[i] = std::cos(angle);
    sin[i] = std::sin(angle);
  }
}

namespace {

void rotate_pairs(float* x, const float* c, const float* s, std::size_t half, bool inverse) {
  for (std::size_t i = 0; i < half; ++i) {
    const float a = x[2 * i];
    const float b = x[2 * i + 1];
    if (!inverse) {  // (a + bi)(c + si)
      x[2 * i] = a * c[i] - b * s[i];
      x[2 * i + 1] = a * s[i] + b * c[i];
    } else {  // (a + bi)(c - si)
      x[2 * i] = a * c[i] + b * s[i];
      x[2 * i + 1] = b * c[i] - a * s[i];
    }
  }
}

}  // namespace

void RopeTable::apply(std::span<float> x, std::int64_t position, bool inverse) const {
  if (x.size() != static_cast<std::size_t>(rope_dim_)) {
    throw std::invalid_argument(fmt::format("RopeTable::apply: expected {} values (the rope slice), got {}",
                                            rope_dim_, x.size()));
  }
  apply_heads(x, x.size(), position, inverse);
}

void RopeTable::apply_heads(std::span<float> x, std::size_t head_dim, std::int64_t position,
                            bool inverse) const {
  const auto rd = static_cast<std::size_t>(rope_dim_);
  if (head_dim < rd || x.size() % head_dim != 0) {
    throw std::invalid_argument(fmt::format(
        "RopeTable::apply_heads: head_dim {} must be >= rope_dim {} and divide the size {}",
        head_dim, rd, x.size()));
  }
  const std::size_t half = rd / 2;
  // rope_dim is at most a few hundred in practice; keep the table on the stack when it fits.
  float buf[2 * 256];
  std::vector<float> heap;
  float* cs = buf;
  if (half > 256) {
    heap.resize(2 * half);
    cs = heap.data();
  }
  cos_sin(position, std::span<float>(cs, half), std::span<float>(cs + half, half));
  for (std::size_t h = 0; h < x.size() / head_dim; ++h) {
    rotate_pairs(x.data() + h * head_dim + head_dim - rd, cs, cs + half, half, inverse);
  }
}

}  // namespace dsv4
