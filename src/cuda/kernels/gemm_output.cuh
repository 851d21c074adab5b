// Where the GEMM kernels write a value (gemm.h GemmOutput): fp32, or bf16 rounded to nearest even.
#pragma once

#include <cstdint>

#include "cuda/device.h"
#include "cuda/kernels/gemm.h"
#include "cuda/kernels/numerics.cuh"

namespace dsv4::gpu {

__device__ __forceinline__ void store_out(const GemmOutput& out, std::int64_t row, std::int64_t col, float v) {
  if (out.f32) {
    static_cast<float*>(out.data)[row * out.ld + col] = v;
  } else {
    store_bf16(static_cast<std::uint16_t*>(out.data) + row * out.ld + col, v);
  }
}

}  // namespace dsv4::gpu
