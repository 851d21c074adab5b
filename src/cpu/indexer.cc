#include "cpu/indexer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "cpu/compressor.h"
#include "cpu/linear.h"
#include "cpu/rope_bf16.h"
#include "numerics/bf16.h"
#include "numerics/block_quant.h"
#include "numerics/hadamard.h"

namespace dsv4 {
namespace {

void check_params(const IndexerParams& p, const char* who) {
  if (p.n_heads <= 0 || p.head_dim <= 0 || p.rope_dim <= 0 || p.rope_dim > p.head_dim ||
      p.head_dim % kIndexerFp4Block != 0) {
    throw std::invalid_argument(
        fmt::format("{}: bad params n_heads {} head_dim {} rope_dim {}", who, p.n_heads, p.head_dim, p.rope_dim));
  }
}

void expect(bool ok, const char* who, const char* what, std::size_t got, std::int64_t want) {
  if (!ok) throw std::invalid_argument(fmt::format("{}: {} has {} values, expected {}", who, what, got, want));
}

}  // namespace

void indexer_query(std::span<const float> qr, std::int64_t rows, std::span<const std::int64_t> positions,
                   const DenseWeight& wq_b, const RopeTable& rope, const IndexerParams& p, std::span<float> q,
                   ThreadPool* pool) {
  const char* who = "indexer_query";
  check_params(p, who);
  const std::int64_t width = p.n_heads * p.head_dim;
  if (wq_b.out != width) {
    throw std::invalid_argument(
        fmt::format("{}: wq_b '{}' has {} outputs, expected {}", who, wq_b.name, wq_b.out, width));
  }
  if (rope.rope_dim() != p.rope_dim) {
    throw std::invalid_argument(
        fmt::format("{}: rope table of {} dims for rope_dim {}", who, rope.rope_dim(), p.rope_dim));
  }
  expect(static_cast<std::int64_t>(positions.size()) == rows, who, "positions", positions.size(), rows);
  linear(qr, rows, wq_b, q, pool);  // checks qr and q sizes
  for (std::int64_t r = 0; r < rows; ++r) {
    std::span<float> qrow = q.subspan(static_cast<std::size_t>(r * width), static_cast<std::size_t>(width));
    rope_heads_bf16(qrow, p.head_dim, rope, positions[static_cast<std::size_t>(r)]);
    for (std::int64_t h = 0; h < p.n_heads; ++h) {
      std::span<float> head =
          qrow.subspan(static_cast<std::size_t>(h * p.head_dim), static_cast<std::size_t>(p.head_dim));
      hadamard_transform(head);
      for (float& v : head) v = round_to_bf16(v);
      simulate_quant_blocks(head, kIndexerFp4Block, QuantFormat::kFp4E2m1);
    }
  }
}

float indexer_weight_scale(const IndexerParams& p) {
  return static_cast<float>(std::pow(static_cast<double>(p.head_dim), -0.5) *
                            std::pow(static_cast<double>(p.n_heads), -0.5));
}

void indexer_weights(std::span<const float> x, std::int64_t rows, const DenseWeight& weights_proj,
                     const IndexerParams& p, std::span<float> w, ThreadPool* pool) {
  check_params(p, "indexer_weights");
  if (weights_proj.out != p.n_heads) {
    throw std::invalid_argument(fmt::format("indexer_weights: weights_proj '{}' has {} outputs, expected {}",
                                            weights_proj.name, weights_proj.out, p.n_heads));
  }
  linear_bf16(x, rows, weights_proj, w, pool);
  const float scale = indexer_weight_scale(p);
  for (float& v : w) v = round_to_bf16(v * scale);
}

void indexer_scores(std::span<const float> q, std::span<const float> w, std::span<const float> keys,
                    const IndexerParams& p, std::span<float> scores, ThreadPool* pool) {
  const char* who = "indexer_scores";
  check_params(p, who);
  const std::int64_t hd = p.head_dim;
  const auto n_keys = static_cast<std::int64_t>(scores.size());
  expect(static_cast<std::int64_t>(q.size()) == p.n_heads * hd, who, "q", q.size(), p.n_heads * hd);
  expect(static_cast<std::int64_t>(w.size()) == p.n_heads, who, "w", w.size(), p.n_heads);
  expect(static_cast<std::int64_t>(keys.size()) == n_keys * hd, who, "keys", keys.size(), n_keys * hd);
  parallel_for(pool, 0, n_keys, [&](std::int64_t j) {
    const float* k = keys.data() + j * hd;
    float total = 0.0f;
    for (std::int64_t h = 0; h < p.n_heads; ++h) {
      const float* qh = q.data() + h * hd;
      float dot = 0.0f;
      for (std::int64_t c = 0; c < hd; ++c) dot += qh[c] * k[c];
      const float relu = std::max(round_to_bf16(dot), 0.0f);
      total += round_to_bf16(relu * w[static_cast<std::size_t>(h)]);
    }
    scores[static_cast<std::size_t>(j)] = round_to_bf16(total);
  });
}

std::vector<std::int64_t> top_k_indices(std::span<const float> scores, std::int64_t k) {
  if (k < 0) throw std::invalid_argument(fmt::format("top_k_indices: negative k {}", k));
  const auto n = static_cast<std::int64_t>(scores.size());
  const std::int64_t take = std::min(k, n);
  std::vector<std::int64_t> idx(static_cast<std::size_t>(n));
  std::iota(idx.begin(), idx.end(), std::int64_t{0});
  const auto key = [&](std::int64_t i) {
    const float s = scores[static_cast<std::size_t>(i)];
    return std::isnan(s) ? -INFINITY : s;
  };
  const auto better = [&](std::int64_t a, std::int64_t b) {
    const float ka = key(a), kb = key(b);
    return ka > kb || (ka == kb && a < b);
  };
  std::partial_sort(idx.begin(), idx.begin() + take, idx.end(), better);
  idx.resize(static_cast<std::size_t>(take));
  return idx;
}

}  // namespace dsv4
