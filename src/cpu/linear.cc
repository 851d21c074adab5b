#include "cpu/linear.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "numerics/bf16.h"
#include "numerics/block_quant.h"

namespace dsv4 {
namespace {

void check_shapes(const char* who, std::span<const float> x, std::int64_t rows, std::int64_t in, std::span<float> out,
                  std::int64_t out_features, const DenseWeight& w) {
  if (rows < 0 || static_cast<std::int64_t>(x.size()) != rows * in ||
      static_cast<std::int64_t>(out.size()) != rows * out_features ||
      static_cast<std::int64_t>(w.w.size()) != w.out * w.in) {
    throw std::invalid_argument(
        fmt::format("{}: weight '{}' [{}, {}] ({} values) with x of {} values and out of {} values for {} rows", who,
                    w.name, w.out, w.in, w.w.size(), x.size(), out.size(), rows));
  }
}

std::int64_t reduction_block(const DenseWeight& w) { return w.kind == WeightKind::kFp4 ? 32 : kActQuantBlock; }

// ---- The GEMM kernels ------------------------------------------------------------------------
// Every output element is blocked_dot(x_row, w_row, in, block) exactly: the same products, the
// same fp32 additions in the same order. What is vectorized is the set of output features: the
// weight's packed copy (DenseWeight::packed, [tile][in][T]) gives, for each k, T consecutive
// output features' weights side by side, so acc[j] += x[k] * Wp[k][j] over j is one vector
// multiply and one vector add per group of lanes, each lane its own sequential sum. A kernel call
// keeps R rows x NT tiles of such sums in registers (register tiling: a weight load serves R
// rows, an activation load NT * T outputs). The reduction dimension is never split or reordered,
// so results are bit-identical to the scalar loop whatever the ISA (no FMA: -ffp-contract=off).
constexpr std::int64_t T = DenseWeight::kPackTile;
constexpr std::int64_t kTilesPerItem = 4;  // output tiles per parallel work item
constexpr std::int64_t kRowsPerItem = 16;  // rows per parallel work item

struct GemmJob {
  const float* x = nullptr;  // row r, group g starts at x + r * x_row + g * in
  std::int64_t x_row = 0;
  std::int64_t rows = 0, in = 0, n_out = 0, block = 0;
  std::int64_t per_group = 0;  // outputs per group (n_out when not grouped)
  const float* wp = nullptr;   // packed weight
  float* out = nullptr;        // [rows, n_out]
  bool round = false;          // bf16 output
  std::int64_t n_tiles = 0, n_items_out = 0;
};

#define DSV4_INLINE [[gnu::always_inline]] inline

// Rows [r0, r0 + R) x tiles [t0, t0 + NT) against group g's slice of x; stores the outputs in
// [lo, hi) (global output indices; lanes outside are computed and dropped).
template <int R, int NT>
DSV4_INLINE void tile_kernel(const GemmJob& job, std::int64_t r0, std::int64_t t0, std::int64_t g, std::int64_t lo,
                             std::int64_t hi) {
  constexpr int W = NT * static_cast<int>(T);
  const std::int64_t in = job.in;
  const float* x[R];
  for (int r = 0; r < R; ++r) x[r] = job.x + (r0 + r) * job.x_row + g * in;
  const float* wt = job.wp + t0 * in * T;  // tile n at wt + n * in * T
  float total[R][W];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < W; ++c) total[r][c] = 0.0f;
  for (std::int64_t start = 0; start < in; start += job.block) {
    const std::int64_t stop = std::min(in, start + job.block);
    float part[R][W];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < W; ++c) part[r][c] = 0.0f;
    for (std::int64_t k = start; k < stop; ++k) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const float xv = x[r][k];
#pragma GCC unroll 8
        for (int n = 0; n < NT; ++n) {
          const float* wk = wt + (n * in + k) * T;
#pragma GCC unroll 16
          for (int j = 0; j < static_cast<int>(T); ++j) part[r][n * T + j] += xv * wk[j];
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < W; ++c) total[r][c] += part[r][c];
  }
  const std::int64_t o0 = t0 * T;
  const std::int64_t c_lo = std::max<std::int64_t>(lo - o0, 0), c_hi = std::min<std::int64_t>(hi - o0, W);
  for (int r = 0; r < R; ++r) {
    float* dst = job.out + (r0 + r) * job.n_out + o0;
    if (job.round) {
      for (std::int64_t c = c_lo; c < c_hi; ++c) dst[c] = round_to_bf16(total[r][c]);
    } else {
      for (std::int64_t c = c_lo; c < c_hi; ++c) dst[c] = total[r][c];
    }
  }
}

// Rows [r, r + R) over tiles [ts, te) in chunks of NT, then smaller chunks.
template <int R, int NT>
DSV4_INLINE void tile_chunks(const GemmJob& job, std::int64_t r, std::int64_t ts, std::int64_t te, std::int64_t g,
                             std::int64_t lo, std::int64_t hi) {
  std::int64_t t = ts;
  for (; t + NT <= te; t += NT) tile_kernel<R, NT>(job, r, t, g, lo, hi);
  if constexpr (NT >= 4) {
    if (t + 2 <= te) {
      tile_kernel<R, 2>(job, r, t, g, lo, hi);
      t += 2;
    }
  }
  if constexpr (NT >= 2) {
    if (t < te) tile_kernel<R, 1>(job, r, t, g, lo, hi);
  }
}

// One segment: tiles [ts, te) whose stored outputs [lo, hi) all belong to group g.
// RMAX rows at a time one tile each; leftover rows (RMAX = 4: two, then one) several tiles each.
template <int RMAX, int NT1>
DSV4_INLINE void run_segment(const GemmJob& job, std::int64_t r0, std::int64_t r1, std::int64_t ts, std::int64_t te,
                             std::int64_t g, std::int64_t lo, std::int64_t hi) {
  std::int64_t r = r0;
  for (; r + RMAX <= r1; r += RMAX) tile_chunks<RMAX, 1>(job, r, ts, te, g, lo, hi);
  if constexpr (RMAX >= 4) {
    for (; r + 2 <= r1; r += 2) tile_chunks<2, 2>(job, r, ts, te, g, lo, hi);
  }
  for (; r < r1; ++r) tile_chunks<1, NT1>(job, r, ts, te, g, lo, hi);
}

// Work item idx: a block of rows x a run of kTilesPerItem output tiles.
template <int RMAX, int NT1>
DSV4_INLINE void run_item_impl(const GemmJob& job, std::int64_t idx) {
  const std::int64_t rb = idx / job.n_items_out, ob = idx % job.n_items_out;
  const std::int64_t r0 = rb * kRowsPerItem, r1 = std::min(job.rows, r0 + kRowsPerItem);
  const std::int64_t t0 = ob * kTilesPerItem, t1 = std::min(job.n_tiles, t0 + kTilesPerItem);
  const std::int64_t pg = job.per_group;
  const std::int64_t first = t0 * T, last = std::min(t1 * T, job.n_out);  // outputs [first, last)
  if (first / pg == (last - 1) / pg) {
    run_segment<RMAX, NT1>(job, r0, r1, t0, t1, first / pg, first, last);
    return;
  }
  // Tiles straddling groups: each tile once per group it touches, keeping that group's lanes.
  for (std::int64_t t = t0; t < t1; ++t) {
    const std::int64_t o_lo = t * T, o_hi = std::min(o_lo + T, job.n_out);
    for (std::int64_t g = o_lo / pg; g <= (o_hi - 1) / pg; ++g) {
      run_segment<RMAX, NT1>(job, r0, r1, t, t + 1, g, std::max(o_lo, g * pg), std::min(o_hi, (g + 1) * pg));
    }
  }
}

// The same code compiled twice: SSE2 (the x86-64 baseline; 4 lanes, 16 registers: 2 rows x one
// tile, or one row x two tiles, is 8 accumulators) and, where the CPU has it, AVX2 (8 lanes:
// 4 rows x one tile, or one row x four tiles). The vector width changes which lanes share an
// instruction, never any lane's arithmetic.
void run_item_generic(const GemmJob& job, std::int64_t idx) { run_item_impl<2, 2>(job, idx); }

#if defined(__x86_64__) && defined(__GNUC__)
#define DSV4_HAVE_AVX2_PATH 1
[[gnu::target("avx2")]] void run_item_avx2(const GemmJob& job, std::int64_t idx) { run_item_impl<4, 4>(job, idx); }
bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#endif

// Below this many multiply-adds (activation values) a GEMM (the FP8 activation simulation) runs
// on the calling thread: waking the pool would cost more.
constexpr std::int64_t kMinParallelWork = std::int64_t{1} << 17;
constexpr std::int64_t kMinParallelSimulate = 4096;

// out[r, o] = finish(blocked_dot(x[r] (group of o), W[o])) for all r, o.
void gemm(const float* x, std::int64_t x_row, std::int64_t rows, const DenseWeight& w, std::int64_t in,
          std::int64_t per_group, bool round, std::span<float> out, ThreadPool* pool, GemmKernels kernels) {
  if (rows == 0 || w.out == 0) return;
  std::vector<float> local;
  const float* wp = w.packed.data();
  if (!w.has_packed()) {
    local = packed_weight_layout(w.w, w.out, w.in);
    wp = local.data();
  }
  GemmJob job;
  job.x = x;
  job.x_row = x_row;
  job.rows = rows;
  job.in = in;
  job.n_out = w.out;
  job.block = reduction_block(w);
  job.per_group = per_group;
  job.wp = wp;
  job.out = out.data();
  job.round = round;
  job.n_tiles = (w.out + T - 1) / T;
  job.n_items_out = (job.n_tiles + kTilesPerItem - 1) / kTilesPerItem;
  const std::int64_t items = (rows + kRowsPerItem - 1) / kRowsPerItem * job.n_items_out;
  void (*run_item)(const GemmJob&, std::int64_t) = run_item_generic;
#ifdef DSV4_HAVE_AVX2_PATH
  if (kernels == GemmKernels::kBest && cpu_has_avx2()) run_item = run_item_avx2;
#else
  (void)kernels;
#endif
  if (rows * w.out * in < kMinParallelWork) pool = nullptr;
  parallel_for(pool, 0, items, [&](std::int64_t idx) { run_item(job, idx); });
}

}  // namespace

float blocked_dot(const float* a, const float* b, std::int64_t n, std::int64_t block) {
  float total = 0.0f;
  for (std::int64_t start = 0; start < n; start += block) {
    const std::int64_t stop = std::min(n, start + block);
    float part = 0.0f;
    for (std::int64_t k = start; k < stop; ++k) part += a[k] * b[k];
    total += part;
  }
  return total;
}

void fp8_simulate_activation(std::span<float> row) {
  for (float& v : row) v = round_to_bf16(v);
  for (std::size_t start = 0; start < row.size(); start += kActQuantBlock) {
    const std::size_t len = std::min<std::size_t>(kActQuantBlock, row.size() - start);
    simulate_quant_blocks(row.subspan(start, len), len, QuantFormat::kFp8E4m3);
  }
}

void linear(std::span<const float> x, std::int64_t rows, const DenseWeight& w, std::span<float> out, ThreadPool* pool,
            GemmKernels kernels) {
  check_shapes("linear", x, rows, w.in, out, w.out, w);
  if (w.kind == WeightKind::kBf16) return linear_bf16(x, rows, w, out, pool, kernels);
  if (w.kind == WeightKind::kF32) {
    throw std::invalid_argument(
        fmt::format("linear: weight '{}' is fp32; use linear_f32, or round_weight_to_bf16 for a bf16 layer", w.name));
  }
  std::vector<float> xs(x.begin(), x.end());
  // Per row, independent of the others (about 10 ns a value: worth the pool for a few rows).
  parallel_for(rows * w.in < kMinParallelSimulate ? nullptr : pool, 0, rows, [&](std::int64_t r) {
    fp8_simulate_activation(
        std::span<float>(xs).subspan(static_cast<std::size_t>(r * w.in), static_cast<std::size_t>(w.in)));
  });
  gemm(xs.data(), w.in, rows, w, w.in, w.out, /*round=*/true, out, pool, kernels);
}

void linear_bf16(std::span<const float> x, std::int64_t rows, const DenseWeight& w, std::span<float> out,
                 ThreadPool* pool, GemmKernels kernels) {
  check_shapes("linear_bf16", x, rows, w.in, out, w.out, w);
  if (w.kind == WeightKind::kF32) {
    throw std::invalid_argument(fmt::format("linear_bf16: weight '{}' is fp32; round_weight_to_bf16 it first", w.name));
  }
  std::vector<float> xs(x.size());
  std::transform(x.begin(), x.end(), xs.begin(), round_to_bf16);
  gemm(xs.data(), w.in, rows, w, w.in, w.out, /*round=*/true, out, pool, kernels);
}

void linear_f32(std::span<const float> x, std::int64_t rows, const DenseWeight& w, std::span<float> out,
                ThreadPool* pool, GemmKernels kernels) {
  check_shapes("linear_f32", x, rows, w.in, out, w.out, w);
  const std::vector<float> xs(x.begin(), x.end());  // x may alias out
  gemm(xs.data(), w.in, rows, w, w.in, w.out, /*round=*/false, out, pool, kernels);
}

void linear_grouped_bf16(std::span<const float> x, std::int64_t rows, const DenseWeight& w, std::int64_t groups,
                         std::span<float> out, ThreadPool* pool, GemmKernels kernels) {
  if (groups <= 0 || w.out % groups != 0) {
    throw std::invalid_argument(fmt::format(
        "linear_grouped_bf16: weight '{}' has {} outputs, not divisible into {} groups", w.name, w.out, groups));
  }
  check_shapes("linear_grouped_bf16", x, rows, groups * w.in, out, w.out, w);
  if (w.kind == WeightKind::kF32) {
    throw std::invalid_argument(
        fmt::format("linear_grouped_bf16: weight '{}' is fp32; round_weight_to_bf16 it first", w.name));
  }
  std::vector<float> xs(x.size());
  std::transform(x.begin(), x.end(), xs.begin(), round_to_bf16);
  gemm(xs.data(), groups * w.in, rows, w, w.in, w.out / groups, /*round=*/true, out, pool, kernels);
}

}  // namespace dsv4
