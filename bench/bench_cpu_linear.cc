// Times the CPU linear layers (src/cpu/linear.h) on tiny-model shapes against the scalar
// implementation they replaced (kept below as old_*), and checks the two agree bit for bit.
//   bench_cpu_linear [min_seconds_per_case (default 0.3)]
// Prints, per case: GFLOP/s of the old scalar code, the new kernels forced to baseline SSE2,
// the new kernels as dispatched (AVX2 where available), and the new/old speedups; single
// thread and with a 2-thread pool.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "cpu/dense_weight.h"
#include "cpu/linear.h"
#include "numerics/bf16.h"

namespace dsv4 {
namespace {

// ---- The previous implementation (scalar: one blocked_dot per output element) ----------------
std::int64_t old_block(const DenseWeight& w) { return w.kind == WeightKind::kFp4 ? 32 : kActQuantBlock; }

template <typename Finish>
void old_gemm_rows(const std::vector<float>& xs, std::int64_t rows, const DenseWeight& w, std::int64_t block,
                   std::span<float> out, ThreadPool* pool, Finish finish) {
  const std::int64_t in = w.in, n_out = w.out;
  parallel_for(pool, 0, rows * n_out, [&](std::int64_t idx) {
    const std::int64_t r = idx / n_out, o = idx % n_out;
    out[static_cast<std::size_t>(idx)] = finish(blocked_dot(xs.data() + r * in, w.w.data() + o * in, in, block));
  });
}

void old_linear(std::span<const float> x, std::int64_t rows, const DenseWeight& w, std::span<float> out,
                ThreadPool* pool) {
  std::vector<float> xs(x.begin(), x.end());
  if (w.kind == WeightKind::kBf16) {
    for (float& v : xs) v = round_to_bf16(v);
  } else {
    for (std::int64_t r = 0; r < rows; ++r) {
      fp8_simulate_activation(
          std::span<float>(xs).subspan(static_cast<std::size_t>(r * w.in), static_cast<std::size_t>(w.in)));
    }
  }
  old_gemm_rows(xs, rows, w, old_block(w), out, pool, [](float v) { return round_to_bf16(v); });
}

void old_linear_f32(std::span<const float> x, std::int64_t rows, const DenseWeight& w, std::span<float> out,
                    ThreadPool* pool) {
  const std::vector<float> xs(x.begin(), x.end());
  old_gemm_rows(xs, rows, w, old_block(w), out, pool, [](float v) { return v; });
}

void old_linear_grouped_bf16(std::span<const float> x, std::int64_t rows, const DenseWeight& w, std::int64_t groups,
                             std::span<float> out, ThreadPool* pool) {
  std::vector<float> xs(x.size());
  std::transform(x.begin(), x.end(), xs.begin(), round_to_bf16);
  const std::int64_t in = w.in, n_out = w.out, per_group = w.out / groups, block = old_block(w);
  parallel_for(pool, 0, rows * n_out, [&](std::int64_t idx) {
    const std::int64_t r = idx / n_out, o = idx % n_out, g = o / per_group;
    const float* xg = xs.data() + r * groups * in + g * in;
    out[static_cast<std::size_t>(idx)] = round_to_bf16(blocked_dot(xg, w.w.data() + o * in, in, block));
  });
}

// ---- Cases ----------------------------------------------------------------------------------
enum class Op { kLinear, kF32, kGrouped };

struct Case {
  std::string name;
  Op op;
  WeightKind kind;
  std::int64_t out, in, groups, rows;
};

DenseWeight random_weight(std::mt19937& rng, const Case& c) {
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  std::vector<float> v(static_cast<std::size_t>(c.out * c.in));
  for (float& x : v) x = c.kind == WeightKind::kF32 ? u(rng) : round_to_bf16(u(rng));
  return make_dense_weight(c.name, c.out, c.in, c.kind, std::move(v));
}

// Best-of time per call (seconds): repeats of a loop lasting at least min_s / 5.
double time_call(const std::function<void()>& fn, double min_s) {
  using clock = std::chrono::steady_clock;
  fn();  // warm up
  double best = 1e30;
  const auto t_end = clock::now() + std::chrono::duration<double>(min_s);
  do {
    const auto t0 = clock::now();
    int n = 0;
    double elapsed = 0;
    do {
      fn();
      ++n;
      elapsed = std::chrono::duration<double>(clock::now() - t0).count();
    } while (elapsed < min_s / 5);
    best = std::min(best, elapsed / n);
  } while (clock::now() < t_end);
  return best;
}

int run(double min_s) {
  const std::vector<Case> shapes = {
      {"wq_b fp8 [2048x128]", Op::kLinear, WeightKind::kFp8, 2048, 128, 1, 0},
      {"wq_a fp8 [128x256]", Op::kLinear, WeightKind::kFp8, 128, 256, 1, 0},
      {"wo_a grouped fp8 [256x1024] g2", Op::kGrouped, WeightKind::kFp8, 256, 1024, 2, 0},
      {"head f32 [4096x256]", Op::kF32, WeightKind::kF32, 4096, 256, 1, 0},
      {"expert fp4 [128x256]", Op::kLinear, WeightKind::kFp4, 128, 256, 1, 0},
      {"wo_b bf16 [256x256]", Op::kLinear, WeightKind::kBf16, 256, 256, 1, 0},
  };
  ThreadPool pool2(2);
  std::mt19937 rng(1);
  fmt::print("{:<32} {:>5} {:>3} | {:>9} {:>9} {:>9} | {:>7} {:>7} | bits\n", "case (GFLOP/s)", "rows", "thr", "old",
             "new-sse2", "new", "sse2/old", "new/old");
  bool all_equal = true;
  for (const Case& shape : shapes) {
    for (std::int64_t rows : {1, 256}) {
      Case c = shape;
      c.rows = rows;
      const DenseWeight w = random_weight(rng, c);
      const std::int64_t in_row = c.in * c.groups;
      std::uniform_real_distribution<float> u(-2.0f, 2.0f);
      std::vector<float> x(static_cast<std::size_t>(rows * in_row));
      for (float& v : x) v = u(rng);
      std::vector<float> y_old(static_cast<std::size_t>(rows * c.out)), y_new(y_old.size());
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2}) {
        auto old_fn = [&] {
          if (c.op == Op::kLinear) old_linear(x, rows, w, y_old, pool);
          if (c.op == Op::kF32) old_linear_f32(x, rows, w, y_old, pool);
          if (c.op == Op::kGrouped) old_linear_grouped_bf16(x, rows, w, c.groups, y_old, pool);
        };
        GemmKernels kernels = GemmKernels::kBest;
        auto new_fn = [&] {
          if (c.op == Op::kLinear) linear(x, rows, w, y_new, pool, kernels);
          if (c.op == Op::kF32) linear_f32(x, rows, w, y_new, pool, kernels);
          if (c.op == Op::kGrouped) linear_grouped_bf16(x, rows, w, c.groups, y_new, pool, kernels);
        };
        const double t_old = time_call(old_fn, min_s);
        kernels = GemmKernels::kBaseline;
        const double t_sse = time_call(new_fn, min_s);
        bool equal = std::memcmp(y_old.data(), y_new.data(), y_old.size() * sizeof(float)) == 0;
        kernels = GemmKernels::kBest;
        const double t_new = time_call(new_fn, min_s);
        equal = equal && std::memcmp(y_old.data(), y_new.data(), y_old.size() * sizeof(float)) == 0;
        all_equal = all_equal && equal;
        const double flop = 2.0 * static_cast<double>(rows * c.out * c.in);
        fmt::print("{:<32} {:>5} {:>3} | {:>9.2f} {:>9.2f} {:>9.2f} | {:>7.1f}x {:>6.1f}x | {}\n", c.name, rows,
                   pool ? pool->size() : 1, flop / t_old * 1e-9, flop / t_sse * 1e-9, flop / t_new * 1e-9,
                   t_old / t_sse, t_old / t_new, equal ? "same" : "DIFFERENT");
      }
    }
  }
  // The FP8 activation simulation linear() runs on every fp8/fp4 input row (unchanged here).
  std::vector<float> row(256), work(256);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (float& v : row) v = u(rng);
  const double t_sim = time_call(
      [&] {
        work = row;
        fp8_simulate_activation(work);
      },
      min_s);
  fmt::print("fp8_simulate_activation: {:.1f} ns per value (a 256-value row)\n", t_sim / 256 * 1e9);
  fmt::print("{}\n", all_equal ? "all outputs bit-identical to the old kernels"
                               : "MISMATCH: new kernels differ from the old ones");
  return all_equal ? 0 : 1;
}

}  // namespace
}  // namespace dsv4

int main(int argc, char** argv) { return dsv4::run(argc > 1 ? std::atof(argv[1]) : 0.3); }
