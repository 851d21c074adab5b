#include "cpu/cpu_executor.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "common/error.h"
#include "cpu/cache_codec.h"
#include "cpu/compressor.h"
#include "cpu/hyper_connections.h"
#include "cpu/indexer.h"
#include "cpu/linear.h"
#include "cpu/moe.h"
#include "cpu/rms_norm.h"
#include "cpu/sink_attention.h"
#include "numerics/bf16.h"

namespace dsv4 {
namespace {

RopeParams window_rope(const ModelConfig& c) {
  RopeParams p;
  p.rope_dim = static_cast<int>(c.qk_rope_head_dim);
  p.base = c.rope_theta;
  return p;
}

RopeParams compressed_rope(const ModelConfig& c) {
  RopeParams p = window_rope(c);
  p.base = c.compress_rope_theta;
  p.yarn = true;
  p.factor = c.rope_scaling.factor;
  p.original_max_position = static_cast<double>(c.rope_scaling.original_max_position_embeddings);
  p.beta_fast = c.rope_scaling.beta_fast;
  p.beta_slow = c.rope_scaling.beta_slow;
  return p;
}

void round_all_to_bf16(std::span<float> x) {
  for (float& v : x) v = round_to_bf16(v);
}

std::span<float> row_of(std::vector<float>& v, std::int64_t row, std::int64_t width) {
  return std::span<float>(v).subspan(static_cast<std::size_t>(row * width), static_cast<std::size_t>(width));
}

}  // namespace

// Per-step state shared by the phases.
struct CpuExecutor::Step {
  explicit Step(const StepPlan& p)
      : plan(p), tokens(p.num_tokens()), positions(p.view.positions.begin(), p.view.positions.end()) {}
  const StepPlan& plan;
  std::int64_t tokens = 0;
  std::vector<std::int64_t> positions;  // [tokens], for the ops that take int64 positions
  std::vector<float> h;                 // [tokens, hc * D] residual streams
  // Attention scratch of the current layer.
  std::vector<float> x, post, comb, qr, q, index_q, index_w;
  // Compressor projections (a_t, g_t) of this step's tokens, attention and indexer
  // compressors. The cache keeps only the positions later steps need (slot != -1); phase B
  // reads this step's positions from here and earlier ones from the cache.
  std::vector<float> state_main, state_index;

  std::int64_t position(std::int64_t t) const { return plan.view.positions[static_cast<std::size_t>(t)]; }
  std::int64_t row(std::int64_t t) const { return plan.token_row[static_cast<std::size_t>(t)]; }
  std::int64_t write_slot(int group, std::int64_t t) const {
    return plan.view.groups[static_cast<std::size_t>(group)].slot_mapping[static_cast<std::size_t>(t)];
  }
  // Slot of entry `index` (a position for sliding kinds, an entry for compressed kinds) of the
  // row of token t, through the row's block table.
  std::int64_t read_slot(const CacheGroup& g, int group, std::int64_t t, std::int64_t index) const {
    const std::int32_t slot = table_slot(plan.view, g, group, row(t), index);
    if (slot < 0)
      throw std::logic_error("cpu executor: no cache block for entry " + std::to_string(index) + " of kind " +
                             std::string(cache_kind_name(g.kind)));
    return slot;
  }
};

CpuExecutor::CpuExecutor(ModelConfig config, CpuModelWeights weights, CacheSpec spec, int num_threads)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      spec_(std::move(spec)),
      pool_(std::make_unique<ThreadPool>(std::max(1, num_threads))),
      rope_window_(window_rope(config_)),
      rope_compressed_(compressed_rope(config_)) {
  // Expert views per block index: decoder blocks, then the MTP blocks.
  std::vector<const CpuBlockWeights*> all;
  for (const auto& b : weights_.blocks) all.push_back(&b);
  for (const auto& m : weights_.mtp) all.push_back(&m.block);
  for (const CpuBlockWeights* b : all) {
    std::vector<ExpertWeights> views;
    for (const auto& e : b->experts) views.push_back(e.view());
    expert_views_.push_back(std::move(views));
  }
}

std::unique_ptr<CpuExecutor> CpuExecutor::load(const std::filesystem::path& dir, const CacheOptions& options,
                                               int num_threads) {
  ModelConfig config = ModelConfig::from_file(dir / "config.json");
  CpuModelWeights weights;
  try {
    weights = CpuModelWeights::load(config, Checkpoint::open(dir));
  } catch (const Error& e) {
    throw e.in(dir.string());
  }
  CacheSpec spec = CacheSpec::build(config, options);
  return std::make_unique<CpuExecutor>(std::move(config), std::move(weights), std::move(spec), num_threads);
}

void CpuExecutor::allocate(std::span<const std::int64_t> pages_per_bucket, const StepLimits& /*limits*/) {
  if (pages_per_bucket.size() != spec_.buckets.size())
    fail("cpu executor: {} page counts for {} buckets", pages_per_bucket.size(), spec_.buckets.size());
  pools_.assign(spec_.buckets.size(), {});
  for (std::size_t b = 0; b < spec_.buckets.size(); ++b)
    pools_[b].assign(static_cast<std::size_t>(pages_per_bucket[b] * spec_.buckets[b]), 0);
  page_table_ = PageTable(spec_, pages_per_bucket);
}

const RopeTable& CpuExecutor::rope_for(std::int64_t layer) const {
  return config_.compress_ratio(layer) > 0 ? rope_compressed_ : rope_window_;
}

std::uint8_t* CpuExecutor::entry_ptr(int group, std::int64_t layer, std::int64_t slot, bool scales) {
  const CacheGroup& g = spec_.groups[static_cast<std::size_t>(group)];
  const std::int64_t epb = g.entries_per_block();
  const std::int64_t layer_slot = g.layer_slot(layer);
  if (slot < 0 || layer_slot < 0) throw std::logic_error("cpu executor: bad cache slot");
  const PageId page = page_table_.page(group, static_cast<BlockId>(slot / epb), layer_slot);
  const PageLayout layout = g.layout();
  const std::int64_t entry = slot % epb;
  std::uint8_t* base = pools_[static_cast<std::size_t>(g.bucket)].data() + page * g.page_bytes;
  return base + (scales ? layout.scale_offset(entry) : layout.data_offset(entry));
}

void CpuExecutor::launch(const StepPlan& plan) {
  if (pools_.empty()) fail("cpu executor: allocate was not called");
  if (launched_ != nullptr) fail("cpu executor: a step was launched and not collected");
  page_table_.apply(plan.page_changes);
  launched_ = &plan;
}

std::span<const float> CpuExecutor::collect_logits() {
  if (launched_ == nullptr) fail("cpu executor: collect without a launched step");
  const StepPlan& plan = *launched_;
  launched_ = nullptr;
  logits_.resize(static_cast<std::size_t>(plan.num_logits_rows() * config_.vocab_size));
  run(plan, logits_);
  return logits_;
}

void CpuExecutor::run(const StepPlan& plan, std::span<float> logits) {
  const ModelConfig& c = config_;
  const std::int64_t D = c.hidden_size, hc = c.hc_mult, V = c.vocab_size;
  const std::int64_t n_mtp = plan.num_mtp_tokens();
  if (!plan.mtp_tokens.empty() && weights_.mtp.empty()) fail("cpu executor: the model has no MTP block");
  if (logits.size() != (plan.logits_tokens.size() + static_cast<std::size_t>(n_mtp)) * static_cast<std::size_t>(V))
    fail("cpu executor: logits buffer holds {} values, expected ({} + {} MTP) x {}", logits.size(),
         plan.logits_tokens.size(), n_mtp, V);
  Step s(plan);
  if (plan.view.positions.size() != static_cast<std::size_t>(s.tokens) || plan.token_row.size() != static_cast<std::size_t>(s.tokens))
    fail("cpu executor: plan has {} tokens but {} positions and {} rows (finish_step_plan not called?)", s.tokens,
         plan.view.positions.size(), plan.token_row.size());

  // Embedding, copied into every residual stream (SPEC 3).
  s.h.assign(static_cast<std::size_t>(s.tokens * hc * D), 0.0f);
  for (std::int64_t t = 0; t < s.tokens; ++t) {
    const std::int64_t id = plan.token_ids[static_cast<std::size_t>(t)];
    if (id < 0 || id >= V) fail("token id {} is outside the vocabulary [0, {})", id, V);
    for (std::int64_t i = 0; i < hc; ++i)
      std::copy_n(weights_.embed.begin() + id * D, D, s.h.begin() + (t * hc + i) * D);
  }
  std::vector<std::int64_t> token_seqs, token_positions;
  if (inspector_) {
    for (std::int64_t t = 0; t < s.tokens; ++t) {
      token_seqs.push_back(plan.view.seqs[static_cast<std::size_t>(s.row(t))]);
      token_positions.push_back(s.position(t));
    }
  }

  for (const CpuBlockWeights& w : weights_.blocks) {
    attention_layer(s, w);
    ffn_layer(s, w);
    if (inspector_) inspector_->hidden(w.layer, token_seqs, token_positions, s.h);
  }

  // Head (SPEC 3.1 end): pre-only mixing, final norm, fp32 logits.
  const HcParams hcp{hc, D, c.hc_sinkhorn_iters, static_cast<float>(c.rms_norm_eps), static_cast<float>(c.hc_eps)};
  const auto n_logits = static_cast<std::int64_t>(plan.logits_tokens.size());
  std::vector<float> y(static_cast<std::size_t>(n_logits * D));
  for (std::int64_t i = 0; i < n_logits; ++i) {
    const std::int64_t t = plan.logits_tokens[static_cast<std::size_t>(i)];
    if (t < 0 || t >= s.tokens) fail("cpu executor: logits token {} outside the step", t);
    hc_head(row_of(s.h, t, hc * D), weights_.hc_head.fn, weights_.hc_head.scale, weights_.hc_head.base, hcp,
            row_of(y, i, D));
  }
  rms_norm(y, n_logits, weights_.norm, static_cast<float>(c.rms_norm_eps), y);
  linear_f32(y, n_logits, weights_.head, logits.first(static_cast<std::size_t>(n_logits * V)), pool_.get());
  if (n_mtp > 0) mtp_block(s, logits.subspan(static_cast<std::size_t>(n_logits * V)));
}

// SPEC.md 3.6: the first MTP block over the step tokens whose next token is known. Its input
// at position t is the main model's final streams h_t and the embedding of token t+1:
// stream_i = bf16(h_proj(hnorm(h_t,i)) + e_proj(enorm(embed(token t+1)))); then one window-only
// block (attending over its own window cache at position t) and the head with the block's
// own hc_head and norm. Row t of the result predicts token t+2.
void CpuExecutor::mtp_block(Step& main, std::span<float> logits) {
  const ModelConfig& c = config_;
  const std::int64_t D = c.hidden_size, hc = c.hc_mult;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const CpuMtpWeights& m = weights_.mtp.front();
  const StepPlan& plan = main.plan;
  const StepPlan sub = mtp_sub_plan(plan);
  const std::vector<std::int32_t>& picked = plan.mtp_rows;
  const auto T = static_cast<std::int64_t>(picked.size());
  Step s(sub);

  // Input streams.
  std::vector<float> hn(static_cast<std::size_t>(T * hc * D)), hp(hn.size());
  for (std::int64_t i = 0; i < T; ++i)
    std::copy_n(main.h.begin() + picked[static_cast<std::size_t>(i)] * hc * D, hc * D, hn.begin() + i * hc * D);
  rms_norm(hn, T * hc, m.hnorm, eps, hn);
  linear(hn, T * hc, m.h_proj, hp, pool_.get());
  std::vector<float> e(static_cast<std::size_t>(T * D)), ep(e.size());
  for (std::int64_t i = 0; i < T; ++i) {
    const std::int64_t id = s.plan.token_ids[static_cast<std::size_t>(i)];
    if (id >= c.vocab_size) fail("MTP token id {} is outside the vocabulary [0, {})", id, c.vocab_size);
    std::copy_n(weights_.embed.begin() + id * D, D, e.begin() + i * D);
  }
  rms_norm(e, T, m.enorm, eps, e);
  linear(e, T, m.e_proj, ep, pool_.get());
  s.h.assign(hp.size(), 0.0f);
  for (std::int64_t i = 0; i < T; ++i)
    for (std::int64_t j = 0; j < hc; ++j)
      for (std::int64_t k = 0; k < D; ++k)
        s.h[static_cast<std::size_t>((i * hc + j) * D + k)] =
            round_to_bf16(hp[static_cast<std::size_t>((i * hc + j) * D + k)] + ep[static_cast<std::size_t>(i * D + k)]);

  attention_layer(s, m.block);
  ffn_layer(s, m.block);

  const HcParams hcp{hc, D, c.hc_sinkhorn_iters, eps, static_cast<float>(c.hc_eps)};
  std::vector<float> y(static_cast<std::size_t>(T * D));
  for (std::int64_t i = 0; i < T; ++i)
    hc_head(row_of(s.h, i, hc * D), m.hc_head.fn, m.hc_head.scale, m.hc_head.base, hcp, row_of(y, i, D));
  rms_norm(y, T, m.norm, eps, y);
  linear_f32(y, T, weights_.head, logits, pool_.get());
}

void CpuExecutor::attention_layer(Step& s, const CpuBlockWeights& w) {
  const ModelConfig& c = config_;
  const std::int64_t D = c.hidden_size, hc = c.hc_mult, H = c.num_attention_heads, d = c.head_dim;
  const std::int64_t rd = c.qk_rope_head_dim, T = s.tokens, r = w.ratio;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const HcParams hcp{hc, D, c.hc_sinkhorn_iters, eps, static_cast<float>(c.hc_eps)};
  const RopeTable& rope = rope_for(w.layer);
  ThreadPool* pool = pool_.get();

  // Phase A: hc pre + attn_norm, projections, window kv and compressor state writes.
  s.x.assign(static_cast<std::size_t>(T * D), 0.0f);
  s.post.assign(static_cast<std::size_t>(T * hc), 0.0f);
  s.comb.assign(static_cast<std::size_t>(T * hc * hc), 0.0f);
  parallel_for(pool, 0, T, [&](std::int64_t t) {
    std::vector<float> y(static_cast<std::size_t>(D));
    hc_pre(row_of(s.h, t, hc * D), w.hc_attn.fn, w.hc_attn.scale, w.hc_attn.base, hcp, y, row_of(s.post, t, hc),
           row_of(s.comb, t, hc * hc));
    rms_norm(y, 1, w.attn_norm, eps, row_of(s.x, t, D));
  });
  std::vector<float> qa(static_cast<std::size_t>(T * c.q_lora_rank));
  linear(s.x, T, w.wq_a, qa, pool);
  s.qr.assign(qa.size(), 0.0f);
  rms_norm(qa, T, w.q_norm, eps, s.qr);
  s.q.assign(static_cast<std::size_t>(T * H * d), 0.0f);
  linear(s.qr, T, w.wq_b, s.q, pool);
  std::vector<float> kv(static_cast<std::size_t>(T * d));
  linear(s.x, T, w.wkv, kv, pool);
  rms_norm(kv, T, w.kv_norm, eps, kv);

  const int window_group = spec_.group_of(CacheKind::kWindowKv);
  const KvCacheDtype kv_dtype = spec_.options.kv_dtype;
  parallel_for(pool, 0, T, [&](std::int64_t t) {
    auto qt = row_of(s.q, t, H * d);
    head_rms_norm_bf16(qt, d, eps);  // weightless per-head norm (SPEC 3.2 step 1)
    rope.apply_heads(qt, static_cast<std::size_t>(d), s.position(t));
    round_all_to_bf16(qt);
    auto kvt = row_of(kv, t, d);
    rope.apply(kvt.subspan(static_cast<std::size_t>(d - rd)), s.position(t));
    round_all_to_bf16(kvt);
    const std::int64_t slot = s.write_slot(window_group, t);
    encode_main_kv(kvt, rd, kv_dtype, entry_ptr(window_group, w.layer, slot, false),
                   entry_ptr(window_group, w.layer, slot, true));
  });

  if (r > 0) {
    // Compressor projections of every token into the state cache (SPEC 3.3).
    const CompressorParams cp{r, d, rd, CompressorKind::kAttention, eps};
    s.state_main.assign(static_cast<std::size_t>(T * cp.slot_floats()), 0.0f);
    compressor_project(s.x, T, s.positions, w.compressor->wkv, w.compressor->wgate, w.compressor->ape, cp,
                       s.state_main, pool);
    store_state(s, w.layer, r == 4 ? CacheKind::kCsaState : CacheKind::kHcaState, s.state_main, cp.slot_floats());
  }
  if (r == 4) {
    const IndexerParams ip{c.index_n_heads, c.index_head_dim, rd, c.index_topk};
    s.index_q.assign(static_cast<std::size_t>(T * ip.n_heads * ip.head_dim), 0.0f);
    indexer_query(s.qr, T, s.positions, w.indexer->wq_b, rope, ip, s.index_q, pool);
    s.index_w.assign(static_cast<std::size_t>(T * ip.n_heads), 0.0f);
    indexer_weights(s.x, T, w.indexer->weights_proj, ip, s.index_w, pool);
    const CompressorParams cp{4, c.index_head_dim, rd, CompressorKind::kIndexer, eps};
    s.state_index.assign(static_cast<std::size_t>(T * cp.slot_floats()), 0.0f);
    const auto& ic = w.indexer->compressor;
    compressor_project(s.x, T, s.positions, ic.wkv, ic.wgate, ic.ape, cp, s.state_index, pool);
    store_state(s, w.layer, CacheKind::kIndexerState, s.state_index, cp.slot_floats());
  }

  // Phase B: entries completed by this step's tokens.
  if (r > 0) write_compressed_entries(s, w, false);
  if (r == 4) write_compressed_entries(s, w, true);

  // Phase C: attention of every token over its key set, read back from the cache.
  const int main_group = r == 4 ? spec_.group_of(CacheKind::kCsaKv) : r == 128 ? spec_.group_of(CacheKind::kHcaKv) : -1;
  const int index_group = r == 4 ? spec_.group_of(CacheKind::kIndexerKv) : -1;
  const float scale = attention_softmax_scale(d);
  std::vector<float> o(static_cast<std::size_t>(T * H * d));
  const bool taps = inspector_ != nullptr && w.layer < c.num_hidden_layers;
  std::vector<std::vector<std::int64_t>> compressed_keys(taps ? static_cast<std::size_t>(T) : 0);
  std::vector<std::vector<float>> index_scores(taps ? static_cast<std::size_t>(T) : 0);
  parallel_for(pool, 0, T, [&](std::int64_t t) {
    const std::int64_t p = s.position(t);
    const std::int64_t first = std::max<std::int64_t>(0, p - c.sliding_window + 1);
    std::vector<std::int64_t> entries;  // compressed entries attended, ascending
    std::vector<float> scores;
    if (r == 128) {
      for (std::int64_t j = 0; 128 * (j + 1) <= p + 1; ++j) entries.push_back(j);
    } else if (r == 4) {
      const std::int64_t complete = (p + 1) / 4;
      const CacheGroup& ig = spec_.groups[static_cast<std::size_t>(index_group)];
      const IndexerParams ip{c.index_n_heads, c.index_head_dim, rd, c.index_topk};
      std::vector<float> keys(static_cast<std::size_t>(complete * ip.head_dim));
      for (std::int64_t j = 0; j < complete; ++j) {
        const std::int64_t slot = s.read_slot(ig, index_group, t, j);
        decode_indexer_key(entry_ptr(index_group, w.layer, slot, false),
                           entry_ptr(index_group, w.layer, slot, true), spec_.options.indexer_dtype,
                           row_of(keys, j, ip.head_dim));
      }
      scores.assign(static_cast<std::size_t>(complete), 0.0f);
      indexer_scores(row_of(s.index_q, t, ip.n_heads * ip.head_dim), row_of(s.index_w, t, ip.n_heads), keys, ip,
                     scores);
      entries = top_k_indices(scores, c.index_topk);
      std::sort(entries.begin(), entries.end());
    }
    const std::int64_t n_window = p - first + 1;
    const auto n_keys = static_cast<std::size_t>(n_window) + entries.size();
    std::vector<float> keys(n_keys * static_cast<std::size_t>(d));
    const CacheGroup& wg = spec_.groups[static_cast<std::size_t>(window_group)];
    for (std::int64_t i = 0; i < n_window; ++i) {
      const std::int64_t slot = s.read_slot(wg, window_group, t, first + i);
      decode_main_kv(entry_ptr(window_group, w.layer, slot, false),
                     entry_ptr(window_group, w.layer, slot, true), rd, kv_dtype, row_of(keys, i, d));
    }
    for (std::size_t k = 0; k < entries.size(); ++k) {
      const CacheGroup& mg = spec_.groups[static_cast<std::size_t>(main_group)];
      const std::int64_t slot = s.read_slot(mg, main_group, t, entries[k]);
      decode_main_kv(entry_ptr(main_group, w.layer, slot, false),
                     entry_ptr(main_group, w.layer, slot, true), rd, kv_dtype,
                     row_of(keys, n_window + static_cast<std::int64_t>(k), d));
    }
    auto ot = row_of(o, t, H * d);
    sink_attention(row_of(s.q, t, H * d), H, d, keys, w.attn_sink, scale, ot);
    rope.apply_heads(ot, static_cast<std::size_t>(d), p, /*inverse=*/true);  // SPEC 3.2 step 5
    round_all_to_bf16(ot);
    if (taps) {
      compressed_keys[static_cast<std::size_t>(t)] = entries;
      index_scores[static_cast<std::size_t>(t)] = std::move(scores);
    }
  });
  if (taps) {
    for (std::int64_t t = 0; t < T; ++t) {
      const std::int64_t p = s.position(t);
      std::vector<std::int64_t> window;
      for (std::int64_t q = std::max<std::int64_t>(0, p - c.sliding_window + 1); q <= p; ++q) window.push_back(q);
      const auto row = static_cast<std::size_t>(s.row(t));
      inspector_->attention(w.layer, AttentionTap{s.plan.view.seqs[row], p, window,
                                                  compressed_keys[static_cast<std::size_t>(t)],
                                                  index_scores[static_cast<std::size_t>(t)]});
    }
  }

  // Grouped low-rank output (SPEC 3.2 step 6), then hc post.
  std::vector<float> z(static_cast<std::size_t>(T * c.o_groups * c.o_lora_rank));
  linear_grouped_bf16(o, T, w.wo_a, c.o_groups, z, pool);
  std::vector<float> out(static_cast<std::size_t>(T * D));
  linear(z, T, w.wo_b, out, pool);
  std::vector<float> h_new(s.h.size());
  parallel_for(pool, 0, T, [&](std::int64_t t) {
    hc_post(row_of(out, t, D), row_of(s.h, t, hc * D), row_of(s.post, t, hc), row_of(s.comb, t, hc * hc), hcp,
            row_of(h_new, t, hc * D));
  });
  s.h.swap(h_new);
}

void CpuExecutor::store_state(Step& s, std::int64_t layer, CacheKind kind, const std::vector<float>& state,
                              std::int64_t width) {
  const int g = spec_.group_of(kind);
  for (std::int64_t t = 0; t < s.tokens; ++t) {
    const std::int64_t slot = s.write_slot(g, t);
    if (slot < 0) continue;  // a position no later step reads
    std::memcpy(entry_ptr(g, layer, slot, false), &state[static_cast<std::size_t>(t * width)],
                static_cast<std::size_t>(width) * sizeof(float));
  }
}

void CpuExecutor::write_compressed_entries(Step& s, const CpuBlockWeights& w, bool indexer) {
  const ModelConfig& c = config_;
  const std::int64_t r = indexer ? 4 : w.ratio;
  const std::int64_t hd = indexer ? c.index_head_dim : c.head_dim, rd = c.qk_rope_head_dim;
  const CompressorParams cp{r, hd, rd, indexer ? CompressorKind::kIndexer : CompressorKind::kAttention,
                            static_cast<float>(c.rms_norm_eps)};
  const int entry_group = spec_.group_of(indexer ? CacheKind::kIndexerKv : (r == 4 ? CacheKind::kCsaKv : CacheKind::kHcaKv));
  const CompressionPlan& cplan = r == 4 ? s.plan.c4 : s.plan.c128;
  // The state group this compressor pools from: the attention compressor's is listed first,
  // the indexer's second (step_plan.h).
  const std::size_t state_index = indexer ? 1 : 0;
  if (cplan.ratio != r || cplan.state_groups.size() <= state_index) throw std::logic_error("cpu executor: plan lacks the compression writes");
  const int state_group = cplan.state_groups[state_index];
  const std::vector<std::int32_t>& state_slots = cplan.state_slots[state_index];
  const auto& norm = indexer ? w.indexer->compressor.norm : w.compressor->norm;
  const RopeTable& rope = rope_for(w.layer);
  const std::int64_t n_slots = cp.num_slots();
  parallel_for(pool_.get(), 0, cplan.num_writes(), [&](std::int64_t i) {
    const std::int64_t t = cplan.token[static_cast<std::size_t>(i)];
    const std::int64_t j = cplan.entry[static_cast<std::size_t>(i)];
    // The ring the pooling reads (compressor.h): for r = 4 slots 0..3 = block j-1, 4..7 = block j.
    std::vector<float> ring(static_cast<std::size_t>(cp.ring_floats()), 0.0f);
    const std::vector<float>& step_state = indexer ? s.state_index : s.state_main;
    for (std::int64_t k = 0; k < n_slots; ++k) {
      const auto src_index = static_cast<std::size_t>(i * n_slots + k);
      const std::int32_t u = cplan.source[src_index];
      if (u == CompressionPlan::kNoPosition) continue;  // j = 0: no previous block
      const float* src = u >= 0 ? &step_state[static_cast<std::size_t>(u * cp.slot_floats())]
                                : reinterpret_cast<const float*>(entry_ptr(state_group, w.layer, state_slots[src_index], false));
      std::memcpy(&ring[static_cast<std::size_t>(k * cp.slot_floats())], src,
                  static_cast<std::size_t>(cp.slot_floats()) * sizeof(float));
    }
    std::vector<float> entry(static_cast<std::size_t>(hd));
    compressor_entry(ring, j, norm, rope, cp, entry, /*simulate_quant=*/false);  // the encoder quantizes once
    const std::int64_t slot = s.write_slot(entry_group, t);
    std::uint8_t* data = entry_ptr(entry_group, w.layer, slot, false);
    std::uint8_t* scales = entry_ptr(entry_group, w.layer, slot, true);
    if (indexer) {
      encode_indexer_key(entry, spec_.options.indexer_dtype, data, scales);
    } else {
      encode_main_kv(entry, rd, spec_.options.kv_dtype, data, scales);
    }
  });
}

void CpuExecutor::ffn_layer(Step& s, const CpuBlockWeights& w) {
  const ModelConfig& c = config_;
  const std::int64_t D = c.hidden_size, hc = c.hc_mult, k = c.num_experts_per_tok;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const HcParams hcp{hc, D, c.hc_sinkhorn_iters, eps, static_cast<float>(c.hc_eps)};
  const MoeParams mp{c.n_routed_experts, k, static_cast<float>(c.routed_scaling_factor),
                     static_cast<float>(c.swiglu_limit)};
  const auto& views = expert_views_[static_cast<std::size_t>(w.layer)];
  std::vector<float> h_new(s.h.size());
  parallel_for(pool_.get(), 0, s.tokens, [&](std::int64_t t) {
    std::vector<float> y(static_cast<std::size_t>(D)), post(static_cast<std::size_t>(hc)),
        comb(static_cast<std::size_t>(hc * hc)), x(static_cast<std::size_t>(D)), out(static_cast<std::size_t>(D));
    auto ht = row_of(s.h, t, hc * D);
    hc_pre(ht, w.hc_ffn.fn, w.hc_ffn.scale, w.hc_ffn.base, hcp, y, post, comb);
    rms_norm(y, 1, w.ffn_norm, eps, x);
    std::vector<float> scores(static_cast<std::size_t>(c.n_routed_experts));
    moe_gate_scores(x, w.gate, scores);
    MoeRouting routing;
    if (w.hash_routed) {
      const std::int64_t id = s.plan.token_ids[static_cast<std::size_t>(t)];
      routing = moe_route_hash(scores, std::span<const std::int64_t>(w.tid2eid).subspan(static_cast<std::size_t>(id * k),
                                                                                        static_cast<std::size_t>(k)),
                               mp);
    } else {
      routing = moe_route_scores(scores, w.gate_bias, mp);
    }
    moe_forward(x, routing, views, w.shared.view(), mp, out);
    hc_post(out, ht, post, comb, hcp, row_of(h_new, t, hc * D));
  });
  s.h.swap(h_new);
}

}  // namespace dsv4
