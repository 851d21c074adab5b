#include "cpu/cpu_weights.h"

#include <fmt/format.h>

#include <cstring>

#include "common/error.h"
#include "model/model_weights.h"
#include "numerics/bf16.h"

namespace dsv4 {
namespace {

class Loader {
 public:
  Loader(const ModelConfig& c, const BoundWeights& w) : c_(c), w_(w) {}

  // A linear layer with its scale when it has one (FP8 / FP4 storage).
  DenseWeight linear(const std::string& prefix) const {
    const TensorView& weight = w_.at(prefix + ".weight");
    auto it = w_.by_name.find(prefix + ".scale");
    DenseWeight d = load_dense_weight(weight, it == w_.by_name.end() ? nullptr : it->second);
    // The reference keeps bf16 parameters; an F32/F16-stored linear is rounded to bf16 on load.
    if (d.kind == WeightKind::kF32) round_weight_to_bf16(d);
    return d;
  }
  std::vector<float> floats(const std::string& name) const { return read_float_tensor(w_.at(name)); }
  // Norm weights are bf16 parameters in the reference.
  std::vector<float> norm(const std::string& name) const {
    std::vector<float> v = floats(name);
    for (float& x : v) x = round_to_bf16(x);
    return v;
  }
  CpuHcWeights hc(const std::string& p, const std::string& sub) const {
    return {floats(p + "hc_" + sub + "_fn"), floats(p + "hc_" + sub + "_base"), floats(p + "hc_" + sub + "_scale")};
  }
  CpuCompressorWeights compressor(const std::string& p) const {
    return {floats(p + "ape"), linear(p + "wkv"), linear(p + "wgate"), norm(p + "norm.weight")};
  }
  std::vector<std::int64_t> ids(const std::string& name) const {
    const TensorView& v = w_.at(name);
    std::vector<std::int64_t> out(static_cast<std::size_t>(v.numel()));
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (v.dtype == DType::kI32) {
        std::int32_t x;
        std::memcpy(&x, v.bytes.data() + 4 * i, 4);
        out[i] = x;
      } else {
        std::memcpy(&out[i], v.bytes.data() + 8 * i, 8);
      }
      if (out[i] < 0 || out[i] >= c_.n_routed_experts)
        fail("{}: expert id {} at index {} is outside [0, {})", name, out[i], i, c_.n_routed_experts);
    }
    return out;
  }

  CpuBlockWeights block(const std::string& p, std::int64_t layer) const {
    CpuBlockWeights b;
    b.layer = layer;
    b.ratio = c_.compress_ratio(layer);
    b.hash_routed = c_.is_hash_layer(layer);
    b.hc_attn = hc(p, "attn");
    b.hc_ffn = hc(p, "ffn");
    b.attn_norm = norm(p + "attn_norm.weight");
    b.ffn_norm = norm(p + "ffn_norm.weight");
    b.attn_sink = floats(p + "attn.attn_sink");
    b.q_norm = norm(p + "attn.q_norm.weight");
    b.kv_norm = norm(p + "attn.kv_norm.weight");
    b.wq_a = linear(p + "attn.wq_a");
    b.wq_b = linear(p + "attn.wq_b");
    b.wkv = linear(p + "attn.wkv");
    b.wo_a = linear(p + "attn.wo_a");
    b.wo_b = linear(p + "attn.wo_b");
    if (b.ratio > 0) b.compressor = compressor(p + "attn.compressor.");
    if (b.ratio == 4)
      b.indexer = CpuIndexerWeights{linear(p + "attn.indexer.wq_b"), linear(p + "attn.indexer.weights_proj"),
                                    compressor(p + "attn.indexer.compressor.")};
    b.gate = linear(p + "ffn.gate");
    if (b.hash_routed) {
      b.tid2eid = ids(p + "ffn.gate.tid2eid");
    } else {
      b.gate_bias = floats(p + "ffn.gate.bias");
    }
    for (std::int64_t e = 0; e < c_.n_routed_experts; ++e) {
      const std::string ep = fmt::format("{}ffn.experts.{}.", p, e);
      b.experts.push_back({linear(ep + "w1"), linear(ep + "w2"), linear(ep + "w3")});
    }
    b.shared = {linear(p + "ffn.shared_experts.w1"), linear(p + "ffn.shared_experts.w2"),
                linear(p + "ffn.shared_experts.w3")};
    return b;
  }

 private:
  const ModelConfig& c_;
  const BoundWeights& w_;
};

}  // namespace

CpuModelWeights CpuModelWeights::load(const ModelConfig& config, const Checkpoint& checkpoint) {
  const BoundWeights bound = bind_weights(config, checkpoint);
  Loader load(config, bound);
  CpuModelWeights m;
  m.embed = load.norm("embed.weight");  // bf16 values (rounded if stored wider)
  m.head = load.linear("head");
  m.norm = load.norm("norm.weight");
  m.hc_head = {load.floats("hc_head_fn"), load.floats("hc_head_base"), load.floats("hc_head_scale")};
  for (std::int64_t i = 0; i < config.num_hidden_layers; ++i) m.blocks.push_back(load.block(fmt::format("layers.{}.", i), i));
  for (std::int64_t k = 0; k < config.num_nextn_predict_layers; ++k) {
    const std::string p = fmt::format("mtp.{}.", k);
    CpuMtpWeights mtp;
    mtp.block = load.block(p, config.num_hidden_layers + k);
    mtp.e_proj = load.linear(p + "e_proj");
    mtp.h_proj = load.linear(p + "h_proj");
    mtp.enorm = load.norm(p + "enorm.weight");
    mtp.hnorm = load.norm(p + "hnorm.weight");
    mtp.norm = load.norm(p + "norm.weight");
    mtp.hc_head = {load.floats(p + "hc_head_fn"), load.floats(p + "hc_head_base"), load.floats(p + "hc_head_scale")};
    m.mtp.push_back(std::move(mtp));
  }
  return m;
}

}  // namespace dsv4
