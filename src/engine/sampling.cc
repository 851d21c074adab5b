// The sampler: greedy, temperature, top-k, top-p, counter-based randomness, logprobs
// (sampling.h).
#include "engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/error.h"

namespace dsv4 {
namespace {

// NaN logits (an executor bug or an overflow) never win and carry no probability.
float clean(float logit) { return std::isnan(logit) ? -std::numeric_limits<float>::infinity() : logit; }

// Higher logit first; equal logits: lower token id first.
template <typename C>
bool better(const C& a, const C& b) {
  return a.logit != b.logit ? a.logit > b.logit : a.token < b.token;
}

}  // namespace

void SamplingParams::validate(std::int64_t vocab_size) const {
  if (!std::isfinite(temperature) || temperature < 0) fail("sampling: temperature must be a finite number >= 0, found {}", temperature);
  if (!(top_p > 0 && top_p <= 1)) fail("sampling: top_p must be in (0, 1], found {}", top_p);
  if (top_k < -1) fail("sampling: top_k must be >= 0 (0 or -1 = off), found {}", top_k);
  if (max_tokens && *max_tokens < 1) fail("sampling: max_tokens must be >= 1, found {}", *max_tokens);
  for (std::int32_t id : stop_token_ids) {
    if (id < 0 || id >= vocab_size) fail("sampling: stop token id {} is outside the vocabulary [0, {})", id, vocab_size);
  }
  if (logprobs && (*logprobs < 0 || *logprobs > vocab_size)) {
    fail("sampling: logprobs must be in [0, {}] (the vocabulary size), found {}", vocab_size, *logprobs);
  }
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

double uniform_draw(std::uint64_t seed, std::uint64_t index) {
  const std::uint64_t bits = splitmix64(splitmix64(seed) ^ splitmix64(index ^ 0x5851f42d4c957f2dULL));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;  // 53 random bits -> [0, 1)
}

std::int32_t Sampler::argmax(std::span<const float> logits) {
  std::int32_t best = 0;
  float best_logit = -std::numeric_limits<float>::infinity();
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const float l = clean(logits[i]);
    if (l > best_logit) {  // strict: an equal later logit keeps the lower id
      best_logit = l;
      best = static_cast<std::int32_t>(i);
    }
  }
  return best;
}

void Sampler::log_softmax(std::span<const float> logits, std::vector<double>& out) {
  out.resize(logits.size());
  double m = -std::numeric_limits<double>::infinity();
  for (float l : logits) m = std::max(m, static_cast<double>(clean(l)));
  if (!std::isfinite(m)) {  // nothing finite: the executor gave garbage; report a uniform row
    std::fill(out.begin(), out.end(), -std::log(static_cast<double>(logits.size())));
    return;
  }
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(clean(l)) - m);
  const double log_sum = std::log(sum);
  for (std::size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(clean(logits[i])) - m - log_sum;
}

std::int32_t Sampler::sample_random(std::span<const float> logits, const SamplingParams& params, double u) {
  const auto vocab = static_cast<std::int64_t>(logits.size());
  const double inv_t = 1.0 / params.temperature;
  const bool use_top_k = params.top_k > 0 && params.top_k < vocab;
  const bool use_top_p = params.top_p < 1.0;
  const double m = static_cast<double>(clean(logits[static_cast<std::size_t>(argmax(logits))]));
  if (!std::isfinite(m)) return argmax(logits);

  if (!use_top_k && !use_top_p) {
    // The whole vocabulary, walked in id order.
    weights_.resize(logits.size());
    double total = 0;
    for (std::size_t i = 0; i < logits.size(); ++i) total += weights_[i] = std::exp((clean(logits[i]) - m) * inv_t);
    const double target = u * total;
    double acc = 0;
    std::int32_t last = 0;
    for (std::size_t i = 0; i < logits.size(); ++i) {
      if (weights_[i] <= 0) continue;
      acc += weights_[i];
      last = static_cast<std::int32_t>(i);
      if (acc > target) return last;
    }
    return last;  // rounding left the target at the very end
  }

  candidates_.resize(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) candidates_[i] = {static_cast<std::int32_t>(i), clean(logits[i])};
  auto order = [](const Candidate& a, const Candidate& b) { return better(a, b); };
  auto weight = [&](const Candidate& c) { return std::exp((c.logit - m) * inv_t); };
  std::size_t kept = candidates_.size();
  std::size_t sorted = 0;  // candidates_[0, sorted) are the best `sorted`, in order, weights_ beside
  double total = 0;
  if (use_top_k) {
    kept = static_cast<std::size_t>(params.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<std::ptrdiff_t>(kept), candidates_.end(), order);
    weights_.resize(kept);
    for (std::size_t i = 0; i < kept; ++i) total += weights_[i] = weight(candidates_[i]);
    sorted = kept;
  } else {
    // top-p alone (a full sort of a 129K vocabulary took 11 ms a row): the mass of the whole
    // vocabulary in id order, and by bucket of the scaled logit (1/16 wide, the last open below).
    // The buckets from the top whose mass reaches top_p, plus one for the rounding of the sums,
    // hold the nucleus: only those tokens are sorted.
    constexpr int kBuckets = 1024;
    constexpr double kPerUnit = 16;
    auto bucket = [&](float logit) {
      const double depth = -(logit - m) * inv_t * kPerUnit;  // >= 0; +inf for -inf logits
      return depth < kBuckets - 1 ? static_cast<int>(depth) : kBuckets - 1;
    };
    bucket_mass_.assign(kBuckets, 0.0);
    for (const Candidate& c : candidates_) {
      const double w = weight(c);
      total += w;
      bucket_mass_[static_cast<std::size_t>(bucket(c.logit))] += w;
    }
    const double need = params.top_p * total;
    double mass = 0;
    int last = 0;
    while (last < kBuckets - 1 && mass + bucket_mass_[static_cast<std::size_t>(last)] < need)
      mass += bucket_mass_[static_cast<std::size_t>(last++)];
    last = std::min(kBuckets - 1, last + 1);
    // Those tokens first (a bucket holds a range of logits, so they are the best `top`), sorted.
    const auto split = std::partition(candidates_.begin(), candidates_.end(),
                                      [&](const Candidate& c) { return bucket(c.logit) <= last; });
    const auto top = static_cast<std::size_t>(split - candidates_.begin());
    std::sort(candidates_.begin(), split, order);
    weights_.resize(top);
    for (std::size_t i = 0; i < top; ++i) weights_[i] = weight(candidates_[i]);
    sorted = top;
  }
  if (use_top_p) {
    // The smallest prefix (most probable first) whose mass reaches top_p. (Should the sorted
    // part run out before -- rounding -- the rest is sorted and the walk goes on.)
    const double need = params.top_p * total;
    double acc = 0;
    std::size_t n = 0;
    while (n < kept) {
      if (n == sorted) {
        std::sort(candidates_.begin() + static_cast<std::ptrdiff_t>(sorted),
                  candidates_.begin() + static_cast<std::ptrdiff_t>(kept), order);
        weights_.resize(kept);
        for (std::size_t i = sorted; i < kept; ++i) weights_[i] = weight(candidates_[i]);
        sorted = kept;
      }
      acc += weights_[n++];
      if (acc >= need) break;
    }
    kept = n;
    total = acc;
  }
  const double target = u * total;
  double acc = 0;
  for (std::size_t i = 0; i < kept; ++i) {
    acc += weights_[i];
    if (acc > target) return candidates_[i].token;
  }
  // Rounding: the last candidate with any weight.
  for (std::size_t i = kept; i-- > 0;) {
    if (weights_[i] > 0) return candidates_[i].token;
  }
  return candidates_[0].token;
}

SampledToken Sampler::sample(std::span<const float> logits, const SamplingParams& params, std::uint64_t seed,
                             std::int64_t output_index) {
  SampledToken out;
  if (logits.empty()) throw Error("sampler: empty logits row");
  out.token = params.greedy() ? argmax(logits)
                              : sample_random(logits, params, uniform_draw(seed, static_cast<std::uint64_t>(output_index)));
  if (params.logprobs) {
    std::vector<double> lp;
    log_softmax(logits, lp);
    out.logprob = static_cast<float>(lp[static_cast<std::size_t>(out.token)]);
    const auto k = static_cast<std::size_t>(std::min<std::int64_t>(*params.logprobs, static_cast<std::int64_t>(logits.size())));
    if (k > 0) {
      candidates_.resize(logits.size());
      for (std::size_t i = 0; i < logits.size(); ++i) candidates_[i] = {static_cast<std::int32_t>(i), clean(logits[i])};
      std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<std::ptrdiff_t>(k), candidates_.end(),
                        [](const Candidate& a, const Candidate& b) { return better(a, b); });
      out.top_logprobs.reserve(k);
      for (std::size_t i = 0; i < k; ++i) {
        out.top_logprobs.push_back({candidates_[i].token, static_cast<float>(lp[static_cast<std::size_t>(candidates_[i].token)])});
      }
    }
  }
  return out;
}

}  // namespace dsv4
