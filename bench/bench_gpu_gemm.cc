// GEMM benchmark at V4-Flash layer shapes: the few-rows kernel (decode) and the tile kernels
// (prefill) across row counts, against two rooflines measured in the same run -- bytes over the
// HBM bandwidth of a large device-to-device copy, FLOPs over the mma.sync peak of a kernel that
// does nothing else -- and against the other kernel path on the same shape (the tile kernel is
// the simple reference for few rows, and the other way round).
//
//   bench_gpu_gemm [--rows 1,2,4,8,16,32,64,128,512,4096] [--reps N (launches per timed batch)]
// Weights and activations are constant bytes (timing does not depend on the values).
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/kernels/gemm.h"
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
  const char* name;
  WeightFormat format;
  std::int64_t n, k;
  int groups;       // gemm_bf16 grouped (wo_a)
  bool bf16_input;  // gemm_bf16, else gemm_quantized
  bool f32_out;
};

// The products of one V4-Flash layer (hidden 4096, q_lora 1024, 64 heads x 512, o_groups 8 x
// o_lora 1024, expert width 2048) and the head.
const std::vector<Shape> kShapes = {
    {"wq_a (fp8)", WeightFormat::kFp8, 1024, 4096, 1, false, false},
    {"wq_b (fp8)", WeightFormat::kFp8, 32768, 1024, 1, false, false},
    {"wkv (fp8)", WeightFormat::kFp8, 512, 4096, 1, false, false},
    {"wo_a grouped (fp8 as bf16)", WeightFormat::kFp8, 8192, 4096, 8, true, false},
    {"wo_b (fp8)", WeightFormat::kFp8, 4096, 8192, 1, false, false},
    {"shared w1 (fp8)", WeightFormat::kFp8, 2048, 4096, 1, false, false},
    {"expert w1 (fp4)", WeightFormat::kFp4, 2048, 4096, 1, false, false},
    {"expert w2 (fp4)", WeightFormat::kFp4, 4096, 2048, 1, false, false},
    {"gate (bf16, f32 out)", WeightFormat::kBf16, 256, 4096, 1, true, true},
    {"head (bf16, f32 out)", WeightFormat::kBf16, 129280, 4096, 1, true, true},
};

std::int64_t weight_bytes(const Shape& s) {
  switch (s.format) {
    case WeightFormat::kFp8: return s.n * s.k + ((s.n + 127) / 128) * ((s.k + 127) / 128) * 4;
    case WeightFormat::kFp4: return s.n * s.k / 2 + s.n * (s.k / 32);
    default: return s.n * s.k * 2;
  }
}

int run(int argc, char** argv) {
  std::vector<std::int64_t> rows_list = {1, 2, 4, 8, 16, 32, 64, 128, 512, 4096};
  int reps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--rows") rows_list = parse_list(value);
    else if (key == "--reps") reps = std::max(3, std::atoi(value.c_str()));
    else throw Error(fmt::format("bench_gpu_gemm: unknown option {}", key));
  }
  const gpu::DeviceInfo info = gpu::device_info();
  const double bw = bench::measure_hbm_bandwidth();
  const double peak_fp8 = bench::measure_mma_peak_tflops(true), peak_bf16 = bench::measure_mma_peak_tflops(false);
  fmt::print("device: {} ({} SMs)\nHBM bandwidth (4 GiB copy, read + write): {:.2f} TB/s\n", info.name, info.sm_count, bw / 1e12);
  fmt::print("mma.sync peak: e4m3 {:.0f} TFLOP/s, bf16 {:.0f} TFLOP/s\n\n", peak_fp8, peak_bf16);
  fmt::print("| product | rows | kernel | time (us) | GB/s | of HBM roofline | TFLOP/s | of mma peak | other path (us) |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|\n");

  const std::int64_t max_rows = *std::max_element(rows_list.begin(), rows_list.end());
  gpu::Stream stream;
  for (const Shape& s : kShapes) {
    const std::int64_t wbytes = weight_bytes(s);
    // Copies of the weight that together exceed the L2 cache, used in turn: every product reads
    // its weight from HBM, as a model's layers do.
    const std::size_t data_bytes =
        static_cast<std::size_t>(s.format == WeightFormat::kFp4 ? s.n * s.k / 2 : s.n * s.k * (s.format == WeightFormat::kBf16 ? 2 : 1));
    const int copies = static_cast<int>(std::clamp<std::int64_t>((std::int64_t{512} << 20) / wbytes + 1, 1, 64));
    gpu::DeviceBuffer wdata(data_bytes * static_cast<std::size_t>(copies));
    const std::size_t scale_bytes = s.format == WeightFormat::kFp8 ? static_cast<std::size_t>(((s.n + 127) / 128) * ((s.k + 127) / 128) * 4)
                                    : s.format == WeightFormat::kFp4 ? static_cast<std::size_t>(s.n * (s.k / 32))
                                                                      : 16;
    gpu::DeviceBuffer wscale(scale_bytes * static_cast<std::size_t>(copies));
    gpu::fill_bytes(wdata.data(), 0x3a, wdata.size(), stream);
    gpu::fill_bytes(wscale.data(), s.format == WeightFormat::kFp4 ? 0x7a : 0x3c, wscale.size(), stream);
    gpu::DeviceWeight w;
    w.format = s.format;
    w.n = s.n;
    w.k = s.k;
    w.data = wdata.data();
    w.scale = s.format == WeightFormat::kBf16 ? nullptr : wscale.data();
    const std::int64_t in_cols = s.k * s.groups;
    gpu::DeviceBuffer act(static_cast<std::size_t>(max_rows * in_cols * 2)), codes(static_cast<std::size_t>(max_rows * s.k)),
        ascales(static_cast<std::size_t>(max_rows * ((s.k + 127) / 128) * 4)), out(static_cast<std::size_t>(max_rows * s.n * 4));
    gpu::fill_bytes(act.data(), 0x3c, act.size(), stream);
    gpu::quantize_activations(act.as<std::uint16_t>(), s.k, max_rows, s.k, codes.as<std::uint8_t>(), ascales.as<float>(), nullptr,
                              stream.handle());
    int next_copy = 0;
    for (std::int64_t rows : rows_list) {
      auto product = [&](GemmPath path) {
        const gpu::GemmOutput o{out.data(), s.n, s.f32_out};
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
      // `reps` launches captured in one CUDA graph and replayed between a pair of events (as the
      // executor's decode graphs run them): the host's launch latency stays out of the time.
      auto time_us = [&](GemmPath path) {
        product(path);
        gpu::Graph graph;
        graph.begin_capture(stream);
        for (int i = 0; i < reps; ++i) product(path);
        graph.end_capture(stream);
        graph.replay(stream);
        gpu::Event start, stop;
        std::vector<double> us;
        for (int batch = 0; batch < 5; ++batch) {
          start.record(stream);
          graph.replay(stream);
          stop.record(stream);
          stop.synchronize();
          us.push_back(gpu::Event::elapsed_ms(start, stop) * 1e3 / reps);
        }
        return median(us);
      };
      const GemmPath chosen = rows <= 16 ? GemmPath::kFewRows : GemmPath::kTiles;
      const GemmPath other = chosen == GemmPath::kFewRows ? GemmPath::kTiles : GemmPath::kFewRows;
      const double t = time_us(chosen);
      const double t_other = rows <= 512 ? time_us(other) : 0.0;  // the few-rows kernel at 4096 rows takes long
      const double bytes = static_cast<double>(wbytes) + static_cast<double>(rows) * static_cast<double>(in_cols) * (s.bf16_input ? 2 : 1) +
                           static_cast<double>(rows) * static_cast<double>(s.n) * (s.f32_out ? 4 : 2);
      const double flops = 2.0 * static_cast<double>(rows) * static_cast<double>(s.n) * static_cast<double>(s.k);
      const double peak = s.bf16_input ? peak_bf16 : peak_fp8;
      const double gbs = bytes / (t * 1e-6) / 1e9, tflops = flops / (t * 1e-6) / 1e12;
      fmt::print("| {} | {} | {} | {:.1f} | {:.0f} | {:.0f}% | {:.1f} | {:.0f}% | {} |\n", s.name, rows,
                 chosen == GemmPath::kFewRows ? "few-rows" : "tiles", t, gbs, 100.0 * gbs * 1e9 / bw, tflops, 100.0 * tflops / peak,
                 t_other > 0 ? fmt::format("{:.1f}", t_other) : std::string("-"));
    }
  }
  return 0;
}

}  // namespace
}  // namespace dsv4

int main(int argc, char** argv) {
  try {
    return dsv4::run(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_gpu_gemm: {}\n", e.what());
    return 1;
  }
}
