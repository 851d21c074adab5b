// Every GPU kernel family against its CPU twin, in the spirit of llama.cpp's test-backend-ops.
// The same file runs on the SIMT simulator (test_gpu_ops_sim, in CI) and on the GPU
// (test_gpu_ops, label gpu). Each case draws fresh seeded inputs of realistic magnitude, poisons
// every output (0xFF bytes: NaN / -1) before the launch, checks that every output is finite and
// compares with the CPU reference ops (src/cpu) by the rules of docs/NUMERICS.md ("Tolerances
// the tests use"). Each case prints one summary line; the table is printed again at the end.
//
// This file: GEMMs, residual-stream kernels, MoE. test_gpu_ops_cache.cc: the kernels that read
// or write the paged KV cache (q/kv finish, compressor, indexer, attention).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <span>

#include "cpu/hyper_connections.h"
#include "cpu/linear.h"
#include "cpu/moe.h"
#include "cpu/rms_norm.h"
#include "cuda/kernels/gemm.h"
#include "cuda/kernels/gemm_experts_fp8.h"
#include "cuda/kernels/gemm_experts_wgmma.h"
#include "cuda/kernels/gemm_stream.h"
#include "cuda/kernels/hyper.h"
#include "cuda/kernels/moe.h"
#include "gpu_step.h"
#include "gpu_test_util.h"
#include "numerics/block_quant.h"
#include "numerics/fp8_dot_model.h"
#include "numerics/fp8_e4m3.h"
#include "numerics/ue8m0.h"

namespace dsv4::gputest {
namespace {

using gpu::GemmPath;
using gpu::WeightFormat;

const std::vector<std::int64_t> kRows = {1, 2, 7, 8, 9, 16, 17, 127, 128, 129, 130};

const char* fmt_name(WeightFormat f) { return f == WeightFormat::kFp8 ? "fp8" : f == WeightFormat::kFp4 ? "fp4" : "bf16"; }
const char* path_name(GemmPath p) {
  switch (p) {
    case GemmPath::kFewRows: return "few-rows";
    case GemmPath::kTiles: return "tiles";
    case GemmPath::kLibrary: return "cublaslt";
    case GemmPath::kStream: return "stream";
    default: return "auto";
  }
}
const char* path_name(gpu::HcMixPath p) { return p == gpu::HcMixPath::kBlocks ? "blocks" : "rows"; }
// hc_pre / hc_head: both ways of forming the mixes, forced.
constexpr gpu::HcMixPath kMixPaths[] = {gpu::HcMixPath::kBlocks, gpu::HcMixPath::kRows};

// Quantizes one row the way linear() feeds an fp8 / fp4 GEMM: blocks of 128, the last shorter.
void quantize_row_ref(std::span<const float> x, std::vector<std::uint8_t>& codes, std::vector<float>& scales) {
  const auto k = static_cast<std::int64_t>(x.size());
  for (std::int64_t b = 0; b * 128 < k; ++b) {
    const std::int64_t len = std::min<std::int64_t>(128, k - b * 128);
    std::vector<std::uint8_t> c(static_cast<std::size_t>(len));
    float s = 0;
    quantize_blocks(x.subspan(static_cast<std::size_t>(b * 128), static_cast<std::size_t>(len)), static_cast<std::size_t>(len),
                    QuantFormat::kFp8E4m3, c, std::span<float>(&s, 1));
    codes.insert(codes.end(), c.begin(), c.end());
    scales.push_back(s);
  }
}

// For outputs that are exact products summed in fp32 and rounded to bf16 once: |got - ref| must be
// within one bf16 ulp plus the summation-order bound, `order` * mag (mag = sum |a_i w_i|).
struct NearCheck {
  std::int64_t bad = 0;
  std::string first;
  void check(float got, float ref, double mag, double order, bool bf16_out, std::int64_t where) {
    const double tol = (bf16_out ? bf16_ulp(std::max(std::fabs(got), std::fabs(ref))) : 0.0) + order * mag + 1e-30;
    if (!(std::fabs(static_cast<double>(got) - ref) <= tol)) {
      if (bad++ == 0) first = fmt::format("element {}: got {} expected {} (tolerance {:.3g})", where, got, ref, tol);
    }
  }
};

// Summation-order allowance per unit of magnitude: fp32 sums of k exact products (the simulator's
// mma sums in order in fp32; the GPU's tensor cores keep fewer bits inside an mma).
double order_bound(std::int64_t k) { return sim() ? static_cast<double>(k) * 0x1p-24 : 0x1p-11; }

// =================================================================================================
// quantize_activations
// =================================================================================================
TEST(GpuOps, QuantizeActivations) {
  const std::vector<std::int64_t> ks = small() ? std::vector<std::int64_t>{32, 96, 128, 256, 416}
                                             : std::vector<std::int64_t>{32, 96, 128, 256, 416, 4096, 7168};
  for (std::int64_t k : ks) {
    std::int64_t all_codes = 0, all_code_diff = 0, all_scales = 0, all_scale_diff = 0;
    for (std::int64_t rows : kRows) {
      std::mt19937_64 rng(seed_of({1, k, rows}));
      const std::int64_t ld = k + (rows % 2 == 1 ? 64 : 0);  // strided input for odd row counts
      std::vector<float> x = bf16_activations(static_cast<std::size_t>(rows * ld), 1.0f, rng);
      // One row of tiny values (the amax floor) and one of large ones.
      if (rows > 2) {
        for (std::int64_t c = 0; c < k; ++c) x[static_cast<std::size_t>(ld + c)] = round_to_bf16(x[static_cast<std::size_t>(ld + c)] * 1e-6f);
        for (std::int64_t c = 0; c < k; ++c) x[static_cast<std::size_t>(2 * ld + c)] = round_to_bf16(x[static_cast<std::size_t>(2 * ld + c)] * 300.0f);
      }
      DevArray<std::uint16_t> dx(to_bf16(x));
      const std::int64_t kb = (k + 127) / 128;
      DevArray<std::uint8_t> codes(static_cast<std::size_t>(rows * k));
      DevArray<float> scales(static_cast<std::size_t>(rows * kb));
      gpu::quantize_activations(dx.get(), ld, rows, k, codes.get(), scales.get(), nullptr, st());
      const auto gc = codes.download();
      const auto gs = scales.download();
      std::int64_t code_diff = 0, scale_diff = 0, sim_diff = 0;
      for (std::int64_t r = 0; r < rows; ++r) {
        std::span<const float> row(x.data() + r * ld, static_cast<std::size_t>(k));
        std::vector<std::uint8_t> rc;
        std::vector<float> rs;
        quantize_row_ref(row, rc, rs);
        for (std::int64_t c = 0; c < k; ++c) code_diff += gc[static_cast<std::size_t>(r * k + c)] != rc[static_cast<std::size_t>(c)];
        for (std::int64_t b = 0; b < kb; ++b)
          scale_diff += std::memcmp(&gs[static_cast<std::size_t>(r * kb + b)], &rs[static_cast<std::size_t>(b)], 4) != 0;
        // The values linear() uses: fp8_simulate_activation = code x scale.
        std::vector<float> simulated(row.begin(), row.end());
        fp8_simulate_activation(simulated);
        for (std::int64_t c = 0; c < k; ++c) {
          const float v = e4m3_to_f32(gc[static_cast<std::size_t>(r * k + c)]) * gs[static_cast<std::size_t>(r * kb + c / 128)];
          sim_diff += !(v == simulated[static_cast<std::size_t>(c)]);
        }
      }
      EXPECT_EQ(code_diff, 0) << "k " << k << " rows " << rows;
      EXPECT_EQ(scale_diff, 0) << "k " << k << " rows " << rows;
      EXPECT_EQ(sim_diff, 0) << "k " << k << " rows " << rows;
      all_codes += rows * k;
      all_code_diff += code_diff;
      all_scales += rows * kb;
      all_scale_diff += scale_diff;
    }
    ErrStats s;
    s.n = all_codes;
    s.differing = all_code_diff + all_scale_diff;
    report_line("quantize_activations", fmt::format("k {} rows 1..130 x{} (odd rows: ld k+64)", k, kRows.size()), "-", "-",
                fmt::format("{}/{} codes, {}/{} scales", all_code_diff, all_codes, all_scale_diff, all_scales),
                "exact vs quantize_blocks (codes, scales) and fp8_simulate_activation");
  }
}

// =================================================================================================
// gemm_quantized: fp8 (128x128 scales) and fp4 (1x32) weights, both kernels, vs cpu linear
// =================================================================================================
struct GemmShape {
  std::int64_t n, k;
};

TEST(GpuOps, GemmQuantized) {
  // n a multiple of 128 and k of 512 (128 x 512, 1024 x 2048) also run cuBLASLt's block-scaled
  // product (GemmPath::kLibrary) where the build has it and it has an algorithm for the row count.
  const std::vector<GemmShape> shapes = small() ? std::vector<GemmShape>{{160, 256}, {64, 96}, {136, 416}, {48, 32}, {128, 128}, {128, 512}}
                                              : std::vector<GemmShape>{{160, 256}, {64, 96}, {136, 416}, {48, 32}, {128, 128}, {128, 512}, {1056, 2176}, {4160, 1024}, {1024, 2048}};
  std::int64_t library_runs = 0;
  std::vector<std::string> library_refused;
  for (WeightFormat f : {WeightFormat::kFp8, WeightFormat::kFp4}) {
    for (const GemmShape& sh : shapes) {
      std::mt19937_64 rng(seed_of({2, static_cast<std::int64_t>(f), sh.n, sh.k}));
      const TestWeight tw = make_weight(f, sh.n, sh.k, 0.05f, rng);
      const DenseWeight dw = tw.dense();
      DevWeight gw = upload_weight(tw);
      Sweep sweep;
      for (std::int64_t rows : kRows) {
        std::vector<float> x = bf16_activations(static_cast<std::size_t>(rows * sh.k), 1.0f, rng);
        std::vector<float> ref(static_cast<std::size_t>(rows * sh.n));
        linear(x, rows, dw, ref, cpu_pool());
        // Magnitudes of the sums, and the exact fp32-output reference (double).
        std::vector<double> mag(ref.size()), exact(ref.size());
        cpu_pool()->parallel_for(0, rows, [&](std::int64_t r) {
          std::vector<float> xs(x.begin() + r * sh.k, x.begin() + (r + 1) * sh.k);
          fp8_simulate_activation(xs);
          for (std::int64_t o = 0; o < sh.n; ++o) {
            double m = 0, e = 0;
            const float* wr = tw.values.data() + o * sh.k;
            for (std::int64_t c = 0; c < sh.k; ++c) {
              const double p = static_cast<double>(xs[static_cast<std::size_t>(c)]) * wr[c];
              m += std::fabs(p);
              e += p;
            }
            mag[static_cast<std::size_t>(r * sh.n + o)] = m;
            exact[static_cast<std::size_t>(r * sh.n + o)] = e;
          }
        });
        DevArray<std::uint16_t> dx(to_bf16(x));
        DevArray<std::uint8_t> codes(static_cast<std::size_t>(rows * sh.k));
        DevArray<float> scales(static_cast<std::size_t>(rows * ((sh.k + 127) / 128)));
        gpu::quantize_activations(dx.get(), sh.k, rows, sh.k, codes.get(), scales.get(), nullptr, st());
        const gpu::QuantizedRows qa{codes.get(), scales.get(), sh.k};
        for (GemmPath path : {GemmPath::kFewRows, GemmPath::kTiles, GemmPath::kLibrary, GemmPath::kStream}) {
          if (path == GemmPath::kStream && f != WeightFormat::kFp8) continue;
          // bf16 output with a padded row stride (the padding must stay poisoned)
          const std::int64_t ld = sh.n + 8;
          DevArray<std::uint16_t> out(static_cast<std::size_t>(rows * ld));
          if (path == GemmPath::kLibrary) {
            if (!gpu::gemm_library_supports(rows, gw.w, gpu::GemmOutput{out.get(), ld, false})) {
              if (f == WeightFormat::kFp8 && sh.n % 128 == 0 && sh.k % 512 == 0) {
                if (library_refused.empty()) std::printf("[gemm] cuBLASLt refused %lld rows x n %lld x k %lld: %s\n",
                                                         static_cast<long long>(rows), static_cast<long long>(sh.n),
                                                         static_cast<long long>(sh.k), gpu::gemm_library_refusal().c_str());
                library_refused.push_back(fmt::format("{}x{}x{}", rows, sh.n, sh.k));
              }
              continue;
            }
            ++library_runs;
          }
          gpu::gemm_quantized(qa, rows, gw.w, gpu::GemmOutput{out.get(), ld, false}, nullptr, st(), path);
          const auto got_bits = out.download();
          std::vector<float> got(ref.size());
          std::int64_t pad_written = 0;
          for (std::int64_t r = 0; r < rows; ++r) {
            for (std::int64_t o = 0; o < sh.n; ++o)
              got[static_cast<std::size_t>(r * sh.n + o)] = bf16_bits_to_f32(got_bits[static_cast<std::size_t>(r * ld + o)]);
            for (std::int64_t o = sh.n; o < ld; ++o) pad_written += got_bits[static_cast<std::size_t>(r * ld + o)] != 0xFFFF;
          }
          const ErrStats s = compare(got, ref);
          NearCheck near;
          for (std::size_t i = 0; i < got.size(); ++i) near.check(got[i], ref[i], mag[i], order_bound(sh.k), true, static_cast<std::int64_t>(i));
          const std::string shape = fmt::format("{} {} rows {} n {} k {}", fmt_name(f), path_name(path), rows, sh.n, sh.k);
          EXPECT_EQ(s.nonfinite, 0) << shape;
          EXPECT_EQ(pad_written, 0) << shape << ": wrote past the output columns";
          EXPECT_LT(s.rel_l2(), 1e-2) << shape;
          EXPECT_EQ(near.bad, 0) << shape << ": " << near.first;
          sweep.add("gemm_quantized", fmt::format("{} {} n {} k {}", fmt_name(f), path_name(path), sh.n, sh.k), s,
                    "bf16 out (ld n+8) vs linear; <= 1 bf16 ulp + sum-order bound");
        }
        if (rows == 9 || rows == 130) {
          // fp32 output against the exact (double) sum.
          for (GemmPath path : {GemmPath::kFewRows, GemmPath::kTiles, GemmPath::kStream}) {
            if (path == GemmPath::kStream && f != WeightFormat::kFp8) continue;
            DevArray<float> out(static_cast<std::size_t>(rows * sh.n));
            gpu::gemm_quantized(qa, rows, gw.w, gpu::GemmOutput{out.get(), sh.n, true}, nullptr, st(), path);
            const auto got = out.download();
            std::vector<float> ex(exact.begin(), exact.end());
            const ErrStats s = compare(got, ex);
            NearCheck near;
            for (std::size_t i = 0; i < got.size(); ++i) near.check(got[i], static_cast<float>(exact[i]), mag[i], order_bound(sh.k), false, static_cast<std::int64_t>(i));
            const std::string shape = fmt::format("{} {} rows {} n {} k {} f32", fmt_name(f), path_name(path), rows, sh.n, sh.k);
            EXPECT_EQ(s.nonfinite, 0) << shape;
            EXPECT_EQ(near.bad, 0) << shape << ": " << near.first;
            sweep.add("gemm_quantized f32", fmt::format("{} {} n {} k {}", fmt_name(f), path_name(path), sh.n, sh.k), s,
                      "f32 out vs the exact (double) sum");
          }
        }
      }
      sweep.flush("rows 1..130 x11 (f32: 9, 130)");
    }
  }
  std::printf("[gemm] cuBLASLt block-scaled product: %lld cases run; refused (rows x n x k): %s\n", static_cast<long long>(library_runs),
              library_refused.empty() ? "none" : fmt::format("{}", fmt::join(library_refused, " ")).c_str());
  if (!sim()) {
    // The real build links cuBLASLt: its path must have run (a silent fallback would hide it).
    EXPECT_GT(library_runs, 0);
  }
}

// cuBLASLt's block-scaled product (GemmPath::kLibrary) with a power-of-two scale of its own for
// every activation row and 128-block and every 128 x 128 weight block, so a scale read from the
// wrong place shows; row counts that are and are not multiples of 8, against cpu linear.
// The FP8 form of the stream kernel on the host, for activation row `codes` and weight row `w`:
// each 128-wide unit's chain of k32 products through the model of the tensor core's sums
// (numerics/fp8_dot_model.h), times (weight scale x activation scale) into its split's fp32 sum,
// the splits' sums added in split order; bf16.
float stream_fp8_reference(const std::uint8_t* codes, const float* a_scales, const std::uint8_t* w,
                           const float* w_scales, std::int64_t k, int per) {
  const std::int64_t units = (k + 127) / 128;
  const std::int64_t splits = (units + per - 1) / per;
  float total = 0.0f;
  for (std::int64_t s = 0; s < splits; ++s) {
    float acc = 0.0f;
    for (std::int64_t u = s * per; u < std::min<std::int64_t>(units, (s + 1) * per); ++u) {
      const auto len = static_cast<std::size_t>(std::min<std::int64_t>(128, k - 128 * u));
      const float unit = fp8_dot(kHopperFp8Dot, 0.0f, std::span<const std::uint8_t>(codes + 128 * u, len),
                                 std::span<const std::uint8_t>(w + 128 * u, len));
      acc += unit * (w_scales[u] * a_scales[u]);
    }
    total = splits == 1 ? acc : total + acc;
  }
  return round_to_bf16(total);
}

TEST(GpuOps, GemmLibraryScales) {
  if (sim()) {
    // The simulator build has no cuBLASLt: the library path must say no (gemm.h then keeps its
    // own kernels) and a forced kLibrary product must fail loudly, not fall back in silence.
    std::mt19937_64 rng(1);
    const TestWeight tw = make_weight(WeightFormat::kFp8, 256, 512, 0.05f, rng);
    DevWeight gw = upload_weight(tw);
    DevArray<std::uint8_t> codes(8 * 512);
    DevArray<float> scales(8 * 4);
    DevArray<std::uint16_t> out(8 * 256);
    const gpu::GemmOutput o{out.get(), 256, false};
    EXPECT_FALSE(gpu::gemm_library_supports(8, gw.w, o));
    EXPECT_NE(gpu::gemm_library_refusal().find("no cuBLASLt"), std::string::npos) << gpu::gemm_library_refusal();
    EXPECT_THROW(gpu::gemm_quantized(gpu::QuantizedRows{codes.get(), scales.get(), 512}, 8, gw.w, o, nullptr, st(), GemmPath::kLibrary),
                 std::runtime_error);
    return;
  }
  struct Case {
    std::int64_t n, k;
    std::vector<std::int64_t> rows;
  };
  std::int64_t runs = 0, model_outputs = 0, model_differ = 0, cpu_differ = 0;
  std::vector<std::string> refused;
  for (const Case& c : {Case{256, 512, {4, 5, 8, 12, 24, 37, 300, 301, 1000}}, Case{512, 512, {300}}, Case{1024, 2048, {8, 24, 37, 300}}}) {
    std::mt19937_64 rng(seed_of({43, c.n, c.k}));
    TestWeight tw = make_weight(WeightFormat::kFp8, c.n, c.k, 0.05f, rng);
    const std::int64_t kbw = (c.k + 127) / 128;
    for (std::int64_t bi = 0; bi * 128 < c.n; ++bi) {
      for (std::int64_t bk = 0; bk < kbw; ++bk) {
        const int j = static_cast<int>((bi * 3 + bk * 5) % 7) - 3;
        const auto i = static_cast<std::size_t>(bi * kbw + bk);
        tw.scales_u8[i] = static_cast<std::uint8_t>(tw.scales_u8[i] + j);
        tw.scales_f32[i] = std::ldexp(tw.scales_f32[i], j);
        for (std::int64_t o = bi * 128; o < std::min(c.n, (bi + 1) * 128); ++o)
          for (std::int64_t kk = bk * 128; kk < std::min(c.k, (bk + 1) * 128); ++kk)
            tw.values[static_cast<std::size_t>(o * c.k + kk)] = std::ldexp(tw.values[static_cast<std::size_t>(o * c.k + kk)], j);
      }
    }
    const DenseWeight dw = tw.dense();
    DevWeight gw = upload_weight(tw);
    Sweep sweep;
    for (std::int64_t rows : c.rows) {
      std::vector<float> x = bf16_activations(static_cast<std::size_t>(rows * c.k), 1.0f, rng);
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t kk = 0; kk < c.k; ++kk)
          x[static_cast<std::size_t>(r * c.k + kk)] = std::ldexp(x[static_cast<std::size_t>(r * c.k + kk)], static_cast<int>((r * 7 + (kk / 128) * 3) % 9) - 4);
      std::vector<float> ref(static_cast<std::size_t>(rows * c.n));
      linear(x, rows, dw, ref, cpu_pool());
      std::vector<double> mag(ref.size());
      cpu_pool()->parallel_for(0, rows, [&](std::int64_t r) {
        std::vector<float> xs(x.begin() + r * c.k, x.begin() + (r + 1) * c.k);
        fp8_simulate_activation(xs);
        for (std::int64_t o = 0; o < c.n; ++o) {
          double m = 0;
          for (std::int64_t kk = 0; kk < c.k; ++kk)
            m += std::fabs(static_cast<double>(xs[static_cast<std::size_t>(kk)]) * tw.values[static_cast<std::size_t>(o * c.k + kk)]);
          mag[static_cast<std::size_t>(r * c.n + o)] = m;
        }
      });
      DevArray<std::uint16_t> dx(to_bf16(x));
      DevArray<std::uint8_t> codes(static_cast<std::size_t>(rows * c.k));
      DevArray<float> scales(static_cast<std::size_t>(rows * kbw));
      gpu::quantize_activations(dx.get(), c.k, rows, c.k, codes.get(), scales.get(), nullptr, st());
      DevArray<std::uint16_t> out(ref.size());
      const gpu::GemmOutput o{out.get(), c.n, false};
      if (!gpu::gemm_library_supports(rows, gw.w, o)) {
        refused.push_back(fmt::format("{}x{}x{} ({})", rows, c.n, c.k, gpu::gemm_library_refusal()));
        continue;
      }
      ++runs;
      gpu::gemm_quantized(gpu::QuantizedRows{codes.get(), scales.get(), c.k}, rows, gw.w, o, nullptr, st(), GemmPath::kLibrary);
      const std::vector<float> got = from_bf16(out.download());
      const ErrStats s = compare(got, ref);
      NearCheck near;
      for (std::size_t i = 0; i < got.size(); ++i) near.check(got[i], ref[i], mag[i], order_bound(c.k), true, static_cast<std::int64_t>(i));
      const std::string shape = fmt::format("cublaslt rows {} n {} k {} (scales vary by row and block)", rows, c.n, c.k);
      EXPECT_EQ(s.nonfinite, 0) << shape;
      EXPECT_LT(s.rel_l2(), 1e-2) << shape;
      EXPECT_EQ(near.bad, 0) << shape << ": " << near.first;
      sweep.add("gemm_quantized", fmt::format("fp8 cublaslt n {} k {} scales varied", c.n, c.k), s, "bf16 out vs linear; <= 1 bf16 ulp + sum-order bound");
      // Whether cuBLASLt sums as the reference's fp8 GEMM does (each 128-wide block a chain of
      // FP8 tensor-core products, numerics/fp8_dot_model.h, the blocks added in order): counted,
      // not asserted, to explain its difference from the CPU executor in the model test.
      const std::vector<std::uint8_t> h_codes = codes.download();
      const std::vector<float> h_scales = scales.download();
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t n = 0; n < c.n; ++n) {
          const float want = stream_fp8_reference(
              &h_codes[static_cast<std::size_t>(r * c.k)], &h_scales[static_cast<std::size_t>(r * kbw)],
              &tw.data[static_cast<std::size_t>(n * c.k)], &tw.scales_f32[static_cast<std::size_t>((n / 128) * kbw)],
              c.k, static_cast<int>(kbw));
          const float have = got[static_cast<std::size_t>(r * c.n + n)];
          model_outputs += 1;
          if (!(have == want)) ++model_differ;
        }
      cpu_differ += s.differing;
    }
    sweep.flush("rows " + fmt::format("{}", fmt::join(c.rows, ",")));
  }
  std::printf("[gemm] cuBLASLt calibration: %s\n", gpu::gemm_library_calibration().c_str());
  std::printf("[gemm] cuBLASLt with varied scales: %lld products checked; refused: %s\n", static_cast<long long>(runs),
              refused.empty() ? "none" : fmt::format("{}", fmt::join(refused, "; ")).c_str());
  std::printf(
      "[gemm] cuBLASLt against the FP8 tensor-core model of the reference's fp8 GEMM: %lld of %lld outputs differ "
      "(against the CPU executor: %lld)\n",
      static_cast<long long>(model_differ), static_cast<long long>(model_outputs), static_cast<long long>(cpu_differ));
  EXPECT_GT(runs, 0) << "the real build links cuBLASLt: its path must run";
}

// The few-rows kernel's block shapes by output width (warps along n x warps along k, for one row
// tile: 1 x 8 up to 8416 weight rows, 2 x 4 from 8417, 4 x 2 from 16833, 8 x 1 from 33665), output
// widths that are not a multiple of 16 (a warp's last rows past the end), k split unevenly over
// warps and k tails within a 128-wide unit, long rows (many units a warp), against cpu linear
// element by element.
TEST(GpuOps, GemmFewRowsShapes) {
  struct Case {
    GemmShape shape;
    const char* what;
  };
  const std::vector<Case> cases = {{{4, 64}, "n < 16"},
                                   {{24, 1184}, "k 9.25 units over 8 warps"},
                                   {{40, 96}, "k tail in the first unit"},
                                   {{4232, 64}, "1 x 8 warps"},
                                   {{8456, 160}, "2 x 4 warps"},
                                   {{16904, 32}, "4 x 2 warps"},
                                   {{33800, 32}, "8 x 1 warps"},
                                   {{40, 4256}, "34 units over 8 warps, a tail"},
                                   {{24, 8192}, "64 units over 8 warps"},
                                   {{32, 8192}, "8 units a warp (fp4, tiled: two passes of the bulk kernel's ring of two-unit slots)"},
                                   {{32, 4224}, "4 or 5 units a warp (fp4, tiled: two-unit slots, a last slot of one)"},
                                   {{32, 7168}, "7 units a warp (fp4, tiled: the bulk kernel with a ring of one unit)"}};
  for (WeightFormat f : {WeightFormat::kFp8, WeightFormat::kFp4}) {
    for (const Case& c : cases) {
      const GemmShape& sh = c.shape;
      std::mt19937_64 rng(seed_of({13, static_cast<std::int64_t>(f), sh.n, sh.k}));
      const TestWeight tw = make_weight(f, sh.n, sh.k, 0.05f, rng);
      const DenseWeight dw = tw.dense();
      DevWeight gw = upload_weight(tw);
      Sweep sweep;
      // One row tile (rows <= 8) keeps the block shapes above; 9 and 17 rows take two and three.
      const std::vector<std::int64_t> rows_list = small() && sh.n > 1000 ? std::vector<std::int64_t>{1} : std::vector<std::int64_t>{1, 8, 9, 17};
      for (std::int64_t rows : rows_list) {
        std::vector<float> x = bf16_activations(static_cast<std::size_t>(rows * sh.k), 1.0f, rng);
        std::vector<float> ref(static_cast<std::size_t>(rows * sh.n));
        linear(x, rows, dw, ref, cpu_pool());
        DevArray<std::uint16_t> dx(to_bf16(x));
        DevArray<std::uint8_t> codes(static_cast<std::size_t>(rows * sh.k));
        DevArray<float> scales(static_cast<std::size_t>(rows * ((sh.k + 127) / 128)));
        gpu::quantize_activations(dx.get(), sh.k, rows, sh.k, codes.get(), scales.get(), nullptr, st());
        DevArray<std::uint16_t> out(static_cast<std::size_t>(rows * sh.n));
        gpu::gemm_quantized(gpu::QuantizedRows{codes.get(), scales.get(), sh.k}, rows, gw.w, gpu::GemmOutput{out.get(), sh.n, false}, nullptr, st(),
                            GemmPath::kFewRows);
        const std::vector<float> got = from_bf16(out.download());
        const ErrStats s = compare(got, ref);
        const std::string shape = fmt::format("{} few-rows rows {} n {} k {}", fmt_name(f), rows, sh.n, sh.k);
        // magnitudes of the sums (the order bound's scale)
        std::vector<float> mag(ref.size());
        for (std::int64_t r = 0; r < rows; ++r) {
          std::vector<float> xs(x.begin() + r * sh.k, x.begin() + (r + 1) * sh.k);
          fp8_simulate_activation(xs);
          for (std::int64_t o = 0; o < sh.n; ++o) {
            double m = 0;
            for (std::int64_t j = 0; j < sh.k; ++j) m += std::fabs(static_cast<double>(xs[static_cast<std::size_t>(j)]) * tw.values[static_cast<std::size_t>(o * sh.k + j)]);
            mag[static_cast<std::size_t>(r * sh.n + o)] = static_cast<float>(m);
          }
        }
        NearCheck near;
        for (std::size_t i = 0; i < got.size(); ++i) near.check(got[i], ref[i], mag[i], order_bound(sh.k), true, static_cast<std::int64_t>(i));
        EXPECT_EQ(s.nonfinite, 0) << shape;
        EXPECT_LT(s.rel_l2(), 1e-2) << shape;
        EXPECT_EQ(near.bad, 0) << shape << ": " << near.first;
        sweep.add("gemm_quantized", fmt::format("{} few-rows n {} k {}", fmt_name(f), sh.n, sh.k), s, c.what);
      }
      sweep.flush(small() && sh.n > 1000 ? "rows 1" : "rows 1,8,9,17");
    }
  }
}

// UE8M0 scale bytes 0 (2^-127) and 255 (NaN) do not occur in real checkpoints. The fp4 few-rows
// products decode scale bytes as plain exponents when the weight was checked free of them (gemm.h
// fp4_scales_normal) and take an exact path otherwise. Tiled (the bulk kernel) and untiled shapes,
// fp32 output against the exact (double) sums; no absolute floor, so a 2^-127 row read as 0 fails.
TEST(GpuOps, GemmFp4SpecialScales) {
  for (const GemmShape& sh : {GemmShape{32, 512}, GemmShape{48, 96}}) {
    std::mt19937_64 rng(seed_of({29, sh.n, sh.k}));
    const TestWeight tw = make_weight(WeightFormat::kFp4, sh.n, sh.k, 0.05f, rng);
    const std::int64_t rows = 3, kb = sh.k / 32;
    const std::string shape = fmt::format("fp4 few-rows rows {} n {} k {}", rows, sh.n, sh.k);
    std::vector<float> x = bf16_activations(static_cast<std::size_t>(rows * sh.k), 1.0f, rng);
    DevArray<std::uint16_t> dx(to_bf16(x));
    DevArray<std::uint8_t> codes(static_cast<std::size_t>(rows * sh.k));
    DevArray<float> scales(static_cast<std::size_t>(rows * ((sh.k + 127) / 128)));
    gpu::quantize_activations(dx.get(), sh.k, rows, sh.k, codes.get(), scales.get(), nullptr, st());
    const gpu::QuantizedRows qa{codes.get(), scales.get(), sh.k};
    // The few-rows kernel, and for tiled shapes also the wgmma expert kernel (the weight as one
    // expert, the rows as one tile of kWgmmaExpertRows).
    const bool tiled = gpu::fp4_tiled(sh.n, sh.k);
    std::vector<std::int32_t> all_rows(static_cast<std::size_t>(rows));
    std::iota(all_rows.begin(), all_rows.end(), 0);
    DevArray<std::int32_t> t_src(all_rows), t_zero(std::vector<std::int32_t>{0}),
        t_rows(std::vector<std::int32_t>{static_cast<std::int32_t>(rows)}), t_num(std::vector<std::int32_t>{1});
    const auto product = [&](const gpu::DeviceWeight& w, bool wgmma) {
      DevArray<float> out(static_cast<std::size_t>(rows * sh.n));
      if (wgmma) {
        const gpu::ExpertTiles tiles{t_src.get(), t_zero.get(), t_zero.get(), t_rows.get(), t_num.get(), 1, gpu::kWgmmaExpertRows};
        gpu::gemm_quantized_experts(qa, tiles, w, gpu::GemmOutput{out.get(), sh.n, true}, st());
      } else {
        gpu::gemm_quantized(qa, rows, w, gpu::GemmOutput{out.get(), sh.n, true}, nullptr, st(), GemmPath::kFewRows);
      }
      return out.download();
    };

    // Plain scales: the check says so, and where the flag picks the decoding (the bulk and wgmma
    // kernels, for tiled shapes; the untiled kernel always tests the bytes) both decodings give the
    // same bits.
    DevWeight gw = upload_weight(tw);
    EXPECT_TRUE(gw.w.fp4_scales_normal) << shape;
    if (tiled) {
      for (bool wgmma : {false, true}) {
        gw.w.fp4_scales_normal = true;
        const std::vector<float> fast = product(gw.w, wgmma);
        gw.w.fp4_scales_normal = false;
        const std::vector<float> checked = product(gw.w, wgmma);
        EXPECT_EQ(std::memcmp(fast.data(), checked.data(), fast.size() * sizeof(float)), 0)
            << shape << (wgmma ? " (wgmma)" : "") << ": the decodings differ";
      }
    }

    // Row 1: every byte 0; row 6: block 1 is 255 (its outputs NaN); row 11: block 0 is 0.
    TestWeight ts = tw;
    // (the values of the 0 bytes from the CPU decoding; row 6 is only checked to be NaN)
    for (std::int64_t b = 0; b < kb; ++b) ts.scales_u8[static_cast<std::size_t>(kb + b)] = 0;
    ts.scales_u8[static_cast<std::size_t>(11 * kb)] = 0;
    dequantize_weight_fp4_1x32(ts.data.data(), ts.scales_u8.data(), static_cast<std::size_t>(sh.n), static_cast<std::size_t>(sh.k),
                               ts.values.data());
    ts.scales_u8[static_cast<std::size_t>(6 * kb + 1)] = 0xff;
    const DevWeight gs = upload_weight(ts);
    EXPECT_FALSE(gs.w.fp4_scales_normal) << shape;
    for (bool wgmma : tiled ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
      const std::vector<float> got = product(gs.w, wgmma);
      std::int64_t bad = 0;
      std::string first;
      for (std::int64_t r = 0; r < rows; ++r) {
        std::vector<float> xs(x.begin() + r * sh.k, x.begin() + (r + 1) * sh.k);
        fp8_simulate_activation(xs);
        for (std::int64_t o = 0; o < sh.n; ++o) {
          double m = 0, e = 0;
          for (std::int64_t c = 0; c < sh.k; ++c) {
            const double p = static_cast<double>(xs[static_cast<std::size_t>(c)]) * ts.values[static_cast<std::size_t>(o * sh.k + c)];
            m += std::fabs(p);
            e += p;
          }
          const float g = got[static_cast<std::size_t>(r * sh.n + o)];
          const bool ok = o == 6 ? std::isnan(g) : std::fabs(static_cast<double>(g) - e) <= 1e-3 * m && (e == 0) == (g == 0.0f);
          if (!ok && bad++ == 0) first = fmt::format("row {} output {}: got {} expected {}", r, o, g, e);
        }
      }
      EXPECT_EQ(bad, 0) << shape << (wgmma ? " (wgmma)" : "") << ": " << first;
      report_line("gemm_quantized (fp4 scales)", wgmma ? shape + " wgmma experts" : shape, "-", "-", fmt::format("{} bad", bad),
                  tiled ? "bytes 0 / 255 exact; plain decoding bit-identical" : "bytes 0 / 255 exact");
    }
  }
}

// The GPU layout of fp4 weights: in each full 128-wide k unit of a row, word 4s + t moves to
// 4t + s; a tail (k % 128) keeps its word order; inside every word the 8 values are repacked (value j
// in the low nibble of byte j, value j + 4 in its high nibble). Tiled shapes (gemm.h fp4_tiled)
// then store unit u of row r of each 16-row group at 1024 u + 64 r of the group, and the unit's
// scale bytes at 64 u + 4 r; other shapes keep rows and scales in order. fp4_from_gpu_layout gives
// the input back.
TEST(GpuOps, Fp4GpuLayout) {
  struct Shape {
    std::int64_t matrices, n, k;
  };
  for (const Shape& sh : std::vector<Shape>{{1, 3, 128}, {1, 5, 160}, {1, 2, 416}, {1, 7, 32}, {2, 8, 256},
                                            {2, 32, 256}, {3, 16, 384}, {1, 48, 1152}, {1, 16, gpu::kFp4TiledMaxK},
                                            {1, 16, gpu::kFp4TiledMaxK + 128}}) {
    const std::int64_t rows = sh.matrices * sh.n, k = sh.k;
    const bool tiled = gpu::fp4_tiled(sh.n, k);
    std::mt19937_64 rng(seed_of({41, sh.matrices, sh.n, k}));
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(rows * k / 2)), scales(static_cast<std::size_t>(rows * k / 32));
    for (std::uint8_t& b : bytes) b = static_cast<std::uint8_t>(rng());
    for (std::uint8_t& b : scales) b = static_cast<std::uint8_t>(rng());
    DevArray<std::uint8_t> d(bytes), ds(scales);
    gpu::fp4_to_gpu_layout(d.get(), ds.get(), sh.matrices, sh.n, k, st());
    const std::vector<std::uint8_t> once = d.download(), once_s = ds.download();
    // where byte b (0..63) of unit u of row r lives: row order or the tiled order
    const std::int64_t units = k / 128;
    auto at = [&](std::int64_t r, std::int64_t byte_in_row) {
      if (!tiled) return r * k / 2 + byte_in_row;
      const std::int64_t u = byte_in_row / 64;
      return (r / 16) * 16 * (k / 2) + u * 1024 + (r % 16) * 64 + byte_in_row % 64;
    };
    // value i (0..7) of a checkpoint word: nibble i, little-endian
    auto value = [](const std::uint8_t* word, int i) { return (word[i / 2] >> (4 * (i % 2))) & 0xf; };
    std::int64_t wrong = 0, wrong_scales = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t w = 0; w < k / 8; ++w) {  // word w of the row in the GPU layout
        std::int64_t src = w;                    // comes from checkpoint word src
        if (w < units * 16) {
          const std::int64_t unit = w / 16, t = (w % 16) / 4, sblk = w % 4;
          src = unit * 16 + 4 * sblk + t;
        }
        const std::uint8_t* in = &bytes[static_cast<std::size_t>(r * k / 2 + 4 * src)];
        for (int j = 0; j < 4; ++j) {
          const int want = value(in, j) | (value(in, j + 4) << 4);
          wrong += once[static_cast<std::size_t>(at(r, 4 * w + j))] != want;
        }
      }
      for (std::int64_t b = 0; b < k / 32; ++b) {
        const std::int64_t to = tiled ? (r / 16) * 16 * (k / 32) + (b / 4) * 64 + (r % 16) * 4 + b % 4 : r * k / 32 + b;
        wrong_scales += once_s[static_cast<std::size_t>(to)] != scales[static_cast<std::size_t>(r * k / 32 + b)];
      }
    }
    const std::string what = fmt::format("{} x {} rows, k {}{}", sh.matrices, sh.n, k, tiled ? " (tiled)" : "");
    EXPECT_EQ(wrong, 0) << what;
    EXPECT_EQ(wrong_scales, 0) << what;
    gpu::fp4_from_gpu_layout(d.get(), ds.get(), sh.matrices, sh.n, k, st());
    EXPECT_EQ(d.download(), bytes) << "back to checkpoint order: " << what;
    EXPECT_EQ(ds.download(), scales) << "scales back to checkpoint order: " << what;
  }
}

// The weight-streaming kernel's plans (gemm_stream.h): one tile or several tiles a warpgroup, a
// warpgroup without tiles, k split over CTAs (unevenly; partials added by the last to arrive),
// activation rows of 8 to 64 a CTA and several such blocks, weights whose last tile is partial,
// k tails. Each product runs twice (the arrival counts must be back at zero, and the bits must
// repeat). Against cpu linear, element by element: one bf16 ulp plus the summation-order bound
// (order_bound). At 9-64 rows of wide outputs, the executor's choice must give the same bits.
TEST(GpuOps, GemmStreamShapes) {
  struct Case {
    GemmShape shape;
    std::vector<std::int64_t> rows;
    const char* what;
  };
  // (Plans on 132 multiprocessors; the simulator reports 132 too.)
  std::vector<Case> cases = {{{25600, 128}, {1, 64}, "400 tiles, one split; two tiles a warpgroup at 64 rows"},
                             {{4104, 4096}, {1, 9, 64}, "65 tiles (the last of 8 rows) on 66 warpgroups, 8 splits (4 at 64 rows)"},
                             {{320, 16384}, {33, 128}, "uneven splits: 43 of 3 units (the last 2); 22 of 6 (the last 2) x 2 blocks of 64 rows"},
                             {{96, 1184}, {5, 17}, "k tail of 32 in the last unit; both tiles in one CTA"}};
  for (const Case& c : cases) {
    const GemmShape& sh = c.shape;
    std::mt19937_64 rng(seed_of({17, sh.n, sh.k}));
    const TestWeight tw = make_weight(WeightFormat::kFp8, sh.n, sh.k, 0.05f, rng);
    const DenseWeight dw = tw.dense();
    DevWeight gw = upload_weight(tw);
    Sweep sweep;
    for (std::int64_t rows : c.rows) {
      if (small() && rows > 16 && sh.n * sh.k > (std::int64_t{1} << 22)) continue;
      std::vector<float> x = bf16_activations(static_cast<std::size_t>(rows * sh.k), 1.0f, rng);
      std::vector<float> ref(static_cast<std::size_t>(rows * sh.n));
      linear(x, rows, dw, ref, cpu_pool());
      std::vector<double> mag(ref.size());  // sum |a_i w_i| of each output
      cpu_pool()->parallel_for(0, rows, [&](std::int64_t r) {
        std::vector<float> xs(x.begin() + r * sh.k, x.begin() + (r + 1) * sh.k);
        fp8_simulate_activation(xs);
        for (std::int64_t o = 0; o < sh.n; ++o) {
          double m = 0;
          const float* wr = tw.values.data() + o * sh.k;
          for (std::int64_t kk = 0; kk < sh.k; ++kk) m += std::fabs(static_cast<double>(xs[static_cast<std::size_t>(kk)]) * wr[kk]);
          mag[static_cast<std::size_t>(r * sh.n + o)] = m;
        }
      });
      DevArray<std::uint16_t> dx(to_bf16(x));
      DevArray<std::uint8_t> codes(static_cast<std::size_t>(rows * sh.k));
      DevArray<float> scales(static_cast<std::size_t>(rows * ((sh.k + 127) / 128)));
      gpu::quantize_activations(dx.get(), sh.k, rows, sh.k, codes.get(), scales.get(), nullptr, st());
      DevArray<std::uint16_t> out(static_cast<std::size_t>(rows * sh.n));
      std::vector<std::uint16_t> first_bits;
      for (int rep = 0; rep < 2; ++rep) {
        gpu::gemm_quantized(gpu::QuantizedRows{codes.get(), scales.get(), sh.k}, rows, gw.w, gpu::GemmOutput{out.get(), sh.n, false}, nullptr,
                            st(), GemmPath::kStream);
        const std::vector<std::uint16_t> bits = out.download();
        const std::vector<float> got = from_bf16(bits);
        const ErrStats s = compare(got, ref);
        NearCheck near;
        for (std::size_t i = 0; i < got.size(); ++i) near.check(got[i], ref[i], mag[i], order_bound(sh.k), true, static_cast<std::int64_t>(i));
        const std::string shape = fmt::format("stream rows {} n {} k {} run {}", rows, sh.n, sh.k, rep);
        EXPECT_EQ(s.nonfinite, 0) << shape;
        EXPECT_LT(s.rel_l2(), 1e-2) << shape;
        EXPECT_EQ(near.bad, 0) << shape << ": " << near.first;
        if (rep == 0) {
          first_bits = bits;
          sweep.add("gemm_quantized", fmt::format("fp8 stream n {} k {}", sh.n, sh.k), s, c.what);
        } else {
          EXPECT_EQ(bits, first_bits) << shape << ": the same product twice must give the same bits";
        }
      }
      if (rows > gpu::kSmallRows && rows <= gpu::kStreamMaxRows && sh.n >= 3072) {
        // The executor's choice (GemmPath::kAuto) takes this kernel for such shapes (gemm.cu use_stream).
        gpu::gemm_quantized(gpu::QuantizedRows{codes.get(), scales.get(), sh.k}, rows, gw.w, gpu::GemmOutput{out.get(), sh.n, false}, nullptr,
                            st(), GemmPath::kAuto);
        EXPECT_EQ(out.download(), first_bits) << "rows " << rows << " n " << sh.n << ": kAuto did not take the stream kernel";
      }
    }
    sweep.flush("rows as listed");
  }
}

// An FP8 tensor-core product's outputs: bit for bit those of its host reference on the model of
// the tensor core's sums (numerics/fp8_dot_model.h), and within the GEMM tolerance of the CPU
// executor's (whose block sums keep more bits); reported with both counts.
void expect_tensor_core_model(const char* op, const std::string& shape, const std::vector<float>& got,
                              const std::vector<float>& model, const std::vector<float>& cpu, const char* note) {
  const ErrStats vs_model = compare(got, model);
  EXPECT_EQ(vs_model.nonfinite, 0) << shape;
  EXPECT_EQ(vs_model.differing, 0) << shape << ": outputs that differ from the model of the tensor core";
  const ErrStats vs_cpu = compare(got, cpu);
  EXPECT_LT(vs_cpu.rel_l2(), 1e-2) << shape;
  report(op, shape, vs_cpu,
         fmt::format("{}/{} differ from the CPU, {} from the model", vs_cpu.differing, vs_cpu.n, vs_model.differing),
         note);
}

// The stream kernel with FP8 products (gemm_stream.h StreamProducts::kFp8): bit for bit the model
// of the tensor core, whatever the plan's split of k; within the GEMM tolerance of the CPU
// executor. Rows 1..64 (every N of the product), a k tail of 32, one split and several.
TEST(GpuOps, GemmStreamFp8Products) {
  struct Case {
    GemmShape shape;
    std::vector<std::int64_t> rows;
  };
  std::vector<Case> cases = {{{96, 1184}, {1, 5, 17, 33}}, {{512, 2048}, {9, 64}}, {{25600, 128}, {1}}};
  if (!small()) cases.push_back({{4104, 4096}, {1, 9, 64}});
  for (const Case& c : cases) {
    const GemmShape& sh = c.shape;
    std::mt19937_64 rng(seed_of({71, sh.n, sh.k}));
    const TestWeight tw = make_weight(WeightFormat::kFp8, sh.n, sh.k, 0.05f, rng);
    const DenseWeight dw = tw.dense();
    DevWeight gw = upload_weight(tw);
    const std::int64_t units = (sh.k + 127) / 128;
    for (std::int64_t rows : c.rows) {
      std::vector<float> x = bf16_activations(static_cast<std::size_t>(rows * sh.k), 1.0f, rng);
      std::vector<float> cpu(static_cast<std::size_t>(rows * sh.n));
      linear(x, rows, dw, cpu, cpu_pool());
      DevArray<std::uint16_t> dx(to_bf16(x));
      DevArray<std::uint8_t> codes(static_cast<std::size_t>(rows * sh.k));
      DevArray<float> scales(static_cast<std::size_t>(rows * units));
      gpu::quantize_activations(dx.get(), sh.k, rows, sh.k, codes.get(), scales.get(), nullptr, st());
      const std::vector<std::uint8_t> h_codes = codes.download();
      const std::vector<float> h_scales = scales.download();
      const gpu::GemmOutput output{nullptr, sh.n, false};
      const int per = gpu::gemm_stream_units_per_split(rows, gw.w, output, gpu::StreamProducts::kFp8);
      std::vector<float> model(cpu.size());
      cpu_pool()->parallel_for(0, rows, [&](std::int64_t r) {
        for (std::int64_t o = 0; o < sh.n; ++o)
          model[static_cast<std::size_t>(r * sh.n + o)] = stream_fp8_reference(
              &h_codes[static_cast<std::size_t>(r * sh.k)], &h_scales[static_cast<std::size_t>(r * units)],
              &tw.data[static_cast<std::size_t>(o * sh.k)], &tw.scales_f32[static_cast<std::size_t>((o / 128) * units)],
              sh.k, per);
      });
      DevArray<std::uint16_t> out(static_cast<std::size_t>(rows * sh.n));
      gpu::gemm_stream_fp8(gpu::QuantizedRows{codes.get(), scales.get(), sh.k}, rows, gw.w,
                           gpu::GemmOutput{out.get(), sh.n, false}, nullptr, st(), gpu::StreamProducts::kFp8);
      const std::vector<float> got = from_bf16(out.download());
      const std::string shape = fmt::format("stream fp8 rows {} n {} k {} ({} units a split)", rows, sh.n, sh.k, per);
      expect_tensor_core_model("gemm_stream_fp8 (FP8)", shape, got, model, cpu, "FP8 wgmma, four k32 steps a unit");
    }
  }
}

// rows_dev: a device row count below `rows` limits the rows computed (graph replay).
TEST(GpuOps, GemmRowsDevLimit) {
  std::mt19937_64 rng(seed_of({3}));
  const std::int64_t n = 96, k = 128, rows = 20, live = 11;
  const TestWeight tw = make_weight(WeightFormat::kFp8, n, k, 0.05f, rng);
  DevWeight gw = upload_weight(tw);
  std::vector<float> x = bf16_activations(static_cast<std::size_t>(rows * k), 1.0f, rng);
  DevArray<std::uint16_t> dx(to_bf16(x));
  DevArray<std::int32_t> rows_dev(std::vector<std::int32_t>{static_cast<std::int32_t>(live)});
  for (GemmPath path : {GemmPath::kFewRows, GemmPath::kTiles, GemmPath::kStream}) {
    DevArray<std::uint8_t> codes(static_cast<std::size_t>(rows * k));
    DevArray<float> scales(static_cast<std::size_t>(rows));
    gpu::quantize_activations(dx.get(), k, rows, k, codes.get(), scales.get(), rows_dev.get(), st());
    DevArray<std::uint16_t> out(static_cast<std::size_t>(rows * n));
    gpu::gemm_quantized(gpu::QuantizedRows{codes.get(), scales.get(), k}, rows, gw.w, gpu::GemmOutput{out.get(), n, false},
                        rows_dev.get(), st(), path);
    const auto got = out.download();
    const auto gs = scales.download();
    std::int64_t written_past = 0, unwritten = 0;
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t o = 0; o < n; ++o) {
        const bool poison = got[static_cast<std::size_t>(r * n + o)] == 0xFFFF;
        if (r < live) unwritten += poison;
        else written_past += !poison;
      }
    std::int64_t scales_past = 0;
    for (std::int64_t r = live; r < rows; ++r) scales_past += !std::isnan(gs[static_cast<std::size_t>(r)]);
    EXPECT_EQ(unwritten, 0) << path_name(path);
    EXPECT_EQ(written_past, 0) << path_name(path);
    EXPECT_EQ(scales_past, 0);
  }
}

// =================================================================================================
// gemm_bf16: bf16 weights (fp32 and bf16 outputs), fp8 weights grouped (wo_a)
// =================================================================================================
TEST(GpuOps, GemmBf16) {
  // {40, 4160}: 65 units of 64 over the few-rows kernel's 8 warps
  const std::vector<GemmShape> shapes = small() ? std::vector<GemmShape>{{160, 256}, {40, 96}, {24, 32}, {40, 4160}}
                                              : std::vector<GemmShape>{{160, 256}, {40, 96}, {24, 32}, {40, 4160}, {4096, 1024}, {1056, 4096}};
  for (const GemmShape& sh : shapes) {
    std::mt19937_64 rng(seed_of({4, sh.n, sh.k}));
    const TestWeight tw = make_weight(WeightFormat::kBf16, sh.n, sh.k, 0.05f, rng);
    const DenseWeight dw = tw.dense();
    DevWeight gw = upload_weight(tw);
    Sweep sweep;
    for (std::int64_t rows : kRows) {
      const std::int64_t lda = sh.k + 32;
      std::vector<float> xa = bf16_activations(static_cast<std::size_t>(rows * lda), 1.0f, rng);
      std::vector<float> x(static_cast<std::size_t>(rows * sh.k));
      for (std::int64_t r = 0; r < rows; ++r) std::copy_n(xa.begin() + r * lda, sh.k, x.begin() + r * sh.k);
      std::vector<float> ref32(static_cast<std::size_t>(rows * sh.n)), ref16(ref32.size()), mag(ref32.size());
      linear_f32(x, rows, dw, ref32, cpu_pool());
      linear_bf16(x, rows, dw, ref16, cpu_pool());
      cpu_pool()->parallel_for(0, rows, [&](std::int64_t r) {
        for (std::int64_t o = 0; o < sh.n; ++o) {
          double m = 0;
          for (std::int64_t c = 0; c < sh.k; ++c) m += std::fabs(static_cast<double>(x[static_cast<std::size_t>(r * sh.k + c)]) * tw.values[static_cast<std::size_t>(o * sh.k + c)]);
          mag[static_cast<std::size_t>(r * sh.n + o)] = static_cast<float>(m);
        }
      });
      DevArray<std::uint16_t> dx(to_bf16(xa));
      for (GemmPath path : {GemmPath::kFewRows, GemmPath::kTiles}) {
        for (bool f32 : {true, false}) {
          std::vector<float> got(ref32.size());
          if (f32) {
            DevArray<float> out(ref32.size());
            gpu::gemm_bf16(dx.get(), lda, rows, gw.w, 1, gpu::GemmOutput{out.get(), sh.n, true}, nullptr, st(), path);
            got = out.download();
          } else {
            DevArray<std::uint16_t> out(ref32.size());
            gpu::gemm_bf16(dx.get(), lda, rows, gw.w, 1, gpu::GemmOutput{out.get(), sh.n, false}, nullptr, st(), path);
            got = from_bf16(out.download());
          }
          const std::vector<float>& ref = f32 ? ref32 : ref16;
          const ErrStats s = compare(got, ref);
          NearCheck near;
          for (std::size_t i = 0; i < got.size(); ++i) near.check(got[i], ref[i], mag[i], order_bound(sh.k), !f32, static_cast<std::int64_t>(i));
          const std::string shape = fmt::format("bf16 {} rows {} n {} k {} {}", path_name(path), rows, sh.n, sh.k, f32 ? "f32" : "bf16");
          EXPECT_EQ(s.nonfinite, 0) << shape;
          EXPECT_LT(s.rel_l2(), f32 ? (sim() ? 1e-5 : 1e-3) : 1e-2) << shape;
          EXPECT_EQ(near.bad, 0) << shape << ": " << near.first;
          sweep.add("gemm_bf16", fmt::format("bf16 {} n {} k {} {} out", path_name(path), sh.n, sh.k, f32 ? "f32" : "bf16"), s,
                    f32 ? "vs linear_f32 (lda k+32); exact products, sum order" : "vs linear_bf16 (lda k+32)");
        }
      }
    }
    sweep.flush("rows 1..130 x11");
  }
}

// The gate at decode: k split over CTAs into fp32 partials (gemm_bf16_k_partials) whose sum in
// order is the product. Splits as gemm_k_splits picks them and 3 (uneven ranges; with k 32 two of
// them are empty and must hold zeros); every partial slot of a row written, none past it.
TEST(GpuOps, GemmBf16KPartials) {
  for (const GemmShape& sh : {GemmShape{256, 4096}, GemmShape{40, 4160}, GemmShape{24, 32}}) {
    std::mt19937_64 rng(seed_of({31, sh.n, sh.k}));
    const TestWeight tw = make_weight(WeightFormat::kBf16, sh.n, sh.k, 0.05f, rng);
    const DenseWeight dw = tw.dense();
    const DevWeight gw = upload_weight(tw);
    for (std::int64_t rows : {1, 8, 9, 64}) {
      std::vector<float> x = bf16_activations(static_cast<std::size_t>(rows * sh.k), 1.0f, rng);
      std::vector<float> ref(static_cast<std::size_t>(rows * sh.n)), mag(ref.size());
      linear_f32(x, rows, dw, ref, cpu_pool());
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t o = 0; o < sh.n; ++o) {
          double m = 0;
          for (std::int64_t c = 0; c < sh.k; ++c) m += std::fabs(static_cast<double>(x[static_cast<std::size_t>(r * sh.k + c)]) * tw.values[static_cast<std::size_t>(o * sh.k + c)]);
          mag[static_cast<std::size_t>(r * sh.n + o)] = static_cast<float>(m);
        }
      DevArray<std::uint16_t> dx(to_bf16(x));
      const int picked = gpu::gemm_k_splits(rows, gw.w);
      for (int splits : {picked, 3}) {
        const std::int64_t stride = rows * sh.n + 8;  // 8 poisoned floats between partials
        DevArray<float> out(static_cast<std::size_t>(splits * stride));
        gpu::gemm_bf16_k_partials(dx.get(), sh.k, rows, gw.w, splits, out.get(), stride, nullptr, st());
        const std::vector<float> parts = out.download();
        std::vector<float> got(ref.size(), 0.0f);
        std::int64_t gap_written = 0;
        for (int p = 0; p < splits; ++p) {
          for (std::size_t i = 0; i < got.size(); ++i) got[i] += parts[static_cast<std::size_t>(p * stride) + i];
          for (std::int64_t i = rows * sh.n; i < stride; ++i) gap_written += !std::isnan(parts[static_cast<std::size_t>(p * stride + i)]);
        }
        const ErrStats s = compare(got, ref);
        NearCheck near;
        for (std::size_t i = 0; i < got.size(); ++i) near.check(got[i], ref[i], mag[i], order_bound(sh.k), false, static_cast<std::int64_t>(i));
        const std::string shape = fmt::format("bf16 rows {} n {} k {} splits {}", rows, sh.n, sh.k, splits);
        EXPECT_EQ(s.nonfinite, 0) << shape;
        EXPECT_EQ(gap_written, 0) << shape << ": wrote past a partial's rows";
        EXPECT_EQ(near.bad, 0) << shape << ": " << near.first;
        report("gemm_bf16_k_partials", shape, s, fmt::format("{}/{} differ", s.differing, s.n),
               fmt::format("sum of partials vs linear_f32 (gemm_k_splits picked {})", picked));
      }
    }
  }
}

// moe_gate: the gate's logits as moe_route reads them -- at decode (kAuto) gemm_k_splits partials
// rows * experts floats apart, past kKSplitMaxRows rows or for prompt steps one product -- in a
// buffer of moe_gate_logit_floats for the most rows.
TEST(GpuOps, MoeGate) {
  const std::int64_t E = 256, D = 4096, most = 100;
  std::mt19937_64 rng(seed_of({32, E, D}));
  const TestWeight tw = make_weight(WeightFormat::kBf16, E, D, 0.05f, rng);
  const DenseWeight dw = tw.dense();
  const DevWeight gw = upload_weight(tw);
  DevArray<float> logits(static_cast<std::size_t>(gpu::moe_gate_logit_floats(most, E)));
  for (std::int64_t rows : {std::int64_t{1}, std::int64_t{9}, most}) {
    std::vector<float> x = bf16_activations(static_cast<std::size_t>(rows * D), 1.0f, rng);
    std::vector<float> ref(static_cast<std::size_t>(rows * E));
    linear_f32(x, rows, dw, ref, cpu_pool());
    DevArray<std::uint16_t> dx(to_bf16(x));
    for (GemmPath path : {GemmPath::kAuto, GemmPath::kAutoPrefill}) {
      logits.poison();
      const int splits = gpu::moe_gate(dx.get(), rows, gw.w, logits.get(), nullptr, path, st());
      EXPECT_EQ(splits, path == GemmPath::kAuto ? gpu::gemm_k_splits(rows, gw.w) : 1);
      const std::vector<float> parts = logits.download();
      std::vector<float> got(ref.size(), 0.0f);
      for (int p = 0; p < splits; ++p)
        for (std::size_t i = 0; i < got.size(); ++i) got[i] += parts[static_cast<std::size_t>(p * rows * E) + i];
      const ErrStats s = compare(got, ref);
      const std::string shape =
          fmt::format("rows {} E {} D {} {} splits {}", rows, E, D, path == GemmPath::kAuto ? "decode" : "prompt", splits);
      EXPECT_EQ(s.nonfinite, 0) << shape;
      EXPECT_LT(s.rel_l2(), sim() ? 1e-5 : 1e-3) << shape;
      report("moe_gate", shape, s, fmt::format("{}/{} differ", s.differing, s.n), "sum of partials vs linear_f32");
    }
  }
}

// The compressor's use: two fp32 products into the halves of one [rows][2 n] buffer.
TEST(GpuOps, GemmBf16StridedF32) {
  const std::int64_t n = 256, k = 256;
  Sweep sweep;
  for (std::int64_t rows : {std::int64_t{1}, std::int64_t{9}, std::int64_t{130}}) {
    std::mt19937_64 rng(seed_of({14, rows}));
    const TestWeight wa = make_weight(WeightFormat::kBf16, n, k, 0.05f, rng), wb = make_weight(WeightFormat::kBf16, n, k, 0.05f, rng);
    DevWeight ga = upload_weight(wa), gb = upload_weight(wb);
    std::vector<float> x = bf16_activations(static_cast<std::size_t>(rows * k), 1.0f, rng);
    std::vector<float> ra(static_cast<std::size_t>(rows * n)), rb(ra.size());
    linear_f32(x, rows, wa.dense(), ra);
    linear_f32(x, rows, wb.dense(), rb);
    std::vector<float> ref(static_cast<std::size_t>(rows * 2 * n));
    for (std::int64_t r = 0; r < rows; ++r) {
      std::copy_n(ra.begin() + r * n, n, ref.begin() + r * 2 * n);
      std::copy_n(rb.begin() + r * n, n, ref.begin() + r * 2 * n + n);
    }
    DevArray<std::uint16_t> dx(to_bf16(x));
    for (GemmPath path : {GemmPath::kFewRows, GemmPath::kTiles}) {
      DevArray<float> out(ref.size());
      gpu::gemm_bf16(dx.get(), k, rows, ga.w, 1, gpu::GemmOutput{out.get(), 2 * n, true}, nullptr, st(), path);
      gpu::gemm_bf16(dx.get(), k, rows, gb.w, 1, gpu::GemmOutput{out.get() + n, 2 * n, true}, nullptr, st(), path);
      const ErrStats s = compare(out.download(), ref);
      const std::string shape = fmt::format("bf16 {} rows {} 2 x n {} k {} ld {}", path_name(path), rows, n, k, 2 * n);
      EXPECT_EQ(s.nonfinite, 0) << shape;
      EXPECT_LT(s.rel_l2(), sim() ? 1e-5 : 1e-3) << shape;
      sweep.add("gemm_bf16 f32 strided", fmt::format("bf16 {} 2 x n {} k {} into ld {}", path_name(path), n, k, 2 * n), s,
                "the compressor's wkv and wgate halves");
    }
  }
  sweep.flush("rows 1,9,130");
}

TEST(GpuOps, GemmGroupedFp8) {
  struct G {
    int groups;
    std::int64_t o, k;
  };
  const std::vector<G> cases = small() ? std::vector<G>{{2, 64, 512}, {8, 32, 256}} : std::vector<G>{{2, 64, 512}, {8, 32, 256}, {8, 1024, 512}, {16, 1024, 256}};
  for (const G& c : cases) {
    const std::int64_t n = c.groups * c.o, in = c.groups * c.k;
    std::mt19937_64 rng(seed_of({5, c.groups, c.o, c.k}));
    const TestWeight tw = make_weight(WeightFormat::kFp8, n, c.k, 0.05f, rng);
    const DenseWeight dw = tw.dense();
    DevWeight gw = upload_weight(tw);
    Sweep sweep;
    for (std::int64_t rows : std::vector<std::int64_t>{1, 7, 16, 17, 128, 130}) {
      std::vector<float> x = bf16_activations(static_cast<std::size_t>(rows * in), 1.0f, rng);
      std::vector<float> ref(static_cast<std::size_t>(rows * n));
      linear_grouped_bf16(x, rows, dw, c.groups, ref, cpu_pool());
      std::vector<float> mag(ref.size());
      cpu_pool()->parallel_for(0, rows, [&](std::int64_t r) {
        for (std::int64_t o = 0; o < n; ++o) {
          const std::int64_t g = o / c.o;
          double m = 0;
          for (std::int64_t j = 0; j < c.k; ++j)
            m += std::fabs(static_cast<double>(x[static_cast<std::size_t>(r * in + g * c.k + j)]) * tw.values[static_cast<std::size_t>(o * c.k + j)]);
          mag[static_cast<std::size_t>(r * n + o)] = static_cast<float>(m);
        }
      });
      DevArray<std::uint16_t> dx(to_bf16(x));
      for (GemmPath path : {GemmPath::kFewRows, GemmPath::kTiles}) {
        DevArray<std::uint16_t> out(ref.size());
        gpu::gemm_bf16(dx.get(), in, rows, gw.w, c.groups, gpu::GemmOutput{out.get(), n, false}, nullptr, st(), path);
        const std::vector<float> got = from_bf16(out.download());
        const ErrStats s = compare(got, ref);
        NearCheck near;
        for (std::size_t i = 0; i < got.size(); ++i) near.check(got[i], ref[i], mag[i], order_bound(c.k), true, static_cast<std::int64_t>(i));
        const std::string shape = fmt::format("fp8 groups {} {} rows {} o {} k {}", c.groups, path_name(path), rows, c.o, c.k);
        EXPECT_EQ(s.nonfinite, 0) << shape;
        EXPECT_LT(s.rel_l2(), 1e-2) << shape;
        EXPECT_EQ(near.bad, 0) << shape << ": " << near.first;
        sweep.add("gemm_bf16 grouped", fmt::format("fp8 groups {} {} o {} k {}", c.groups, path_name(path), c.o, c.k), s, "vs linear_grouped_bf16");
      }
    }
    sweep.flush("rows 1,7,16,17,128,130");
  }
}

// gemm_quantized_experts with a hand-built tile map (tile_m 8, 64 for tiled fp4 experts, and 128).
// The tiles of experts holding `counts` rows each (consecutive rows from 0) for tiles of tile_m
// rows, then three tiles of garbage past `num` (a grid covers them; they must do nothing).
struct HostTileMap {
  std::vector<std::int32_t> expert, row0, rows;
  std::int32_t num = 0;
};
HostTileMap host_tile_map(const std::vector<std::int64_t>& counts, int tile_m) {
  HostTileMap m;
  std::int64_t row0 = 0;
  for (std::size_t e = 0; e < counts.size(); ++e) {
    for (std::int64_t j = 0; j < counts[e]; j += tile_m) {
      m.expert.push_back(static_cast<std::int32_t>(e));
      m.row0.push_back(static_cast<std::int32_t>(row0 + j));
      m.rows.push_back(static_cast<std::int32_t>(std::min<std::int64_t>(tile_m, counts[e] - j)));
    }
    row0 += counts[e];
  }
  m.num = static_cast<std::int32_t>(m.expert.size());
  for (int extra = 0; extra < 3; ++extra) {
    m.expert.push_back(1);
    m.row0.push_back(0);
    m.rows.push_back(tile_m);
  }
  return m;
}

TEST(GpuOps, GemmQuantizedExperts) {
  const std::int64_t E = 4, n = small() ? 96 : 1024, tokens = 40;
  const std::vector<std::int64_t> counts = {9, 0, 130, 1};  // rows per expert
  // fp4 experts are tiled (gemm.h fp4_tiled), so their few-rows products take the bulk-copy
  // kernel; at k 4096 a warp's 16 units pass its ring twice.
  const std::vector<std::int64_t> ks = small() ? std::vector<std::int64_t>{128, 256, 1536} : std::vector<std::int64_t>{128, 1920, 4096};
  for (std::int64_t k : ks)
  for (WeightFormat f : {WeightFormat::kFp4, WeightFormat::kFp8}) {
    std::mt19937_64 rng(seed_of({6, static_cast<std::int64_t>(f), k}));
    std::vector<TestWeight> tws;
    std::vector<const TestWeight*> ptrs;
    for (std::int64_t e = 0; e < E; ++e) tws.push_back(make_weight(f, n, k, 0.05f, rng));
    for (const auto& t : tws) ptrs.push_back(&t);
    DevWeight gw = upload_experts(ptrs);
    std::vector<float> x = bf16_activations(static_cast<std::size_t>(tokens * k), 1.0f, rng);
    DevArray<std::uint16_t> dx(to_bf16(x));
    DevArray<std::uint8_t> codes(static_cast<std::size_t>(tokens * k));
    DevArray<float> scales(static_cast<std::size_t>(tokens * (k / 128)));
    gpu::quantize_activations(dx.get(), k, tokens, k, codes.get(), scales.get(), nullptr, st());
    const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
    std::vector<std::int32_t> source(static_cast<std::size_t>(total)), row_expert(static_cast<std::size_t>(total));
    {
      std::int64_t i = 0;
      for (std::int64_t e = 0; e < E; ++e)
        for (std::int64_t j = 0; j < counts[static_cast<std::size_t>(e)]; ++j, ++i) {
          source[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(rng() % tokens);
          row_expert[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(e);
        }
    }
    std::vector<float> ref(static_cast<std::size_t>(total * n));
    for (std::int64_t e = 0, i = 0; e < E; ++e) {
      const DenseWeight dw = tws[static_cast<std::size_t>(e)].dense();
      for (std::int64_t j = 0; j < counts[static_cast<std::size_t>(e)]; ++j, ++i) {
        std::span<const float> xr(x.data() + source[static_cast<std::size_t>(i)] * k, static_cast<std::size_t>(k));
        linear(xr, 1, dw, std::span<float>(ref.data() + i * n, static_cast<std::size_t>(n)));
      }
    }
    for (int tile_m : {gpu::kSmallRows, gpu::kWgmmaExpertRows, gpu::kTileRows}) {
      if (tile_m == gpu::kWgmmaExpertRows && !gpu::experts_fp4_wgmma_supported(gw.w)) continue;
      const HostTileMap map = host_tile_map(counts, tile_m);
      DevArray<std::int32_t> d_src(source), d_te(map.expert), d_tr0(map.row0), d_trows(map.rows),
          d_num(std::vector<std::int32_t>{map.num});
      const gpu::ExpertTiles tiles{d_src.get(), d_te.get(),  d_tr0.get(), d_trows.get(),
                                   d_num.get(), map.num + 3, tile_m};
      DevArray<std::uint16_t> out(static_cast<std::size_t>(total * n));
      gpu::gemm_quantized_experts(gpu::QuantizedRows{codes.get(), scales.get(), k}, tiles, gw.w, gpu::GemmOutput{out.get(), n, false}, st());
      const std::vector<float> got = from_bf16(out.download());
      const ErrStats s = compare(got, ref);
      const std::string shape = fmt::format("{} tile_m {} E {} rows {} n {} k {}", fmt_name(f), tile_m, E, total, n, k);
      EXPECT_EQ(s.nonfinite, 0) << shape;
      EXPECT_LT(s.rel_l2(), 1e-2) << shape;
      // The wgmma kernel multiplies exact f16 values and sums in fp32, as the tile kernels do: its
      // bf16 outputs may differ from the CPU's only where a sum sits on a rounding boundary. (Its
      // first form, on FP8 wgmma, whose tensor-core sums keep fewer bits, differed in 2%.)
      if (tile_m == gpu::kWgmmaExpertRows) {
        EXPECT_LE(s.differing * 1000, s.n) << shape;
      }
      report("gemm_quantized_experts", shape, s, fmt::format("{}/{} differ", s.differing, s.n), "rows per expert 9,0,130,1");
    }
  }
}

// The FP8 expert kernel's arithmetic on the host, for weight row n and one token: each 32-wide
// block's product through the model of the tensor core's sums (numerics/fp8_dot_model.h) on the
// e4m3 bytes the kernel feeds it (the fp4 values times 2^-6), times the block's weight scale into
// the unit's fp32 sum; each unit's sum times the activation scale into the total; times 64; bf16.
float fp8_expert_reference(const TestWeight& w, std::int64_t n, const std::uint8_t* codes, const float* scales) {
  const std::int64_t k = w.k;
  float acc = 0.0f;
  std::uint8_t rebuilt[32];
  for (std::int64_t u = 0; u < k / 128; ++u) {
    float unit = 0.0f;
    for (std::int64_t s = 0; s < 4; ++s) {
      const std::int64_t b = 4 * u + s;
      for (std::int64_t i = 0; i < 32; ++i) {
        const std::int64_t kk = 32 * b + i;
        const std::uint8_t byte = w.data[static_cast<std::size_t>(n * (k / 2) + kk / 2)];
        const unsigned nib = (kk % 2) != 0 ? byte >> 4 : byte & 15u;
        rebuilt[i] = static_cast<std::uint8_t>(((nib & 7u) << 2) | ((nib & 8u) << 4));
      }
      const float block = fp8_dot(kHopperFp8Dot, 0.0f, rebuilt, std::span<const std::uint8_t>(codes + 32 * b, 32));
      const float scaled = block * ue8m0_to_f32(w.scales_u8[static_cast<std::size_t>(n * (k / 32) + b)]);
      unit = s == 0 ? scaled : unit + scaled;
    }
    acc += unit * scales[u];
  }
  return round_to_bf16(acc * 64.0f);
}

// The FP8 form of the routed-expert products (gemm_experts_fp8.h) on decode tiles (8 rows) and
// prompt tiles (64 rows): bit for bit the model of the tensor core, and within the GEMM tolerance
// of the CPU executor (its fp32 block sums keep more bits: about 2% of the outputs move by a bf16
// step). Rows per expert 9, 0, 65, 1 and 8: a tile's edge on each side for both heights.
TEST(GpuOps, GemmExpertsFp8) {
  const std::int64_t E = 5, n = small() ? 96 : 1024, tokens = 70;
  const std::vector<std::int64_t> counts = {9, 0, 65, 1, 8};
  const std::vector<std::int64_t> ks =
      small() ? std::vector<std::int64_t>{128, 256, 1536} : std::vector<std::int64_t>{128, 1920, 4096};
  for (std::int64_t k : ks) {
    std::mt19937_64 rng(seed_of({61, k}));
    std::vector<TestWeight> tws;
    std::vector<const TestWeight*> ptrs;
    for (std::int64_t e = 0; e < E; ++e) tws.push_back(make_weight(WeightFormat::kFp4, n, k, 0.05f, rng));
    for (const auto& t : tws) ptrs.push_back(&t);
    DevWeight gw = upload_experts(ptrs);
    ASSERT_TRUE(gpu::experts_fp4_wgmma_supported(gw.w));
    std::vector<float> x = bf16_activations(static_cast<std::size_t>(tokens * k), 1.0f, rng);
    DevArray<std::uint16_t> dx(to_bf16(x));
    DevArray<std::uint8_t> codes(static_cast<std::size_t>(tokens * k));
    DevArray<float> scales(static_cast<std::size_t>(tokens * (k / 128)));
    gpu::quantize_activations(dx.get(), k, tokens, k, codes.get(), scales.get(), nullptr, st());
    const std::vector<std::uint8_t> h_codes = codes.download();
    const std::vector<float> h_scales = scales.download();
    const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
    std::vector<std::int32_t> source(static_cast<std::size_t>(total));
    for (auto& v : source) v = static_cast<std::int32_t>(rng() % tokens);
    std::vector<float> model(static_cast<std::size_t>(total * n)), cpu(static_cast<std::size_t>(total * n));
    for (std::int64_t e = 0, i = 0; e < E; ++e) {
      const TestWeight& tw = tws[static_cast<std::size_t>(e)];
      const DenseWeight dw = tw.dense();
      for (std::int64_t j = 0; j < counts[static_cast<std::size_t>(e)]; ++j, ++i) {
        const std::int64_t t = source[static_cast<std::size_t>(i)];
        std::span<const float> xr(x.data() + t * k, static_cast<std::size_t>(k));
        linear(xr, 1, dw, std::span<float>(cpu.data() + i * n, static_cast<std::size_t>(n)));
        for (std::int64_t r = 0; r < n; ++r)
          model[static_cast<std::size_t>(i * n + r)] = fp8_expert_reference(
              tw, r, &h_codes[static_cast<std::size_t>(t * k)], &h_scales[static_cast<std::size_t>(t * (k / 128))]);
      }
    }
    for (int tile_m : {gpu::kSmallRows, gpu::kWgmmaExpertRows}) {
      const HostTileMap map = host_tile_map(counts, tile_m);
      DevArray<std::int32_t> d_src(source), d_te(map.expert), d_tr0(map.row0), d_trows(map.rows),
          d_num(std::vector<std::int32_t>{map.num});
      const gpu::ExpertTiles tiles{d_src.get(), d_te.get(),  d_tr0.get(), d_trows.get(),
                                   d_num.get(), map.num + 3, tile_m};
      DevArray<std::uint16_t> out(static_cast<std::size_t>(total * n));
      gpu::gemm_experts_fp4_fp8(gpu::QuantizedRows{codes.get(), scales.get(), k}, tiles, gw.w,
                                gpu::GemmOutput{out.get(), n, false}, st());
      const std::vector<float> got = from_bf16(out.download());
      const std::string shape = fmt::format("fp4 tile_m {} E {} rows {} n {} k {}", tile_m, E, total, n, k);
      expect_tensor_core_model("gemm_experts_fp4_fp8", shape, got, model, cpu, "rows per expert 9,0,65,1,8");
    }
  }
}

// =================================================================================================
// Residual-stream kernels (hyper.h)
// =================================================================================================
struct HcInputs {
  std::vector<float> fn, base, scale, norm_w;
};
HcInputs hc_inputs(std::int64_t hc, std::int64_t dim, std::int64_t n_mix, std::int64_t n_scale, std::mt19937_64& rng) {
  HcInputs in;
  in.fn = normal(static_cast<std::size_t>(n_mix * hc * dim), 0.02f, rng);
  in.base = normal(static_cast<std::size_t>(n_mix), 0.5f, rng);
  in.scale = uniform(static_cast<std::size_t>(n_scale), 0.5f, 1.5f, rng);
  in.norm_w = normal(static_cast<std::size_t>(dim), 0.1f, rng);
  for (float& w : in.norm_w) w = round_to_bf16(1.0f + w);
  return in;
}

TEST(GpuOps, RmsNormRows) {
  const std::vector<std::int64_t> dims = small() ? std::vector<std::int64_t>{128, 256, 1536} : std::vector<std::int64_t>{128, 256, 1536, 4096, 7168};
  for (std::int64_t dim : dims) {
    Sweep sweep;
    for (std::int64_t rows : {std::int64_t{1}, std::int64_t{9}, std::int64_t{130}}) {
      std::mt19937_64 rng(seed_of({7, dim, rows}));
      std::vector<float> x = bf16_activations(static_cast<std::size_t>(rows * dim), 2.0f, rng);
      std::vector<float> w = normal(static_cast<std::size_t>(dim), 0.1f, rng);
      for (float& v : w) v = round_to_bf16(1.0f + v);
      std::vector<float> ref(x.size());
      rms_norm(x, rows, w, 1e-6f, ref);
      DevArray<float> dw(w);
      for (bool alias : {false, true}) {
        DevArray<std::uint16_t> dx(to_bf16(x));
        DevArray<std::uint16_t> dy(x.size());
        gpu::rms_norm_rows(dx.get(), dw.get(), rows, dim, 1e-6f, alias ? dx.get() : dy.get(), nullptr, st());
        const std::vector<float> got = from_bf16(alias ? dx.download() : dy.download());
        const ErrStats s = compare(got, ref);
        const std::string shape = fmt::format("rows {} dim {}{}", rows, dim, alias ? " in place" : "");
        // The sum of squares in the CPU's blocked order, every operation rounded alone: exact.
        EXPECT_EQ(s.nonfinite, 0) << shape;
        EXPECT_EQ(s.differing, 0) << shape;
        sweep.add("rms_norm_rows", fmt::format("dim {}{}", dim, alias ? " in place" : ""), s, "exact: blocked sum of squares");
      }
    }
    sweep.flush("rows 1,9,130");
  }
}

TEST(GpuOps, HcPreAndPost) {
  const int hc = 4;
  const std::vector<std::int64_t> dims = small() ? std::vector<std::int64_t>{256} : std::vector<std::int64_t>{256, 4096, 7168};
  for (std::int64_t dim : dims) {
    Sweep sweep;
    for (std::int64_t rows :
         small() ? std::vector<std::int64_t>{1, 2, 9, 17, 33} : std::vector<std::int64_t>{1, 2, 9, 17, 33, 130}) {
      std::mt19937_64 rng(seed_of({8, dim, rows}));
      const std::int64_t n_mix = (2 + hc) * hc;
      const HcInputs in = hc_inputs(hc, dim, n_mix, 3, rng);
      std::vector<float> h = bf16_activations(static_cast<std::size_t>(rows * hc * dim), 1.0f, rng);
      const HcParams p{hc, dim, 20, 1e-6f, 1e-6f};
      std::vector<float> ref_x(static_cast<std::size_t>(rows * dim)), ref_post(static_cast<std::size_t>(rows * hc)),
          ref_comb(static_cast<std::size_t>(rows * hc * hc));
      for (std::int64_t r = 0; r < rows; ++r) {
        std::vector<float> y(static_cast<std::size_t>(dim));
        hc_pre(std::span<const float>(h).subspan(static_cast<std::size_t>(r * hc * dim), static_cast<std::size_t>(hc * dim)), in.fn,
               in.scale, in.base, p, y, std::span<float>(ref_post).subspan(static_cast<std::size_t>(r * hc), hc),
               std::span<float>(ref_comb).subspan(static_cast<std::size_t>(r * hc * hc), hc * hc));
        rms_norm(y, 1, in.norm_w, 1e-6f, std::span<float>(ref_x).subspan(static_cast<std::size_t>(r * dim), static_cast<std::size_t>(dim)));
      }
      DevArray<std::uint16_t> dh(to_bf16(h));
      DevArray<float> dfn(in.fn), dbase(in.base), dscale(in.scale), dnorm(in.norm_w);
      DevArray<std::uint16_t> dx(ref_x.size());
      DevArray<float> dpost(ref_post.size()), dcomb(ref_comb.size());
      const gpu::HcShape shape{hc, dim, 20, 1e-6f, 1e-6f};
      DevArray<float> dscratch(static_cast<std::size_t>(gpu::hc_scratch_floats(rows, shape)));
      const std::string key = fmt::format("hc {} dim {}", hc, dim);
      // Both ways of forming the mixes; outputs poisoned (NaN) before each run.
      for (const gpu::HcMixPath path : kMixPaths) {
        dx.upload(std::vector<std::uint16_t>(ref_x.size(), 0x7fc0));
        dpost.upload(std::vector<float>(ref_post.size(), std::numeric_limits<float>::quiet_NaN()));
        dcomb.upload(std::vector<float>(ref_comb.size(), std::numeric_limits<float>::quiet_NaN()));
        gpu::hc_pre(dh.get(), gpu::HcWeights{dfn.get(), dbase.get(), dscale.get()}, dnorm.get(), shape, rows, dx.get(),
                    dpost.get(), dcomb.get(), nullptr, dscratch.get(), st(), path);
        const ErrStats sx = compare(from_bf16(dx.download()), ref_x);
        const ErrStats sp = compare(dpost.download(), ref_post);
        const ErrStats sc = compare(dcomb.download(), ref_comb);
        const std::string sh = fmt::format("hc {} rows {} dim {} mixes by {}", hc, rows, dim, path_name(path));
        // The mixes and the norm's sum of squares in the CPU's blocked order: bit-identical.
        EXPECT_EQ(sx.nonfinite + sp.nonfinite + sc.nonfinite, 0) << sh;
        EXPECT_EQ(sx.differing, 0) << sh;
        EXPECT_EQ(sp.differing, 0) << sh;
        EXPECT_EQ(sc.differing, 0) << sh;
        sweep.add(fmt::format("hc_pre x ({})", path_name(path)), key, sx, "exact: bf16, with attn_norm; blocked sums");
        sweep.add(fmt::format("hc_pre post ({})", path_name(path)), key, sp, "exact: fp32");
        sweep.add(fmt::format("hc_pre comb ({})", path_name(path)), key, sc, "exact: fp32, 20 Sinkhorn iterations");
      }
      // A device row count below the grid's rows (a replayed graph, a short last chunk): the live
      // rows exact, the rows past it untouched.
      if (rows > 8) {
        const std::int64_t live = rows - 5;
        for (const gpu::HcMixPath path : kMixPaths) {
          DevArray<std::int32_t> dlive(std::vector<std::int32_t>{static_cast<std::int32_t>(live)});
          dx.upload(std::vector<std::uint16_t>(ref_x.size(), 0x7fc0));
          gpu::hc_pre(dh.get(), gpu::HcWeights{dfn.get(), dbase.get(), dscale.get()}, dnorm.get(), shape, rows,
                      dx.get(), dpost.get(), dcomb.get(), dlive.get(), dscratch.get(), st(), path);
          std::vector<float> got = from_bf16(dx.download());
          std::int64_t past = 0;
          for (std::size_t k = static_cast<std::size_t>(live * dim); k < got.size(); ++k) past += !std::isnan(got[k]);
          got.resize(static_cast<std::size_t>(live * dim));
          const ErrStats sl = compare(got, std::vector<float>(ref_x.begin(), ref_x.begin() + live * dim));
          const std::string sh =
              fmt::format("hc {} rows {} (live {}) dim {} mixes by {}", hc, rows, live, dim, path_name(path));
          EXPECT_EQ(sl.differing + sl.nonfinite, 0) << sh;
          EXPECT_EQ(past, 0) << sh;
        }
      }

      // hc_post on the CPU's post/comb and a random sub-layer output: the same fp32 ops in the
      // same order, so bit-identical.
      std::vector<float> out = bf16_activations(static_cast<std::size_t>(rows * dim), 1.0f, rng);
      std::vector<float> ref_h(h.size());
      for (std::int64_t r = 0; r < rows; ++r)
        hc_post(std::span<const float>(out).subspan(static_cast<std::size_t>(r * dim), static_cast<std::size_t>(dim)),
                std::span<const float>(h).subspan(static_cast<std::size_t>(r * hc * dim), static_cast<std::size_t>(hc * dim)),
                std::span<const float>(ref_post).subspan(static_cast<std::size_t>(r * hc), hc),
                std::span<const float>(ref_comb).subspan(static_cast<std::size_t>(r * hc * hc), hc * hc), p,
                std::span<float>(ref_h).subspan(static_cast<std::size_t>(r * hc * dim), static_cast<std::size_t>(hc * dim)));
      DevArray<std::uint16_t> dout(to_bf16(out));
      DevArray<float> cpost(ref_post), ccomb(ref_comb);
      DevArray<std::uint16_t> dhn(h.size());
      gpu::hc_post(dout.get(), dh.get(), cpost.get(), ccomb.get(), shape, rows, dhn.get(), nullptr, st());
      const ErrStats sn = compare(from_bf16(dhn.download()), ref_h);
      EXPECT_EQ(sn.differing, 0) << fmt::format("hc {} rows {} dim {}", hc, rows, dim);
      sweep.add("hc_post", key, sn, "exact: same fp32 ops, same order");
    }
    sweep.flush(small() ? "rows 1,2,9,17,33" : "rows 1,2,9,17,33,130");
  }
}

TEST(GpuOps, HcHeadEmbedMtp) {
  const int hc = 4;
  const std::int64_t dim = small() ? 256 : 4096, vocab = 1000, T = 13;
  std::mt19937_64 rng(seed_of({9, dim}));
  const HcInputs in = hc_inputs(hc, dim, hc, 1, rng);
  std::vector<float> h = bf16_activations(static_cast<std::size_t>(T * hc * dim), 1.0f, rng);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(T));
  for (auto& id : ids) id = static_cast<std::int32_t>(rng() % vocab);
  std::vector<std::int32_t> positions(static_cast<std::size_t>(T));
  std::iota(positions.begin(), positions.end(), 0);
  const std::vector<std::int32_t> logits_tokens = {0, 4, 5, 12};
  const std::vector<std::int32_t> mtp_source = {12, 0, 3, 3, 7, 1, 2, 11, 10, 9, 8, 6, 5};
  auto step = simple_step(ids, positions, logits_tokens, mtp_source);
  const HcParams p{hc, dim, 20, 1e-6f, 1e-6f};
  const gpu::HcShape shape{hc, dim, 20, 1e-6f, 1e-6f};
  DevArray<std::uint16_t> dh(to_bf16(h));
  DevArray<float> dfn(in.fn), dbase(in.base), dscale(in.scale), dnorm(in.norm_w);
  DevArray<float> dscratch(static_cast<std::size_t>(gpu::hc_scratch_floats(T, shape)));
  for (bool all : {false, true}) {
    const std::vector<std::int32_t> rows = all ? positions : logits_tokens;
    std::vector<float> ref(rows.size() * static_cast<std::size_t>(dim));
    for (std::size_t i = 0; i < rows.size(); ++i) {
      std::vector<float> y(static_cast<std::size_t>(dim));
      hc_head(std::span<const float>(h).subspan(static_cast<std::size_t>(rows[i] * hc * dim), static_cast<std::size_t>(hc * dim)), in.fn,
              in.scale, in.base, p, y);
      rms_norm(y, 1, in.norm_w, 1e-6f, std::span<float>(ref).subspan(i * static_cast<std::size_t>(dim), static_cast<std::size_t>(dim)));
    }
    for (const gpu::HcMixPath path : kMixPaths) {
      DevArray<std::uint16_t> dy(static_cast<std::size_t>(T * dim));
      gpu::hc_head(dh.get(), step->get(), all, static_cast<std::int32_t>(T),
                   gpu::HcWeights{dfn.get(), dbase.get(), dscale.get()}, dnorm.get(), shape, dy.get(), dscratch.get(),
                   st(), path);
      std::vector<float> got = from_bf16(dy.download());
      // Rows past the count stay poisoned.
      std::int64_t past = 0;
      for (std::size_t i = ref.size(); i < got.size(); ++i) past += !std::isnan(got[i]);
      got.resize(ref.size());
      const ErrStats s = compare(got, ref);
      const std::string sh =
          fmt::format("hc {} dim {} tokens {} rows {} mixes by {}", hc, dim, T, rows.size(), path_name(path));
      EXPECT_EQ(s.nonfinite, 0) << sh;
      EXPECT_EQ(past, 0) << sh;
      EXPECT_EQ(s.differing, 0) << sh;  // blocked sums, as the CPU
      report(all ? "hc_head (all tokens)" : "hc_head (logits tokens)", sh, s,
             fmt::format("{}/{} differ", s.differing, s.n), "exact: with the final norm");
    }
  }
  // embed_streams: every stream a copy of the embedding row (exact).
  {
    std::vector<float> embed = bf16_activations(static_cast<std::size_t>(vocab * dim), 0.5f, rng);
    DevArray<std::uint16_t> de(to_bf16(embed));
    for (int streams : {hc, 1}) {
      DevArray<std::uint16_t> out(static_cast<std::size_t>(T * streams * dim));
      gpu::HcShape s1 = shape;
      s1.hc = streams;
      gpu::embed_streams(step->get(), static_cast<std::int32_t>(T + 3), de.get(), out.get(), s1, st());
      const std::vector<float> got = from_bf16(out.download());
      std::vector<float> ref(got.size());
      for (std::int64_t t = 0; t < T; ++t)
        for (int i = 0; i < streams; ++i)
          std::copy_n(embed.begin() + ids[static_cast<std::size_t>(t)] * dim, dim, ref.begin() + (t * streams + i) * dim);
      const ErrStats s = compare(got, ref);
      EXPECT_EQ(s.differing, 0);
      report("embed_streams", fmt::format("streams {} dim {} tokens {}", streams, dim, T), s, fmt::format("{}/{} differ", s.differing, s.n), "exact copy");
    }
  }
  // mtp_streams: h = bf16(hp + ep) (exact: one fp32 add, rounded as the CPU does).
  {
    std::vector<float> hp = bf16_activations(static_cast<std::size_t>(T * hc * dim), 1.0f, rng);
    std::vector<float> ep = bf16_activations(static_cast<std::size_t>(T * dim), 1.0f, rng);
    std::vector<float> ref(hp.size());
    for (std::int64_t t = 0; t < T; ++t)
      for (int i = 0; i < hc; ++i)
        for (std::int64_t c = 0; c < dim; ++c) {
          const std::size_t at = static_cast<std::size_t>((t * hc + i) * dim + c);
          ref[at] = round_to_bf16(hp[at] + ep[static_cast<std::size_t>(t * dim + c)]);
        }
    DevArray<std::uint16_t> dhp(to_bf16(hp)), dep(to_bf16(ep)), out(hp.size());
    gpu::mtp_streams(dhp.get(), dep.get(), shape, T, out.get(), st());
    const ErrStats s = compare(from_bf16(out.download()), ref);
    EXPECT_EQ(s.differing, 0);
    report("mtp_streams", fmt::format("hc {} dim {} tokens {}", hc, dim, T), s, fmt::format("{}/{} differ", s.differing, s.n), "exact");
  }
  // gather_mtp_rows: dst[i] = src[mtp_source[i]].
  {
    const std::int64_t width = hc * dim;
    DevArray<std::uint16_t> out(static_cast<std::size_t>(T * width));
    gpu::gather_mtp_rows(dh.get(), step->get(), static_cast<std::int32_t>(T), width, out.get(), st());
    const std::vector<float> got = from_bf16(out.download());
    std::vector<float> ref(got.size());
    for (std::int64_t i = 0; i < T; ++i) std::copy_n(h.begin() + mtp_source[static_cast<std::size_t>(i)] * width, width, ref.begin() + i * width);
    const ErrStats s = compare(got, ref);
    EXPECT_EQ(s.differing, 0);
    report("gather_mtp_rows", fmt::format("width {} tokens {}", width, T), s, fmt::format("{}/{} differ", s.differing, s.n), "exact copy");
  }
}

// =================================================================================================
// MoE (moe.h)
// =================================================================================================
// scores = sqrt(softplus(logits)) through moe_gate_scores with an identity gate (linear_f32 of a
// one-hot row is exact), so the CPU's own softplus code runs.
std::vector<float> cpu_gate_scores(std::span<const float> logits) {
  const auto E = static_cast<std::int64_t>(logits.size());
  std::vector<float> eye(static_cast<std::size_t>(E * E), 0.0f);
  for (std::int64_t e = 0; e < E; ++e) eye[static_cast<std::size_t>(e * E + e)] = 1.0f;
  static thread_local std::int64_t cached_e = -1;
  static thread_local DenseWeight gate;
  if (cached_e != E) {
    gate = make_dense_weight("eye", E, E, WeightKind::kF32, eye);
    cached_e = E;
  }
  std::vector<float> scores(static_cast<std::size_t>(E));
  moe_gate_scores(logits, gate, scores);
  return scores;
}

struct RouteCase {
  std::int64_t experts, top_k;
  bool hash;
};

// Routes every token on the CPU; returns (experts, weights) [T][k].
void cpu_route(const std::vector<float>& logits, std::int64_t T, const RouteCase& rc, const std::vector<float>& bias,
               const std::vector<std::int32_t>& tid2eid, const std::vector<std::int32_t>& ids, float scale,
               std::vector<std::int32_t>& experts, std::vector<float>& weights, std::vector<float>* scores_out = nullptr) {
  const MoeParams mp{rc.experts, rc.top_k, scale, 10.0f};
  experts.clear();
  weights.clear();
  for (std::int64_t t = 0; t < T; ++t) {
    const std::vector<float> s = cpu_gate_scores(std::span<const float>(logits).subspan(static_cast<std::size_t>(t * rc.experts), static_cast<std::size_t>(rc.experts)));
    if (scores_out != nullptr) scores_out->insert(scores_out->end(), s.begin(), s.end());
    MoeRouting r;
    if (rc.hash) {
      std::vector<std::int64_t> e(static_cast<std::size_t>(rc.top_k));
      for (std::int64_t c = 0; c < rc.top_k; ++c) e[static_cast<std::size_t>(c)] = tid2eid[static_cast<std::size_t>(ids[static_cast<std::size_t>(t)] * rc.top_k + c)];
      r = moe_route_hash(s, e, mp);
    } else {
      r = moe_route_scores(s, bias, mp);
    }
    for (std::int64_t c = 0; c < rc.top_k; ++c) {
      experts.push_back(static_cast<std::int32_t>(r.experts[static_cast<std::size_t>(c)]));
      weights.push_back(r.weights[static_cast<std::size_t>(c)]);
    }
  }
}

struct RouteInputs {
  std::vector<float> logits, bias;
  std::vector<std::int32_t> tid2eid, ids;
};
RouteInputs route_inputs(std::int64_t T, const RouteCase& rc, std::int64_t vocab, std::mt19937_64& rng) {
  RouteInputs in;
  in.logits = normal(static_cast<std::size_t>(T * rc.experts), 2.0f, rng);
  // Some large logits (softplus(z) = z above 20) and some exact ties between experts.
  for (std::size_t i = 0; i < in.logits.size(); i += 37) in.logits[i] = 21.0f + static_cast<float>(i % 5);
  for (std::int64_t t = 0; t < T; t += 3) in.logits[static_cast<std::size_t>(t * rc.experts + 1)] = in.logits[static_cast<std::size_t>(t * rc.experts)];
  in.bias = normal(static_cast<std::size_t>(rc.experts), 0.1f, rng);
  in.ids.resize(static_cast<std::size_t>(T));
  for (auto& id : in.ids) id = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(vocab));
  in.tid2eid.resize(static_cast<std::size_t>(vocab * rc.top_k));
  for (std::int64_t v = 0; v < vocab; ++v) {
    std::vector<std::int32_t> perm(static_cast<std::size_t>(rc.experts));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::copy_n(perm.begin(), rc.top_k, in.tid2eid.begin() + v * rc.top_k);
  }
  return in;
}

TEST(GpuOps, MoeRouteAndPermute) {
  const std::vector<RouteCase> cases = {{8, 2, false}, {8, 2, true}, {64, 6, false}, {256, 8, false}, {256, 6, true}, {384, 6, false}};
  const std::int64_t vocab = 500;
  for (const RouteCase& rc : cases) {
    std::int64_t all_set_diff = 0, all_ties = 0, permute_bad = 0;
    std::string permute_tiles, permute_first;
    ErrStats all_weights;
    for (std::int64_t T : {std::int64_t{1}, std::int64_t{9}, std::int64_t{130}}) {
      std::mt19937_64 rng(seed_of({10, rc.experts, rc.top_k, rc.hash, T}));
      const RouteInputs in = route_inputs(T, rc, vocab, rng);
      std::vector<std::int32_t> positions(static_cast<std::size_t>(T), 0);
      auto step = simple_step(in.ids, positions);
      DevArray<float> dlogits(in.logits), dbias(in.bias);
      DevArray<std::int32_t> dtid(in.tid2eid);
      DevArray<std::int32_t> re(static_cast<std::size_t>(T * rc.top_k));
      DevArray<float> rw(static_cast<std::size_t>(T * rc.top_k));
      gpu::MoeRouteArgs a;
      a.step = step->get();
      a.capacity = static_cast<std::int32_t>(T + 2);
      a.logits = dlogits.get();
      a.experts = static_cast<std::int32_t>(rc.experts);
      a.top_k = static_cast<std::int32_t>(rc.top_k);
      a.routed_scale = 2.5f;
      a.bias = rc.hash ? nullptr : dbias.get();
      a.tid2eid = rc.hash ? dtid.get() : nullptr;
      a.route_expert = re.get();
      a.route_weight = rw.get();
      gpu::moe_route(a, st());
      const auto ge = re.download();
      const auto gw = rw.download();
      {
        // The logits as two partials (gemm.h gemm_bf16_k_partials), halves of each value (their sum
        // is exact): the same choices and weights, bit for bit.
        std::vector<float> halves(static_cast<std::size_t>(2 * a.capacity * rc.experts), std::nanf(""));
        for (std::size_t i = 0; i < in.logits.size(); ++i) halves[i] = halves[i + static_cast<std::size_t>(a.capacity * rc.experts)] = in.logits[i] / 2;
        DevArray<float> dhalves(halves);
        DevArray<std::int32_t> re2(static_cast<std::size_t>(T * rc.top_k));
        DevArray<float> rw2(static_cast<std::size_t>(T * rc.top_k));
        gpu::MoeRouteArgs a2 = a;
        a2.logits = dhalves.get();
        a2.logit_splits = 2;
        a2.split_stride = a.capacity * rc.experts;
        a2.route_expert = re2.get();
        a2.route_weight = rw2.get();
        gpu::moe_route(a2, st());
        const auto gw2 = rw2.download();
        EXPECT_EQ(re2.download(), ge) << "experts from two logit partials";
        EXPECT_EQ(std::memcmp(gw2.data(), gw.data(), gw.size() * sizeof(float)), 0) << "weights from two logit partials";
      }
      std::vector<std::int32_t> ce;
      std::vector<float> cw, scores;
      cpu_route(in.logits, T, rc, in.bias, in.tid2eid, in.ids, 2.5f, ce, cw, &scores);
      // Expert lists identical (order included) except near-ties of the biased scores.
      std::int64_t set_diff = 0, near_ties = 0;
      for (std::int64_t t = 0; t < T; ++t) {
        std::set<std::int32_t> g(ge.begin() + t * rc.top_k, ge.begin() + (t + 1) * rc.top_k), c(ce.begin() + t * rc.top_k, ce.begin() + (t + 1) * rc.top_k);
        if (g == c) continue;
        ++set_diff;
        // Allowed only when every differing expert's biased score is within 1e-5 of the k-th.
        const float kth = scores[static_cast<std::size_t>(t * rc.experts + ce[static_cast<std::size_t>(t * rc.top_k + rc.top_k - 1)])] +
                          (rc.hash ? 0.0f : in.bias[static_cast<std::size_t>(ce[static_cast<std::size_t>(t * rc.top_k + rc.top_k - 1)])]);
        bool tie = !rc.hash;
        for (std::int32_t e : g)
          if (c.count(e) == 0) tie = tie && std::fabs(scores[static_cast<std::size_t>(t * rc.experts + e)] + in.bias[static_cast<std::size_t>(e)] - kth) <= 1e-5f * std::fabs(kth);
        near_ties += tie;
      }
      EXPECT_EQ(set_diff, near_ties) << "expert sets differ beyond near-ties: E " << rc.experts << " k " << rc.top_k;
      // Weights compared expert by expert (the choice order only orders the normalising sum);
      // the simulator runs the CPU's libm, so there the order must match too.
      std::int64_t order_diff = 0;
      for (std::size_t i = 0; i < ge.size(); ++i) order_diff += ge[i] != ce[i];
      ErrStats s;
      for (std::int64_t t = 0; t < T; ++t) {
        std::set<std::int32_t> g(ge.begin() + t * rc.top_k, ge.begin() + (t + 1) * rc.top_k), c(ce.begin() + t * rc.top_k, ce.begin() + (t + 1) * rc.top_k);
        if (g != c) continue;
        for (std::int64_t c2 = 0; c2 < rc.top_k; ++c2) {
          const std::int32_t e = ge[static_cast<std::size_t>(t * rc.top_k + c2)];
          const auto at = std::find(ce.begin() + t * rc.top_k, ce.begin() + (t + 1) * rc.top_k, e) - ce.begin();
          s.add(gw[static_cast<std::size_t>(t * rc.top_k + c2)], cw[static_cast<std::size_t>(at)]);
        }
      }
      EXPECT_EQ(s.nonfinite, 0);
      EXPECT_LT(s.rel_l2(), 1e-5);
      if (sim()) {
        EXPECT_EQ(order_diff, 0) << "choice order differs";
      }
      const std::string sh = fmt::format("{} E {} k {} tokens {}", rc.hash ? "hash" : "score", rc.experts, rc.top_k, T);
      all_set_diff += set_diff;
      all_ties += near_ties;
      all_weights.merge(s);

      // moe_permute on the GPU routing: a consistent permutation and tile map.
      for (int tile_m : {gpu::kSmallRows, gpu::kTileRows}) {
        const std::int64_t pairs = T * rc.top_k;
        const std::int32_t max_tiles = gpu::moe_max_tiles(T, rc.top_k, rc.experts, tile_m);
        DevArray<std::int32_t> src(static_cast<std::size_t>(pairs)), slot_of(static_cast<std::size_t>(pairs)), num_rows(1), te(static_cast<std::size_t>(max_tiles)),
            tr0(static_cast<std::size_t>(max_tiles)), trows(static_cast<std::size_t>(max_tiles)), num_tiles(1), scratch(static_cast<std::size_t>(3 * rc.experts));
        DevArray<float> slot_w(static_cast<std::size_t>(pairs));
        gpu::MoePermuteArgs pa;
        pa.step = step->get();
        pa.experts = static_cast<std::int32_t>(rc.experts);
        pa.top_k = static_cast<std::int32_t>(rc.top_k);
        pa.route_expert = re.get();
        pa.route_weight = rw.get();
        pa.tile_m = tile_m;
        pa.source_row = src.get();
        pa.slot_of = slot_of.get();
        pa.slot_weight = slot_w.get();
        pa.num_rows = num_rows.get();
        pa.tile_expert = te.get();
        pa.tile_row0 = tr0.get();
        pa.tile_rows = trows.get();
        pa.num_tiles = num_tiles.get();
        pa.expert_scratch = scratch.get();
        gpu::moe_permute(pa, st());
        const auto hs = src.download(), hslot = slot_of.download(), hn = num_rows.download(), hte = te.download(), htr0 = tr0.download(),
                   htrows = trows.download(), hnt = num_tiles.download();
        const auto hsw = slot_w.download();
        std::int64_t bad = 0;
        std::string first;
        auto fail = [&](const std::string& m) {
          if (bad++ == 0) first = m;
        };
        if (hn[0] != pairs) fail(fmt::format("num_rows {} for {} pairs", hn[0], pairs));
        std::vector<int> used(static_cast<std::size_t>(pairs), 0);
        std::vector<std::int32_t> slot_expert(static_cast<std::size_t>(pairs), -1);
        for (std::int64_t p = 0; p < pairs; ++p) {
          const std::int32_t sl = hslot[static_cast<std::size_t>(p)];
          if (sl < 0 || sl >= pairs) {
            fail(fmt::format("pair {}: slot {}", p, sl));
            continue;
          }
          ++used[static_cast<std::size_t>(sl)];
          slot_expert[static_cast<std::size_t>(sl)] = ge[static_cast<std::size_t>(p)];
          if (hs[static_cast<std::size_t>(sl)] != p / rc.top_k) fail(fmt::format("slot {}: source row {} for pair {}", sl, hs[static_cast<std::size_t>(sl)], p));
          if (!(hsw[static_cast<std::size_t>(sl)] == gw[static_cast<std::size_t>(p)])) fail(fmt::format("slot {}: weight", sl));
        }
        for (std::int64_t i = 0; i < pairs; ++i)
          if (used[static_cast<std::size_t>(i)] != 1) fail(fmt::format("slot {} used {} times", i, used[static_cast<std::size_t>(i)]));
        for (std::int64_t i = 1; i < pairs; ++i)
          if (slot_expert[static_cast<std::size_t>(i)] < slot_expert[static_cast<std::size_t>(i - 1)]) fail("slots not grouped by ascending expert");
        // Tiles: cover rows [0, pairs) in order, each within one expert, tile_m at most.
        std::int64_t covered = 0, expect_tiles = 0;
        std::vector<std::int64_t> count(static_cast<std::size_t>(rc.experts), 0);
        for (std::int32_t e : ge) ++count[static_cast<std::size_t>(e)];
        for (std::int64_t c : count) expect_tiles += (c + tile_m - 1) / tile_m;
        if (hnt[0] != expect_tiles || hnt[0] > max_tiles) fail(fmt::format("num_tiles {} expected {} (max {})", hnt[0], expect_tiles, max_tiles));
        for (std::int32_t t = 0; t < std::min(hnt[0], max_tiles); ++t) {
          const std::int32_t r0 = htr0[static_cast<std::size_t>(t)], nr = htrows[static_cast<std::size_t>(t)], e = hte[static_cast<std::size_t>(t)];
          if (r0 != covered || nr < 1 || nr > tile_m) fail(fmt::format("tile {}: rows {} + {} (covered {})", t, r0, nr, covered));
          for (std::int32_t r = r0; r < r0 + nr && r < pairs; ++r)
            if (slot_expert[static_cast<std::size_t>(r)] != e) fail(fmt::format("tile {}: row {} of expert {} in a tile of expert {}", t, r, slot_expert[static_cast<std::size_t>(r)], e));
          covered = r0 + nr;
        }
        if (covered != pairs) fail(fmt::format("tiles cover {} rows of {}", covered, pairs));
        EXPECT_EQ(bad, 0) << sh << " tile_m " << tile_m << ": " << first;
        if (T == 130) permute_tiles += fmt::format("{}{} tiles of {}", permute_tiles.empty() ? "" : ", ", hnt[0], tile_m);
        permute_bad += bad;
        if (permute_first.empty()) permute_first = first;
      }
    }
    const std::string sh = fmt::format("{} E {} k {} tokens 1,9,130", rc.hash ? "hash" : "score", rc.experts, rc.top_k);
    report("moe_route", sh, all_weights, fmt::format("{} sets differ, {} ties", all_set_diff, all_ties), "weights vs cpu weigh(), expert by expert");
    report_line("moe_permute", sh + " tile_m 8,128", "-", "-", permute_tiles + " at T 130",
                permute_bad == 0 ? "permutation, weights and tile map consistent" : permute_first);
  }
}

TEST(GpuOps, SwigluQuantize) {
  for (std::int64_t inter : small() ? std::vector<std::int64_t>{96, 128, 384} : std::vector<std::int64_t>{96, 128, 384, 2048, 3072}) {
    for (bool weighted : {true, false}) {
      ErrStats all;
      std::int64_t all_codes = 0, all_code_diff = 0, all_step = 0, all_scale_diff = 0;
      for (std::int64_t rows : {std::int64_t{1}, std::int64_t{9}, std::int64_t{130}}) {
        std::mt19937_64 rng(seed_of({11, inter, rows, weighted}));
        std::vector<float> gu = bf16_activations(static_cast<std::size_t>(rows * 2 * inter), 4.0f, rng);  // many beyond the limit 10
        std::vector<float> w = uniform(static_cast<std::size_t>(rows), 0.05f, 1.5f, rng);
        const float limit = 10.0f;
        const std::int64_t kb = (inter + 127) / 128;
        std::vector<std::uint8_t> rc;
        std::vector<float> rs;
        for (std::int64_t r = 0; r < rows; ++r) {
          std::span<const float> g(gu.data() + r * 2 * inter, static_cast<std::size_t>(inter)), u(gu.data() + r * 2 * inter + inter, static_cast<std::size_t>(inter));
          std::vector<float> h(static_cast<std::size_t>(inter));
          swiglu_clamped(g, u, limit, weighted ? w[static_cast<std::size_t>(r)] : 1.0f, h);
          round_all_bf16(h);
          quantize_row_ref(h, rc, rs);
        }
        DevArray<std::uint16_t> dgu(to_bf16(gu));
        DevArray<float> dw(w);
        DevArray<std::uint8_t> codes(static_cast<std::size_t>(rows * inter));
        DevArray<float> scales(static_cast<std::size_t>(rows * kb));
        gpu::swiglu_quantize(dgu.get(), rows, nullptr, inter, limit, weighted ? dw.get() : nullptr, codes.get(), scales.get(), st());
        const auto gc = codes.download();
        const auto gs = scales.download();
        std::int64_t code_diff = 0, code_step = 0, scale_diff = 0;
        ErrStats s;
        for (std::size_t i = 0; i < gc.size(); ++i) {
          if (gc[i] != rc[i]) {
            ++code_diff;
            code_step += std::abs((gc[i] & 0x7f) - (rc[i] & 0x7f)) == 1 && (gc[i] & 0x80) == (rc[i] & 0x80);
          }
          const std::size_t row = i / static_cast<std::size_t>(inter), blk = (i % static_cast<std::size_t>(inter)) / 128;
          s.add(e4m3_to_f32(gc[i]) * gs[row * static_cast<std::size_t>(kb) + blk], e4m3_to_f32(rc[i]) * rs[row * static_cast<std::size_t>(kb) + blk]);
        }
        for (std::size_t i = 0; i < gs.size(); ++i) scale_diff += gs[i] != rs[i];
        const std::string sh = fmt::format("rows {} inter {} {}", rows, inter, weighted ? "weighted" : "shared");
        // Same fp32 ops in the same order (silu's expf is the one libm difference on the GPU).
        EXPECT_EQ(s.nonfinite, 0) << sh;
        EXPECT_EQ(scale_diff, 0) << sh;
        EXPECT_LE(code_diff - code_step, 0) << sh;
        EXPECT_LE(code_step, sim() ? 0 : std::max<std::int64_t>(2, rows * inter / 1000)) << sh;
        all.merge(s);
        all_codes += static_cast<std::int64_t>(gc.size());
        all_code_diff += code_diff;
        all_step += code_step;
        all_scale_diff += scale_diff;
      }
      report("swiglu_quantize", fmt::format("inter {} {} rows 1,9,130", inter, weighted ? "routed (row weights)" : "shared (weight 1)"), all,
             fmt::format("{}/{} codes ({} 1-step), {} scales", all_code_diff, all_codes, all_step, all_scale_diff),
             "codes vs swiglu_clamped + bf16 + e4m3 blocks of 128");
    }
  }
}

// A whole MoE layer: route -> permute -> experts w13 -> swiglu -> experts w2 -> shared -> combine,
// against cpu moe_forward per token.
TEST(GpuOps, MoeLayer) {
  struct L {
    std::int64_t D, E, K, I;
  };
  const std::vector<L> layers = small() ? std::vector<L>{{256, 8, 2, 128}} : std::vector<L>{{256, 8, 2, 128}, {1024, 32, 6, 512}};
  for (const L& l : layers) {
    std::mt19937_64 rng(seed_of({12, l.D, l.E}));
    std::vector<TestWeight> w1, w2, w3, w13;
    for (std::int64_t e = 0; e < l.E; ++e) {
      w1.push_back(make_weight(WeightFormat::kFp4, l.I, l.D, 0.05f, rng));
      w3.push_back(make_weight(WeightFormat::kFp4, l.I, l.D, 0.05f, rng));
      w2.push_back(make_weight(WeightFormat::kFp4, l.D, l.I, 0.05f, rng));
      TestWeight s = w1.back();  // rows [0, I) = w1, [I, 2I) = w3 (gpu_weights.h)
      s.n = 2 * l.I;
      s.data.insert(s.data.end(), w3.back().data.begin(), w3.back().data.end());
      s.scales_u8.insert(s.scales_u8.end(), w3.back().scales_u8.begin(), w3.back().scales_u8.end());
      s.values.insert(s.values.end(), w3.back().values.begin(), w3.back().values.end());
      w13.push_back(std::move(s));
    }
    const TestWeight sw1 = make_weight(WeightFormat::kFp8, l.I, l.D, 0.05f, rng), sw3 = make_weight(WeightFormat::kFp8, l.I, l.D, 0.05f, rng),
                     sw2 = make_weight(WeightFormat::kFp8, l.D, l.I, 0.05f, rng);
    std::vector<DenseWeight> d1, d2, d3;
    for (std::int64_t e = 0; e < l.E; ++e) {
      d1.push_back(w1[static_cast<std::size_t>(e)].dense("w1"));
      d2.push_back(w2[static_cast<std::size_t>(e)].dense("w2"));
      d3.push_back(w3[static_cast<std::size_t>(e)].dense("w3"));
    }
    std::vector<ExpertWeights> views;
    for (std::int64_t e = 0; e < l.E; ++e) views.push_back({&d1[static_cast<std::size_t>(e)], &d2[static_cast<std::size_t>(e)], &d3[static_cast<std::size_t>(e)]});
    const DenseWeight ds1 = sw1.dense("s1"), ds2 = sw2.dense("s2"), ds3 = sw3.dense("s3");
    const ExpertWeights shared{&ds1, &ds2, &ds3};
    std::vector<const TestWeight*> p13, p2;
    for (const auto& t : w13) p13.push_back(&t);
    for (const auto& t : w2) p2.push_back(&t);
    DevWeight g13 = upload_experts(p13), g2 = upload_experts(p2), gs1 = upload_weight(sw1), gs2 = upload_weight(sw2), gs3 = upload_weight(sw3);
    const float limit = 10.0f, scale = 1.5f;

    for (bool hash : {false, true}) {
      for (std::int64_t T : small() ? std::vector<std::int64_t>{1, 7, 70} : std::vector<std::int64_t>{1, 7, 70, 300}) {
        const RouteCase rc{l.E, l.K, hash};
        const RouteInputs in = route_inputs(T, rc, 300, rng);
        std::vector<float> x = bf16_activations(static_cast<std::size_t>(T * l.D), 1.0f, rng);
        // CPU
        std::vector<std::int32_t> ce;
        std::vector<float> cw;
        cpu_route(in.logits, T, rc, in.bias, in.tid2eid, in.ids, scale, ce, cw);
        std::vector<float> ref(static_cast<std::size_t>(T * l.D));
        const MoeParams mp{l.E, l.K, scale, limit};
        cpu_pool()->parallel_for(0, T, [&](std::int64_t t) {
          MoeRouting r;
          for (std::int64_t c = 0; c < l.K; ++c) {
            r.experts.push_back(ce[static_cast<std::size_t>(t * l.K + c)]);
            r.weights.push_back(cw[static_cast<std::size_t>(t * l.K + c)]);
          }
          moe_forward(std::span<const float>(x).subspan(static_cast<std::size_t>(t * l.D), static_cast<std::size_t>(l.D)), r, views, shared, mp,
                      std::span<float>(ref).subspan(static_cast<std::size_t>(t * l.D), static_cast<std::size_t>(l.D)));
        });
        // GPU
        std::vector<std::int32_t> positions(static_cast<std::size_t>(T), 0);
        auto step = simple_step(in.ids, positions);
        const std::int32_t cap = static_cast<std::int32_t>(T);
        DevArray<float> dlogits(in.logits), dbias(in.bias);
        DevArray<std::int32_t> dtid(in.tid2eid);
        DevArray<std::int32_t> re(static_cast<std::size_t>(T * l.K));
        DevArray<float> rw(static_cast<std::size_t>(T * l.K));
        gpu::MoeRouteArgs ra;
        ra.step = step->get();
        ra.capacity = cap;
        ra.logits = dlogits.get();
        ra.experts = static_cast<std::int32_t>(l.E);
        ra.top_k = static_cast<std::int32_t>(l.K);
        ra.routed_scale = scale;
        ra.bias = hash ? nullptr : dbias.get();
        ra.tid2eid = hash ? dtid.get() : nullptr;
        ra.route_expert = re.get();
        ra.route_weight = rw.get();
        gpu::moe_route(ra, st());
        DevArray<std::uint16_t> dx(to_bf16(x));
        DevArray<std::uint8_t> xq(static_cast<std::size_t>(T * l.D));
        DevArray<float> xs(static_cast<std::size_t>(T * ((l.D + 127) / 128)));
        const std::int32_t tile_m = gpu::expert_tile_rows(T * l.K, l.E, g13.w, g2.w);
        const std::int32_t max_tiles = gpu::moe_max_tiles(T, l.K, l.E, tile_m);
        const std::size_t pairs = static_cast<std::size_t>(T * l.K);
        DevArray<std::int32_t> src(pairs), slot_of(pairs), num_rows(1), te(static_cast<std::size_t>(max_tiles)), tr0(static_cast<std::size_t>(max_tiles)),
            trows(static_cast<std::size_t>(max_tiles)), num_tiles(1), scratch(static_cast<std::size_t>(3 * l.E));
        DevArray<float> slot_w(pairs);
        gpu::MoePermuteArgs pa;
        pa.step = step->get();
        pa.experts = static_cast<std::int32_t>(l.E);
        pa.top_k = static_cast<std::int32_t>(l.K);
        pa.route_expert = re.get();
        pa.route_weight = rw.get();
        pa.tile_m = tile_m;
        pa.source_row = src.get();
        pa.slot_of = slot_of.get();
        pa.slot_weight = slot_w.get();
        pa.num_rows = num_rows.get();
        pa.tile_expert = te.get();
        pa.tile_row0 = tr0.get();
        pa.tile_rows = trows.get();
        pa.num_tiles = num_tiles.get();
        pa.expert_scratch = scratch.get();
        gpu::moe_permute(pa, st());
        // (the executor's order: gemm_quantized_experts reads the tile map from two launches back)
        gpu::quantize_activations(dx.get(), l.D, T, l.D, xq.get(), xs.get(), nullptr, st());
        // (rows_bound: no expert gets more rows than the step has tokens)
        gpu::ExpertTiles tiles{src.get(), te.get(), tr0.get(), trows.get(), num_tiles.get(), max_tiles, tile_m, static_cast<std::int32_t>(T)};
        DevArray<std::uint16_t> gu(pairs * static_cast<std::size_t>(2 * l.I));
        gpu::gemm_quantized_experts(gpu::QuantizedRows{xq.get(), xs.get(), l.D}, tiles, g13.w, gpu::GemmOutput{gu.get(), 2 * l.I, false}, st());
        DevArray<std::uint8_t> hq(pairs * static_cast<std::size_t>(l.I));
        DevArray<float> hs(pairs * static_cast<std::size_t>((l.I + 127) / 128));
        gpu::swiglu_quantize(gu.get(), T * l.K, num_rows.get(), l.I, limit, slot_w.get(), hq.get(), hs.get(), st());
        tiles.source_row = nullptr;
        DevArray<std::uint16_t> y(pairs * static_cast<std::size_t>(l.D));
        gpu::gemm_quantized_experts(gpu::QuantizedRows{hq.get(), hs.get(), l.I}, tiles, g2.w, gpu::GemmOutput{y.get(), l.D, false}, st());
        DevArray<std::uint16_t> gus(static_cast<std::size_t>(T * 2 * l.I));
        gpu::gemm_quantized(gpu::QuantizedRows{xq.get(), xs.get(), l.D}, T, gs1.w, gpu::GemmOutput{gus.get(), 2 * l.I, false}, nullptr, st());
        gpu::gemm_quantized(gpu::QuantizedRows{xq.get(), xs.get(), l.D}, T, gs3.w, gpu::GemmOutput{gus.get() + l.I, 2 * l.I, false}, nullptr, st());
        DevArray<std::uint8_t> hsq(static_cast<std::size_t>(T * l.I));
        DevArray<float> hss(static_cast<std::size_t>(T * ((l.I + 127) / 128)));
        gpu::swiglu_quantize(gus.get(), T, nullptr, l.I, limit, nullptr, hsq.get(), hss.get(), st());
        DevArray<std::uint16_t> ys(static_cast<std::size_t>(T * l.D));
        gpu::gemm_quantized(gpu::QuantizedRows{hsq.get(), hss.get(), l.I}, T, gs2.w, gpu::GemmOutput{ys.get(), l.D, false}, nullptr, st());
        DevArray<std::uint16_t> out(static_cast<std::size_t>(T * l.D));
        gpu::moe_combine(step->get(), cap + 2, static_cast<std::int32_t>(l.K), re.get(), slot_of.get(), y.get(), ys.get(), l.D, out.get(), st());
        const std::vector<float> got = from_bf16(out.download());
        // Tokens whose expert sets differ (a near-tie decided the other way: libm differences on
        // the GPU) are left out of the comparison and counted; the simulator must route identically.
        const auto ge = re.download();
        std::int64_t route_diff = 0;
        ErrStats s;
        for (std::int64_t t = 0; t < T; ++t) {
          const std::set<std::int32_t> g(ge.begin() + t * l.K, ge.begin() + (t + 1) * l.K), c(ce.begin() + t * l.K, ce.begin() + (t + 1) * l.K);
          if (g != c) {
            ++route_diff;
            continue;
          }
          for (std::int64_t i = t * l.D; i < (t + 1) * l.D; ++i) s.add(got[static_cast<std::size_t>(i)], ref[static_cast<std::size_t>(i)]);
        }
        const std::string sh = fmt::format("{} T {} D {} E {} k {} I {} tile_m {}", hash ? "hash" : "score", T, l.D, l.E, l.K, l.I, tile_m);
        EXPECT_LE(route_diff, sim() ? 0 : std::max<std::int64_t>(1, T / 50)) << sh;
        EXPECT_EQ(s.nonfinite, 0) << sh;
        EXPECT_LT(s.rel_l2(), 1e-2) << sh;
        report("moe layer", sh, s, fmt::format("{}/{} differ", s.differing, s.n),
               fmt::format("vs moe_forward (fp4 experts, fp8 shared); tokens routed apart {}", route_diff));
      }
    }
  }
}

}  // namespace
}  // namespace dsv4::gputest
