// Sampler: greedy ties, temperature distribution, top-k / top-p support, determinism, logprobs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "common/error.h"
#include "engine/sampling.h"

namespace dsv4 {
namespace {

std::vector<float> log_probs(const std::vector<double>& p) {
  std::vector<float> out;
  for (double x : p) out.push_back(static_cast<float>(std::log(x)));
  return out;
}

// Draw `n` tokens with seeds 0..n-1 at output index 3.
std::map<std::int32_t, int> histogram(const std::vector<float>& logits, const SamplingParams& params, int n) {
  Sampler sampler;
  std::map<std::int32_t, int> counts;
  for (int s = 0; s < n; ++s) ++counts[sampler.sample(logits, params, static_cast<std::uint64_t>(s), 3).token];
  return counts;
}

SamplingParams with_temperature(double t) {
  SamplingParams p;
  p.temperature = t;
  return p;
}

TEST(Sampling, GreedyTakesArgmaxAndBreaksTiesByLowerId) {
  Sampler sampler;
  SamplingParams greedy = with_temperature(0);
  EXPECT_EQ(sampler.sample(std::vector<float>{1, 3, 3, 2}, greedy, 1, 0).token, 1);
  EXPECT_EQ(sampler.sample(std::vector<float>{0, 0, 0, 0}, greedy, 1, 0).token, 0);
  EXPECT_EQ(sampler.sample(std::vector<float>{-5, -1, 7, 7.5f}, greedy, 1, 0).token, 3);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(sampler.sample(std::vector<float>{nan, 2, nan, 1}, greedy, 1, 0).token, 1);
  // Greedy ignores the seed and the index.
  const std::vector<float> logits = {0.5f, 2.0f, 1.9f, 2.0f, -1};
  for (std::uint64_t seed = 0; seed < 20; ++seed) EXPECT_EQ(sampler.sample(logits, greedy, seed, static_cast<std::int64_t>(seed)).token, 1);
  EXPECT_EQ(Sampler::argmax(logits), 1);
}

TEST(Sampling, TemperatureFollowsTheSoftmax) {
  const std::vector<double> p = {0.30, 0.20, 0.15, 0.12, 0.10, 0.07, 0.04, 0.02};
  const std::vector<float> logits = log_probs(p);
  for (double t : {1.0, 0.6, 1.7}) {
    // Expected: softmax(log p / t) = p^(1/t) / sum.
    std::vector<double> q;
    double sum = 0;
    for (double x : p) sum += std::pow(x, 1 / t);
    for (double x : p) q.push_back(std::pow(x, 1 / t) / sum);
    const int n = 20000;
    const auto counts = histogram(logits, with_temperature(t), n);
    double chi2 = 0;
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double expected = q[i] * n;
      const double got = counts.count(static_cast<std::int32_t>(i)) ? counts.at(static_cast<std::int32_t>(i)) : 0;
      chi2 += (got - expected) * (got - expected) / expected;
    }
    EXPECT_LT(chi2, 24.3) << "temperature " << t;  // chi-square, 7 degrees of freedom, p = 0.001
  }
}

TEST(Sampling, SameSeedAndIndexGiveTheSameToken) {
  std::vector<float> logits(50);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(std::sin(static_cast<double>(i)));
  SamplingParams params = with_temperature(1.0);
  params.top_p = 0.9;
  Sampler a, b;
  std::set<std::int32_t> by_index, by_seed;
  for (int i = 0; i < 40; ++i) {
    const std::int32_t x = a.sample(logits, params, 1234, i).token;
    b.sample(logits, params, 99, i);  // unrelated use of another sampler in between
    EXPECT_EQ(x, a.sample(logits, params, 1234, i).token);
    EXPECT_EQ(x, b.sample(logits, params, 1234, i).token);
    by_index.insert(x);
    by_seed.insert(a.sample(logits, params, static_cast<std::uint64_t>(i), 0).token);
  }
  EXPECT_GT(by_index.size(), 5u);  // the index matters
  EXPECT_GT(by_seed.size(), 5u);   // the seed matters
  EXPECT_NE(uniform_draw(1, 2), uniform_draw(2, 1));
}

TEST(Sampling, UniformDrawsAreUniform) {
  double sum = 0;
  int low = 0;
  for (std::uint64_t i = 0; i < 100000; ++i) {
    const double u = uniform_draw(42, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    low += u < 0.1;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.005);
  EXPECT_NEAR(low / 100000.0, 0.1, 0.005);
}

TEST(Sampling, TopKRestrictsTheSupportExactly) {
  std::vector<float> logits(100);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(std::cos(static_cast<double>(i) * 1.7) * 2);
  std::vector<std::int32_t> ids(100);
  for (std::int32_t i = 0; i < 100; ++i) ids[static_cast<std::size_t>(i)] = i;
  std::sort(ids.begin(), ids.end(), [&](auto a, auto b) { return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)]; });
  const std::set<std::int32_t> top5(ids.begin(), ids.begin() + 5);
  SamplingParams params = with_temperature(2.0);
  params.top_k = 5;
  const auto counts = histogram(logits, params, 5000);
  std::set<std::int32_t> seen;
  for (const auto& [token, n] : counts) seen.insert(token);
  EXPECT_EQ(seen, top5);

  // Ties at the boundary go to the lower ids.
  params.top_k = 2;
  const auto tied = histogram({5, 5, 5, 1}, params, 2000);
  EXPECT_EQ(tied.size(), 2u);
  EXPECT_TRUE(tied.count(0) && tied.count(1));
}

TEST(Sampling, TopPKeepsTheSmallestNucleus) {
  const std::vector<float> logits = log_probs({0.05, 0.5, 0.15, 0.3});  // sorted: 1 (0.5), 3 (0.3), 2 (0.15), 0 (0.05)
  SamplingParams params = with_temperature(1.0);
  params.top_p = 0.75;  // 0.5 + 0.3 reaches it
  auto counts = histogram(logits, params, 8000);
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_TRUE(counts.count(1) && counts.count(3));
  EXPECT_NEAR(counts[1] / 8000.0, 0.5 / 0.8, 0.03);  // renormalised over the nucleus

  params.top_p = 0.85;  // needs the third
  counts = histogram(logits, params, 8000);
  EXPECT_EQ(counts.size(), 3u);
  EXPECT_FALSE(counts.count(0));

  params.top_p = 0.3;  // the top token alone
  counts = histogram(logits, params, 500);
  EXPECT_EQ(counts.size(), 1u);
  EXPECT_TRUE(counts.count(1));

  // top-k first, then top-p over the renormalised top-k: top-2 = {1: 0.625, 3: 0.375}.
  params.top_k = 2;
  params.top_p = 0.6;
  counts = histogram(logits, params, 500);
  EXPECT_EQ(counts.size(), 1u);
  params.top_p = 0.7;
  counts = histogram(logits, params, 2000);
  EXPECT_EQ(counts.size(), 2u);
}

// The nucleus by brute force, as sampling.h defines it: every token sorted by logit then id, the
// mass of the whole vocabulary summed in id order, the smallest sorted prefix reaching top_p,
// one draw walking it.
std::int32_t nucleus_reference(const std::vector<float>& logits, double temperature, double top_p, double u) {
  std::vector<std::int32_t> ids(logits.size());
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i);
  auto at = [&](std::int32_t id) { return logits[static_cast<std::size_t>(id)]; };
  std::sort(ids.begin(), ids.end(),
            [&](std::int32_t a, std::int32_t b) { return at(a) != at(b) ? at(a) > at(b) : a < b; });
  const double m = at(ids[0]), inv_t = 1.0 / temperature;
  auto weight = [&](std::int32_t id) { return std::exp((at(id) - m) * inv_t); };
  double total = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) total += weight(static_cast<std::int32_t>(i));
  double acc = 0;
  std::size_t kept = 0;
  while (kept < ids.size()) {
    acc += weight(ids[kept++]);
    if (acc >= top_p * total) break;
  }
  const double target = u * acc;
  double walked = 0;
  for (std::size_t i = 0; i < kept; ++i) {
    walked += weight(ids[i]);
    if (walked > target) return ids[i];
  }
  return ids[kept - 1];
}

// The sampler sorts only as much of the vocabulary as the nucleus needs (in growing chunks): it
// must pick what the full sort picks, for nuclei of a few tokens and of most of the vocabulary
// (peaked and flat rows, ties, a vocabulary of 20,000).
TEST(Sampling, TopPMatchesTheFullSort) {
  std::mt19937 rng(11);
  Sampler sampler;
  int compared = 0;
  for (const double spread : {0.05, 1.0, 8.0}) {
    std::vector<float> logits(20000);
    std::normal_distribution<float> normal(0.0f, static_cast<float>(spread));
    for (float& l : logits) l = normal(rng);
    for (std::size_t i = 0; i < logits.size(); i += 97) logits[i] = logits[0];  // ties
    for (const double top_p : {0.05, 0.5, 0.9, 0.999}) {
      SamplingParams params = with_temperature(0.7);
      params.top_p = top_p;
      for (std::uint64_t seed = 0; seed < 8; ++seed) {
        const std::int32_t got = sampler.sample(logits, params, seed, 5).token;
        EXPECT_EQ(got, nucleus_reference(logits, 0.7, top_p, uniform_draw(seed, 5)))
            << "spread " << spread << " top_p " << top_p << " seed " << seed;
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 96);
}

TEST(Sampling, LogprobsAreANormalisedDistribution) {
  std::vector<float> logits(1000);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(std::sin(static_cast<double>(i) * 0.37) * 6);
  std::vector<double> lp;
  Sampler::log_softmax(logits, lp);
  double sum = 0;
  for (double x : lp) sum += std::exp(x);
  EXPECT_NEAR(sum, 1.0, 1e-9);

  Sampler sampler;
  SamplingParams params = with_temperature(0.8);
  params.logprobs = 5;
  const SampledToken s = sampler.sample(logits, params, 7, 0);
  EXPECT_NEAR(s.logprob, lp[static_cast<std::size_t>(s.token)], 1e-6);
  ASSERT_EQ(s.top_logprobs.size(), 5u);
  EXPECT_EQ(s.top_logprobs[0].token, Sampler::argmax(logits));
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_NEAR(s.top_logprobs[i].logprob, lp[static_cast<std::size_t>(s.top_logprobs[i].token)], 1e-6);
    if (i > 0) {
      EXPECT_GE(s.top_logprobs[i - 1].logprob, s.top_logprobs[i].logprob);
    }
  }
  // Logprobs are of the raw model distribution: the same whatever the temperature.
  params.temperature = 0;
  const SampledToken g = sampler.sample(logits, params, 7, 0);
  EXPECT_NEAR(g.top_logprobs[0].logprob, s.top_logprobs[0].logprob, 1e-7);
  params.logprobs = 0;
  EXPECT_TRUE(sampler.sample(logits, params, 7, 0).top_logprobs.empty());
}

TEST(Sampling, ValidateRejectsOutOfRangeValues) {
  SamplingParams ok;
  EXPECT_NO_THROW(ok.validate(64));
  auto rejects = [](auto edit) {
    SamplingParams p;
    edit(p);
    EXPECT_THROW(p.validate(64), Error);
  };
  rejects([](SamplingParams& p) { p.temperature = -0.1; });
  rejects([](SamplingParams& p) { p.temperature = std::numeric_limits<double>::infinity(); });
  rejects([](SamplingParams& p) { p.top_p = 0; });
  rejects([](SamplingParams& p) { p.top_p = 1.5; });
  rejects([](SamplingParams& p) { p.top_k = -2; });
  rejects([](SamplingParams& p) { p.max_tokens = 0; });
  rejects([](SamplingParams& p) { p.stop_token_ids = {64}; });
  rejects([](SamplingParams& p) { p.logprobs = -1; });
}

}  // namespace
}  // namespace dsv4
