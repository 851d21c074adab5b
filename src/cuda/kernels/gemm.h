// Matrix products of the GPU executor, with the reference's numerics (SPEC.md 5a):
//   fp8 / fp4 weights: the bf16 activation row is quantized to e4m3 in blocks of 128 along k
//     (power-of-two scales, quantize_activations), products accumulate in fp32 per weight-scale
//     block and are scaled block by block, the result rounded to bf16 (or kept fp32);
//   bf16 weights (and the bf16 einsum over fp8 weights, wo_a): bf16 activations, fp32
//     accumulation -- for bf16-valued inputs the same as the reference's fp32 products.
// CPU twins: cpu/linear.h (linear, linear_bf16, linear_f32, linear_grouped_bf16).
//
// Kernels (gemm.cu), chosen by row count (GemmPath): for few rows (decode: bound by reading the weight) a
// kernel that puts the weight on the A side of mma.sync and up to 8 activation rows on the B side,
// loading the weight straight into registers; for many rows tensor-core tile kernels (128 x 128
// tiles through shared memory). Both use mma.sync e4m3 for fp8/fp4 weights (fp4 values rebuilt as
// e4m3) and mma.sync bf16 for bf16 activations. The same entry points serve dense layers and the
// MoE experts (rows grouped by expert through a tile map); tiled fp4 experts with many rows each
// take the wgmma kernel of gemm_experts_wgmma.h instead of the tiles; dense fp8 weights of wide
// outputs at 9 to 64 rows take the weight-streaming wgmma kernel of gemm_stream.h.
// Shapes: weights [n, k] row-major (one output feature per row); k a multiple of 32.
#pragma once

#include <cstdint>
#include <string>

#include "cuda/runtime.h"
#include "cuda/stream_handle.h"

namespace dsv4::gpu {

enum class WeightFormat : std::int32_t {
  kBf16,   // bf16 [n][k]
  kFp8,    // e4m3 [n][k], fp32 scales [ceil(n/128)][ceil(k/128)] (UE8M0 values widened)
  kFp4,    // packed e2m1 [n][k/2] and UE8M0 bytes [n][k/32] in the GPU layout (fp4_to_gpu_layout;
           // the checkpoint's low nibble is the even k)
};

// One weight matrix on the device, or `experts` of them stacked (expert e at data +
// e * expert_stride bytes, its scales at scale + e * scale_stride elements / bytes).
struct DeviceWeight {
  WeightFormat format = WeightFormat::kBf16;
  std::int64_t n = 0, k = 0;
  const void* data = nullptr;
  const void* scale = nullptr;  // kFp8: const float*; kFp4: const uint8_t*; kBf16: null
  std::int64_t expert_stride = 0;  // bytes between stacked experts' data
  std::int64_t scale_stride = 0;   // elements (fp32 or bytes) between stacked experts' scales
  // kFp4: every UE8M0 scale byte is 1..254 (fp4_scales_normal), so the products decode the bytes
  // as plain fp32 exponent fields, without testing for 0 (2^-127) and 255 (NaN) per unit. Set it
  // only from that check; false is always correct.
  bool fp4_scales_normal = false;
};

// bf16 activations quantized for an fp8/fp4 GEMM: codes [rows][k] e4m3, scales [rows][ceil(k/128)].
struct QuantizedRows {
  const std::uint8_t* codes = nullptr;
  const float* scales = nullptr;
  std::int64_t k = 0;
};

// Where a GEMM writes: row r (its output row), column c at out + r * ld + c.
struct GemmOutput {
  void* data = nullptr;
  std::int64_t ld = 0;       // elements between rows
  bool f32 = false;          // fp32 values, else bf16 (rounded)
};

// Rows grouped by expert (MoE), built by moe_permute (moe.h): permuted row i (in expert order)
// reads activation row `source_row[i]` (row i itself when source_row is null) and writes output
// row i. The GEMM runs
// tile by tile: tile t covers permuted rows [tile_row0[t], tile_row0[t] + tile_rows[t]) of
// expert tile_expert[t]; tiles at or past *num_tiles do nothing.
struct ExpertTiles {
  const std::int32_t* source_row = nullptr;
  const std::int32_t* tile_expert = nullptr;
  const std::int32_t* tile_row0 = nullptr;
  const std::int32_t* tile_rows = nullptr;
  const std::int32_t* num_tiles = nullptr;
  std::int32_t max_tiles = 0;  // grid bound
  std::int32_t tile_m = 0;     // rows per tile the map was built for (kSmallRows, kWgmmaExpertRows, kTileRows)
  // No tile holds more rows than this (0: tile_m). An expert gets each token at most once, so the
  // step's token count bounds it; the few-rows fp4 kernel then stages only that many activation
  // rows and gives the shared memory it saves to its weight ring. A tile past the bound traps.
  std::int32_t rows_bound = 0;
};

// Which kernel runs a product: by row count and shape for speed (kAuto: few rows up to 16, or up
// to 128 when the output is narrow; else tiles; dense fp8 weights of wide outputs at 9 to
// kStreamMaxRows rows take the weight-streaming kernel), for steps with prompt tokens
// (kAutoPrefill: the same, but tiles instead of few rows past 16; with DSV4_GEMM_LIBRARY=1 in the
// environment, cuBLASLt's block-scaled product for dense fp8 weights where it can run them,
// gemm_library.h), or forced (tests and benchmarks compare them; kLibrary throws where cuBLASLt
// cannot run the product, see gemm_library_supports). cuBLASLt is opt-in because on 2026-12-02
// (H200, cuBLASLt 13.1) the GPU model test's layer-0 cache entries differed from the CPU
// executor's with it (up to 8 e4m3 steps) while the same products alone matched
// (GemmLibraryScales): not understood yet. kAuto never takes cuBLASLt: decode steps are captured
// into graphs whose row count is read on the device. gemm_bf16 and the expert products have no
// library path (kLibrary runs their tiles). kStream: the weight-streaming wgmma kernel for dense
// fp8 weights (gemm_stream.h; fp4 weights take the few-rows kernel there); the automatic choice
// of it is gemm.cu use_stream, from bench_gpu_gemm's measurements (docs/perf.md, 2026-12-07);
// DSV4_GEMM_STREAM=0 in the environment turns it off.
enum class GemmPath : std::int32_t { kAuto, kAutoPrefill, kFewRows, kTiles, kLibrary, kStream };

inline constexpr int kSmallRows = 8;    // rows the few-rows kernel takes at once
inline constexpr int kStreamMaxRows = 64;  // rows the weight-streaming kernel takes by choice
inline constexpr int kTileRows = 128;   // rows of a tensor-core tile

// The tile height to build expert tiles with, for `total_rows` routed rows over `experts`
// experts whose products are `w13` then `w2` (one tile map serves both): kSmallRows (few-rows
// kernel) when experts get few rows each; else kWgmmaExpertRows (gemm_experts_wgmma.h) where that
// kernel runs both weights, kTileRows otherwise.
int expert_tile_rows(std::int64_t total_rows, std::int64_t experts, const DeviceWeight& w13, const DeviceWeight& w2);

// codes/scales for rows [0, rows) of x (bf16 [rows][ld], the first k columns). `rows_dev`,
// when set, is a device count that limits the rows actually quantized (graph replay).
void quantize_activations(const std::uint16_t* x, std::int64_t ld, std::int64_t rows, std::int64_t k,
                          std::uint8_t* codes, float* scales, const std::int32_t* rows_dev, gpu_stream_t stream);

// Puts `matrices` fp4 weights of n x k, uploaded in checkpoint order (packed e2m1 [n][k/2], UE8M0
// [n][k/32], matrix after matrix), into the GPU layout the products read, in place:
//  - Within a row: each full 128-wide k unit (64 bytes, 16 words; word 4s + t holds k 32s + 8t ..
//    32s + 8t + 7) is stored with word 4s + t at 4t + s, a tail of k % 128 keeping its word order;
//    inside every word, value j (of the word's 8) sits in the low nibble of byte j and value j + 4
//    in its high nibble (the checkpoint packs values 2j, 2j + 1 into byte j).
//  - Tiled (fp4_tiled: k a multiple of 128 up to kFp4TiledMaxK, n of 16): rows go in groups of 16,
//    and a group's unit u is one 1,024-byte block (row r of the group at 64 r) after its units
//    0 .. u - 1, so a warp's rows of several units are one contiguous copy; the scales likewise,
//    the unit's four bytes of row r at 4 r of a 64-byte block. Otherwise the rows stay in order and
//    the scales are not touched.
// fp4_from_gpu_layout converts back.
inline constexpr std::int64_t kFp4TiledMaxK = 8192;
constexpr bool fp4_tiled(std::int64_t n, std::int64_t k) { return k % 128 == 0 && k <= kFp4TiledMaxK && n % 16 == 0; }
void fp4_to_gpu_layout(void* data, void* scales, std::int64_t matrices, std::int64_t n, std::int64_t k, gpu_stream_t stream);
void fp4_from_gpu_layout(void* data, void* scales, std::int64_t matrices, std::int64_t n, std::int64_t k, gpu_stream_t stream);
// Whether all `bytes` UE8M0 scale bytes at `scales` (device memory) are 1..254 (for
// DeviceWeight::fp4_scales_normal). Waits for the stream.
bool fp4_scales_normal(const void* scales, std::int64_t bytes, Stream& stream);

// Whether cuBLASLt's block-scaled product (GemmPath::kLibrary) can run `rows` rows against `w`
// into `out`: a dense fp8 weight with n a multiple of 128 and k of 512, bf16 output, 16-byte aligned, a
// build with cuBLASLt (not the simulator), and an algorithm for the shape (none for 1 row).
bool gemm_library_supports(std::int64_t rows, const DeviceWeight& w, const GemmOutput& out);
// Why the last gemm_library_supports that said no did (for test and benchmark reports).
std::string gemm_library_refusal();
// The scale layouts and row counts the library path found it can use (gemm_library.h).
std::string gemm_library_calibration();

// out[r] = W . dequant(a[r]) for rows [0, rows): fp8/fp4 weights only.
void gemm_quantized(const QuantizedRows& a, std::int64_t rows, const DeviceWeight& w, const GemmOutput& out,
                    const std::int32_t* rows_dev, gpu_stream_t stream, GemmPath path = GemmPath::kAuto);
// The same over expert-grouped rows (w holds the stacked experts). Its few-rows fp4 kernel is
// launched dependent (kernels/dependent_launch.cuh) and reads the tile map and starts its weight
// copies before waiting for the kernel launched just before it: the tile map must come from a
// kernel at least two launches back (or a copy), while the activations may come from the last one.
void gemm_quantized_experts(const QuantizedRows& a, const ExpertTiles& tiles, const DeviceWeight& w,
                            const GemmOutput& out, gpu_stream_t stream);

// out[r] = W . a[r] with bf16 activations a [rows][lda]; w bf16 or fp8 (used as its bf16
// values). groups > 1: the grouped product of wo_a -- group g multiplies activation columns
// [g * w.k, (g + 1) * w.k) with weight rows [g * n/groups, (g + 1) * n/groups) into output
// columns of the same range.
void gemm_bf16(const std::uint16_t* a, std::int64_t lda, std::int64_t rows, const DeviceWeight& w, int groups,
               const GemmOutput& out, const std::int32_t* rows_dev, gpu_stream_t stream,
               GemmPath path = GemmPath::kAuto);

// Few rows against a narrow bf16 weight (the MoE gate at decode: 256 or 384 outputs are 16 or 24
// CTAs of the few-rows kernel) leave most SMs idle. gemm_k_splits says into how many k ranges to
// split such a product (1: none, run gemm_bf16; at most kMaxKSplits, and only for rows up to
// kKSplitMaxRows); gemm_bf16_k_partials writes each range's fp32 partial product, partial p of
// row r and output c at out + p * split_stride + r * w.n + c. The sum of the partials in p order
// is the product (moe_route adds them).
inline constexpr int kMaxKSplits = 8;
inline constexpr std::int64_t kKSplitMaxRows = 64;
int gemm_k_splits(std::int64_t rows, const DeviceWeight& w);
void gemm_bf16_k_partials(const std::uint16_t* a, std::int64_t lda, std::int64_t rows, const DeviceWeight& w, int splits,
                          float* out, std::int64_t split_stride, const std::int32_t* rows_dev, gpu_stream_t stream);

}  // namespace dsv4::gpu
