// Inputs, pools and counters for the CPU op benchmarks (cpu_bench_util.h).
#include "cpu_bench_util.h"

#include <map>
#include <memory>
#include <random>

#include "numerics/bf16.h"

namespace dsv4::bench {

std::vector<float> random_values(std::size_t n, std::uint64_t seed, float scale, bool bf16) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = bf16 ? round_to_bf16(u(rng)) : u(rng);
  return v;
}

DenseWeight random_weight(const std::string& name, std::int64_t out, std::int64_t in, WeightKind kind,
                          std::uint64_t seed) {
  // The CPU executor holds every weight kind as fp32 values (bf16 values for fp8 / fp4 / bf16
  // storage); the kind decides the activation rounding and the reduction block.
  return make_dense_weight(name, out, in, kind,
                           random_values(static_cast<std::size_t>(out * in), seed, 0.5f, kind != WeightKind::kF32));
}

ThreadPool* pool_for(std::int64_t threads) {
  static std::map<std::int64_t, std::unique_ptr<ThreadPool>> pools;
  if (threads <= 1) return nullptr;
  auto& pool = pools[threads];
  if (!pool) pool = std::make_unique<ThreadPool>(static_cast<int>(threads));
  return pool.get();
}

void set_rates(benchmark::State& state, double flop_per_iteration, double bytes_per_iteration) {
  state.counters["FLOP/s"] = benchmark::Counter(flop_per_iteration, benchmark::Counter::kIsIterationInvariantRate,
                                                benchmark::Counter::kIs1000);
  state.counters["bytes/s"] = benchmark::Counter(bytes_per_iteration, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1024);
}

}  // namespace dsv4::bench
