// Writes synthetic checkpoints in the official V4 layout and dtypes (SPEC.md section 2):
// FP8 e4m3 dense weights with UE8M0 128x128 block scales, packed FP4 experts with per-32
// UE8M0 scales, bf16 / fp32 small tensors, sharded with an index when large, plus
// config.json and generation_config.json.
//
// Values are deterministic in (seed, tensor name) -- independent of write order and
// platform (own PRNG, uniform distributions) -- and sized so activations stay finite
// through many layers: linear weights ~ U(+-sqrt(3/fan_in)) (outputs of unit scale), output
// projections damped, norm weights near 1, hyper-connection mixers scaled by 1/sqrt(hc*D).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "model/model_config.h"

namespace dsv4 {

struct SyntheticOptions {
  std::uint64_t seed = 0;
  std::size_t max_shard_bytes = std::size_t{2} << 30;
  // Refuse to write more than this (a synthetic V4-Flash would be ~150 GB).
  std::size_t max_total_bytes = std::size_t{8} << 30;
};

// Writes into `dir` (created if needed). Throws Error if the checkpoint would exceed
// options.max_total_bytes or the directory cannot be written.
void write_synthetic_checkpoint(const ModelConfig& config, const std::filesystem::path& dir,
                                const SyntheticOptions& options = {});

}  // namespace dsv4
