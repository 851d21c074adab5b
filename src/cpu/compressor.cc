#include "cpu/compressor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "cpu/linear.h"
#include "cpu/rms_norm.h"
#include "cpu/rope_bf16.h"
#include "numerics/bf16.h"
#include "numerics/block_quant.h"
#include "numerics/hadamard.h"
#include "numerics/exp_float.h"

namespace dsv4 {
namespace {

void check_params(const CompressorParams& p, const char* who) {
  if ((p.ratio != 4 && p.ratio != 128) || p.head_dim <= 0 || p.rope_dim <= 0 || p.rope_dim > p.head_dim) {
    throw std::invalid_argument(
        fmt::format("{}: bad params ratio {} head_dim {} rope_dim {}", who, p.ratio, p.head_dim, p.rope_dim));
  }
}

void expect(bool ok, const char* who, const char* what, std::size_t got, std::int64_t want) {
  if (!ok) throw std::invalid_argument(fmt::format("{}: {} has {} values, expected {}", who, what, got, want));
}

}  // namespace

void compressor_project(std::span<const float> x, std::int64_t rows, std::span<const std::int64_t> positions,
                        const DenseWeight& wkv, const DenseWeight& wgate, std::span<const float> ape,
                        const CompressorParams& p, std::span<float> slots, ThreadPool* pool) {
  const char* who = "compressor_project";
  check_params(p, who);
  const std::int64_t pd = p.proj_dim();
  if (wkv.out != pd || wgate.out != pd || wkv.in != wgate.in) {
    throw std::invalid_argument(fmt::format("{}: wkv '{}' [{}, {}] and wgate '{}' [{}, {}] must both be [{}, D]", who,
                                            wkv.name, wkv.out, wkv.in, wgate.name, wgate.out, wgate.in, pd));
  }
  expect(static_cast<std::int64_t>(positions.size()) == rows, who, "positions", positions.size(), rows);
  expect(static_cast<std::int64_t>(ape.size()) == p.ratio * pd, who, "ape", ape.size(), p.ratio * pd);
  expect(static_cast<std::int64_t>(slots.size()) == rows * 2 * pd, who, "slots", slots.size(), rows * 2 * pd);
  std::vector<float> a(static_cast<std::size_t>(rows * pd)), g(static_cast<std::size_t>(rows * pd));
  linear_f32(x, rows, wkv, a, pool);
  linear_f32(x, rows, wgate, g, pool);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t t = positions[static_cast<std::size_t>(r)];
    if (t < 0) throw std::invalid_argument(fmt::format("{}: negative position {}", who, t));
    const float* ape_row = ape.data() + (t % p.ratio) * pd;
    float* slot = slots.data() + r * 2 * pd;
    for (std::int64_t c = 0; c < pd; ++c) {
      slot[c] = a[static_cast<std::size_t>(r * pd + c)];
      slot[pd + c] = g[static_cast<std::size_t>(r * pd + c)] + ape_row[c];
    }
  }
}

std::int64_t compressor_slot(std::int64_t position, const CompressorParams& p) {
  check_params(p, "compressor_slot");
  return p.ratio == 4 ? 4 + position % 4 : position % p.ratio;
}

bool compressor_block_complete(std::int64_t position, const CompressorParams& p) {
  check_params(p, "compressor_block_complete");
  return (position + 1) % p.ratio == 0;
}

void compressor_shift(std::span<float> ring, const CompressorParams& p) {
  check_params(p, "compressor_shift");
  expect(static_cast<std::int64_t>(ring.size()) == p.ring_floats(), "compressor_shift", "ring", ring.size(),
         p.ring_floats());
  if (p.ratio != 4) return;
  const auto half = static_cast<std::size_t>(4 * p.slot_floats());
  std::copy(ring.begin() + static_cast<std::ptrdiff_t>(half), ring.end(), ring.begin());
}

void compressor_pool(std::span<const float> ring, bool has_previous, const CompressorParams& p,
                     std::span<float> entry) {
  const char* who = "compressor_pool";
  check_params(p, who);
  expect(static_cast<std::int64_t>(ring.size()) == p.ring_floats(), who, "ring", ring.size(), p.ring_floats());
  expect(static_cast<std::int64_t>(entry.size()) == p.head_dim, who, "entry", entry.size(), p.head_dim);
  const std::int64_t hd = p.head_dim, pd = p.proj_dim(), sf = p.slot_floats();
  // The (value, score) offsets of the slots entry j pools, in the reference's order.
  struct Source {
    std::int64_t value;  // offset of a[c = 0] in the ring
    std::int64_t score;  // offset of g[c = 0]
  };
  std::vector<Source> src;
  if (p.ratio == 4) {
    if (has_previous) {
      for (std::int64_t s = 0; s < 4; ++s) src.push_back({s * sf, s * sf + pd});  // first halves
    }
    for (std::int64_t s = 4; s < 8; ++s) src.push_back({s * sf + hd, s * sf + pd + hd});  // second halves
  } else {
    for (std::int64_t s = 0; s < p.ratio; ++s) src.push_back({s * sf, s * sf + pd});
  }
  std::vector<float> w(src.size());
  for (std::int64_t c = 0; c < hd; ++c) {
    float mx = -INFINITY;
    for (const Source& s : src) mx = std::max(mx, ring[static_cast<std::size_t>(s.score + c)]);
    float sum = 0.0f;
    for (std::size_t i = 0; i < src.size(); ++i) {
      w[i] = exp_float(ring[static_cast<std::size_t>(src[i].score + c)] - mx);
      sum += w[i];
    }
    float acc = 0.0f;
    for (std::size_t i = 0; i < src.size(); ++i) acc += ring[static_cast<std::size_t>(src[i].value + c)] * (w[i] / sum);
    entry[static_cast<std::size_t>(c)] = acc;
  }
}

void fp8_simulate_kv_nope(std::span<float> kv, std::int64_t rope_dim) {
  const auto n = static_cast<std::int64_t>(kv.size());
  if (rope_dim < 0 || rope_dim > n || (n - rope_dim) % kKvFp8Block != 0) {
    throw std::invalid_argument(fmt::format("fp8_simulate_kv_nope: {} dims minus {} rope dims is not a multiple of {}",
                                            n, rope_dim, kKvFp8Block));
  }
  simulate_quant_blocks(kv.first(static_cast<std::size_t>(n - rope_dim)), kKvFp8Block, QuantFormat::kFp8E4m3);
}

void compressor_finish(std::span<float> entry, std::span<const float> norm_weight, const RopeTable& rope,
                       std::int64_t block_index, const CompressorParams& p, bool simulate_quant) {
  const char* who = "compressor_finish";
  check_params(p, who);
  expect(static_cast<std::int64_t>(entry.size()) == p.head_dim, who, "entry", entry.size(), p.head_dim);
  expect(static_cast<std::int64_t>(norm_weight.size()) == p.head_dim, who, "norm weight", norm_weight.size(),
         p.head_dim);
  if (rope.rope_dim() != p.rope_dim) {
    throw std::invalid_argument(
        fmt::format("{}: rope table of {} dims for rope_dim {}", who, rope.rope_dim(), p.rope_dim));
  }
  if (block_index < 0) throw std::invalid_argument(fmt::format("{}: negative block index {}", who, block_index));
  for (float& v : entry) v = round_to_bf16(v);
  rms_norm(entry, 1, norm_weight, p.norm_eps, entry);
  rope_heads_bf16(entry, p.head_dim, rope, block_index * p.ratio);
  if (p.kind == CompressorKind::kAttention) {
    if (simulate_quant) fp8_simulate_kv_nope(entry, p.rope_dim);
  } else {
    hadamard_transform(entry);
    for (float& v : entry) v = round_to_bf16(v);
    if (simulate_quant) simulate_quant_blocks(entry, kIndexerFp4Block, QuantFormat::kFp4E2m1);
  }
}

void compressor_entry(std::span<const float> ring, std::int64_t block_index, std::span<const float> norm_weight,
                      const RopeTable& rope, const CompressorParams& p, std::span<float> entry,
                      bool simulate_quant) {
  compressor_pool(ring, block_index > 0, p, entry);
  compressor_finish(entry, norm_weight, rope, block_index, p, simulate_quant);
}

}  // namespace dsv4
