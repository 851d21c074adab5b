// Routed-MoE layer benchmark at V4-Flash (256 experts, top 6, hidden 4096, expert width 2048) and
// V4-Pro (384, top 6, hidden 7168, width 3072) shapes with fp4 experts: the executor's routed path
// (cuda_executor.cc ffn_layer without hc_pre, the shared expert and hc_post) --
//   gate GEMM (bf16, fp32 logits; at decode its k split over CTAs into partials) -> moe_route
//   (score routing with a bias, adding the partials) -> moe_permute -> quantize_activations
//   -> gemm_quantized_experts (stacked w1|w3) -> swiglu_quantize
//   -> gemm_quantized_experts (w2) -> moe_combine
// -- per token count, against two ceilings measured in the same run: bytes over the HBM
// bandwidth of a large device-to-device copy, FLOPs over the e4m3 mma.sync peak (mma_peak.h).
//
//   bench_gpu_moe [--tokens 1,16,64,256,4096] [--reps N (timed runs, default 50)] [--shapes flash,pro]
//   (DSV4_EXPERTS_FP8=1 in the environment: the expert products on FP8 wgmma, gemm_experts_fp8.h)
//
// Routing is realistic: the activations and the gate weight are seeded random values (logits of
// standard deviation about 2) plus a small random bias, so tokens pick experts at random and the
// experts are hit unevenly. The experts hit are counted from the routing of the first run (every
// run routes the same way). Bytes = the gate weight + the experts hit (w1|w3 and w2 with their
// UE8M0 scales) + activations (x read, the output written, and each intermediate -- the w1|w3
// product, the quantized SwiGLU rows, the w2 product -- counted once); FLOPs = 2 * tokens * top_k
// * 3 * hidden * width (the two expert products; the gate's are left out). The expert-GEMM columns
// take the experts hit plus their own activations (quantized x and SwiGLU codes read, the two
// products written) over the two GEMMs' time, and the same FLOPs.
//
// Timing: `reps` runs captured back to back in one CUDA graph with an event recorded between runs
// (timing inside the graph: no host launch latency), the graph replayed once as warm-up and once
// timed; the median run is reported. Run r reads copy r mod copies of the weights (gate and
// experts; up to 8 copies within 100 GB): between two uses of a copy the other copies' reads pass
// far more than the 50 MB L2, so every run reads its weights from HBM as a model's layers do. A
// second graph of the same runs records events around the gate GEMM and the two expert GEMMs
// (their medians: the "gate" and "expert GEMMs" columns; the total comes from the first graph,
// which has no events inside a run). Expert weights are random e2m1 bytes with scale 2^0 (timing
// does not depend on the values; nothing overflows).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/device_step.h"
#include "cuda/kernels/fill.h"
#include "cuda/kernels/gemm.h"
#include "cuda/kernels/gemm_experts_fp8.h"
#include "cuda/kernels/moe.h"
#include "cuda/runtime.h"
#include "gpu_bench_util.h"
#include "mma_peak.h"

namespace dsv4 {
namespace {

using gpu::DeviceBuffer;
using gpu::GemmPath;
using gpu::WeightFormat;

using bench::median;
using bench::parse_list;

struct Shape {
  const char* key;   // --shapes name
  const char* name;  // table label
  std::int64_t experts, top_k, hidden, inter;
  float routed_scale, swiglu_limit;
};

// tests/fixtures/v4-flash and v4-pro config.json (fp4 experts).
const std::vector<Shape> kShapes = {
    {"flash", "V4-Flash", 256, 6, 4096, 2048, 1.5f, 10.0f},
    {"pro", "V4-Pro", 384, 6, 7168, 3072, 2.5f, 10.0f},
};

constexpr std::uint8_t kUe8m0One = 127;  // fp4 block scale 2^0
constexpr double kWeightBudget = 100e9;  // bytes of weight copies at most
constexpr int kMaxCopies = 8;
constexpr std::int64_t kMaxDecodeTokens = 512;  // the executor's largest decode graph bucket

// Bytes of one expert's weights (w1|w3 [2 * inter][hidden] and w2 [hidden][inter], packed e2m1
// with one UE8M0 byte per 32 values).
std::int64_t expert_bytes(const Shape& s) {
  const std::int64_t values = 3 * s.inter * s.hidden;
  return values / 2 + values / 32;
}

// One copy of the layer's routed weights: the gate and the stacked experts, laid out as
// gpu_weights.cc lays them out.
struct WeightCopy {
  DeviceBuffer gate, w13, s13, w2, s2;
  bool s13_normal = false, s2_normal = false;  // gemm.h fp4_scales_normal
};

// A plain step of `tokens` tokens on the device (ids and positions 0, rows 0..tokens-1): the MoE
// kernels read n_tokens (and token_ids on hash layers only).
struct StepOnDevice {
  DeviceBuffer ids, positions, rows, logits_tokens, step{sizeof(gpu::DeviceStep)};
  const gpu::DeviceStep* get() const { return step.as<gpu::DeviceStep>(); }
  const std::int32_t* n_tokens() const {
    return reinterpret_cast<const std::int32_t*>(static_cast<const std::uint8_t*>(step.data()) +
                                                 offsetof(gpu::DeviceStep, n_tokens));
  }
};

void make_step(StepOnDevice& s, std::int64_t tokens, gpu::Stream& stream) {
  const auto n = static_cast<std::size_t>(tokens);
  std::vector<std::int32_t> zeros(n, 0), rows(n);
  std::iota(rows.begin(), rows.end(), 0);
  s.ids = DeviceBuffer(n * 4);
  s.positions = DeviceBuffer(n * 4);
  s.rows = DeviceBuffer(n * 4);
  s.logits_tokens = DeviceBuffer(4);
  gpu::copy_to_device(s.ids.data(), zeros.data(), n * 4, stream);
  gpu::copy_to_device(s.positions.data(), zeros.data(), n * 4, stream);
  gpu::copy_to_device(s.rows.data(), rows.data(), n * 4, stream);
  gpu::DeviceStep host;
  host.n_tokens = static_cast<std::int32_t>(tokens);
  host.n_rows = host.n_tokens;
  host.n_logits = 0;
  host.n_groups = 0;
  host.token_ids = s.ids.as<std::int32_t>();
  host.positions = s.positions.as<std::int32_t>();
  host.token_row = s.rows.as<std::int32_t>();
  host.logits_tokens = s.logits_tokens.as<std::int32_t>();
  gpu::copy_to_device(s.step.data(), &host, sizeof host, stream);
  stream.synchronize();  // `host`, `zeros` and `rows` go out of scope
}

struct Result {
  double total_us = 0, gate_us = 0, gemm_us = 0;
};

void run_shape(const Shape& s, const std::vector<std::int64_t>& tokens_list, int reps, double bw, double peak_fp8) {
  const std::int64_t E = s.experts, K = s.top_k, D = s.hidden, I = s.inter;
  const std::int64_t max_tokens = *std::max_element(tokens_list.begin(), tokens_list.end());
  const std::int64_t max_pairs = max_tokens * K;
  std::int32_t max_tiles = 1;
  // (the bound for the shortest tiles, whatever height expert_tile_rows picks)
  for (std::int64_t t : tokens_list) max_tiles = std::max(max_tiles, gpu::moe_max_tiles(t, K, E, gpu::kSmallRows));
  gpu::Stream stream;
  const gpu_stream_t st = stream.handle();
  auto bytes = [](std::int64_t n) { return static_cast<std::size_t>(std::max<std::int64_t>(n, 1)); };

  // Activations and routing buffers, sized for the largest token count.
  DeviceBuffer x(bytes(max_tokens * D * 2)), logits(bytes(gpu::moe_gate_logit_floats(max_tokens, E) * 4)), bias(bytes(E * 4));
  DeviceBuffer route_e(bytes(max_pairs * 4)), route_w(bytes(max_pairs * 4));
  DeviceBuffer xq(bytes(max_tokens * D)), xs(bytes(max_tokens * ((D + 127) / 128) * 4));
  DeviceBuffer source_row(bytes(max_pairs * 4)), slot_of(bytes(max_pairs * 4)), slot_w(bytes(max_pairs * 4)),
      num_rows(4);
  DeviceBuffer tile_expert(bytes(max_tiles * 4)), tile_row0(bytes(max_tiles * 4)), tile_rows(bytes(max_tiles * 4)),
      num_tiles(4), expert_scratch(bytes(3 * E * 4));
  DeviceBuffer gu(bytes(max_pairs * 2 * I * 2)), hq(bytes(max_pairs * I)), hs(bytes(max_pairs * ((I + 127) / 128) * 4));
  DeviceBuffer y(bytes(max_pairs * D * 2)), y_shared(bytes(max_tokens * D * 2)), out(bytes(max_tokens * D * 2));
  // x uniform in [-1, 1) (variance 1/3) and the gate uniform in [-a, a) (variance a^2/3): logits of
  // variance D a^2 / 9, standard deviation 2 for a = 6 / sqrt(D).
  gpu::fill_uniform_bf16(x.as<std::uint16_t>(), max_tokens * D, 0x5eed0001, -1.0f, 1.0f, st);
  gpu::fill_uniform_f32(bias.as<float>(), E, 0x5eed0002, -0.1f, 0.1f, st);
  gpu::fill_bytes(y_shared.data(), 0, y_shared.size(), stream);  // the shared expert's output: 0
  const float gate_range = 6.0f / std::sqrt(static_cast<float>(D));

  // Weight copies: as many as fit (up to kMaxCopies) in kWeightBudget and in the free memory
  // less a margin; every copy's gate is the same (the same routing every run).
  const std::int64_t gate_bytes = E * D * 2;
  const std::int64_t copy_bytes = gate_bytes + E * expert_bytes(s);
  const gpu::DeviceInfo info = gpu::device_info();
  const double room = std::min(kWeightBudget, static_cast<double>(info.free_bytes) - 4.0 * (1 << 30));
  const int copies =
      static_cast<int>(std::clamp<double>(std::floor(room / static_cast<double>(copy_bytes)), 1, kMaxCopies));
  std::vector<WeightCopy> weights(static_cast<std::size_t>(copies));
  for (int c = 0; c < copies; ++c) {
    WeightCopy& w = weights[static_cast<std::size_t>(c)];
    w.gate = DeviceBuffer(static_cast<std::size_t>(gate_bytes));
    w.w13 = DeviceBuffer(static_cast<std::size_t>(E * 2 * I * D / 2));
    w.s13 = DeviceBuffer(static_cast<std::size_t>(E * 2 * I * D / 32));
    w.w2 = DeviceBuffer(static_cast<std::size_t>(E * D * I / 2));
    w.s2 = DeviceBuffer(static_cast<std::size_t>(E * D * I / 32));
    gpu::fill_uniform_bf16(w.gate.as<std::uint16_t>(), E * D, 0x5eed0003, -gate_range, gate_range, st);
    gpu::fill_fp4_bytes(w.w13.as<std::uint8_t>(), static_cast<std::int64_t>(w.w13.size()),
                        0x5eed0100 + static_cast<std::uint64_t>(c), st);
    gpu::fill_fp4_bytes(w.w2.as<std::uint8_t>(), static_cast<std::int64_t>(w.w2.size()),
                        0x5eed0200 + static_cast<std::uint64_t>(c), st);
    gpu::fill_const_u8(w.s13.as<std::uint8_t>(), static_cast<std::int64_t>(w.s13.size()), kUe8m0One, st);
    gpu::fill_const_u8(w.s2.as<std::uint8_t>(), static_cast<std::int64_t>(w.s2.size()), kUe8m0One, st);
    w.s13_normal = gpu::fp4_scales_normal(w.s13.data(), static_cast<std::int64_t>(w.s13.size()), stream);
    w.s2_normal = gpu::fp4_scales_normal(w.s2.data(), static_cast<std::int64_t>(w.s2.size()), stream);
  }
  stream.synchronize();
  fmt::print("{} (E {}, top {}, hidden {}, width {}): {} copies of the gate and experts ({:.1f} GB each) in turn\n\n",
             s.name, E, K, D, I, copies, static_cast<double>(copy_bytes) / 1e9);
  fmt::print(
      "| shape | tokens | experts hit | time (us) | GB/s | of HBM roofline | TFLOP/s | of fp8 peak | gate (us) | "
      "expert GEMMs (us) | GEMMs of HBM | GEMMs of fp8 peak |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);

  auto gate_of = [&](int c) {
    gpu::DeviceWeight g;
    g.format = WeightFormat::kBf16;
    g.n = E;
    g.k = D;
    g.data = weights[static_cast<std::size_t>(c)].gate.data();
    return g;
  };
  auto w13_of = [&](int c) {
    const WeightCopy& w = weights[static_cast<std::size_t>(c)];
    gpu::DeviceWeight d;
    d.format = WeightFormat::kFp4;
    d.n = 2 * I;
    d.k = D;
    d.data = w.w13.data();
    d.scale = w.s13.data();
    d.expert_stride = I * D;  // 2I rows of D/2 bytes
    d.scale_stride = 2 * I * D / 32;
    d.fp4_scales_normal = w.s13_normal;
    return d;
  };
  auto w2_of = [&](int c) {
    const WeightCopy& w = weights[static_cast<std::size_t>(c)];
    gpu::DeviceWeight d;
    d.format = WeightFormat::kFp4;
    d.n = D;
    d.k = I;
    d.data = w.w2.data();
    d.scale = w.s2.data();
    d.expert_stride = D * I / 2;
    d.scale_stride = D * I / 32;
    d.fp4_scales_normal = w.s2_normal;
    return d;
  };

  for (std::int64_t T : tokens_list) {
    StepOnDevice step;
    make_step(step, T, stream);
    const auto cap = static_cast<std::int32_t>(T);
    const std::int32_t* n_dev = step.n_tokens();
    const GemmPath gate_path = T <= kMaxDecodeTokens ? GemmPath::kAuto : GemmPath::kAutoPrefill;
    const std::int32_t tile_m = gpu::expert_tile_rows(T * K, E, w13_of(0), w2_of(0));
    const gpu::ExpertTiles tiles{source_row.as<std::int32_t>(),
                                 tile_expert.as<std::int32_t>(),
                                 tile_row0.as<std::int32_t>(),
                                 tile_rows.as<std::int32_t>(),
                                 num_tiles.as<std::int32_t>(),
                                 gpu::moe_max_tiles(T, K, E, tile_m),
                                 tile_m,
                                 cap};
    gpu::ExpertTiles tiles_w2 = tiles;
    tiles_w2.source_row = nullptr;  // w2 reads the permuted rows themselves

    // One run of the routed path on weight copy c; `mark(i)` between stages (the breakdown graph
    // records events there): 0 before the gate, 1 after it, 2 before w1|w3, 3 after it, 4 before
    // w2, 5 after it.
    auto moe_run = [&](int c, auto&& mark) {
      mark(0);
      const int gate_splits = gpu::moe_gate(x.as<std::uint16_t>(), cap, gate_of(c), logits.as<float>(), n_dev, gate_path, st);
      mark(1);
      gpu::MoeRouteArgs route;
      route.step = step.get();
      route.capacity = cap;
      route.logits = logits.as<float>();
      route.logit_splits = gate_splits;
      route.split_stride = cap * E;
      route.experts = static_cast<std::int32_t>(E);
      route.top_k = static_cast<std::int32_t>(K);
      route.routed_scale = s.routed_scale;
      route.bias = bias.as<float>();
      route.route_expert = route_e.as<std::int32_t>();
      route.route_weight = route_w.as<float>();
      gpu::moe_route(route, st);
      gpu::MoePermuteArgs perm;
      perm.step = step.get();
      perm.experts = static_cast<std::int32_t>(E);
      perm.top_k = static_cast<std::int32_t>(K);
      perm.route_expert = route_e.as<std::int32_t>();
      perm.route_weight = route_w.as<float>();
      perm.tile_m = tile_m;
      perm.source_row = source_row.as<std::int32_t>();
      perm.slot_of = slot_of.as<std::int32_t>();
      perm.slot_weight = slot_w.as<float>();
      perm.num_rows = num_rows.as<std::int32_t>();
      perm.tile_expert = tile_expert.as<std::int32_t>();
      perm.tile_row0 = tile_row0.as<std::int32_t>();
      perm.tile_rows = tile_rows.as<std::int32_t>();
      perm.num_tiles = num_tiles.as<std::int32_t>();
      perm.expert_scratch = expert_scratch.as<std::int32_t>();
      gpu::moe_permute(perm, st);
      // (as the executor: gemm_quantized_experts wants the tile map from two launches back)
      gpu::quantize_activations(x.as<std::uint16_t>(), D, cap, D, xq.as<std::uint8_t>(), xs.as<float>(), n_dev, st);
      mark(2);
      gpu::gemm_quantized_experts(gpu::QuantizedRows{xq.as<std::uint8_t>(), xs.as<float>(), D}, tiles, w13_of(c),
                                  gpu::GemmOutput{gu.data(), 2 * I, false}, st);
      mark(3);
      gpu::swiglu_quantize(gu.as<std::uint16_t>(), T * K, num_rows.as<std::int32_t>(), I, s.swiglu_limit,
                           slot_w.as<float>(), hq.as<std::uint8_t>(), hs.as<float>(), st);
      mark(4);
      gpu::gemm_quantized_experts(gpu::QuantizedRows{hq.as<std::uint8_t>(), hs.as<float>(), I}, tiles_w2, w2_of(c),
                                  gpu::GemmOutput{y.data(), D, false}, st);
      mark(5);
      gpu::moe_combine(step.get(), cap, static_cast<std::int32_t>(K), route_e.as<std::int32_t>(),
                       slot_of.as<std::int32_t>(), y.as<std::uint16_t>(), y_shared.as<std::uint16_t>(), D,
                       out.as<std::uint16_t>(), st);
    };

    // One run outside any graph (first launches), then the experts it hit.
    moe_run(0, [](int) {});
    std::vector<std::int32_t> chosen(static_cast<std::size_t>(T * K));
    gpu::copy_to_host(chosen.data(), route_e.data(), chosen.size() * 4, stream);
    stream.synchronize();
    const std::set<std::int32_t> hit(chosen.begin(), chosen.end());
    const auto experts_hit = static_cast<std::int64_t>(hit.size());

    // `reps` runs in one graph with events at the stages in `marks` (starting with 0: the run
    // boundaries).
    auto timed = [&](const std::vector<int>& marks) {
      return bench::events_of_graph_runs(stream, reps, static_cast<int>(marks.size()), [&](int r, auto&& mark) {
        moe_run(r % copies, [&](int m) {
          const auto at = std::find(marks.begin(), marks.end(), m);
          if (at != marks.end()) mark(static_cast<int>(at - marks.begin()));
        });
      });
    };
    using bench::us_between;
    Result res;
    {
      const std::vector<gpu::Event> ev = timed({0});
      std::vector<double> us;
      for (int r = 0; r < reps; ++r)
        us.push_back(us_between(ev, static_cast<std::size_t>(r), static_cast<std::size_t>(r) + 1));
      res.total_us = median(us);
    }
    {
      const std::vector<int> marks = {0, 1, 2, 3, 4, 5};
      const std::vector<gpu::Event> ev = timed(marks);
      std::vector<double> gate_us, gemm_us;
      for (int r = 0; r < reps; ++r) {
        const std::size_t b = static_cast<std::size_t>(r) * marks.size();
        gate_us.push_back(us_between(ev, b + 0, b + 1));
        gemm_us.push_back(us_between(ev, b + 2, b + 3) + us_between(ev, b + 4, b + 5));
      }
      res.gate_us = median(gate_us);
      res.gemm_us = median(gemm_us);
    }

    const double pairs = static_cast<double>(T * K);
    const double weight_bytes = static_cast<double>(gate_bytes) + static_cast<double>(experts_hit * expert_bytes(s));
    const double act_bytes = 2.0 * static_cast<double>(T * D * 2) +
                             pairs * static_cast<double>(2 * I * 2 + I + ((I + 127) / 128) * 4 + D * 2);
    const double expert_act_bytes = static_cast<double>(T * D) + pairs * static_cast<double>(2 * I * 2 + I + D * 2);
    const double flops = 2.0 * pairs * 3.0 * static_cast<double>(I) * static_cast<double>(D);
    const double gbs = (weight_bytes + act_bytes) / (res.total_us * 1e-6) / 1e9;
    const double tflops = flops / (res.total_us * 1e-6) / 1e12;
    const double gemm_gbs =
        (static_cast<double>(experts_hit * expert_bytes(s)) + expert_act_bytes) / (res.gemm_us * 1e-6) / 1e9;
    const double gemm_tflops = flops / (res.gemm_us * 1e-6) / 1e12;
    fmt::print(
        "| {} | {} | {} | {:.1f} | {:.0f} | {:.0f}% | {:.1f} | {:.0f}% | {:.1f} | {:.1f} | {:.0f}% | {:.0f}% |\n",
        s.name, T, experts_hit, res.total_us, gbs, 100.0 * gbs * 1e9 / bw, tflops, 100.0 * tflops / peak_fp8,
        res.gate_us, res.gemm_us, 100.0 * gemm_gbs * 1e9 / bw, 100.0 * gemm_tflops / peak_fp8);
    std::fflush(stdout);
  }
  fmt::print("\n");
}

int run(int argc, char** argv) {
  std::vector<std::int64_t> tokens_list = {1, 16, 64, 256, 4096};
  std::string shapes = "flash,pro";
  int reps = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--tokens")
      tokens_list = parse_list(value);
    else if (key == "--reps")
      reps = std::max(3, std::atoi(value.c_str()));
    else if (key == "--shapes")
      shapes = value;
    else
      throw Error(fmt::format("unknown option {}", key));
  }
  if (argc % 2 == 0) throw Error(fmt::format("option {} has no value", argv[argc - 1]));
  for (std::int64_t t : tokens_list)
    if (t < 1) throw Error(fmt::format("token count {} (at least 1)", t));
  std::vector<const Shape*> chosen;
  for (const std::string& key : bench::split_list(shapes)) {
    const auto it = std::find_if(kShapes.begin(), kShapes.end(), [&](const Shape& s) { return key == s.key; });
    if (it == kShapes.end()) throw Error(fmt::format("unknown shape '{}' (flash, pro)", key));
    chosen.push_back(&*it);
  }

  const gpu::DeviceInfo info = gpu::device_info();
  const double bw = bench::measure_hbm_bandwidth();
  const double peak_fp8 = bench::measure_mma_peak_tflops(true);
  fmt::print("device: {} ({} SMs, L2 {} MB)\nHBM bandwidth (4 GiB copy, read + write): {:.2f} TB/s\n", info.name,
             info.sm_count, info.l2_bytes >> 20, bw / 1e12);
  fmt::print("mma.sync peak: e4m3 {:.0f} TFLOP/s\n", peak_fp8);
  fmt::print("expert products: {}\n\n", gpu::experts_fp8_opted_in()
                                            ? "FP8 wgmma at every step size (DSV4_EXPERTS_FP8=1, gemm_experts_fp8.h)"
                                            : "the default kernels (few-rows at decode, f16 wgmma tiles for prompts)");
  fmt::print(
      "Routed MoE, gate GEMM through combine (time: the median of {} runs); gate and expert GEMMs (w1|w3 + w2): the\n"
      "same runs' medians of those launches alone, the GEMMs' ratios over the experts' bytes and the FLOPs.\n\n",
      reps);
  for (const Shape* s : chosen) run_shape(*s, tokens_list, reps, bw, peak_fp8);
  return 0;
}

}  // namespace
}  // namespace dsv4

int main(int argc, char** argv) { return dsv4::bench::guarded_main("bench_gpu_moe", dsv4::run, argc, argv); }
