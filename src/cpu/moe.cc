#include "cpu/moe.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "cpu/indexer.h"
#include "cpu/linear.h"
#include "numerics/bf16.h"
#include "numerics/exp_float.h"

namespace dsv4 {
namespace {

float softplus(float z) { return z > 20.0f ? z : std::log1p(exp_float(z)); }
float silu(float z) { return z / (1.0f + exp_float(-z)); }

MoeRouting weigh(std::span<const float> scores, std::vector<std::int64_t> experts, const MoeParams& p) {
  MoeRouting r;
  float sum = 0.0f;
  for (const std::int64_t e : experts) sum += scores[static_cast<std::size_t>(e)];
  for (const std::int64_t e : experts) {
    const float normalized = scores[static_cast<std::size_t>(e)] / sum;
    r.weights.push_back(normalized * p.routed_scaling_factor);
  }
  r.experts = std::move(experts);
  return r;
}

void check_scores(std::span<const float> scores, const MoeParams& p, const char* who) {
  if (p.n_routed_experts <= 0 || p.top_k <= 0 || p.top_k > p.n_routed_experts ||
      static_cast<std::int64_t>(scores.size()) != p.n_routed_experts) {
    throw std::invalid_argument(
        fmt::format("{}: {} scores for {} experts, top {}", who, scores.size(), p.n_routed_experts, p.top_k));
  }
}

void check_expert(const ExpertWeights& e, std::int64_t dim, const char* who) {
  if (e.w1 == nullptr || e.w2 == nullptr || e.w3 == nullptr)
    throw std::invalid_argument(fmt::format("{}: missing expert weight", who));
  const std::int64_t inter = e.w1->out;
  if (e.w1->in != dim || e.w3->in != dim || e.w3->out != inter || e.w2->in != inter || e.w2->out != dim) {
    throw std::invalid_argument(
        fmt::format("{}: expert weights '{}' [{}, {}], '{}' [{}, {}], '{}' [{}, {}] do not fit D = {}", who, e.w1->name,
                    e.w1->out, e.w1->in, e.w2->name, e.w2->out, e.w2->in, e.w3->name, e.w3->out, e.w3->in, dim));
  }
}

}  // namespace

void moe_gate_scores(std::span<const float> x, const DenseWeight& gate, std::span<float> scores, ThreadPool* pool) {
  linear_f32(x, 1, gate, scores, pool);
  for (float& s : scores) s = std::sqrt(softplus(s));
}

MoeRouting moe_route_scores(std::span<const float> scores, std::span<const float> bias, const MoeParams& p) {
  check_scores(scores, p, "moe_route_scores");
  if (bias.size() != scores.size()) {
    throw std::invalid_argument(
        fmt::format("moe_route_scores: {} bias values for {} experts", bias.size(), scores.size()));
  }
  std::vector<float> biased(scores.size());
  for (std::size_t e = 0; e < scores.size(); ++e) biased[e] = scores[e] + bias[e];
  return weigh(scores, top_k_indices(biased, p.top_k), p);
}

MoeRouting moe_route_hash(std::span<const float> scores, std::span<const std::int64_t> expert_ids, const MoeParams& p) {
  check_scores(scores, p, "moe_route_hash");
  if (static_cast<std::int64_t>(expert_ids.size()) != p.top_k) {
    throw std::invalid_argument(fmt::format("moe_route_hash: {} expert ids, expected {}", expert_ids.size(), p.top_k));
  }
  for (const std::int64_t e : expert_ids) {
    if (e < 0 || e >= p.n_routed_experts) {
      throw std::invalid_argument(fmt::format("moe_route_hash: expert id {} outside [0, {})", e, p.n_routed_experts));
    }
  }
  return weigh(scores, std::vector<std::int64_t>(expert_ids.begin(), expert_ids.end()), p);
}

void swiglu_clamped(std::span<const float> gate, std::span<const float> up, float limit, float route_weight,
                    std::span<float> h) {
  if (up.size() != gate.size() || h.size() != gate.size()) {
    throw std::invalid_argument(fmt::format("swiglu_clamped: sizes {}, {}, {}", gate.size(), up.size(), h.size()));
  }
  for (std::size_t i = 0; i < gate.size(); ++i) {
    float g = gate[i], u = up[i];
    if (limit > 0.0f) {
      g = std::min(g, limit);
      u = std::clamp(u, -limit, limit);
    }
    h[i] = route_weight * (silu(g) * u);
  }
}

void expert_forward(std::span<const float> x, const ExpertWeights& e, float route_weight, float swiglu_limit,
                    std::span<float> out, ThreadPool* pool) {
  check_expert(e, static_cast<std::int64_t>(x.size()), "expert_forward");
  const auto inter = static_cast<std::size_t>(e.w1->out);
  std::vector<float> g(inter), u(inter);
  linear(x, 1, *e.w1, g, pool);
  linear(x, 1, *e.w3, u, pool);
  swiglu_clamped(g, u, swiglu_limit, route_weight, g);
  for (float& v : g) v = round_to_bf16(v);
  linear(g, 1, *e.w2, out, pool);
}

void moe_forward(std::span<const float> x, const MoeRouting& routing, std::span<const ExpertWeights> experts,
                 const ExpertWeights& shared, const MoeParams& p, std::span<float> out, ThreadPool* pool) {
  const char* who = "moe_forward";
  if (static_cast<std::int64_t>(experts.size()) != p.n_routed_experts || out.size() != x.size() ||
      routing.experts.size() != routing.weights.size()) {
    throw std::invalid_argument(fmt::format("{}: {} experts for {}, out {} for x {}, routing {} / {}", who,
                                            experts.size(), p.n_routed_experts, out.size(), x.size(),
                                            routing.experts.size(), routing.weights.size()));
  }
  // Ascending expert id (the reference loops over experts); a repeated id keeps routing order.
  std::vector<std::size_t> order(routing.experts.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return routing.experts[a] < routing.experts[b]; });
  std::vector<float> acc(x.size(), 0.0f), y(x.size());
  for (const std::size_t k : order) {
    const std::int64_t e = routing.experts[k];
    if (e < 0 || e >= p.n_routed_experts) {
      throw std::invalid_argument(fmt::format("{}: expert id {} outside [0, {})", who, e, p.n_routed_experts));
    }
    expert_forward(x, experts[static_cast<std::size_t>(e)], routing.weights[k], p.swiglu_limit, y, pool);
    for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += y[i];
  }
  expert_forward(x, shared, 1.0f, p.swiglu_limit, y, pool);
  for (std::size_t i = 0; i < acc.size(); ++i) out[i] = round_to_bf16(acc[i] + y[i]);
}

}  // namespace dsv4
