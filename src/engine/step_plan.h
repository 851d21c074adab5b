// StepPlan: the one plain data structure between the scheduler and an executor (DESIGN.md).
// The scheduler decides which tokens of which sequences run in this step; the KV cache
// manager fills in where each token reads and writes (StepView); the executor runs the
// model over it, filling the caches and the requested logits.
#pragma once

#include <cstdint>
#include <vector>

#include "kvcache/step_view.h"

namespace dsv4 {

struct StepPlan {
  // Rows (sequences), their positions and per-cache-group slot mappings and block tables.
  StepView view;
  // The input token of every step token, [tokens] (token t of the step is at position
  // view.positions[t] of sequence view.seqs[row]).
  std::vector<std::int32_t> token_ids;
  // Step-token indices whose logits are wanted, ascending (usually the last token of each
  // row that samples; every token when scoring a prompt).
  std::vector<std::int64_t> logits_tokens;
  // Multi-token prediction (SPEC.md 3.6), off when empty. Otherwise [tokens]: the token that
  // follows each step token (the MTP block's input at that position), -1 where it is not known
  // yet; within a row the known ones must come first. The executor then also returns, after
  // the logits_tokens rows, one row of MTP logits per known entry, in step order.
  std::vector<std::int32_t> mtp_tokens;

  std::int64_t num_tokens() const { return static_cast<std::int64_t>(token_ids.size()); }
  std::int64_t num_rows() const { return static_cast<std::int64_t>(view.seqs.size()); }
  std::int64_t num_mtp_tokens() const {
    std::int64_t n = 0;
    for (std::int32_t t : mtp_tokens) n += t >= 0;
    return n;
  }
};

}  // namespace dsv4
