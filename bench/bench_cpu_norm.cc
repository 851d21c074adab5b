// RMSNorm (src/cpu/rms_norm.h): the hidden-state norm over D = 4096 for 1 and 32 rows, and the
// per-head q norm over V4-Flash's 64 heads of 512 (bf16 in place).
// FLOP/s: 4 per value (square and add; scale and weight). bytes/s: the values read and written
// (and the weight).
#include <fmt/format.h>

#include <string>
#include <vector>

#include "cpu/rms_norm.h"
#include "cpu_bench_util.h"

namespace dsv4::bench {
namespace {

constexpr std::int64_t kDim = 4096;

void run_rms_norm(benchmark::State& state, std::int64_t rows) {
  const std::vector<float> x = random_values(static_cast<std::size_t>(rows * kDim), 1);
  const std::vector<float> weight = random_values(kDim, 2);
  std::vector<float> out(x.size());
  for (auto _ : state) {
    rms_norm(x, rows, weight, 1e-6f, out);
    benchmark::DoNotOptimize(out.data());
  }
  set_rates(state, 4.0 * static_cast<double>(rows * kDim), 4.0 * static_cast<double>(2 * rows * kDim + kDim));
}

void BM_head_rms_norm(benchmark::State& state) {
  constexpr std::int64_t kHeads = 64, kHeadDim = 512;
  const std::vector<float> q0 = random_values(kHeads * kHeadDim, 3);
  std::vector<float> q = q0;
  for (auto _ : state) {
    head_rms_norm_bf16(q, kHeadDim, 1e-6f);
    benchmark::DoNotOptimize(q.data());
  }
  set_rates(state, 4.0 * kHeads * kHeadDim, 4.0 * 2 * kHeads * kHeadDim);
}
BENCHMARK(BM_head_rms_norm)->Name("head_rms_norm_bf16/heads:64x512")->Unit(benchmark::kMicrosecond);

const bool registered = [] {
  for (std::int64_t rows : {1, 32}) {
    benchmark::RegisterBenchmark(fmt::format("rms_norm/dim:4096/rows:{}", rows).c_str(), [rows](
                                                                                             benchmark::State& state) {
      run_rms_norm(state, rows);
    })->Unit(benchmark::kMicrosecond);
  }
  return true;
}();

}  // namespace
}  // namespace dsv4::bench
