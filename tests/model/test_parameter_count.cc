// Parameter counts from the config alone. The published figures are pinned exactly
// (values worked out independently from the SPEC.md section 2 shapes) and a closed-form
// formula written here checks count_parameters on scaled-down variants.
#include <gtest/gtest.h>

#include <cmath>

#include "model/parameter_count.h"
#include "model/presets.h"

namespace dsv4 {
namespace {

double round1(double billions) { return std::round(billions * 10) / 10; }

TEST(ParameterCount, V4FlashMatchesPublishedFigures) {
  ParameterCount p = count_parameters(v4_flash_config());
  EXPECT_EQ(p.total, 284332240471);
  EXPECT_EQ(p.activated, 13270101591);
  EXPECT_DOUBLE_EQ(round1(static_cast<double>(p.total) / 1e9), 284.3);
  EXPECT_DOUBLE_EQ(round1(static_cast<double>(p.activated) / 1e9), 13.3);
  EXPECT_EQ(p.embedding, 129280LL * 4096);
  EXPECT_EQ(p.mtp_total, 6610048891);
}

TEST(ParameterCount, V4ProMatchesPublishedFigures) {
  ParameterCount p = count_parameters(v4_pro_config());
  EXPECT_EQ(p.total, 1572997201763);
  EXPECT_EQ(p.activated, 48852402019);
  EXPECT_DOUBLE_EQ(round1(static_cast<double>(p.total) / 1e9), 1573.0);
  EXPECT_DOUBLE_EQ(round1(static_cast<double>(p.activated) / 1e9), 48.9);
  // "1.6T with MTP" (SPEC.md section 1).
  EXPECT_DOUBLE_EQ(std::round(static_cast<double>(p.total + p.mtp_total) / 1e11) / 10, 1.6);
}

// An independent closed form of the SPEC.md section 2 shapes.
struct Formula {
  std::int64_t total = 0, activated = 0, mtp = 0;
};
Formula closed_form(const ModelConfig& c) {
  const std::int64_t D = c.hidden_size, hc = c.hc_mult, H = c.num_attention_heads, d = c.head_dim;
  const std::int64_t ql = c.q_lora_rank, G = c.o_groups, ol = c.o_lora_rank, E = c.n_routed_experts;
  const std::int64_t expert = 3 * D * c.moe_intermediate_size;
  auto block = [&](std::int64_t layer, std::int64_t& total, std::int64_t& active) {
    const std::int64_t r = c.compress_ratios[static_cast<std::size_t>(layer)];
    std::int64_t p = 2 * ((2 + hc) * hc * hc * D + (2 + hc) * hc + 3) + 2 * D;      // hc + norms
    p += H + ql * D + ql + H * d * ql + d * D + d + ol * H * d + D * G * ol;        // attention
    if (r > 0) {
      const std::int64_t coff = r == 4 ? 2 : 1;
      p += r * coff * d + 2 * coff * d * D + d;                                     // compressor
    }
    if (r == 4) {
      const std::int64_t ih = c.index_n_heads, id = c.index_head_dim;
      p += ih * id * ql + ih * D + 4 * 2 * id + 2 * 2 * id * D + id;                // indexer
    }
    p += E * D + (layer < c.num_hash_layers ? 0 : E) + expert;                      // gate + shared
    total += p + E * expert;
    active += p + c.num_experts_per_tok * expert;
  };
  Formula f;
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) block(i, f.total, f.activated);
  const std::int64_t final_head = D + hc * hc * D + hc + 1;
  f.total += final_head + 2 * c.vocab_size * D;
  f.activated += final_head + c.vocab_size * D;
  std::int64_t mtp_active = 0;
  for (std::int64_t k = 0; k < c.num_nextn_predict_layers; ++k) {
    block(c.num_hidden_layers + k, f.mtp, mtp_active);
    f.mtp += 2 * D * D + 3 * D + hc * hc * D + hc + 1;
  }
  return f;
}

TEST(ParameterCount, MatchesClosedFormOnVariants) {
  std::vector<ModelConfig> configs = {tiny_config(), v4_flash_config(), v4_pro_config()};
  ModelConfig wide = tiny_config();
  wide.hidden_size = 512;
  wide.n_routed_experts = 16;
  wide.num_experts_per_tok = 4;
  wide.num_hash_layers = 2;
  wide.num_hidden_layers = 6;
  wide.num_nextn_predict_layers = 2;
  wide.compress_ratios = {128, 4, 0, 4, 128, 4, 0, 0};
  configs.push_back(wide);
  for (const ModelConfig& c : configs) {
    ParameterCount p = count_parameters(c);
    Formula f = closed_form(c);
    EXPECT_EQ(p.total, f.total) << "hidden " << c.hidden_size;
    EXPECT_EQ(p.activated, f.activated) << "hidden " << c.hidden_size;
    EXPECT_EQ(p.mtp_total, f.mtp) << "hidden " << c.hidden_size;
  }
}

TEST(ParameterCount, StoredBytesCountPackingAndScales) {
  // FP4 experts take half a byte per parameter plus one scale byte per 32; FP8 one byte.
  ModelConfig c = tiny_config();
  ParameterCount fp4 = count_parameters(c);
  c.expert_dtype = "fp8";
  ParameterCount fp8 = count_parameters(c);
  EXPECT_EQ(fp4.total, fp8.total);
  const std::int64_t expert_params =
      3 * c.hidden_size * c.moe_intermediate_size * c.n_routed_experts * (c.num_hidden_layers + 1);
  // fp8 stores 1 B/param + 128x128 scales; fp4 stores 0.5 B/param + 1/32 B/param.
  const std::int64_t fp4_bytes = expert_params / 2 + expert_params / 32;
  const std::int64_t tiles_per_expert = 2 * (c.moe_intermediate_size / 128) * (c.hidden_size / 128) +
                                        (c.hidden_size / 128) * (c.moe_intermediate_size / 128);
  const std::int64_t fp8_bytes =
      expert_params + tiles_per_expert * c.n_routed_experts * (c.num_hidden_layers + 1);
  EXPECT_EQ(fp8.stored_bytes - fp4.stored_bytes, fp8_bytes - fp4_bytes);
}

}  // namespace
}  // namespace dsv4
