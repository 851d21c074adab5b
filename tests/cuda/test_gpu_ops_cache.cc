// GPU op tests of the kernels that read or write the paged KV cache (see test_gpu_ops.cc for the
// conventions): q / window-kv finish, compressor state and entries, the lightning indexer,
// sparse attention. Steps come from the real KV cache manager and finish_step_plan (several
// rows at positions around 0..9, 127..130, 255..257, pooling sources from the state cache of an
// earlier step); the CPU side writes its own copy of the pages with cpu/cache_codec.h and the
// device pages must hold the same bytes.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <set>

#include "cpu/cache_codec.h"
#include "cpu/compressor.h"
#include "cpu/indexer.h"
#include "cpu/rms_norm.h"
#include "cpu/rope_bf16.h"
#include "cpu/sink_attention.h"
#include "cuda/kernels/attention.h"
#include "cuda/kernels/compressor.h"
#include "cuda/kernels/indexer.h"
#include "cuda/kernels/qkv.h"
#include "gpu_step.h"
#include "gpu_test_util.h"
#include "model/presets.h"
#include "numerics/block_quant.h"
#include "numerics/hadamard.h"

namespace dsv4::gputest {
namespace {

constexpr std::int64_t kDim = 512, kRope = 64, kIdxDim = 128;

const char* kv_name(KvCacheDtype d) { return d == KvCacheDtype::kFp8 ? "fp8" : "bf16"; }
const char* idx_name(IndexerCacheDtype d) {
  return d == IndexerCacheDtype::kFp4 ? "fp4" : d == IndexerCacheDtype::kFp8 ? "fp8" : "bf16";
}
gpu::IndexerFormat gpu_format(IndexerCacheDtype d) {
  return d == IndexerCacheDtype::kFp4 ? gpu::IndexerFormat::kFp4 : d == IndexerCacheDtype::kFp8 ? gpu::IndexerFormat::kFp8 : gpu::IndexerFormat::kBf16;
}

std::vector<float> bf16_weights(std::size_t n, std::mt19937_64& rng) {
  std::vector<float> w = normal(n, 0.1f, rng);
  for (float& v : w) v = round_to_bf16(1.0f + v);
  return w;
}

std::string positions_of(const StepPlan& p) {
  std::string s;
  for (std::size_t r = 0; r < p.view.seqs.size(); ++r) {
    const std::int32_t a = p.view.positions[static_cast<std::size_t>(p.view.token_start[r])];
    const std::int32_t b = p.view.positions[static_cast<std::size_t>(p.view.token_start[r + 1] - 1)];
    s += fmt::format("{}{}", s.empty() ? "" : ",", a == b ? fmt::format("{}", a) : fmt::format("{}-{}", a, b));
  }
  return s;
}

// =================================================================================================
// finish_q_and_window_kv
// =================================================================================================
TEST(GpuOpsCache, FinishQAndWindowKv) {
  for (KvCacheDtype kv : {KvCacheDtype::kFp8, KvCacheDtype::kBf16}) {
    CacheHarness hz(kv, IndexerCacheDtype::kFp4);
    hz.add_sequence(1, 20);
    hz.add_sequence(2, 300);
    hz.add_sequence(3, 300);
    hz.skip(2, 125);
    hz.skip(3, 253);
    const StepPlan plan = hz.plan({{1, 10}, {2, 6}, {3, 5}});  // positions 0-9, 125-130, 253-257
    auto step = hz.pack(plan);
    const std::int64_t T = plan.num_tokens();
    const int wg = hz.group(CacheKind::kWindowKv);
    const std::vector<std::int64_t> heads_list = sim() ? std::vector<std::int64_t>{4, 64} : std::vector<std::int64_t>{4, 64, 128};
    for (std::int64_t layer : {std::int64_t{0}, std::int64_t{3}}) {
      const bool compressed = hz.config().compress_ratios[static_cast<std::size_t>(layer)] > 0;
      const RopeTable& rope = compressed ? hz.rope_compressed() : hz.rope_window();
      const std::int32_t lslot = hz.layer_slot(CacheKind::kWindowKv, layer);
      for (std::int64_t H : heads_list) {
        std::mt19937_64 rng(seed_of({20, static_cast<std::int64_t>(kv), layer, H}));
        std::vector<float> q = bf16_activations(static_cast<std::size_t>(T * H * kDim), 0.7f, rng);
        std::vector<float> kvv = bf16_activations(static_cast<std::size_t>(T * kDim), 1.0f, rng);
        const std::vector<float> kv_norm = bf16_weights(kDim, rng);
        DevArray<std::uint16_t> dq(to_bf16(q)), dkv(to_bf16(kvv));
        DevArray<float> dnorm(kv_norm);
        const auto before = hz.download_pools();
        gpu::QkvArgs a;
        a.step = step->get();
        a.capacity = static_cast<std::int32_t>(T + 3);
        a.compressed_rope = compressed;
        a.q = dq.get();
        a.heads = static_cast<std::int32_t>(H);
        a.kv = dkv.get();
        a.kv_norm = dnorm.get();
        a.eps = 1e-6f;
        a.window_group = wg;
        a.layer_slot = lslot;
        a.kv_fp8 = kv == KvCacheDtype::kFp8;
        gpu::finish_q_and_window_kv(a, st());
        const auto after = hz.download_pools();
        // CPU
        std::vector<float> ref_q = q, ref_kv = kvv;
        EntryDiff ed;
        std::vector<CacheHarness::Region> regions;
        for (std::int64_t t = 0; t < T; ++t) {
          const std::int64_t pos = plan.view.positions[static_cast<std::size_t>(t)];
          std::span<float> qt(ref_q.data() + t * H * kDim, static_cast<std::size_t>(H * kDim));
          head_rms_norm_bf16(qt, kDim, 1e-6f);
          rope.apply_heads(qt, kDim, pos);
          for (float& v : qt) v = round_to_bf16(v);
          std::span<float> kt(ref_kv.data() + t * kDim, kDim);
          rms_norm(kt, 1, kv_norm, 1e-6f, kt);
          rope.apply(kt.subspan(kDim - kRope), pos);
          for (float& v : kt) v = round_to_bf16(v);
          const std::int64_t slot = plan.view.groups[static_cast<std::size_t>(wg)].slot_mapping[static_cast<std::size_t>(t)];
          if (slot < 0) continue;
          std::uint8_t* hd = hz.host_entry(wg, slot, lslot, false);
          std::uint8_t* hs = hz.host_entry(wg, slot, lslot, true);
          encode_main_kv(kt, kRope, kv, hd, hs);
          const auto rd = hz.entry_region(wg, slot, lslot, false), rs = hz.entry_region(wg, slot, lslot, true);
          regions.push_back(rd);
          regions.push_back(rs);
          compare_main_kv_entry(after[static_cast<std::size_t>(rd.bucket)].data() + rd.offset, after[static_cast<std::size_t>(rs.bucket)].data() + rs.offset,
                                hd, hs, kv, ed, fmt::format("token {} position {}", t, pos));
        }
        const ErrStats sq = compare(from_bf16(dq.download()), ref_q);
        const ErrStats sk = compare(from_bf16(dkv.download()), ref_kv);
        const std::int64_t stray = CacheHarness::stray_bytes(before, after, regions);
        const std::string sh = fmt::format("{} layer {} heads {} T {} pos {}", kv_name(kv), layer, H, T, positions_of(plan));
        // Every sum in the CPU's blocked order, every operation rounded alone: bit-identical.
        EXPECT_EQ(sq.nonfinite + sk.nonfinite, 0) << sh;
        EXPECT_EQ(sq.differing, 0) << sh;
        EXPECT_EQ(sk.differing, 0) << sh;
        EXPECT_EQ(stray, 0) << sh << ": bytes written outside the step's window entries";
        expect_entries_ok(ed, "window kv " + sh);
        EXPECT_EQ(ed.bytes_differing, 0) << "window kv " << sh << ": " << ed.summary();
        report("finish_q (q)", sh, sq, fmt::format("{}/{} differ", sq.differing, sq.n), "exact: blocked head-norm sum");
        report("finish_q (kv)", sh, sk, ed.summary(), fmt::format("cache entries {}, stray bytes {}", ed.entries, stray));
      }
    }
  }
}

// =================================================================================================
// finish_compressor_state + write_compressed_entries
// =================================================================================================
struct CompressorCase {
  const char* name;
  std::int64_t layer;
  std::int32_t ratio;
  bool indexer;
};

TEST(GpuOpsCache, Compressor) {
  struct Dtypes {
    KvCacheDtype kv;
    IndexerCacheDtype idx;
  };
  const std::vector<CompressorCase> cases = {{"main c4", 3, 4, false}, {"indexer c4", 1, 4, true}, {"main c128", 2, 128, false}};
  for (const Dtypes dt : {Dtypes{KvCacheDtype::kFp8, IndexerCacheDtype::kFp4}, Dtypes{KvCacheDtype::kBf16, IndexerCacheDtype::kFp8},
                          Dtypes{KvCacheDtype::kFp8, IndexerCacheDtype::kBf16}}) {
    CacheHarness hz(dt.kv, dt.idx);
    hz.add_sequence(1, 600);
    hz.add_sequence(2, 50);
    // Persistent per-layer weights of each compressor.
    std::mt19937_64 wrng(seed_of({30, static_cast<std::int64_t>(dt.kv), static_cast<std::int64_t>(dt.idx)}));
    std::vector<std::vector<float>> apes, norms;
    for (const CompressorCase& c : cases) {
      const std::int64_t hd = c.indexer ? kIdxDim : kDim, pd = (c.ratio == 4 ? 2 : 1) * hd;
      apes.push_back(normal(static_cast<std::size_t>(c.ratio * pd), 0.5f, wrng));
      norms.push_back(bf16_weights(static_cast<std::size_t>(hd), wrng));
    }
    const std::vector<std::vector<StepSlice>> steps = {{{1, 130}, {2, 3}}, {{1, 128}, {2, 1}}, {{1, 2}, {2, 4}}};
    // Per compressor, over the steps: state rows, state cache, entries.
    struct Totals {
      ErrStats state_rows;
      EntryDiff state, entries;
      std::int64_t writes = 0, from_cache = 0, no_position = 0, stray = 0;
    };
    std::vector<Totals> totals(cases.size());
    std::string step_positions;
    for (std::size_t si = 0; si < steps.size(); ++si) {
      const StepPlan plan = hz.plan(steps[si]);
      auto step = hz.pack(plan);
      const std::int64_t T = plan.num_tokens();
      for (std::size_t ci = 0; ci < cases.size(); ++ci) {
        const CompressorCase& c = cases[ci];
        const std::int64_t hd = c.indexer ? kIdxDim : kDim, coff = c.ratio == 4 ? 2 : 1, pd = coff * hd, sf = 2 * pd;
        const CacheKind state_kind = c.indexer ? CacheKind::kIndexerState : c.ratio == 4 ? CacheKind::kCsaState : CacheKind::kHcaState;
        const CacheKind entry_kind = c.indexer ? CacheKind::kIndexerKv : c.ratio == 4 ? CacheKind::kCsaKv : CacheKind::kHcaKv;
        const int sg = hz.group(state_kind), eg = hz.group(entry_kind);
        const std::int32_t s_slot = hz.layer_slot(state_kind, c.layer), e_slot = hz.layer_slot(entry_kind, c.layer);
        const std::vector<float>& ape = apes[ci];
        const std::vector<float>& norm = norms[ci];
        std::mt19937_64 rng(seed_of({31, static_cast<std::int64_t>(si), static_cast<std::int64_t>(ci), static_cast<std::int64_t>(dt.kv), static_cast<std::int64_t>(dt.idx)}));
        // The wkv / wgate products: a_t then g_t (without ape), [T][2 pd].
        std::vector<float> state = normal(static_cast<std::size_t>(T * sf), 1.0f, rng);
        for (std::int64_t t = 0; t < T; ++t)
          for (std::int64_t i = pd; i < sf; ++i) state[static_cast<std::size_t>(t * sf + i)] *= 1.5f;
        DevArray<float> dstate(state), dape(ape), dnorm(norm);
        const auto before = hz.download_pools();
        gpu::CompressorArgs a;
        a.step = step->get();
        a.capacity = static_cast<std::int32_t>(T + 1);
        a.ratio = c.ratio;
        a.head_dim = static_cast<std::int32_t>(hd);
        a.state = dstate.get();
        a.ape = dape.get();
        a.state_group = sg;
        a.state_index = c.indexer ? 1 : 0;
        a.state_layer_slot = s_slot;
        a.norm = dnorm.get();
        a.eps = 1e-6f;
        a.entry_group = eg;
        a.entry_layer_slot = e_slot;
        a.target = c.indexer ? gpu::CompressorTarget::kIndexerKey : gpu::CompressorTarget::kMainKv;
        a.kv_fp8 = dt.kv == KvCacheDtype::kFp8;
        a.index_format = gpu_format(dt.idx);
        gpu::finish_compressor_state(a, st());
        gpu::write_compressed_entries(a, static_cast<std::int32_t>(T), st());
        const auto after = hz.download_pools();
        const std::vector<float> got_state = dstate.download();

        // CPU: compressor_project's sum (g + ape), the state cache writes, then each entry.
        std::vector<float> ref_state = state;
        for (std::int64_t t = 0; t < T; ++t) {
          const std::int64_t pos = plan.view.positions[static_cast<std::size_t>(t)];
          for (std::int64_t i = 0; i < pd; ++i)
            ref_state[static_cast<std::size_t>(t * sf + pd + i)] = state[static_cast<std::size_t>(t * sf + pd + i)] + ape[static_cast<std::size_t>((pos % c.ratio) * pd + i)];
        }
        EntryDiff state_diff, entry_diff;
        std::vector<CacheHarness::Region> regions;
        for (std::int64_t t = 0; t < T; ++t) {
          const std::int64_t slot = plan.view.groups[static_cast<std::size_t>(sg)].slot_mapping[static_cast<std::size_t>(t)];
          if (slot < 0) continue;
          std::uint8_t* hdst = hz.host_entry(sg, slot, s_slot, false);
          std::memcpy(hdst, ref_state.data() + t * sf, static_cast<std::size_t>(sf) * 4);
          const auto r = hz.entry_region(sg, slot, s_slot, false);
          regions.push_back(r);
          compare_raw_entry(after[static_cast<std::size_t>(r.bucket)].data() + r.offset, hdst, sf * 4, state_diff, fmt::format("state of token {}", t));
        }
        const CompressionPlan& cp = c.ratio == 4 ? plan.c4 : plan.c128;
        const std::size_t si_idx = c.indexer ? 1 : 0;
        ASSERT_GT(cp.state_groups.size(), si_idx);
        ASSERT_EQ(cp.state_groups[si_idx], sg);
        CompressorParams params{c.ratio, hd, kRope, c.indexer ? CompressorKind::kIndexer : CompressorKind::kAttention, 1e-6f};
        const std::int64_t n_slots = params.num_slots();
        std::int64_t from_cache = 0, no_position = 0;
        for (std::int64_t i = 0; i < cp.num_writes(); ++i) {
          const std::int64_t t = cp.token[static_cast<std::size_t>(i)], j = cp.entry[static_cast<std::size_t>(i)];
          std::vector<float> ring(static_cast<std::size_t>(params.ring_floats()), 0.0f);
          for (std::int64_t k = 0; k < n_slots; ++k) {
            const auto src_index = static_cast<std::size_t>(i * n_slots + k);
            const std::int32_t u = cp.source[src_index];
            if (u == CompressionPlan::kNoPosition) {
              ++no_position;
              continue;
            }
            const float* src = nullptr;
            if (u >= 0) {
              src = ref_state.data() + u * sf;
            } else {
              ++from_cache;
              src = reinterpret_cast<const float*>(hz.host_entry(sg, cp.state_slots[si_idx][src_index], s_slot, false));
            }
            std::memcpy(ring.data() + k * sf, src, static_cast<std::size_t>(sf) * 4);
          }
          std::vector<float> entry(static_cast<std::size_t>(hd));
          compressor_entry(ring, j, norm, hz.rope_compressed(), params, entry, /*simulate_quant=*/false);
          const std::int64_t slot = plan.view.groups[static_cast<std::size_t>(eg)].slot_mapping[static_cast<std::size_t>(t)];
          ASSERT_GE(slot, 0);
          std::uint8_t* hd_ = hz.host_entry(eg, slot, e_slot, false);
          std::uint8_t* hs_ = hz.host_entry(eg, slot, e_slot, true);
          if (c.indexer) encode_indexer_key(entry, dt.idx, hd_, hs_);
          else encode_main_kv(entry, kRope, dt.kv, hd_, hs_);
          const auto rd = hz.entry_region(eg, slot, e_slot, false), rs = hz.entry_region(eg, slot, e_slot, true);
          regions.push_back(rd);
          if (rs.length > 0) regions.push_back(rs);
          const std::uint8_t* gd = after[static_cast<std::size_t>(rd.bucket)].data() + rd.offset;
          const std::uint8_t* gs = after[static_cast<std::size_t>(rs.bucket)].data() + rs.offset;
          const std::string where = fmt::format("entry {} (token {})", j, t);
          if (c.indexer) compare_indexer_entry(gd, gs, hd_, hs_, dt.idx, entry_diff, where);
          else compare_main_kv_entry(gd, gs, hd_, hs_, dt.kv, entry_diff, where);
        }
        const ErrStats ss = compare(got_state, ref_state);
        const std::int64_t stray = CacheHarness::stray_bytes(before, after, regions);
        const std::string sh = fmt::format("{} {}/{} step {} pos {} writes {}", c.name, kv_name(dt.kv), idx_name(dt.idx), si + 1,
                                           positions_of(plan), cp.num_writes());
        EXPECT_EQ(ss.differing, 0) << sh << ": state rows (g + ape) differ";
        EXPECT_EQ(state_diff.hard, 0) << sh << ": " << state_diff.first_hard;
        EXPECT_EQ(stray, 0) << sh << ": bytes written outside the step's entries";
        if (cp.num_writes() > 0) expect_entries_ok(entry_diff, sh);
        Totals& tot = totals[ci];
        tot.state_rows.merge(ss);
        tot.state.merge(state_diff);
        tot.entries.merge(entry_diff);
        tot.writes += cp.num_writes();
        tot.from_cache += from_cache;
        tot.no_position += no_position;
        tot.stray += stray;
      }
      step_positions += fmt::format("{}{}", si == 0 ? "" : " ; ", positions_of(plan));
      hz.commit(plan);
    }
    for (std::size_t ci = 0; ci < cases.size(); ++ci) {
      const Totals& tot = totals[ci];
      const std::string sh = fmt::format("{} {}/{} steps {}", cases[ci].name, kv_name(dt.kv), idx_name(dt.idx), step_positions);
      report("finish_compressor_state", sh, tot.state_rows, tot.state.summary(),
             fmt::format("g + ape exact; {} state-cache slots written", tot.state.entries));
      ErrStats none;
      report("write_compressed_entries", sh, none, tot.entries.summary(),
             fmt::format("{} entries; pooled from the state cache {}, no position {}; stray bytes {}", tot.writes, tot.from_cache,
                         tot.no_position, tot.stray));
    }
  }
}

// =================================================================================================
// indexer_query
// =================================================================================================
TEST(GpuOpsCache, IndexerQuery) {
  const ModelConfig cfg = tiny_config();
  const RopeTable rope(compressed_rope_params(cfg));
  const std::vector<std::int32_t> positions = {0, 1, 5, 127, 128, 129, 255, 256, 257, 1000, 65000};
  const auto T = static_cast<std::int64_t>(positions.size());
  for (std::int64_t H : {std::int64_t{4}, std::int64_t{64}}) {
    std::mt19937_64 rng(seed_of({40, H}));
    std::vector<float> q = bf16_activations(static_cast<std::size_t>(T * H * kIdxDim), 1.0f, rng);
    auto step = std::make_unique<PackedStep>();
    step->host.n_tokens = static_cast<std::int32_t>(T);
    step->host.positions = step->arrays.put(positions);
    std::vector<float> rc;
    for (std::int32_t p : positions) append_cos_sin(rope, p, rc);
    step->host.rope_compressed = step->arrays.put(rc);
    step->upload();
    DevArray<std::uint16_t> dq(to_bf16(q));
    gpu::IndexerArgs a;
    a.step = step->get();
    a.capacity = static_cast<std::int32_t>(T + 2);
    a.heads = static_cast<std::int32_t>(H);
    a.q = dq.get();
    gpu::indexer_query(a, st());
    std::vector<float> ref = q;
    for (std::int64_t t = 0; t < T; ++t) {
      std::span<float> row(ref.data() + t * H * kIdxDim, static_cast<std::size_t>(H * kIdxDim));
      rope_heads_bf16(row, kIdxDim, rope, positions[static_cast<std::size_t>(t)]);
      for (std::int64_t h = 0; h < H; ++h) {
        std::span<float> head = row.subspan(static_cast<std::size_t>(h * kIdxDim), kIdxDim);
        hadamard_transform(head);
        for (float& v : head) v = round_to_bf16(v);
        simulate_quant_blocks(head, kIndexerFp4Block, QuantFormat::kFp4E2m1);
      }
    }
    const ErrStats s = compare(from_bf16(dq.download()), ref);
    const std::string sh = fmt::format("heads {} T {} pos 0..65000", H, T);
    EXPECT_EQ(s.nonfinite, 0) << sh;
    EXPECT_EQ(s.differing, 0) << sh << ": the same fp32 operations in the same order";
    report("indexer_query", sh, s, fmt::format("{}/{} differ", s.differing, s.n), "exact: RoPE, Hadamard, bf16, FP4");
  }
}

// =================================================================================================
// indexer_top_k on given scores, many ties
// =================================================================================================
TEST(GpuOpsCache, IndexerTopKTies) {
  const std::int32_t k = sim() ? 64 : 512;
  // (40000: more than four quads a thread in the write pass, one CTA or three segments: read twice)
  const std::vector<std::int64_t> ns = sim() ? std::vector<std::int64_t>{1, 5, k - 1, k, k + 1, 3 * k, 2000, 40000}
                                             : std::vector<std::int64_t>{1, 5, k - 1, k, k + 1, 3 * k, 2000, 16000, 40000};
  const std::int64_t T = static_cast<std::int64_t>(ns.size()) * 2;
  std::vector<std::int32_t> positions, ids(static_cast<std::size_t>(T), 0);
  for (std::int64_t n : ns) {
    positions.push_back(static_cast<std::int32_t>(4 * n - 1));  // (p + 1) / 4 = n
    positions.push_back(static_cast<std::int32_t>(4 * n + 2));
  }
  auto step = simple_step(ids, positions);
  std::int64_t max_n = 0;
  for (std::int32_t p : positions) max_n = std::max<std::int64_t>(max_n, (p + 1) / 4);
  // Rows of an odd length (the kernel's scalar loads) and rows padded to 4 (its 16-byte loads);
  // one CTA a token, and rows split into segments (a segment may hold no entry of a short row).
  for (const auto& [padded, segments] : {std::pair{false, 1}, std::pair{true, 1}, std::pair{false, 3}, std::pair{true, 7}}) {
    const std::int64_t max_entries = padded ? (max_n + 3) / 4 * 4 + 4 : max_n + 3;
    std::mt19937_64 rng(seed_of({41, k}));
    std::vector<float> scores(static_cast<std::size_t>(T * max_entries), std::nanf(""));
    const std::vector<float> levels = {round_to_bf16(1.5f), round_to_bf16(0.75f), 0.0f, -0.0f, round_to_bf16(-0.25f), round_to_bf16(3.0f),
                                       -INFINITY, round_to_bf16(0.7539f)};
    for (std::int64_t t = 0; t < T; ++t) {
      const std::int64_t n = (positions[static_cast<std::size_t>(t)] + 1) / 4;
      for (std::int64_t j = 0; j < n; ++j) {
        float v;
        const std::uint64_t r = rng() % 100;
        if (r < 4) v = std::nanf("");
        else if (t % 2 == 0) v = levels[rng() % levels.size()];           // heavy ties
        else v = round_to_bf16(std::normal_distribution<float>(0.0f, 1.0f)(rng));  // bf16 values: some ties
        scores[static_cast<std::size_t>(t * max_entries + j)] = v;
      }
    }
    DevArray<float> ds(scores);
    DevArray<std::int32_t> idx(static_cast<std::size_t>(T * k)), count(static_cast<std::size_t>(T));
    DevArray<std::int32_t> work(static_cast<std::size_t>(std::max<std::int64_t>(1, gpu::indexer_top_k_work_ints(T, segments))));
    DevArray<std::int32_t> key_counts(std::vector<std::int32_t>(static_cast<std::size_t>(gpu::indexer_key_count_ints(T)), 0));
    gpu::IndexerArgs a;
    a.step = step->get();
    a.capacity = static_cast<std::int32_t>(T);
    a.scores = ds.get();
    a.max_entries = max_entries;
    a.top_k = k;
    a.top_idx = idx.get();
    a.top_count = count.get();
    a.top_k_segments = segments;
    a.top_k_work = work.get();
    a.key_counts = key_counts.get();  // (the segmented passes count into them)
    // Twice: the second call finds the key counts as the first left them.
    for (int call = 0; call < 2; ++call) gpu::indexer_top_k(a, st());
    {
      const auto kc = key_counts.download();
      EXPECT_EQ(std::count(kc.begin(), kc.end(), 0), static_cast<std::ptrdiff_t>(kc.size())) << "key counts left nonzero";
    }
    const auto gi = idx.download();
    const auto gc = count.download();
    std::int64_t bad_sets = 0, bad_counts = 0, unsorted = 0;
    for (std::int64_t t = 0; t < T; ++t) {
      const std::int64_t n = (positions[static_cast<std::size_t>(t)] + 1) / 4;
      const auto ref = top_k_indices(std::span<const float>(scores).subspan(static_cast<std::size_t>(t * max_entries), static_cast<std::size_t>(n)), k);
      const std::int32_t c = gc[static_cast<std::size_t>(t)];
      if (c != static_cast<std::int32_t>(ref.size())) {
        ++bad_counts;
        continue;
      }
      std::set<std::int64_t> g, r(ref.begin(), ref.end());
      for (std::int32_t i = 0; i < c; ++i) {
        g.insert(gi[static_cast<std::size_t>(t * k + i)]);
        if (i > 0 && gi[static_cast<std::size_t>(t * k + i)] <= gi[static_cast<std::size_t>(t * k + i - 1)]) ++unsorted;
      }
      if (g != r) {
        ++bad_sets;
        ADD_FAILURE() << "top-k set differs for n " << n << " (" << (t % 2 == 0 ? "heavy ties" : "normal") << ")";
      }
    }
    EXPECT_EQ(bad_counts, 0);
    EXPECT_EQ(unsorted, 0);
    report_line("indexer_top_k", fmt::format("k {} n 1..{} ({} tokens, ties, NaN, +-0, -inf; rows {}; {} segment(s))", k, max_n, T, padded ? "padded to 4" : "of odd length", segments), "-", "-",
                fmt::format("{} sets differ", bad_sets), fmt::format("exact sets vs top_k_indices; counts wrong {}, unsorted {}", bad_counts, unsorted));
  }
}

// =================================================================================================
// indexer_scores (keys from the indexer cache) + indexer_top_k, vs cpu indexer_scores / top_k_indices
// =================================================================================================
TEST(GpuOpsCache, IndexerScoresAndTopK) {
  const std::int32_t top_k = sim() ? 64 : 512;
  const std::int64_t long_pos = sim() ? 1000 : 3000;
  for (IndexerCacheDtype idt : {IndexerCacheDtype::kFp4, IndexerCacheDtype::kFp8, IndexerCacheDtype::kBf16}) {
    CacheHarness hz(KvCacheDtype::kFp8, idt, 5, long_pos + 100);
    hz.add_sequence(1, 10);
    hz.add_sequence(2, 10);
    hz.add_sequence(3, 300);
    hz.add_sequence(4, 300);
    hz.add_sequence(5, long_pos + 10);
    hz.skip(2, 6);
    hz.skip(3, 130);
    hz.skip(4, 255);
    hz.skip(5, long_pos);
    // positions 0-2 (no entries), 6-7, 130, 255-257, long_pos
    const StepPlan plan = hz.plan({{1, 3}, {2, 2}, {3, 1}, {4, 3}, {5, 1}});
    auto step = hz.pack(plan);
    const std::int64_t T = plan.num_tokens();
    const int kg = hz.group(CacheKind::kIndexerKv);
    const CacheGroup& kgroup = hz.spec().groups[static_cast<std::size_t>(kg)];
    Sweep sweep;
    std::vector<std::pair<std::string, std::array<std::int64_t, 2>>> topk_lines;
    for (std::int64_t layer : {std::int64_t{1}, std::int64_t{3}}) {
      const std::int32_t lslot = hz.layer_slot(CacheKind::kIndexerKv, layer);
      for (std::int64_t H : sim() ? std::vector<std::int64_t>{4, 64} : std::vector<std::int64_t>{4, 32, 64}) {
        std::mt19937_64 rng(seed_of({42, static_cast<std::int64_t>(idt), layer, H}));
        // Keys of every complete entry of every row, encoded by the CPU into the pages.
        std::int64_t max_n = 0;
        for (std::int64_t r = 0; r < plan.num_rows(); ++r) {
          const std::int64_t last = plan.view.positions[static_cast<std::size_t>(plan.view.token_start[static_cast<std::size_t>(r) + 1] - 1)];
          const std::int64_t n = (last + 1) / 4;
          max_n = std::max(max_n, n);
          for (std::int64_t j = 0; j < n; ++j) {
            const std::int32_t slot = table_slot(plan.view, kgroup, kg, r, j);
            ASSERT_GE(slot, 0);
            std::vector<float> key = bf16_activations(kIdxDim, 1.0f, rng);
            // FP4 / FP8: some keys whose FP4 block scales span more than the e4m3 folding holds
            // (a block 2^-20 down: the exact path), some with a block of zeros (its scale is
            // ignored). (Not for bf16 keys: the bf16 kernel's tensor-core sums lose such tiny
            // terms beyond the sum-order bound.)
            const bool wide = idt != IndexerCacheDtype::kBf16;
            if (wide && j % 200 == 103)  // (most blocks of 64 entries have none: both paths run)
              for (int c = 32; c < 64; ++c) key[static_cast<std::size_t>(c)] = round_to_bf16(key[static_cast<std::size_t>(c)] * 0x1p-20f);
            if (wide && j % 11 == 5)
              for (int c = 64; c < 96; ++c) key[static_cast<std::size_t>(c)] = 0.0f;
            encode_indexer_key(key, idt, hz.host_entry(kg, slot, lslot, false), hz.host_entry(kg, slot, lslot, true));
          }
        }
        hz.upload_pools();
        // Queries as indexer_query leaves them (FP4-simulated bf16 values), weights (bf16, unscaled).
        std::vector<float> q = bf16_activations(static_cast<std::size_t>(T * H * kIdxDim), 1.0f, rng);
        // The next-to-last token's head 0 spans more binades than e4m3 holds under one scale: that
        // token takes the exact path on the FP8 tensor-core kernel (FP4 / FP8 keys, as above).
        for (int c = 64; c < 96 && idt != IndexerCacheDtype::kBf16; ++c) {
          float& v = q[static_cast<std::size_t>((T - 2) * H * kIdxDim + c)];
          v = round_to_bf16(v * 0x1p-24f);
        }
        simulate_quant_blocks(q, kIndexerFp4Block, QuantFormat::kFp4E2m1);
        std::vector<float> w = bf16_activations(static_cast<std::size_t>(T * H), 1.0f, rng);
        DevArray<std::uint16_t> dq(to_bf16(q)), dw(to_bf16(w));
        // fp4: rows of an odd length (top-k's scalar loads); the others padded to 4 (its 16-byte loads)
        const std::int64_t max_entries = idt == IndexerCacheDtype::kFp4 ? max_n + 5 : (max_n + 3) / 4 * 4 + 4;
        // Two calls of the token range (token0), as the executor chunks it.
        const std::int32_t split = static_cast<std::int32_t>(T / 2);
        // The second call's grid covers 2 rows past the step's tokens (a graph bucket): they stay untouched.
        DevArray<float> scores(static_cast<std::size_t>((T + 2) * max_entries));
        DevArray<std::int32_t> idx(static_cast<std::size_t>((T + 2) * top_k)), cnt(static_cast<std::size_t>(T + 2));
        DevArray<std::int32_t> work(static_cast<std::size_t>(gpu::indexer_top_k_work_ints(T + 2, 4)));
        DevArray<std::uint8_t> q_work(static_cast<std::size_t>(gpu::indexer_q_work_bytes(T + 2)));
        // key counts start at zero; every call must leave them so
        DevArray<std::int32_t> key_counts(std::vector<std::int32_t>(static_cast<std::size_t>(gpu::indexer_key_count_ints(T + 2)), 0));
        for (int part = 0; part < 2; ++part) {
          gpu::IndexerArgs a;
          a.step = step->get();
          a.token0 = part == 0 ? 0 : split;
          a.capacity = part == 0 ? split : static_cast<std::int32_t>(T) - split + 2;
          a.heads = static_cast<std::int32_t>(H);
          a.q = dq.get();
          a.weights = dw.get();
          a.key_group = kg;
          a.layer_slot = lslot;
          a.format = gpu_format(idt);
          a.scores = scores.get() + a.token0 * max_entries;
          a.max_entries = max_entries;
          a.top_k = top_k;
          a.top_idx = idx.get() + static_cast<std::int64_t>(a.token0) * top_k;
          a.top_count = cnt.get() + a.token0;
          a.ctas_per_token = part == 0 ? 1 : 0;  // one CTA walking every tile of its token; the grid's choice
          a.top_k_segments = part == 0 ? 1 : 4;  // top-k: one CTA a token; rows in 4 segments
          a.top_k_work = work.get();
          a.q_work = q_work.get();  // FP4 / FP8 keys on FP8 tensor cores
          a.key_counts = key_counts.get();  // FP4 / FP8 keys, segmented top-k: the scores kernel does the first pass
          gpu::indexer_scores(a, st());
          gpu::indexer_top_k(a, st());
          if (part == 1 && idt != IndexerCacheDtype::kBf16) {  // FP4 / FP8 keys without q_work: a clear error
            gpu::IndexerArgs bare = a;
            bare.q_work = nullptr;
            EXPECT_THROW(gpu::indexer_scores(bare, st()), std::exception);
          }
        }
        {
          const auto kc = key_counts.download();
          EXPECT_EQ(std::count(kc.begin(), kc.end(), 0), static_cast<std::ptrdiff_t>(kc.size())) << "key counts left nonzero";
        }
        const auto gs = scores.download();
        const auto gi = idx.download();
        const auto gc = cnt.download();
        EXPECT_EQ(gc[static_cast<std::size_t>(T)], -1);
        EXPECT_EQ(gc[static_cast<std::size_t>(T + 1)], -1);
        for (std::int64_t i = T * max_entries; i < (T + 2) * max_entries; ++i) EXPECT_TRUE(std::isnan(gs[static_cast<std::size_t>(i)]));
        // CPU
        IndexerParams ip{H, kIdxDim, kRope, top_k};
        const float wscale = indexer_weight_scale(ip);
        ErrStats s;
        std::int64_t past_written = 0, set_diff = 0, tie_diff = 0, self_diff = 0, bad_count = 0, beyond = 0;
        for (std::int64_t t = 0; t < T; ++t) {
          const std::int64_t pos = plan.view.positions[static_cast<std::size_t>(t)], n = (pos + 1) / 4;
          const std::int64_t row = plan.token_row[static_cast<std::size_t>(t)];
          std::vector<float> keys(static_cast<std::size_t>(n * kIdxDim));
          for (std::int64_t j = 0; j < n; ++j) {
            const std::int32_t slot = table_slot(plan.view, kgroup, kg, row, j);
            decode_indexer_key(hz.host_entry(kg, slot, lslot, false), hz.host_entry(kg, slot, lslot, true), idt,
                               std::span<float>(keys).subspan(static_cast<std::size_t>(j * kIdxDim), kIdxDim));
          }
          std::vector<float> wt(static_cast<std::size_t>(H));
          for (std::int64_t h = 0; h < H; ++h) wt[static_cast<std::size_t>(h)] = round_to_bf16(w[static_cast<std::size_t>(t * H + h)] * wscale);
          std::vector<float> ref(static_cast<std::size_t>(n)), mag(static_cast<std::size_t>(n), 0.0f);
          cpu_pool()->parallel_for(0, n, [&](std::int64_t j) {  // sum of |terms|, for the tie rule
            for (std::int64_t h = 0; h < H; ++h) {
              float dot = 0.0f;
              for (std::int64_t c = 0; c < kIdxDim; ++c)
                dot += q[static_cast<std::size_t>((t * H + h) * kIdxDim + c)] * keys[static_cast<std::size_t>(j * kIdxDim + c)];
              mag[static_cast<std::size_t>(j)] += std::fabs(round_to_bf16(std::max(round_to_bf16(dot), 0.0f) * wt[static_cast<std::size_t>(h)]));
            }
          });
          indexer_scores(std::span<const float>(q).subspan(static_cast<std::size_t>(t * H * kIdxDim), static_cast<std::size_t>(H * kIdxDim)), wt, keys, ip, ref);
          const float* got = gs.data() + t * max_entries;
          for (std::int64_t j = 0; j < n; ++j) {
            const float r = ref[static_cast<std::size_t>(j)];
            s.add(got[j], r);
            // Only the order of the q.k sums and of the head sum differ: a bf16 ulp of the score plus a
            // bf16 ulp of the largest term (<= 2^-8 mag).
            if (!(std::fabs(got[j] - r) <= bf16_ulp(r) + 0x1p-8f * mag[static_cast<std::size_t>(j)])) ++beyond;
          }
          for (std::int64_t j = n; j < max_entries; ++j) past_written += !std::isnan(got[j]);
          // top-k: the GPU's list is the top-k of its own scores exactly; against the CPU's scores
          // a difference is allowed only between entries whose scores tie within a bf16 ulp.
          const std::int32_t c = gc[static_cast<std::size_t>(t)];
          const auto cref = top_k_indices(ref, top_k);
          if (c != static_cast<std::int32_t>(cref.size())) {
            ++bad_count;
            continue;
          }
          std::set<std::int64_t> gset;
          for (std::int32_t i = 0; i < c; ++i) gset.insert(gi[static_cast<std::size_t>(t * top_k + i)]);
          const auto self = top_k_indices(std::span<const float>(got, static_cast<std::size_t>(n)), top_k);
          if (gset != std::set<std::int64_t>(self.begin(), self.end())) ++self_diff;
          const std::set<std::int64_t> cset(cref.begin(), cref.end());
          if (gset != cset) {
            ++set_diff;
            // A tie: the entry's CPU score within the rounding of the sum order of the k-th one
            // (a bf16 ulp of each score and of the largest term, 2^-8 mag, on each side).
            const float kth = ref[static_cast<std::size_t>(cref.back())];
            const float kth_mag = mag[static_cast<std::size_t>(cref.back())];
            auto tie = [&](std::int64_t j) {
              const float tol = bf16_ulp(kth) + bf16_ulp(ref[static_cast<std::size_t>(j)]) + 0x1p-8f * (kth_mag + mag[static_cast<std::size_t>(j)]);
              return std::fabs(ref[static_cast<std::size_t>(j)] - kth) <= tol;
            };
            bool ties = true;
            for (std::int64_t j : gset)
              if (cset.count(j) == 0) ties = ties && tie(j);
            for (std::int64_t j : cset)
              if (gset.count(j) == 0) ties = ties && tie(j);
            tie_diff += ties;
          }
        }
        const std::string sh = fmt::format("{} layer {} heads {} T {} pos {}", idx_name(idt), layer, H, T, positions_of(plan));
        EXPECT_EQ(beyond, 0) << sh << ": scores beyond the sum-order bound";
        EXPECT_EQ(s.nonfinite, 0) << sh;
        EXPECT_EQ(past_written, 0) << sh << ": scores past the complete entries were written";
        EXPECT_LT(s.rel_l2(), 1e-2) << sh;
        EXPECT_EQ(bad_count, 0) << sh;
        EXPECT_EQ(self_diff, 0) << sh << ": top-k is not the top-k of the GPU's own scores";
        EXPECT_EQ(set_diff, tie_diff) << sh << ": top-k sets differ beyond ties";
        const std::string key = fmt::format("{} heads {} T {} pos {}", idx_name(idt), H, T, positions_of(plan));
        sweep.add("indexer_scores", key, s, idt == IndexerCacheDtype::kBf16 ? "bf16 mma q.k, heads summed in a tree; <= ulp + 2^-8 mag"
                                                                           : "e4m3 wgmma q.k (exact operands), heads summed by mma; <= ulp + 2^-8 mag");
        bool found = false;
        for (auto& [k2, v] : topk_lines)
          if (k2 == key) {
            v[0] += set_diff;
            v[1] += tie_diff;
            found = true;
          }
        if (!found) topk_lines.push_back({key, {set_diff, tie_diff}});
      }
    }
    sweep.flush("layers 1,3 (2 calls: token0)");
    for (const auto& [key, v] : topk_lines)
      report_line("indexer_top_k", key + fmt::format(" k {} layers 1,3", top_k), "-", "-", fmt::format("{} sets differ ({} ties)", v[0], v[1]),
                  "vs top_k_indices of the CPU scores; exactly the top-k of the GPU's own scores");
  }
}

// =================================================================================================
// sparse_attention
// =================================================================================================
struct AttnCase {
  std::int32_t ratio;
  KvCacheDtype kv;
  std::int64_t heads;
  int splits;          // 0: attention_splits' choice
  int key_scale_log2 = 0;  // keys times 2^s, queries times 2^-s: UE8M0 scales past 2^15 (s = 24)
};

// The split count: fewest waves x chunks per split (+1 for the combine), fewest splits among equals.
TEST(GpuOpsCache, AttentionSplitsMinimizeWavesTimesChunks) {
  EXPECT_EQ(gpu::attention_splits(2, 64, 640, 132), 10);    // decode batch 1: one chunk a split
  EXPECT_EQ(gpu::attention_splits(128, 64, 640, 132), 1);   // 128 CTAs fill one wave: no split
  EXPECT_EQ(gpu::attention_splits(256, 64, 640, 132), 1);   // two waves either way
  EXPECT_EQ(gpu::attention_splits(4, 128, 1152, 132), 9);   // 8 CTAs, 18 chunks: 9 ties 16 and 18
  EXPECT_EQ(gpu::attention_splits(64, 64, 640, 132), 2);    // 64 CTAs: two splits still one wave
  EXPECT_EQ(gpu::attention_splits(300, 64, 100000, 132), 1);  // kMaxSplitTokens / tokens = 0 -> 1
  EXPECT_EQ(gpu::attention_splits(0, 64, 640, 132), 1);
}

TEST(GpuOpsCache, SparseAttention) {
  const std::int32_t top_k = sim() ? 40 : 512;
  std::vector<AttnCase> cases;
  if (sim()) {
    cases = {{0, KvCacheDtype::kFp8, 64, 1},     {0, KvCacheDtype::kBf16, 4, 0},     {128, KvCacheDtype::kFp8, 64, 0},
             {128, KvCacheDtype::kBf16, 128, 1}, {4, KvCacheDtype::kFp8, 128, 5},    {4, KvCacheDtype::kBf16, 64, 3},
             {4, KvCacheDtype::kFp8, 4, 1},      {4, KvCacheDtype::kFp8, 64, 1, 24}, {4, KvCacheDtype::kFp8, 128, 1},
             {128, KvCacheDtype::kFp8, 128, 2}};
  } else {
    // Every ratio, cache dtype and head count (4: a CTA's 64 rows mostly padding; 128: two head
    // groups); splits 1, the heuristic's choice and a forced 3.
    for (std::int32_t r : {0, 4, 128})
      for (KvCacheDtype kv : {KvCacheDtype::kFp8, KvCacheDtype::kBf16}) {
        cases.push_back({r, kv, 4, 1});
        cases.push_back({r, kv, 64, 1});
        cases.push_back({r, kv, 64, 3});
        cases.push_back({r, kv, 128, 0});
      }
    // Keys whose block scales leave the dequantization's power-of-two range (its fp32 path).
    cases.push_back({4, KvCacheDtype::kFp8, 64, 1, 24});
    cases.push_back({128, KvCacheDtype::kFp8, 128, 0, 24});
    // Two head groups with three splits: the combine over both groups' heads (on 132 SMs the
    // heuristic gives these 65 tokens one split).
    cases.push_back({4, KvCacheDtype::kFp8, 128, 3});
  }
  for (KvCacheDtype kv : {KvCacheDtype::kFp8, KvCacheDtype::kBf16}) {
    CacheHarness hz(kv, IndexerCacheDtype::kFp4, 4, sim() ? 400 : 2400);
    hz.add_sequence(1, 20);
    hz.add_sequence(2, 300);
    hz.add_sequence(3, 300);
    hz.add_sequence(5, 80);
    hz.skip(2, 127);
    hz.skip(3, 255);
    hz.skip(5, 62);
    // positions 0-9, 127-130, 255-257, and 62-66 (a last key chunk of 1, 2 or 3 keys)
    std::vector<StepSlice> slices = {{1, 10}, {2, 4}, {3, 3}, {5, 5}};
    if (!sim()) {
      hz.add_sequence(4, 2100);
      hz.skip(4, 2040);
      slices.push_back({4, 40});  // long rows: more than top_k compressed entries, many key chunks
    }
    const StepPlan plan = hz.plan(slices);
    auto step = hz.pack(plan);
    const std::int64_t T = plan.num_tokens();
    const int wg = hz.group(CacheKind::kWindowKv);
    const CacheGroup& wgroup = hz.spec().groups[static_cast<std::size_t>(wg)];
    const std::int64_t window = hz.config().sliding_window;
    for (const AttnCase& c : cases) {
      if (c.kv != kv) continue;
      const std::int64_t layer = c.ratio == 0 ? 0 : c.ratio == 4 ? 1 : 2;
      const RopeTable& rope = c.ratio > 0 ? hz.rope_compressed() : hz.rope_window();
      const std::int32_t wslot = hz.layer_slot(CacheKind::kWindowKv, layer);
      const CacheKind ckind = c.ratio == 4 ? CacheKind::kCsaKv : CacheKind::kHcaKv;
      const int cg = c.ratio > 0 ? hz.group(ckind) : -1;
      const std::int32_t cslot = c.ratio > 0 ? hz.layer_slot(ckind, layer) : 0;
      const std::int64_t H = c.heads;
      std::mt19937_64 rng(seed_of({50, c.ratio, static_cast<std::int64_t>(kv), H, c.splits, c.key_scale_log2}));
      // Keys: every window position and compressed entry the step's tokens read, CPU-encoded.
      for (std::int64_t r = 0; r < plan.num_rows(); ++r) {
        const std::int64_t last = plan.view.positions[static_cast<std::size_t>(plan.view.token_start[static_cast<std::size_t>(r) + 1] - 1)];
        const std::int64_t first_read = std::max<std::int64_t>(0, plan.view.row_start[static_cast<std::size_t>(r)] - window + 1);
        for (std::int64_t pos = first_read; pos <= last; ++pos) {
          const std::int32_t slot = table_slot(plan.view, wgroup, wg, r, pos);
          ASSERT_GE(slot, 0) << "window position " << pos << " of row " << r << " is not held";
          std::vector<float> v = bf16_activations(kDim, 1.0f, rng);
          for (float& x : v) x = std::ldexp(x, c.key_scale_log2);
          encode_main_kv(v, kRope, kv, hz.host_entry(wg, slot, wslot, false), hz.host_entry(wg, slot, wslot, true));
        }
        if (c.ratio > 0) {
          const CacheGroup& cgroup = hz.spec().groups[static_cast<std::size_t>(cg)];
          for (std::int64_t j = 0; j < (last + 1) / c.ratio; ++j) {
            const std::int32_t slot = table_slot(plan.view, cgroup, cg, r, j);
            ASSERT_GE(slot, 0);
            std::vector<float> v = bf16_activations(kDim, 1.0f, rng);
            for (float& x : v) x = std::ldexp(x, c.key_scale_log2);
            encode_main_kv(v, kRope, kv, hz.host_entry(cg, slot, cslot, false), hz.host_entry(cg, slot, cslot, true));
          }
        }
      }
      hz.upload_pools();
      // CSA: a top-k list per token (ascending, as indexer_top_k leaves it; some shorter than k).
      std::vector<std::int32_t> top_idx(static_cast<std::size_t>(T * top_k), -1), top_count(static_cast<std::size_t>(T), 0);
      if (c.ratio == 4) {
        for (std::int64_t t = 0; t < T; ++t) {
          const std::int64_t n = (plan.view.positions[static_cast<std::size_t>(t)] + 1) / 4;
          std::vector<std::int32_t> all(static_cast<std::size_t>(n));
          std::iota(all.begin(), all.end(), 0);
          std::shuffle(all.begin(), all.end(), rng);
          std::int64_t cnt = std::min<std::int64_t>(n, top_k);
          if (t % 3 == 1 && cnt > 0) --cnt;
          all.resize(static_cast<std::size_t>(cnt));
          std::sort(all.begin(), all.end());
          std::copy(all.begin(), all.end(), top_idx.begin() + t * top_k);
          top_count[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(cnt);
        }
      }
      std::vector<float> q = bf16_activations(static_cast<std::size_t>(T * H * kDim), 1.0f, rng);
      for (float& x : q) x = std::ldexp(x, -c.key_scale_log2);
      std::vector<float> sink = normal(static_cast<std::size_t>(H), 1.0f, rng);
      const float scale = attention_softmax_scale(kDim);
      std::int64_t max_keys = window;
      if (c.ratio == 4) max_keys += top_k;
      if (c.ratio == 128) max_keys += (plan.view.positions.back() + 1) / 128 + 4;
      // The grid covers 3 tokens past the step's (a graph bucket); their outputs stay untouched.
      const std::int64_t cap = T + 3;
      const int splits = c.splits > 0 ? c.splits : gpu::attention_splits(cap, H, max_keys, gpu::device_info().sm_count);
      DevArray<std::uint16_t> dq(to_bf16(q)), out(static_cast<std::size_t>(cap * H * kDim));
      DevArray<float> dsink(sink), part_acc(static_cast<std::size_t>(splits * cap * H * kDim)), part_ml(static_cast<std::size_t>(splits * cap * H * 2));
      DevArray<std::int32_t> didx(top_idx), dcnt(top_count);
      gpu::AttentionArgs a;
      a.step = step->get();
      a.capacity = static_cast<std::int32_t>(cap);
      a.q = dq.get();
      a.heads = static_cast<std::int32_t>(H);
      a.sink = dsink.get();
      a.scale = scale;
      a.window = static_cast<std::int32_t>(window);
      a.window_group = wg;
      a.window_layer_slot = wslot;
      a.ratio = c.ratio;
      a.compressed_group = std::max(cg, 0);
      a.compressed_layer_slot = cslot;
      a.top_idx = didx.get();
      a.top_count = dcnt.get();
      a.top_k = top_k;
      a.kv_fp8 = kv == KvCacheDtype::kFp8;
      a.compressed_rope = c.ratio > 0;
      a.out = out.get();
      a.splits = splits;
      a.part_acc = part_acc.get();
      a.part_ml = part_ml.get();
      gpu::sparse_attention(a, st());
      const std::vector<std::uint16_t> got_bits = out.download();
      std::vector<float> got = from_bf16(got_bits);
      std::int64_t past = 0;
      for (std::size_t i = static_cast<std::size_t>(T * H * kDim); i < got.size(); ++i) past += !std::isnan(got[i]);
      EXPECT_EQ(past, 0) << "outputs past the step's tokens were written";
      got.resize(static_cast<std::size_t>(T * H * kDim));
      // CPU: keys decoded from the pages, sink attention, inverse RoPE, bf16.
      std::vector<float> ref(got.size());
      std::int64_t total_keys = 0;
      for (std::int64_t t = 0; t < T; ++t) {
        const std::int64_t p = plan.view.positions[static_cast<std::size_t>(t)], row = plan.token_row[static_cast<std::size_t>(t)];
        std::vector<std::int64_t> windows, entries;
        for (std::int64_t pos = std::max<std::int64_t>(0, p - window + 1); pos <= p; ++pos) windows.push_back(pos);
        if (c.ratio == 128)
          for (std::int64_t j = 0; 128 * (j + 1) <= p + 1; ++j) entries.push_back(j);
        if (c.ratio == 4)
          for (std::int32_t i = 0; i < top_count[static_cast<std::size_t>(t)]; ++i) entries.push_back(top_idx[static_cast<std::size_t>(t * top_k + i)]);
        std::vector<float> keys((windows.size() + entries.size()) * kDim);
        std::size_t k = 0;
        for (std::int64_t pos : windows) {
          const std::int32_t slot = table_slot(plan.view, wgroup, wg, row, pos);
          decode_main_kv(hz.host_entry(wg, slot, wslot, false), hz.host_entry(wg, slot, wslot, true), kRope, kv,
                         std::span<float>(keys).subspan(k++ * kDim, kDim));
        }
        for (std::int64_t j : entries) {
          const CacheGroup& cgroup = hz.spec().groups[static_cast<std::size_t>(cg)];
          const std::int32_t slot = table_slot(plan.view, cgroup, cg, row, j);
          decode_main_kv(hz.host_entry(cg, slot, cslot, false), hz.host_entry(cg, slot, cslot, true), kRope, kv,
                         std::span<float>(keys).subspan(k++ * kDim, kDim));
        }
        total_keys += static_cast<std::int64_t>(k);
        std::span<float> ot(ref.data() + t * H * kDim, static_cast<std::size_t>(H * kDim));
        sink_attention(std::span<const float>(q).subspan(static_cast<std::size_t>(t * H * kDim), static_cast<std::size_t>(H * kDim)), H, kDim, keys,
                       sink, scale, ot, cpu_pool());
        rope.apply_heads(ot, kDim, p, /*inverse=*/true);
        for (float& v : ot) v = round_to_bf16(v);
      }
      const ErrStats s = compare(got, ref);
      if (std::getenv("DSV4_DEBUG_ATTN") != nullptr) {  // per-token worst element, for chasing a failure
        for (std::int64_t t = 0; t < T; ++t) {
          double mx = 0, at_ref = 0, at_got = 0, rmax = 0;
          std::int64_t at_i = 0;
          for (std::int64_t i = 0; i < H * kDim; ++i) {
            const std::size_t o = static_cast<std::size_t>(t * H * kDim + i);
            rmax = std::max(rmax, static_cast<double>(std::fabs(ref[o])));
            if (std::fabs(got[o] - ref[o]) > mx) {
              mx = std::fabs(got[o] - ref[o]);
              at_ref = ref[o];
              at_got = got[o];
              at_i = i;
            }
          }
          std::printf("t %lld pos %d: max err %g at head %lld dim %lld (got %g ref %g), max |ref| %g\n", static_cast<long long>(t),
                      plan.view.positions[static_cast<std::size_t>(t)], mx, static_cast<long long>(at_i / kDim), static_cast<long long>(at_i % kDim), at_got, at_ref, rmax);
        }
      }
      const std::string sh = fmt::format("r {} {} heads {} splits {}{} T {} (grid {}) pos {}", c.ratio, kv_name(kv), H, splits,
                                         c.key_scale_log2 != 0 ? fmt::format(" keys x2^{}", c.key_scale_log2) : "", T, cap, positions_of(plan));
      EXPECT_EQ(s.nonfinite, 0) << sh;
      EXPECT_LT(s.rel_l2(), 1e-2) << sh;
      report("sparse_attention", sh, s, fmt::format("{}/{} differ", s.differing, s.n),
             fmt::format("{} keys; online softmax over chunks of 64", total_keys));
    }
  }
}

}  // namespace
}  // namespace dsv4::gputest
