// Matrix-product kernels (gemm.h): activation quantization, a CUDA-core kernel for few
// rows, and tensor-core tile kernels (mma.sync e4m3 for fp8/fp4 weights, mma.sync bf16 for
// bf16 activations). CPU twin: cpu/linear.cc.
#include "cuda/kernels/gemm.h"

#include <algorithm>

#include "cuda/kernels/launch_check.h"
#include "cuda/device.h"
#include "cuda/kernels/numerics.cuh"
#include "cuda/kernels/reduce.cuh"

namespace dsv4::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kActBlock = 128;  // activation quantization block along k

__device__ __forceinline__ std::int64_t row_limit(std::int64_t rows, const std::int32_t* rows_dev) {
  return rows_dev == nullptr ? rows : (rows < *rows_dev ? rows : static_cast<std::int64_t>(*rows_dev));
}

// ---- activation quantization ------------------------------------------------------------------
// One warp per (row, 128-block); lane i holds the block's values 4i .. 4i+3.
__global__ void quantize_rows_kernel(const std::uint16_t* x, std::int64_t ld, std::int64_t rows, std::int64_t k,
                                     std::uint8_t* codes, float* scales, const std::int32_t* rows_dev) {
  const std::int64_t blocks_per_row = (k + kActBlock - 1) / kActBlock;
  const std::int64_t warp_id = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const std::int64_t row = warp_id / blocks_per_row, kb = warp_id % blocks_per_row;
  if (row >= row_limit(rows, rows_dev)) return;  // the whole warp leaves together
  float v[4];
  float amax = 0.0f;
  DSV4_UNROLL
  for (int i = 0; i < 4; ++i) {
    const std::int64_t kk = kb * kActBlock + lane * 4 + i;
    v[i] = kk < k ? bf16_value(x[row * ld + kk]) : 0.0f;
    amax = fmaxf(amax, fabsf(v[i]));
  }
  amax = warp_max(amax);
  const float scale = fp8_scale(amax);
  const float inv = 1.0f / scale;  // exact: a power of two
  DSV4_UNROLL
  for (int i = 0; i < 4; ++i) {
    const std::int64_t kk = kb * kActBlock + lane * 4 + i;
    if (kk < k) codes[row * k + kk] = fp8_encode_scaled(v[i], inv);
  }
  if (lane == 0) scales[row * blocks_per_row + kb] = scale;
}

// ---- shared pieces ------------------------------------------------------------------------------
struct RowTile {
  std::int64_t first = 0;  // first output row of the tile (dense: m0; experts: permuted row)
  int count = 0;           // rows in the tile
  int expert = 0;
  bool valid = false;
};

__device__ __forceinline__ RowTile row_tile(int tile_index, int tile_m, std::int64_t rows, const std::int32_t* rows_dev,
                                            const ExpertTiles& tiles, bool experts) {
  RowTile t;
  if (experts) {
    if (tile_index >= *tiles.num_tiles) return t;
    t.first = tiles.tile_row0[tile_index];
    t.count = tiles.tile_rows[tile_index];
    t.expert = tiles.tile_expert[tile_index];
  } else {
    const std::int64_t limit = row_limit(rows, rows_dev);
    t.first = static_cast<std::int64_t>(tile_index) * tile_m;
    if (t.first >= limit) return t;
    const std::int64_t left = limit - t.first;
    t.count = static_cast<int>(left < tile_m ? left : tile_m);
  }
  t.valid = t.count > 0;
  return t;
}

// Activation row read by tile row m.
__device__ __forceinline__ std::int64_t source_row(const RowTile& t, int m, const ExpertTiles& tiles, bool experts) {
  return experts && tiles.source_row != nullptr ? static_cast<std::int64_t>(tiles.source_row[t.first + m]) : t.first + m;
}

__device__ __forceinline__ void store_out(const GemmOutput& out, std::int64_t row, std::int64_t col, float v) {
  if (out.f32) {
    static_cast<float*>(out.data)[row * out.ld + col] = v;
  } else {
    store_bf16(static_cast<std::uint16_t*>(out.data) + row * out.ld + col, v);
  }
}

// ---- CUDA-core kernel for few rows --------------------------------------------------------------
// Each warp owns kRowsPerWarp weight rows; lane l takes k-chunks l, l + 32, ... of KC values (16
// fp8 codes, 32 fp4 values or 16 bf16 values: 16 or 32 bytes, one weight-scale block), and
// multiplies them with the same chunk of every activation row of the tile.
struct SmallArgs {
  // activations: quantized (codes/scales, ld = k) or bf16 (a_bf16, lda)
  const std::uint8_t* a_codes;
  const float* a_scales;
  const std::uint16_t* a_bf16;
  std::int64_t lda;
  std::int64_t a_group_stride;  // activation columns between groups (grouped wo_a), else 0
  std::int64_t k;
  DeviceWeight w;
  std::int64_t n_per_group;
  GemmOutput out;
  std::int64_t rows;
  const std::int32_t* rows_dev;
  ExpertTiles tiles;
  bool experts;
};

template <WeightFormat F>
struct ChunkOf {
  static constexpr int kValues = F == WeightFormat::kFp4 ? 32 : 16;
};

template <WeightFormat F, bool kQuantA, int kRowsPerWarp>
__global__ void __launch_bounds__(kThreads) small_rows_kernel(SmallArgs args) {
  constexpr int KC = ChunkOf<F>::kValues;
  const RowTile tile = row_tile(blockIdx.y, kSmallRows, args.rows, args.rows_dev, args.tiles, args.experts);
  if (!tile.valid) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const std::int64_t n_total = args.w.n;
  const std::int64_t n0 = (static_cast<std::int64_t>(blockIdx.x) * (kThreads / 32) + warp) * kRowsPerWarp;
  const std::int64_t k = args.k;
  const std::int64_t kb_act = (k + kActBlock - 1) / kActBlock;
  const std::int64_t kb_w = (k + 127) / 128;
  const auto* wbase = static_cast<const std::uint8_t*>(args.w.data) + static_cast<std::int64_t>(tile.expert) * args.w.expert_stride;

  float acc[kRowsPerWarp][kSmallRows];
  DSV4_UNROLL
  for (int r = 0; r < kRowsPerWarp; ++r)
    DSV4_UNROLL
    for (int m = 0; m < kSmallRows; ++m) acc[r][m] = 0.0f;

  std::int64_t arow[kSmallRows];
  DSV4_UNROLL
  for (int m = 0; m < kSmallRows; ++m) arow[m] = m < tile.count ? source_row(tile, m, args.tiles, args.experts) : 0;

  for (std::int64_t k0 = static_cast<std::int64_t>(lane) * KC; k0 < k; k0 += 32 * KC) {
    DSV4_UNROLL
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const std::int64_t n = n0 + r;
      if (n >= n_total) break;
      const std::int64_t group = args.n_per_group > 0 ? n / args.n_per_group : 0;
      float wv[KC];
      float wscale = 1.0f;
      if constexpr (F == WeightFormat::kFp8) {
        const uint4 raw = *reinterpret_cast<const uint4*>(wbase + n * k + k0);
        DSV4_UNROLL
        for (int j = 0; j < 16; ++j) wv[j] = e4m3_value(static_cast<std::uint8_t>(byte_of(raw, j)));
        const auto* s = static_cast<const float*>(args.w.scale) + static_cast<std::int64_t>(tile.expert) * args.w.scale_stride;
        wscale = s[(n / 128) * kb_w + k0 / 128];
      } else if constexpr (F == WeightFormat::kFp4) {
        const uint4 raw = *reinterpret_cast<const uint4*>(wbase + n * (k / 2) + k0 / 2);
        DSV4_UNROLL
        for (int j = 0; j < 16; ++j) {
          const std::uint32_t b = byte_of(raw, j);
          wv[2 * j] = e2m1_value(static_cast<std::uint8_t>(b & 0xf));
          wv[2 * j + 1] = e2m1_value(static_cast<std::uint8_t>(b >> 4));
        }
        const auto* s = static_cast<const std::uint8_t*>(args.w.scale) + static_cast<std::int64_t>(tile.expert) * args.w.scale_stride;
        wscale = ue8m0_value(s[n * (k / 32) + k0 / 32]);
      } else {
        const auto* p = reinterpret_cast<const uint4*>(wbase + (n * k + k0) * 2);
        const uint4 lo = p[0], hi = p[1];
        DSV4_UNROLL
        for (int j = 0; j < 8; ++j) {
          wv[j] = bf16_value(static_cast<std::uint16_t>(byte_of(lo, 2 * j) | (byte_of(lo, 2 * j + 1) << 8)));
          wv[8 + j] = bf16_value(static_cast<std::uint16_t>(byte_of(hi, 2 * j) | (byte_of(hi, 2 * j + 1) << 8)));
        }
      }
      const std::int64_t acol = group * args.a_group_stride + k0;
      DSV4_UNROLL
      for (int m = 0; m < kSmallRows; ++m) {
        if (m >= tile.count) break;
        float part = 0.0f;
        if constexpr (kQuantA) {
          const std::uint8_t* c = args.a_codes + arow[m] * k + acol;
          const float sa = args.a_scales[arow[m] * kb_act + acol / kActBlock];
          DSV4_UNROLL
          for (int j = 0; j < KC; ++j) part += (e4m3_value(c[j]) * sa) * wv[j];
        } else {
          const std::uint16_t* x = args.a_bf16 + arow[m] * args.lda + acol;
          DSV4_UNROLL
          for (int j = 0; j < KC; ++j) part += bf16_value(x[j]) * wv[j];
        }
        acc[r][m] += part * wscale;
      }
    }
  }
  DSV4_UNROLL
  for (int r = 0; r < kRowsPerWarp; ++r) {
    DSV4_UNROLL
    for (int m = 0; m < kSmallRows; ++m) {
      const float v = warp_sum(acc[r][m]);
      const std::int64_t n = n0 + r;
      if (lane == 0 && m < tile.count && n < n_total) store_out(args.out, tile.first + m, n, v);
    }
  }
}

// ---- tensor-core tile kernels ------------------------------------------------------------------
// A CTA computes a 128 x 128 output tile with 8 warps (2 along M x 4 along N, 64 x 32 each);
// k advances in tiles of 128 bytes (128 e4m3 values, or 64 bf16 values) through two shared-memory
// stages. Rows are padded to 144 bytes so the fragment loads of a warp hit 32 different banks.
constexpr int kTileM = 128, kTileN = 128, kRowBytes = 144;
constexpr int kStageBytes = 2 * kTileM * kRowBytes;  // A then B
constexpr int kMmaSmem = 2 * kStageBytes + 2 * kTileN * 4 * 4;  // + fp4 weight scales per stage

struct MmaArgs {
  const std::uint8_t* a_codes;  // quantized activations (mma_fp8)
  const float* a_scales;
  const std::uint16_t* a_bf16;  // bf16 activations (mma_bf16)
  std::int64_t lda;
  std::int64_t a_group_stride;
  std::int64_t k;
  DeviceWeight w;
  std::int64_t n_per_group;     // grouped products (bf16 kernel): weight rows per group
  GemmOutput out;
  std::int64_t rows;
  const std::int32_t* rows_dev;
  ExpertTiles tiles;
  bool experts;
};

// Tensor-core product of e4m3 activations with fp8 (128x128-scaled) or fp4 (1x32-scaled)
// weights. fp8: each 128-wide k tile is one weight-scale block, accumulated apart and added
// with its scales (activation row scale x weight block scale). fp4: the same per 32-wide step.
template <WeightFormat F>
__global__ void __launch_bounds__(kThreads) mma_fp8_kernel(MmaArgs args) {
  DSV4_DYNAMIC_SMEM(std::uint8_t, smem);
  const RowTile tile = row_tile(blockIdx.y, kTileM, args.rows, args.rows_dev, args.tiles, args.experts);
  if (!tile.valid) return;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, tig = lane & 3;
  const int warp_m = warp >> 2, warp_n = warp & 3;
  const std::int64_t k = args.k, n_total = args.w.n;
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.x) * kTileN;
  const std::int64_t kb_act = (k + kActBlock - 1) / kActBlock;
  const std::int64_t kb_w = (k + 127) / 128;
  const int k_tiles = static_cast<int>((k + 127) / 128);
  const auto* wbase = static_cast<const std::uint8_t*>(args.w.data) + static_cast<std::int64_t>(tile.expert) * args.w.expert_stride;
  const std::int64_t w_row_bytes = F == WeightFormat::kFp4 ? k / 2 : k;
  float* fp4_scales = reinterpret_cast<float*>(smem + 2 * kStageBytes);  // [stage][128 n][4 steps]

  auto load_stage = [&](int kt, int stage) {
    std::uint8_t* As = smem + stage * kStageBytes;
    std::uint8_t* Bs = As + kTileM * kRowBytes;
    const std::int64_t k0 = static_cast<std::int64_t>(kt) * 128;
    DSV4_UNROLL
    for (int i = 0; i < 4; ++i) {
      const int c = tid + i * kThreads;
      const int row = c >> 3, col = (c & 7) * 16;
      const bool ok = row < tile.count && k0 + col < k;
      const std::uint8_t* src = ok ? args.a_codes + source_row(tile, row, args.tiles, args.experts) * k + k0 + col : args.a_codes;
      cp_async_16_zfill(As + row * kRowBytes + col, src, ok);
    }
    if constexpr (F == WeightFormat::kFp8) {
      DSV4_UNROLL
      for (int i = 0; i < 4; ++i) {
        const int c = tid + i * kThreads;
        const int row = c >> 3, col = (c & 7) * 16;
        const bool ok = n0 + row < n_total && k0 + col < k;
        const std::uint8_t* src = ok ? wbase + (n0 + row) * w_row_bytes + k0 + col : wbase;
        cp_async_16_zfill(Bs + row * kRowBytes + col, src, ok);
      }
    } else {
      // fp4: 64 packed bytes per row and k tile; each thread rebuilds 2 x 32 values as e4m3.
      const auto* sbase = static_cast<const std::uint8_t*>(args.w.scale) + static_cast<std::int64_t>(tile.expert) * args.w.scale_stride;
      DSV4_UNROLL
      for (int i = 0; i < 2; ++i) {
        const int c = tid + i * kThreads;
        const int row = c >> 2, part = c & 3;
        const bool ok = n0 + row < n_total && k0 + part * 32 < k;
        uint4 raw = make_uint4(0, 0, 0, 0);
        float s = 0.0f;
        if (ok) {
          raw = *reinterpret_cast<const uint4*>(wbase + (n0 + row) * w_row_bytes + k0 / 2 + part * 16);
          s = ue8m0_value(sbase[(n0 + row) * (k / 32) + k0 / 32 + part]);
        }
        const std::uint32_t in[4] = {raw.x, raw.y, raw.z, raw.w};
        std::uint32_t outw[8];
        DSV4_UNROLL
        for (int wd = 0; wd < 4; ++wd) {
          const std::uint32_t v = in[wd];
          std::uint32_t lo = 0, hi = 0;
          DSV4_UNROLL
          for (int b = 0; b < 2; ++b) {
            const std::uint32_t byte = (v >> (8 * b)) & 0xffu;
            lo |= e2m1_to_e4m3_byte(byte & 0xfu) << (16 * b);
            lo |= e2m1_to_e4m3_byte(byte >> 4) << (16 * b + 8);
          }
          DSV4_UNROLL
          for (int b = 0; b < 2; ++b) {
            const std::uint32_t byte = (v >> (8 * (b + 2))) & 0xffu;
            hi |= e2m1_to_e4m3_byte(byte & 0xfu) << (16 * b);
            hi |= e2m1_to_e4m3_byte(byte >> 4) << (16 * b + 8);
          }
          outw[2 * wd] = lo;
          outw[2 * wd + 1] = hi;
        }
        uint4* dst = reinterpret_cast<uint4*>(Bs + row * kRowBytes + part * 32);
        dst[0] = make_uint4(outw[0], outw[1], outw[2], outw[3]);
        dst[1] = make_uint4(outw[4], outw[5], outw[6], outw[7]);
        fp4_scales[(stage * kTileN + row) * 4 + part] = s;
      }
    }
  };

  float acc[4][4][4];
  DSV4_UNROLL
  for (int mi = 0; mi < 4; ++mi)
    DSV4_UNROLL
    for (int ni = 0; ni < 4; ++ni)
      DSV4_UNROLL
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

  // Activation scale rows of this thread: 64 * warp_m + 16 * mi + g (+ 8).
  auto row_in_tile = [&](int mi, int half) { return warp_m * 64 + mi * 16 + g + half * 8; };

  load_stage(0, 0);
  cp_async_commit();
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int stage = kt & 1;
    if (kt + 1 < k_tiles) {
      load_stage(kt + 1, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const std::uint8_t* As = smem + stage * kStageBytes;
    const std::uint8_t* Bs = As + kTileM * kRowBytes;
    float sa[4][2];
    DSV4_UNROLL
    for (int mi = 0; mi < 4; ++mi) {
      DSV4_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int r = row_in_tile(mi, h);
        sa[mi][h] = r < tile.count ? args.a_scales[source_row(tile, r, args.tiles, args.experts) * kb_act + kt] : 0.0f;
      }
    }
    float block_scale = 1.0f;
    if constexpr (F == WeightFormat::kFp8) {
      const auto* s = static_cast<const float*>(args.w.scale) + static_cast<std::int64_t>(tile.expert) * args.w.scale_stride;
      block_scale = s[(n0 / 128) * kb_w + kt];
    }
    float tmp[4][4][4];
    DSV4_UNROLL
    for (int kk = 0; kk < 4; ++kk) {
      if (F == WeightFormat::kFp4 || kk == 0) {
        DSV4_UNROLL
        for (int mi = 0; mi < 4; ++mi)
          DSV4_UNROLL
          for (int ni = 0; ni < 4; ++ni)
            DSV4_UNROLL
            for (int e = 0; e < 4; ++e) tmp[mi][ni][e] = 0.0f;
      }
      std::uint32_t a[4][4], b[4][2];
      DSV4_UNROLL
      for (int mi = 0; mi < 4; ++mi) {
        const std::uint8_t* p = As + (warp_m * 64 + mi * 16 + g) * kRowBytes + kk * 32 + tig * 4;
        a[mi][0] = *reinterpret_cast<const std::uint32_t*>(p);
        a[mi][1] = *reinterpret_cast<const std::uint32_t*>(p + 8 * kRowBytes);
        a[mi][2] = *reinterpret_cast<const std::uint32_t*>(p + 16);
        a[mi][3] = *reinterpret_cast<const std::uint32_t*>(p + 8 * kRowBytes + 16);
      }
      DSV4_UNROLL
      for (int ni = 0; ni < 4; ++ni) {
        const std::uint8_t* p = Bs + (warp_n * 32 + ni * 8 + g) * kRowBytes + kk * 32 + tig * 4;
        b[ni][0] = *reinterpret_cast<const std::uint32_t*>(p);
        b[ni][1] = *reinterpret_cast<const std::uint32_t*>(p + 16);
      }
      DSV4_UNROLL
      for (int mi = 0; mi < 4; ++mi)
        DSV4_UNROLL
        for (int ni = 0; ni < 4; ++ni) mma_m16n8k32_e4m3(tmp[mi][ni], a[mi], b[ni], tmp[mi][ni]);
      if constexpr (F == WeightFormat::kFp4) {
        const float* ws = fp4_scales + stage * kTileN * 4;
        DSV4_UNROLL
        for (int ni = 0; ni < 4; ++ni) {
          const int col = warp_n * 32 + ni * 8 + tig * 2;
          const float w0 = ws[col * 4 + kk], w1 = ws[(col + 1) * 4 + kk];
          DSV4_UNROLL
          for (int mi = 0; mi < 4; ++mi) {
            acc[mi][ni][0] += tmp[mi][ni][0] * (sa[mi][0] * w0);
            acc[mi][ni][1] += tmp[mi][ni][1] * (sa[mi][0] * w1);
            acc[mi][ni][2] += tmp[mi][ni][2] * (sa[mi][1] * w0);
            acc[mi][ni][3] += tmp[mi][ni][3] * (sa[mi][1] * w1);
          }
        }
      }
    }
    if constexpr (F == WeightFormat::kFp8) {
      DSV4_UNROLL
      for (int mi = 0; mi < 4; ++mi)
        DSV4_UNROLL
        for (int ni = 0; ni < 4; ++ni) {
          acc[mi][ni][0] += tmp[mi][ni][0] * (sa[mi][0] * block_scale);
          acc[mi][ni][1] += tmp[mi][ni][1] * (sa[mi][0] * block_scale);
          acc[mi][ni][2] += tmp[mi][ni][2] * (sa[mi][1] * block_scale);
          acc[mi][ni][3] += tmp[mi][ni][3] * (sa[mi][1] * block_scale);
        }
    }
    __syncthreads();  // the stage is reloaded two tiles later
  }

  DSV4_UNROLL
  for (int mi = 0; mi < 4; ++mi) {
    DSV4_UNROLL
    for (int ni = 0; ni < 4; ++ni) {
      DSV4_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int r = row_in_tile(mi, e >> 1);
        const std::int64_t col = n0 + warp_n * 32 + ni * 8 + tig * 2 + (e & 1);
        if (r < tile.count && col < n_total) store_out(args.out, tile.first + r, col, acc[mi][ni][e]);
      }
    }
  }
}

// Tensor-core product of bf16 activations with bf16 weights, or fp8 weights used as their
// exact bf16 values (the grouped wo_a einsum). k advances 64 values per tile; grouped products
// take the group from blockIdx.z.
template <WeightFormat F>
__global__ void __launch_bounds__(kThreads) mma_bf16_kernel(MmaArgs args) {
  DSV4_DYNAMIC_SMEM(std::uint8_t, smem);
  const RowTile tile = row_tile(blockIdx.y, kTileM, args.rows, args.rows_dev, args.tiles, args.experts);
  if (!tile.valid) return;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, tig = lane & 3;
  const int warp_m = warp >> 2, warp_n = warp & 3;
  const std::int64_t k = args.k;
  const std::int64_t group = blockIdx.z;
  const std::int64_t n_group = args.n_per_group > 0 ? args.n_per_group : args.w.n;
  const std::int64_t n0 = group * n_group + static_cast<std::int64_t>(blockIdx.x) * kTileN;  // weight row
  const std::int64_t n_end = (group + 1) * n_group;
  if (n0 >= n_end) return;
  const std::int64_t a_col0 = group * args.a_group_stride;
  const std::int64_t kb_w = (k + 127) / 128;
  const int k_tiles = static_cast<int>((k + 63) / 64);
  const auto* wbase = static_cast<const std::uint8_t*>(args.w.data);

  auto load_stage = [&](int kt, int stage) {
    std::uint8_t* As = smem + stage * kStageBytes;
    std::uint8_t* Bs = As + kTileM * kRowBytes;
    const std::int64_t k0 = static_cast<std::int64_t>(kt) * 64;
    DSV4_UNROLL
    for (int i = 0; i < 4; ++i) {
      const int c = tid + i * kThreads;
      const int row = c >> 3, col = (c & 7) * 8;  // in bf16 values
      const bool ok = row < tile.count && k0 + col < k;
      const std::uint16_t* src =
          ok ? args.a_bf16 + source_row(tile, row, args.tiles, args.experts) * args.lda + a_col0 + k0 + col : args.a_bf16;
      cp_async_16_zfill(As + row * kRowBytes + col * 2, src, ok);
    }
    if constexpr (F == WeightFormat::kBf16) {
      DSV4_UNROLL
      for (int i = 0; i < 4; ++i) {
        const int c = tid + i * kThreads;
        const int row = c >> 3, col = (c & 7) * 8;
        const bool ok = n0 + row < n_end && k0 + col < k;
        const std::uint8_t* src = ok ? wbase + ((n0 + row) * k + k0 + col) * 2 : wbase;
        cp_async_16_zfill(Bs + row * kRowBytes + col * 2, src, ok);
      }
    } else {
      // fp8 -> bf16: 16 codes per thread and pass, times the 128x128 block scale (exact).
      const auto* s = static_cast<const float*>(args.w.scale);
      DSV4_UNROLL
      for (int i = 0; i < 2; ++i) {
        const int c = tid + i * kThreads;
        const int row = c >> 2, part = c & 3;
        const bool ok = n0 + row < n_end && k0 + part * 16 < k;
        std::uint32_t outw[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (ok) {
          const uint4 raw = *reinterpret_cast<const uint4*>(wbase + (n0 + row) * k + k0 + part * 16);
          const float scale = s[((n0 + row) / 128) * kb_w + (k0 + part * 16) / 128];
          DSV4_UNROLL
          for (int j = 0; j < 8; ++j) {
            const std::uint32_t lo = bf16_bits(e4m3_value(static_cast<std::uint8_t>(byte_of(raw, 2 * j))) * scale);
            const std::uint32_t hi = bf16_bits(e4m3_value(static_cast<std::uint8_t>(byte_of(raw, 2 * j + 1))) * scale);
            outw[j] = lo | (hi << 16);
          }
        }
        uint4* dst = reinterpret_cast<uint4*>(Bs + row * kRowBytes + part * 32);
        dst[0] = make_uint4(outw[0], outw[1], outw[2], outw[3]);
        dst[1] = make_uint4(outw[4], outw[5], outw[6], outw[7]);
      }
    }
  };

  float acc[4][4][4];
  DSV4_UNROLL
  for (int mi = 0; mi < 4; ++mi)
    DSV4_UNROLL
    for (int ni = 0; ni < 4; ++ni)
      DSV4_UNROLL
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

  load_stage(0, 0);
  cp_async_commit();
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int stage = kt & 1;
    if (kt + 1 < k_tiles) {
      load_stage(kt + 1, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const std::uint8_t* As = smem + stage * kStageBytes;
    const std::uint8_t* Bs = As + kTileM * kRowBytes;
    DSV4_UNROLL
    for (int kk = 0; kk < 4; ++kk) {
      std::uint32_t a[4][4], b[4][2];
      DSV4_UNROLL
      for (int mi = 0; mi < 4; ++mi) {
        const std::uint8_t* p = As + (warp_m * 64 + mi * 16 + g) * kRowBytes + (kk * 16 + tig * 2) * 2;
        a[mi][0] = *reinterpret_cast<const std::uint32_t*>(p);
        a[mi][1] = *reinterpret_cast<const std::uint32_t*>(p + 8 * kRowBytes);
        a[mi][2] = *reinterpret_cast<const std::uint32_t*>(p + 16);
        a[mi][3] = *reinterpret_cast<const std::uint32_t*>(p + 8 * kRowBytes + 16);
      }
      DSV4_UNROLL
      for (int ni = 0; ni < 4; ++ni) {
        const std::uint8_t* p = Bs + (warp_n * 32 + ni * 8 + g) * kRowBytes + (kk * 16 + tig * 2) * 2;
        b[ni][0] = *reinterpret_cast<const std::uint32_t*>(p);
        b[ni][1] = *reinterpret_cast<const std::uint32_t*>(p + 16);
      }
      DSV4_UNROLL
      for (int mi = 0; mi < 4; ++mi)
        DSV4_UNROLL
        for (int ni = 0; ni < 4; ++ni) mma_m16n8k16_bf16(acc[mi][ni], a[mi], b[ni], acc[mi][ni]);
    }
    __syncthreads();
  }

  DSV4_UNROLL
  for (int mi = 0; mi < 4; ++mi) {
    DSV4_UNROLL
    for (int ni = 0; ni < 4; ++ni) {
      DSV4_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int r = warp_m * 64 + mi * 16 + g + (e >> 1) * 8;
        const std::int64_t col = n0 + warp_n * 32 + ni * 8 + tig * 2 + (e & 1);
        if (r < tile.count && col < n_end) store_out(args.out, tile.first + r, col, acc[mi][ni][e]);
      }
    }
  }
}

// ---- dispatch -----------------------------------------------------------------------------------
void check_k(std::int64_t k, const char* who) {
  if (k <= 0 || k % 32 != 0) launch_error(who, {k});
}

template <WeightFormat F, bool kQuantA>
void launch_small(const SmallArgs& args, std::int64_t row_tiles, gpu_stream_t stream) {
  // Enough blocks to cover the machine: 4 weight rows a warp for wide outputs, fewer for narrow.
  const std::int64_t n = args.w.n;
  const dim3 block(kThreads);
  if (n >= 32 * 4 * 132) {
    launch(small_rows_kernel<F, kQuantA, 4>, dim3(static_cast<unsigned>((n + 31) / 32), static_cast<unsigned>(row_tiles)),
           block, 0, stream, args);
  } else if (n >= 16 * 2 * 132) {
    launch(small_rows_kernel<F, kQuantA, 2>, dim3(static_cast<unsigned>((n + 15) / 16), static_cast<unsigned>(row_tiles)),
           block, 0, stream, args);
  } else {
    launch(small_rows_kernel<F, kQuantA, 1>, dim3(static_cast<unsigned>((n + 7) / 8), static_cast<unsigned>(row_tiles)),
           block, 0, stream, args);
  }
}

template <WeightFormat F>
void launch_mma_fp8(const MmaArgs& args, std::int64_t row_tiles, gpu_stream_t stream) {
  static const bool smem_set = (set_max_dynamic_smem(mma_fp8_kernel<F>, kMmaSmem), true);
  (void)smem_set;
  launch(mma_fp8_kernel<F>, dim3(static_cast<unsigned>((args.w.n + kTileN - 1) / kTileN), static_cast<unsigned>(row_tiles)),
         dim3(kThreads), kMmaSmem, stream, args);
}

template <WeightFormat F>
void launch_mma_bf16(const MmaArgs& args, std::int64_t row_tiles, int groups, gpu_stream_t stream) {
  static const bool smem_set = (set_max_dynamic_smem(mma_bf16_kernel<F>, kMmaSmem), true);
  (void)smem_set;
  const std::int64_t n_group = args.n_per_group > 0 ? args.n_per_group : args.w.n;
  launch(mma_bf16_kernel<F>,
         dim3(static_cast<unsigned>((n_group + kTileN - 1) / kTileN), static_cast<unsigned>(row_tiles),
              static_cast<unsigned>(groups)),
         dim3(kThreads), kMmaSmem, stream, args);
}

bool use_small(std::int64_t rows, GemmPath path) {
  if (path == GemmPath::kCudaCores) return true;
  if (path == GemmPath::kTensorCores) return false;
  return rows <= 16;
}

}  // namespace

int expert_tile_rows(std::int64_t total_rows, std::int64_t experts) {
  return experts > 0 && total_rows <= 16 * experts ? kSmallRows : kTileRows;
}

void quantize_activations(const std::uint16_t* x, std::int64_t ld, std::int64_t rows, std::int64_t k,
                          std::uint8_t* codes, float* scales, const std::int32_t* rows_dev, gpu_stream_t stream) {
  if (rows <= 0) return;
  const std::int64_t warps = rows * ((k + kActBlock - 1) / kActBlock);
  launch(quantize_rows_kernel, dim3(static_cast<unsigned>((warps * 32 + kThreads - 1) / kThreads)), dim3(kThreads), 0,
         stream, x, ld, rows, k, codes, scales, rows_dev);
}

void gemm_quantized(const QuantizedRows& a, std::int64_t rows, const DeviceWeight& w, const GemmOutput& out,
                    const std::int32_t* rows_dev, gpu_stream_t stream, GemmPath path) {
  check_k(w.k, "gemm_quantized: the reduction length {} must be a positive multiple of 32");
  if (rows <= 0) return;
  if (a.k != w.k) launch_error("gemm_quantized: activations of {} columns for a weight of {}", {a.k, w.k});
  if (w.format == WeightFormat::kBf16) launch_error("gemm_quantized: bf16 weights take gemm_bf16");
  if (use_small(rows, path)) {
    SmallArgs s{a.codes, a.scales, nullptr, 0, 0, w.k, w, 0, out, rows, rows_dev, {}, false};
    const std::int64_t tiles = (rows + kSmallRows - 1) / kSmallRows;
    if (w.format == WeightFormat::kFp8) launch_small<WeightFormat::kFp8, true>(s, tiles, stream);
    else launch_small<WeightFormat::kFp4, true>(s, tiles, stream);
    return;
  }
  MmaArgs m{a.codes, a.scales, nullptr, 0, 0, w.k, w, 0, out, rows, rows_dev, {}, false};
  const std::int64_t tiles = (rows + kTileM - 1) / kTileM;
  if (w.format == WeightFormat::kFp8) launch_mma_fp8<WeightFormat::kFp8>(m, tiles, stream);
  else launch_mma_fp8<WeightFormat::kFp4>(m, tiles, stream);
}

void gemm_quantized_experts(const QuantizedRows& a, const ExpertTiles& tiles, const DeviceWeight& w,
                            const GemmOutput& out, gpu_stream_t stream) {
  check_k(w.k, "gemm_quantized_experts: the reduction length {} must be a positive multiple of 32");
  if (w.format == WeightFormat::kBf16) launch_error("gemm_quantized_experts: bf16 expert weights are not supported");
  if (tiles.max_tiles <= 0) return;
  if (tiles.tile_m == kSmallRows) {
    SmallArgs s{a.codes, a.scales, nullptr, 0, 0, w.k, w, 0, out, 0, nullptr, tiles, true};
    if (w.format == WeightFormat::kFp8) launch_small<WeightFormat::kFp8, true>(s, tiles.max_tiles, stream);
    else launch_small<WeightFormat::kFp4, true>(s, tiles.max_tiles, stream);
    return;
  }
  if (tiles.tile_m != kTileRows) launch_error("gemm_quantized_experts: tiles of {} rows", {tiles.tile_m});
  MmaArgs m{a.codes, a.scales, nullptr, 0, 0, w.k, w, 0, out, 0, nullptr, tiles, true};
  if (w.format == WeightFormat::kFp8) launch_mma_fp8<WeightFormat::kFp8>(m, tiles.max_tiles, stream);
  else launch_mma_fp8<WeightFormat::kFp4>(m, tiles.max_tiles, stream);
}

void gemm_bf16(const std::uint16_t* a, std::int64_t lda, std::int64_t rows, const DeviceWeight& w, int groups,
               const GemmOutput& out, const std::int32_t* rows_dev, gpu_stream_t stream, GemmPath path) {
  check_k(w.k, "gemm_bf16: the reduction length {} must be a positive multiple of 32");
  if (rows <= 0) return;
  if (groups < 1 || w.n % groups != 0) launch_error("gemm_bf16: {} weight rows do not split into {} groups", {w.n, groups});
  if (w.format == WeightFormat::kFp4) launch_error("gemm_bf16: fp4 weights take gemm_quantized");
  const std::int64_t n_group = w.n / groups;
  const std::int64_t a_stride = groups > 1 ? w.k : 0;
  if (use_small(rows, path)) {
    SmallArgs s{nullptr, nullptr, a, lda, a_stride, w.k, w, groups > 1 ? n_group : 0, out, rows, rows_dev, {}, false};
    const std::int64_t tiles = (rows + kSmallRows - 1) / kSmallRows;
    if (w.format == WeightFormat::kFp8) launch_small<WeightFormat::kFp8, false>(s, tiles, stream);
    else launch_small<WeightFormat::kBf16, false>(s, tiles, stream);
    return;
  }
  MmaArgs m{nullptr, nullptr, a, lda, a_stride, w.k, w, groups > 1 ? n_group : 0, out, rows, rows_dev, {}, false};
  const std::int64_t tiles = (rows + kTileM - 1) / kTileM;
  if (w.format == WeightFormat::kFp8) launch_mma_bf16<WeightFormat::kFp8>(m, tiles, groups, stream);
  else launch_mma_bf16<WeightFormat::kBf16>(m, tiles, groups, stream);
}

}  // namespace dsv4::gpu
