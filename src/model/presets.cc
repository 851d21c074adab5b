#include "model/presets.h"

#include <fmt/ranges.h>

#include "common/error.h"

namespace dsv4 {
namespace {

// Fields shared by both published models (SPEC.md section 1).
ModelConfig v4_common() {
  ModelConfig c;
  c.num_nextn_predict_layers = 1;
  c.vocab_size = 129280;
  c.num_key_value_heads = 1;
  c.head_dim = 512;
  c.qk_rope_head_dim = 64;
  c.o_lora_rank = 1024;
  c.sliding_window = 128;
  c.index_n_heads = 64;
  c.index_head_dim = 128;
  c.rope_theta = 10000;
  c.compress_rope_theta = 160000;
  c.rope_scaling = {"yarn", 16, 65536, 32, 1};
  c.max_position_embeddings = 1048576;
  c.rms_norm_eps = 1e-6;
  c.hc_eps = 1e-6;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 6;
  c.scoring_func = "sqrtsoftplus";
  c.num_hash_layers = 3;
  c.swiglu_limit = 10.0;
  c.hc_mult = 4;
  c.hc_sinkhorn_iters = 20;
  c.expert_dtype = "fp4";
  c.bos_token_id = 0;
  c.eos_token_id = 1;
  return c;
}

// `leading` window-or-HCA layers, then CSA on even and HCA on odd layers, then MTP (0).
std::vector<std::int64_t> alternating_ratios(std::int64_t layers, std::int64_t leading_ratio) {
  std::vector<std::int64_t> r;
  for (std::int64_t i = 0; i < layers; ++i) r.push_back(i < 2 ? leading_ratio : (i % 2 == 0 ? 4 : 128));
  r.push_back(0);
  return r;
}

}  // namespace

ModelConfig v4_flash_config() {
  ModelConfig c = v4_common();
  c.hidden_size = 4096;
  c.num_hidden_layers = 43;
  c.num_attention_heads = 64;
  c.q_lora_rank = 1024;
  c.o_groups = 8;
  c.index_topk = 512;
  c.n_routed_experts = 256;
  c.moe_intermediate_size = 2048;
  c.routed_scaling_factor = 1.5;
  c.compress_ratios = alternating_ratios(43, 0);
  return c;
}

ModelConfig v4_pro_config() {
  ModelConfig c = v4_common();
  c.hidden_size = 7168;
  c.num_hidden_layers = 61;
  c.num_attention_heads = 128;
  c.q_lora_rank = 1536;
  c.o_groups = 16;
  c.index_topk = 1024;
  c.n_routed_experts = 384;
  c.moe_intermediate_size = 3072;
  c.routed_scaling_factor = 2.5;
  c.compress_ratios = alternating_ratios(61, 128);
  return c;
}

// Small enough for fast CPU runs, but every structural feature is present:
// layer 0 window-only + hash-routed, 1 CSA, 2 HCA, 3 CSA, then one MTP block. The head
// dims keep the production values (512 / 64 / 128) so the cache entry formats are the real
// ones; index_topk 8 is far below the 75 compressed blocks of a 300-token prompt.
ModelConfig tiny_config() {
  ModelConfig c = v4_common();
  c.hidden_size = 256;
  c.num_hidden_layers = 4;
  c.vocab_size = 4096;
  c.num_attention_heads = 4;
  c.q_lora_rank = 128;
  c.o_groups = 2;
  c.o_lora_rank = 128;
  c.index_n_heads = 4;
  c.index_topk = 8;
  c.n_routed_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 128;
  c.routed_scaling_factor = 1.5;
  c.num_hash_layers = 1;
  c.max_position_embeddings = 65536;
  c.compress_ratios = {0, 4, 128, 4, 0};
  return c;
}

std::vector<std::string> preset_names() { return {"flash", "pro", "tiny"}; }

ModelConfig preset_config(std::string_view name) {
  if (name == "flash") return v4_flash_config();
  if (name == "pro") return v4_pro_config();
  if (name == "tiny") return tiny_config();
  fail("unknown preset '{}'; known presets: {}", name, fmt::join(preset_names(), ", "));
}

}  // namespace dsv4
