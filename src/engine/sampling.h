// Sampling: how a request turns one row of logits into its next token.
//
// The sampler is a pure function of (logits, params, seed, output index): the random number
// for output token i of a request is splitmix64 of (seed, i), so the token does not depend on
// which other requests share the batch, on the order of rows, or on whether the request was
// preempted and recomputed in between. The pipeline (vLLM's order):
//   temperature == 0 (or below 1e-5)   greedy: the largest logit, ties to the lower token id
//   otherwise                          softmax(logits / temperature), restricted to the top_k
//                                      largest, then to the nucleus: the smallest set, sorted
//                                      by probability then id, whose mass (summed in that order)
//                                      reaches top_p of the total (summed in id order without
//                                      top_k, in that order with it); one uniform draw walks that
//                                      set in that order.
// Logprobs, when asked for, are log_softmax of the raw logits (before temperature, top-k and
// top-p), computed in double in token-id order, as the OpenAI API reports them.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace dsv4 {

struct SamplingParams {
  double temperature = 1.0;  // 0 = greedy
  double top_p = 1.0;        // (0, 1]; 1 = off
  std::int64_t top_k = 0;    // 0 (or -1) = off
  std::optional<std::uint64_t> seed;          // unset: the engine draws one per request
  std::optional<std::int64_t> max_tokens;     // unset: until the context (max_model_len) is full
  std::vector<std::int32_t> stop_token_ids;   // finish (reason stop) after emitting any of these
  bool ignore_eos = false;                    // keep going past the model's eos token
  std::optional<std::int64_t> logprobs;       // set: report the sampled token's logprob and the
                                              // top `*logprobs` alternatives (0 = sampled only)

  bool greedy() const { return temperature < 1e-5; }
  // Throws Error naming the field when a value is out of range for a vocabulary of `vocab`.
  void validate(std::int64_t vocab_size) const;
};

struct TokenLogprob {
  std::int32_t token = 0;
  float logprob = 0;
};

struct SampledToken {
  std::int32_t token = 0;
  float logprob = 0;                      // of `token`; only when params.logprobs is set
  std::vector<TokenLogprob> top_logprobs;  // the params.logprobs most likely, best first (ties: lower id)
};

// The counter-based generator: a uniform double in [0, 1) for draw `index` of stream `seed`.
double uniform_draw(std::uint64_t seed, std::uint64_t index);
std::uint64_t splitmix64(std::uint64_t x);

class Sampler {
 public:
  // Samples output token number `output_index` of a request from its row of logits.
  SampledToken sample(std::span<const float> logits, const SamplingParams& params, std::uint64_t seed,
                      std::int64_t output_index);

  // The pieces, for tests and for scoring.
  static std::int32_t argmax(std::span<const float> logits);  // ties to the lower id
  // log_softmax of `logits` into `out` (double accumulation, id order).
  static void log_softmax(std::span<const float> logits, std::vector<double>& out);

 private:
  std::int32_t sample_random(std::span<const float> logits, const SamplingParams& params, double u);

  struct Candidate {
    std::int32_t token;
    float logit;
  };
  std::vector<Candidate> candidates_;
  std::vector<double> weights_;
  std::vector<double> bucket_mass_;  // top-p: the mass by bucket of the scaled logit
};

}  // namespace dsv4
