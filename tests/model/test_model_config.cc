// ModelConfig: the checked-in config.json fixtures against the presets (SPEC.md section 1),
// per-layer structure, round trips, and error messages that name the field and the file.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "../support/test_support.h"
#include "common/error.h"
#include "common/json_io.h"
#include "model/model_config.h"
#include "model/presets.h"

namespace dsv4 {
namespace {

namespace fs = std::filesystem;

const fs::path kFlashFixture = fs::path(DSV4_SOURCE_DIR) / "tests/fixtures/v4-flash/config.json";
const fs::path kProFixture = fs::path(DSV4_SOURCE_DIR) / "tests/fixtures/v4-pro/config.json";

// Top-level keys of the fixtures that from_json does not need.
const std::set<std::string> kOptionalKeys = {"architectures", "model_type", "topk_method", "norm_topk_prob",
                                             "torch_dtype",   "tie_word_embeddings"};

using testing_support::error_of;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::size_t count_of(const std::string& haystack, const std::string& needle) {
  std::size_t n = 0;
  for (auto pos = haystack.find(needle); pos != std::string::npos; pos = haystack.find(needle, pos + 1)) ++n;
  return n;
}

Json flash_json() { return read_json_file(kFlashFixture); }

// The error from_json gives for the Flash fixture with `pointer` set to `value`.
std::string error_with(const std::string& pointer, const Json& value, const std::string& where = "cfg/config.json") {
  Json j = flash_json();
  j[Json::json_pointer(pointer)] = value;
  return error_of([&] { ModelConfig::from_json(j, where); });
}

class ModelConfigFiles : public testing_support::TempDirTest {
 protected:
  fs::path write(const std::string& name, const std::string& text) {
    fs::path path = dir_ / name;
    write_text_file(path, text);
    return path;
  }
};

// ---------------------------------------------------------------------------------------
// Fixtures and presets

void expect_same(const ModelConfig& a, const ModelConfig& b, const std::string& what) {
  Json ja = a.to_json(), jb = b.to_json();
  EXPECT_EQ(ja, jb) << what << ": differences " << Json::diff(jb, ja).dump();
}

TEST(ModelConfig, FlashFixtureMatchesPreset) {
  ModelConfig c = ModelConfig::from_file(kFlashFixture);
  expect_same(c, v4_flash_config(), "flash");
  // Spot checks against SPEC.md section 1 itself, independent of the preset code.
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_hidden_layers, 43);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.num_key_value_heads, 1);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.nope_head_dim(), 448);
  EXPECT_EQ(c.q_lora_rank, 1024);
  EXPECT_EQ(c.o_groups, 8);
  EXPECT_EQ(c.o_lora_rank, 1024);
  EXPECT_EQ(c.sliding_window, 128);
  EXPECT_EQ(c.index_n_heads, 64);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 512);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.compress_rope_theta, 160000.0);
  EXPECT_EQ(c.rope_scaling.type, "yarn");
  EXPECT_EQ(c.rope_scaling.factor, 16.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 65536);
  EXPECT_EQ(c.rope_scaling.beta_fast, 32.0);
  EXPECT_EQ(c.rope_scaling.beta_slow, 1.0);
  EXPECT_EQ(c.max_position_embeddings, 1048576);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.hc_eps, 1e-6);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.num_experts_per_tok, 6);
  EXPECT_EQ(c.moe_intermediate_size, 2048);
  EXPECT_EQ(c.scoring_func, "sqrtsoftplus");
  EXPECT_EQ(c.routed_scaling_factor, 1.5);
  EXPECT_EQ(c.num_hash_layers, 3);
  EXPECT_EQ(c.swiglu_limit, 10.0);
  EXPECT_EQ(c.hc_mult, 4);
  EXPECT_EQ(c.hc_sinkhorn_iters, 20);
  EXPECT_EQ(c.expert_dtype, "fp4");
  EXPECT_EQ(c.quantization.quant_method, "fp8");
  EXPECT_EQ(c.quantization.fmt, "e4m3");
  EXPECT_EQ(c.quantization.scale_fmt, "ue8m0");
  EXPECT_EQ(c.quantization.activation_scheme, "dynamic");
  EXPECT_EQ(c.quantization.weight_block_rows, 128);
  EXPECT_EQ(c.quantization.weight_block_cols, 128);
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_id, 1);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.compress_ratios.size(), 44u);
  EXPECT_EQ(c.num_blocks_total(), 44);
}

TEST(ModelConfig, ProFixtureMatchesPreset) {
  ModelConfig c = ModelConfig::from_file(kProFixture);
  expect_same(c, v4_pro_config(), "pro");
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.num_hidden_layers, 61);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.num_attention_heads, 128);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.o_groups, 16);
  EXPECT_EQ(c.o_lora_rank, 1024);
  EXPECT_EQ(c.index_topk, 1024);
  EXPECT_EQ(c.n_routed_experts, 384);
  EXPECT_EQ(c.num_experts_per_tok, 6);
  EXPECT_EQ(c.moe_intermediate_size, 3072);
  EXPECT_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.compress_ratios.size(), 62u);
  EXPECT_EQ(c.num_blocks_total(), 62);
}

TEST(ModelConfig, PresetsDifferWhereTheSpecSaysSo) {
  // Guards against expect_same passing for trivial reasons.
  EXPECT_NE(v4_flash_config().to_json(), v4_pro_config().to_json());
  EXPECT_NE(v4_flash_config().to_json(), tiny_config().to_json());
}

TEST(ModelConfig, LayerKindCounts) {
  for (const ModelConfig& c : {ModelConfig::from_file(kFlashFixture), v4_flash_config()}) {
    EXPECT_EQ(c.layers_of_ratio(0), 2);
    EXPECT_EQ(c.layers_of_ratio(4), 21);
    EXPECT_EQ(c.layers_of_ratio(128), 20);
    EXPECT_EQ(c.layers_of_ratio(3), 0);
  }
  for (const ModelConfig& c : {ModelConfig::from_file(kProFixture), v4_pro_config()}) {
    EXPECT_EQ(c.layers_of_ratio(0), 0);  // the MTP entry (0) is not a main layer
    EXPECT_EQ(c.layers_of_ratio(4), 30);
    EXPECT_EQ(c.layers_of_ratio(128), 31);
  }
}

TEST(ModelConfig, FlashPerLayerRatios) {
  ModelConfig c = ModelConfig::from_file(kFlashFixture);
  for (std::int64_t i = 0; i < 43; ++i) {
    std::int64_t want = i < 2 ? 0 : (i % 2 == 0 ? 4 : 128);
    EXPECT_EQ(c.compress_ratio(i), want) << i;
    EXPECT_EQ(c.attention_kind(i),
              want == 0 ? AttentionKind::kWindow : (want == 4 ? AttentionKind::kCsa : AttentionKind::kHca))
        << i;
    EXPECT_EQ(c.is_hash_layer(i), i < 3) << i;
  }
  EXPECT_EQ(c.compress_ratio(43), 0);  // the MTP block
  EXPECT_EQ(c.attention_kind(43), AttentionKind::kWindow);
  EXPECT_THROW(c.compress_ratio(44), Error);
  EXPECT_THROW(c.compress_ratio(-1), Error);
  EXPECT_THROW(c.attention_kind(44), Error);
}

TEST(ModelConfig, ProPerLayerRatios) {
  ModelConfig c = ModelConfig::from_file(kProFixture);
  for (std::int64_t i = 0; i < 61; ++i) {
    std::int64_t want = i < 2 ? 128 : (i % 2 == 0 ? 4 : 128);
    EXPECT_EQ(c.compress_ratio(i), want) << i;
    EXPECT_EQ(c.attention_kind(i), want == 4 ? AttentionKind::kCsa : AttentionKind::kHca) << i;
  }
  EXPECT_EQ(c.compress_ratio(61), 0);
  EXPECT_EQ(c.attention_kind(61), AttentionKind::kWindow);
  EXPECT_THROW(c.compress_ratio(62), Error);
}

TEST(ModelConfig, RoundTripAllPresets) {
  for (const std::string& name : preset_names()) {
    ModelConfig c = preset_config(name);
    ModelConfig back = ModelConfig::from_json(c.to_json(), name);
    expect_same(back, c, name);
    EXPECT_EQ(back.compress_ratios, c.compress_ratios) << name;
    EXPECT_EQ(back.rms_norm_eps, c.rms_norm_eps) << name;
    // And through text.
    ModelConfig text = ModelConfig::from_json(parse_json(c.to_json().dump(2), name), name);
    expect_same(text, c, name + " (text)");
  }
  // A config with non-default optional fields survives too.
  ModelConfig c = tiny_config();
  c.tie_word_embeddings = true;
  c.quantization.activation_scheme = "static";
  c.rope_scaling.factor = 4.25;
  ModelConfig back = ModelConfig::from_json(c.to_json(), "x");
  EXPECT_TRUE(back.tie_word_embeddings);
  EXPECT_EQ(back.quantization.activation_scheme, "static");
  EXPECT_EQ(back.rope_scaling.factor, 4.25);
}

TEST(ModelConfig, PresetByName) {
  EXPECT_EQ(preset_names(), (std::vector<std::string>{"flash", "pro", "tiny"}));
  expect_same(preset_config("flash"), v4_flash_config(), "flash");
  expect_same(preset_config("pro"), v4_pro_config(), "pro");
  expect_same(preset_config("tiny"), tiny_config(), "tiny");
  std::string message = error_of([] { preset_config("nope"); });
  EXPECT_TRUE(contains(message, "'nope'")) << message;
  for (const char* name : {"flash", "pro", "tiny"}) EXPECT_TRUE(contains(message, name)) << message;
  EXPECT_THROW(preset_config(""), Error);
  EXPECT_THROW(preset_config("Flash"), Error);
}

TEST(ModelConfig, TinyHasTheFullStructure) {
  ModelConfig c = tiny_config();
  EXPECT_NO_THROW(ModelConfig::from_json(c.to_json(), "tiny"));  // passes validation
  EXPECT_GT(c.layers_of_ratio(0), 0);
  EXPECT_GT(c.layers_of_ratio(4), 0);
  EXPECT_GT(c.layers_of_ratio(128), 0);
  EXPECT_EQ(c.layers_of_ratio(0) + c.layers_of_ratio(4) + c.layers_of_ratio(128), c.num_hidden_layers);
  bool hash = false, score = false;
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) (c.is_hash_layer(i) ? hash : score) = true;
  EXPECT_TRUE(hash);
  EXPECT_TRUE(score);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.compress_ratio(c.num_hidden_layers), 0);
  EXPECT_EQ(c.num_blocks_total(), c.num_hidden_layers + 1);
  // The indexer must actually select: top-k below the complete c4 blocks of a 300-token prompt.
  EXPECT_LT(c.index_topk, 300 / 4);
  EXPECT_GT(c.index_topk, 0);
  EXPECT_GE(c.hc_mult, 2);
  EXPECT_LT(c.num_experts_per_tok, c.n_routed_experts);
  // Small enough for CPU runs.
  EXPECT_LT(c.hidden_size, v4_flash_config().hidden_size);
  EXPECT_LT(c.vocab_size, v4_flash_config().vocab_size);
}

// ---------------------------------------------------------------------------------------
// Repeated keys: refused, not silently resolved to the last one

TEST_F(ModelConfigFiles, DuplicateKeyNamesKeyAndFile) {
  std::string text = flash_json().dump(1);
  // The same field again at the end, with another value.
  text.insert(text.rfind('}'), ",\"num_hidden_layers\": 2");
  fs::path path = write("duplicate.json", text);
  std::string message = error_of([&] { ModelConfig::from_file(path); });
  EXPECT_TRUE(contains(message, path.string() + ": key 'num_hidden_layers' is listed more than once")) << message;
  // Nested, too.
  std::string nested = flash_json().dump(1);
  const std::size_t at = nested.find("\"rope_scaling\": {") + std::string("\"rope_scaling\": {").size();
  nested.insert(at, "\"factor\": 2, ");
  path = write("duplicate_nested.json", nested);
  message = error_of([&] { ModelConfig::from_file(path); });
  EXPECT_TRUE(contains(message, path.string() + ": key 'factor' is listed more than once in \"rope_scaling\""))
      << message;
}

// ---------------------------------------------------------------------------------------
// Missing fields

TEST_F(ModelConfigFiles, EachMissingTopLevelFieldIsNamed) {
  const Json full = flash_json();
  std::vector<std::string> keys;
  for (const auto& item : full.items()) keys.push_back(item.key());
  int required = 0;
  for (const std::string& key : keys) {
    Json j = full;
    j.erase(key);
    fs::path path = write("missing_" + key + ".json", j.dump(1));
    if (kOptionalKeys.count(key)) {
      EXPECT_NO_THROW(ModelConfig::from_file(path)) << key;
      continue;
    }
    ++required;
    std::string message = error_of([&] { ModelConfig::from_file(path); });
    EXPECT_TRUE(contains(message, path.string())) << key << ": " << message;
    EXPECT_TRUE(contains(message, "missing field '" + key + "'")) << key << ": " << message;
    for (const std::string& other : keys) {
      if (other != key) {
        EXPECT_FALSE(contains(message, "'" + other + "'")) << key << ": " << message;
      }
    }
  }
  EXPECT_EQ(required, 36);
}

TEST_F(ModelConfigFiles, EachMissingNestedFieldIsNamed) {
  const Json full = flash_json();
  for (const std::string parent : {"rope_scaling", "quantization_config"}) {
    for (const auto& item : full.at(parent).items()) {
      const std::string key = item.key();
      if (parent == "rope_scaling" && key == "type") continue;  // see RopeScalingType below
      Json j = full;
      j.at(parent).erase(key);
      fs::path path = write("missing_" + parent + "_" + key + ".json", j.dump());
      if (parent == "quantization_config" && key == "activation_scheme") {
        EXPECT_EQ(ModelConfig::from_file(path).quantization.activation_scheme, "dynamic");
        continue;
      }
      std::string message = error_of([&] { ModelConfig::from_file(path); });
      EXPECT_TRUE(contains(message, path.string())) << message;
      EXPECT_TRUE(contains(message, "missing field '" + parent + "." + key + "'")) << message;
    }
  }
}

TEST(ModelConfig, RopeScalingTypeAlias) {
  Json j = flash_json();
  j["rope_scaling"].erase("type");
  j["rope_scaling"]["rope_type"] = "yarn";
  EXPECT_EQ(ModelConfig::from_json(j, "x").rope_scaling.type, "yarn");
  j["rope_scaling"]["rope_type"] = "linear";
  EXPECT_TRUE(contains(error_of([&] { ModelConfig::from_json(j, "x"); }), "'rope_scaling.type' = \"linear\""));
}

// With neither 'type' nor 'rope_type', the message should name the key the fixture (and
// the published config.json) uses, not only the alias.
TEST(ModelConfig, RopeScalingTypeMissingNamesTheField) {
  Json j = flash_json();
  j["rope_scaling"].erase("type");
  std::string message = error_of([&] { ModelConfig::from_json(j, "cfg/config.json"); });
  EXPECT_TRUE(contains(message, "cfg/config.json")) << message;
  EXPECT_TRUE(contains(message, "'rope_scaling.type'")) << message;
}

TEST(ModelConfig, OptionalFieldDefaults) {
  Json j = flash_json();
  for (const auto& key : kOptionalKeys) j.erase(key);
  j["quantization_config"].erase("activation_scheme");
  ModelConfig c = ModelConfig::from_json(j, "x");
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.quantization.activation_scheme, "dynamic");
  j["tie_word_embeddings"] = true;
  EXPECT_TRUE(ModelConfig::from_json(j, "x").tie_word_embeddings);
}

// ---------------------------------------------------------------------------------------
// Wrong types and ranges

struct BadValue {
  std::string pointer;
  Json value;
  std::string expect;
};

TEST(ModelConfig, WrongTypesNameTheField) {
  const std::vector<BadValue> cases = {
      {"/hidden_size", "4096", "field 'hidden_size' must be an integer, found string"},
      {"/hidden_size", 1.5, "field 'hidden_size' must be an integer, found number 1.5"},
      {"/hidden_size", 1e300, "field 'hidden_size' must be an integer"},
      {"/num_hidden_layers", true, "field 'num_hidden_layers' must be an integer, found boolean"},
      {"/vocab_size", nullptr, "field 'vocab_size' must be an integer, found null"},
      {"/index_topk", Json::array({512}), "field 'index_topk' must be an integer, found array"},
      {"/o_groups", Json::object(), "field 'o_groups' must be an integer, found object"},
      {"/rope_scaling", Json::array(), "field 'rope_scaling' must be a JSON object, found array"},
      {"/rope_scaling", "yarn", "field 'rope_scaling' must be a JSON object, found string"},
      {"/quantization_config", Json::array({1}), "field 'quantization_config' must be a JSON object, found array"},
      {"/rope_theta", "10000", "field 'rope_theta' must be a number, found string"},
      {"/rms_norm_eps", Json::array(), "field 'rms_norm_eps' must be a number, found array"},
      {"/rope_scaling/factor", "16", "field 'rope_scaling.factor' must be a number"},
      {"/rope_scaling/original_max_position_embeddings", 65536.5,
       "field 'rope_scaling.original_max_position_embeddings' must be an integer"},
      {"/rope_scaling/type", 3, "field 'rope_scaling.type' must be a string, found integer"},
      {"/scoring_func", 1, "field 'scoring_func' must be a string, found integer"},
      {"/expert_dtype", nullptr, "field 'expert_dtype' must be a string, found null"},
      {"/quantization_config/fmt", false, "field 'quantization_config.fmt' must be a string, found boolean"},
      {"/quantization_config/weight_block_size", 128,
       "field 'quantization_config.weight_block_size' must be an array, found integer"},
      {"/quantization_config/weight_block_size/1", "128",
       "field 'quantization_config.weight_block_size[1]' must be an integer"},
      {"/quantization_config/weight_block_size", Json::array({128}),
       "field 'quantization_config.weight_block_size' must have 2 entries, found 1"},
      {"/compress_ratios", Json::object(), "field 'compress_ratios' must be an array, found object"},
      {"/compress_ratios/5", "4", "field 'compress_ratios[5]' must be an integer, found string"},
      {"/compress_ratios/7", 4.5, "field 'compress_ratios[7]' must be an integer, found number"},
      {"/tie_word_embeddings", "false", "field 'tie_word_embeddings' must be true or false, found string"},
      {"/tie_word_embeddings", 0, "field 'tie_word_embeddings' must be true or false, found integer"},
  };
  for (const auto& c : cases) {
    std::string message = error_with(c.pointer, c.value);
    EXPECT_TRUE(contains(message, "cfg/config.json: ")) << c.pointer << ": " << message;
    EXPECT_TRUE(contains(message, c.expect)) << c.pointer << " = " << c.value.dump() << ": " << message;
  }
}

TEST(ModelConfig, OutOfRangeValuesNameTheField) {
  const std::vector<BadValue> cases = {
      {"/hidden_size", 0, "field 'hidden_size' = 0 is out of range"},
      {"/hidden_size", -4096, "field 'hidden_size' = -4096 is out of range"},
      {"/hidden_size", std::numeric_limits<std::int64_t>::max(), "field 'hidden_size' = 9223372036854775807"},
      {"/hidden_size", std::numeric_limits<std::int64_t>::min(), "field 'hidden_size' = -9223372036854775808"},
      {"/hidden_size", std::numeric_limits<std::uint64_t>::max(), "field 'hidden_size' = 18446744073709551615 is out of range: expected an integer in [1, 1048576]"},
      {"/num_hidden_layers", 0, "field 'num_hidden_layers' = 0 is out of range"},
      {"/num_hidden_layers", 100000, "field 'num_hidden_layers' = 100000 is out of range"},
      {"/num_nextn_predict_layers", -1, "field 'num_nextn_predict_layers' = -1 is out of range"},
      {"/vocab_size", 1, "field 'vocab_size' = 1 is out of range"},
      {"/index_topk", 0, "field 'index_topk' = 0 is out of range"},
      {"/hc_mult", 0, "field 'hc_mult' = 0 is out of range"},
      {"/bos_token_id", -1, "field 'bos_token_id' = -1 is out of range"},
      {"/rope_scaling/original_max_position_embeddings", 0,
       "field 'rope_scaling.original_max_position_embeddings' = 0 is out of range"},
      {"/rms_norm_eps", 0, "field 'rms_norm_eps' = 0 is out of range: expected a positive number"},
      {"/rms_norm_eps", -1e-6, "field 'rms_norm_eps' = -1e-06 is out of range: expected a positive number"},
      {"/rope_theta", -10000.0, "field 'rope_theta' = -10000 is out of range: expected a positive number"},
      {"/rope_scaling/factor", 0.0, "field 'rope_scaling.factor' = 0 is out of range: expected a positive number"},
      {"/routed_scaling_factor", -1.5, "field 'routed_scaling_factor' = -1.5 is out of range: expected a positive number"},
      {"/swiglu_limit", 0, "field 'swiglu_limit' = 0 is out of range: expected a positive number"},
  };
  for (const auto& c : cases) {
    std::string message = error_with(c.pointer, c.value);
    EXPECT_TRUE(contains(message, "cfg/config.json: ")) << c.pointer << ": " << message;
    EXPECT_TRUE(contains(message, c.expect)) << c.pointer << " = " << c.value.dump() << ": " << message;
  }
}

TEST(ModelConfig, IntegralFloatsAcceptedForIntegers) {
  Json j = flash_json();
  j["hidden_size"] = 4096.0;
  j["rope_scaling"]["original_max_position_embeddings"] = 65536.0;
  j["max_position_embeddings"] = 1048576.0;
  j["bos_token_id"] = -0.0;
  j["quantization_config"]["weight_block_size"] = {128.0, 128.0};
  for (auto& r : j["compress_ratios"]) r = r.get<double>();
  ASSERT_TRUE(j["compress_ratios"][3].is_number_float());
  // Also as text, the way an exported config.json spells them.
  for (const Json& input : {j, parse_json(j.dump(), "text")}) {
    ModelConfig c = ModelConfig::from_json(input, "floats.json");
    expect_same(c, v4_flash_config(), "integral floats");
    EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 65536);
  }
  EXPECT_TRUE(contains(error_with("/hidden_size", 4096.5), "'hidden_size' must be an integer"));
}

// ---------------------------------------------------------------------------------------
// Cross-field consistency

struct Inconsistency {
  std::string pointer;
  Json value;
  std::string expect;
};

TEST(ModelConfig, EachInconsistencyIsReportedAlone) {
  Json short_ratios = flash_json()["compress_ratios"];
  short_ratios.erase(short_ratios.size() - 1);
  Json long_ratios = flash_json()["compress_ratios"];
  long_ratios.push_back(0);
  const std::vector<Inconsistency> cases = {
      {"/compress_ratios", short_ratios,
       "'compress_ratios' has 43 entries, expected num_hidden_layers + num_nextn_predict_layers = 44"},
      {"/compress_ratios", long_ratios, "'compress_ratios' has 45 entries"},
      {"/compress_ratios", Json::array(), "'compress_ratios' has 0 entries"},
      {"/compress_ratios/2", 3, "'compress_ratios[2]' = 3, expected 0, 4 or 128"},
      {"/compress_ratios/3", 64, "'compress_ratios[3]' = 64, expected 0, 4 or 128"},
      {"/compress_ratios/0", -4, "'compress_ratios[0]' = -4, expected 0, 4 or 128"},
      {"/compress_ratios/43", 4, "'compress_ratios[43]' = 4 belongs to an MTP block"},
      {"/compress_ratios/43", 128, "'compress_ratios[43]' = 128 belongs to an MTP block"},
      {"/num_nextn_predict_layers", 2, "'compress_ratios' has 44 entries, expected num_hidden_layers + "
                                        "num_nextn_predict_layers = 45"},
      {"/o_groups", 7, "'num_attention_heads' = 64 must be divisible by 'o_groups' = 7"},
      {"/o_groups", 128, "'num_attention_heads' = 64 must be divisible by 'o_groups' = 128"},
      {"/num_key_value_heads", 2, "'num_key_value_heads' = 2"},
      {"/index_head_dim", 96, "'index_head_dim' = 96 must be a power of two"},
      {"/index_head_dim", 32, "'index_head_dim' = 32 must be a power of two (Hadamard) of at least"},
      {"/num_experts_per_tok", 257, "'num_experts_per_tok' = 257 exceeds 'n_routed_experts' = 256"},
      {"/num_hash_layers", 44, "'num_hash_layers' = 44 exceeds 'num_hidden_layers' = 43"},
      {"/n_shared_experts", 2, "'n_shared_experts' = 2"},
      {"/n_shared_experts", 0, "'n_shared_experts' = 0"},
      {"/scoring_func", "softmax", "'scoring_func' = \"softmax\""},
      {"/expert_dtype", "bf16", "'expert_dtype' = \"bf16\""},
      {"/rope_scaling/type", "linear", "'rope_scaling.type' = \"linear\""},
      {"/rope_scaling/beta_fast", 0.5, "'rope_scaling.beta_fast' must be larger than 'rope_scaling.beta_slow'"},
      {"/quantization_config/quant_method", "int8", "'quantization_config.quant_method' = \"int8\""},
      {"/quantization_config/fmt", "e5m2", "'quantization_config.fmt' = \"e5m2\""},
      {"/quantization_config/scale_fmt", "fp32", "'quantization_config.scale_fmt' = \"fp32\""},
      {"/quantization_config/weight_block_size", Json::array({64, 128}),
       "'quantization_config.weight_block_size' = [64, 128]"},
      {"/hidden_size", 4000, "'hidden_size' = 4000 must be a multiple of 128"},
      {"/q_lora_rank", 1000, "'q_lora_rank' = 1000 must be a multiple of 128"},
      {"/o_lora_rank", 1000, "'o_lora_rank' = 1000 must be a multiple of 128"},
      {"/moe_intermediate_size", 2000, "'moe_intermediate_size' = 2000 must be a multiple of 128"},
      {"/head_dim", 500, "'head_dim' - 'qk_rope_head_dim' = 436 must be a multiple of 64"},
      {"/eos_token_id", 129280, "'eos_token_id' 129280 must be below 'vocab_size' 129280"},
  };
  for (const auto& c : cases) {
    std::string message = error_with(c.pointer, c.value);
    EXPECT_TRUE(contains(message, "cfg/config.json: inconsistent config:")) << c.pointer << ": " << message;
    EXPECT_TRUE(contains(message, c.expect)) << c.pointer << " = " << c.value.dump() << ": " << message;
    EXPECT_EQ(count_of(message, "\n  "), 1u) << "exactly one problem expected for " << c.pointer << ": " << message;
  }
  // qk_rope_head_dim must be even and below head_dim.
  for (int bad : {63, 512, 600}) {
    std::string message = error_with("/qk_rope_head_dim", bad);
    EXPECT_TRUE(contains(message, "'qk_rope_head_dim' = " + std::to_string(bad) + " must be even")) << message;
  }
}

TEST_F(ModelConfigFiles, SeveralProblemsReportedTogether) {
  Json j = flash_json();
  j["compress_ratios"][2] = 3;
  j["compress_ratios"][43] = 4;
  j["o_groups"] = 7;
  j["num_key_value_heads"] = 2;
  j["index_head_dim"] = 96;
  j["num_experts_per_tok"] = 300;
  fs::path path = write("several.json", j.dump(2));
  std::string message = error_of([&] { ModelConfig::from_file(path); });
  EXPECT_TRUE(contains(message, path.string() + ": inconsistent config:")) << message;
  for (const char* part : {"'compress_ratios[2]' = 3", "'compress_ratios[43]' = 4 belongs to an MTP block",
                           "'o_groups' = 7", "'num_key_value_heads' = 2", "'index_head_dim' = 96",
                           "'num_experts_per_tok' = 300 exceeds"})
    EXPECT_TRUE(contains(message, part)) << part << " missing from: " << message;
  EXPECT_EQ(count_of(message, "\n  "), 6u) << message;
  EXPECT_EQ(count_of(message, path.string()), 1u) << message;
}

// ---------------------------------------------------------------------------------------
// Files

TEST_F(ModelConfigFiles, FromFileErrorsNameThePath) {
  fs::path missing = dir_ / "nowhere" / "config.json";
  std::string message = error_of([&] { ModelConfig::from_file(missing); });
  EXPECT_TRUE(contains(message, missing.string())) << message;

  fs::path not_json = write("not_json.json", "hidden_size: 4096\n");
  message = error_of([&] { ModelConfig::from_file(not_json); });
  EXPECT_TRUE(contains(message, not_json.string() + ": invalid JSON")) << message;

  fs::path empty = write("empty.json", "");
  message = error_of([&] { ModelConfig::from_file(empty); });
  EXPECT_TRUE(contains(message, empty.string() + ": invalid JSON")) << message;

  fs::path array = write("array.json", "[" + flash_json().dump() + "]");
  message = error_of([&] { ModelConfig::from_file(array); });
  EXPECT_TRUE(contains(message, array.string() + ": expected a JSON object, found array")) << message;

  fs::path number = write("number.json", "4096");
  message = error_of([&] { ModelConfig::from_file(number); });
  EXPECT_TRUE(contains(message, number.string() + ": expected a JSON object, found integer")) << message;

  fs::path deep = write("deep.json", std::string(100000, '['));
  message = error_of([&] { ModelConfig::from_file(deep); });
  EXPECT_TRUE(contains(message, deep.string() + ": JSON nested deeper than")) << message;

  fs::path huge = write("huge.json", flash_json().dump() + std::string(std::size_t{2} << 20, ' '));
  message = error_of([&] { ModelConfig::from_file(huge); });
  EXPECT_TRUE(contains(message, huge.string())) << message;
  EXPECT_TRUE(contains(message, "limit")) << message;

  fs::path directory = dir_ / "a_directory";
  fs::create_directories(directory);
  message = error_of([&] { ModelConfig::from_file(directory); });
  EXPECT_TRUE(contains(message, directory.string())) << message;
}

TEST_F(ModelConfigFiles, ToJsonWrittenAndReadBack) {
  for (const std::string& name : preset_names()) {
    ModelConfig c = preset_config(name);
    fs::path path = write(name + ".json", c.to_json().dump(2));
    expect_same(ModelConfig::from_file(path), c, name);
  }
}

TEST(ModelConfig, FromJsonOfANonObject) {
  for (const Json& j : {Json::array(), Json(nullptr), Json("config"), Json(3.5)}) {
    std::string message = error_of([&] { ModelConfig::from_json(j, "where.json"); });
    EXPECT_TRUE(contains(message, "where.json: expected a JSON object, found " + json_type_name(j))) << message;
  }
}

}  // namespace
}  // namespace dsv4
