// The weight-streaming product of dense fp8 weights for few rows (gemm_stream.h): f16 wgmma on
// the exact f16 values of the e4m3 codes. CPU twin: cpu/linear.cc linear().
#include "cuda/kernels/gemm_stream.h"

#include <algorithm>
#include <cstdint>

#include "cuda/device.h"
#include "cuda/kernels/gemm_output.cuh"
#include "cuda/kernels/launch_check.h"
#include "cuda/kernels/numerics.cuh"

namespace dsv4::gpu {
namespace {

constexpr int kThreads = 128;       // one warpgroup
constexpr int kWeightTile = 64;     // weight rows of a tile (wgmma's M)
constexpr int kUnitK = 128;         // k of a unit: one weight-scale block, one activation scale
constexpr int kUnitBytes = kWeightTile * kUnitK;  // one unit of a tile's weight, e4m3: 8 KiB
constexpr int kSmemLimit = 225 * 1024;  // dynamic shared memory a CTA may take (227 KiB less the static part)
constexpr std::int64_t kPartialBudget = std::int64_t{8} << 20;  // fp32 partials (32 MiB)

constexpr int kDepth = 4;           // units of weight a thread has in flight (its registers)

struct StreamArgs {
  const std::uint8_t* codes;   // activations [rows][k] e4m3
  const float* a_scales;       // [rows][units]
  std::int64_t k;
  const std::uint8_t* w;       // weight [n][k] e4m3
  const float* w_scales;       // [ceil(n / 128)][units]
  std::int64_t n;
  GemmOutput out;
  std::int64_t rows;
  const std::int32_t* rows_dev;
  int tiles, units, units_per_split, splits, token_blocks;
  float* partial;              // [tile][token block][split][64 x NT] when splits > 1
  std::int32_t* counters;      // [tile][token block]
};

// Shared memory of a CTA whose split has `units` units: two units of weight as f16 (wgmma's A
// operand, alternating), the split's activations as f16 (the B operand) and their scales [unit][NT].
__host__ __device__ constexpr int smem_bytes(int nt, int units) { return 4 * kUnitBytes + units * (nt * kUnitK * 2 + nt * 4); }

// Operand layouts (K-major without swizzle, device.h wgmma_m64n64k16_bf16; f16 core matrices of 8
// rows x 8 values). A, one unit: row r, k group kg (8 values) at kg * 1024 + (r / 8) * 128 + (r % 8)
// * 16 (k16 step j starts at group 2 j: lbo 1024, sbo 128). B, unit u: row r, group kg at u * NT *
// 256 + kg * NT * 16 + (r / 8) * 128 + (r % 8) * 16 (step j at group 2 j: lbo NT * 16, sbo 128).
__device__ __forceinline__ int a_offset(int r, int kg) { return kg * 1024 + (r >> 3) * 128 + (r & 7) * 16; }

// 16 e4m3 codes as 16 f16 (exact): k 0..7 and 8..15.
__device__ __forceinline__ void e4m3x16_to_f16(const uint4& v, uint4& lo, uint4& hi) {
  lo = make_uint4(e4m3x2_to_f16x2(v.x), e4m3x2_to_f16x2(v.x >> 16), e4m3x2_to_f16x2(v.y), e4m3x2_to_f16x2(v.y >> 16));
  hi = make_uint4(e4m3x2_to_f16x2(v.z), e4m3x2_to_f16x2(v.z >> 16), e4m3x2_to_f16x2(v.w), e4m3x2_to_f16x2(v.w >> 16));
}

template <int NT>
__global__ void __launch_bounds__(kThreads) stream_fp8_kernel(StreamArgs args) {
  DSV4_DYNAMIC_SMEM(std::uint8_t, smem);
  __shared__ int last_arrival;
  const std::int64_t limit = args.rows_dev == nullptr ? args.rows
                                                      : (args.rows < *args.rows_dev ? args.rows : static_cast<std::int64_t>(*args.rows_dev));
  const std::int64_t tok0 = static_cast<std::int64_t>(blockIdx.z) * NT;
  if (tok0 >= limit) return;  // the whole CTA (and every split of this token block) leaves
  const int count = static_cast<int>(limit - tok0 < NT ? limit - tok0 : NT);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
  const int split = blockIdx.y;
  const int u_begin = split * args.units_per_split;
  const int n_units = (args.units - u_begin < args.units_per_split ? args.units - u_begin : args.units_per_split);
  const std::int64_t k = args.k;
  std::uint8_t* a_smem = smem;
  std::uint8_t* b_smem = a_smem + 4 * kUnitBytes;
  float* sa_smem = reinterpret_cast<float*>(b_smem + n_units * NT * kUnitK * 2);

  // The CTA's tiles: blockIdx.x, + gridDim.x, ...; items = (tile, unit) pairs in that order.
  const int my_tiles = (args.tiles - static_cast<int>(blockIdx.x) + static_cast<int>(gridDim.x) - 1) / static_cast<int>(gridDim.x);
  const int items = my_tiles * n_units;
  auto tile_of = [&](int item) { return static_cast<int>(blockIdx.x) + (item / n_units) * static_cast<int>(gridDim.x); };
  // Thread (warp, lane) owns rows lane / 4 + 8 warp (+ 32) and 16-value chunks lane % 4 (+ 4) of
  // every unit: each load instruction of a warp reads 64 contiguous bytes of 8 rows. The chunks go
  // from global memory into the thread's registers, kDepth units ahead.
  auto chunk_row = [&](int i) { return g + 8 * warp + 32 * (i >> 1); };
  auto chunk_col = [&](int i) { return q + 4 * (i & 1); };
  auto load_unit = [&](int item, uint4 (&raw)[4]) {
    const std::int64_t row0 = static_cast<std::int64_t>(tile_of(item)) * kWeightTile;
    const std::int64_t k0 = static_cast<std::int64_t>(u_begin + item % n_units) * kUnitK;
    DSV4_UNROLL
    for (int i = 0; i < 4; ++i) {
      const int r = chunk_row(i), c = chunk_col(i);
      raw[i] = load_global_v4_or_zero(args.w + (row0 + r) * k + k0 + 16 * c, row0 + r < args.n && k0 + 16 * c < k);
    }
  };

  uint4 buf[kDepth][4];
  DSV4_UNROLL
  for (int d = 0; d < kDepth; ++d)
    if (d < items) load_unit(d, buf[d]);
  // Meanwhile the split's activations, as f16.
  for (int i = tid; i < NT * n_units * 8; i += kThreads) {
    const int r = i / (n_units * 8), rem = i % (n_units * 8), ul = rem >> 3, c = rem & 7;
    const std::int64_t kk = static_cast<std::int64_t>(u_begin + ul) * kUnitK + 16 * c;
    uint4 lo, hi;
    e4m3x16_to_f16(load_global_v4_or_zero(args.codes + (tok0 + r) * k + kk, r < count && kk < k), lo, hi);
    std::uint8_t* dst = b_smem + ul * (NT * 256) + (2 * c) * (NT * 16) + (r >> 3) * 128 + (r & 7) * 16;
    *reinterpret_cast<uint4*>(dst) = lo;
    *reinterpret_cast<uint4*>(dst + NT * 16) = hi;
  }
  for (int i = tid; i < NT * n_units; i += kThreads) {
    const int ul = i / NT, r = i % NT;
    sa_smem[i] = r < count ? args.a_scales[(tok0 + r) * args.units + u_begin + ul] : 0.0f;
  }

  const int row_in_tile = 16 * warp + g;
  float acc[NT / 2], part[NT / 2];
  DSV4_UNROLL
  for (int i = 0; i < NT / 2; ++i) acc[i] = part[i] = 0.0f;

  for (int base = 0; base < items; base += kDepth) {
    DSV4_UNROLL
    for (int d = 0; d < kDepth; ++d) {
      const int item = base + d;
      if (item >= items) break;
      const int ul = item % n_units, tile = tile_of(item);
      // The unit as f16 into A buffer item % 2 (its last readers, unit item - 2's products, were
      // waited for by every thread before the previous barrier), visible to wgmma, then everyone's;
      // the registers take the unit kDepth ahead.
      std::uint8_t* a_unit = a_smem + (item & 1) * (2 * kUnitBytes);
      DSV4_UNROLL
      for (int i = 0; i < 4; ++i) {
        uint4 lo, hi;
        e4m3x16_to_f16(buf[d][i], lo, hi);
        *reinterpret_cast<uint4*>(a_unit + a_offset(chunk_row(i), 2 * chunk_col(i))) = lo;
        *reinterpret_cast<uint4*>(a_unit + a_offset(chunk_row(i), 2 * chunk_col(i) + 1)) = hi;
      }
      if (item + kDepth < items) load_unit(item + kDepth, buf[d]);
      fence_proxy_async_shared();
      __syncthreads();
      // The unit's eight k16 steps in one chain: f16 products are exact and f16 wgmma sums in fp32
      // (FP8 wgmma keeps fewer bits: about 1e-4 relative on the H200, docs/perf.md).
      wgmma_fence();
      DSV4_UNROLL
      for (int j = 0; j < 8; ++j) {
        const std::uint64_t da = wgmma_descriptor(a_unit + 2 * j * 1024, 1024, 128);
        const std::uint64_t db = wgmma_descriptor(b_smem + ul * (NT * 256) + 2 * j * (NT * 16), NT * 16, 128);
        wgmma_m64k16_f16<NT>(part, da, db, j != 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operands(part);
      // acc += the unit's sum x (weight block scale x activation scale); part[4 m + e]: weight row
      // 16 warp + g + 8 (e / 2), activation row 8 m + 2 q + e % 2.
      const float ws = args.w_scales[static_cast<std::int64_t>(tile / 2) * args.units + u_begin + ul];
      DSV4_UNROLL
      for (int m = 0; m < NT / 8; ++m) {
        const float2 sa = *reinterpret_cast<const float2*>(sa_smem + ul * NT + 8 * m + 2 * q);
        const float f0 = ws * sa.x, f1 = ws * sa.y;
        acc[4 * m + 0] += part[4 * m + 0] * f0;
        acc[4 * m + 1] += part[4 * m + 1] * f1;
        acc[4 * m + 2] += part[4 * m + 2] * f0;
        acc[4 * m + 3] += part[4 * m + 3] * f1;
      }
      if (ul != n_units - 1) continue;

      // The tile's k range is done: write it (one split), or hand it to the workspace.
      const std::int64_t n_row = static_cast<std::int64_t>(tile) * kWeightTile + row_in_tile;
      if (args.splits == 1) {
        DSV4_UNROLL
        for (int i = 0; i < NT / 2; ++i) {
          const std::int64_t n = n_row + 8 * ((i & 3) >> 1);
          const int r = 8 * (i >> 2) + 2 * q + (i & 1);
          if (r < count && n < args.n) store_out(args.out, tok0 + r, n, acc[i]);
        }
      } else {
        const std::int64_t slot_index = static_cast<std::int64_t>(tile) * args.token_blocks + blockIdx.z;
        float* mine = args.partial + (slot_index * args.splits + split) * (kWeightTile * NT);
        DSV4_UNROLL
        for (int i = 0; i < NT / 2; i += 4)
          *reinterpret_cast<float4*>(mine + (i / 4) * (4 * kThreads) + 4 * tid) = make_float4(acc[i], acc[i + 1], acc[i + 2], acc[i + 3]);
        __threadfence();
        __syncthreads();
        if (tid == 0) last_arrival = atomicAdd(args.counters + slot_index, 1) == args.splits - 1;
        __syncthreads();
        if (last_arrival) {
          __threadfence();
          float sum[NT / 2];
          DSV4_UNROLL
          for (int i = 0; i < NT / 2; ++i) sum[i] = 0.0f;
          for (int s = 0; s < args.splits; ++s) {
            const float* other = args.partial + (slot_index * args.splits + s) * (kWeightTile * NT);
            DSV4_UNROLL
            for (int i = 0; i < NT / 2; i += 4) {
              const float4 v = load_global_l2_v4(other + (i / 4) * (4 * kThreads) + 4 * tid);
              sum[i] += v.x, sum[i + 1] += v.y, sum[i + 2] += v.z, sum[i + 3] += v.w;
            }
          }
          DSV4_UNROLL
          for (int i = 0; i < NT / 2; ++i) {
            const std::int64_t n = n_row + 8 * ((i & 3) >> 1);
            const int r = 8 * (i >> 2) + 2 * q + (i & 1);
            if (r < count && n < args.n) store_out(args.out, tok0 + r, n, sum[i]);
          }
          if (tid == 0) args.counters[slot_index] = 0;  // ready for the next product
        }
      }
      DSV4_UNROLL
      for (int i = 0; i < NT / 2; ++i) acc[i] = 0.0f;
    }
  }
}

template <int NT>
void launch_stream(StreamArgs args, int grid_x, int smem, gpu_stream_t stream) {
  static const bool smem_set = (set_max_dynamic_smem(stream_fp8_kernel<NT>, kSmemLimit), true);
  (void)smem_set;
  launch(stream_fp8_kernel<NT>, dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(args.splits), static_cast<unsigned>(args.token_blocks)),
         dim3(kThreads), static_cast<std::size_t>(smem), stream, args);
}

}  // namespace

void gemm_stream_fp8(const QuantizedRows& a, std::int64_t rows, const DeviceWeight& w, const GemmOutput& out,
                     const std::int32_t* rows_dev, gpu_stream_t stream) {
  if (w.format != WeightFormat::kFp8) launch_error("gemm_stream_fp8: the weight is not fp8");
  if (w.k <= 0 || w.k % 32 != 0) launch_error("gemm_stream_fp8: the reduction length {} must be a positive multiple of 32", {w.k});
  if (a.k != w.k) launch_error("gemm_stream_fp8: activations of {} columns for a weight of {}", {a.k, w.k});
  if (rows <= 0 || w.n <= 0) return;
  if (reinterpret_cast<std::uintptr_t>(a.codes) % 16 != 0 || reinterpret_cast<std::uintptr_t>(w.data) % 16 != 0)
    launch_error("gemm_stream_fp8: activation codes and weights must be 16-byte aligned");
  const int nt = rows <= 8 ? 8 : rows <= 16 ? 16 : rows <= 32 ? 32 : 64;
  StreamArgs args{};
  args.codes = a.codes;
  args.a_scales = a.scales;
  args.k = w.k;
  args.w = static_cast<const std::uint8_t*>(w.data);
  args.w_scales = static_cast<const float*>(w.scale);
  args.n = w.n;
  args.out = out;
  args.rows = rows;
  args.rows_dev = rows_dev;
  args.units = static_cast<int>((w.k + kUnitK - 1) / kUnitK);
  args.tiles = static_cast<int>((w.n + kWeightTile - 1) / kWeightTile);
  args.token_blocks = static_cast<int>((rows + nt - 1) / nt);

  // The plan: units per split (`per`), and CTAs along the tiles (grid_x, each taking tiles_per_cta
  // tiles: one wave of CTAs -- a second, partial wave would cost a whole CTA time). Chosen by a cost
  // in units of weight a CTA streams: waves x (tiles a CTA x (units + partial write/read) + fixed
  // start), over every `per` that fits shared memory, the partials within the workspace budget
  // where any plan allows it. Ties go to fewer splits.
  const std::int64_t sms = stream_sm_count();
  const std::int64_t work = static_cast<std::int64_t>(args.tiles) * args.token_blocks;
  struct Plan {
    double cost = 0;
    int per = 0, grid_x = 0;
  };
  auto best_plan = [&](bool within_budget) {
    Plan best;
    for (int p = 1; p <= args.units && smem_bytes(nt, p) <= kSmemLimit; ++p) {
      const std::int64_t splits = (args.units + p - 1) / p;
      if (within_budget && splits > 1 && work * splits * kWeightTile * nt > kPartialBudget) continue;
      // CTAs resident at once: by shared memory, and by registers (ptxas: ~236 a thread at 64 rows,
      // 2 CTAs a multiprocessor; ~168 at 32, 3; <= 128 below, 4).
      const std::int64_t slots = std::clamp(kSmemLimit / (smem_bytes(nt, p) + 1024), 1, nt == 64 ? 2 : nt == 32 ? 3 : 4) * sms;
      const std::int64_t along = std::max<std::int64_t>(1, slots / (splits * args.token_blocks));
      const std::int64_t tiles_per_cta = (args.tiles + along - 1) / along;
      const std::int64_t grid_x = (args.tiles + tiles_per_cta - 1) / tiles_per_cta;
      const std::int64_t waves = (grid_x * splits * args.token_blocks + slots - 1) / slots;
      const double cost = static_cast<double>(waves) * (static_cast<double>(tiles_per_cta) * (p + (splits > 1 ? nt / 8.0 : 0.0)) + 2.0);
      if (best.per == 0 || cost <= best.cost) best = Plan{cost, p, static_cast<int>(grid_x)};
    }
    return best;
  };
  Plan plan = best_plan(true);
  if (plan.per == 0) plan = best_plan(false);
  if (plan.per == 0) launch_error("gemm_stream_fp8: {} activation rows of k {} do not fit in shared memory", {rows, w.k});
  args.units_per_split = plan.per;
  args.splits = (args.units + plan.per - 1) / plan.per;
  const int smem = smem_bytes(nt, plan.per);
  const int grid_x = plan.grid_x;
  if (args.splits > 1) {
    const StreamWorkspace ws = stream_workspace(stream, work * args.splits * kWeightTile * nt, work);
    args.partial = ws.partial;
    args.counters = ws.counters;
  }
  switch (nt) {
    case 8: launch_stream<8>(args, grid_x, smem, stream); break;
    case 16: launch_stream<16>(args, grid_x, smem, stream); break;
    case 32: launch_stream<32>(args, grid_x, smem, stream); break;
    default: launch_stream<64>(args, grid_x, smem, stream); break;
  }
}

}  // namespace dsv4::gpu
