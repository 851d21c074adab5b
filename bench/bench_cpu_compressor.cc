// The KV compressor (src/cpu/compressor.h) at V4-Flash's sizes (D = 4096): the per-token
// projections (two fp32 GEMMs, wkv and wgate, plus the position bias) for a CSA layer (ratio 4,
// head 512, overlapping: 2 x 512 outputs each), an HCA layer (ratio 128, 512) and the indexer's
// compressor (ratio 4, head 128); and one compressed entry (softmax pooling over the ring, then
// norm, RoPE and the FP8 or Hadamard + FP4 simulation).
// FLOP/s: projections 2 x 2 x rows x D x proj; entries 4 x slots x head (the pooling's
// multiply-adds and exponentials as 2 each). bytes/s: the weights, x and the slots written;
// entries the ring slots read.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "cpu/compressor.h"
#include "cpu_bench_util.h"

namespace dsv4::bench {
namespace {

constexpr std::int64_t kDim = 4096;

struct Kind {
  const char* name;
  CompressorParams params;
};

CompressorParams params_of(std::int64_t ratio, std::int64_t head_dim, CompressorKind kind) {
  CompressorParams p;
  p.ratio = ratio;
  p.head_dim = head_dim;
  p.kind = kind;
  return p;
}

const Kind kKinds[] = {
    {"csa", params_of(4, 512, CompressorKind::kAttention)},
    {"hca", params_of(128, 512, CompressorKind::kAttention)},
    {"indexer", params_of(4, 128, CompressorKind::kIndexer)},
};

void run_project(benchmark::State& state, const Kind& k, std::int64_t rows, std::int64_t threads) {
  const CompressorParams& p = k.params;
  const DenseWeight wkv = random_weight("wkv", p.proj_dim(), kDim, WeightKind::kF32, 1);
  const DenseWeight wgate = random_weight("wgate", p.proj_dim(), kDim, WeightKind::kF32, 2);
  const std::vector<float> ape = random_values(static_cast<std::size_t>(p.ratio * p.proj_dim()), 3, 0.1f, false);
  const std::vector<float> x = random_values(static_cast<std::size_t>(rows * kDim), 4);
  std::vector<std::int64_t> positions(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) positions[static_cast<std::size_t>(r)] = 1000 + r;
  std::vector<float> slots(static_cast<std::size_t>(rows * p.slot_floats()));
  ThreadPool* pool = pool_for(threads);
  for (auto _ : state) {
    compressor_project(x, rows, positions, wkv, wgate, ape, p, slots, pool);
    benchmark::DoNotOptimize(slots.data());
  }
  const double weights = 4.0 * static_cast<double>(wkv.packed.size() + wgate.packed.size());
  set_rates(state, 4.0 * static_cast<double>(rows * kDim * p.proj_dim()),
            weights + 4.0 * static_cast<double>(rows * (kDim + p.slot_floats())));
}

void run_entry(benchmark::State& state, const Kind& k) {
  const CompressorParams& p = k.params;
  const std::vector<float> ring = random_values(static_cast<std::size_t>(p.ring_floats()), 5, 1.0f, false);
  const std::vector<float> norm = random_values(static_cast<std::size_t>(p.head_dim), 6);
  RopeParams rp;
  rp.rope_dim = static_cast<int>(p.rope_dim);
  rp.yarn = true;
  rp.factor = 16;
  rp.original_max_position = 65536;
  const RopeTable rope(rp);
  std::vector<float> entry(static_cast<std::size_t>(p.head_dim));
  for (auto _ : state) {
    compressor_entry(ring, 7, norm, rope, p, entry);
    benchmark::DoNotOptimize(entry.data());
  }
  const double pooled = static_cast<double>(p.num_slots() * p.head_dim);
  set_rates(state, 4.0 * pooled, 4.0 * 2.0 * pooled);
}

const bool registered = [] {
  for (const Kind& k : kKinds) {
    for (std::int64_t rows : {1, 32}) {
      for (std::int64_t threads : {1, 2}) {
        benchmark::RegisterBenchmark(
            fmt::format("compressor_project/{}:ratio{}x{}/rows:{}/threads:{}", k.name, k.params.ratio,
                        k.params.head_dim, rows, threads)
                .c_str(),
            [&k, rows, threads](benchmark::State& state) { run_project(state, k, rows, threads); })
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
      }
    }
    benchmark::RegisterBenchmark(
        fmt::format("compressor_entry/{}:ratio{}x{}", k.name, k.params.ratio, k.params.head_dim).c_str(),
        [&k](benchmark::State& state) { run_entry(state, k); })
        ->Unit(benchmark::kMicrosecond);
  }
  return true;
}();

}  // namespace
}  // namespace dsv4::bench
