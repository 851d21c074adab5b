// The sink attention of one query token (src/cpu/sink_attention.h) at V4-Flash's 64 heads of
// 512: one shared kv vector per key, all heads in one softmax with the per-head sink. Key
// counts: the 128-token window alone, window + CSA's top-512 compressed entries (640), and
// window + an HCA layer's 128x-compressed history of 1M tokens (128 + 8192).
// FLOP/s: 4 x heads x keys x head_dim (q.k and p.v). bytes/s: the keys, q and the output.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "cpu/sink_attention.h"
#include "cpu_bench_util.h"

namespace dsv4::bench {
namespace {

constexpr std::int64_t kHeads = 64, kHeadDim = 512;

void run(benchmark::State& state, std::int64_t keys, std::int64_t threads) {
  const std::vector<float> q = random_values(static_cast<std::size_t>(kHeads * kHeadDim), 1);
  const std::vector<float> kv = random_values(static_cast<std::size_t>(keys * kHeadDim), 2);
  const std::vector<float> sink = random_values(static_cast<std::size_t>(kHeads), 3);
  std::vector<float> out(q.size());
  const float scale = attention_softmax_scale(kHeadDim);
  ThreadPool* pool = pool_for(threads);
  for (auto _ : state) {
    sink_attention(q, kHeads, kHeadDim, kv, sink, scale, out, pool);
    benchmark::DoNotOptimize(out.data());
  }
  set_rates(state, 4.0 * static_cast<double>(kHeads * keys * kHeadDim),
            4.0 * static_cast<double>(keys * kHeadDim + 2 * kHeads * kHeadDim));
}

const bool registered = [] {
  for (std::int64_t keys : {128, 640, 128 + 8192}) {
    for (std::int64_t threads : {1, 2}) {
      benchmark::RegisterBenchmark(fmt::format("sink_attention/heads:64x512/keys:{}/threads:{}", keys, threads).c_str(),
                                   [keys, threads](benchmark::State& state) { run(state, keys, threads); })
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
    }
  }
  return true;
}();

}  // namespace
}  // namespace dsv4::bench
