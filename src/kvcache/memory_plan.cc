// MemoryPlan: per-kind and total cache bytes per sequence, buckets, capacity (memory_plan.h).
#include "kvcache/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/error.h"

namespace dsv4 {
namespace {

std::size_t ix(std::int64_t i) { return static_cast<std::size_t>(i); }

std::string commas(std::int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

double gib(std::int64_t bytes) { return static_cast<double>(bytes) / static_cast<double>(std::int64_t{1} << 30); }
double gb(std::int64_t bytes) { return static_cast<double>(bytes) / 1e9; }
std::string sized(std::int64_t bytes) {
  return fmt::format("{} B = {:.3f} GiB = {:.3f} GB", commas(bytes), gib(bytes), gb(bytes));
}

// Entries one sequence of `tokens` positions keeps per layer (unpadded).
std::int64_t entries_per_layer(const CacheGroup& g, std::int64_t tokens) {
  if (!g.sliding) return tokens / g.tokens_per_entry;
  return std::min(tokens, g.keep_extent + g.keep_align);  // window: 128; c4 state: 8; c128 state: 128
}

}  // namespace

std::int64_t sequence_blocks(const CacheGroup& g, std::int64_t tokens) {
  if (tokens <= 0) return 0;
  const std::int64_t per_block = g.positions_per_block;
  if (!g.sliding) return (tokens + per_block - 1) / per_block;
  // The step that writes position n holds positions [keep_from(n), n]; the pattern repeats
  // every 256 positions, so the last 256 steps cover every alignment.
  std::int64_t most = 0;
  for (std::int64_t n = std::max<std::int64_t>(0, tokens - kLogicalBlockTokens); n < tokens; ++n) {
    most = std::max(most, n / per_block - g.keep_from(n) / per_block + 1);
  }
  return most;
}

std::vector<std::int64_t> sequence_pages(const CacheSpec& spec, std::int64_t tokens) {
  std::vector<std::int64_t> pages(spec.buckets.size(), 0);
  for (const CacheGroup& g : spec.groups) pages[ix(g.bucket)] += sequence_blocks(g, tokens) * g.num_layers();
  return pages;
}

std::vector<std::int64_t> pool_pages_for_budget(const CacheSpec& spec, std::int64_t budget_bytes, std::int64_t context) {
  const std::vector<std::int64_t> per_seq = sequence_pages(spec, std::max<std::int64_t>(context, 1));
  std::int64_t per_seq_bytes = 0;
  for (std::size_t b = 0; b < per_seq.size(); ++b) per_seq_bytes += per_seq[b] * spec.buckets[b];
  std::vector<std::int64_t> pages(spec.buckets.size(), 0);
  if (per_seq_bytes == 0 || budget_bytes <= 0) return pages;
  for (std::size_t b = 0; b < per_seq.size(); ++b) {
    const long double share = static_cast<long double>(per_seq[b]) * spec.buckets[b] / per_seq_bytes;
    pages[b] = static_cast<std::int64_t>(share * budget_bytes / spec.buckets[b]);
  }
  return pages;
}

MemoryPlan plan_memory(const ModelConfig& config, const PlanRequest& request) {
  if (request.context <= 0) fail("plan: context must be a positive number of tokens, found {}", request.context);
  MemoryPlan plan;
  plan.spec = CacheSpec::build(config, request.cache);
  plan.model_name = request.model_name;
  plan.context = request.context;
  for (const CacheGroup& g : plan.spec.groups) {
    KindPlan k;
    k.kind = g.kind;
    k.layers = g.num_layers();
    k.entry_bytes = g.format.entry_bytes();
    k.entries_per_layer = entries_per_layer(g, request.context);
    k.bytes = k.entries_per_layer * k.entry_bytes * k.layers;
    k.blocks = sequence_blocks(g, request.context);
    k.paged_bytes = k.blocks * k.layers * g.page_bytes;
    (g.sliding ? plan.sliding_bytes : plan.compressed_bytes) += k.bytes;
    plan.paged_bytes += k.paged_bytes;
    if (g.kind == CacheKind::kWindowKv) plan.step_bytes_per_token = k.entry_bytes * k.layers;
    plan.kinds.push_back(k);
  }
  plan.pages_per_sequence = sequence_pages(plan.spec, request.context);

  const std::int64_t v32_main = request.cache.kv_dtype == KvCacheDtype::kBf16 ? (512 + 64) * 2 : 512 + 4 * 4 + 64 * 2;
  const std::int64_t v32_index = request.cache.indexer_dtype == IndexerCacheDtype::kBf16 ? 128 * 2 : 128 + 4;
  plan.v32_bytes_per_token_layer = v32_main + v32_index;
  plan.v32_bytes = plan.v32_bytes_per_token_layer * kV32Layers * request.context;
  plan.v32_ratio = plan.compressed_bytes > 0 ? static_cast<double>(plan.v32_bytes) / static_cast<double>(plan.compressed_bytes) : 0.0;

  if (request.gpu_memory_bytes) {
    plan.gpu_memory_bytes = request.gpu_memory_bytes;
    plan.weight_bytes = request.weight_bytes;
    plan.kv_budget_bytes = std::max<std::int64_t>(0, *request.gpu_memory_bytes - request.weight_bytes.value_or(0));
    plan.sequences_fit = plan.paged_bytes > 0 ? plan.kv_budget_bytes / plan.paged_bytes : 0;
    plan.pool_pages = pool_pages_for_budget(plan.spec, plan.kv_budget_bytes, request.context);
  }
  return plan;
}

std::string format_plan(const MemoryPlan& plan) {
  const CacheSpec& spec = plan.spec;
  std::string out;
  auto line = [&](const std::string& s) { out += s + "\n"; };

  std::int64_t window_only = 0, csa = 0, hca = 0;
  for (std::int64_t layer = 0; layer < spec.num_main_layers; ++layer) {
    bool in_csa = false, in_hca = false;
    if (int g = spec.group_of(CacheKind::kCsaKv); g >= 0) in_csa = spec.groups[ix(g)].layer_slot(layer) >= 0;
    if (int g = spec.group_of(CacheKind::kHcaKv); g >= 0) in_hca = spec.groups[ix(g)].layer_slot(layer) >= 0;
    (in_csa ? csa : in_hca ? hca : window_only) += 1;
  }
  const std::int64_t mtp = spec.num_layers - spec.num_main_layers;
  line(fmt::format("KV cache plan{}: {} layers ({} window-only, {} CSA, {} HCA){}, context {} tokens",
                   plan.model_name.empty() ? "" : " for " + plan.model_name, spec.num_main_layers, window_only, csa,
                   hca, mtp > 0 ? fmt::format(" + {} MTP block(s) (window only)", mtp) : std::string(),
                   commas(plan.context)));
  line(fmt::format("entries: main KV {} ({} B), indexer keys {} ({} B), compressor state fp32",
                   cache_dtype_name(spec.options.kv_dtype), spec.group(CacheKind::kWindowKv).format.entry_bytes(),
                   cache_dtype_name(spec.options.indexer_dtype),
                   spec.group_of(CacheKind::kIndexerKv) >= 0 ? spec.group(CacheKind::kIndexerKv).format.entry_bytes() : 0));
  line("");
  line(fmt::format("{} page bucket(s) (at most 3; every page a multiple of {} B, waste = page - entries):",
                   spec.buckets.size(), spec.alignment));
  for (std::size_t b = 0; b < spec.buckets.size(); ++b) {
    line(fmt::format("  bucket {}: {} B", b, commas(spec.buckets[b])));
    for (const CacheGroup& g : spec.groups) {
      if (ix(g.bucket) != b) continue;
      const PageLayout layout = g.layout();
      line(fmt::format("    {:<28} {:>3} {} x {:>4} B = {:>6} B, waste {:>5} B ({:.1f}%)", cache_kind_title(g.kind),
                       layout.entries, g.tokens_per_entry == 1 ? "positions" : "entries  ", g.format.entry_bytes(),
                       commas(layout.used_bytes()), commas(layout.waste_bytes()),
                       100.0 * static_cast<double>(layout.waste_bytes()) / static_cast<double>(layout.page_bytes)));
    }
  }
  line("");
  line(fmt::format("per sequence of {} tokens:", commas(plan.context)));
  line(fmt::format("  {:<28} {:>6} {:>14} {:>8} {:>18} {:>18}", "kind", "layers", "entries/layer", "entry B", "bytes", "paged bytes"));
  auto row = [&](const KindPlan& k) {
    line(fmt::format("  {:<28} {:>6} {:>14} {:>8} {:>18} {:>18}", cache_kind_title(k.kind), k.layers,
                     commas(k.entries_per_layer), k.entry_bytes, commas(k.bytes), commas(k.paged_bytes)));
  };
  for (const KindPlan& k : plan.kinds) {
    if (is_compressed_kind(k.kind)) row(k);
  }
  line(fmt::format("  compressed KV + indexer (the published figure): {}", sized(plan.compressed_bytes)));
  for (const KindPlan& k : plan.kinds) {
    if (!is_compressed_kind(k.kind)) row(k);
  }
  line(fmt::format("  windows + compressor states: {}", sized(plan.sliding_bytes)));
  std::string pages;
  for (std::size_t b = 0; b < plan.pages_per_sequence.size(); ++b) {
    pages += fmt::format("{}{} x {} B", b ? ", " : "", commas(plan.pages_per_sequence[b]), commas(spec.buckets[b]));
  }
  line(fmt::format("  all kinds as pages: {} ({})", sized(plan.paged_bytes), pages));
  line(fmt::format("  a step also holds {} B of window KV per scheduled token until commit",
                   commas(plan.step_bytes_per_token)));
  line("");
  line(fmt::format("{}-layer V3.2-style MLA cache ({} B per token per layer): {}", kV32Layers,
                   plan.v32_bytes_per_token_layer, sized(plan.v32_bytes)));
  line(fmt::format("V4 compressed KV + indexer needs {:.2f}x less", plan.v32_ratio));
  if (plan.gpu_memory_bytes) {
    line("");
    line(fmt::format("GPU memory {:.2f} GiB - weights {} = {} for the KV cache",
                     gib(*plan.gpu_memory_bytes),
                     plan.weight_bytes ? fmt::format("{:.2f} GiB", gib(*plan.weight_bytes)) : std::string("unknown (counted as 0)"),
                     sized(plan.kv_budget_bytes)));
    std::string pools;
    for (std::size_t b = 0; b < plan.pool_pages.size(); ++b) {
      pools += fmt::format("{}{} x {} B", b ? ", " : "", commas(plan.pool_pages[b]), commas(spec.buckets[b]));
    }
    line(fmt::format("fits {} sequences of {} tokens (pools: {}){}", commas(plan.sequences_fit), commas(plan.context), pools,
                     plan.kv_budget_bytes == 0 ? "; the weights alone exceed this GPU memory" : ""));
  }
  return out;
}

Json plan_to_json(const MemoryPlan& plan) {
  const CacheSpec& spec = plan.spec;
  Json buckets = Json::array();
  for (std::size_t b = 0; b < spec.buckets.size(); ++b) {
    Json kinds = Json::array();
    for (const CacheGroup& g : spec.groups) {
      if (ix(g.bucket) != b) continue;
      const PageLayout layout = g.layout();
      kinds.push_back({{"kind", cache_kind_name(g.kind)},
                       {"positions_per_page", g.positions_per_block},
                       {"entries_per_page", layout.entries},
                       {"entry_bytes", g.format.entry_bytes()},
                       {"used_bytes", layout.used_bytes()},
                       {"waste_bytes", layout.waste_bytes()}});
    }
    buckets.push_back({{"page_bytes", spec.buckets[b]}, {"pages_per_sequence", plan.pages_per_sequence[b]}, {"kinds", kinds}});
  }
  Json kinds = Json::array();
  for (const KindPlan& k : plan.kinds) {
    kinds.push_back({{"kind", cache_kind_name(k.kind)},
                     {"layers", k.layers},
                     {"entry_bytes", k.entry_bytes},
                     {"entries_per_layer", k.entries_per_layer},
                     {"bytes", k.bytes},
                     {"blocks", k.blocks},
                     {"paged_bytes", k.paged_bytes}});
  }
  Json out = {{"model", plan.model_name},
              {"context", plan.context},
              {"kv_cache_dtype", cache_dtype_name(spec.options.kv_dtype)},
              {"indexer_cache_dtype", cache_dtype_name(spec.options.indexer_dtype)},
              {"page_alignment", spec.alignment},
              {"buckets", buckets},
              {"kinds", kinds},
              {"compressed_bytes", plan.compressed_bytes},
              {"compressed_gib", gib(plan.compressed_bytes)},
              {"compressed_gb", gb(plan.compressed_bytes)},
              {"sliding_bytes", plan.sliding_bytes},
              {"paged_bytes", plan.paged_bytes},
              {"step_bytes_per_token", plan.step_bytes_per_token},
              {"v32", {{"layers", kV32Layers},
                       {"bytes_per_token_layer", plan.v32_bytes_per_token_layer},
                       {"bytes", plan.v32_bytes},
                       {"gib", gib(plan.v32_bytes)},
                       {"gb", gb(plan.v32_bytes)},
                       {"ratio", plan.v32_ratio}}}};
  if (plan.gpu_memory_bytes) {
    out["capacity"] = {{"gpu_memory_bytes", *plan.gpu_memory_bytes},
                       {"weight_bytes", plan.weight_bytes ? Json(*plan.weight_bytes) : Json(nullptr)},
                       {"kv_budget_bytes", plan.kv_budget_bytes},
                       {"sequences", plan.sequences_fit},
                       {"pool_pages", plan.pool_pages}};
  }
  return out;
}

}  // namespace dsv4
