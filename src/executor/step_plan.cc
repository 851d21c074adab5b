// finish_step_plan: the arrays every executor would otherwise re-derive per layer (step_plan.h).
#include "executor/step_plan.h"

#include <fmt/format.h>

#include <stdexcept>

namespace dsv4 {
namespace {

std::size_t ix(std::int64_t i) { return static_cast<std::size_t>(i); }

[[noreturn]] void bad_plan(const std::string& what) { throw std::logic_error("step plan: " + what); }

// Entries of ratio r completed by the step's tokens, with their pooling sources.
void plan_compression(StepPlan& plan, const CacheSpec& spec, std::int32_t ratio, CompressionPlan& out) {
  out = CompressionPlan{};
  const CacheKind state_kind = ratio == 4 ? CacheKind::kCsaState : CacheKind::kHcaState;
  const int main_state = spec.group_of(state_kind);
  if (main_state < 0) return;
  out.ratio = ratio;
  out.state_groups.push_back(main_state);
  if (ratio == 4) {
    const int index_state = spec.group_of(CacheKind::kIndexerState);
    if (index_state >= 0) out.state_groups.push_back(index_state);
  }
  out.state_slots.resize(out.state_groups.size());
  const StepView& v = plan.view;
  const std::int32_t slots = out.num_slots();
  for (std::int64_t t = 0; t < plan.num_tokens(); ++t) {
    const std::int32_t p = v.positions[ix(t)];
    if ((p + 1) % ratio != 0) continue;
    const std::int32_t row = plan.token_row[ix(t)];
    const std::int32_t row_first = v.row_start[ix(row)];
    const std::int32_t row_tokens = v.token_start[ix(row) + 1] - v.token_start[ix(row)];
    out.token.push_back(static_cast<std::int32_t>(t));
    out.entry.push_back(p / ratio);
    const std::int32_t first = out.first_position(out.num_writes() - 1);
    for (std::int32_t k = 0; k < slots; ++k) {
      const std::int32_t q = first + k;
      std::int32_t source = CompressionPlan::kNoPosition;
      if (q >= row_first && q < row_first + row_tokens) {
        source = v.token_start[ix(row)] + (q - row_first);
      } else if (q >= 0) {
        source = CompressionPlan::kFromStateCache;
      }
      out.source.push_back(source);
      for (std::size_t i = 0; i < out.state_groups.size(); ++i) {
        std::int32_t slot = -1;
        if (source == CompressionPlan::kFromStateCache) {
          const int g = out.state_groups[i];
          slot = table_slot(v, spec.groups[ix(g)], g, row, q);
          if (slot < 0) {
            bad_plan(fmt::format("{} position {} of row {} is pooled from the cache but no block holds it",
                                 cache_kind_name(spec.groups[ix(g)].kind), q, row));
          }
        }
        out.state_slots[i].push_back(slot);
      }
    }
  }
}

}  // namespace

std::int32_t table_slot(const StepView& view, const CacheGroup& group, int group_index, std::int64_t row,
                        std::int64_t index) {
  const GroupStepView& gv = view.groups[ix(group_index)];
  const std::int64_t epb = group.entries_per_block();
  const std::int64_t k = index / epb - gv.table_base[ix(row)];
  const std::int64_t begin = gv.table_start[ix(row)], end = gv.table_start[ix(row) + 1];
  if (index < 0 || k < 0 || begin + k >= end) return -1;
  const BlockId block = gv.block_ids[ix(begin + k)];
  if (block == kNoBlock) return -1;
  return static_cast<std::int32_t>(block * epb + index % epb);
}

StepPlan mtp_sub_plan(const StepPlan& plan) {
  StepPlan sub;
  sub.view.seqs = plan.view.seqs;
  sub.view.row_start = plan.view.row_start;
  sub.view.groups = plan.view.groups;
  for (GroupStepView& g : sub.view.groups) g.slot_mapping.clear();
  sub.view.token_start.assign(plan.view.token_start.size(), 0);
  for (std::int32_t t : plan.mtp_rows) {
    const std::int32_t row = plan.token_row[ix(t)];
    ++sub.view.token_start[ix(row) + 1];
    sub.view.positions.push_back(plan.view.positions[ix(t)]);
    sub.token_ids.push_back(plan.mtp_tokens[ix(t)]);
    sub.token_row.push_back(row);
    for (std::size_t g = 0; g < sub.view.groups.size(); ++g) {
      sub.view.groups[g].slot_mapping.push_back(plan.view.groups[g].slot_mapping[ix(t)]);
    }
  }
  for (std::size_t r = 1; r < sub.view.token_start.size(); ++r) sub.view.token_start[r] += sub.view.token_start[r - 1];
  return sub;
}

void finish_step_plan(StepPlan& plan, const CacheSpec& spec) {
  const StepView& v = plan.view;
  const std::int64_t tokens = plan.num_tokens(), rows = plan.num_rows();
  if (static_cast<std::int64_t>(v.positions.size()) != tokens) {
    bad_plan(fmt::format("{} tokens but {} positions", tokens, v.positions.size()));
  }
  if (static_cast<std::int64_t>(v.row_start.size()) != rows || static_cast<std::int64_t>(v.token_start.size()) != rows + 1 ||
      v.token_start.front() != 0 || v.token_start.back() != tokens) {
    bad_plan(fmt::format("{} rows with {} row starts and {} token starts for {} tokens", rows, v.row_start.size(),
                         v.token_start.size(), tokens));
  }
  if (static_cast<int>(v.groups.size()) != spec.num_groups()) {
    bad_plan(fmt::format("{} cache groups, the cache spec has {}", v.groups.size(), spec.num_groups()));
  }
  for (const GroupStepView& g : v.groups) {
    if (static_cast<std::int64_t>(g.slot_mapping.size()) != tokens || static_cast<std::int64_t>(g.table_base.size()) != rows ||
        static_cast<std::int64_t>(g.table_start.size()) != rows + 1 || g.table_start.back() != static_cast<std::int32_t>(g.block_ids.size())) {
      bad_plan(fmt::format("{} slot mapping / block tables do not match {} tokens and {} rows", cache_kind_name(g.kind), tokens, rows));
    }
  }
  plan.token_row.assign(ix(tokens), 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    if (v.token_start[ix(r) + 1] < v.token_start[ix(r)]) bad_plan(fmt::format("row {} has a negative token count", r));
    for (std::int32_t t = v.token_start[ix(r)]; t < v.token_start[ix(r) + 1]; ++t) {
      plan.token_row[ix(t)] = static_cast<std::int32_t>(r);
      if (v.positions[ix(t)] != v.row_start[ix(r)] + (t - v.token_start[ix(r)])) {
        bad_plan(fmt::format("positions of row {} are not consecutive from {}", r, v.row_start[ix(r)]));
      }
    }
  }
  std::int32_t previous = -1;
  for (std::int32_t t : plan.logits_tokens) {
    if (t <= previous || t >= tokens) bad_plan(fmt::format("logits token {} is not ascending inside [0, {})", t, tokens));
    previous = t;
  }
  plan.mtp_rows.clear();
  if (!plan.mtp_tokens.empty()) {
    if (static_cast<std::int64_t>(plan.mtp_tokens.size()) != tokens) {
      bad_plan(fmt::format("{} MTP tokens for {} step tokens", plan.mtp_tokens.size(), tokens));
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      bool gap = false;
      for (std::int32_t t = v.token_start[ix(r)]; t < v.token_start[ix(r) + 1]; ++t) {
        if (plan.mtp_tokens[ix(t)] < 0) {
          gap = true;
        } else if (gap) {
          bad_plan(fmt::format("row {}: a known MTP token follows an unknown one", r));
        } else {
          plan.mtp_rows.push_back(t);
        }
      }
    }
  }
  plan_compression(plan, spec, 4, plan.c4);
  plan_compression(plan, spec, 128, plan.c128);
}

}  // namespace dsv4
