// The MoE layer for one token (src/cpu/moe.h) at V4-Flash's sizes: D = 4096, experts 2048 wide,
// the gate over 256 experts, then 6 routed FP4 experts and the shared FP8 one (each: w1 and w3
// [2048, 4096], clamped SwiGLU, w2 [4096, 2048]). The routed slots all use one expert's weights
// (each far larger than the caches, so every route reads its weights from memory as distinct
// experts would); decode is memory-bound.
// FLOP/s: 2 x 3 x D x I per expert (gate: 2 x 256 x D). bytes/s: the packed weights read.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "cpu/moe.h"
#include "cpu_bench_util.h"

namespace dsv4::bench {
namespace {

constexpr std::int64_t kDim = 4096, kInter = 2048, kExperts = 256, kTopK = 6;

struct Expert {
  DenseWeight w1, w2, w3;
  ExpertWeights view() const { return {&w1, &w2, &w3}; }
};

const Expert& expert(WeightKind kind) {
  static const Expert fp4{random_weight("w1", kInter, kDim, WeightKind::kFp4, 1),
                          random_weight("w2", kDim, kInter, WeightKind::kFp4, 2),
                          random_weight("w3", kInter, kDim, WeightKind::kFp4, 3)};
  static const Expert fp8{random_weight("w1", kInter, kDim, WeightKind::kFp8, 4),
                          random_weight("w2", kDim, kInter, WeightKind::kFp8, 5),
                          random_weight("w3", kInter, kDim, WeightKind::kFp8, 6)};
  return kind == WeightKind::kFp4 ? fp4 : fp8;
}

double expert_bytes(const Expert& e) {
  return 4.0 * static_cast<double>(e.w1.packed.size() + e.w2.packed.size() + e.w3.packed.size());
}

void run_moe(benchmark::State& state, std::int64_t threads) {
  const Expert& routed = expert(WeightKind::kFp4);
  const Expert& shared = expert(WeightKind::kFp8);
  const std::vector<ExpertWeights> experts(kExperts, routed.view());
  MoeParams params;
  params.n_routed_experts = kExperts;
  params.top_k = kTopK;
  params.routed_scaling_factor = 1.5f;
  params.swiglu_limit = 10.0f;
  MoeRouting routing;
  for (std::int64_t e = 0; e < kTopK; ++e) {
    routing.experts.push_back(e * 37);
    routing.weights.push_back(1.0f / kTopK);
  }
  const std::vector<float> x = random_values(kDim, 7);
  std::vector<float> out(kDim);
  ThreadPool* pool = pool_for(threads);
  for (auto _ : state) {
    moe_forward(x, routing, experts, shared.view(), params, out, pool);
    benchmark::DoNotOptimize(out.data());
  }
  set_rates(state, 2.0 * 3.0 * (kTopK + 1) * kDim * kInter, (kTopK + 1) * expert_bytes(routed));
}

void run_gate(benchmark::State& state) {
  const DenseWeight gate = random_weight("gate", kExperts, kDim, WeightKind::kF32, 8);
  const std::vector<float> x = random_values(kDim, 9);
  std::vector<float> scores(kExperts);
  for (auto _ : state) {
    moe_gate_scores(x, gate, scores);
    benchmark::DoNotOptimize(scores.data());
  }
  set_rates(state, 2.0 * kExperts * kDim, 4.0 * static_cast<double>(gate.packed.size() + kDim));
}

const bool registered = [] {
  for (std::int64_t threads : {1, 2}) {
    benchmark::RegisterBenchmark(fmt::format("moe_forward/6_fp4+shared_fp8/4096x2048/threads:{}", threads).c_str(),
                                 [threads](benchmark::State& state) { run_moe(state, threads); })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  benchmark::RegisterBenchmark("moe_gate_scores/experts:256/dim:4096", run_gate)->Unit(benchmark::kMicrosecond);
  return true;
}();

}  // namespace
}  // namespace dsv4::bench
