#include "gpu_step.h"

#include <fmt/format.h>

#include "cuda/kernels/page_table.h"
#include "model/presets.h"

namespace dsv4::gputest {

std::unique_ptr<PackedStep> simple_step(const std::vector<std::int32_t>& token_ids, const std::vector<std::int32_t>& positions,
                                        const std::vector<std::int32_t>& logits_tokens,
                                        const std::vector<std::int32_t>& mtp_source) {
  auto s = std::make_unique<PackedStep>();
  gpu::DeviceStep& d = s->host;
  d.n_tokens = static_cast<std::int32_t>(token_ids.size());
  d.n_rows = d.n_tokens;
  d.n_logits = static_cast<std::int32_t>(logits_tokens.size());
  d.token_ids = s->arrays.put(token_ids);
  d.positions = s->arrays.put(positions);
  std::vector<std::int32_t> rows(token_ids.size());
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<std::int32_t>(i);
  d.token_row = s->arrays.put(rows);
  d.logits_tokens = s->arrays.put(logits_tokens);
  if (!mtp_source.empty()) d.mtp_source = s->arrays.put(mtp_source);
  s->upload();
  return s;
}

RopeParams window_rope_params(const ModelConfig& c) {
  RopeParams p;
  p.rope_dim = static_cast<int>(c.qk_rope_head_dim);
  p.base = c.rope_theta;
  return p;
}

RopeParams compressed_rope_params(const ModelConfig& c) {
  RopeParams p = window_rope_params(c);
  p.base = c.compress_rope_theta;
  p.yarn = true;
  p.factor = c.rope_scaling.factor;
  p.original_max_position = static_cast<double>(c.rope_scaling.original_max_position_embeddings);
  p.beta_fast = c.rope_scaling.beta_fast;
  p.beta_slow = c.rope_scaling.beta_slow;
  return p;
}

void append_cos_sin(const RopeTable& table, std::int64_t position, std::vector<float>& out) {
  const std::size_t at = out.size();
  out.resize(at + 2 * gpu::kRopeHalf);
  table.cos_sin(position, std::span<float>(out.data() + at, gpu::kRopeHalf),
                std::span<float>(out.data() + at + gpu::kRopeHalf, gpu::kRopeHalf));
}

// ---- the cache harness ---------------------------------------------------------------------------
namespace {
ModelConfig harness_config() {
  ModelConfig c = tiny_config();
  return c;
}
// Sliding groups hold only the positions a step can still read (the step's own and the kept
// extent before it); compressed groups hold every entry.
std::vector<std::int64_t> pages_for(const CacheSpec& spec, std::int64_t seqs, std::int64_t positions, std::int64_t max_step) {
  std::vector<std::int64_t> pages(spec.buckets.size(), 0);
  for (const CacheGroup& g : spec.groups) {
    const std::int64_t span = g.sliding ? std::min(positions, max_step + g.keep_extent + g.keep_align) : positions;
    pages[static_cast<std::size_t>(g.bucket)] += (span / g.positions_per_block + 3) * g.num_layers() * seqs;
  }
  return pages;
}
}  // namespace

CacheHarness::CacheHarness(KvCacheDtype kv, IndexerCacheDtype index, std::int64_t max_seqs, std::int64_t max_positions,
                           std::int64_t max_step)
    : config_(harness_config()),
      spec_(CacheSpec::build(config_, CacheOptions{kv, index, false})),
      pages_(pages_for(spec_, max_seqs, max_positions, max_step)),
      mgr_(std::make_unique<KvCacheManager>(spec_, pages_, /*prefix_caching=*/false)),
      table_(spec_, pages_),
      rope_window_(window_rope_params(config_)),
      rope_compressed_(compressed_rope_params(config_)) {
  for (std::size_t b = 0; b < spec_.buckets.size(); ++b) {
    const auto bytes = static_cast<std::size_t>(pages_[b] * spec_.buckets[b]);
    host_pools_.emplace_back(bytes, std::uint8_t{0xFF});  // unwritten entries decode to NaN
    pools_.emplace_back(bytes);
  }
  for (int g = 0; g < spec_.num_groups(); ++g) {
    page_tables_.emplace_back(std::max<std::size_t>(table_.table(g).size(), 1));  // poisoned: -1
  }
  upload_pools();
}

std::int32_t CacheHarness::layer_slot(CacheKind kind, std::int64_t layer) const {
  return static_cast<std::int32_t>(spec_.group(kind).layer_slot(layer));
}

void CacheHarness::add_sequence(SeqId id, std::int64_t length) {
  std::vector<std::int32_t> prompt(static_cast<std::size_t>(length));
  for (auto& t : prompt) t = static_cast<std::int32_t>(rng_() % static_cast<std::uint64_t>(config_.vocab_size));
  if (mgr_->add_sequence(id, prompt) != 0) throw std::logic_error("harness: unexpected prefix hit");
}

StepPlan CacheHarness::plan(const std::vector<StepSlice>& slices) {
  for (const StepSlice& s : slices) {
    AllocResult r = mgr_->allocate(s.seq, s.num_tokens);
    if (!r.ok()) throw std::logic_error("harness: allocation failed: " + r.reason);
  }
  StepPlan plan;
  plan.view = mgr_->step_view(slices);
  for (const StepSlice& s : slices) {
    const SequenceCache& seq = mgr_->sequence(s.seq);
    (void)seq;
    for (std::int64_t t = 0; t < s.num_tokens; ++t)
      plan.token_ids.push_back(static_cast<std::int32_t>(rng_() % static_cast<std::uint64_t>(config_.vocab_size)));
  }
  for (std::size_t t = 0; t < plan.token_ids.size(); ++t) plan.logits_tokens.push_back(static_cast<std::int32_t>(t));
  plan.page_changes = mgr_->take_page_changes();
  table_.apply(plan.page_changes);
  finish_step_plan(plan, spec_);
  return plan;
}

void CacheHarness::commit(const StepPlan& plan) {
  for (std::size_t r = 0; r < plan.view.seqs.size(); ++r) {
    const auto begin = static_cast<std::size_t>(plan.view.token_start[r]), end = static_cast<std::size_t>(plan.view.token_start[r + 1]);
    mgr_->commit(plan.view.seqs[r], std::span<const std::int32_t>(plan.token_ids).subspan(begin, end - begin));
  }
  mgr_->check_invariants();
}

void CacheHarness::skip(SeqId id, std::int64_t tokens) {
  for (std::int64_t done = 0; done < tokens; done += kSkipChunk) {
    StepPlan p = plan({StepSlice{id, std::min(kSkipChunk, tokens - done)}});
    auto packed = pack(p);  // keeps the device page tables current
    commit(p);
  }
}

std::unique_ptr<PackedStep> CacheHarness::pack(const StepPlan& p) {
  auto s = std::make_unique<PackedStep>();
  gpu::DeviceStep& d = s->host;
  Uploads& up = s->arrays;
  d.n_tokens = static_cast<std::int32_t>(p.num_tokens());
  d.n_rows = static_cast<std::int32_t>(p.num_rows());
  d.n_logits = static_cast<std::int32_t>(p.logits_tokens.size());
  d.n_groups = spec_.num_groups();
  d.token_ids = up.put(p.token_ids);
  d.positions = up.put(p.view.positions);
  d.token_row = up.put(p.token_row);
  d.logits_tokens = up.put(p.logits_tokens);
  std::vector<float> rw, rc;
  for (std::int32_t pos : p.view.positions) {
    append_cos_sin(rope_window_, pos, rw);
    append_cos_sin(rope_compressed_, pos, rc);
  }
  d.rope_window = up.put(rw);
  d.rope_compressed = up.put(rc);
  for (int g = 0; g < spec_.num_groups(); ++g) {
    const CacheGroup& cg = spec_.groups[static_cast<std::size_t>(g)];
    const GroupStepView& v = p.view.groups[static_cast<std::size_t>(g)];
    gpu::DeviceCacheGroup& dg = d.groups[g];
    dg.slot_mapping = up.put(v.slot_mapping);
    dg.table_base = up.put(v.table_base);
    dg.table_start = up.put(v.table_start);
    dg.block_ids = up.put(v.block_ids);
    dg.page_table = page_tables_[static_cast<std::size_t>(g)].get();
    dg.pool = pools_[static_cast<std::size_t>(cg.bucket)].as<std::uint8_t>();
    dg.page_bytes = cg.page_bytes;
    dg.layers = static_cast<std::int32_t>(cg.num_layers());
    dg.entries_per_block = static_cast<std::int32_t>(cg.entries_per_block());
    dg.data_bytes = static_cast<std::int32_t>(cg.format.data_bytes);
    dg.scale_bytes = static_cast<std::int32_t>(cg.format.scale_bytes);
  }
  for (int r = 0; r < 2; ++r) {
    const CompressionPlan& cp = r == 0 ? p.c4 : p.c128;
    gpu::DeviceCompression& dc = r == 0 ? d.c4 : d.c128;
    dc.ratio = cp.ratio;
    dc.writes = static_cast<std::int32_t>(cp.num_writes());
    dc.token = up.put(cp.token);
    dc.entry = up.put(cp.entry);
    dc.source = up.put(cp.source);
    for (std::size_t i = 0; i < 2; ++i) dc.state_slot[i] = i < cp.state_slots.size() ? up.put(cp.state_slots[i]) : nullptr;
    std::vector<float> rope;
    for (std::int32_t j : cp.entry) append_cos_sin(rope_compressed_, static_cast<std::int64_t>(j) * cp.ratio, rope);
    dc.rope = up.put(rope);
  }
  std::vector<std::int32_t> updates;
  for (std::size_t g = 0; g < p.page_changes.groups.size(); ++g) {
    const PageTableChanges::Group& c = p.page_changes.groups[g];
    const std::int64_t layers = spec_.groups[g].num_layers();
    for (std::size_t b = 0; b < c.blocks.size(); ++b) {
      for (std::int64_t l = 0; l < layers; ++l) {
        updates.push_back(static_cast<std::int32_t>(g));
        updates.push_back(static_cast<std::int32_t>(c.blocks[b] * layers + l));
        updates.push_back(c.pages[b * static_cast<std::size_t>(layers) + static_cast<std::size_t>(l)]);
      }
    }
  }
  d.page_updates = static_cast<std::int32_t>(updates.size() / 3);
  d.page_update = up.put(updates);
  s->upload();
  gpu::apply_page_updates(s->get(), d.page_updates, st());
  for (int g = 0; g < spec_.num_groups(); ++g) {
    const std::vector<std::int32_t> got = page_tables_[static_cast<std::size_t>(g)].download();
    const auto want = table_.table(g);
    std::int64_t bad = 0;
    for (std::size_t i = 0; i < want.size(); ++i) bad += got[i] != want[i];
    EXPECT_EQ(bad, 0) << "apply_page_updates: device page table of group " << g << " differs from the host's";
  }
  return s;
}

std::int64_t CacheHarness::entry_offset(int group, std::int64_t slot, std::int64_t layer_slot, bool scales) const {
  const EntryAddress a = mgr_->entry_address(group, slot, layer_slot);
  return scales ? a.scale_offset : a.data_offset;
}

CacheHarness::Region CacheHarness::entry_region(int group, std::int64_t slot, std::int64_t layer_slot, bool scales) const {
  const CacheGroup& g = spec_.groups[static_cast<std::size_t>(group)];
  return Region{g.bucket, entry_offset(group, slot, layer_slot, scales), scales ? g.format.scale_bytes : g.format.data_bytes};
}

std::uint8_t* CacheHarness::host_entry(int group, std::int64_t slot, std::int64_t layer_slot, bool scales) {
  if (slot < 0) throw std::logic_error("harness: entry of slot -1");
  const CacheGroup& g = spec_.groups[static_cast<std::size_t>(group)];
  return host_pools_[static_cast<std::size_t>(g.bucket)].data() + entry_offset(group, slot, layer_slot, scales);
}

void CacheHarness::upload_pools() {
  for (std::size_t b = 0; b < pools_.size(); ++b)
    gpu::copy_to_device(pools_[b].data(), host_pools_[b].data(), host_pools_[b].size(), stream());
  sync();
}

std::vector<std::vector<std::uint8_t>> CacheHarness::download_pools() {
  std::vector<std::vector<std::uint8_t>> out;
  for (std::size_t b = 0; b < pools_.size(); ++b) {
    out.emplace_back(host_pools_[b].size());
    gpu::copy_to_host(out.back().data(), pools_[b].data(), out.back().size(), stream());
  }
  sync();
  return out;
}

std::int64_t CacheHarness::stray_bytes(const std::vector<std::vector<std::uint8_t>>& before,
                                       const std::vector<std::vector<std::uint8_t>>& after, const std::vector<Region>& allowed) {
  std::vector<std::vector<std::uint8_t>> mask;
  for (const auto& b : before) mask.emplace_back(b.size(), std::uint8_t{0});
  for (const Region& r : allowed)
    std::fill_n(mask[static_cast<std::size_t>(r.bucket)].begin() + r.offset, r.length, std::uint8_t{1});
  std::int64_t stray = 0;
  for (std::size_t b = 0; b < before.size(); ++b)
    for (std::size_t i = 0; i < before[b].size(); ++i) stray += mask[b][i] == 0 && before[b][i] != after[b][i];
  return stray;
}

}  // namespace dsv4::gputest
