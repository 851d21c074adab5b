// Matrix-product kernels (gemm.h): activation quantization, a tensor-core kernel for few rows
// (the weight on the mma's A side, straight from global memory), and tensor-core tile kernels
// (mma.sync e4m3 for fp8/fp4 weights, mma.sync bf16 for bf16 activations). CPU twin: cpu/linear.cc.
#include "cuda/kernels/gemm.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/device.h"
#include "cuda/kernels/dependent_launch.cuh"
#include "cuda/kernels/gemm_experts_fp8.h"
#include "cuda/kernels/gemm_experts_wgmma.h"
#include "cuda/kernels/gemm_library.h"
#include "cuda/kernels/gemm_output.cuh"
#include "cuda/kernels/gemm_stream.h"
#include "cuda/kernels/launch_check.h"
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
// One warp per (row, 128-block); lane i holds the block's values 4i .. 4i+3. Launched dependent
// (dependent_launch.cuh): it waits for the kernel before it first.
__global__ void quantize_rows_kernel(const std::uint16_t* x, std::int64_t ld, std::int64_t rows, std::int64_t k,
                                     std::uint8_t* codes, float* scales, const std::int32_t* rows_dev) {
  grid_dependency_wait();
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

// Scales [rows][kb] -> [kb][rows], for the layouts cuBLASLt reads (gemm_library.h Layouts).
__global__ void transpose_scales_kernel(const float* scales, std::int64_t rows, std::int64_t kb, float* out) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * kb) return;
  const std::int64_t b = i / rows, r = i % rows;  // consecutive threads write consecutive rows
  out[i] = scales[r * kb + b];
}

// ---- the GPU layout of fp4 weights (gemm.h) -----------------------------------------------------
// A full 128-wide k unit of a row is 64 packed bytes, 16 words: in checkpoint order word 4s + t
// holds k 32s + 8t .. 32s + 8t + 7 (scale block s). The GPU keeps word 4s + t at 4t + s (a 4 x 4
// transpose), so the few-rows kernel's lane t reads the words of all four blocks it needs with one
// 16-byte load. Inside every word (tails too) value j goes to the low nibble of byte j and value
// j + 4 to its high nibble (checkpoint: values 2j and 2j + 1 in byte j), so a word's values 0..3
// and 4..7 become e4m3 words with a few bit operations (numerics.cuh e2m1_low_nibbles_as_e4m3).
// One thread per 128-wide unit of a row (a tail shorter than 128 is one unit, not transposed).
__host__ __device__ constexpr std::uint32_t fp4_word_to_gpu(std::uint32_t w) {
  std::uint32_t out = 0;
  for (int j = 0; j < 4; ++j) out |= (((w >> (4 * j)) & 0xfu) << (8 * j)) | (((w >> (4 * j + 16)) & 0xfu) << (8 * j + 4));
  return out;
}
__host__ __device__ constexpr std::uint32_t fp4_word_from_gpu(std::uint32_t w) {
  std::uint32_t out = 0;
  for (int j = 0; j < 4; ++j) out |= (((w >> (8 * j)) & 0xfu) << (4 * j)) | (((w >> (8 * j + 4)) & 0xfu) << (4 * j + 16));
  return out;
}
static_assert(fp4_word_to_gpu(0x76543210u) == 0x73625140u && fp4_word_from_gpu(0x73625140u) == 0x76543210u);

__global__ void fp4_layout_kernel(std::uint8_t* data, std::int64_t rows, std::int64_t k, bool to_gpu) {
  const std::int64_t units = (k + 127) / 128;
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * units) return;
  const std::int64_t unit = i % units;
  auto* p = reinterpret_cast<std::uint32_t*>(data + (i / units) * (k / 2) + unit * 64);
  const std::int64_t left = k - unit * 128;
  const int words = static_cast<int>((left < 128 ? left : 128) / 8);
  if (words < 16) {
    for (int w = 0; w < words; ++w) p[w] = to_gpu ? fp4_word_to_gpu(p[w]) : fp4_word_from_gpu(p[w]);
    return;
  }
  std::uint32_t in[16], out[16];
  DSV4_UNROLL
  for (int w = 0; w < 16; ++w) in[w] = p[w];
  DSV4_UNROLL
  for (int s = 0; s < 4; ++s)
    DSV4_UNROLL
    for (int t = 0; t < 4; ++t) {
      if (to_gpu) out[4 * t + s] = fp4_word_to_gpu(in[4 * s + t]);
      else out[4 * s + t] = fp4_word_from_gpu(in[4 * t + s]);
    }
  DSV4_UNROLL
  for (int w = 0; w < 16; ++w) p[w] = out[w];
}

// The tiled order (gemm.h fp4_tiled) of one 16-row group, in place: a CTA reads the group's rows
// and scale rows into shared memory, then writes unit u of row r to 1024 u + 64 r (scales: 64 u +
// 4 r); `to_tiled` false reads the tiled order and writes rows.
__global__ void fp4_tile_kernel(std::uint8_t* data, std::uint8_t* scales, std::int64_t k, bool to_tiled) {
  DSV4_DYNAMIC_SMEM(std::uint8_t, smem);
  const std::int64_t units = k / 128, row_bytes = k / 2, scale_bytes = k / 32;
  std::uint8_t* w = data + static_cast<std::int64_t>(blockIdx.x) * 16 * row_bytes;
  std::uint8_t* sc = scales + static_cast<std::int64_t>(blockIdx.x) * 16 * scale_bytes;
  std::uint8_t* ws = smem;
  std::uint8_t* ss = smem + 16 * row_bytes;
  // 16-byte pieces: row r, unit u, piece p (4 a unit) <-> row-major r * row_bytes + 64 u + 16 p,
  // tiled 1024 u + 64 r + 16 p; scale words: r * scale_bytes + 4 u <-> 64 u + 4 r.
  const auto row_major = [&](std::int64_t i) { return (i / (4 * units)) * row_bytes + (i % (4 * units)) * 16; };
  const auto tiled = [&](std::int64_t i) { return ((i % (4 * units)) / 4) * 1024 + (i / (4 * units)) * 64 + (i % 4) * 16; };
  for (std::int64_t i = threadIdx.x; i < 16 * 4 * units; i += blockDim.x)
    *reinterpret_cast<uint4*>(ws + row_major(i)) = *reinterpret_cast<const uint4*>(w + (to_tiled ? row_major(i) : tiled(i)));
  for (std::int64_t i = threadIdx.x; i < 16 * units; i += blockDim.x) {
    const std::int64_t r = i / units, u = i % units;
    *reinterpret_cast<std::uint32_t*>(ss + r * scale_bytes + 4 * u) =
        *reinterpret_cast<const std::uint32_t*>(sc + (to_tiled ? r * scale_bytes + 4 * u : 64 * u + 4 * r));
  }
  __syncthreads();
  for (std::int64_t i = threadIdx.x; i < 16 * 4 * units; i += blockDim.x)
    *reinterpret_cast<uint4*>(w + (to_tiled ? tiled(i) : row_major(i))) = *reinterpret_cast<const uint4*>(ws + row_major(i));
  for (std::int64_t i = threadIdx.x; i < 16 * units; i += blockDim.x) {
    const std::int64_t r = i / units, u = i % units;
    *reinterpret_cast<std::uint32_t*>(sc + (to_tiled ? 64 * u + 4 * r : r * scale_bytes + 4 * u)) =
        *reinterpret_cast<const std::uint32_t*>(ss + r * scale_bytes + 4 * u);
  }
}

// Sets *found to 1 when a byte of the `bytes` at s is 0 or 255 (16 bytes a thread a step).
__global__ void find_special_scales_kernel(const std::uint8_t* s, std::int64_t bytes, std::int32_t* found) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i * 16 < bytes; i += stride) {
    bool special = false;
    for (std::int64_t j = i * 16; j < i * 16 + 16 && j < bytes; ++j) special = special || s[j] == 0 || s[j] == 0xff;
    if (special) atomicOr(found, 1);
  }
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

// ---- tensor-core kernel for few rows --------------------------------------------------------------
// A decode step multiplies a handful of activation rows with a whole weight matrix: the product is
// bound by reading the weight once. This kernel puts the weight on the 16-row A side of the mma
// and up to 8 activation rows on its 8-column B side (out^T = W . X^T), so no tensor-core work
// goes to padding and the weight goes from global memory straight into registers: each lane
// loads contiguous bytes of weight rows g and g + 8 (g = lane / 4) and the k order inside one mma
// step is permuted the same way on both sides (a dot product's terms may come in any order; only
// the fp32 rounding of the sums moves, which the tests bound).
// A block has 8 warps: warps_n along the output (16 weight rows each) times 8 / warps_n along k,
// whose partial sums are added in warp order through shared memory (deterministic). Each warp
// walks its k range in units (the k extent one activation scale and one weight scale cover),
// loading kDepth units ahead. Each weight format is a policy U (FewFp8, FewFp4, FewBf16): its lane
// (pointers), its registers of one unit, load and accumulate, and kOutScale. On Hopper the e4m3
// mma.sync runs as f16 HMMAs after converting both operands (two values an instruction), so what
// bounds these products is integer and conversion work per weight byte, not the tensor cores or
// HBM (docs/perf.md): the policies keep that work small.
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
  // few_rows_kernel with gridDim.z > 1 (gemm_bf16_k_partials): CTA z takes the z-th of gridDim.z
  // k ranges and writes its fp32 partial at out + z * split_stride elements
  std::int64_t split_stride = 0;
};

constexpr int kFewWarps = kThreads / 32;

// What one lane reads: weight rows g and g + 8 of its warp (null past the last row), the
// activation row of token g (null past the tile's rows; at the group's columns), the activation
// scale rows of tokens 2t and 2t + 1 (the accumulator's columns), and the weight scales.
struct FewLane {
  const std::uint8_t* w_lo = nullptr;
  const std::uint8_t* w_hi = nullptr;
  const void* x = nullptr;
  const float* sa0 = nullptr;
  const float* sa1 = nullptr;
  const float* ws = nullptr;  // fp8: the 128-row block's scale row [ceil(k / 128)]
  std::int64_t k = 0;
  int t = 0;
};

template <class T>
__device__ __forceinline__ T load_or_zero(const void* base, std::int64_t byte_offset, bool ok) {
  return ok && base != nullptr ? *reinterpret_cast<const T*>(static_cast<const std::uint8_t*>(base) + byte_offset) : T{};
}

// The lane of the bf16-activation products (FewBf16); loads check its pointers.
template <WeightFormat F>
__device__ __forceinline__ FewLane few_lane(const SmallArgs& args, const RowTile& tile, std::int64_t n0, int g, int t) {
  const std::int64_t n_total = args.w.n, k = args.k;
  FewLane l;
  l.k = k;
  l.t = t;
  const auto* wbase = static_cast<const std::uint8_t*>(args.w.data) + static_cast<std::int64_t>(tile.expert) * args.w.expert_stride;
  const std::int64_t row_bytes = F == WeightFormat::kFp8 ? k : 2 * k;
  if (n0 + g < n_total) l.w_lo = wbase + (n0 + g) * row_bytes;
  if (n0 + g + 8 < n_total) l.w_hi = wbase + (n0 + g + 8) * row_bytes;
  const std::int64_t kb_act = (k + kActBlock - 1) / kActBlock;
  if (g < tile.count) {
    const std::int64_t row = source_row(tile, g, args.tiles, args.experts);
    if (args.a_codes != nullptr) {
      l.x = args.a_codes + row * k;
    } else {
      const std::int64_t group = args.n_per_group > 0 ? n0 / args.n_per_group : 0;
      l.x = args.a_bf16 + row * args.lda + group * args.a_group_stride;
    }
  }
  if (args.a_scales != nullptr) {
    if (2 * t < tile.count) l.sa0 = args.a_scales + source_row(tile, 2 * t, args.tiles, args.experts) * kb_act;
    if (2 * t + 1 < tile.count) l.sa1 = args.a_scales + source_row(tile, 2 * t + 1, args.tiles, args.experts) * kb_act;
  }
  if constexpr (F == WeightFormat::kFp8) {
    l.ws = static_cast<const float*>(args.w.scale) + static_cast<std::int64_t>(tile.expert) * args.w.scale_stride +
           (n0 / 128) * ((k + 127) / 128);
  }
  return l;
}

// The lane of the quantized products (fp8 / fp4 weights, e4m3 activations): weight rows g and
// g + 8 of the warp, token g's codes, the scale rows of tokens 2t and 2t + 1 (the accumulator's
// columns). No pointer is null, so loads need no checks: rows past the weight's end read its last
// row and tokens past the tile's count its last token, and neither result is stored (an mma output
// element depends only on its own A row and B column).
struct QuantLane {
  const std::uint8_t* w_lo;
  const std::uint8_t* w_hi;
  const std::uint8_t* x;
  const float* sa0;
  const float* sa1;
  std::int64_t k;
  int t;
};
struct QuantRows {
  std::int64_t lo, hi;  // the weight rows the lane reads
};
__device__ __forceinline__ QuantRows quant_lane(const SmallArgs& args, const RowTile& tile, std::int64_t n0, int g, int t,
                                                std::int64_t row_bytes, QuantLane& l) {
  const std::int64_t k = args.k, n_last = args.w.n - 1;
  const QuantRows rows{n0 + g < n_last ? n0 + g : n_last, n0 + g + 8 < n_last ? n0 + g + 8 : n_last};
  const auto* w = static_cast<const std::uint8_t*>(args.w.data) + static_cast<std::int64_t>(tile.expert) * args.w.expert_stride;
  const std::int64_t kb_act = (k + kActBlock - 1) / kActBlock;
  const int m_last = tile.count - 1;
  l.w_lo = w + rows.lo * row_bytes;
  l.w_hi = w + rows.hi * row_bytes;
  l.x = args.a_codes + source_row(tile, g < m_last ? g : m_last, args.tiles, args.experts) * k;
  l.sa0 = args.a_scales + source_row(tile, 2 * t < m_last ? 2 * t : m_last, args.tiles, args.experts) * kb_act;
  l.sa1 = args.a_scales + source_row(tile, 2 * t + 1 < m_last ? 2 * t + 1 : m_last, args.tiles, args.experts) * kb_act;
  l.k = k;
  l.t = t;
  return rows;
}

// fp8 weights x e4m3 activations. A unit is one 128-wide weight-scale block: two chunks of 64 k,
// lane t holding k 16t .. 16t + 15 of each (two mma steps). kWholeUnits: k is a multiple of 128
// (every V4 dense weight), so no chunk needs a bound check.
template <bool kWholeUnits>
struct FewFp8 {
  static constexpr int kK = 128, kDepth = 2;
  static constexpr float kOutScale = 1.0f;
  struct Lane : QuantLane {
    const float* ws;  // the 128-row block's scale row [ceil(k / 128)]
  };
  static __device__ __forceinline__ Lane lane(const SmallArgs& args, const RowTile& tile, std::int64_t n0, int g, int t) {
    Lane l;
    quant_lane(args, tile, n0, g, t, args.k, l);
    l.ws = static_cast<const float*>(args.w.scale) + static_cast<std::int64_t>(tile.expert) * args.w.scale_stride +
           (n0 / 128) * ((args.k + 127) / 128);
    // the lane's own bytes of every unit, so a unit's address is one multiply-add
    l.w_lo += 16 * t;
    l.w_hi += 16 * t;
    l.x += 16 * t;
    return l;
  }
  struct Regs {
    uint4 w_lo[2], w_hi[2], x[2];
    float sa0, sa1, ws;
  };
  static __device__ __forceinline__ void load(const Lane& l, int unit, Regs& r) {
    const std::uint8_t *w_lo = l.w_lo + unit * kK, *w_hi = l.w_hi + unit * kK, *x = l.x + unit * kK;
    DSV4_UNROLL
    for (int h = 0; h < 2; ++h) {
      const bool ok = kWholeUnits || unit * kK + 64 * h + 16 * l.t < l.k;
      r.w_lo[h] = ok ? *reinterpret_cast<const uint4*>(w_lo + 64 * h) : make_uint4(0, 0, 0, 0);
      r.w_hi[h] = ok ? *reinterpret_cast<const uint4*>(w_hi + 64 * h) : make_uint4(0, 0, 0, 0);
      r.x[h] = ok ? *reinterpret_cast<const uint4*>(x + 64 * h) : make_uint4(0, 0, 0, 0);
    }
    r.sa0 = l.sa0[unit];
    r.sa1 = l.sa1[unit];
    r.ws = l.ws[unit];
  }
  static __device__ __forceinline__ void accumulate(const Regs& r, float (&acc)[4]) {
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    DSV4_UNROLL
    for (int h = 0; h < 2; ++h) {
      DSV4_UNROLL
      for (int s = 0; s < 2; ++s) {
        // mma k 4t..4t+3 <- bytes 8s..8s+3 of the lane's 16, k 16+4t.. <- bytes 8s+4..8s+7.
        const std::uint32_t a[4] = {word_of(r.w_lo[h], 2 * s), word_of(r.w_hi[h], 2 * s), word_of(r.w_lo[h], 2 * s + 1),
                                    word_of(r.w_hi[h], 2 * s + 1)};
        const std::uint32_t b[2] = {word_of(r.x[h], 2 * s), word_of(r.x[h], 2 * s + 1)};
        mma_m16n8k32_e4m3(part, a, b, part);
      }
    }
    acc[0] += part[0] * (r.sa0 * r.ws);
    acc[1] += part[1] * (r.sa1 * r.ws);
    acc[2] += part[2] * (r.sa0 * r.ws);
    acc[3] += part[3] * (r.sa1 * r.ws);
  }
};

// fp4 weights (rebuilt as e4m3 bytes of value * 2^-6, numerics.cuh) x e4m3 activations. A unit is
// 128 k = four 32-wide weight-scale blocks, one mma step each: lane t holds k 8t .. 8t + 7 of each
// block (one word of packed e2m1; in a full unit the GPU layout keeps the lane's four words
// together for one 16-byte load). kWholeUnits: k is a multiple of 128 (every V4 expert), so no
// unit is partial and the scale words are aligned.
template <bool kWholeUnits>
struct FewFp4 {
  static constexpr int kK = 128, kDepth = 3;
  struct Lane : QuantLane {
    const std::uint8_t* s_lo;  // UE8M0 rows (k / 32 bytes) of weight rows g and g + 8
    const std::uint8_t* s_hi;
  };
  struct Regs {
    uint4 w_lo, w_hi;  // word s: block s
    uint2 x[4];
    std::uint32_t s_lo, s_hi;  // the four blocks' UE8M0 bytes of rows g and g + 8
    float sa0, sa1;
  };
  static __device__ __forceinline__ Lane lane(const SmallArgs& args, const RowTile& tile, std::int64_t n0, int g, int t) {
    Lane l;
    const QuantRows rows = quant_lane(args, tile, n0, g, t, args.k / 2, l);
    const auto* s = static_cast<const std::uint8_t*>(args.w.scale) + static_cast<std::int64_t>(tile.expert) * args.w.scale_stride;
    l.s_lo = s + rows.lo * (args.k / 32);
    l.s_hi = s + rows.hi * (args.k / 32);
    if constexpr (kWholeUnits) {
      // the lane's own bytes of every unit, so a unit's address is one multiply-add
      l.w_lo += 16 * t;
      l.w_hi += 16 * t;
      l.x += 8 * t;
    }
    return l;
  }
  static __device__ __forceinline__ void load(const Lane& l, int unit, Regs& r) {
    if constexpr (kWholeUnits) {
      // a unit is 64 weight bytes, 128 codes and one scale word further
      r.w_lo = *reinterpret_cast<const uint4*>(l.w_lo + unit * 64);
      r.w_hi = *reinterpret_cast<const uint4*>(l.w_hi + unit * 64);
      const std::uint8_t* x = l.x + unit * 128;
      DSV4_UNROLL
      for (int s = 0; s < 4; ++s) r.x[s] = *reinterpret_cast<const uint2*>(x + 32 * s);
      r.s_lo = reinterpret_cast<const std::uint32_t*>(l.s_lo)[unit];
      r.s_hi = reinterpret_cast<const std::uint32_t*>(l.s_hi)[unit];
    } else {
      // any k: word loads, a tail unit (k % 128) in checkpoint word order, zeros past k
      std::uint32_t lo[4], hi[4];
      r.s_lo = 0;
      r.s_hi = 0;
      const int k0 = unit * kK;
      const bool full = k0 + kK <= l.k;
      DSV4_UNROLL
      for (int s = 0; s < 4; ++s) {
        const int k = k0 + 32 * s;
        const bool ok = k < l.k;
        const int word = full ? k0 / 2 + 16 * l.t + 4 * s : k / 2 + 4 * l.t;
        lo[s] = ok ? *reinterpret_cast<const std::uint32_t*>(l.w_lo + word) : 0u;
        hi[s] = ok ? *reinterpret_cast<const std::uint32_t*>(l.w_hi + word) : 0u;
        r.x[s] = ok ? *reinterpret_cast<const uint2*>(l.x + k + 8 * l.t) : make_uint2(0, 0);
        r.s_lo |= ok ? static_cast<std::uint32_t>(l.s_lo[k / 32]) << (8 * s) : 0x7fu << (8 * s);  // 0x7f: 1.0
        r.s_hi |= ok ? static_cast<std::uint32_t>(l.s_hi[k / 32]) << (8 * s) : 0x7fu << (8 * s);
      }
      r.w_lo = make_uint4(lo[0], lo[1], lo[2], lo[3]);
      r.w_hi = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    }
    r.sa0 = l.sa0[unit];
    r.sa1 = l.sa1[unit];
  }
  // kNormalScales: every scale byte of the weight is 1..254 (DeviceWeight::fp4_scales_normal)
  template <bool kNormalScales = false>
  static __device__ __forceinline__ void accumulate(const Regs& r, float (&acc)[4]) {
    float ws_lo[4], ws_hi[4];
    ue8m0x4_values<kNormalScales>(r.s_lo, ws_lo);
    ue8m0x4_values<kNormalScales>(r.s_hi, ws_hi);
    // sum over the unit's blocks of product * weight scale, then times the activation scale: both
    // scales are powers of two, so this rounds as product * (activation scale * weight scale)
    float unit[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    DSV4_UNROLL
    for (int s = 0; s < 4; ++s) {
      const std::uint32_t wl = word_of(r.w_lo, s), wh = word_of(r.w_hi, s);
      // mma k 4t..4t+3 <- the lane's values 0..3 (low nibbles), k 16+4t.. <- values 4..7.
      const std::uint32_t a[4] = {e2m1_low_nibbles_as_e4m3(wl), e2m1_low_nibbles_as_e4m3(wh), e2m1_high_nibbles_as_e4m3(wl),
                                  e2m1_high_nibbles_as_e4m3(wh)};
      const std::uint32_t b[2] = {r.x[s].x, r.x[s].y};
      float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      mma_m16n8k32_e4m3(part, a, b, part);
      unit[0] += part[0] * ws_lo[s];
      unit[1] += part[1] * ws_lo[s];
      unit[2] += part[2] * ws_hi[s];
      unit[3] += part[3] * ws_hi[s];
    }
    acc[0] += unit[0] * r.sa0;
    acc[1] += unit[1] * r.sa1;
    acc[2] += unit[2] * r.sa0;
    acc[3] += unit[3] * r.sa1;
  }
  static constexpr float kOutScale = kFp4Rebuild;
};

// bf16 activations x bf16 weights, or fp8 weights as their exact bf16 values (code x block
// scale). A unit is 64 k: two chunks of 32, lane t holding k 8t .. 8t + 7 of each (two mma steps).
template <WeightFormat F>
struct FewBf16 {
  static constexpr int kK = 64, kDepth = F == WeightFormat::kBf16 ? 2 : 4;
  static constexpr float kOutScale = 1.0f;
  using Lane = FewLane;
  static __device__ __forceinline__ Lane lane(const SmallArgs& args, const RowTile& tile, std::int64_t n0, int g, int t) {
    return few_lane<F>(args, tile, n0, g, t);
  }
  using WeightChunk = std::conditional_t<F == WeightFormat::kBf16, uint4, uint2>;
  struct Regs {
    WeightChunk w_lo[2], w_hi[2];
    uint4 x[2];
    float ws;
  };
  static __device__ __forceinline__ void load(const FewLane& l, int unit, Regs& r) {
    const std::int64_t k0 = static_cast<std::int64_t>(unit) * kK;
    constexpr int kWeightBytes = F == WeightFormat::kBf16 ? 2 : 1;
    DSV4_UNROLL
    for (int h = 0; h < 2; ++h) {
      const std::int64_t k = k0 + 32 * h + 8 * l.t;
      const bool ok = k < l.k;
      r.w_lo[h] = load_or_zero<WeightChunk>(l.w_lo, k * kWeightBytes, ok);
      r.w_hi[h] = load_or_zero<WeightChunk>(l.w_hi, k * kWeightBytes, ok);
      r.x[h] = load_or_zero<uint4>(l.x, k * 2, ok);
    }
    r.ws = F == WeightFormat::kFp8 ? l.ws[k0 / 128] : 1.0f;
  }
  static __device__ __forceinline__ uint4 weight_words(const WeightChunk& c, float ws) {
    if constexpr (F == WeightFormat::kBf16) {
      (void)ws;
      return c;
    } else {
      return make_uint4(e4m3x2_to_bf16x2(c.x, ws), e4m3x2_to_bf16x2(c.x >> 16, ws), e4m3x2_to_bf16x2(c.y, ws),
                        e4m3x2_to_bf16x2(c.y >> 16, ws));
    }
  }
  static __device__ __forceinline__ void accumulate(const Regs& r, float (&acc)[4]) {
    DSV4_UNROLL
    for (int h = 0; h < 2; ++h) {
      const uint4 lo = weight_words(r.w_lo[h], r.ws), hi = weight_words(r.w_hi[h], r.ws);
      DSV4_UNROLL
      for (int s = 0; s < 2; ++s) {
        // mma k 2t, 2t+1 <- the lane's values 4s, 4s+1; k 8+2t.. <- values 4s+2, 4s+3.
        const std::uint32_t a[4] = {word_of(lo, 2 * s), word_of(hi, 2 * s), word_of(lo, 2 * s + 1), word_of(hi, 2 * s + 1)};
        const std::uint32_t b[2] = {word_of(r.x[h], 2 * s), word_of(r.x[h], 2 * s + 1)};
        mma_m16n8k16_bf16(acc, a, b, acc);
      }
    }
  }
};

// The block's sum for the few-rows kernels: the partials of the warps along k (wk) are added in
// warp order into those of warp wk = 0 (deterministic). Every thread of the block calls it.
__device__ __forceinline__ void few_block_sum(float (&partial)[kFewWarps][32][4], float (&acc)[4], int warp, int lane,
                                              int wn, int wk, int warps_n) {
  if (warps_n == kFewWarps) return;  // no split of k
  DSV4_UNROLL
  for (int e = 0; e < 4; ++e) partial[warp][lane][e] = acc[e];
  __syncthreads();
  if (wk == 0) {
    for (int w = 1; w < kFewWarps / warps_n; ++w) {
      DSV4_UNROLL
      for (int e = 0; e < 4; ++e) acc[e] += partial[w * warps_n + wn][lane][e];
    }
  }
}

template <class U, WeightFormat F>
__global__ void __launch_bounds__(kThreads, 2) few_rows_kernel(SmallArgs args, int warps_n) {
  __shared__ float partial[kFewWarps][32][4];
  const RowTile tile = row_tile(blockIdx.y, kSmallRows, args.rows, args.rows_dev, args.tiles, args.experts);
  if (!tile.valid) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wn = warp % warps_n, wk = warp / warps_n, k_split = kFewWarps / warps_n;
  const std::int64_t n_total = args.w.n, k = args.k;
  const std::int64_t n0 = (static_cast<std::int64_t>(blockIdx.x) * warps_n + wn) * 16;  // the warp's first weight row

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (n0 < n_total) {
    const typename U::Lane l = U::lane(args, tile, n0, g, t);
    // the warp's units [u_begin, u_end) of k (32-bit: a row has at most 2^31 / 64 units), of the
    // CTA's range (all of k unless split over gridDim.z)
    const int units = static_cast<int>((k + U::kK - 1) / U::kK);
    const int z = static_cast<int>(blockIdx.z), zs = static_cast<int>(gridDim.z);
    const int c_begin = units * z / zs, c_units = units * (z + 1) / zs - c_begin;
    const int u_begin = c_begin + c_units * wk / k_split, u_end = c_begin + c_units * (wk + 1) / k_split;
    typename U::Regs buf[U::kDepth];
    DSV4_UNROLL
    for (int d = 0; d < U::kDepth; ++d)
      if (u_begin + d < u_end) U::load(l, u_begin + d, buf[d]);
    for (int u = u_begin; u < u_end; u += U::kDepth) {
      DSV4_UNROLL
      for (int d = 0; d < U::kDepth; ++d) {
        if (u + d < u_end) {
          U::accumulate(buf[d], acc);
          if (u + d + U::kDepth < u_end) U::load(l, u + d + U::kDepth, buf[d]);
        }
      }
    }
  }

  few_block_sum(partial, acc, warp, lane, wn, wk, warps_n);
  if (wk != 0) return;
  GemmOutput out = args.out;
  if (gridDim.z > 1) out.data = static_cast<float*>(out.data) + blockIdx.z * args.split_stride;  // (fp32 partials)
  // acc[e]: weight row n0 + g (+ 8 for e >= 2), token 2t + (e & 1).
  DSV4_UNROLL
  for (int e = 0; e < 4; ++e) {
    const std::int64_t n = n0 + g + 8 * (e >> 1);
    const int m = 2 * t + (e & 1);
    if (m < tile.count && n < n_total) store_out(out, tile.first + m, n, acc[e] * U::kOutScale);
  }
}

// ---- fp4 few-rows kernel with the weights streamed by the bulk copy engine ---------------------
// The products of few_rows_kernel<FewFp4<true>> (the same fragments, sums and rounding, so the
// same bits) for weights in the tiled layout (gemm.h fp4_tiled: a warp's 16 rows of a unit are one
// 1,024-byte block, its scales one of 64 bytes). How the bytes arrive:
//  - Weights: each warp keeps a ring of slots of one or two units (kSlotUnits); one lane fills a
//    slot with two bulk copies (cp.async.bulk: the units' blocks, then their scale blocks, which
//    the tiled layout keeps contiguous) counted on the slot's mbarrier, so a wait for a slot waits
//    for exactly those units. Register prefetch (few_rows_kernel) put several units' loads on
//    shared scoreboards, so a unit's first use also waited for loads issued after it (ncu: 45% of
//    the stall samples there, docs/perf.md). Two units a slot halve the waits, warp syncs and
//    copy issues per unit.
//  - Activations: the tile's tokens (e4m3 codes) and their scales go into shared memory once per
//    CTA. The codes of a unit are stored so that a lane's 32 bytes (k 32 s + 8 t .. + 7, s = 0..3)
//    are adjacent, and rows are k + 16 bytes apart, so the two 16-byte reads of 8 lanes (two tokens
//    x four t) hit distinct banks.
//  - kNormalScales: every scale byte of the weight is 1..254 (DeviceWeight::fp4_scales_normal,
//    checked once at upload), so the per-unit test for bytes 0 and 255 is left out.
constexpr int kFp4RingMax = 8;  // slots a warp
constexpr int kFp4UnitBytes = 1024 + 64;
// Dynamic shared memory a CTA may take so that `blocks` of them fit on an SM beside their static
// arrays (228 KB an SM, 1 KB of it reserved per CTA). More CTAs an SM beat a deeper ring: three
// with a ring of one unit were faster than two with five (docs/perf.md).
constexpr std::int64_t fp4_bulk_smem_budget(int blocks) { return blocks == 3 ? 70 * 1024 : 108 * 1024; }

// Where the bulk kernel's dynamic shared memory holds the activations (`x_rows` token rows, at most
// 8: no tile of the launch has more), their scales ([unit][8 tokens]) and the warps' rings of `ring`
// slots of `slot_units` units.
struct Fp4BulkLayout {
  std::int64_t x_stride = 0, sa_offset = 0, ring_offset = 0, bytes = 0;
};
__host__ __device__ constexpr Fp4BulkLayout fp4_bulk_layout(std::int64_t k, int ring, int slot_units, int x_rows) {
  Fp4BulkLayout s;
  s.x_stride = k + 16;
  s.sa_offset = x_rows * s.x_stride;
  s.ring_offset = (s.sa_offset + (k / 128) * kSmallRows * 4 + 127) / 128 * 128;
  s.bytes = s.ring_offset + static_cast<std::int64_t>(kFewWarps) * ring * slot_units * kFp4UnitBytes;
  return s;
}

template <int kBlocksPerSm, int kSlotUnits, bool kNormalScales>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) few_rows_fp4_bulk_kernel(SmallArgs args, int warps_n, int ring, int x_rows) {
  constexpr int kSlotBytes = kSlotUnits * kFp4UnitBytes;  // the units' weight blocks, then their scale blocks
  DSV4_DYNAMIC_SMEM(std::uint8_t, smem);
  __shared__ float partial[kFewWarps][32][4];
  __shared__ std::uint64_t landed[kFewWarps][kFp4RingMax];
  const RowTile tile = row_tile(blockIdx.y, kSmallRows, args.rows, args.rows_dev, args.tiles, args.experts);
  if (!tile.valid) return;
  if (tile.count > x_rows) __trap();  // (a tile past ExpertTiles::rows_bound)
  // (the warp index broadcast from lane 0, so the compiler knows it and the copy addresses built on
  // it warp-uniform: a bulk copy takes uniform operands)
  const int tid = threadIdx.x, warp = __shfl_sync(0xffffffffu, tid >> 5, 0), lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int wn = warp % warps_n, wk = warp / warps_n, k_split = kFewWarps / warps_n;
  const std::int64_t n_total = args.w.n, k = args.k;
  const int units = static_cast<int>(k / 128);
  const std::int64_t n0 = (static_cast<std::int64_t>(blockIdx.x) * warps_n + wn) * 16;  // the warp's first weight row
  const bool active = n0 < n_total;  // (n is a multiple of 16: all 16 rows exist)
  const int u_begin = units * wk / k_split, u_end = units * (wk + 1) / k_split;
  const Fp4BulkLayout lay = fp4_bulk_layout(k, ring, kSlotUnits, x_rows);
  std::uint8_t* xs = smem;
  float* sas = reinterpret_cast<float*>(smem + lay.sa_offset);
  std::uint8_t* slots = smem + lay.ring_offset + static_cast<std::int64_t>(warp) * ring * kSlotBytes;

  // The warp's blocks: unit u of its row group at w_src + 1024 u, the unit's scales at s_src + 64 u.
  const std::int64_t first_block = (n0 / 16) * units;
  const auto* w_src = static_cast<const std::uint8_t*>(args.w.data) + static_cast<std::int64_t>(tile.expert) * args.w.expert_stride + first_block * 1024;
  const auto* s_src = static_cast<const std::uint8_t*>(args.w.scale) + static_cast<std::int64_t>(tile.expert) * args.w.scale_stride + first_block * 64;
  const auto issue = [&](int u, int slot) {  // by lane 0: units u .. u + kSlotUnits - 1 that are before u_end
    const unsigned count = static_cast<unsigned>(u_end - u < kSlotUnits ? u_end - u : kSlotUnits);
    std::uint8_t* to = slots + slot * kSlotBytes;
    mbarrier_arrive_expect_tx(&landed[warp][slot], count * kFp4UnitBytes);
    bulk_copy_to_shared(to, w_src + static_cast<std::int64_t>(u) * 1024, 1024u * count, &landed[warp][slot]);
    bulk_copy_to_shared(to + kSlotUnits * 1024, s_src + static_cast<std::int64_t>(u) * 64, 64u * count, &landed[warp][slot]);
  };
  if (active && lane == 0) {
    for (int r = 0; r < ring; ++r) mbarrier_init(&landed[warp][r], 1);
    for (int i = 0; i < ring && u_begin + i * kSlotUnits < u_end; ++i) issue(u_begin + i * kSlotUnits, i);
  }
  // Launched dependent: the tile map and the weights were complete before the kernel before this
  // one began (gemm_quantized_experts), so the first copies are in flight while that kernel ends;
  // the activations may come from it.
  grid_dependency_wait();
  grid_dependents_launch();

  // The tile's activations, while the first units are in flight: tokens m < count, 16 bytes a step
  // (two 8-byte pieces: k 16 c .. 16 c + 15 is block s = (c % 8) / 2, lane t = 2 (c % 2) + p).
  const int m_last = tile.count - 1;
  const std::int64_t chunks = k / 16;
  for (std::int64_t i = tid; i < tile.count * chunks; i += kThreads) {
    const int m = static_cast<int>(i / chunks);
    const std::int64_t c = i % chunks;
    const uint4 v = *reinterpret_cast<const uint4*>(args.a_codes + source_row(tile, m, args.tiles, args.experts) * k + 16 * c);
    std::uint8_t* to = xs + m * lay.x_stride + (c / 8) * 128 + 8 * static_cast<int>((c % 8) / 2);
    const int t0 = 2 * static_cast<int>(c % 2);
    *reinterpret_cast<uint2*>(to + 32 * t0) = make_uint2(v.x, v.y);
    *reinterpret_cast<uint2*>(to + 32 * (t0 + 1)) = make_uint2(v.z, v.w);
  }
  // scales [unit][8 tokens], tokens past the tile's count repeating its last
  for (int i = tid; i < units * kSmallRows; i += kThreads) {
    const int u = i / kSmallRows, m = i % kSmallRows;
    sas[i] = args.a_scales[source_row(tile, m < m_last ? m : m_last, args.tiles, args.experts) * units + u];
  }
  __syncthreads();  // (also orders lane 0's barrier initialization before the other lanes' waits)

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (active) {
    const std::uint8_t* x_lane = xs + (g < m_last ? g : m_last) * lay.x_stride + 32 * t;
    int slot = 0;
    unsigned phase = 0;
    for (int u = u_begin; u < u_end; u += kSlotUnits) {
      mbarrier_wait(&landed[warp][slot], phase);
      const std::uint8_t* sl = slots + slot * kSlotBytes;
      DSV4_UNROLL
      for (int j = 0; j < kSlotUnits; ++j) {
        if (j > 0 && u + j >= u_end) break;  // (a last slot of one unit)
        const std::uint8_t* wj = sl + 1024 * j;
        const std::uint8_t* sj = sl + kSlotUnits * 1024 + 64 * j;
        FewFp4<true>::Regs r;
        r.w_lo = *reinterpret_cast<const uint4*>(wj + 64 * g + 16 * t);
        r.w_hi = *reinterpret_cast<const uint4*>(wj + 64 * (g + 8) + 16 * t);
        r.s_lo = *reinterpret_cast<const std::uint32_t*>(sj + 4 * g);
        r.s_hi = *reinterpret_cast<const std::uint32_t*>(sj + 4 * (g + 8));
        const uint4 x01 = *reinterpret_cast<const uint4*>(x_lane + (u + j) * 128);
        const uint4 x23 = *reinterpret_cast<const uint4*>(x_lane + (u + j) * 128 + 16);
        r.x[0] = make_uint2(x01.x, x01.y);
        r.x[1] = make_uint2(x01.z, x01.w);
        r.x[2] = make_uint2(x23.x, x23.y);
        r.x[3] = make_uint2(x23.z, x23.w);
        const float2 sa = *reinterpret_cast<const float2*>(sas + (u + j) * kSmallRows + 2 * t);
        r.sa0 = sa.x;
        r.sa1 = sa.y;
        FewFp4<true>::accumulate<kNormalScales>(r, acc);
      }
      __syncwarp();  // every lane has used the slot: it may be refilled
      if (lane == 0 && u + ring * kSlotUnits < u_end) issue(u + ring * kSlotUnits, slot);
      if (++slot == ring) {
        slot = 0;
        phase ^= 1u;
      }
    }
  }

  few_block_sum(partial, acc, warp, lane, wn, wk, warps_n);
  if (wk != 0 || !active) return;
  DSV4_UNROLL
  for (int e = 0; e < 4; ++e) {
    const std::int64_t n = n0 + g + 8 * (e >> 1);
    const int m = 2 * t + (e & 1);
    if (m < tile.count) store_out(args.out, tile.first + m, n, acc[e] * FewFp4<true>::kOutScale);
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
  constexpr float kOutScale = F == WeightFormat::kFp4 ? kFp4Rebuild : 1.0f;  // fp4 values rebuilt times 2^-6
  const std::int64_t kb_act = (k + kActBlock - 1) / kActBlock;
  const std::int64_t kb_w = (k + 127) / 128;
  const int k_tiles = static_cast<int>((k + 127) / 128);
  const auto* wbase = static_cast<const std::uint8_t*>(args.w.data) + static_cast<std::int64_t>(tile.expert) * args.w.expert_stride;
  const std::int64_t w_row_bytes = F == WeightFormat::kFp4 ? k / 2 : k;
  const bool tiled = F == WeightFormat::kFp4 && fp4_tiled(n_total, k);
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
      // fp4: 64 packed bytes per row and k tile; each thread rebuilds 2 x 32 values as e4m3 (times 2^-6).
      const auto* sbase = static_cast<const std::uint8_t*>(args.w.scale) + static_cast<std::int64_t>(tile.expert) * args.w.scale_stride;
      DSV4_UNROLL
      for (int i = 0; i < 2; ++i) {
        const int c = tid + i * kThreads;
        const int row = c >> 2, part = c & 3;
        const bool ok = n0 + row < n_total && k0 + part * 32 < k;
        uint4 raw = make_uint4(0, 0, 0, 0);
        float s = 0.0f;
        if (ok) {
          const std::int64_t r = n0 + row;
          // the row's 16 bytes of the unit and its scale byte, in row order or tiled (gemm.h)
          const std::int64_t block = (r / 16) * k_tiles + kt;
          raw = *reinterpret_cast<const uint4*>(wbase + (tiled ? block * 1024 + (r % 16) * 64 : r * w_row_bytes + k0 / 2) + part * 16);
          s = ue8m0_value(sbase[(tiled ? block * 64 + (r % 16) * 4 : r * (k / 32) + k0 / 32) + part]);
        }
        const std::uint32_t in[4] = {raw.x, raw.y, raw.z, raw.w};
        std::uint32_t outw[8];  // word wd's values 0..3, then 4..7 (the GPU layout's nibbles)
        DSV4_UNROLL
        for (int wd = 0; wd < 4; ++wd) {
          outw[2 * wd] = e2m1_low_nibbles_as_e4m3(in[wd]);
          outw[2 * wd + 1] = e2m1_high_nibbles_as_e4m3(in[wd]);
        }
        if (k0 + 128 <= k) {
          // GPU layout: word wd of the 16 bytes holds k 32 wd + 8 part .. + 7
          DSV4_UNROLL
          for (int wd = 0; wd < 4; ++wd)
            *reinterpret_cast<uint2*>(Bs + row * kRowBytes + 32 * wd + 8 * part) = make_uint2(outw[2 * wd], outw[2 * wd + 1]);
        } else {
          // a tail tile keeps checkpoint order: k 32 part .. 32 part + 31
          uint4* dst = reinterpret_cast<uint4*>(Bs + row * kRowBytes + part * 32);
          dst[0] = make_uint4(outw[0], outw[1], outw[2], outw[3]);
          dst[1] = make_uint4(outw[4], outw[5], outw[6], outw[7]);
        }
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
        if (r < tile.count && col < n_total) store_out(args.out, tile.first + r, col, acc[mi][ni][e] * kOutScale);
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

// Few-rows kernels' warps along the output: as many as still give about `per_sm` blocks per SM
// (the blocks an SM holds at once), the rest of the block's warps splitting k.
int few_warps_n(std::int64_t n, std::int64_t row_tiles, int per_sm = 2) {
  const std::int64_t groups = (n + 15) / 16;
  for (int w : {8, 4, 2})
    if ((groups + w - 1) / w * row_tiles >= per_sm * 132) return w;
  return 1;
}

// Few-rows launch (warps: few_warps_n), k split over `splits` CTAs into fp32 partials where asked
// (gemm_bf16_k_partials). (Splitting k over CTAs with the last CTA adding the partials, for the
// narrow fp8 outputs of 512 and more, was measured slower on 2026-12-02: docs/perf.md.)
template <class U, WeightFormat F>
void launch_few(const SmallArgs& args, std::int64_t row_tiles, gpu_stream_t stream, int splits = 1) {
  const std::int64_t groups = (args.w.n + 15) / 16;
  const int warps_n = few_warps_n(args.w.n, row_tiles);
  launch(few_rows_kernel<U, F>,
         dim3(static_cast<unsigned>((groups + warps_n - 1) / warps_n), static_cast<unsigned>(row_tiles), static_cast<unsigned>(splits)),
         dim3(kThreads), 0, stream, args, warps_n);
}

void launch_few_fp8(const SmallArgs& args, std::int64_t row_tiles, gpu_stream_t stream) {
  if (args.k % 128 == 0) launch_few<FewFp8<true>, WeightFormat::kFp8>(args, row_tiles, stream);
  else launch_few<FewFp8<false>, WeightFormat::kFp8>(args, row_tiles, stream);
}

// The bulk-copy kernel (tiled fp4 weights): three CTAs an SM where a ring of one unit still fits
// beside the activations, else two (two slots of two units at kFp4TiledMaxK). Slots of two units
// where two of them fit, so a warp still has a slot in flight while it works on the other; each
// ring as deep as fits.
template <int kBlocksPerSm, int kSlotUnits, bool kNormalScales>
void launch_fp4_bulk(const SmallArgs& args, dim3 grid, int warps_n, int ring, int x_rows, gpu_stream_t stream) {
  static const bool smem_set = (set_max_dynamic_smem(few_rows_fp4_bulk_kernel<kBlocksPerSm, kSlotUnits, kNormalScales>,
                                                     fp4_bulk_smem_budget(kBlocksPerSm)),
                                true);
  (void)smem_set;
  launch_dependent(few_rows_fp4_bulk_kernel<kBlocksPerSm, kSlotUnits, kNormalScales>, grid, dim3(kThreads),
         static_cast<std::size_t>(fp4_bulk_layout(args.k, ring, kSlotUnits, x_rows).bytes), stream, args, warps_n, ring, x_rows);
}

template <int kBlocksPerSm, int kSlotUnits>
void launch_fp4_bulk(const SmallArgs& args, dim3 grid, int warps_n, int ring, int x_rows, gpu_stream_t stream) {
  if (args.w.fp4_scales_normal) launch_fp4_bulk<kBlocksPerSm, kSlotUnits, true>(args, grid, warps_n, ring, x_rows, stream);
  else launch_fp4_bulk<kBlocksPerSm, kSlotUnits, false>(args, grid, warps_n, ring, x_rows, stream);
}

void launch_few_fp4_bulk(const SmallArgs& args, std::int64_t row_tiles, gpu_stream_t stream) {
  // activation rows to stage: as many as a tile may hold
  const std::int64_t bound = args.experts ? (args.tiles.rows_bound > 0 ? args.tiles.rows_bound : kSmallRows) : args.rows;
  const int x_rows = static_cast<int>(std::clamp<std::int64_t>(bound, 1, kSmallRows));
  const auto slots_for = [&](int blocks, int slot_units) {
    return static_cast<int>(std::min<std::int64_t>(kFp4RingMax, (fp4_bulk_smem_budget(blocks) - fp4_bulk_layout(args.k, 0, 1, x_rows).bytes) /
                                                                    (kFewWarps * slot_units * kFp4UnitBytes)));
  };
  // (two CTAs always fit two slots of two units)
  static_assert((fp4_bulk_smem_budget(2) - fp4_bulk_layout(kFp4TiledMaxK, 0, 1, kSmallRows).bytes) / (kFewWarps * 2 * kFp4UnitBytes) >= 2);
  // (with three blocks an SM, warps along n for three: Pro's w1|w3 and w2 at one token took 95 us
  // with four warps a row group where two-block warps_n's eight took 99)
  const int blocks = slots_for(3, 1) >= 1 ? 3 : 2;
  const int warps_n = few_warps_n(args.w.n, row_tiles, blocks);
  const std::int64_t groups = args.w.n / 16;
  const dim3 grid(static_cast<unsigned>((groups + warps_n - 1) / warps_n), static_cast<unsigned>(row_tiles));
  if (blocks == 2) launch_fp4_bulk<2, 2>(args, grid, warps_n, slots_for(2, 2), x_rows, stream);
  else if (slots_for(3, 2) >= 2) launch_fp4_bulk<3, 2>(args, grid, warps_n, slots_for(3, 2), x_rows, stream);
  else launch_fp4_bulk<3, 1>(args, grid, warps_n, slots_for(3, 1), x_rows, stream);
}

void launch_few_fp4(const SmallArgs& args, std::int64_t row_tiles, gpu_stream_t stream) {
  if (fp4_tiled(args.w.n, args.k)) {
    launch_few_fp4_bulk(args, row_tiles, stream);
    return;
  }
  // weights in row order (gemm.h)
  if (args.k % 128 == 0) launch_few<FewFp4<true>, WeightFormat::kFp4>(args, row_tiles, stream);
  else launch_few<FewFp4<false>, WeightFormat::kFp4>(args, row_tiles, stream);
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

// DSV4_GEMM_LIBRARY=1: prompt steps take cuBLASLt where it runs (gemm.h GemmPath).
bool library_opted_in() {
  static const bool on = env_is("DSV4_GEMM_LIBRARY", "1");
  return on;
}

// The few-rows kernel up to 16 rows, and up to 128 while the tile kernel would leave the GPU
// short of CTAs (outputs narrower than ~16K for one 128-row tile): measured by bench_gpu_gemm,
// where the tile kernel at 32-128 rows loses to re-reading the weight per 8 rows until it has
// about one 128 x 128 tile per SM.
bool use_small(std::int64_t rows, std::int64_t n, GemmPath path) {
  if (path == GemmPath::kFewRows || path == GemmPath::kStream) return true;
  if (path == GemmPath::kTiles || path == GemmPath::kLibrary) return false;
  if (rows <= 16) return true;
  if (path == GemmPath::kAutoPrefill) return false;
  const std::int64_t tile_ctas = ((n + kTileN - 1) / kTileN) * ((rows + kTileM - 1) / kTileM);
  return rows <= 128 && tile_ctas < 132;
}

// Dense fp8 weights: the weight-streaming kernel where bench_gpu_gemm measured it faster than
// the few-rows kernel and the tiles (gemm.h GemmPath): 9 to 64 rows of outputs of at least 3,072,
// or 17 to 64 rows of outputs of at least 1,536. Narrower outputs need k split over many CTAs,
// whose partial sums and activation staging cost more than re-reading the weight per 8 rows.
// DSV4_GEMM_STREAM=0 in the environment turns the automatic choice off (comparisons).
bool stream_opted_out() {
  static const bool off = env_is("DSV4_GEMM_STREAM", "0");
  return off;
}

bool use_stream(std::int64_t rows, const QuantizedRows& a, const DeviceWeight& w, GemmPath path) {
  if (w.format != WeightFormat::kFp8) return false;
  if (path == GemmPath::kStream) return true;
  if (path != GemmPath::kAuto && path != GemmPath::kAutoPrefill) return false;
  if (stream_opted_out()) return false;
  if (path == GemmPath::kAutoPrefill && library_opted_in()) return false;
  if (rows <= kSmallRows || rows > kStreamMaxRows) return false;
  if (reinterpret_cast<std::uintptr_t>(a.codes) % 16 != 0 || reinterpret_cast<std::uintptr_t>(w.data) % 16 != 0) return false;
  return w.n >= 3072 || (rows > 16 && w.n >= 1536);
}

void fp4_row_layout(void* data, std::int64_t rows, std::int64_t k, bool to_gpu, gpu_stream_t stream) {
  const std::int64_t units = rows * ((k + 127) / 128);
  launch(fp4_layout_kernel, dim3(static_cast<unsigned>((units + kThreads - 1) / kThreads)), dim3(kThreads), 0, stream,
         static_cast<std::uint8_t*>(data), rows, k, to_gpu);
}
void fp4_tile_order(void* data, void* scales, std::int64_t rows, std::int64_t k, bool to_tiled, gpu_stream_t stream) {
  const std::int64_t smem = 16 * (k / 2 + k / 32);
  static const bool smem_set = (set_max_dynamic_smem(fp4_tile_kernel, 16 * (kFp4TiledMaxK / 2 + kFp4TiledMaxK / 32)), true);
  (void)smem_set;
  launch(fp4_tile_kernel, dim3(static_cast<unsigned>(rows / 16)), dim3(kThreads), static_cast<std::size_t>(smem), stream,
         static_cast<std::uint8_t*>(data), static_cast<std::uint8_t*>(scales), k, to_tiled);
}

}  // namespace

void fp4_to_gpu_layout(void* data, void* scales, std::int64_t matrices, std::int64_t n, std::int64_t k, gpu_stream_t stream) {
  check_k(k, "fp4_to_gpu_layout: the row length {} must be a positive multiple of 32");
  const std::int64_t rows = matrices * n;
  if (rows <= 0) return;
  fp4_row_layout(data, rows, k, true, stream);
  if (fp4_tiled(n, k)) fp4_tile_order(data, scales, rows, k, true, stream);
}

void fp4_from_gpu_layout(void* data, void* scales, std::int64_t matrices, std::int64_t n, std::int64_t k, gpu_stream_t stream) {
  check_k(k, "fp4_from_gpu_layout: the row length {} must be a positive multiple of 32");
  const std::int64_t rows = matrices * n;
  if (rows <= 0) return;
  if (fp4_tiled(n, k)) fp4_tile_order(data, scales, rows, k, false, stream);
  fp4_row_layout(data, rows, k, false, stream);
}

bool fp4_scales_normal(const void* scales, std::int64_t bytes, Stream& stream) {
  if (bytes <= 0) return true;
  DeviceBuffer found(sizeof(std::int32_t));
  fill_bytes(found.data(), 0, sizeof(std::int32_t), stream);
  const std::int64_t blocks = std::min<std::int64_t>(1024, (bytes + 16 * kThreads - 1) / (16 * kThreads));
  launch(find_special_scales_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream.handle(),
         static_cast<const std::uint8_t*>(scales), bytes, found.as<std::int32_t>());
  std::int32_t host = 0;
  copy_to_host(&host, found.data(), sizeof(host), stream);
  stream.synchronize();
  return host == 0;
}

bool gemm_library_supports(std::int64_t rows, const DeviceWeight& w, const GemmOutput& out) {
  return cublaslt::find_plan(rows, w, out) != nullptr;
}

std::string gemm_library_refusal() { return cublaslt::last_refusal(); }
std::string gemm_library_calibration() { return cublaslt::calibration(); }

int expert_tile_rows(std::int64_t total_rows, std::int64_t experts, const DeviceWeight& w13, const DeviceWeight& w2) {
  if (experts > 0 && total_rows <= 16 * experts) return kSmallRows;
  return experts_fp4_wgmma_supported(w13) && experts_fp4_wgmma_supported(w2) ? kWgmmaExpertRows : kTileRows;
}

void quantize_activations(const std::uint16_t* x, std::int64_t ld, std::int64_t rows, std::int64_t k,
                          std::uint8_t* codes, float* scales, const std::int32_t* rows_dev, gpu_stream_t stream) {
  if (rows <= 0) return;
  const std::int64_t warps = rows * ((k + kActBlock - 1) / kActBlock);
  launch_dependent(quantize_rows_kernel, dim3(static_cast<unsigned>((warps * 32 + kThreads - 1) / kThreads)), dim3(kThreads), 0,
         stream, x, ld, rows, k, codes, scales, rows_dev);
}

void gemm_quantized(const QuantizedRows& a, std::int64_t rows, const DeviceWeight& w, const GemmOutput& out,
                    const std::int32_t* rows_dev, gpu_stream_t stream, GemmPath path) {
  check_k(w.k, "gemm_quantized: the reduction length {} must be a positive multiple of 32");
  if (rows <= 0) return;
  if (a.k != w.k) launch_error("gemm_quantized: activations of {} columns for a weight of {}", {a.k, w.k});
  if (w.format == WeightFormat::kBf16) launch_error("gemm_quantized: bf16 weights take gemm_bf16");
  if (use_stream(rows, a, w, path)) {
    gemm_stream_fp8(a, rows, w, out, rows_dev, stream);
    return;
  }
  if (use_small(rows, w.n, path)) {
    SmallArgs s{a.codes, a.scales, nullptr, 0, 0, w.k, w, 0, out, rows, rows_dev, {}, false};
    const std::int64_t tiles = (rows + kSmallRows - 1) / kSmallRows;
    if (w.format == WeightFormat::kFp8) launch_few_fp8(s, tiles, stream);
    else launch_few_fp4(s, tiles, stream);
    return;
  }
  if (path == GemmPath::kLibrary || (path == GemmPath::kAutoPrefill && library_opted_in())) {
    // cuBLASLt's block-scaled product (gemm_library.h). It computes all `rows`: rows_dev is for
    // graphs, which kAutoPrefill steps are not.
    const bool codes_aligned = reinterpret_cast<std::uintptr_t>(a.codes) % 16 == 0;
    if (const cublaslt::Plan* plan = codes_aligned ? cublaslt::find_plan(rows, w, out) : nullptr) {
      // Rearrange the scales into the layouts cuBLASLt reads (transposed copies in its scratch).
      const cublaslt::Layouts layouts = cublaslt::layouts();
      const std::int64_t kb = w.k / 128, nb = w.n / 128, act_floats = (rows * kb + 63) / 64 * 64;
      float* scratch = cublaslt::scale_scratch(stream, act_floats + nb * kb);
      const float* act_scales = a.scales;
      const auto* weight_scales = static_cast<const float*>(w.scale);
      if (layouts.act_k_major) {
        launch(transpose_scales_kernel, dim3(static_cast<unsigned>((rows * kb + kThreads - 1) / kThreads)), dim3(kThreads), 0,
               stream, a.scales, rows, kb, scratch);
        act_scales = scratch;
      }
      if (layouts.weight_transposed) {
        launch(transpose_scales_kernel, dim3(static_cast<unsigned>((nb * kb + kThreads - 1) / kThreads)), dim3(kThreads), 0,
               stream, weight_scales, nb, kb, scratch + act_floats);
        weight_scales = scratch + act_floats;
      }
      cublaslt::run(*plan, a.codes, act_scales, weight_scales, w, out, stream);
      return;
    }
    if (path == GemmPath::kLibrary)
      launch_error("gemm_quantized: cuBLASLt cannot run {} rows x n {} x k {} here (gemm_library_supports)", {rows, w.n, w.k});
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
  // DSV4_EXPERTS_FP8=1: tiled fp4 experts on FP8 wgmma at every step size (gemm_experts_fp8.h).
  if (experts_fp8_opted_in() && experts_fp4_wgmma_supported(w) &&
      (tiles.tile_m == kSmallRows || tiles.tile_m == kWgmmaExpertRows)) {
    gemm_experts_fp4_fp8(a, tiles, w, out, stream);
    return;
  }
  if (tiles.tile_m == kSmallRows) {
    SmallArgs s{a.codes, a.scales, nullptr, 0, 0, w.k, w, 0, out, 0, nullptr, tiles, true};
    if (w.format == WeightFormat::kFp8) launch_few_fp8(s, tiles.max_tiles, stream);
    else launch_few_fp4(s, tiles.max_tiles, stream);
    return;
  }
  if (tiles.tile_m == kWgmmaExpertRows) {
    gemm_experts_fp4_wgmma(a, tiles, w, out, stream);
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
  // The few-rows kernel reads 8 bf16 activations at once and keeps a warp's 16 weight rows in
  // one group; other layouts take the tile kernel.
  const bool few_layout = lda % 8 == 0 && a_stride % 8 == 0 && reinterpret_cast<std::uintptr_t>(a) % 16 == 0 &&
                          (groups == 1 || n_group % 16 == 0);
  if (use_small(rows, w.n, path) && (few_layout || path == GemmPath::kFewRows)) {
    if (!few_layout) launch_error("gemm_bf16: the few-rows kernel needs 16-byte aligned activation rows and output groups of a multiple of 16 rows");
    SmallArgs s{nullptr, nullptr, a, lda, a_stride, w.k, w, groups > 1 ? n_group : 0, out, rows, rows_dev, {}, false};
    const std::int64_t tiles = (rows + kSmallRows - 1) / kSmallRows;
    if (w.format == WeightFormat::kFp8) launch_few<FewBf16<WeightFormat::kFp8>, WeightFormat::kFp8>(s, tiles, stream);
    else launch_few<FewBf16<WeightFormat::kBf16>, WeightFormat::kBf16>(s, tiles, stream);
    return;
  }
  MmaArgs m{nullptr, nullptr, a, lda, a_stride, w.k, w, groups > 1 ? n_group : 0, out, rows, rows_dev, {}, false};
  const std::int64_t tiles = (rows + kTileM - 1) / kTileM;
  if (w.format == WeightFormat::kFp8) launch_mma_bf16<WeightFormat::kFp8>(m, tiles, groups, stream);
  else launch_mma_bf16<WeightFormat::kBf16>(m, tiles, groups, stream);
}

int gemm_k_splits(std::int64_t rows, const DeviceWeight& w) {
  if (w.format != WeightFormat::kBf16 || rows <= 0 || rows > kKSplitMaxRows || !use_small(rows, w.n, GemmPath::kAuto)) return 1;
  const std::int64_t tiles = (rows + kSmallRows - 1) / kSmallRows, groups = (w.n + 15) / 16;
  const int warps_n = few_warps_n(w.n, tiles);
  const std::int64_t ctas = (groups + warps_n - 1) / warps_n * tiles;
  // about two CTAs an SM, each k range at least one 64-wide unit per warp
  const std::int64_t units = (w.k + 63) / 64;
  return static_cast<int>(std::clamp<std::int64_t>(std::min(2 * 132 / ctas, units / kFewWarps), 1, kMaxKSplits));
}

void gemm_bf16_k_partials(const std::uint16_t* a, std::int64_t lda, std::int64_t rows, const DeviceWeight& w, int splits,
                          float* out, std::int64_t split_stride, const std::int32_t* rows_dev, gpu_stream_t stream) {
  check_k(w.k, "gemm_bf16_k_partials: the reduction length {} must be a positive multiple of 32");
  if (rows <= 0) return;
  if (w.format != WeightFormat::kBf16) launch_error("gemm_bf16_k_partials: bf16 weights only");
  if (splits < 1 || splits > kMaxKSplits) launch_error("gemm_bf16_k_partials: {} k ranges (1 to {})", {splits, kMaxKSplits});
  if (split_stride < rows * w.n) launch_error("gemm_bf16_k_partials: partials {} floats apart hold {} rows of {}", {split_stride, rows, w.n});
  if (lda % 8 != 0 || reinterpret_cast<std::uintptr_t>(a) % 16 != 0)
    launch_error("gemm_bf16_k_partials: the few-rows kernel needs 16-byte aligned activation rows");
  SmallArgs s{nullptr, nullptr, a, lda, 0, w.k, w, 0, GemmOutput{out, w.n, true}, rows, rows_dev, {}, false, split_stride};
  launch_few<FewBf16<WeightFormat::kBf16>, WeightFormat::kBf16>(s, (rows + kSmallRows - 1) / kSmallRows, stream, splits);
}

}  // namespace dsv4::gpu
