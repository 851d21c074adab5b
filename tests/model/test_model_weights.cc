// The tensor inventory derived from the config and the binding of checkpoints to it.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>

#include "common/error.h"
#include "model/model_weights.h"
#include "model/presets.h"
#include "model/safetensors.h"
#include "model/synthetic_checkpoint.h"

namespace dsv4 {
namespace {

std::map<std::string, TensorSpec> by_name(const ModelConfig& c) {
  std::map<std::string, TensorSpec> m;
  for (auto& s : expected_tensors(c)) {
    EXPECT_TRUE(m.emplace(s.name, s).second) << "duplicate name " << s.name;
  }
  return m;
}

using Shape = std::vector<std::int64_t>;

TEST(ExpectedTensors, TinyShapesFollowTheSpec) {
  ModelConfig c = tiny_config();  // ratios {0, 4, 128, 4 | MTP 0}, one hash layer
  auto t = by_name(c);
  const std::int64_t D = 256, hc = 4, H = 4, d = 512;
  EXPECT_EQ(t.at("embed.weight").shape, (Shape{4096, D}));
  EXPECT_EQ(t.at("head.weight").shape, (Shape{4096, D}));
  EXPECT_EQ(t.at("hc_head_fn").shape, (Shape{hc, hc * D}));
  EXPECT_EQ(t.at("layers.0.hc_attn_fn").shape, (Shape{(2 + hc) * hc, hc * D}));
  EXPECT_EQ(t.at("layers.0.hc_ffn_scale").shape, (Shape{3}));
  EXPECT_EQ(t.at("layers.0.attn.wq_b.weight").shape, (Shape{H * d, 128}));
  EXPECT_EQ(t.at("layers.0.attn.wq_b.scale").shape, (Shape{16, 1}));
  EXPECT_EQ(t.at("layers.0.attn.wo_a.weight").shape, (Shape{2 * 128, H * d / 2}));
  EXPECT_EQ(t.at("layers.0.attn.wo_b.weight").shape, (Shape{D, 2 * 128}));
  EXPECT_EQ(t.at("layers.0.attn.wkv.weight").dtypes.front(), DType::kF8E4M3);
  EXPECT_EQ(t.at("layers.0.attn.wkv.scale").dtypes.front(), DType::kF8E8M0);
  // Window-only layer: no compressor, no indexer; hash-routed: tid2eid, no bias.
  EXPECT_FALSE(t.count("layers.0.attn.compressor.ape"));
  EXPECT_EQ(t.at("layers.0.ffn.gate.tid2eid").shape, (Shape{4096, 2}));
  EXPECT_FALSE(t.count("layers.0.ffn.gate.bias"));
  // CSA layer: overlapping compressor (coff 2) and the indexer with its own compressor.
  EXPECT_EQ(t.at("layers.1.attn.compressor.ape").shape, (Shape{4, 2 * d}));
  EXPECT_EQ(t.at("layers.1.attn.compressor.wkv.weight").shape, (Shape{2 * d, D}));
  EXPECT_EQ(t.at("layers.1.attn.compressor.wkv.weight").dtypes.front(), DType::kBF16);
  EXPECT_EQ(t.at("layers.1.attn.indexer.wq_b.weight").shape, (Shape{4 * 128, 128}));
  EXPECT_EQ(t.at("layers.1.attn.indexer.weights_proj.weight").shape, (Shape{4, D}));
  EXPECT_EQ(t.at("layers.1.attn.indexer.compressor.ape").shape, (Shape{4, 256}));
  EXPECT_EQ(t.at("layers.1.attn.indexer.compressor.norm.weight").shape, (Shape{128}));
  EXPECT_EQ(t.at("layers.1.ffn.gate.bias").shape, (Shape{8}));
  EXPECT_FALSE(t.count("layers.1.ffn.gate.tid2eid"));
  // HCA layer: compressor without overlap, no indexer.
  EXPECT_EQ(t.at("layers.2.attn.compressor.ape").shape, (Shape{128, d}));
  EXPECT_FALSE(t.count("layers.2.attn.indexer.wq_b.weight"));
  // Experts: packed FP4 with per-32 scales; the shared expert is FP8.
  EXPECT_EQ(t.at("layers.1.ffn.experts.7.w1.weight").shape, (Shape{128, D / 2}));
  EXPECT_EQ(t.at("layers.1.ffn.experts.7.w1.scale").shape, (Shape{128, D / 32}));
  EXPECT_EQ(t.at("layers.1.ffn.experts.7.w2.weight").shape, (Shape{D, 128 / 2}));
  EXPECT_EQ(t.at("layers.1.ffn.experts.7.w1.weight").parameters, 128 * D);
  EXPECT_FALSE(t.count("layers.1.ffn.experts.8.w1.weight"));
  EXPECT_EQ(t.at("layers.1.ffn.shared_experts.w2.weight").shape, (Shape{D, 128}));
  // MTP block: a window-only, score-routed block plus its own projections and head mixing.
  EXPECT_EQ(t.at("mtp.0.e_proj.weight").shape, (Shape{D, D}));
  EXPECT_EQ(t.at("mtp.0.h_proj.scale").shape, (Shape{2, 2}));
  EXPECT_TRUE(t.count("mtp.0.enorm.weight") && t.count("mtp.0.hnorm.weight") && t.count("mtp.0.norm.weight"));
  EXPECT_TRUE(t.count("mtp.0.hc_head_fn") && t.count("mtp.0.ffn.gate.bias"));
  EXPECT_FALSE(t.count("mtp.0.attn.compressor.ape"));
  EXPECT_TRUE(t.at("mtp.0.attn.wkv.weight").mtp);
  EXPECT_FALSE(t.count("layers.4.attn.wkv.weight"));
}

TEST(ExpectedTensors, FlashInventorySize) {
  ModelConfig c = v4_flash_config();
  auto specs = expected_tensors(c);
  std::int64_t csa_indexers = 0;
  for (auto& s : specs) csa_indexers += s.name.ends_with("attn.indexer.wq_b.weight");
  EXPECT_EQ(csa_indexers, 21);
  // Every scale names the weight it scales, and that weight exists.
  auto m = by_name(c);
  for (auto& s : specs) {
    if (s.role == TensorRole::kBlockScale) {
      EXPECT_TRUE(m.count(s.scale_of)) << s.name;
    }
  }
}

class Binding : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("dsv4_binding_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    write_synthetic_checkpoint(config_, dir_ / "good", {.seed = 7});
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Copies the good checkpoint into one file after `edit` changes its tensor list.
  std::filesystem::path rewrite(const std::function<void(std::vector<TensorData>&)>& edit) {
    Checkpoint good = Checkpoint::open(dir_ / "good");
    std::vector<TensorData> tensors;
    for (const auto& [name, v] : good.tensors())
      tensors.push_back({name, v.dtype, v.shape, std::vector<std::uint8_t>(v.bytes.begin(), v.bytes.end())});
    edit(tensors);
    auto out = dir_ / "edited";
    std::filesystem::create_directories(out);
    write_safetensors(out / "model.safetensors", tensors);
    return out;
  }

  ModelConfig config_ = tiny_config();
  std::filesystem::path dir_;
};

TEST_F(Binding, SyntheticCheckpointBinds) {
  Checkpoint ck = Checkpoint::open(dir_ / "good");
  BoundWeights w = bind_weights(config_, ck);
  EXPECT_EQ(w.by_name.size(), expected_tensors(config_).size());
  EXPECT_EQ(w.at("layers.2.attn.compressor.ape").shape, (Shape{128, 512}));
  EXPECT_THROW(w.at("nope"), Error);
}

TEST_F(Binding, AllProblemsReportedTogether) {
  auto dir = rewrite([](std::vector<TensorData>& t) {
    std::erase_if(t, [](const TensorData& x) {
      return x.name == "layers.1.attn.wkv.weight" || x.name == "mtp.0.enorm.weight";
    });
    for (auto& x : t) {
      if (x.name == "layers.0.attn.attn_sink") {  // wrong dtype (I32 is not a float)
        x.dtype = DType::kI32;
      }
      if (x.name == "norm.weight") {  // wrong shape: [256] -> [128, 2]
        x.shape = {128, 2};
      }
    }
    t.push_back({"layers.0.attn.bogus", DType::kF32, {2}, std::vector<std::uint8_t>(8, 1)});
  });
  Checkpoint ck = Checkpoint::open(dir);
  auto problems = check_weights(config_, ck);
  ASSERT_EQ(problems.size(), 4u);
  try {
    bind_weights(config_, ck);
    FAIL() << "bind_weights accepted a broken checkpoint";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("2 missing tensors"), std::string::npos) << m;
    EXPECT_NE(m.find("layers.1.attn.wkv.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("mtp.0.enorm.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("1 unexpected tensors: layers.0.attn.bogus"), std::string::npos) << m;
    EXPECT_NE(m.find("'layers.0.attn.attn_sink' has dtype I32"), std::string::npos) << m;
    EXPECT_NE(m.find("'norm.weight' has shape [128, 2], expected [256]"), std::string::npos) << m;
  }
}

TEST_F(Binding, SmallTensorsAcceptAnyFloatDtype) {
  auto dir = rewrite([](std::vector<TensorData>& t) {
    for (auto& x : t)
      if (x.name == "layers.0.attn.attn_sink") {  // fp32 [4] -> bf16 [4]
        x.dtype = DType::kBF16;
        x.bytes.resize(8);
      }
  });
  EXPECT_TRUE(check_weights(config_, Checkpoint::open(dir)).empty());
}

TEST_F(Binding, ConfigOfAnotherModelIsRejected) {
  ModelConfig other = config_;
  other.n_routed_experts = 4;  // the checkpoint has 8 experts per layer
  auto problems = check_weights(other, Checkpoint::open(dir_ / "good"));
  ASSERT_FALSE(problems.empty());
  EXPECT_NE(problems.front().find("unexpected tensors"), std::string::npos) << problems.front();
}

}  // namespace
}  // namespace dsv4
