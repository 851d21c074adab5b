// The KV compressors of CSA / HCA layers and of the lightning indexer on the GPU (SPEC.md 3.3,
// 7a). CPU twins: cpu/compressor.h (compressor_project, compressor_pool, compressor_finish) and
// cpu/cache_codec.h (encode_main_kv, encode_indexer_key).
//
//   finish_compressor_state   after the wkv / wgate products wrote a_t and g_t (without ape)
//                             into the step's state rows [tokens][2 * pd]: adds ape[t mod r] to
//                             g_t and stores the rows the plan gives a state-cache slot.
//   write_compressed_entries  one block per entry the step completes: pools its 8 (ratio 4) or
//                             128 (ratio 128) positions per channel (softmax of the scores over
//                             the slots, in the CPU's order), then bf16, RMSNorm, RoPE at j*r,
//                             and (indexer) the Hadamard transform, and writes the entry to its
//                             compressed-cache slot, quantizing once.
#pragma once

#include <cstdint>

#include "cuda/device_step.h"
#include "cuda/stream_handle.h"

namespace dsv4::gpu {

enum class CompressorTarget : std::int32_t { kMainKv, kIndexerKey };
enum class IndexerFormat : std::int32_t { kBf16, kFp8, kFp4 };

struct CompressorArgs {
  const DeviceStep* step = nullptr;
  std::int32_t capacity = 0;        // tokens the grid covers
  std::int32_t ratio = 4;
  std::int32_t head_dim = 512;      // hd: 512 (attention) or 128 (indexer)
  float* state = nullptr;           // [tokens][2 * pd], pd = coff * hd
  const float* ape = nullptr;       // [ratio][pd]
  std::int32_t state_group = 0;     // index into step->groups
  std::int32_t state_index = 0;     // 0: the attention compressor's state slots, 1: the indexer's
  std::int32_t state_layer_slot = 0;
  // write_compressed_entries only:
  const float* norm = nullptr;      // [hd]
  float eps = 1e-6f;
  std::int32_t entry_group = 0;
  std::int32_t entry_layer_slot = 0;
  CompressorTarget target = CompressorTarget::kMainKv;
  bool kv_fp8 = true;               // main-KV cache dtype (kMainKv)
  IndexerFormat index_format = IndexerFormat::kFp4;  // (kIndexerKey)
};

void finish_compressor_state(const CompressorArgs& args, gpu_stream_t stream);
// max_writes: grid bound (>= the plan's writes for this ratio).
void write_compressed_entries(const CompressorArgs& args, std::int32_t max_writes, gpu_stream_t stream);

}  // namespace dsv4::gpu
