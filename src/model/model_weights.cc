#include "model/model_weights.h"

#include <fmt/ranges.h>

#include <set>

#include "common/error.h"

namespace dsv4 {
namespace {

constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

class Inventory {
 public:
  explicit Inventory(const ModelConfig& c) : c_(c) {}

  void small(const std::string& name, std::vector<std::int64_t> shape, TensorRole role = TensorRole::kSmallFp32) {
    // Small tensors may be stored in any float dtype (SPEC.md section 2); we write fp32,
    // except norm weights, which the reference keeps in bf16.
    std::vector<DType> dtypes = role == TensorRole::kNormWeight
                                    ? std::vector<DType>{DType::kBF16, DType::kF32, DType::kF16}
                                    : std::vector<DType>{DType::kF32, DType::kBF16, DType::kF16};
    add(name, role, dtypes, shape, numel(shape));
  }
  void norm(const std::string& name, std::int64_t dim) { small(name, {dim}, TensorRole::kNormWeight); }
  void bf16_linear(const std::string& name, std::int64_t out, std::int64_t in,
                   TensorRole role = TensorRole::kLinearBf16) {
    add(name, role, {DType::kBF16, DType::kF32, DType::kF16}, {out, in}, out * in);
  }
  // FP8 e4m3 weight [out, in] with one UE8M0 scale per 128x128 tile.
  void fp8_linear(const std::string& prefix, std::int64_t out, std::int64_t in,
                  TensorRole role = TensorRole::kDenseFp8) {
    add(prefix + ".weight", role, {DType::kF8E4M3}, {out, in}, out * in);
    add_scale(prefix, {ceil_div(out, 128), ceil_div(in, 128)});
  }
  // Routed expert weight: packed FP4 [out, in/2] with a UE8M0 scale per 32 inputs, or FP8.
  void expert_linear(const std::string& prefix, std::int64_t out, std::int64_t in) {
    if (c_.expert_dtype == "fp8") return fp8_linear(prefix, out, in, TensorRole::kExpertFp4);
    add(prefix + ".weight", TensorRole::kExpertFp4, {DType::kI8, DType::kU8}, {out, in / 2}, out * in);
    add_scale(prefix, {out, in / 32});
  }

  void block(const std::string& p, std::int64_t layer, bool mtp) {
    block_ = layer;
    mtp_ = mtp;
    const std::int64_t D = c_.hidden_size, hc = c_.hc_mult, H = c_.num_attention_heads, d = c_.head_dim;
    const std::int64_t G = c_.o_groups, r = c_.compress_ratio(layer);
    const std::int64_t mix = (2 + hc) * hc;
    for (const char* sub : {"attn", "ffn"}) {
      small(fmt::format("{}hc_{}_fn", p, sub), {mix, hc * D});
      small(fmt::format("{}hc_{}_base", p, sub), {mix});
      small(fmt::format("{}hc_{}_scale", p, sub), {3});
      norm(fmt::format("{}{}_norm.weight", p, sub), D);
    }
    small(p + "attn.attn_sink", {H});
    fp8_linear(p + "attn.wq_a", c_.q_lora_rank, D);
    norm(p + "attn.q_norm.weight", c_.q_lora_rank);
    fp8_linear(p + "attn.wq_b", H * d, c_.q_lora_rank);
    fp8_linear(p + "attn.wkv", d, D);
    norm(p + "attn.kv_norm.weight", d);
    fp8_linear(p + "attn.wo_a", G * c_.o_lora_rank, H * d / G);
    fp8_linear(p + "attn.wo_b", D, G * c_.o_lora_rank);
    if (r > 0) compressor(p + "attn.compressor.", r, r == 4 ? 2 : 1, d);
    if (r == 4) {
      const std::int64_t ih = c_.index_n_heads, id = c_.index_head_dim;
      fp8_linear(p + "attn.indexer.wq_b", ih * id, c_.q_lora_rank);
      bf16_linear(p + "attn.indexer.weights_proj.weight", ih, D);
      compressor(p + "attn.indexer.compressor.", 4, 2, id);
    }
    const std::int64_t E = c_.n_routed_experts, I = c_.moe_intermediate_size;
    bf16_linear(p + "ffn.gate.weight", E, D);
    if (c_.is_hash_layer(layer)) {
      add(p + "ffn.gate.tid2eid", TensorRole::kRoutingTable, {DType::kI32, DType::kI64},
           {c_.vocab_size, c_.num_experts_per_tok}, 0);
    } else {
      small(p + "ffn.gate.bias", {E});
    }
    for (std::int64_t e = 0; e < E; ++e) {
      expert_ = e;
      expert_linear(fmt::format("{}ffn.experts.{}.w1", p, e), I, D);
      expert_linear(fmt::format("{}ffn.experts.{}.w2", p, e), D, I);
      expert_linear(fmt::format("{}ffn.experts.{}.w3", p, e), I, D);
    }
    expert_ = -1;
    fp8_linear(p + "ffn.shared_experts.w1", I, D);
    fp8_linear(p + "ffn.shared_experts.w2", D, I);
    fp8_linear(p + "ffn.shared_experts.w3", I, D);
  }

  void head(const std::string& p) {
    const std::int64_t D = c_.hidden_size, hc = c_.hc_mult;
    small(p + "hc_head_fn", {hc, hc * D});
    small(p + "hc_head_base", {hc});
    small(p + "hc_head_scale", {1});
    norm(p + "norm.weight", D);
  }

  std::vector<TensorSpec> take() { return std::move(specs_); }

 private:
  static std::int64_t numel(const std::vector<std::int64_t>& shape) {
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
    return n;
  }
  void compressor(const std::string& p, std::int64_t ratio, std::int64_t coff, std::int64_t dim) {
    small(p + "ape", {ratio, coff * dim});
    bf16_linear(p + "wkv.weight", coff * dim, c_.hidden_size);
    bf16_linear(p + "wgate.weight", coff * dim, c_.hidden_size);
    norm(p + "norm.weight", dim);
  }
  void add_scale(const std::string& prefix, std::vector<std::int64_t> shape) {
    add(prefix + ".scale", TensorRole::kBlockScale, {DType::kF8E8M0, DType::kF32}, std::move(shape), 0,
        prefix + ".weight");
  }
  void add(std::string name, TensorRole role, std::vector<DType> dtypes, std::vector<std::int64_t> shape,
           std::int64_t parameters, std::string scale_of = "") {
    TensorSpec spec;
    spec.name = std::move(name);
    spec.role = role;
    spec.dtypes = std::move(dtypes);
    spec.shape = std::move(shape);
    spec.parameters = parameters;
    spec.scale_of = std::move(scale_of);
    spec.block = block_;
    spec.mtp = mtp_;
    spec.expert = expert_;
    specs_.push_back(std::move(spec));
  }

  const ModelConfig& c_;
  std::vector<TensorSpec> specs_;
  std::int64_t block_ = -1;
  std::int64_t expert_ = -1;
  bool mtp_ = false;
};

std::string shape_text(const std::vector<std::int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

std::string dtypes_text(const std::vector<DType>& dtypes) {
  std::vector<std::string_view> names;
  for (DType t : dtypes) names.push_back(dtype_name(t));
  return fmt::format("{}", fmt::join(names, " or "));
}

}  // namespace

std::vector<TensorSpec> expected_tensors(const ModelConfig& config) {
  Inventory inv(config);
  const std::int64_t V = config.vocab_size, D = config.hidden_size;
  inv.bf16_linear("embed.weight", V, D, TensorRole::kEmbedding);
  inv.bf16_linear("head.weight", V, D, TensorRole::kHead);
  inv.head("");
  for (std::int64_t i = 0; i < config.num_hidden_layers; ++i) inv.block(fmt::format("layers.{}.", i), i, false);
  for (std::int64_t k = 0; k < config.num_nextn_predict_layers; ++k) {
    const std::string p = fmt::format("mtp.{}.", k);
    const std::int64_t layer = config.num_hidden_layers + k;
    inv.block(p, layer, true);
    inv.fp8_linear(p + "e_proj", D, D);
    inv.fp8_linear(p + "h_proj", D, D);
    inv.norm(p + "enorm.weight", D);
    inv.norm(p + "hnorm.weight", D);
    inv.head(p);
  }
  return inv.take();
}

std::vector<std::string> check_weights(const ModelConfig& config, const Checkpoint& checkpoint) {
  std::vector<std::string> missing, wrong, unexpected;
  std::set<std::string> known;
  for (const TensorSpec& spec : expected_tensors(config)) {
    known.insert(spec.name);
    const TensorView* view = checkpoint.find(spec.name);
    if (view == nullptr) {
      missing.push_back(spec.name);
      continue;
    }
    bool dtype_ok = false;
    for (DType t : spec.dtypes) dtype_ok = dtype_ok || t == view->dtype;
    if (!dtype_ok)
      wrong.push_back(fmt::format("'{}' has dtype {}, expected {}", spec.name, dtype_name(view->dtype),
                                  dtypes_text(spec.dtypes)));
    if (view->shape != spec.shape)
      wrong.push_back(fmt::format("'{}' has shape {}, expected {}", spec.name, shape_text(view->shape),
                                  shape_text(spec.shape)));
  }
  for (const auto& [name, view] : checkpoint.tensors())
    if (!known.count(name)) unexpected.push_back(name);

  std::vector<std::string> problems;
  auto summarize = [&](const std::vector<std::string>& items, const std::string& title) {
    if (items.empty()) return;
    constexpr std::size_t kShown = 20;
    std::vector<std::string> shown(items.begin(), items.begin() + std::min(items.size(), kShown));
    std::string more = items.size() > kShown ? fmt::format(" (and {} more)", items.size() - kShown) : "";
    problems.push_back(fmt::format("{} {}: {}{}", items.size(), title, fmt::join(shown, ", "), more));
  };
  summarize(missing, "missing tensors");
  summarize(unexpected, "unexpected tensors");
  for (auto& w : wrong) problems.push_back(std::move(w));
  return problems;
}

BoundWeights bind_weights(const ModelConfig& config, const Checkpoint& checkpoint) {
  auto problems = check_weights(config, checkpoint);
  if (!problems.empty())
    fail("checkpoint does not match the config ({} problems):\n  {}", problems.size(), fmt::join(problems, "\n  "));
  BoundWeights bound;
  for (const TensorSpec& spec : expected_tensors(config)) bound.by_name[spec.name] = checkpoint.find(spec.name);
  return bound;
}

const TensorView& BoundWeights::at(const std::string& name) const {
  auto it = by_name.find(name);
  if (it == by_name.end()) fail("no bound tensor named '{}'", name);
  return *it->second;
}

}  // namespace dsv4
