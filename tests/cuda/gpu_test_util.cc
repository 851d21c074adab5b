#include "gpu_test_util.h"

#include <fmt/format.h>

#include <cstdio>
#include <mutex>
#include <thread>

#include "cpu/cache_codec.h"
#include "numerics/block_quant.h"
#include "numerics/fp8_e4m3.h"
#include "numerics/ue8m0.h"

namespace dsv4::gputest {

gpu::Stream& stream() {
  static gpu::Stream s;
  return s;
}

ThreadPool* cpu_pool() {
  static ThreadPool pool(static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1u, 16u)));
  return &pool;
}

// ---- random inputs -------------------------------------------------------------------------------
std::uint64_t seed_of(std::initializer_list<std::int64_t> parts) {
  std::uint64_t h = 0x243f6a8885a308d3ull;
  for (std::int64_t p : parts) {
    h ^= static_cast<std::uint64_t>(p) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ull;
  }
  return h;
}

std::vector<float> normal(std::size_t n, float sigma, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<float> uniform(std::size_t n, float lo, float hi, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<float> bf16_activations(std::size_t n, float sigma, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) {
    x = d(rng);
    if (u(rng) < 0.003f) x *= 8.0f + 32.0f * u(rng);  // outliers, as real activations have
    if (x == 0.0f) x = sigma * 1e-3f;
    x = round_to_bf16(x);
    if (x == 0.0f) x = round_to_bf16(sigma * 1e-3f);
  }
  return v;
}

void round_all_bf16(std::vector<float>& v) {
  for (float& x : v) x = round_to_bf16(x);
}

std::vector<std::uint16_t> to_bf16(std::span<const float> v) {
  std::vector<std::uint16_t> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16_bits(v[i]);
  return out;
}

std::vector<float> from_bf16(std::span<const std::uint16_t> v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = bf16_bits_to_f32(v[i]);
  return out;
}

// ---- comparisons ---------------------------------------------------------------------------------
void ErrStats::add(float got, float ref) {
  ++n;
  if (std::memcmp(&got, &ref, sizeof got) != 0) ++differing;
  if (!std::isfinite(got) && std::isfinite(ref)) {
    ++nonfinite;
    return;
  }
  if (!std::isfinite(ref)) return;
  const double d = static_cast<double>(got) - static_cast<double>(ref);
  max_abs = std::max(max_abs, std::fabs(d));
  diff2 += d * d;
  ref2 += static_cast<double>(ref) * ref;
}

void ErrStats::merge(const ErrStats& o) {
  n += o.n;
  nonfinite += o.nonfinite;
  differing += o.differing;
  max_abs = std::max(max_abs, o.max_abs);
  diff2 += o.diff2;
  ref2 += o.ref2;
}

ErrStats compare(std::span<const float> got, std::span<const float> ref) {
  ErrStats s;
  EXPECT_EQ(got.size(), ref.size());
  const std::size_t n = std::min(got.size(), ref.size());
  for (std::size_t i = 0; i < n; ++i) s.add(got[i], ref[i]);
  return s;
}

float bf16_ulp(float x) {
  const float a = std::fabs(x);
  if (!(a >= 0x1p-126f)) return 0x1p-133f;
  return std::ldexp(1.0f, std::ilogb(a) - 7);
}

// ---- cache entries -------------------------------------------------------------------------------
namespace {

std::int64_t count_differing(const std::uint8_t* a, const std::uint8_t* b, std::int64_t n) {
  std::int64_t d = 0;
  for (std::int64_t i = 0; i < n; ++i) d += a[i] != b[i];
  return d;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void hard(EntryDiff& diff, const std::string& where, std::int64_t i, float got, float ref) {
  ++diff.hard;
  if (diff.first_hard.empty()) diff.first_hard = fmt::format("{} value {}: got {} expected {}", where, i, got, ref);
}

// Value rule for an FP8-simulated value (e4m3 steps are at most 1/8 of the value in the normal range).
bool fp8_value_step(float g, float r) {
  if (!std::isfinite(g) || g == r) return std::isfinite(g);
  if ((g < 0) != (r < 0) && g != 0 && r != 0) return false;
  const float a = std::max(std::fabs(g), std::fabs(r));
  return std::fabs(g - r) <= 0.125f * a;
}

// Value rule for an FP4-simulated value of a block whose largest reference magnitude is `block_max`:
// grid {0, .5, 1, 1.5, 2, 3, 4, 6} x s with block_max >= 3s, so neighbours differ by at most half
// the larger value, and 0 neighbours 0.5 s <= block_max / 6.
bool fp4_value_step(float g, float r, float block_max) {
  if (!std::isfinite(g)) return false;
  if (g == 0.0f || r == 0.0f) return std::fabs(g - r) <= block_max / 6.0f * 1.0001f;
  if ((g < 0) != (r < 0)) return false;
  return std::fabs(g - r) <= 0.5f * std::max(std::fabs(g), std::fabs(r)) * 1.0001f;
}

}  // namespace

std::string EntryDiff::summary() const {
  std::string s = fmt::format("{}/{} B", bytes_differing, bytes);
  if (fp8_steps > 0) s += fmt::format(" fp8-step {}", fp8_steps);
  if (fp4_steps > 0) s += fmt::format(" fp4-step {}", fp4_steps);
  if (bf16_ulps > 0) s += fmt::format(" bf16-ulp {}", bf16_ulps);
  if (hard > 0) s += fmt::format(" HARD {}", hard);
  return s;
}

void EntryDiff::merge(const EntryDiff& o) {
  entries += o.entries;
  bytes += o.bytes;
  bytes_differing += o.bytes_differing;
  fp8_steps += o.fp8_steps;
  fp4_steps += o.fp4_steps;
  bf16_ulps += o.bf16_ulps;
  hard += o.hard;
  if (first_hard.empty()) first_hard = o.first_hard;
}

void compare_main_kv_entry(const std::uint8_t* got_data, const std::uint8_t* got_scales, const std::uint8_t* ref_data,
                           const std::uint8_t* ref_scales, KvCacheDtype dtype, EntryDiff& diff, const std::string& where) {
  constexpr std::int64_t kDim = 512, kRope = 64, kNope = kDim - kRope;
  const bool fp8 = dtype == KvCacheDtype::kFp8;
  const std::int64_t data_bytes = fp8 ? kNope + 2 * kRope : 2 * kDim, scale_bytes = fp8 ? 8 : 0;
  ++diff.entries;
  diff.bytes += data_bytes + scale_bytes;
  const std::int64_t differing = count_differing(got_data, ref_data, data_bytes) +
                                 (fp8 ? count_differing(got_scales, ref_scales, scale_bytes) : 0);
  diff.bytes_differing += differing;
  if (differing == 0) return;
  if (fp8 && got_scales[7] != ref_scales[7]) hard(diff, where + " (pad scale byte)", 7, got_scales[7], ref_scales[7]);
  std::vector<float> g(kDim), r(kDim);
  decode_main_kv(got_data, got_scales, kRope, dtype, g);
  decode_main_kv(ref_data, ref_scales, kRope, dtype, r);
  for (std::int64_t i = 0; i < kDim; ++i) {
    const float gv = g[static_cast<std::size_t>(i)], rv = r[static_cast<std::size_t>(i)];
    if (same_bits(gv, rv)) continue;
    if (i >= kNope) {
      if (std::isfinite(gv) && std::fabs(gv - rv) <= bf16_ulp(std::max(std::fabs(gv), std::fabs(rv))))
        ++diff.bf16_ulps;
      else
        hard(diff, where, i, gv, rv);
      continue;
    }
    bool step = false;
    if (fp8 && got_scales[i / 64] == ref_scales[i / 64]) {
      const int cg = got_data[i], cr = ref_data[i];
      const int mg = cg & 0x7f, mr = cr & 0x7f;
      step = mg != 0x7f && std::abs(mg - mr) == 1 && ((cg & 0x80) == (cr & 0x80) || mg == 0 || mr == 0);
    } else {
      step = fp8_value_step(gv, rv);
    }
    if (step)
      ++diff.fp8_steps;
    else
      hard(diff, where, i, gv, rv);
  }
}

void compare_indexer_entry(const std::uint8_t* got_data, const std::uint8_t* got_scales, const std::uint8_t* ref_data,
                           const std::uint8_t* ref_scales, IndexerCacheDtype dtype, EntryDiff& diff,
                           const std::string& where) {
  constexpr std::int64_t kDim = 128;
  const std::int64_t data_bytes = dtype == IndexerCacheDtype::kFp4 ? 64 : dtype == IndexerCacheDtype::kFp8 ? 128 : 256;
  const std::int64_t scale_bytes = dtype == IndexerCacheDtype::kBf16 ? 0 : 4;
  ++diff.entries;
  diff.bytes += data_bytes + scale_bytes;
  const std::int64_t differing =
      count_differing(got_data, ref_data, data_bytes) + count_differing(got_scales, ref_scales, scale_bytes);
  diff.bytes_differing += differing;
  if (differing == 0) return;
  std::vector<float> g(kDim), r(kDim);
  decode_indexer_key(got_data, got_scales, dtype, g);
  decode_indexer_key(ref_data, ref_scales, dtype, r);
  for (std::int64_t i = 0; i < kDim; ++i) {
    const float gv = g[static_cast<std::size_t>(i)], rv = r[static_cast<std::size_t>(i)];
    if (same_bits(gv, rv)) continue;
    bool step = false;
    if (dtype == IndexerCacheDtype::kFp4 && got_scales[i / 32] == ref_scales[i / 32]) {
      const int cg = (got_data[i / 2] >> (4 * (i % 2))) & 0xf, cr = (ref_data[i / 2] >> (4 * (i % 2))) & 0xf;
      const int mg = cg & 7, mr = cr & 7;
      step = std::abs(mg - mr) == 1 && ((cg & 8) == (cr & 8) || mg == 0 || mr == 0);
    } else {
      float block_max = 0.0f;
      for (std::int64_t j = i / 32 * 32; j < i / 32 * 32 + 32; ++j) block_max = std::max(block_max, std::fabs(r[static_cast<std::size_t>(j)]));
      step = fp4_value_step(gv, rv, block_max);
    }
    if (step)
      ++diff.fp4_steps;
    else
      hard(diff, where, i, gv, rv);
  }
}

void compare_raw_entry(const std::uint8_t* got, const std::uint8_t* ref, std::int64_t bytes, EntryDiff& diff,
                       const std::string& where) {
  ++diff.entries;
  diff.bytes += bytes;
  const std::int64_t d = count_differing(got, ref, bytes);
  diff.bytes_differing += d;
  if (d == 0) return;
  for (std::int64_t i = 0; i < bytes; ++i) {
    if (got[i] != ref[i]) {
      ++diff.hard;
      if (diff.first_hard.empty()) diff.first_hard = fmt::format("{} byte {}: got {} expected {}", where, i, got[i], ref[i]);
    }
  }
}

void expect_entries_ok(const EntryDiff& d, const std::string& what, double max_step_fraction) {
  EXPECT_EQ(d.hard, 0) << what << ": " << d.first_hard;
  EXPECT_LE(static_cast<double>(d.steps()), std::max(2.0, max_step_fraction * static_cast<double>(d.bytes)))
      << what << ": too many one-step differences: " << d.summary();
  EXPECT_GT(d.entries, 0) << what << ": no entries compared";
}

// ---- weights -----------------------------------------------------------------------------------
DenseWeight TestWeight::dense(const std::string& name) const {
  const WeightKind kind = format == gpu::WeightFormat::kFp8   ? WeightKind::kFp8
                          : format == gpu::WeightFormat::kFp4 ? WeightKind::kFp4
                                                              : WeightKind::kBf16;
  return make_dense_weight(name, n, k, kind, values);
}

TestWeight make_weight(gpu::WeightFormat format, std::int64_t n, std::int64_t k, float sigma, std::mt19937_64& rng) {
  TestWeight t;
  t.format = format;
  t.n = n;
  t.k = k;
  std::vector<float> w = normal(static_cast<std::size_t>(n * k), sigma, rng);
  const auto un = static_cast<std::size_t>(n), uk = static_cast<std::size_t>(k);
  t.values.resize(un * uk);
  if (format == gpu::WeightFormat::kFp8) {
    const std::size_t sb = ((un + 127) / 128) * ((uk + 127) / 128);
    t.data.resize(un * uk);
    t.scales_u8.resize(sb);
    quantize_weight_fp8_128x128(w.data(), un, uk, t.data.data(), t.scales_u8.data());
    dequantize_weight_fp8_128x128(t.data.data(), t.scales_u8.data(), un, uk, t.values.data());
    for (std::uint8_t e : t.scales_u8) t.scales_f32.push_back(ue8m0_to_f32(e));
  } else if (format == gpu::WeightFormat::kFp4) {
    t.data.resize(un * uk / 2);
    t.scales_u8.resize(un * uk / 32);
    quantize_weight_fp4_1x32(w.data(), un, uk, t.data.data(), t.scales_u8.data());
    dequantize_weight_fp4_1x32(t.data.data(), t.scales_u8.data(), un, uk, t.values.data());
  } else {
    t.data.resize(un * uk * 2);
    for (std::size_t i = 0; i < w.size(); ++i) {
      const std::uint16_t b = f32_to_bf16_bits(w[i]);
      std::memcpy(t.data.data() + 2 * i, &b, 2);
      t.values[i] = bf16_bits_to_f32(b);
    }
  }
  return t;
}

DevWeight upload_weight(const TestWeight& t) { return upload_experts({&t}); }

DevWeight upload_experts(const std::vector<const TestWeight*>& experts) {
  const TestWeight& f = *experts.front();
  std::vector<std::uint8_t> data, s8;
  std::vector<float> sf;
  for (const TestWeight* e : experts) {
    if (e->format != f.format || e->n != f.n || e->k != f.k) throw std::logic_error("upload_experts: shapes differ");
    data.insert(data.end(), e->data.begin(), e->data.end());
    s8.insert(s8.end(), e->scales_u8.begin(), e->scales_u8.end());
    sf.insert(sf.end(), e->scales_f32.begin(), e->scales_f32.end());
  }
  DevWeight d{DevArray<std::uint8_t>(data), DevArray<float>(sf), DevArray<std::uint8_t>(s8), {}};
  d.w.format = f.format;
  d.w.n = f.n;
  d.w.k = f.k;
  d.w.data = d.data.get();
  d.w.scale = f.format == gpu::WeightFormat::kFp8   ? static_cast<const void*>(d.scales_f32.get())
              : f.format == gpu::WeightFormat::kFp4 ? static_cast<const void*>(d.scales_u8.get())
                                                    : nullptr;
  d.w.expert_stride = static_cast<std::int64_t>(f.data.size());
  d.w.scale_stride = static_cast<std::int64_t>(f.format == gpu::WeightFormat::kFp8 ? f.scales_f32.size() : f.scales_u8.size());
  // fp4 products read the GPU layout, as the executor's weights are stored (gemm.h).
  if (f.format == gpu::WeightFormat::kFp4) {
    gpu::fp4_to_gpu_layout(d.data.get(), d.scales_u8.get(), static_cast<std::int64_t>(experts.size()), f.n, f.k, st());
    d.w.fp4_scales_normal = gpu::fp4_scales_normal(d.scales_u8.get(), static_cast<std::int64_t>(s8.size()), stream());
  }
  return d;
}

// ---- the summary table ---------------------------------------------------------------------------
namespace {
std::mutex g_rows_mutex;
std::vector<std::string>& rows() {
  static std::vector<std::string> r;
  return r;
}
}  // namespace

void report_line(const std::string& op, const std::string& shape, const std::string& max_abs, const std::string& rel,
                 const std::string& bytes, const std::string& note) {
  const std::string line = fmt::format("| {:<26} | {:<44} | {:>9} | {:>9} | {:<22} | {} |", op, shape, max_abs, rel, bytes, note);
  std::printf("[gpu-ops] %s\n", line.c_str());
  std::fflush(stdout);
  std::lock_guard lock(g_rows_mutex);
  rows().push_back(line);
}

void report(const std::string& op, const std::string& shape, const ErrStats& s, const std::string& bytes,
            const std::string& note) {
  std::string n = note;
  if (s.nonfinite > 0) n += fmt::format("{}NONFINITE {}", n.empty() ? "" : "; ", s.nonfinite);
  report_line(op, shape, fmt::format("{:.3g}", s.max_abs), fmt::format("{:.3g}", s.rel_l2()), bytes, n);
}

void Sweep::add(const std::string& op, const std::string& shape, const ErrStats& s, const std::string& note) {
  for (Entry& e : entries_) {
    if (e.op == op && e.shape == shape) {
      e.stats.merge(s);
      return;
    }
  }
  entries_.push_back({op, shape, note, s});
}

void Sweep::flush(const std::string& sweep) {
  for (const Entry& e : entries_)
    report(e.op, e.shape + " " + sweep, e.stats, fmt::format("{}/{} differ", e.stats.differing, e.stats.n), e.note);
  entries_.clear();
}

void print_summary_table() {
  std::lock_guard lock(g_rows_mutex);
  if (rows().empty()) return;
  std::printf("\n[gpu-ops] summary (%s)\n", sim() ? "SIMT simulator" : "GPU");
  std::printf("%s\n", fmt::format("| {:<26} | {:<44} | {:>9} | {:>9} | {:<22} | {} |", "op", "shape", "max abs", "rel L2",
                                  "bytes differing", "note")
                          .c_str());
  std::printf("|%s|%s|%s|%s|%s|---|\n", std::string(28, '-').c_str(), std::string(46, '-').c_str(),
              std::string(11, '-').c_str(), std::string(11, '-').c_str(), std::string(24, '-').c_str());
  for (const std::string& r : rows()) std::printf("%s\n", r.c_str());
  std::fflush(stdout);
}

namespace {
class SummaryEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { print_summary_table(); }
};
const auto* const g_env = ::testing::AddGlobalTestEnvironment(new SummaryEnvironment);
}  // namespace

}  // namespace dsv4::gputest
