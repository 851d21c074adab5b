// Parameter counts from the config alone (walking expected_tensors). Conventions of the
// published figures (V4-Flash 284.3B total / 13.3B activated, V4-Pro 1573.0B / 48.9B):
// - total: every main-model parameter including the embedding and head, excluding MTP blocks;
// - activated per token: total minus the embedding, with only num_experts_per_tok routed
//   experts of each layer (the shared expert always counts);
// - block scales and the integer tid2eid tables are not parameters.
#pragma once

#include <cstdint>

#include "model/model_config.h"

namespace dsv4 {

struct ParameterCount {
  std::int64_t total = 0;            // main model (no MTP), embedding included
  std::int64_t activated = 0;        // per token, embedding excluded, MTP excluded
  std::int64_t embedding = 0;
  std::int64_t routed_experts = 0;   // all routed experts of the main model
  std::int64_t mtp_total = 0;        // MTP blocks (they share embed and head)
  std::int64_t mtp_activated = 0;
  std::int64_t stored_bytes = 0;     // checkpoint bytes of every tensor incl. MTP and scales
};

ParameterCount count_parameters(const ModelConfig& config);

}  // namespace dsv4
