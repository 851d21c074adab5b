// Hyper-connections (src/cpu/hyper_connections.h) at V4-Flash's width: 4 streams of D = 4096.
// hc_pre: the 24 mixes (an fp32 [24, 4 x 4096] product), Sinkhorn (20 iterations on 4 x 4) and
// the weighted sum into the sub-layer input; hc_post: the 4 x 4 stream mix plus the sub-layer
// output. Per token, single-threaded (the executor runs tokens in parallel).
// FLOP/s: hc_pre 2 x 24 x 4D + 2 x 4D (Sinkhorn's 4 x 4 work left out); hc_post 2 x 5 x 4D.
// bytes/s: hc_pre the mixing matrix fn and h; hc_post h, the output and h_new.
#include <vector>

#include "cpu/hyper_connections.h"
#include "cpu_bench_util.h"

namespace dsv4::bench {
namespace {

constexpr std::int64_t kHc = 4, kDim = 4096, kMix = (2 + kHc) * kHc;

HcParams params() {
  HcParams p;
  p.hc = kHc;
  p.dim = kDim;
  return p;
}

void BM_hc_pre(benchmark::State& state) {
  const std::vector<float> h = random_values(kHc * kDim, 1);
  const std::vector<float> fn = random_values(kMix * kHc * kDim, 2, 0.01f, false);
  const std::vector<float> scale = {0.5f, 0.5f, 0.5f};
  const std::vector<float> base = random_values(kMix, 3, 0.1f, false);
  std::vector<float> y(kDim), post(kHc), comb(kHc * kHc);
  for (auto _ : state) {
    hc_pre(h, fn, scale, base, params(), y, post, comb);
    benchmark::DoNotOptimize(y.data());
  }
  set_rates(state, 2.0 * kMix * kHc * kDim + 2.0 * kHc * kDim, 4.0 * (kMix * kHc * kDim + kHc * kDim + kDim));
}
BENCHMARK(BM_hc_pre)->Name("hc_pre/streams:4/dim:4096")->Unit(benchmark::kMicrosecond);

void BM_hc_post(benchmark::State& state) {
  const std::vector<float> out = random_values(kDim, 1);
  const std::vector<float> h = random_values(kHc * kDim, 2);
  const std::vector<float> post = random_values(kHc, 3, 1.0f, false);
  const std::vector<float> comb = random_values(kHc * kHc, 4, 1.0f, false);
  std::vector<float> h_new(kHc * kDim);
  for (auto _ : state) {
    hc_post(out, h, post, comb, params(), h_new);
    benchmark::DoNotOptimize(h_new.data());
  }
  set_rates(state, 2.0 * (kHc + 1) * kHc * kDim, 4.0 * (2 * kHc * kDim + kDim));
}
BENCHMARK(BM_hc_post)->Name("hc_post/streams:4/dim:4096")->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace dsv4::bench
