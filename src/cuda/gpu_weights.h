// GpuModelWeights: every weight of a V4 model in GPU memory, in the formats the kernels read
// (kernels/gemm.h DeviceWeight): dense projections stay e4m3 with their 128x128 scales widened to
// fp32; routed experts stay packed FP4 with their per-32 UE8M0 scales (w1 and w3 stacked into one
// [2 * inter, dim] matrix per expert, all experts of a layer in one array); bf16 linears, the
// embedding and the head stay bf16; norms and the small fp32 tensors are fp32 (norms rounded to
// bf16 values, as the CPU loader does). One device allocation holds everything.
//
// Two sources: a checkpoint directory as shipped (mmap, pinned staging, asynchronous copies,
// a progress line on stderr), or dummy values (vLLM's --load-format dummy) drawn on the GPU with a
// seed for any config's real shapes, for benchmarks. Either way the bytes needed are known before
// anything is allocated, and a model that does not fit fails with both numbers.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "cuda/kernels/gemm.h"
#include "cuda/kernels/hyper.h"
#include "cuda/runtime.h"
#include "model/model_config.h"
#include "model/safetensors.h"

namespace dsv4::gpu {

struct GpuCompressorWeights {
  const float* ape = nullptr;   // [r][coff * hd]
  DeviceWeight wkv, wgate;      // bf16 [coff * hd][D]
  const float* norm = nullptr;  // [hd]
};

struct GpuIndexerWeights {
  DeviceWeight wq_b;           // fp8 [heads * 128][q_lora]
  DeviceWeight weights_proj;   // bf16 [heads][D]
  GpuCompressorWeights compressor;
};

struct GpuBlockWeights {
  std::int64_t layer = 0;
  std::int64_t ratio = 0;
  bool hash_routed = false;
  HcWeights hc_attn, hc_ffn;
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  const float* attn_sink = nullptr;
  const float* q_norm = nullptr;
  const float* kv_norm = nullptr;
  DeviceWeight wq_a, wq_b, wkv, wo_a, wo_b;
  std::optional<GpuCompressorWeights> compressor;
  std::optional<GpuIndexerWeights> indexer;
  DeviceWeight gate;                        // bf16 [E][D]
  const float* gate_bias = nullptr;         // score-routed layers
  const std::int32_t* tid2eid = nullptr;    // hash layers [V][k]
  DeviceWeight experts_w13;                 // [E] x [2 * inter][D]
  DeviceWeight experts_w2;                  // [E] x [D][inter]
  DeviceWeight shared_w1, shared_w2, shared_w3;
};

struct GpuMtpWeights {
  GpuBlockWeights block;
  DeviceWeight e_proj, h_proj;
  const float* enorm = nullptr;
  const float* hnorm = nullptr;
  const float* norm = nullptr;
  HcWeights hc_head;
};

struct GpuModelWeights {
  const std::uint16_t* embed = nullptr;  // [V][D] bf16
  DeviceWeight head;                     // bf16 [V][D]
  const float* norm = nullptr;
  HcWeights hc_head;
  std::vector<GpuBlockWeights> blocks;
  std::vector<GpuMtpWeights> mtp;
  DeviceBuffer memory;                   // everything above points into it
  std::int64_t bytes = 0;

  // The bytes load() / dummy() allocate for `config`.
  static std::int64_t required_bytes(const ModelConfig& config);
  // Binds the checkpoint (every problem reported at once) and uploads it; fails before
  // allocating when the weights need more than `budget_bytes`.
  static GpuModelWeights load(const ModelConfig& config, const Checkpoint& checkpoint, std::int64_t budget_bytes,
                              bool progress);
  // Deterministic random weights of the config's shapes, drawn on the GPU.
  static GpuModelWeights dummy(const ModelConfig& config, std::uint64_t seed, std::int64_t budget_bytes);
};

}  // namespace dsv4::gpu
