// libFuzzer target: config.json text -> parse_json -> ModelConfig::from_json.
//
// Outside input may only ever produce a dsv4::Error, and that error must name the source.
// Any other exception escaping, a crash, a sanitizer report or a broken invariant below
// is a bug. For configs that are accepted, the derived accessors must agree with the
// validation, and to_json must round-trip (through text) to the same config.
//
//   ./fuzz_config -max_total_time=60 <scratch copy of fuzz/corpus/config>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/error.h"
#include "common/json_io.h"
#include "model/model_config.h"

namespace {

constexpr const char* kWhere = "fuzz/config.json";

[[noreturn]] void bug(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_config: %s\n%s\n", what, detail.c_str());
  std::abort();
}

void check_error(const dsv4::Error& e) {
  std::string message = e.what();
  if (message.find(kWhere) == std::string::npos) bug("error does not name the source", message);
}

void check_accepted(const dsv4::ModelConfig& c) {
  using dsv4::AttentionKind;
  if (static_cast<std::int64_t>(c.compress_ratios.size()) != c.num_blocks_total())
    bug("compress_ratios length differs from num_blocks_total", c.to_json().dump());
  for (std::int64_t i = 0; i < c.num_blocks_total(); ++i) {
    std::int64_t r = c.compress_ratio(i);
    AttentionKind kind = c.attention_kind(i);
    bool ok = (r == 0 && kind == AttentionKind::kWindow) || (r == 4 && kind == AttentionKind::kCsa) ||
              (r == 128 && kind == AttentionKind::kHca);
    if (!ok) bug("compress ratio / attention kind mismatch", std::to_string(i));
    if (i >= c.num_hidden_layers && r != 0) bug("MTP block with a compressed cache accepted", std::to_string(i));
  }
  if (c.layers_of_ratio(0) + c.layers_of_ratio(4) + c.layers_of_ratio(128) != c.num_hidden_layers)
    bug("layers_of_ratio does not add up", c.to_json().dump());
  if (c.num_key_value_heads != 1 || c.o_groups <= 0 || c.num_attention_heads % c.o_groups != 0 ||
      c.num_experts_per_tok > c.n_routed_experts || c.index_head_dim <= 0 ||
      (c.index_head_dim & (c.index_head_dim - 1)) != 0 || c.nope_head_dim() <= 0)
    bug("accepted a config that breaks a validation rule", c.to_json().dump());

  // Round trip through text.
  dsv4::Json first = c.to_json();
  std::string text = first.dump();
  dsv4::ModelConfig back;
  try {
    back = dsv4::ModelConfig::from_json(dsv4::parse_json(text, "round trip"), "round trip");
  } catch (const dsv4::Error& e) {
    bug("to_json output rejected by from_json", std::string(e.what()) + "\n" + text);
  }
  if (back.to_json() != first) bug("to_json -> from_json round trip changed the config", text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  dsv4::Json json;
  try {
    json = dsv4::parse_json(text, kWhere);
  } catch (const dsv4::Error& e) {
    check_error(e);
    return 0;
  }
  dsv4::ModelConfig config;
  try {
    config = dsv4::ModelConfig::from_json(json, kWhere);
  } catch (const dsv4::Error& e) {
    check_error(e);
    return 0;
  }
  check_accepted(config);
  return 0;
}
