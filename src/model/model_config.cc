#include "model/model_config.h"

#include <fmt/ranges.h>

#include <limits>

#include "common/error.h"
#include "common/json_reader.h"

namespace dsv4 {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// config.json as Hugging Face exports it: integers may be written as 65536.0; null is a value
// (and so the wrong type for every field).
constexpr JsonRules kConfigRules{.null_is_absent = false, .integral_floats = true};

double positive(const JsonObject& o, std::string_view key) { return o.number(key, 0, kInf, /*min_open=*/true); }

std::vector<std::int64_t> integers(const JsonObject& o, std::string_view key) {
  std::vector<std::int64_t> out;
  for (const JsonField& item : o.array(key)) out.push_back(item.integer());
  return out;
}

bool is_power_of_two(std::int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// Cross-field rules the math of SPEC.md needs. Collects every problem, then throws once.
void validate(const ModelConfig& c, const std::string& where) {
  std::vector<std::string> problems;
  auto require = [&](bool ok, std::string message) {
    if (!ok) problems.push_back(std::move(message));
  };
  std::int64_t expected_ratios = c.num_hidden_layers + c.num_nextn_predict_layers;
  require(static_cast<std::int64_t>(c.compress_ratios.size()) == expected_ratios,
          fmt::format("'compress_ratios' has {} entries, expected num_hidden_layers + "
                      "num_nextn_predict_layers = {}",
                      c.compress_ratios.size(), expected_ratios));
  for (std::size_t i = 0; i < c.compress_ratios.size(); ++i) {
    std::int64_t r = c.compress_ratios[i];
    require(r == 0 || r == 4 || r == 128,
            fmt::format("'compress_ratios[{}]' = {}, expected 0, 4 or 128", i, r));
    if (static_cast<std::int64_t>(i) >= c.num_hidden_layers)
      require(r == 0, fmt::format("'compress_ratios[{}]' = {} belongs to an MTP block, which is window-only (0)", i, r));
  }
  require(c.num_key_value_heads == 1,
          fmt::format("'num_key_value_heads' = {}, V4 attention shares one KV head", c.num_key_value_heads));
  require(c.qk_rope_head_dim > 0 && c.qk_rope_head_dim % 2 == 0 && c.qk_rope_head_dim < c.head_dim,
          fmt::format("'qk_rope_head_dim' = {} must be even and smaller than 'head_dim' = {}", c.qk_rope_head_dim,
                      c.head_dim));
  require(c.nope_head_dim() % 64 == 0,
          fmt::format("'head_dim' - 'qk_rope_head_dim' = {} must be a multiple of 64 (FP8 kv blocks)",
                      c.nope_head_dim()));
  require(c.o_groups > 0 && c.num_attention_heads % c.o_groups == 0,
          fmt::format("'num_attention_heads' = {} must be divisible by 'o_groups' = {}", c.num_attention_heads,
                      c.o_groups));
  require(is_power_of_two(c.index_head_dim) && c.index_head_dim >= c.qk_rope_head_dim,
          fmt::format("'index_head_dim' = {} must be a power of two (Hadamard) of at least 'qk_rope_head_dim'",
                      c.index_head_dim));
  require(c.index_head_dim % 32 == 0, fmt::format("'index_head_dim' = {} must be a multiple of 32 (FP4 blocks)",
                                                  c.index_head_dim));
  require(c.hidden_size % 128 == 0,
          fmt::format("'hidden_size' = {} must be a multiple of 128 (FP8 activation blocks)", c.hidden_size));
  require(c.q_lora_rank % 128 == 0, fmt::format("'q_lora_rank' = {} must be a multiple of 128", c.q_lora_rank));
  require(c.o_lora_rank % 128 == 0, fmt::format("'o_lora_rank' = {} must be a multiple of 128", c.o_lora_rank));
  require(c.moe_intermediate_size % 128 == 0,
          fmt::format("'moe_intermediate_size' = {} must be a multiple of 128", c.moe_intermediate_size));
  require(c.num_experts_per_tok <= c.n_routed_experts,
          fmt::format("'num_experts_per_tok' = {} exceeds 'n_routed_experts' = {}", c.num_experts_per_tok,
                      c.n_routed_experts));
  require(c.num_hash_layers <= c.num_hidden_layers,
          fmt::format("'num_hash_layers' = {} exceeds 'num_hidden_layers' = {}", c.num_hash_layers,
                      c.num_hidden_layers));
  require(c.n_shared_experts == 1,
          fmt::format("'n_shared_experts' = {}, the V4 block has exactly one shared expert", c.n_shared_experts));
  require(c.scoring_func == "sqrtsoftplus",
          fmt::format("'scoring_func' = \"{}\", only \"sqrtsoftplus\" is V4's", c.scoring_func));
  require(c.expert_dtype == "fp4" || c.expert_dtype == "fp8",
          fmt::format("'expert_dtype' = \"{}\", expected \"fp4\" or \"fp8\"", c.expert_dtype));
  require(c.rope_scaling.type == "yarn",
          fmt::format("'rope_scaling.type' = \"{}\", expected \"yarn\"", c.rope_scaling.type));
  require(c.rope_scaling.beta_fast > c.rope_scaling.beta_slow,
          "'rope_scaling.beta_fast' must be larger than 'rope_scaling.beta_slow'");
  const auto& q = c.quantization;
  require(q.quant_method == "fp8", fmt::format("'quantization_config.quant_method' = \"{}\", expected \"fp8\"",
                                               q.quant_method));
  require(q.fmt == "e4m3", fmt::format("'quantization_config.fmt' = \"{}\", expected \"e4m3\"", q.fmt));
  require(q.scale_fmt == "ue8m0",
          fmt::format("'quantization_config.scale_fmt' = \"{}\", expected \"ue8m0\"", q.scale_fmt));
  require(q.weight_block_rows == 128 && q.weight_block_cols == 128,
          fmt::format("'quantization_config.weight_block_size' = [{}, {}], expected [128, 128]", q.weight_block_rows,
                      q.weight_block_cols));
  require(c.bos_token_id < c.vocab_size && c.eos_token_id < c.vocab_size,
          fmt::format("'bos_token_id' {} / 'eos_token_id' {} must be below 'vocab_size' {}", c.bos_token_id,
                      c.eos_token_id, c.vocab_size));
  if (!problems.empty()) fail("{}: inconsistent config:\n  {}", where, fmt::join(problems, "\n  "));
}

}  // namespace

ModelConfig ModelConfig::from_json(const Json& json, const std::string& where) {
  const JsonObject f(json, where, kConfigRules);
  constexpr std::int64_t kBig = std::int64_t{1} << 40;
  ModelConfig c;
  c.hidden_size = f.integer("hidden_size", 1, 1 << 20);
  c.num_hidden_layers = f.integer("num_hidden_layers", 1, 4096);
  c.num_nextn_predict_layers = f.integer("num_nextn_predict_layers", 0, 64);
  c.vocab_size = f.integer("vocab_size", 2, 1 << 24);
  c.num_attention_heads = f.integer("num_attention_heads", 1, 4096);
  c.num_key_value_heads = f.integer("num_key_value_heads", 1, 4096);
  c.head_dim = f.integer("head_dim", 1, 1 << 16);
  c.qk_rope_head_dim = f.integer("qk_rope_head_dim", 2, 1 << 16);
  c.q_lora_rank = f.integer("q_lora_rank", 1, 1 << 20);
  c.o_groups = f.integer("o_groups", 1, 4096);
  c.o_lora_rank = f.integer("o_lora_rank", 1, 1 << 20);
  c.sliding_window = f.integer("sliding_window", 1, 1 << 20);
  c.index_n_heads = f.integer("index_n_heads", 1, 4096);
  c.index_head_dim = f.integer("index_head_dim", 1, 1 << 16);
  c.index_topk = f.integer("index_topk", 1, 1 << 24);
  c.rope_theta = positive(f, "rope_theta");
  c.compress_rope_theta = positive(f, "compress_rope_theta");
  {
    const JsonObject r = f.object("rope_scaling");
    if (r.has("type")) {
      c.rope_scaling.type = r.string("type");
    } else if (r.has("rope_type")) {
      c.rope_scaling.type = r.string("rope_type");
    } else {
      fail("{}: missing field 'rope_scaling.type' (or 'rope_scaling.rope_type')", where);
    }
    c.rope_scaling.factor = positive(r, "factor");
    c.rope_scaling.original_max_position_embeddings = r.integer("original_max_position_embeddings", 1, kBig);
    c.rope_scaling.beta_fast = positive(r, "beta_fast");
    c.rope_scaling.beta_slow = positive(r, "beta_slow");
  }
  c.max_position_embeddings = f.integer("max_position_embeddings", 1, kBig);
  c.rms_norm_eps = positive(f, "rms_norm_eps");
  c.hc_eps = positive(f, "hc_eps");
  c.n_routed_experts = f.integer("n_routed_experts", 1, 1 << 16);
  c.n_shared_experts = f.integer("n_shared_experts", 0, 64);
  c.num_experts_per_tok = f.integer("num_experts_per_tok", 1, 1 << 16);
  c.moe_intermediate_size = f.integer("moe_intermediate_size", 1, 1 << 20);
  c.scoring_func = f.string("scoring_func");
  c.routed_scaling_factor = positive(f, "routed_scaling_factor");
  c.num_hash_layers = f.integer("num_hash_layers", 0, 4096);
  c.swiglu_limit = positive(f, "swiglu_limit");
  c.hc_mult = f.integer("hc_mult", 1, 64);
  c.hc_sinkhorn_iters = f.integer("hc_sinkhorn_iters", 1, 1000);
  c.expert_dtype = f.string("expert_dtype");
  {
    const JsonObject q = f.object("quantization_config");
    c.quantization.quant_method = q.string("quant_method");
    c.quantization.fmt = q.string("fmt");
    c.quantization.scale_fmt = q.string("scale_fmt");
    c.quantization.activation_scheme = q.optional_string("activation_scheme").value_or("dynamic");
    const std::vector<std::int64_t> block = integers(q, "weight_block_size");
    if (block.size() != 2)
      fail("{}: field 'quantization_config.weight_block_size' must have 2 entries, found {}", where, block.size());
    c.quantization.weight_block_rows = block[0];
    c.quantization.weight_block_cols = block[1];
  }
  c.bos_token_id = f.integer("bos_token_id", 0, 1 << 24);
  c.eos_token_id = f.integer("eos_token_id", 0, 1 << 24);
  c.tie_word_embeddings = f.optional_boolean("tie_word_embeddings").value_or(false);
  c.compress_ratios = integers(f, "compress_ratios");
  validate(c, where);
  return c;
}

ModelConfig ModelConfig::from_file(const std::filesystem::path& path) {
  return from_json(read_json_file(path, std::size_t{1} << 20), path.string());
}

Json ModelConfig::to_json() const {
  Json j;
  j["architectures"] = {"DeepseekV4ForCausalLM"};
  j["model_type"] = "deepseek_v4";
  j["hidden_size"] = hidden_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_nextn_predict_layers"] = num_nextn_predict_layers;
  j["vocab_size"] = vocab_size;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["qk_rope_head_dim"] = qk_rope_head_dim;
  j["q_lora_rank"] = q_lora_rank;
  j["o_groups"] = o_groups;
  j["o_lora_rank"] = o_lora_rank;
  j["sliding_window"] = sliding_window;
  j["index_n_heads"] = index_n_heads;
  j["index_head_dim"] = index_head_dim;
  j["index_topk"] = index_topk;
  j["rope_theta"] = rope_theta;
  j["compress_rope_theta"] = compress_rope_theta;
  j["rope_scaling"] = {{"type", rope_scaling.type},
                       {"factor", rope_scaling.factor},
                       {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings},
                       {"beta_fast", rope_scaling.beta_fast},
                       {"beta_slow", rope_scaling.beta_slow}};
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["hc_eps"] = hc_eps;
  j["n_routed_experts"] = n_routed_experts;
  j["n_shared_experts"] = n_shared_experts;
  j["num_experts_per_tok"] = num_experts_per_tok;
  j["moe_intermediate_size"] = moe_intermediate_size;
  j["scoring_func"] = scoring_func;
  j["routed_scaling_factor"] = routed_scaling_factor;
  j["num_hash_layers"] = num_hash_layers;
  j["swiglu_limit"] = swiglu_limit;
  j["hc_mult"] = hc_mult;
  j["hc_sinkhorn_iters"] = hc_sinkhorn_iters;
  j["expert_dtype"] = expert_dtype;
  j["quantization_config"] = {{"quant_method", quantization.quant_method},
                              {"fmt", quantization.fmt},
                              {"scale_fmt", quantization.scale_fmt},
                              {"activation_scheme", quantization.activation_scheme},
                              {"weight_block_size", {quantization.weight_block_rows, quantization.weight_block_cols}}};
  j["bos_token_id"] = bos_token_id;
  j["eos_token_id"] = eos_token_id;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["compress_ratios"] = compress_ratios;
  return j;
}

std::int64_t ModelConfig::compress_ratio(std::int64_t layer) const {
  if (layer < 0 || layer >= static_cast<std::int64_t>(compress_ratios.size()))
    fail("layer {} is outside the model's {} blocks", layer, compress_ratios.size());
  return compress_ratios[static_cast<std::size_t>(layer)];
}

AttentionKind ModelConfig::attention_kind(std::int64_t layer) const {
  switch (compress_ratio(layer)) {
    case 4: return AttentionKind::kCsa;
    case 128: return AttentionKind::kHca;
    default: return AttentionKind::kWindow;
  }
}

std::int64_t ModelConfig::layers_of_ratio(std::int64_t ratio) const {
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < num_hidden_layers; ++i) n += compress_ratios[static_cast<std::size_t>(i)] == ratio;
  return n;
}

}  // namespace dsv4
