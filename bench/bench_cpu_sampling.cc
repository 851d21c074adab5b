// The sampler (src/engine/sampling.h) on one row of V4's vocabulary (129,280 logits) for each
// sampling mode: what the engine pays per sequence per decode step on the host. bytes/s: the
// logits read once.
#include <string>
#include <vector>

#include "cpu_bench_util.h"
#include "engine/sampling.h"

namespace dsv4::bench {
namespace {

constexpr std::int64_t kVocab = 129280;

// Logits uniform in [-spread, spread). At 3 a flatter row than a trained model's: the nucleus of
// top_p 0.9 holds a large share of the vocabulary (the costly case for top-p); at 12 a peaked one.
void run_sample(benchmark::State& state, const SamplingParams& params, float spread = 3.0f) {
  const std::vector<float> logits = random_values(kVocab, 5, spread, false);
  Sampler sampler;
  std::int64_t index = 0;
  for (auto _ : state) {
    const SampledToken t = sampler.sample(logits, params, 7, index++);
    benchmark::DoNotOptimize(t.token);
  }
  set_rates(state, 0.0, 4.0 * kVocab);
}

SamplingParams mode(double temperature, double top_p, std::int64_t top_k, bool logprobs) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_p = top_p;
  p.top_k = top_k;
  if (logprobs) p.logprobs = 5;
  return p;
}

void BM_greedy(benchmark::State& s) { run_sample(s, mode(0, 1, 0, false)); }
void BM_temperature(benchmark::State& s) { run_sample(s, mode(0.7, 1, 0, false)); }
void BM_top_p(benchmark::State& s) { run_sample(s, mode(0.7, 0.9, 0, false)); }
void BM_top_p_peaked(benchmark::State& s) { run_sample(s, mode(0.7, 0.9, 0, false), 12.0f); }
void BM_top_k(benchmark::State& s) { run_sample(s, mode(0.7, 1, 50, false)); }
void BM_greedy_logprobs(benchmark::State& s) { run_sample(s, mode(0, 1, 0, true)); }
BENCHMARK(BM_greedy)->Name("sample/vocab:129280/greedy")->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_temperature)->Name("sample/vocab:129280/temperature:0.7")->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_top_p)->Name("sample/vocab:129280/temperature:0.7,top_p:0.9")->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_top_p_peaked)->Name("sample/vocab:129280/temperature:0.7,top_p:0.9,peaked")->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_top_k)->Name("sample/vocab:129280/temperature:0.7,top_k:50")->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_greedy_logprobs)->Name("sample/vocab:129280/greedy,logprobs:5")->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace dsv4::bench
