// The test model that reads its history back from the paged cache (recording_executor.h).
#include "recording_executor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "engine/sampling.h"
#include "model/presets.h"

namespace dsv4::test {
namespace {

constexpr std::uint32_t kMagic = 0x5eedc0deu;
constexpr std::uint64_t kStartHash = 0x243f6a8885a308d3ULL;

std::uint64_t mix(std::uint64_t a, std::uint64_t b) { return splitmix64(a ^ splitmix64(b)); }

[[noreturn]] void bad(const std::string& what) { throw std::runtime_error("RecordingExecutor: " + what); }

std::size_t ix(std::int64_t i) { return static_cast<std::size_t>(i); }

}  // namespace

ModelConfig recording_model_config() {
  ModelConfig c = tiny_config();
  c.vocab_size = 64;
  c.eos_token_id = 1;
  return c;
}

CacheOptions recording_cache_options() {
  CacheOptions o;
  o.kv_dtype = KvCacheDtype::kFp8;
  o.indexer_dtype = IndexerCacheDtype::kFp4;
  o.mtp_layers = false;
  return o;
}

RecordingExecutor::RecordingExecutor(ModelConfig config, CacheOptions options)
    : config_(std::move(config)), spec_(CacheSpec::build(config_, options)) {}

void RecordingExecutor::allocate(std::span<const std::int64_t> pages_per_bucket, const StepLimits& /*limits*/) {
  if (pages_per_bucket.size() != spec_.buckets.size()) bad("allocate: wrong bucket count");
  memory_.assign(pages_per_bucket.size(), {});
  for (std::size_t b = 0; b < pages_per_bucket.size(); ++b) memory_[b].assign(ix(pages_per_bucket[b] * spec_.buckets[b]), 0);
  pages_ = PageTable(spec_, pages_per_bucket);
}

std::uint8_t* RecordingExecutor::entry_bytes(int g, std::int64_t slot, std::int64_t layer_slot) {
  return const_cast<std::uint8_t*>(std::as_const(*this).entry_bytes(g, slot, layer_slot));
}

const std::uint8_t* RecordingExecutor::entry_bytes(int g, std::int64_t slot, std::int64_t layer_slot) const {
  const CacheGroup& group = spec_.groups[ix(g)];
  const std::int64_t per_block = group.entries_per_block();
  const auto block = static_cast<BlockId>(slot / per_block);
  if (checked_pool != nullptr && checked_pool->ref_count(g, block) <= 0) {
    bad(fmt::format("{} slot {} is in free block {}", cache_kind_name(group.kind), slot, block));
  }
  const PageId page = pages_.page(g, block, layer_slot);
  if (checked_pool != nullptr && checked_pool->block_pages(g, block)[ix(layer_slot)] != page) {
    bad(fmt::format("{} block {}: the executor's page table is stale", cache_kind_name(group.kind), block));
  }
  const auto& mem = memory_[ix(group.bucket)];
  const std::int64_t offset = page * group.page_bytes + group.layout().data_offset(slot % per_block);
  if (offset + static_cast<std::int64_t>(sizeof(Record)) > static_cast<std::int64_t>(mem.size())) bad("page outside the cache memory");
  return mem.data() + offset;
}

std::int64_t RecordingExecutor::table_slot(const StepPlan& plan, int g, std::size_t row, std::int64_t entry) const {
  const CacheGroup& group = spec_.groups[ix(g)];
  const GroupStepView& view = plan.view.groups[ix(g)];
  const std::int64_t per_block = group.entries_per_block();
  const std::int64_t index = entry / per_block;
  const std::int64_t k = index - view.table_base[row];
  const std::int64_t count = view.table_start[row + 1] - view.table_start[row];
  if (k < 0 || k >= count) {
    bad(fmt::format("{} entry {} of row {}: block index {} outside its table [{}, {})", cache_kind_name(group.kind), entry, row,
                    index, view.table_base[row], view.table_base[row] + count));
  }
  const BlockId block = view.block_ids[ix(view.table_start[row] + k)];
  if (block == kNoBlock) bad(fmt::format("{} entry {} of row {}: no block", cache_kind_name(group.kind), entry, row));
  return static_cast<std::int64_t>(block) * per_block + entry % per_block;
}

RecordingExecutor::Record RecordingExecutor::read(const StepPlan& plan, int g, std::size_t row,
                                                  std::int64_t position) const {
  const CacheGroup& group = spec_.groups[ix(g)];
  const std::int64_t entry = position / group.tokens_per_entry;
  const std::int64_t slot = table_slot(plan, g, row, entry);
  Record first{};
  for (std::int64_t s = 0; s < group.num_layers(); ++s) {
    Record r{};
    std::memcpy(&r, entry_bytes(g, slot, s), sizeof r);
    if (r.magic != kMagic || r.position != position) {
      bad(fmt::format("row {} reads {} position {} (layer slot {}): found magic {:#x} position {}", row,
                      cache_kind_name(group.kind), position, s, r.magic, r.position));
    }
    if (s == 0) {
      first = r;
    } else if (r.hash != first.hash || r.token != first.token) {
      bad(fmt::format("{} position {}: layer slots disagree", cache_kind_name(group.kind), position));
    }
  }
  return first;
}

void RecordingExecutor::launch(const StepPlan& plan) {
  if (launched_ != nullptr) bad("launch twice without collect");
  pages_.apply(plan.page_changes);
  launched_ = &plan;
}

std::span<const float> RecordingExecutor::collect_logits() {
  if (launched_ == nullptr) bad("collect without launch");
  const StepPlan& plan = *launched_;
  launched_ = nullptr;
  logits_.assign(static_cast<std::size_t>(plan.num_logits_rows() * config_.vocab_size), 0.0f);
  execute_step(plan, logits_);
  return logits_;
}

void RecordingExecutor::execute_step(const StepPlan& plan, std::span<float> logits) {
  const StepView& v = plan.view;
  StepRecord record;
  record.num_tokens = plan.num_tokens();
  record.logits_tokens.assign(plan.logits_tokens.begin(), plan.logits_tokens.end());
  for (std::size_t r = 0; r < v.seqs.size(); ++r) {
    record.seqs.push_back(v.seqs[r]);
    record.row_start.push_back(v.row_start[r]);
    record.row_tokens.push_back(v.token_start[r + 1] - v.token_start[r]);
  }
  steps.push_back(record);
  if (throw_for_seq && std::count(v.seqs.begin(), v.seqs.end(), *throw_for_seq) > 0) bad("asked to fail");

  const std::int64_t vocab = config_.vocab_size;
  if (static_cast<std::int64_t>(logits.size()) != static_cast<std::int64_t>(plan.logits_tokens.size()) * vocab) {
    bad("logits buffer size does not match logits_tokens");
  }
  if (static_cast<std::int64_t>(v.positions.size()) != plan.num_tokens() || v.token_start.back() != plan.num_tokens()) {
    bad("positions / token_start do not match token_ids");
  }
  const int window = spec_.group_of(CacheKind::kWindowKv);
  std::size_t next_logits = 0;
  for (std::size_t r = 0; r < v.seqs.size(); ++r) {
    for (std::int64_t t = v.token_start[r]; t < v.token_start[r + 1]; ++t) {
      const std::int64_t p = v.positions[ix(t)];
      if (p != v.row_start[r] + (t - v.token_start[r])) bad("positions are not consecutive within a row");
      const std::int32_t x = plan.token_ids[ix(t)];
      const std::uint64_t prev = p == 0 ? kStartHash : read(plan, window, r, p - 1).hash;
      const std::uint64_t h = mix(mix(prev, static_cast<std::uint64_t>(x)), static_cast<std::uint64_t>(p));
      const Record rec{kMagic, x, p, h};
      for (int g = 0; g < spec_.num_groups(); ++g) {
        const CacheGroup& group = spec_.groups[ix(g)];
        const std::int64_t slot = v.groups[ix(g)].slot_mapping[ix(t)];
        const bool completes = (p + 1) % group.tokens_per_entry == 0;
        if (group.is_compressor_state() && slot == -1) continue;  // a state position no later step reads
        if (!completes) {
          if (slot != -1) bad(fmt::format("{} position {} has slot {} but completes no entry", cache_kind_name(group.kind), p, slot));
          continue;
        }
        const std::int64_t expected = table_slot(plan, g, r, p / group.tokens_per_entry);
        if (slot != expected) bad(fmt::format("{} position {}: slot {} but the block table says {}", cache_kind_name(group.kind), p, slot, expected));
        for (std::int64_t s = 0; s < group.num_layers(); ++s) std::memcpy(entry_bytes(g, slot, s), &rec, sizeof rec);
      }
      if (next_logits < plan.logits_tokens.size() && plan.logits_tokens[next_logits] == t) {
        std::uint64_t fold = h;
        for (int g = 0; g < spec_.num_groups(); ++g) {
          const CacheGroup& group = spec_.groups[ix(g)];
          const std::int64_t first = group.sliding ? group.keep_from(p) : group.tokens_per_entry - 1;
          if (group.is_compressor_state()) {
            // Only positions from before the step are in the cache, and which those are depends
            // on the chunking, so they are checked against the window instead of folded in.
            for (std::int64_t q = first; q < v.row_start[r]; ++q) {
              if (read(plan, g, r, q).hash != read(plan, window, r, q).hash) {
                bad(fmt::format("{} position {} disagrees with the window", cache_kind_name(group.kind), q));
              }
            }
            continue;
          }
          for (std::int64_t q = first; q <= p; q += group.tokens_per_entry) fold = mix(fold, read(plan, g, r, q).hash);
        }
        float* row = logits.data() + next_logits * ix(vocab);
        for (std::int64_t tok = 0; tok < vocab; ++tok) {
          row[tok] = static_cast<float>(static_cast<double>(mix(fold, static_cast<std::uint64_t>(tok)) >> 40) * 0x1.0p-24 * 8.0);
        }
        ++next_logits;
      }
    }
  }
  if (next_logits != plan.logits_tokens.size()) bad("logits_tokens not ascending or out of range");
}

}  // namespace dsv4::test
