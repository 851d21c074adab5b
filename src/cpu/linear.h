// Linear layers with the reference numerics (SPEC.md 5a; DeepSeek-V4 inference/model.py
// `linear` and kernel.py act_quant / fp8_gemm / fp4_gemm).
//
//   linear       dispatch on the weight kind:
//                fp8 / fp4: each input row (taken as bf16) is FP8-simulated in blocks of 128
//                  (simulate_quant_blocks, e4m3, power-of-two scales; a shorter last block when
//                  in % 128 != 0), then fp32 accumulation, output rounded to bf16;
//                bf16: bf16 input, fp32 accumulation, bf16 output;
//                f32: rejected (say what you mean: linear_f32, or round_weight_to_bf16 first).
//   linear_bf16  a bf16 GEMM whatever the storage (fp8 / fp4 / bf16 weights are bf16 values):
//                the grouped wo_a einsum, bf16 input, fp32 accumulation, bf16 output.
//   linear_f32   fp32 in, fp32 out, no rounding anywhere (compressor wkv/wgate, MoE gate, head).
//   linear_grouped_bf16  out[g] = W[g] . x[g] for G groups (wo_a viewed [G, o_lora, in]).
//
// Fixed reduction order, the same for every kind: the dot product over k runs in blocks of
// 128 inputs (32 for fp4 weights, the weight scale granularity the reference kernels apply per
// block); inside a block a sequential fp32 sum, then each block's partial sum is added to the
// fp32 total in order. With FP8 activations and fp8/fp4 weights every product is exact in fp32,
// so this is the reference kernels' "scaled partial sums per block" structure.
// Every output element is computed on its own: a row's result never depends on the other rows
// or on the thread pool (parallelism is over rows x output features only).
// Shapes: x [rows, in], out [rows, out], row-major; size mismatches throw std::invalid_argument.
//
// Implementation: the kernels read the weight's packed copy (DenseWeight::packed, k-major tiles
// of 16 output features) and vectorize across output features and rows, never across k: each
// output is still exactly the scalar blocked_dot below (tests/cpu/test_linear.cc checks this bit
// for bit). x86-64 builds pick AVX2 code at run time where the CPU has it, else SSE2 (GemmKernels).
#pragma once

#include <cstdint>
#include <span>

#include "common/thread_pool.h"
#include "cpu/dense_weight.h"

namespace dsv4 {

inline constexpr std::int64_t kActQuantBlock = 128;

// Which compiled kernels a call runs: kBest picks at run time (AVX2 where the CPU has it),
// kBaseline always runs the baseline code (SSE2 on x86-64). The results are the same bits either
// way; tests and benchmarks ask for kBaseline to compare the two.
enum class GemmKernels { kBest, kBaseline };

void linear(std::span<const float> x, std::int64_t rows, const DenseWeight& w, std::span<float> out,
            ThreadPool* pool = nullptr, GemmKernels kernels = GemmKernels::kBest);
void linear_bf16(std::span<const float> x, std::int64_t rows, const DenseWeight& w, std::span<float> out,
                 ThreadPool* pool = nullptr, GemmKernels kernels = GemmKernels::kBest);
void linear_f32(std::span<const float> x, std::int64_t rows, const DenseWeight& w, std::span<float> out,
                ThreadPool* pool = nullptr, GemmKernels kernels = GemmKernels::kBest);
// x [rows, groups * w.in], w [groups * o, w.in] (w.out divisible by groups), out [rows, w.out].
void linear_grouped_bf16(std::span<const float> x, std::int64_t rows, const DenseWeight& w, std::int64_t groups,
                         std::span<float> out, ThreadPool* pool = nullptr, GemmKernels kernels = GemmKernels::kBest);

// In place: one activation row rounded to bf16, then FP8-simulated in blocks of 128 (last block
// shorter when the size is not a multiple of 128). What linear() feeds an fp8/fp4 GEMM.
void fp8_simulate_activation(std::span<float> row);

// The fixed-order dot product described above: blocks of `block` values summed sequentially in
// fp32, block sums added in order.
float blocked_dot(const float* a, const float* b, std::int64_t n, std::int64_t block);

}  // namespace dsv4
