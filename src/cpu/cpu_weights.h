// All weights of a model in the form the CPU reference ops take: linear layers dequantized
// exactly to fp32 (DenseWeight), small tensors as fp32 vectors. Loaded once from a bound
// checkpoint (model/model_weights.h checks names, dtypes and shapes first).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "cpu/dense_weight.h"
#include "cpu/moe.h"
#include "model/model_config.h"
#include "model/safetensors.h"

namespace dsv4 {

struct CpuHcWeights {
  std::vector<float> fn, base, scale;
};

struct CpuCompressorWeights {
  std::vector<float> ape;   // [r, coff*hd] fp32
  DenseWeight wkv, wgate;   // [coff*hd, D], used in fp32
  std::vector<float> norm;  // [hd]
};

struct CpuIndexerWeights {
  DenseWeight wq_b;          // [n_heads*hd, q_lora]
  DenseWeight weights_proj;  // [n_heads, D]
  CpuCompressorWeights compressor;
};

struct CpuExpertWeights {
  DenseWeight w1, w2, w3;
  ExpertWeights view() const { return {&w1, &w2, &w3}; }
};

struct CpuBlockWeights {
  std::int64_t layer = 0;
  std::int64_t ratio = 0;
  bool hash_routed = false;
  CpuHcWeights hc_attn, hc_ffn;
  std::vector<float> attn_norm, ffn_norm;
  std::vector<float> attn_sink, q_norm, kv_norm;
  DenseWeight wq_a, wq_b, wkv, wo_a, wo_b;
  std::optional<CpuCompressorWeights> compressor;  // ratio 4 or 128
  std::optional<CpuIndexerWeights> indexer;        // ratio 4
  DenseWeight gate;                                // [E, D], used in fp32
  std::vector<float> gate_bias;                    // score-routed layers
  std::vector<std::int64_t> tid2eid;               // hash layers: [vocab, top_k]
  std::vector<CpuExpertWeights> experts;
  CpuExpertWeights shared;
};

struct CpuMtpWeights {
  CpuBlockWeights block;
  DenseWeight e_proj, h_proj;
  std::vector<float> enorm, hnorm, norm;
  CpuHcWeights hc_head;
};

struct CpuModelWeights {
  std::vector<float> embed;  // [V, D] bf16 values
  DenseWeight head;          // [V, D], used in fp32
  std::vector<float> norm;
  CpuHcWeights hc_head;
  std::vector<CpuBlockWeights> blocks;
  std::vector<CpuMtpWeights> mtp;

  // Binds (bind_weights: every problem reported at once) and loads every tensor.
  static CpuModelWeights load(const ModelConfig& config, const Checkpoint& checkpoint);
};

}  // namespace dsv4
