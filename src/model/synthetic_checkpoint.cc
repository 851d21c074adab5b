#include "model/synthetic_checkpoint.h"

#include <cmath>
#include <cstring>
#include <map>
#include <numeric>

#include "common/error.h"
#include "common/json_io.h"
#include "model/model_weights.h"
#include "model/parameter_count.h"
#include "model/safetensors.h"
#include "numerics/bf16.h"
#include "numerics/block_quant.h"

namespace dsv4 {
namespace {

// splitmix64: tiny, well mixed, and the same on every platform (std:: distributions are not).
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float symmetric() { return static_cast<float>(static_cast<double>(next() >> 11) * 0x1.0p-52 - 1.0); }
  std::uint64_t below(std::uint64_t n) { return next() % n; }

 private:
  std::uint64_t state_;
};

std::uint64_t fnv1a(std::string_view text) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : text) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::int64_t numel(const std::vector<std::int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
}

// Output projections feed the residual stream; damping them keeps deep stacks tame.
bool is_output_projection(std::string_view name) {
  return name.find("wo_b.") != std::string_view::npos || name.find(".w2.") != std::string_view::npos;
}

std::vector<float> uniform(Rng& rng, std::int64_t n, float lo, float hi) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = lo + (hi - lo) * 0.5f * (rng.symmetric() + 1.0f);
  return v;
}

std::vector<std::uint8_t> encode_floats(const std::vector<float>& values, DType dtype) {
  std::vector<std::uint8_t> bytes(values.size() * dtype_size(dtype));
  if (dtype == DType::kF32) {
    std::memcpy(bytes.data(), values.data(), bytes.size());
  } else if (dtype == DType::kBF16) {
    for (std::size_t i = 0; i < values.size(); ++i) {
      std::uint16_t b = f32_to_bf16_bits(values[i]);
      std::memcpy(bytes.data() + 2 * i, &b, 2);
    }
  } else {
    fail("synthetic writer: cannot encode floats as {}", dtype_name(dtype));
  }
  return bytes;
}

// The values of one float tensor, by role and name.
std::vector<float> small_values(const ModelConfig& c, const TensorSpec& spec, Rng& rng) {
  const std::int64_t n = numel(spec.shape);
  const std::string& name = spec.name;
  if (spec.role == TensorRole::kNormWeight) return uniform(rng, n, 0.9f, 1.1f);
  if (ends_with(name, "_fn")) {
    float a = std::sqrt(3.0f / static_cast<float>(c.hc_mult * c.hidden_size));
    return uniform(rng, n, -a, a);
  }
  if (ends_with(name, "_base")) return uniform(rng, n, -0.5f, 0.5f);
  if (ends_with(name, "_scale")) return uniform(rng, n, 0.5f, 1.0f);
  if (ends_with(name, "attn_sink")) return uniform(rng, n, -1.0f, 1.0f);
  if (ends_with(name, "ape")) return uniform(rng, n, -0.5f, 0.5f);
  if (ends_with(name, "gate.bias")) return uniform(rng, n, -0.1f, 0.1f);
  fail("synthetic writer: no value rule for small tensor '{}'", name);
}

std::vector<float> linear_values(const TensorSpec& spec, Rng& rng, std::int64_t out, std::int64_t in) {
  float a = std::sqrt(3.0f / static_cast<float>(in));
  if (is_output_projection(spec.name)) a *= 0.5f;
  return uniform(rng, out * in, -a, a);
}

class SyntheticWriter {
 public:
  SyntheticWriter(const ModelConfig& config, std::uint64_t seed) : c_(config), seed_(seed) {}

  TensorData make(const TensorSpec& spec) {
    TensorData t;
    t.name = spec.name;
    t.dtype = spec.dtypes.front();
    t.shape = spec.shape;
    Rng rng(seed_ ^ fnv1a(spec.name));
    switch (spec.role) {
      case TensorRole::kEmbedding:
        t.bytes = encode_floats(uniform(rng, numel(spec.shape), -1.0f, 1.0f), t.dtype);
        break;
      case TensorRole::kHead:
      case TensorRole::kLinearBf16:
        t.bytes = encode_floats(linear_values(spec, rng, spec.shape[0], spec.shape[1]), t.dtype);
        break;
      case TensorRole::kNormWeight:
      case TensorRole::kSmallFp32:
        t.bytes = encode_floats(small_values(c_, spec, rng), t.dtype);
        break;
      case TensorRole::kDenseFp8:
      case TensorRole::kExpertFp4:
        quantized_weight(spec, rng, t);
        break;
      case TensorRole::kRoutingTable:
        t.bytes = routing_table(spec, rng);
        break;
      case TensorRole::kBlockScale: {
        auto it = pending_scales_.find(spec.name);
        if (it == pending_scales_.end()) fail("synthetic writer: scale '{}' before its weight", spec.name);
        t.bytes = std::move(it->second);
        pending_scales_.erase(it);
        break;
      }
    }
    return t;
  }

 private:
  void quantized_weight(const TensorSpec& spec, Rng& rng, TensorData& t) {
    const bool fp4 = spec.dtypes.front() == DType::kI8;
    const std::int64_t out = spec.shape[0], in = fp4 ? spec.shape[1] * 2 : spec.shape[1];
    std::vector<float> w = linear_values(spec, rng, out, in);
    const std::string scale_name = spec.name.substr(0, spec.name.size() - std::string(".weight").size()) + ".scale";
    const auto rows = static_cast<std::size_t>(out), cols = static_cast<std::size_t>(in);
    std::vector<std::uint8_t> scales;
    if (fp4) {
      t.bytes.resize(rows * cols / 2);
      scales.resize(rows * cols / 32);
      quantize_weight_fp4_1x32(w.data(), rows, cols, t.bytes.data(), scales.data());
    } else {
      t.bytes.resize(rows * cols);
      scales.resize(((rows + 127) / 128) * ((cols + 127) / 128));
      quantize_weight_fp8_128x128(w.data(), rows, cols, t.bytes.data(), scales.data());
    }
    pending_scales_[scale_name] = std::move(scales);
  }

  // Each token id maps to num_experts_per_tok distinct experts (a partial Fisher-Yates draw).
  std::vector<std::uint8_t> routing_table(const TensorSpec& spec, Rng& rng) const {
    const std::int64_t vocab = spec.shape[0], k = spec.shape[1];
    std::vector<std::int32_t> ids(static_cast<std::size_t>(vocab * k));
    std::vector<std::int32_t> experts(static_cast<std::size_t>(c_.n_routed_experts));
    for (std::int64_t v = 0; v < vocab; ++v) {
      std::iota(experts.begin(), experts.end(), 0);
      for (std::int64_t j = 0; j < k; ++j) {
        auto pick = static_cast<std::size_t>(j) + rng.below(experts.size() - static_cast<std::size_t>(j));
        std::swap(experts[static_cast<std::size_t>(j)], experts[pick]);
        ids[static_cast<std::size_t>(v * k + j)] = experts[static_cast<std::size_t>(j)];
      }
    }
    std::vector<std::uint8_t> bytes(ids.size() * 4);
    std::memcpy(bytes.data(), ids.data(), bytes.size());
    return bytes;
  }

  const ModelConfig& c_;
  std::uint64_t seed_;
  std::map<std::string, std::vector<std::uint8_t>> pending_scales_;
};

}  // namespace

void write_synthetic_checkpoint(const ModelConfig& config, const std::filesystem::path& dir,
                                const SyntheticOptions& options) {
  const ParameterCount count = count_parameters(config);
  if (static_cast<std::size_t>(count.stored_bytes) > options.max_total_bytes)
    fail("a synthetic checkpoint of this config takes {:.1f} GB, over the limit of {:.1f} GB; "
         "use a scaled-down config",
         static_cast<double>(count.stored_bytes) / 1e9, static_cast<double>(options.max_total_bytes) / 1e9);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("cannot create {}: {}", dir.string(), ec.message());

  SyntheticWriter writer(config, options.seed);
  ShardedCheckpointWriter shards(dir, options.max_shard_bytes);
  for (const TensorSpec& spec : expected_tensors(config)) shards.add(writer.make(spec));
  shards.finish();

  write_text_file(dir / "config.json", config.to_json().dump(2) + "\n");
  Json generation = {{"bos_token_id", config.bos_token_id},
                     {"eos_token_id", config.eos_token_id},
                     {"do_sample", true},
                     {"temperature", 1.0},
                     {"top_p", 1.0}};
  write_text_file(dir / "generation_config.json", generation.dump(2) + "\n");
  Json note = {{"generator", "dsv4 make-model"}, {"seed", options.seed}};
  write_text_file(dir / "dsv4_synthetic.json", note.dump(2) + "\n");
}

}  // namespace dsv4
