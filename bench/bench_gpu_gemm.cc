// GEMM benchmark at V4-Flash and V4-Pro layer shapes: our kernels (the few-rows kernel for decode,
// the tile kernels for prefill) and cuBLASLt's block-scaled FP8 product (gemm_library.h) across
// row counts, against two rooflines measured in the same run -- bytes over the HBM bandwidth of a
// large device-to-device copy, FLOPs over the mma.sync peak of a kernel that does nothing else
// (the e4m3 one for fp8 / fp4 weights) -- and against each other on the same shape.
//
//   bench_gpu_gemm [--rows 1,8,64,128,4096] [--reps N (launches per graph, default 10)]
//                  [--runs N (timed graph replays, default 50)] [--models flash,pro]
// Each time is the median over `runs` replays of a CUDA graph of `reps` launches (per launch);
// the weights rotate through copies that together exceed the L2 cache, so every product reads
// its weight from HBM. Weights and activations are constant bytes (timing does not depend on the
// values). "auto" is what the executor picks for a prefill step (GemmPath::kAutoPrefill): the
// few-rows kernel up to 16 rows, then cuBLASLt where it runs the shape, else the tiles. "stream" is
// the weight-streaming wgmma kernel (GemmPath::kStream, dense fp8 weights, opt-in); with
// DSV4_GEMM_STREAM_FP8=1 in the environment its products are FP8 wgmma (gemm_stream.h StreamProducts).
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/kernels/gemm.h"
#include "cuda/kernels/gemm_stream.h"
#include "cuda/runtime.h"
#include "gpu_bench_util.h"
#include "mma_peak.h"

namespace dsv4 {
namespace {

using gpu::GemmPath;
using gpu::WeightFormat;

using bench::median;
using bench::parse_list;

struct Shape {
  std::string name;
  WeightFormat format;
  std::int64_t n, k;
  int groups;       // gemm_bf16 grouped (wo_a)
  bool bf16_input;  // gemm_bf16, else gemm_quantized
  bool f32_out;
};

// The products of one layer and the head. V4-Flash: hidden 4096, q_lora 1024, 64 heads x 512,
// o_groups 8 x o_lora 1024, expert width 2048. V4-Pro: hidden 7168, q_lora 1536, 128 heads,
// o_groups 16 x o_lora 1024, expert width 3072.
std::vector<Shape> shapes_of(const std::string& model) {
  const bool pro = model == "pro";
  const std::int64_t d = pro ? 7168 : 4096, ql = pro ? 1536 : 1024, heads = pro ? 128 : 64, og = pro ? 16 : 8, inter = pro ? 3072 : 2048;
  const char* m = pro ? "Pro" : "Flash";
  auto name = [&](const char* what) { return fmt::format("{} {}", m, what); };
  return {
      {name("wq_a (fp8)"), WeightFormat::kFp8, ql, d, 1, false, false},
      {name("wq_b (fp8)"), WeightFormat::kFp8, heads * 512, ql, 1, false, false},
      {name("wkv (fp8)"), WeightFormat::kFp8, 512, d, 1, false, false},
      {name("wo_a grouped (fp8 as bf16)"), WeightFormat::kFp8, og * 1024, heads * 512 / og, static_cast<int>(og), true, false},
      {name("wo_b (fp8)"), WeightFormat::kFp8, d, og * 1024, 1, false, false},
      {name("shared w1 (fp8)"), WeightFormat::kFp8, inter, d, 1, false, false},
      {name("expert w1 (fp4)"), WeightFormat::kFp4, inter, d, 1, false, false},
      {name("expert w2 (fp4)"), WeightFormat::kFp4, d, inter, 1, false, false},
      {name("gate (bf16, f32 out)"), WeightFormat::kBf16, pro ? 384 : 256, d, 1, true, true},
      {name("head (bf16, f32 out)"), WeightFormat::kBf16, 129280, d, 1, true, true},
  };
}

std::int64_t weight_bytes(const Shape& s) {
  switch (s.format) {
    case WeightFormat::kFp8: return s.n * s.k + ((s.n + 127) / 128) * ((s.k + 127) / 128) * 4;
    case WeightFormat::kFp4: return s.n * s.k / 2 + s.n * (s.k / 32);
    default: return s.n * s.k * 2;
  }
}

const char* path_label(GemmPath p) {
  switch (p) {
    case GemmPath::kFewRows: return "few-rows";
    case GemmPath::kTiles: return "tiles";
    case GemmPath::kLibrary: return "cuBLASLt";
    case GemmPath::kStream: return "stream";
    default: return "auto";
  }
}

int run(int argc, char** argv) {
  std::vector<std::int64_t> rows_list = {1, 8, 64, 128, 4096};
  std::vector<std::string> models = {"flash", "pro"};
  int reps = 10, runs = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--rows") rows_list = parse_list(value);
    else if (key == "--reps") reps = std::max(1, std::atoi(value.c_str()));
    else if (key == "--runs") runs = std::max(3, std::atoi(value.c_str()));
    else if (key == "--models") models = bench::split_list(value);
    else throw Error(fmt::format("unknown option {}", key));
  }
  for (const std::string& m : models)
    if (m != "flash" && m != "pro") throw Error(fmt::format("unknown model '{}' (flash, pro)", m));
  const gpu::DeviceInfo info = gpu::device_info();
  const double bw = bench::measure_hbm_bandwidth();
  const double peak_fp8 = bench::measure_mma_peak_tflops(true), peak_bf16 = bench::measure_mma_peak_tflops(false);
  fmt::print("device: {} ({} SMs)\nHBM bandwidth (4 GiB copy, read + write): {:.2f} TB/s\n", info.name, info.sm_count, bw / 1e12);
  fmt::print("mma.sync peak: e4m3 {:.0f} TFLOP/s, bf16 {:.0f} TFLOP/s\n", peak_fp8, peak_bf16);
  fmt::print("stream products: {}\n", gpu::stream_products() == gpu::StreamProducts::kFp8
                                          ? "FP8 wgmma (DSV4_GEMM_STREAM_FP8=1, gemm_stream.h)"
                                          : "f16 wgmma (the default)");
  fmt::print("time: median of {} replays of a graph of {} launches, per launch\n", runs, reps);
  fmt::print("cuBLASLt ({}): reported after the first product that asks for it\n\n", "block-scaled FP8");
  fmt::print("| product | rows | auto picks | auto (us) | GB/s | of HBM | TFLOP/s | of mma peak | few-rows (us) | stream (us) | stream of HBM | tiles (us) | cuBLASLt (us) | cuBLASLt / auto |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");

  const std::int64_t max_rows = *std::max_element(rows_list.begin(), rows_list.end());
  gpu::Stream stream;
  for (const std::string& model : models) {
    for (const Shape& s : shapes_of(model)) {
      const std::int64_t wbytes = weight_bytes(s);
      // Copies of the weight that together exceed the L2 cache, used in turn.
      const std::size_t data_bytes = static_cast<std::size_t>(s.format == WeightFormat::kFp4 ? s.n * s.k / 2
                                                                                             : s.n * s.k * (s.format == WeightFormat::kBf16 ? 2 : 1));
      const int copies = static_cast<int>(std::clamp<std::int64_t>((std::int64_t{512} << 20) / wbytes + 1, 2, 64));
      gpu::DeviceBuffer wdata(data_bytes * static_cast<std::size_t>(copies));
      // Scale copies 256-byte aligned (cuBLASLt wants 16-byte aligned scales).
      const std::size_t scale_bytes_raw = s.format == WeightFormat::kFp8 ? static_cast<std::size_t>(((s.n + 127) / 128) * ((s.k + 127) / 128) * 4)
                                          : s.format == WeightFormat::kFp4 ? static_cast<std::size_t>(s.n * (s.k / 32))
                                                                            : 16;
      const std::size_t scale_bytes = (scale_bytes_raw + 255) / 256 * 256;
      gpu::DeviceBuffer wscale(scale_bytes * static_cast<std::size_t>(copies));
      gpu::fill_bytes(wdata.data(), 0x3a, wdata.size(), stream);
      if (s.format == WeightFormat::kFp4) {
        gpu::fill_bytes(wscale.data(), 0x7a, wscale.size(), stream);
      } else {
        // fp32 2^-7 (0x3c000000): the bytes 00 00 00 3c
        std::vector<std::uint8_t> one(scale_bytes);
        for (std::size_t i = 0; i + 4 <= one.size(); i += 4) one[i + 3] = 0x3c;
        for (int c = 0; c < copies; ++c)
          gpu::copy_to_device(static_cast<std::uint8_t*>(wscale.data()) + scale_bytes * static_cast<std::size_t>(c), one.data(), one.size(), stream);
        stream.synchronize();
      }
      gpu::DeviceWeight w;
      w.format = s.format;
      w.n = s.n;
      w.k = s.k;
      w.data = wdata.data();
      w.scale = s.format == WeightFormat::kBf16 ? nullptr : wscale.data();
      if (s.format == WeightFormat::kFp4) w.fp4_scales_normal = gpu::fp4_scales_normal(wscale.data(), static_cast<std::int64_t>(wscale.size()), stream);
      const std::int64_t in_cols = s.k * s.groups;
      gpu::DeviceBuffer act(static_cast<std::size_t>(max_rows * in_cols * 2)), codes(static_cast<std::size_t>(max_rows * s.k)),
          ascales(static_cast<std::size_t>(max_rows * ((s.k + 127) / 128) * 4)), out(static_cast<std::size_t>(max_rows * s.n * 4));
      gpu::fill_bytes(act.data(), 0x3c, act.size(), stream);
      gpu::quantize_activations(act.as<std::uint16_t>(), s.k, max_rows, s.k, codes.as<std::uint8_t>(), ascales.as<float>(), nullptr,
                                stream.handle());
      int next_copy = 0;
      const gpu::GemmOutput o{out.data(), s.n, s.f32_out};
      for (std::int64_t rows : rows_list) {
        auto product = [&](GemmPath path) {
          next_copy = (next_copy + 1) % copies;
          w.data = static_cast<const std::uint8_t*>(wdata.data()) + data_bytes * static_cast<std::size_t>(next_copy);
          if (w.scale != nullptr) w.scale = static_cast<const std::uint8_t*>(wscale.data()) + scale_bytes * static_cast<std::size_t>(next_copy);
          if (s.bf16_input) {
            gpu::gemm_bf16(act.as<std::uint16_t>(), in_cols, rows, w, s.groups, o, nullptr, stream.handle(), path);
          } else {
            gpu::gemm_quantized(gpu::QuantizedRows{codes.as<std::uint8_t>(), ascales.as<float>(), s.k}, rows, w, o, nullptr,
                                stream.handle(), path);
          }
        };
        // `reps` launches captured in one CUDA graph (as the executor's decode graphs run them:
        // the host's launch latency stays out of the time), replayed `runs` times between events.
        auto time_us = [&](GemmPath path) {
          product(path);
          gpu::Graph graph;
          graph.begin_capture(stream);
          for (int i = 0; i < reps; ++i) product(path);
          graph.end_capture(stream);
          graph.replay(stream);
          gpu::Event start, stop;
          std::vector<double> us;
          for (int r = 0; r < runs; ++r) {
            start.record(stream);
            graph.replay(stream);
            stop.record(stream);
            stop.synchronize();
            us.push_back(gpu::Event::elapsed_ms(start, stop) * 1e3 / reps);
          }
          return median(us);
        };
        const bool library = !s.bf16_input && gpu::gemm_library_supports(rows, w, o);
        if (!library && !s.bf16_input && s.format == WeightFormat::kFp8 && rows > 1)
          fmt::print("({} at {} rows: cuBLASLt refused: {})\n", s.name, rows, gpu::gemm_library_refusal());
        const bool streams = !s.bf16_input && s.format == WeightFormat::kFp8;  // the weight-streaming kernel runs it
        const GemmPath chosen = rows <= 16 ? GemmPath::kFewRows : library ? GemmPath::kLibrary : GemmPath::kTiles;
        const double t = time_us(chosen);
        const double t_few = chosen == GemmPath::kFewRows ? t : rows <= 512 ? time_us(GemmPath::kFewRows) : 0.0;  // slow at 4096
        const double t_stream = streams && rows <= 512 ? time_us(GemmPath::kStream) : 0.0;
        const double t_tiles = chosen == GemmPath::kTiles ? t : time_us(GemmPath::kTiles);
        const double t_lib = chosen == GemmPath::kLibrary ? t : library ? time_us(GemmPath::kLibrary) : 0.0;
        const double bytes = static_cast<double>(wbytes) + static_cast<double>(rows) * static_cast<double>(in_cols) * (s.bf16_input ? 2 : 1) +
                             static_cast<double>(rows) * static_cast<double>(s.n) * (s.f32_out ? 4 : 2);
        const double flops = 2.0 * static_cast<double>(rows) * static_cast<double>(s.n) * static_cast<double>(s.k);
        const double peak = s.bf16_input ? peak_bf16 : peak_fp8;
        const double gbs = bytes / (t * 1e-6) / 1e9, tflops = flops / (t * 1e-6) / 1e12;
        auto cell = [](double us) { return us > 0 ? fmt::format("{:.1f}", us) : std::string("-"); };
        const std::string stream_hbm = t_stream > 0 ? fmt::format("{:.0f}%", 100.0 * bytes / (t_stream * 1e-6) / bw) : std::string("-");
        fmt::print("| {} | {} | {} | {:.1f} | {:.0f} | {:.0f}% | {:.1f} | {:.0f}% | {} | {} | {} | {} | {} | {} |\n", s.name, rows, path_label(chosen), t,
                   gbs, 100.0 * gbs * 1e9 / bw, tflops, 100.0 * tflops / peak, cell(t_few), cell(t_stream), stream_hbm, cell(t_tiles), cell(t_lib),
                   t_lib > 0 ? fmt::format("{:.2f}x", t_lib / t) : std::string("-"));
      }
    }
  }
  fmt::print("\ncuBLASLt calibration: {}\n", gpu::gemm_library_calibration());
  return 0;
}

}  // namespace
}  // namespace dsv4

int main(int argc, char** argv) { return dsv4::bench::guarded_main("bench_gpu_gemm", dsv4::run, argc, argv); }
