// ModelConfig: every field of a DeepSeek-V4 config.json (SPEC.md section 1), read from
// the Hugging Face keys, validated, and never hard-coded: Flash, Pro and scaled-down
// test models differ only here.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "common/json_io.h"

namespace dsv4 {

struct RopeScaling {
  std::string type = "yarn";
  double factor = 1.0;
  std::int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
};

struct QuantizationConfig {
  std::string quant_method = "fp8";
  std::string fmt = "e4m3";
  std::string scale_fmt = "ue8m0";
  std::string activation_scheme = "dynamic";
  std::int64_t weight_block_rows = 128;
  std::int64_t weight_block_cols = 128;
};

// What a layer's attention reads besides its window (SPEC.md 3.2).
enum class AttentionKind { kWindow = 0, kCsa = 4, kHca = 128 };

struct ModelConfig {
  std::int64_t hidden_size = 0;               // D
  std::int64_t num_hidden_layers = 0;
  std::int64_t num_nextn_predict_layers = 0;  // MTP blocks
  std::int64_t vocab_size = 0;
  std::int64_t num_attention_heads = 0;       // H
  std::int64_t num_key_value_heads = 1;
  std::int64_t head_dim = 0;                  // d = 512
  std::int64_t qk_rope_head_dim = 0;          // rd = 64, the last dims of a head
  std::int64_t q_lora_rank = 0;
  std::int64_t o_groups = 0;                  // G
  std::int64_t o_lora_rank = 0;
  std::int64_t sliding_window = 0;            // win = 128
  std::int64_t index_n_heads = 0;
  std::int64_t index_head_dim = 0;
  std::int64_t index_topk = 0;
  double rope_theta = 0;
  double compress_rope_theta = 0;
  RopeScaling rope_scaling;
  std::int64_t max_position_embeddings = 0;
  double rms_norm_eps = 0;
  double hc_eps = 0;
  std::int64_t n_routed_experts = 0;
  std::int64_t n_shared_experts = 0;
  std::int64_t num_experts_per_tok = 0;
  std::int64_t moe_intermediate_size = 0;
  std::string scoring_func;
  double routed_scaling_factor = 0;
  std::int64_t num_hash_layers = 0;
  double swiglu_limit = 0;
  std::int64_t hc_mult = 0;
  std::int64_t hc_sinkhorn_iters = 0;
  std::string expert_dtype;                   // "fp4" (packed e2m1) or "fp8"
  QuantizationConfig quantization;
  std::int64_t bos_token_id = 0;
  std::int64_t eos_token_id = 0;
  bool tie_word_embeddings = false;
  // One entry per decoder layer, then one per MTP block: 0, 4 or 128.
  std::vector<std::int64_t> compress_ratios;

  // Parses and validates; errors name the field and `where` (the file).
  static ModelConfig from_json(const Json& json, const std::string& where);
  static ModelConfig from_file(const std::filesystem::path& path);
  Json to_json() const;  // the Hugging Face config.json form, readable by from_json

  // Derived values.
  std::int64_t compress_ratio(std::int64_t layer) const;  // layer < num_hidden_layers + MTP
  AttentionKind attention_kind(std::int64_t layer) const;
  bool is_hash_layer(std::int64_t layer) const { return layer < num_hash_layers; }
  std::int64_t num_blocks_total() const { return num_hidden_layers + num_nextn_predict_layers; }
  std::int64_t nope_head_dim() const { return head_dim - qk_rope_head_dim; }  // 448
  std::int64_t layers_of_ratio(std::int64_t ratio) const;  // main layers only
};

}  // namespace dsv4
