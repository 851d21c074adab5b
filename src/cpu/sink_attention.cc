#include "cpu/sink_attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "numerics/bf16.h"
#include "numerics/exp_float.h"

namespace dsv4 {

float attention_softmax_scale(std::int64_t head_dim) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

void sink_attention(std::span<const float> q, std::int64_t n_heads, std::int64_t head_dim,
                    std::span<const float* const> kv, std::span<const float> sink, float scale, std::span<float> out,
                    ThreadPool* pool) {
  if (n_heads <= 0 || head_dim <= 0 || static_cast<std::int64_t>(q.size()) != n_heads * head_dim ||
      out.size() != q.size() || static_cast<std::int64_t>(sink.size()) != n_heads) {
    throw std::invalid_argument(
        fmt::format("sink_attention: {} heads of {} need q and out of {} values and {} sinks, got {}, {} and {}",
                    n_heads, head_dim, n_heads * head_dim, n_heads, q.size(), out.size(), sink.size()));
  }
  for (const float* k : kv) {
    if (k == nullptr) throw std::invalid_argument("sink_attention: null key pointer");
  }
  const std::size_t n_keys = kv.size();
  const auto d = static_cast<std::size_t>(head_dim);
  parallel_for(pool, 0, n_heads, [&](std::int64_t h) {
    const float* qh = q.data() + static_cast<std::size_t>(h) * d;
    float* oh = out.data() + static_cast<std::size_t>(h) * d;
    if (n_keys == 0) {
      for (std::size_t c = 0; c < d; ++c) oh[c] = 0.0f;
      return;
    }
    std::vector<float> acc(d, 0.0f);
    float m = -INFINITY, sum = 0.0f;
    const auto block = static_cast<std::size_t>(kAttentionKeyBlock);
    std::vector<float> s(block);
    for (std::size_t b0 = 0; b0 < n_keys; b0 += block) {
      const std::size_t b1 = std::min(n_keys, b0 + block);
      float block_max = -INFINITY;
      for (std::size_t i = b0; i < b1; ++i) {
        float dot = 0.0f;
        for (std::size_t c = 0; c < d; ++c) dot += qh[c] * kv[i][c];
        s[i - b0] = dot * scale;
        block_max = std::max(block_max, s[i - b0]);
      }
      const float m_new = std::max(m, block_max);
      const float corr = m == -INFINITY ? 0.0f : exp_float(m - m_new);
      sum *= corr;
      for (std::size_t c = 0; c < d; ++c) acc[c] *= corr;
      for (std::size_t i = b0; i < b1; ++i) {
        const float p = exp_float(s[i - b0] - m_new);
        sum += p;
        const float pb = round_to_bf16(p);
        for (std::size_t c = 0; c < d; ++c) acc[c] += pb * kv[i][c];
      }
      m = m_new;
    }
    const float den = sum + exp_float(sink[static_cast<std::size_t>(h)] - m);
    for (std::size_t c = 0; c < d; ++c) oh[c] = round_to_bf16(acc[c] / den);
  });
}

void sink_attention(std::span<const float> q, std::int64_t n_heads, std::int64_t head_dim, std::span<const float> kv,
                    std::span<const float> sink, float scale, std::span<float> out, ThreadPool* pool) {
  if (head_dim <= 0 || kv.size() % static_cast<std::size_t>(head_dim) != 0) {
    throw std::invalid_argument(
        fmt::format("sink_attention: {} key values are not whole vectors of {}", kv.size(), head_dim));
  }
  std::vector<const float*> keys(kv.size() / static_cast<std::size_t>(head_dim));
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = kv.data() + i * static_cast<std::size_t>(head_dim);
  sink_attention(q, n_heads, head_dim, keys, sink, scale, out, pool);
}

}  // namespace dsv4
