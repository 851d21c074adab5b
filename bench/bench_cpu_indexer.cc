// The lightning indexer (src/cpu/indexer.h) for one query at V4-Flash's sizes: 64 heads of 128,
// scores over the compressed keys of 4K, 64K and 1M tokens of context (1024, 16384, 262144
// keys at ratio 4), then the top-512 selection over them.
// FLOP/s: scores 2 x heads x head_dim x keys (+ the per-head weights); top-k: none counted.
// bytes/s: the keys read and the scores written; top-k the scores read.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "cpu/indexer.h"
#include "cpu_bench_util.h"

namespace dsv4::bench {
namespace {

const IndexerParams kParams;  // the defaults are V4-Flash's: 64 heads of 128 (64 rope dims), top-512

void run_scores(benchmark::State& state, std::int64_t keys, std::int64_t threads) {
  const IndexerParams& p = kParams;
  const std::vector<float> q = random_values(static_cast<std::size_t>(p.n_heads * p.head_dim), 1);
  const std::vector<float> w = random_values(static_cast<std::size_t>(p.n_heads), 2);
  const std::vector<float> k = random_values(static_cast<std::size_t>(keys * p.head_dim), 3);
  std::vector<float> scores(static_cast<std::size_t>(keys));
  ThreadPool* pool = pool_for(threads);
  for (auto _ : state) {
    indexer_scores(q, w, k, p, scores, pool);
    benchmark::DoNotOptimize(scores.data());
  }
  set_rates(state, 2.0 * static_cast<double>(p.n_heads * (p.head_dim + 1) * keys),
            4.0 * static_cast<double>(keys * (p.head_dim + 1)));
}

void run_top_k(benchmark::State& state, std::int64_t keys) {
  const std::vector<float> scores = random_values(static_cast<std::size_t>(keys), 4, 10.0f, false);
  for (auto _ : state) {
    std::vector<std::int64_t> picked = top_k_indices(scores, kParams.topk);
    benchmark::DoNotOptimize(picked.data());
  }
  set_rates(state, 0.0, 4.0 * static_cast<double>(keys));
}

const bool registered = [] {
  for (std::int64_t keys : {1024, 16384, 262144}) {
    for (std::int64_t threads : {1, 2}) {
      benchmark::RegisterBenchmark(fmt::format("indexer_scores/heads:64x128/keys:{}/threads:{}", keys, threads).c_str(),
                                   [keys, threads](benchmark::State& state) { run_scores(state, keys, threads); })
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
    }
    benchmark::RegisterBenchmark(fmt::format("indexer_top_k/k:512/keys:{}", keys).c_str(),
                                 [keys](benchmark::State& state) { run_top_k(state, keys); })
        ->Unit(benchmark::kMicrosecond);
  }
  return true;
}();

}  // namespace
}  // namespace dsv4::bench
