// linear / linear_bf16 / linear_f32 / linear_grouped_bf16 (SPEC.md 5a): against double-precision
// brute force, the FP8 activation simulation really happening, row invariance (1 row or many,
// with or without threads: bit-identical), the fixed blocked reduction order, and the packed,
// vectorized kernels bit for bit against a plain scalar statement of that order.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "cpu/linear.h"
#include "cpu_test_util.h"
#include "numerics/block_quant.h"

namespace dsv4 {
namespace {

// Independent statement: bf16 input, FP8-simulated per 128-block (shorter last block), double dot.
struct Ref {
  std::vector<double> value, mag;
};

Ref reference_fp8(const std::vector<float>& x, std::int64_t rows, const DenseWeight& w, bool quantize = true) {
  Ref out{std::vector<double>(static_cast<std::size_t>(rows * w.out)),
          std::vector<double>(static_cast<std::size_t>(rows * w.out))};
  for (std::int64_t r = 0; r < rows; ++r) {
    std::vector<float> xr(x.begin() + r * w.in, x.begin() + (r + 1) * w.in);
    for (float& v : xr) v = round_to_bf16(v);
    if (quantize) {
      for (std::int64_t s = 0; s < w.in; s += 128) {
        const std::int64_t len = std::min<std::int64_t>(128, w.in - s);
        simulate_quant_blocks(std::span<float>(xr).subspan(static_cast<std::size_t>(s), static_cast<std::size_t>(len)),
                              static_cast<std::size_t>(len), QuantFormat::kFp8E4m3);
      }
    }
    for (std::int64_t o = 0; o < w.out; ++o) {
      out.value[static_cast<std::size_t>(r * w.out + o)] = test::dot_d(xr.data(), w.row(o).data(), w.in);
      out.mag[static_cast<std::size_t>(r * w.out + o)] = test::dot_mag(xr.data(), w.row(o).data(), w.in);
    }
  }
  return out;
}

// got must be the bf16 rounding of a value within a few fp32-accumulation ulps of ref: allow one
// bf16 ulp.
void expect_bf16_close(const std::vector<float>& got, const Ref& ref, const char* what) {
  ASSERT_EQ(got.size(), ref.value.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(round_to_bf16(got[i]), got[i]) << what << " " << i;
    ASSERT_TRUE(test::bf16_near(got[i], ref.value[i], ref.mag[i]))
        << what << " " << i << ": " << got[i] << " vs " << ref.value[i];
  }
}

TEST(Linear, Fp8WeightsQuantizeActivationsPer128) {
  std::mt19937 rng(21);
  const std::int64_t rows = 5, in = 300, out = 70;  // 300 = 128 + 128 + 44: a short last block
  const DenseWeight w = test::random_fp8_weight(rng, "w", out, in);
  std::vector<float> x = test::random_bf16(rng, static_cast<std::size_t>(rows * in), -2.0f, 2.0f);
  x[7] = 40.0f;  // a large value in the first block makes its small values lose bits
  std::vector<float> y(static_cast<std::size_t>(rows * out));
  linear(x, rows, w, y);
  expect_bf16_close(y, reference_fp8(x, rows, w), "fp8");
  // The unquantized product is measurably different: the simulation really happens.
  const std::vector<double> plain = reference_fp8(x, rows, w, /*quantize=*/false).value;
  int far = 0;
  for (std::size_t i = 0; i < y.size(); ++i) far += std::fabs(y[i] - plain[i]) > 2 * test::bf16_ulp(plain[i]);
  EXPECT_GT(far, 10);
}

TEST(Linear, Fp4WeightsAndUnroundedInputs) {
  std::mt19937 rng(22);
  const std::int64_t rows = 3, in = 256, out = 40;
  const DenseWeight w = test::random_fp4_weight(rng, "e.w1", out, in);
  // Inputs that are not bf16 values are taken as bf16 (rounded first).
  const std::vector<float> x = test::random_floats(rng, static_cast<std::size_t>(rows * in), -3.0f, 3.0f);
  std::vector<float> y(static_cast<std::size_t>(rows * out));
  linear(x, rows, w, y);
  expect_bf16_close(y, reference_fp8(x, rows, w), "fp4");
}

TEST(Linear, Bf16AndF32AndGrouped) {
  std::mt19937 rng(23);
  const std::int64_t rows = 4, in = 200, out = 30;
  const DenseWeight wb = test::random_bf16_weight(rng, "wb", out, in);
  const std::vector<float> x = test::random_floats(rng, static_cast<std::size_t>(rows * in));
  std::vector<float> y(static_cast<std::size_t>(rows * out));
  linear(x, rows, wb, y);
  expect_bf16_close(y, reference_fp8(x, rows, wb, /*quantize=*/false), "bf16");
  std::vector<float> y2(y.size());
  linear_bf16(x, rows, wb, y2);
  EXPECT_EQ(y, y2);

  DenseWeight wf =
      make_dense_weight("wf", out, in, WeightKind::kF32, test::random_floats(rng, static_cast<std::size_t>(out * in)));
  linear_f32(x, rows, wf, y);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t o = 0; o < out; ++o) {
      const double ref = test::dot_d(x.data() + r * in, wf.row(o).data(), in);
      EXPECT_NEAR(y[static_cast<std::size_t>(r * out + o)], ref, 1e-5 * (1 + std::fabs(ref)));
    }
  }
  EXPECT_THROW(linear(x, rows, wf, y), std::invalid_argument);  // fp32 weight: say linear_f32
  EXPECT_THROW(linear_bf16(x, rows, wf, y), std::invalid_argument);
  std::vector<float> short_out(y.size() - 1);
  EXPECT_THROW(linear(x, rows, wb, short_out), std::invalid_argument);

  // Grouped (the wo_a einsum): group g of x against rows [g*o, (g+1)*o) of the weight.
  const std::int64_t groups = 3, per_group = 8, gin = 64;
  const DenseWeight wg = test::random_fp8_weight(rng, "wo_a", groups * per_group, gin);
  const std::vector<float> xg = test::random_bf16(rng, static_cast<std::size_t>(rows * groups * gin));
  std::vector<float> yg(static_cast<std::size_t>(rows * groups * per_group));
  linear_grouped_bf16(xg, rows, wg, groups, yg);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t o = 0; o < groups * per_group; ++o) {
      const std::int64_t g = o / per_group;
      const float* xo = xg.data() + r * groups * gin + g * gin;
      const double ref = test::dot_d(xo, wg.row(o).data(), gin);
      const float got = yg[static_cast<std::size_t>(r * groups * per_group + o)];
      EXPECT_TRUE(test::bf16_near(got, ref, test::dot_mag(xo, wg.row(o).data(), gin))) << r << " " << o;
    }
  }
  EXPECT_THROW(linear_grouped_bf16(xg, rows, wg, 5, yg), std::invalid_argument);
}

TEST(Linear, RowsAreIndependentOfBatchAndThreads) {
  std::mt19937 rng(24);
  const std::int64_t rows = 7, in = 384, out = 50;
  const DenseWeight w8 = test::random_fp8_weight(rng, "w8", out, in);
  const DenseWeight w4 = test::random_fp4_weight(rng, "w4", out, in);
  const DenseWeight wb = test::random_bf16_weight(rng, "wb", out, in);
  const std::vector<float> x = test::random_bf16(rng, static_cast<std::size_t>(rows * in), -3.0f, 3.0f);
  ThreadPool pool(3);
  for (const DenseWeight* w : {&w8, &w4, &wb}) {
    for (int mode = 0; mode < 2; ++mode) {
      std::vector<float> batch(static_cast<std::size_t>(rows * out)), threaded(batch.size());
      if (mode == 0) {
        linear(x, rows, *w, batch);
        linear(x, rows, *w, threaded, &pool);
      } else {
        linear_f32(x, rows, *w, batch);
        linear_f32(x, rows, *w, threaded, &pool);
      }
      EXPECT_EQ(batch, threaded) << w->name;
      for (std::int64_t r = 0; r < rows; ++r) {
        std::vector<float> single(static_cast<std::size_t>(out));
        const std::span<const float> xr =
            std::span<const float>(x).subspan(static_cast<std::size_t>(r * in), static_cast<std::size_t>(in));
        if (mode == 0) {
          linear(xr, 1, *w, single);
        } else {
          linear_f32(xr, 1, *w, single);
        }
        for (std::int64_t o = 0; o < out; ++o) {
          ASSERT_EQ(single[static_cast<std::size_t>(o)], batch[static_cast<std::size_t>(r * out + o)])
              << w->name << " " << r;
        }
      }
    }
  }
}

TEST(Linear, BlockedDotOrder) {
  // Blocks of 2: (1e8 + 1) + (-1e8 + 1) = 1e8 - 1e8 = 0 in fp32; one block of 4: ((1e8 + 1) - 1e8) + 1 = 1.
  const float a[4] = {1e8f, 1.0f, -1e8f, 1.0f};
  const float b[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  EXPECT_EQ(blocked_dot(a, b, 4, 2), 0.0f);
  EXPECT_EQ(blocked_dot(a, b, 4, 4), 1.0f);
  EXPECT_EQ(blocked_dot(a, b, 3, 2), 0.0f);  // (1e8 + 1) + (-1e8)
}

TEST(Linear, ActivationSimulationIsBlockwise) {
  // Block 0's amax 100 gives scale 2^-2: 100 -> 400 is a tie between e4m3 384 and 416 -> 384 (even),
  // and 9 * 2^-12 -> 4.5 * 2^-9 (subnormal) -> 4 * 2^-9 (even). Block 1 holds only 9 * 2^-12 (scale
  // 2^-17, 288 is an e4m3 value): unchanged.
  std::vector<float> row(256, 0.0f);
  row[0] = 100.0f;
  row[1] = 9 * 0x1p-12f;
  row[200] = 9 * 0x1p-12f;
  fp8_simulate_activation(row);
  EXPECT_EQ(row[0], 96.0f);
  EXPECT_EQ(row[1], 0x1p-9f);
  EXPECT_EQ(row[200], 9 * 0x1p-12f);
}

// ---- The vectorized kernels against a straightforward scalar implementation, bit for bit ----

// The reduction order of linear.h, written out: blocks of `block` products summed sequentially
// from zero in fp32, block sums added to a zero total in order.
float scalar_blocked_dot(const float* a, const float* b, std::int64_t n, std::int64_t block) {
  float total = 0.0f;
  for (std::int64_t start = 0; start < n; start += block) {
    float part = 0.0f;
    for (std::int64_t k = start; k < std::min(n, start + block); ++k) {
      const float product = a[k] * b[k];
      part = part + product;
    }
    total = total + part;
  }
  return total;
}

enum class Op { kLinear, kBf16, kF32, kGrouped };

// out[r, o] for the op, element by element.
std::vector<float> scalar_reference(Op op, const std::vector<float>& x, std::int64_t rows, const DenseWeight& w,
                                    std::int64_t groups) {
  const std::int64_t x_in = op == Op::kGrouped ? groups * w.in : w.in;
  const std::int64_t per_group = w.out / groups, block = w.kind == WeightKind::kFp4 ? 32 : 128;
  std::vector<float> xs = x;
  const bool fp8_act = op == Op::kLinear && (w.kind == WeightKind::kFp8 || w.kind == WeightKind::kFp4);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::span<float> row =
        std::span<float>(xs).subspan(static_cast<std::size_t>(r * x_in), static_cast<std::size_t>(x_in));
    if (fp8_act) {
      fp8_simulate_activation(row);
    } else if (op != Op::kF32) {
      for (float& v : row) v = round_to_bf16(v);
    }
  }
  std::vector<float> out(static_cast<std::size_t>(rows * w.out));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t o = 0; o < w.out; ++o) {
      const std::int64_t g = op == Op::kGrouped ? o / per_group : 0;
      const float v = scalar_blocked_dot(xs.data() + r * x_in + g * w.in, w.w.data() + o * w.in, w.in, block);
      out[static_cast<std::size_t>(r * w.out + o)] = op == Op::kF32 ? v : round_to_bf16(v);
    }
  }
  return out;
}

void run_op(Op op, const std::vector<float>& x, std::int64_t rows, const DenseWeight& w, std::int64_t groups,
            std::vector<float>& out, ThreadPool* pool, GemmKernels kernels) {
  switch (op) {
    case Op::kLinear:
      return linear(x, rows, w, out, pool, kernels);
    case Op::kBf16:
      return linear_bf16(x, rows, w, out, pool, kernels);
    case Op::kF32:
      return linear_f32(x, rows, w, out, pool, kernels);
    case Op::kGrouped:
      return linear_grouped_bf16(x, rows, w, groups, out, pool, kernels);
  }
}

// Random non-zero values; bf16 values unless `any`.
std::vector<float> nonzero_values(std::mt19937& rng, std::size_t n, float range, bool any) {
  std::uniform_real_distribution<float> u(-range, range);
  std::vector<float> v(n);
  for (float& x : v) {
    do {
      x = any ? u(rng) : round_to_bf16(u(rng));
    } while (x == 0.0f);
  }
  return v;
}

// First index where the bit patterns differ, or -1.
std::int64_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return static_cast<std::int64_t>(i);
  }
  return -1;
}

class LinearKernels : public ::testing::TestWithParam<GemmKernels> {  // param: the kernels every call asks for
 protected:
  // Every row count in 1..9 and 33, with and without a pool, against the scalar reference.
  void check(Op op, const DenseWeight& w, std::int64_t groups, std::mt19937& rng, ThreadPool& pool) {
    const std::int64_t x_in = op == Op::kGrouped ? groups * w.in : w.in;
    for (std::int64_t rows : {1, 2, 3, 4, 5, 6, 7, 8, 9, 33}) {
      const std::vector<float> x = nonzero_values(rng, static_cast<std::size_t>(rows * x_in), 3.0f, /*any=*/true);
      const std::vector<float> want = scalar_reference(op, x, rows, w, groups);
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        std::vector<float> got(want.size(), -1.0f);
        run_op(op, x, rows, w, groups, got, p, GetParam());
        const std::int64_t bad = first_bit_difference(got, want);
        ASSERT_EQ(bad, -1) << "op " << static_cast<int>(op) << " weight " << w.name << " [" << w.out << ", " << w.in
                           << "] groups " << groups << " rows " << rows << " pool " << (p != nullptr) << ": "
                           << got[static_cast<std::size_t>(bad)] << " vs " << want[static_cast<std::size_t>(bad)];
      }
    }
  }
};

TEST_P(LinearKernels, BitIdenticalToScalarReference) {
  std::mt19937 rng(31);
  ThreadPool pool(3);
  for (WeightKind kind : {WeightKind::kFp8, WeightKind::kFp4, WeightKind::kBf16, WeightKind::kF32}) {
    for (std::int64_t out : {1, 7, 16, 129}) {
      // 100: one short block; 300 = 2 x 128 + 44 (and 9 x 32 + 12 for fp4 weights); 5 < any block.
      for (std::int64_t in : {5, 100, 300}) {
        const bool f32 = kind == WeightKind::kF32;
        const std::string name =
            std::string(weight_kind_name(kind)) + "_" + std::to_string(out) + "x" + std::to_string(in);
        const DenseWeight w =
            make_dense_weight(name, out, in, kind, nonzero_values(rng, static_cast<std::size_t>(out * in), 0.5f, f32));
        ASSERT_TRUE(w.has_packed());
        check(Op::kF32, w, 1, rng, pool);
        if (!f32) {
          check(Op::kLinear, w, 1, rng, pool);
          check(Op::kBf16, w, 1, rng, pool);
        }
      }
    }
  }
}

TEST_P(LinearKernels, GroupedBitIdenticalToScalarReference) {
  std::mt19937 rng(32);
  ThreadPool pool(2);
  // Groups whose outputs start inside a 16-wide tile (per_group 1, 7, 20) and whole tiles (32).
  for (std::int64_t groups : {1, 2, 3}) {
    for (std::int64_t per_group : {1, 7, 20, 32}) {
      for (std::int64_t in : {64, 130}) {
        for (WeightKind kind : {WeightKind::kFp8, WeightKind::kFp4, WeightKind::kBf16}) {
          const DenseWeight w = make_dense_weight("wo_a", groups * per_group, in, kind,
                                                  nonzero_values(rng, static_cast<std::size_t>(groups * per_group * in),
                                                                 0.5f, /*any=*/false));
          check(Op::kGrouped, w, groups, rng, pool);
        }
      }
    }
  }
}

TEST_P(LinearKernels, WithoutPackedCopyAndAfterRounding) {
  std::mt19937 rng(33);
  ThreadPool pool(2);
  // A weight whose packed copy is missing (built by hand) is packed per call: same results.
  DenseWeight w = make_dense_weight("wf", 37, 200, WeightKind::kF32, nonzero_values(rng, 37 * 200, 0.5f, true));
  DenseWeight bare{w.name, w.out, w.in, w.kind, w.w, {}};
  ASSERT_FALSE(bare.has_packed());
  check(Op::kF32, bare, 1, rng, pool);
  // round_weight_to_bf16 repacks.
  round_weight_to_bf16(w);
  ASSERT_TRUE(w.has_packed());
  check(Op::kLinear, w, 1, rng, pool);
  check(Op::kF32, w, 1, rng, pool);
}

INSTANTIATE_TEST_SUITE_P(Dispatch, LinearKernels, ::testing::Values(GemmKernels::kBest, GemmKernels::kBaseline),
                         [](const ::testing::TestParamInfo<GemmKernels>& param) {
                           return param.param == GemmKernels::kBaseline ? "Baseline" : "Best";
                         });

TEST(DenseWeightPacking, Layout) {
  // packed[(t * in + i) * 16 + j] = w[(t * 16 + j) * in + i], zero padding past the last output.
  const std::int64_t out = 19, in = 3;
  std::vector<float> v(static_cast<std::size_t>(out * in));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i + 1);
  const DenseWeight w = make_dense_weight("w", out, in, WeightKind::kF32, v);
  ASSERT_EQ(w.packed.size(), static_cast<std::size_t>(2 * 16 * in));
  for (std::int64_t t = 0; t < 2; ++t) {
    for (std::int64_t i = 0; i < in; ++i) {
      for (std::int64_t j = 0; j < 16; ++j) {
        const std::int64_t o = t * 16 + j;
        const float want = o < out ? v[static_cast<std::size_t>(o * in + i)] : 0.0f;
        EXPECT_EQ(w.packed[static_cast<std::size_t>((t * in + i) * 16 + j)], want) << t << " " << i << " " << j;
      }
    }
  }
}

}  // namespace
}  // namespace dsv4
