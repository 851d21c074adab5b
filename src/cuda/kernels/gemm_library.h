// cuBLASLt's block-scaled FP8 matrix product, the prefill path of dense fp8 weights (gemm.h picks
// it). The same numerics as the project's own kernels (SPEC.md 5a): e4m3 activations with one fp32
// scale per row and 128 values of k, e4m3 weights with one fp32 scale per 128 x 128 block, fp32
// accumulation, bf16 output. cuBLASLt computes out^T = W . X^T ("TN": the weight [n][k] is its
// transposed A, the activations [rows][k] its B) with BLK128x128_32F weight scales and
// VEC128_32F activation scales, in the layouts this cuBLASLt reads (Layouts: checked, not
// assumed -- a wrong layout silently gives wrong products).
//
// Built with cuBLASLt only in the real GPU build; the simulator build has no cuBLASLt (available()
// is false there and gemm.h keeps its own kernels). A handle, a workspace per stream and one plan
// per shape (cuBLASLt's first heuristic choice, kept so a shape always runs the same algorithm:
// repeated steps give identical bits) live for the whole process. The first find_plan must not
// run inside a stream capture (it runs and checks a small product, see Layouts).
#pragma once

#include <cstdint>
#include <string>

#include "cuda/kernels/gemm.h"

namespace dsv4::gpu::cublaslt {

// True when cuBLASLt is compiled in.
bool available();

// The plan for `rows` activation rows against weight `w` writing `out`, or null when cuBLASLt
// cannot run it: no cuBLASLt, a weight that is not fp8 or with n not a multiple of 128 or k not a
// multiple of 512 (whole 16-byte rows of weight scales), fp32
// output, unaligned pointers or strides, or no algorithm (cuBLASLt 13 has none for 1 row).
struct Plan;
const Plan* find_plan(std::int64_t rows, const DeviceWeight& w, const GemmOutput& out);
// Why the last find_plan without a plan had none (tests and benchmarks print it).
std::string last_refusal();

// The scale layouts cuBLASLt reads: activation scales [k/128][rows] (act_k_major) or as
// quantized, [rows][k/128]; weight scales as stored, [n/128][k/128], or transposed. Found once
// per process (the first find_plan) by a small product with distinct scales per row and block
// checked against the exact result; a cuBLASLt that matches none is not used.
struct Layouts {
  bool act_k_major = true;
  bool weight_transposed = false;
};
Layouts layouts();
// What the calibration found (or why cuBLASLt is not used), for reports.
std::string calibration();

// Device memory for rearranged scales of one product on `stream` (at least `floats` floats):
// valid until the next call with the same stream, which happens after the product is launched
// (the stream orders its use).
float* scale_scratch(gpu_stream_t stream, std::int64_t floats);

// Launches the product on `stream`: codes [rows][k] e4m3, the scales in layouts().
void run(const Plan& plan, const std::uint8_t* codes, const float* act_scales, const float* weight_scales,
         const DeviceWeight& w, const GemmOutput& out, gpu_stream_t stream);

}  // namespace dsv4::gpu::cublaslt
