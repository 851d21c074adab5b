// The attention inputs of a layer, finished in one launch (SPEC.md 3.2 steps 1-2, 7c): every
// query head normalised without a weight in bf16 arithmetic and rotated (RoPE on its last 64
// dims), and the shared kv normalised (kv_norm), rotated, and written to its window-cache slot
// (fp8: e4m3 no-rope dims in blocks of 64 with UE8M0 scales + bf16 rope dims; bf16: the
// FP8-simulated values). CPU twins: cpu/rms_norm.h head_rms_norm_bf16, numerics/rope.h,
// cpu/cache_codec.h encode_main_kv.
#pragma once

#include <cstdint>

#include "cuda/device_step.h"
#include "cuda/stream_handle.h"

namespace dsv4::gpu {

struct QkvArgs {
  const DeviceStep* step = nullptr;
  std::int32_t capacity = 0;      // grid rows (>= the step's tokens)
  bool compressed_rope = false;   // the layer's table: step->rope_compressed, else rope_window
  std::uint16_t* q = nullptr;     // [tokens][heads][512] bf16, finished in place
  std::int32_t heads = 0;
  std::uint16_t* kv = nullptr;    // [tokens][512] bf16 (wkv output), finished in place
  const float* kv_norm = nullptr; // [512]
  float eps = 1e-6f;
  std::int32_t window_group = 0;  // index into step->groups
  std::int32_t layer_slot = 0;    // this layer's page within a window block
  bool kv_fp8 = true;             // main-KV cache dtype
};

void finish_q_and_window_kv(const QkvArgs& args, gpu_stream_t stream);

}  // namespace dsv4::gpu
