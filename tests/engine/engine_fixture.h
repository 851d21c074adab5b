// Helpers shared by the engine and scheduler tests: prompts, cache sizes, and a loop that
// steps an engine to the end while checking the KV cache invariants after every step.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "common/error.h"
#include "engine/engine.h"
#include "kvcache/memory_plan.h"
#include "recording_executor.h"

namespace dsv4::test {

// `n` tokens in [2, 64) (never eos = 1), a pure function of `seed`.
inline std::vector<std::int32_t> random_tokens(std::uint64_t seed, std::int64_t n) {
  std::vector<std::int32_t> out;
  for (std::int64_t i = 0; i < n; ++i) out.push_back(static_cast<std::int32_t>(2 + splitmix64(seed * 1000003 + static_cast<std::uint64_t>(i)) % 62));
  return out;
}

// Pages for `copies` sequences of `tokens` positions plus room for a prefill chunk.
inline std::vector<std::int64_t> pages_for(const CacheSpec& spec, std::int64_t tokens, double copies) {
  std::vector<std::int64_t> one = sequence_pages(spec, tokens);
  std::vector<std::int64_t> chunk = sequence_pages(spec, 512);
  std::vector<std::int64_t> pages;
  for (std::size_t b = 0; b < one.size(); ++b) pages.push_back(static_cast<std::int64_t>(static_cast<double>(one[b]) * copies) + chunk[b]);
  return pages;
}

inline EngineConfig engine_config(std::int64_t budget, std::int64_t max_seqs, std::vector<std::int64_t> pages,
                                  bool prefix_caching = true) {
  EngineConfig c;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = max_seqs;
  c.max_model_len = 4096;
  c.cache_pages = std::move(pages);
  c.prefix_caching = prefix_caching;
  return c;
}

inline SamplingParams greedy(std::int64_t max_tokens, bool ignore_eos = true) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = ignore_eos;
  return p;
}

inline SamplingParams random_sampling(std::int64_t max_tokens, std::uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.9;
  p.top_p = 0.95;
  p.top_k = 40;
  p.seed = seed;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

// Accumulated results per request: all tokens, and the final output's fields.
struct Finished {
  std::vector<std::int32_t> tokens;
  std::vector<SampledToken> logprobs;
  RequestOutput last;
  int finished_reports = 0;
};

// Steps until nothing is unfinished (at most `max_steps`), checking invariants every step.
inline std::map<RequestId, Finished> run_to_end(Engine& engine, int max_steps = 100000) {
  std::map<RequestId, Finished> out;
  int steps = 0;
  while (engine.has_unfinished()) {
    if (++steps > max_steps) {
      ADD_FAILURE() << "engine did not finish within " << max_steps << " steps";
      break;
    }
    for (RequestOutput& o : engine.step()) {
      Finished& f = out[o.id];
      f.tokens.insert(f.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      f.logprobs.insert(f.logprobs.end(), o.new_logprobs.begin(), o.new_logprobs.end());
      f.finished_reports += o.finished;
      f.last = std::move(o);
    }
    engine.kv_cache().check_invariants();
  }
  for (const auto& [id, f] : out) EXPECT_EQ(f.finished_reports, 1) << "request " << id;
  return out;
}

}  // namespace dsv4::test
