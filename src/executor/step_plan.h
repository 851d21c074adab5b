// StepPlan: the one plain data structure between the scheduler and an executor, planned once
// per step and read by every layer (FlashInfer's plan/run split).
//
// The scheduler decides which tokens of which sequences run; the KV cache manager fills in
// where each token reads and writes (StepView) and which blocks got new pages since the last
// step (PageTableChanges); finish_step_plan() derives everything an executor would otherwise
// re-derive per layer and per token: the row of every token, the compressed entries the step
// completes with the sources their pooling reads, and the MTP rows. Every array is a flat
// int32 vector, so a GPU executor uploads the whole plan in one copy; the CPU executor reads
// the very same arrays.
#pragma once

#include <cstdint>
#include <vector>

#include "kvcache/block_pool.h"
#include "kvcache/cache_spec.h"
#include "kvcache/step_view.h"

namespace dsv4 {

// The compressed entries of one compress ratio (4: CSA, 128: HCA) that this step completes,
// and where their pooling reads (SPEC.md 3.3). Entry j of a row pools the positions
// first(j) .. first(j) + num_slots() - 1 with first(j) = 4j - 4 (ratio 4: the previous block's
// 4 tokens, then this block's 4) or 128j (ratio 128); slot k of the pooling reads position
// first(j) + k from:
//   source >= 0       step token `source` (its compressor projections are in step scratch);
//   kFromStateCache   the compressor-state cache of an earlier step, at state_slots[i][...] in
//                     state group state_groups[i] (the attention compressor's state, and for
//                     ratio 4 also the indexer compressor's state: different pages, same positions);
//   kNoPosition       nothing (ratio 4, j = 0: there is no previous block; weight 0).
struct CompressionPlan {
  static constexpr std::int32_t kFromStateCache = -1;
  static constexpr std::int32_t kNoPosition = -2;

  std::int32_t ratio = 0;                   // 4 or 128; 0 when the model has no such layer
  std::vector<std::int32_t> token;          // [writes] the step token whose position completes the entry
  std::vector<std::int32_t> entry;          // [writes] j = position / ratio
  std::vector<std::int32_t> source;         // [writes * num_slots()]
  std::vector<std::int32_t> state_groups;   // cache groups of the states this ratio pools from
  std::vector<std::vector<std::int32_t>> state_slots;  // [state_groups][writes * num_slots()], -1 unless kFromStateCache

  std::int32_t num_slots() const { return ratio == 4 ? 8 : ratio; }
  std::int64_t num_writes() const { return static_cast<std::int64_t>(token.size()); }
  std::int32_t first_position(std::int64_t write) const {
    const std::int32_t j = entry[static_cast<std::size_t>(write)];
    return ratio == 4 ? 4 * j - 4 : ratio * j;
  }
};

struct StepPlan {
  // Rows (sequences), their positions and per-cache-group slot mappings and block tables.
  StepView view;
  // The input token of every step token, [tokens] (token t of the step is at position
  // view.positions[t] of sequence view.seqs[token_row[t]]).
  std::vector<std::int32_t> token_ids;
  // Step-token indices whose logits are wanted, ascending (usually the last token of each
  // row that samples; every token when scoring a prompt).
  std::vector<std::int32_t> logits_tokens;
  // Multi-token prediction (SPEC.md 3.6), off when empty. Otherwise [tokens]: the token that
  // follows each step token (the MTP block's input at that position), -1 where it is not known
  // yet; within a row the known ones must come first. The executor then also returns, after
  // the logits_tokens rows, one row of MTP logits per known entry, in step order.
  std::vector<std::int32_t> mtp_tokens;
  // Pages of the blocks allocated since the previous plan (KvCacheManager::take_page_changes).
  PageTableChanges page_changes;

  // Derived by finish_step_plan:
  std::vector<std::int32_t> token_row;  // [tokens] the row of each step token
  std::vector<std::int32_t> mtp_rows;   // step tokens that run the MTP block (mtp_tokens[t] >= 0), ascending
  CompressionPlan c4, c128;

  std::int64_t num_tokens() const { return static_cast<std::int64_t>(token_ids.size()); }
  std::int64_t num_rows() const { return static_cast<std::int64_t>(view.seqs.size()); }
  std::int64_t num_mtp_tokens() const { return static_cast<std::int64_t>(mtp_rows.size()); }
  std::int64_t num_logits_rows() const { return static_cast<std::int64_t>(logits_tokens.size()) + num_mtp_tokens(); }
};

// Validates the plan's shapes (throws std::logic_error naming the first inconsistency) and
// fills token_row, mtp_rows, c4 and c128. Call once after view, token_ids, logits_tokens and
// mtp_tokens are set.
void finish_step_plan(StepPlan& plan, const CacheSpec& spec);

// The plan of the MTP block (SPEC.md 3.6): the rows' tokens listed in plan.mtp_rows, with
// the next tokens (plan.mtp_tokens) as their inputs, the same positions, slot mappings and
// block tables; no logits tokens. Sub-plan token i is main-plan token plan.mtp_rows[i].
StepPlan mtp_sub_plan(const StepPlan& plan);

// The slot of entry `index` (a position for sliding groups, an entry index for compressed
// groups) of row `row` in group `group`, through the row's block table; -1 when the table does
// not hold it.
std::int32_t table_slot(const StepView& view, const CacheGroup& group, int group_index, std::int64_t row,
                        std::int64_t index);

}  // namespace dsv4
