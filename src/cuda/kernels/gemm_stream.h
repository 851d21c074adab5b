// The weight-streaming product of dense fp8 weights for decode-sized row counts (gemm.h
// GemmPath::kStream; the executor takes it at 9 to 64 rows of wide outputs, gemm.cu use_stream).
// Numerics as the other fp8 kernels (SPEC.md 5a) -- e4m3 activations with one scale per row and 128
// k, sums per 128-wide k unit scaled by (activation scale x 128 x 128 weight block scale) and added
// unit by unit in fp32, bf16 or fp32 output. The products run as f16 wgmma on the exact f16 values
// of the e4m3 codes: FP8 wgmma sums with fewer bits than fp32 (about 1e-4 relative on the H200,
// docs/perf.md), f16 wgmma in fp32. CPU twin: cpu/linear.h linear(). An opt-in FP8 form
// (StreamProducts below) runs the reference's own arithmetic instead.
//
// How (gemm_stream.cu): at a handful of rows the product is bound by reading the weight once. A CTA
// is two warpgroups sharing the activations of a range of k units (a split) x up to 64 activation
// rows (a token block), staged once as f16; each warpgroup takes its own 64-row weight tiles. The
// weight goes from global memory into registers, kDepth units of 64 x 128 ahead, and each thread
// converts its own values to f16 as the A operand of wgmma m64nNk16 f16 (A from registers; N = 8 /
// 16 / 32 / 64 activation rows): the weight never passes through shared memory. Both operands take
// the same order of k inside a unit, so that a thread's A values of a k16 step are one 32-bit word
// of a row. Where the tiles alone leave the GPU short of warpgroups, k is split over CTAs: each
// writes its fp32 partial tile to a workspace, and the last of a tile's warpgroups to arrive (an
// atomic count) adds the partials in split order -- the same bits whatever order they ran in.
#pragma once

#include <cstdint>

#include "cuda/kernels/gemm.h"

namespace dsv4::gpu {

// How the products run: f16 wgmma on the codes' exact f16 values, summed in fp32 (the CPU
// executor's block sums); or FP8 wgmma on the codes, each 128-wide block a chain of four k32
// products summed as the tensor core sums (the reference's fp8_gemm arithmetic,
// numerics/fp8_dot_model.h; GpuOps.GemmStreamFp8Products compares it bit for bit with that model).
enum class StreamProducts { kF16, kFp8 };
// kFp8 with DSV4_GEMM_STREAM_FP8=1 in the environment (read once), else kF16: the executor's choice
// until the FP8 form is measured.
StreamProducts stream_products();

// The 128-wide units of k each CTA's split takes in gemm_stream_fp8's plan for such a product (the
// partial sums of the splits are added in split order: tests that rebuild the sums need it).
int gemm_stream_units_per_split(std::int64_t rows, const DeviceWeight& w, const GemmOutput& out,
                                StreamProducts products);

// out[r] = W . dequant(a[r]) for rows [0, rows) of a dense fp8 weight (k a multiple of 32).
void gemm_stream_fp8(const QuantizedRows& a, std::int64_t rows, const DeviceWeight& w, const GemmOutput& out,
                     const std::int32_t* rows_dev, gpu_stream_t stream, StreamProducts products = stream_products());

// The split-K workspace of one stream (gemm_stream_workspace.cc): at least `partial_floats` fp32
// partials and `counters` arrival counts, the counts zero between products (each product's last
// CTAs put theirs back to zero). Grows (after a device synchronization) when a product needs more,
// so the first product of a shape must not run inside a stream capture; the executor runs every
// graph's step once eagerly first.
struct StreamWorkspace {
  float* partial = nullptr;
  std::int32_t* counters = nullptr;
};
StreamWorkspace stream_workspace(gpu_stream_t stream, std::int64_t partial_floats, std::int64_t counters);
// Multiprocessors of the current device (cached).
int stream_sm_count();

}  // namespace dsv4::gpu
