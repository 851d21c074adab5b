#include "model/parameter_count.h"

#include <map>

#include "model/model_weights.h"

namespace dsv4 {

ParameterCount count_parameters(const ModelConfig& config) {
  ParameterCount count;
  // Routed-expert parameters per block: all of them count towards the total, only
  // num_experts_per_tok / n_routed_experts of them towards the activated count.
  std::map<std::int64_t, std::int64_t> routed_per_block;
  for (const TensorSpec& spec : expected_tensors(config)) {
    std::int64_t element_bytes = static_cast<std::int64_t>(dtype_size(spec.dtypes.front()));
    std::int64_t stored = element_bytes;
    for (auto s : spec.shape) stored *= s;
    count.stored_bytes += stored;
    if (spec.parameters == 0) continue;
    const bool routed = spec.expert >= 0;
    if (spec.mtp) {
      count.mtp_total += spec.parameters;
      if (routed) {
        routed_per_block[spec.block] += spec.parameters;
      } else {
        count.mtp_activated += spec.parameters;
      }
      continue;
    }
    count.total += spec.parameters;
    if (spec.role == TensorRole::kEmbedding) {
      count.embedding += spec.parameters;
    } else if (routed) {
      count.routed_experts += spec.parameters;
      routed_per_block[spec.block] += spec.parameters;
    } else {
      count.activated += spec.parameters;
    }
  }
  for (const auto& [block, routed] : routed_per_block) {
    std::int64_t active = routed / config.n_routed_experts * config.num_experts_per_tok;
    if (block >= config.num_hidden_layers) {
      count.mtp_activated += active;
    } else {
      count.activated += active;
    }
  }
  return count;
}

}  // namespace dsv4
