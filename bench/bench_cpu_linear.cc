// The CPU linear layers (src/cpu/linear.h) at V4-Flash layer shapes: fp8, fp4 and bf16 weights
// (FP8-simulated or bf16 activations, blocked fp32 sums, bf16 output), the fp32 GEMM of the
// compressor projections, and the grouped wo_a; decode (1 row) and a small batch (32 rows); the
// kernels picked at run time (best: AVX2 where the CPU has it) and the baseline ones (SSE2).
//   bench_cpu_linear [--benchmark_filter=REGEX] [--benchmark_min_time=S] ...
// FLOP/s: 2 x rows x out x in. bytes/s: the packed weight (4 bytes a value, as the executor holds
// it), the activations read and the outputs written.
#include <fmt/format.h>

#include <map>
#include <string>
#include <vector>

#include "cpu/linear.h"
#include "cpu_bench_util.h"

namespace dsv4::bench {
namespace {

enum class Op { kLinear, kF32, kGrouped };

struct Shape {
  const char* name;
  Op op;
  WeightKind kind;
  std::int64_t out, in, groups;
};

// V4-Flash: D 4096, q_lora 1024, 64 heads of 512, o_groups 8 x o_lora 1024, experts 2048 wide.
const Shape kShapes[] = {
    {"wq_a", Op::kLinear, WeightKind::kFp8, 1024, 4096, 1},
    {"wq_b", Op::kLinear, WeightKind::kFp8, 64 * 512, 1024, 1},
    {"wo_a_grouped", Op::kGrouped, WeightKind::kBf16, 8 * 1024, 64 * 512 / 8, 8},
    {"wo_b", Op::kLinear, WeightKind::kFp8, 4096, 8 * 1024, 1},
    {"expert_w1", Op::kLinear, WeightKind::kFp4, 2048, 4096, 1},
    {"shared_w2", Op::kLinear, WeightKind::kBf16, 4096, 2048, 1},
    {"compressor_wkv", Op::kF32, WeightKind::kF32, 2 * 512, 4096, 1},
};

const DenseWeight& weight_of(const Shape& s) {
  static std::map<std::string, DenseWeight> weights;
  auto it = weights.find(s.name);
  if (it == weights.end()) it = weights.emplace(s.name, random_weight(s.name, s.out, s.in, s.kind, 7)).first;
  return it->second;
}

void run(benchmark::State& state, const Shape& s, std::int64_t rows, GemmKernels kernels, std::int64_t threads) {
  const DenseWeight& w = weight_of(s);
  const std::int64_t x_in = s.in * s.groups;
  const std::vector<float> x = random_values(static_cast<std::size_t>(rows * x_in), 11, 2.0f, false);
  std::vector<float> y(static_cast<std::size_t>(rows * s.out));
  ThreadPool* pool = pool_for(threads);
  for (auto _ : state) {
    switch (s.op) {
      case Op::kLinear: linear(x, rows, w, y, pool, kernels); break;
      case Op::kF32: linear_f32(x, rows, w, y, pool, kernels); break;
      case Op::kGrouped: linear_grouped_bf16(x, rows, w, s.groups, y, pool, kernels); break;
    }
    benchmark::DoNotOptimize(y.data());
  }
  const double weight_bytes = 4.0 * static_cast<double>(w.packed.size());
  set_rates(state, 2.0 * static_cast<double>(rows * s.out * s.in),
            weight_bytes + 4.0 * static_cast<double>(rows * (x_in + s.out)));
}

const bool registered = [] {
  for (const Shape& s : kShapes) {
    for (std::int64_t rows : {1, 32}) {
      for (GemmKernels kernels : {GemmKernels::kBest, GemmKernels::kBaseline}) {
        for (std::int64_t threads : {1, 2}) {
          const std::string name =
              fmt::format("linear/{}_{}_{}x{}/rows:{}/{}/threads:{}", s.name, weight_kind_name(s.kind), s.out, s.in,
                          rows, kernels == GemmKernels::kBest ? "best" : "baseline", threads);
          benchmark::RegisterBenchmark(
              name.c_str(),
              [&s, rows, kernels, threads](benchmark::State& state) { run(state, s, rows, kernels, threads); })
              ->Unit(benchmark::kMicrosecond)
              ->UseRealTime();
        }
      }
    }
  }
  return true;
}();

}  // namespace
}  // namespace dsv4::bench
