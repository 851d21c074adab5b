// Synthetic checkpoints: official layout and dtypes, deterministic, sensible magnitudes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "common/error.h"
#include "common/json_io.h"
#include "model/model_weights.h"
#include "model/presets.h"
#include "model/safetensors.h"
#include "model/synthetic_checkpoint.h"
#include "numerics/bf16.h"
#include "numerics/block_quant.h"
#include "numerics/ue8m0.h"

namespace dsv4 {
namespace {

class Synthetic : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("dsv4_synth_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

bool same_bytes(const Checkpoint& a, const Checkpoint& b) {
  if (a.tensors().size() != b.tensors().size()) return false;
  for (const auto& [name, v] : a.tensors()) {
    const TensorView* w = b.find(name);
    if (w == nullptr || w->bytes.size() != v.bytes.size() ||
        std::memcmp(w->bytes.data(), v.bytes.data(), v.bytes.size()) != 0)
      return false;
  }
  return true;
}

TEST_F(Synthetic, DeterministicInSeedAndIndependentOfSharding) {
  const ModelConfig c = tiny_config();
  write_synthetic_checkpoint(c, dir_ / "a", {.seed = 3});
  write_synthetic_checkpoint(c, dir_ / "b", {.seed = 3, .max_shard_bytes = 1 << 20});
  write_synthetic_checkpoint(c, dir_ / "c", {.seed = 4});
  Checkpoint a = Checkpoint::open(dir_ / "a"), b = Checkpoint::open(dir_ / "b"), d = Checkpoint::open(dir_ / "c");
  EXPECT_EQ(a.files().size(), 1u);
  EXPECT_TRUE(std::filesystem::exists(dir_ / "a" / "model.safetensors"));
  EXPECT_GT(b.files().size(), 3u);
  EXPECT_TRUE(std::filesystem::exists(dir_ / "b" / "model.safetensors.index.json"));
  EXPECT_TRUE(same_bytes(a, b));
  EXPECT_FALSE(same_bytes(a, d));
  // config.json written next to the weights reads back as the same config.
  EXPECT_EQ(ModelConfig::from_file(dir_ / "b" / "config.json").to_json(), c.to_json());
  EXPECT_TRUE(check_weights(c, b).empty());
}

std::vector<float> dequant_fp8(const TensorView& w, const TensorView& s) {
  auto rows = static_cast<std::size_t>(w.shape[0]), cols = static_cast<std::size_t>(w.shape[1]);
  std::vector<float> out(rows * cols);
  dequantize_weight_fp8_128x128(w.bytes.data(), s.bytes.data(), rows, cols, out.data());
  return out;
}

double rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s / static_cast<double>(v.size()));
}

TEST_F(Synthetic, MagnitudesAreSensible) {
  const ModelConfig c = tiny_config();
  write_synthetic_checkpoint(c, dir_, {.seed = 11});
  Checkpoint ck = Checkpoint::open(dir_);
  // FP8 linear weights ~ U(+-sqrt(3/in)): rms ~ 1/sqrt(in); scales are UE8M0 powers of two.
  auto wq_b = dequant_fp8(*ck.find("layers.1.attn.wq_b.weight"), *ck.find("layers.1.attn.wq_b.scale"));
  EXPECT_NEAR(rms(wq_b), 1.0 / std::sqrt(128.0), 0.1 / std::sqrt(128.0));
  for (float x : wq_b) ASSERT_TRUE(std::isfinite(x));
  // Output projections are damped by half.
  auto wo_b = dequant_fp8(*ck.find("layers.1.attn.wo_b.weight"), *ck.find("layers.1.attn.wo_b.scale"));
  EXPECT_NEAR(rms(wo_b), 0.5 / std::sqrt(256.0), 0.05 / std::sqrt(256.0));
  // FP4 experts: packed, with per-32 scales; decode to the same magnitude rule.
  const TensorView& w1 = *ck.find("layers.3.ffn.experts.5.w1.weight");
  const TensorView& s1 = *ck.find("layers.3.ffn.experts.5.w1.scale");
  EXPECT_EQ(w1.dtype, DType::kI8);
  EXPECT_EQ(s1.dtype, DType::kF8E8M0);
  std::vector<float> e(static_cast<std::size_t>(128 * 256));
  dequantize_weight_fp4_1x32(w1.bytes.data(), s1.bytes.data(), 128, 256, e.data());
  EXPECT_NEAR(rms(e), 1.0 / std::sqrt(256.0), 0.15 / std::sqrt(256.0));
  // Norm weights near 1 (bf16); sinks fp32 in [-1, 1].
  const TensorView& norm = *ck.find("layers.2.attn.kv_norm.weight");
  ASSERT_EQ(norm.dtype, DType::kBF16);
  for (std::size_t i = 0; i < norm.bytes.size(); i += 2) {
    std::uint16_t b;
    std::memcpy(&b, norm.bytes.data() + i, 2);
    float v = bf16_bits_to_f32(b);
    ASSERT_GE(v, 0.89f);
    ASSERT_LE(v, 1.11f);
  }
  // Hash routing: each token's experts are distinct and in range.
  const TensorView& tid = *ck.find("layers.0.ffn.gate.tid2eid");
  ASSERT_EQ(tid.dtype, DType::kI32);
  std::vector<std::int32_t> ids(tid.bytes.size() / 4);
  std::memcpy(ids.data(), tid.bytes.data(), tid.bytes.size());
  std::set<std::int32_t> used;
  for (std::size_t v = 0; v < ids.size(); v += 2) {
    ASSERT_NE(ids[v], ids[v + 1]);
    ASSERT_TRUE(ids[v] >= 0 && ids[v] < 8 && ids[v + 1] >= 0 && ids[v + 1] < 8);
    used.insert(ids[v]);
  }
  EXPECT_EQ(used.size(), 8u);
}

TEST_F(Synthetic, RefusesHugeModels) {
  try {
    write_synthetic_checkpoint(v4_flash_config(), dir_);
    FAIL() << "wrote a Flash-sized checkpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("over the limit"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ / "config.json"));
}

}  // namespace
}  // namespace dsv4
