// Built-in configurations: the published V4-Flash and V4-Pro shapes (SPEC.md section 1)
// and `tiny`, a scaled-down model with the full V4 structure that the CPU runs quickly
// (window-only, CSA and HCA layers; hash- and score-routed MoE; hyper-connections; one
// MTP block; an indexer top-k smaller than the compressed blocks of a short prompt).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "model/model_config.h"

namespace dsv4 {

ModelConfig v4_flash_config();
ModelConfig v4_pro_config();
ModelConfig tiny_config();

// "flash", "pro" or "tiny"; throws Error listing the names for anything else.
ModelConfig preset_config(std::string_view name);
std::vector<std::string> preset_names();

}  // namespace dsv4
