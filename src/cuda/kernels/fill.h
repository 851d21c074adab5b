// Deterministic pseudo-random fills of device memory, for dummy weights (vLLM's
// --load-format dummy) and for the GPU tests' inputs. Each element is a hash of (seed, index):
// the same values whatever the launch shape.
#pragma once

#include <cstdint>

#include "cuda/stream_handle.h"

namespace dsv4::gpu {

// Uniform in [lo, hi): fp32, or bf16 (rounded).
void fill_uniform_f32(float* dst, std::int64_t n, std::uint64_t seed, float lo, float hi, gpu_stream_t stream);
void fill_uniform_bf16(std::uint16_t* dst, std::int64_t n, std::uint64_t seed, float lo, float hi, gpu_stream_t stream);
// e4m3 codes of uniform values in (-448, 448) (never NaN); packed e2m1 bytes (any nibble).
void fill_fp8_codes(std::uint8_t* dst, std::int64_t n, std::uint64_t seed, gpu_stream_t stream);
void fill_fp4_bytes(std::uint8_t* dst, std::int64_t n, std::uint64_t seed, gpu_stream_t stream);
void fill_const_f32(float* dst, std::int64_t n, float value, gpu_stream_t stream);
void fill_const_u8(std::uint8_t* dst, std::int64_t n, std::uint8_t value, gpu_stream_t stream);
// Bytes uniform in [lo, hi].
void fill_bytes_in_range(std::uint8_t* dst, std::int64_t n, std::uint64_t seed, std::uint8_t lo, std::uint8_t hi,
                         gpu_stream_t stream);
// rows x k expert ids in [0, experts): row r gets k distinct ids (when k <= experts).
void fill_expert_ids(std::int32_t* dst, std::int64_t rows, std::int32_t k, std::int32_t experts, std::uint64_t seed,
                     gpu_stream_t stream);

}  // namespace dsv4::gpu
