// Hyper-connection kernels at V4-Flash (hidden 4096) and V4-Pro (7168) shapes, 4 streams:
// hc_pre (the 25 raw mixes of each row, Sinkhorn, the weighted sum and the sub-layer's RMSNorm)
// with each way of forming the mixes (hyper.h HcMixPath: kBlocks, the form for few rows, is the
// reference the other is measured against in the same run), and hc_post. Per row count: time,
// GB/s and the share of the HBM bandwidth measured in the same run.
//
//   bench_gpu_hyper [--rows 1,8,32,64,256,1024,4096] [--reps N (timed runs, default 50)] [--shapes flash,pro]
//
// Bytes: hc_pre reads h [rows][4][hidden] bf16 and the mix weights fn [24][4 * hidden] fp32 and
// writes x [rows][hidden] bf16 (post and comb are small); hc_post reads h and the sub-layer output
// and writes the new streams. Timing: `reps` runs captured in one CUDA graph with an event between
// runs (gpu_bench_util.h), the median run reported; run r reads copy r mod copies of h, 256 MB
// of copies in turn (at most 64 copies), so from about 32 rows on h comes from HBM as in a prompt
// step; at fewer rows the copies fit in L2, as a decode step's streams stay there. fn (1.5 MB
// for Flash) stays in L2 across runs, where a model's layers each read their own.
#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/kernels/fill.h"
#include "cuda/kernels/hyper.h"
#include "cuda/runtime.h"
#include "gpu_bench_util.h"

namespace dsv4 {
namespace {

using bench::median;
using gpu::DeviceBuffer;
using gpu::HcMixPath;

struct Shape {
  const char* key;
  const char* name;
  std::int64_t hidden;
};
const std::vector<Shape> kShapes = {{"flash", "V4-Flash", 4096}, {"pro", "V4-Pro", 7168}};
constexpr int kHc = 4;
constexpr std::int64_t kMix = (2 + kHc) * kHc;
constexpr double kRotateBytes = 256e6;  // the copies of h in turn: several times the 50 MB L2
constexpr int kMaxCopies = 64;

template <class Run>
double median_us(gpu::Stream& stream, int reps, Run&& run) {
  const std::vector<gpu::Event> ev = bench::events_of_graph_runs(stream, reps, 1, [&](int r, auto mark) {
    mark(0);
    run(r);
  });
  std::vector<double> us;
  for (int r = 0; r < reps; ++r)
    us.push_back(bench::us_between(ev, static_cast<std::size_t>(r), static_cast<std::size_t>(r) + 1));
  return median(us);
}

void run_shape(const Shape& s, const std::vector<std::int64_t>& rows_list, int reps, double bw) {
  const std::int64_t D = s.hidden, n = kHc * D;
  const std::int64_t max_rows = *std::max_element(rows_list.begin(), rows_list.end());
  gpu::Stream stream;
  const gpu_stream_t st = stream.handle();
  const gpu::HcShape shape{kHc, D, 20, 1e-6f, 1e-6f};
  DeviceBuffer fn(static_cast<std::size_t>(kMix * n * 4)), base(kMix * 4), scale(3 * 4),
      norm(static_cast<std::size_t>(D * 4));
  gpu::fill_uniform_f32(fn.as<float>(), kMix * n, 0x5eed0301, -0.02f, 0.02f, st);
  gpu::fill_uniform_f32(base.as<float>(), kMix, 0x5eed0302, -0.5f, 0.5f, st);
  gpu::fill_uniform_f32(scale.as<float>(), 3, 0x5eed0303, 0.5f, 1.0f, st);
  gpu::fill_uniform_f32(norm.as<float>(), D, 0x5eed0304, 0.5f, 1.5f, st);
  DeviceBuffer x(static_cast<std::size_t>(max_rows * D * 2)), out(static_cast<std::size_t>(max_rows * D * 2));
  DeviceBuffer post(static_cast<std::size_t>(max_rows * kHc * 4)),
      comb(static_cast<std::size_t>(max_rows * kHc * kHc * 4));
  DeviceBuffer scratch(static_cast<std::size_t>(gpu::hc_scratch_floats(max_rows, shape) * 4));
  DeviceBuffer h_new(static_cast<std::size_t>(max_rows * n * 2));
  gpu::fill_uniform_bf16(out.as<std::uint16_t>(), max_rows * D, 0x5eed0305, -1.0f, 1.0f, st);

  fmt::print("{} (hidden {}, hc {}):\n\n", s.name, D, kHc);
  fmt::print(
      "| shape | rows | copies | hc_pre, blocks (us) | hc_pre, rows (us) | rows vs blocks | rows GB/s | of HBM | "
      "hc_post (us) | hc_post of HBM |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  for (std::int64_t rows : rows_list) {
    const double h_bytes = static_cast<double>(rows * n * 2);
    const int copies = static_cast<int>(std::clamp<double>(kRotateBytes / h_bytes, 1, kMaxCopies));
    std::vector<DeviceBuffer> h;
    for (int c = 0; c < copies; ++c) {
      h.emplace_back(static_cast<std::size_t>(h_bytes));
      gpu::fill_uniform_bf16(h.back().as<std::uint16_t>(), rows * n, 0x5eed0400 + static_cast<std::uint64_t>(c), -1.0f,
                             1.0f, st);
    }
    stream.synchronize();
    const gpu::HcWeights w{fn.as<float>(), base.as<float>(), scale.as<float>()};
    auto pre = [&](HcMixPath path) {
      return median_us(stream, reps, [&](int r) {
        gpu::hc_pre(h[static_cast<std::size_t>(r % copies)].as<std::uint16_t>(), w, norm.as<float>(), shape, rows,
                    x.as<std::uint16_t>(), post.as<float>(), comb.as<float>(), nullptr, scratch.as<float>(), st, path);
      });
    };
    const double blocks_us = pre(HcMixPath::kBlocks), rows_us = pre(HcMixPath::kRows);
    const double post_us = median_us(stream, reps, [&](int r) {
      gpu::hc_post(out.as<std::uint16_t>(), h[static_cast<std::size_t>(r % copies)].as<std::uint16_t>(),
                   post.as<float>(), comb.as<float>(), shape, rows, h_new.as<std::uint16_t>(), nullptr, st);
    });
    const double pre_bytes = h_bytes + static_cast<double>(kMix * n * 4 + rows * D * 2);
    const double post_bytes = 2 * h_bytes + static_cast<double>(rows * D * 2);
    const double gbs = pre_bytes / (rows_us * 1e-6) / 1e9;
    fmt::print("| {} | {} | {} | {:.1f} | {:.1f} | {:.2f}x | {:.0f} | {:.0f}% | {:.1f} | {:.0f}% |\n", s.name, rows,
               copies, blocks_us, rows_us, blocks_us / rows_us, gbs, 100.0 * gbs * 1e9 / bw, post_us,
               100.0 * post_bytes / (post_us * 1e-6) / bw);
    std::fflush(stdout);
  }
  fmt::print("\n");
}

int run(int argc, char** argv) {
  std::vector<std::int64_t> rows_list = {1, 8, 32, 64, 256, 1024, 4096};
  std::vector<std::string> shapes = {"flash", "pro"};
  int reps = 50;
  for (int i = 1; i < argc; ++i) {
    const std::string key = argv[i];
    if (i + 1 >= argc) throw Error("missing value after " + key);
    const std::string value = argv[++i];
    if (key == "--rows")
      rows_list = bench::parse_list(value);
    else if (key == "--reps")
      reps = std::stoi(value);
    else if (key == "--shapes")
      shapes = bench::split_list(value);
    else
      throw Error("unknown option " + key + " (--rows, --reps, --shapes)");
  }
  if (reps < 1) throw Error("--reps must be at least 1");
  for (std::int64_t r : rows_list)
    if (r < 1 || r > 65536) throw Error("--rows takes counts from 1 to 65536");
  const double bw = bench::measure_hbm_bandwidth();
  fmt::print("HBM (device-to-device copy): {:.0f} GB/s\n\n", bw / 1e9);
  for (const std::string& key : shapes) {
    const auto it = std::find_if(kShapes.begin(), kShapes.end(), [&](const Shape& s) { return key == s.key; });
    if (it == kShapes.end()) throw Error("unknown shape " + key + " (flash, pro)");
    run_shape(*it, rows_list, reps, bw);
  }
  return 0;
}

}  // namespace
}  // namespace dsv4

int main(int argc, char** argv) { return dsv4::bench::guarded_main("bench_gpu_hyper", dsv4::run, argc, argv); }
