// GPU executor benchmark: decode steps of a V4-Flash-shaped model (the real config with fewer
// layers, dummy weights drawn on the GPU) at several batch sizes and contexts, and the prefill of
// one long prompt in chunks. Prints step time, tokens/s, the time split by kernel family (one
// profiled step: decode replayed as a graph with timing nodes, prefill eager), and the step's byte roofline: weights actually read plus KV read, over
// the HBM bandwidth measured in the same run (a large device-to-device copy).
//
//   bench_gpu_model [--preset flash|pro] [--layers N] [--batches 1,32,128] [--contexts 4096,131072]
//                   [--steps N] [--prefill TOKENS] [--chunk TOKENS]
// Long contexts are not prefilled: the sequences' cache pages are filled with random finite bytes
// (CudaExecutor::randomize_cache), which is what a decode step reads.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/cuda_executor.h"
#include "cuda/runtime.h"
#include "gpu_bench_util.h"
#include "executor/inspector.h"
#include "executor/step_plan.h"
#include "kvcache/kv_cache_manager.h"
#include "kvcache/memory_plan.h"
#include "model/presets.h"

namespace dsv4 {
namespace {

using Clock = std::chrono::steady_clock;

using bench::median;
using bench::parse_list;

std::int64_t fp8_bytes(std::int64_t out, std::int64_t in) { return out * in + ((out + 127) / 128) * ((in + 127) / 128) * 4; }

// Bytes of weights a decode step of `tokens` tokens reads (dense layers, the experts the tokens
// touch on average under uniform routing, the head rows of the sampled tokens' logits: all of it).
double weight_bytes(const ModelConfig& c, std::int64_t tokens) {
  const std::int64_t D = c.hidden_size, H = c.num_attention_heads, ql = c.q_lora_rank, I = c.moe_intermediate_size;
  const std::int64_t E = c.n_routed_experts, K = c.num_experts_per_tok, GO = c.o_groups * c.o_lora_rank;
  const double touched = static_cast<double>(E) * (1.0 - std::pow(1.0 - static_cast<double>(K) / static_cast<double>(E), static_cast<double>(tokens)));
  double total = static_cast<double>(c.vocab_size) * D * 2;  // head
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::int64_t r = c.compress_ratio(l);
    double layer = 2.0 * 24 * c.hc_mult * D * 4;  // two hc_pre mixes
    layer += fp8_bytes(ql, D) + fp8_bytes(H * 512, ql) + fp8_bytes(512, D) + fp8_bytes(GO, H * 512 / c.o_groups) + fp8_bytes(D, GO);
    if (r > 0) layer += 2.0 * (r == 4 ? 2 : 1) * 512 * D * 2;  // compressor wkv + wgate (bf16)
    if (r == 4) layer += fp8_bytes(c.index_n_heads * c.index_head_dim, ql) + c.index_n_heads * D * 2 + 2.0 * 2 * 128 * D * 2;
    layer += E * D * 2.0;                                               // gate
    layer += 3.0 * fp8_bytes(I, D);                                     // shared expert
    layer += touched * 3.0 * (static_cast<double>(I) * D / 2 + static_cast<double>(I) * D / 32);  // routed fp4
    total += layer;
  }
  return total;
}

// Bytes of KV a decode token reads at context `ctx` (window, compressed entries, indexer keys).
double kv_bytes_per_token(const ModelConfig& c, std::int64_t ctx) {
  double total = 0;
  const double entry = 584, index_entry = 68;
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::int64_t r = c.compress_ratio(l);
    total += std::min<std::int64_t>(c.sliding_window, ctx) * entry;
    if (r == 4) total += std::min<std::int64_t>(c.index_topk, ctx / 4) * entry + static_cast<double>(ctx / 4) * index_entry;
    if (r == 128) total += static_cast<double>(ctx / 128) * entry;
  }
  return total;
}

void print_profile(gpu::CudaExecutor& exec, double step_ms) {
  auto profile = exec.take_profile();
  std::sort(profile.begin(), profile.end(), [](const auto& a, const auto& b) { return a.ms > b.ms; });
  double sum = 0;
  for (const auto& k : profile) sum += k.ms;
  for (const auto& k : profile)
    fmt::print("      {:<46} {:9.3f} ms {:5.1f}%  ({} launches groups)\n", k.family, k.ms, 100.0 * k.ms / std::max(sum, 1e-9), k.calls);
  fmt::print("      {:<46} {:9.3f} ms (profiled step: decode as a graph with timing nodes, prefill eager; graph step {:.3f} ms)\n", "total", sum, step_ms);
}

// Finds where non-finite values first appear: the first layer whose residual streams hold one.
class FiniteCheck final : public Inspector {
 public:
  void hidden(std::int64_t layer, std::span<const std::int64_t> seqs, std::span<const std::int64_t> positions,
              std::span<const float> hidden) override {
    (void)seqs;
    if (first_layer_ >= 0) return;
    const std::size_t width = positions.empty() ? 0 : hidden.size() / positions.size();
    for (std::size_t i = 0; i < hidden.size(); ++i)
      if (!std::isfinite(hidden[i])) {
        first_layer_ = layer;
        first_row_ = width == 0 ? 0 : static_cast<std::int64_t>(i / width);
        return;
      }
  }
  void attention(std::int64_t, const AttentionTap&) override {}
  std::int64_t first_layer_ = -1, first_row_ = -1;
};

struct Runner {
  gpu::CudaExecutor& exec;
  KvCacheManager& kv;
  const ModelConfig& c;

  // One step of `slices`, token ids arbitrary; returns wall-clock ms (launch to collected logits,
  // which stay in the executor's pinned buffer as the engine reads them).
  double step(const std::vector<StepSlice>& slices, bool logits_last_only) {
    for (const StepSlice& s : slices)
      if (!kv.allocate(s.seq, s.num_tokens).ok()) fail("benchmark: the KV cache is too small");
    StepPlan plan;
    plan.view = kv.step_view(slices);
    plan.token_ids.assign(static_cast<std::size_t>(plan.view.positions.size()), 0);
    for (std::size_t i = 0; i < plan.token_ids.size(); ++i) plan.token_ids[i] = static_cast<std::int32_t>((i * 7919 + 13) % c.vocab_size);
    for (std::size_t r = 0; r < slices.size(); ++r) plan.logits_tokens.push_back(plan.view.token_start[r + 1] - 1);
    (void)logits_last_only;
    plan.page_changes = kv.take_page_changes();
    finish_step_plan(plan, kv.spec());
    const auto t0 = Clock::now();
    const std::span<const float> logits = exec.execute(plan);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    std::int64_t bad_row = -1;
    for (std::size_t i = 0; i < logits.size() && bad_row < 0; ++i)
      if (!std::isfinite(logits[i])) bad_row = static_cast<std::int64_t>(i) / c.vocab_size;
    if (bad_row >= 0) {
      // Once more, eagerly, with the residual streams checked layer by layer (the cache pages
      // hold this step's entries already; rewriting them with the same values changes nothing).
      FiniteCheck check;
      exec.set_inspector(&check);
      (void)exec.execute(plan);
      exec.set_inspector(nullptr);
      fail("benchmark: non-finite logits (row {} of {}); eagerly with taps: first non-finite streams after layer {} (row {})",
           bad_row, plan.num_logits_rows(), check.first_layer_, check.first_row_);
    }
    for (std::size_t r = 0; r < slices.size(); ++r) {
      const auto begin = plan.token_ids.begin() + plan.view.token_start[r], end = plan.token_ids.begin() + plan.view.token_start[r + 1];
      kv.commit(slices[r].seq, std::vector<std::int32_t>(begin, end));
    }
    return ms;
  }
};

int run(int argc, char** argv) {
  std::string preset = "flash";
  std::int64_t layers = 8, steps = 20, prefill = 32768, chunk = 4096;
  std::vector<std::int64_t> batches = {1, 32, 128}, contexts = {4096, 131072};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--preset") preset = value;
    else if (key == "--layers") layers = std::atoll(value.c_str());
    else if (key == "--steps") steps = std::atoll(value.c_str());
    else if (key == "--prefill") prefill = std::atoll(value.c_str());
    else if (key == "--chunk") chunk = std::atoll(value.c_str());
    else if (key == "--batches") batches = parse_list(value);
    else if (key == "--contexts") contexts = parse_list(value);
    else fail("unknown option {}", key);
  }
  ModelConfig c = preset_config(preset);
  c.num_hidden_layers = layers;
  c.num_nextn_predict_layers = 0;
  c.compress_ratios.resize(static_cast<std::size_t>(layers));
  const gpu::DeviceInfo dev = gpu::device_info();
  const double bw = bench::measure_hbm_bandwidth();
  fmt::print("device: {} ({} SMs, {:.1f} GB)\nHBM bandwidth (4 GiB copy, read + write): {:.2f} TB/s\n", dev.name, dev.sm_count,
             dev.total_bytes / 1e9, bw / 1e12);
  fmt::print("model: V4-{} shapes, {} layers (ratios", preset, layers);
  for (auto r : c.compress_ratios) fmt::print(" {}", r);
  fmt::print("), dummy weights\n");

  gpu::CudaOptions options;
  options.max_logits_rows = 256;
  const CacheOptions cache{KvCacheDtype::kFp8, IndexerCacheDtype::kFp4, false};
  const auto t_load = Clock::now();
  auto exec = gpu::CudaExecutor::dummy(c, cache, options, 1);
  fmt::print("dummy weights: {:.2f} GB in {:.1f} s\n", exec->weights().bytes / 1e9,
             std::chrono::duration<double>(Clock::now() - t_load).count());
  const std::int64_t max_batch = *std::max_element(batches.begin(), batches.end());
  const std::int64_t max_ctx = std::max(*std::max_element(contexts.begin(), contexts.end()), prefill) + 256;
  const StepLimits limits{std::max(max_batch, chunk), max_batch, max_ctx};
  const std::int64_t budget = exec->cache_budget_bytes(limits);
  const std::vector<std::int64_t> pages = pool_pages_for_budget(exec->cache_spec(), budget, max_ctx);
  KvCacheManager kv(exec->cache_spec(), pages, /*prefix_caching=*/false);
  exec->allocate(pages, limits);
  Runner run{*exec, kv, c};
  SeqId next_id = 1;

  fmt::print("\n| decode | context | batch | step (ms) | tokens/s | roofline (ms) | of roofline |\n|---|---|---|---|---|---|---|\n");
  for (std::int64_t ctx : contexts) {
    for (std::int64_t b : batches) {
      // The sequences' contexts are never computed, only their pages filled: pages freed by the
      // previous configuration hold entries of other cache groups that share their page size
      // (fp32 compressor state read as e4m3 codes can be NaN), so every configuration starts from
      // freshly randomized pools.
      exec->randomize_cache(static_cast<std::uint64_t>(7 + ctx + b));
      std::vector<StepSlice> seqs;
      for (std::int64_t i = 0; i < b; ++i) {
        const SeqId id = next_id++;
        kv.add_sequence(id, {});
        if (!kv.allocate(id, ctx).ok()) fail("benchmark: no room for {} x {} tokens", b, ctx);
        kv.commit(id, std::vector<std::int32_t>(static_cast<std::size_t>(ctx), 5));
        seqs.push_back({id, 1});
      }
      std::vector<double> ms;
      for (std::int64_t s = 0; s < steps + 3; ++s) {
        const double t = run.step(seqs, true);
        if (s >= 3) ms.push_back(t);
      }
      const double step_ms = median(ms);
      const double bytes = weight_bytes(c, b) + static_cast<double>(b) * kv_bytes_per_token(c, ctx);
      const double roof_ms = bytes / bw * 1e3;
      fmt::print("| decode | {} | {} | {:.3f} | {:.0f} | {:.3f} | {:.0f}% |\n", ctx, b, step_ms, 1e3 * b / step_ms, roof_ms,
                 100.0 * roof_ms / step_ms);
      exec->set_profiling(true);
      run.step(seqs, true);
      exec->set_profiling(false);
      print_profile(*exec, step_ms);
      for (const StepSlice& s : seqs) kv.free(s.seq);
    }
  }

  if (prefill > 0) {
    const SeqId id = next_id++;
    kv.add_sequence(id, {});
    exec->set_profiling(true);
    double total_ms = 0;
    for (std::int64_t done = 0; done < prefill; done += chunk) {
      const std::int64_t n = std::min(chunk, prefill - done);
      total_ms += run.step({{id, n}}, true);
    }
    exec->set_profiling(false);
    fmt::print("\nprefill of {} tokens in chunks of {}: {:.1f} ms, {:.0f} tokens/s (eager, profiled)\n", prefill, chunk, total_ms,
               1e3 * static_cast<double>(prefill) / total_ms);
    print_profile(*exec, total_ms);
    kv.free(id);
  }
  return 0;
}

}  // namespace
}  // namespace dsv4

int main(int argc, char** argv) { return dsv4::bench::guarded_main("bench_gpu_model", dsv4::run, argc, argv); }
