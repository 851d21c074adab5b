// The tensor inventory of a V4 checkpoint (SPEC.md section 2), derived from the config
// alone, and the binding of a checkpoint's tensors to it.
//
// `expected_tensors(config)` lists every tensor by name with the dtypes it may be stored in
// and its stored shape (FP4 experts packed: [out, in/2]; FP8 weights with a [ceil(out/128),
// ceil(in/128)] UE8M0 `scale`; FP4 weights with an [out, in/32] scale). Parameter counting,
// the synthetic checkpoint writer and `bind_weights` all walk this one list, so they cannot
// disagree about what a checkpoint holds.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/dtype.h"
#include "model/model_config.h"
#include "model/safetensors.h"

namespace dsv4 {

// What a tensor is, for counting parameters and choosing synthetic values.
enum class TensorRole {
  kEmbedding,     // embed.weight
  kHead,          // head.weight
  kDenseFp8,      // FP8 e4m3 weight of a linear layer
  kExpertFp4,     // routed/shared expert weight stored as packed FP4 (or FP8 when expert_dtype = fp8)
  kBlockScale,    // UE8M0 scales of an FP8 or FP4 weight (not parameters)
  kLinearBf16,    // bf16 linear weights (compressor wkv/wgate, weights_proj, gate.weight)
  kNormWeight,    // RMSNorm weights
  kSmallFp32,     // attn_sink, ape, hc_* tensors, gate bias
  kRoutingTable,  // tid2eid (integer expert ids, not parameters)
};

struct TensorSpec {
  std::string name;
  TensorRole role = TensorRole::kSmallFp32;
  std::vector<DType> dtypes;            // accepted stored dtypes; the first is what we write
  std::vector<std::int64_t> shape;      // stored shape
  std::int64_t parameters = 0;          // logical parameters (FP4 packed counts 2 per byte; scales 0)
  std::int64_t block = -1;              // decoder block index (num_hidden_layers.. = MTP), -1 = global
  std::int64_t expert = -1;             // routed expert index, -1 otherwise
  bool mtp = false;                     // belongs to an MTP block
  std::string scale_of;                 // for kBlockScale: the weight it scales
};

std::vector<TensorSpec> expected_tensors(const ModelConfig& config);

// Every tensor of `checkpoint` checked against `expected_tensors(config)`: missing,
// unexpected, wrong dtype and wrong shape are all collected and reported together in one
// Error. On success returns the views by name.
struct BoundWeights {
  std::map<std::string, const TensorView*> by_name;
  const TensorView& at(const std::string& name) const;
};
BoundWeights bind_weights(const ModelConfig& config, const Checkpoint& checkpoint);

// The same checks, returned as a list of problems instead of thrown (for `dsv4 inspect`).
std::vector<std::string> check_weights(const ModelConfig& config, const Checkpoint& checkpoint);

}  // namespace dsv4
