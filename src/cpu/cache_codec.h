// The bytes of one cache entry (kvcache/entry_layout.h) from the values the model computes,
// and back. The executor writes every kv vector, compressed entry and indexer key through
// encode_* and reads every key it attends to through decode_*, so the cache is the only
// place a value travels between tokens and steps -- which is what makes chunked prefill,
// decode, batching and prefix hits reproduce one-shot prefill exactly.
//
// The input of an encoder is the value *before* the reference's simulated quantization (the
// kv after RoPE; the indexer key after the Hadamard transform); the decoder returns the value
// *after* it (SPEC.md 3.2 step 2, 3.3, 5):
//   main KV  fp8:  nope dims quantized to e4m3 in blocks of 64 (UE8M0 scales), rope dims bf16.
//                  Lossless with respect to the reference's FP8 simulation.
//            bf16: the FP8-simulated nope dims and the rope dims as bf16. Also lossless.
//   indexer  fp4:  e2m1 in blocks of 32 (UE8M0 scales). Lossless w.r.t. the FP4 simulation.
//            bf16: the FP4-simulated key as bf16. Lossless.
//            fp8:  the FP4-simulated key re-quantized to e4m3 with one power-of-two fp32 scale
//                  per 128 dims. Lossy when the key's 32-blocks differ in scale by more than
//                  e4m3's range covers (deviation documented; fp4 is the faithful choice).
// Encoding quantizes the pre-simulation values, as a fused GPU kernel does, so both write
// the same bytes.
#pragma once

#include <cstdint>
#include <span>

#include "kvcache/cache_spec.h"

namespace dsv4 {

// kv [head_dim] -> entry data (EntryFormat::data_bytes) and scales (scale_bytes).
void encode_main_kv(std::span<const float> kv, std::int64_t rope_dim, KvCacheDtype dtype, std::uint8_t* data,
                    std::uint8_t* scales);
void decode_main_kv(const std::uint8_t* data, const std::uint8_t* scales, std::int64_t rope_dim, KvCacheDtype dtype,
                    std::span<float> kv);

// key [index_head_dim] (after the Hadamard transform) -> entry.
void encode_indexer_key(std::span<const float> key, IndexerCacheDtype dtype, std::uint8_t* data,
                        std::uint8_t* scales);
void decode_indexer_key(const std::uint8_t* data, const std::uint8_t* scales, IndexerCacheDtype dtype,
                        std::span<float> key);

}  // namespace dsv4
