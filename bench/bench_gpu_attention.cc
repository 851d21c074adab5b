// Sparse attention and lightning-indexer benchmark at V4 shapes, against ceilings measured in
// the same run (a 4 GiB device-to-device copy for bytes, the bf16 mma.sync peak for FLOPs) and
// against DeepSeek FlashMLA's figures on the same kind of GPU (taken with its own harness,
// listed in the "FlashMLA" column; the numbers our kernels are meant to beat).
//
//   bench_gpu_attention [--cases decode,prefill,indexer] [--batches 1,64,128] [--reps N]
//                       [--top-k-segments S] [--ctas-per-token C]   (indexer launch overrides; 0: auto)
//                       [--splits S]   (decode attention's split count; 0: attention_splits' choice)
//                       [--top-k K]    (decode: the CSA cases' top-k instead of 512 / 1024; no FlashMLA figure)
//                       [--rotate 0|1] (decode; 0: one cache copy, no rotation through more than L2 holds)
//
// decode   s_q = 2 query tokens per sequence (a token and its MTP draft) at the end of a 16K
//          context, FP8 main-KV cache (584-byte entries) read through block tables:
//          V4-Flash CSA (64 heads, window 128 + indexer top-512), V4-Pro CSA (128 heads, window
//          128 + top-1024), V4-Flash HCA (64 heads, window 128 + every c128 entry: 127-128).
// prefill  4096 queries of one sequence ending at context 8K / 64K, window 128 + top-k each.
// indexer  scores of 64 index heads against the FP4 (68-byte) and FP8 (132-byte) indexer
//          caches and the top-512: one query at 1M tokens (262,144 entries), and 64 sequences
//          at 128K. "top-512" times indexer_top_k after indexer_scores (the FP8 tensor-core
//          scores kernel already counted its first histogram); "both" is the pair.
//
// The key sets (top-k lists) are random distinct entries, the cache bytes random values that
// decode to finite numbers, pages shuffled through the pool (as a paged cache leaves them).
// Timing: `reps` runs captured in one CUDA graph with events between runs, replayed once as
// warm-up and once timed; the median run is reported. Decode and indexer runs rotate through
// copies of the cache (different rows of the same pools) so that about 200 MB (over three times
// the H200's L2) pass between two uses of a copy: the keys come from HBM. Queries and outputs are
// not rotated.
//
// FLOPs of attention = 2 * (512 + 512) per (query, head, key) (Q.K^T and P.V), the accounting
// FlashMLA's harness uses; bytes = the keys' cache entries read per query (a key read by two
// queries counts twice, as FlashMLA counts it) + q + output.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/device_step.h"
#include "cuda/kernels/attention.h"
#include "cuda/kernels/fill.h"
#include "cuda/kernels/indexer.h"
#include "cuda/runtime.h"
#include "gpu_bench_util.h"
#include "mma_peak.h"

namespace dsv4 {
namespace {

using gpu::DeviceBuffer;
using bench::median;

constexpr int kDim = 512;
constexpr std::int64_t kMainEntryData = 576, kMainEntryScales = 8;  // fp8 main KV (584 B)
constexpr std::int64_t kNope = 448;                                 // its fp8 bytes, then bf16 rope dims
constexpr std::int64_t kIndexData = 64, kIndexScales = 4;           // fp4 indexer key (68 B)
constexpr std::int64_t kIndexFp8Data = 128;                          // fp8 indexer key (132 B)
constexpr std::int64_t kBlockPositions = 256;
constexpr double kRotateBytes = 200e6;  // bytes passed between two uses of a cache copy
constexpr int kMaxCopies = 256;

template <class T>
DeviceBuffer upload(const std::vector<T>& v, gpu::Stream& s) {
  DeviceBuffer b(std::max<std::size_t>(v.size() * sizeof(T), 4));
  if (!v.empty()) gpu::copy_to_device(b.data(), v.data(), v.size() * sizeof(T), s);
  return b;
}

// One cache group of `rows` rows, each holding `blocks` blocks starting at block `first_block`
// of its sequence (block ids unique per row, pages shuffled through the pool).
struct SyntheticGroup {
  DeviceBuffer table_base, table_start, block_ids, page_table, pool;
  gpu::DeviceCacheGroup group;

  SyntheticGroup(std::int64_t rows, std::int64_t blocks, std::int64_t first_block, std::int64_t entries_per_block,
                 std::int64_t data_bytes, std::int64_t scale_bytes, std::uint64_t seed, gpu::Stream& s) {
    const std::int64_t n_blocks = rows * blocks;
    std::vector<std::int32_t> base(static_cast<std::size_t>(rows), static_cast<std::int32_t>(first_block));
    std::vector<std::int32_t> start(static_cast<std::size_t>(rows + 1)), ids(static_cast<std::size_t>(n_blocks)),
        pages(static_cast<std::size_t>(n_blocks));
    for (std::int64_t r = 0; r <= rows; ++r) start[static_cast<std::size_t>(r)] = static_cast<std::int32_t>(r * blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::iota(pages.begin(), pages.end(), 0);
    std::mt19937_64 rng(seed);
    std::shuffle(pages.begin(), pages.end(), rng);
    const std::int64_t page_bytes = entries_per_block * (data_bytes + scale_bytes);
    table_base = upload(base, s);
    table_start = upload(start, s);
    block_ids = upload(ids, s);
    page_table = upload(pages, s);
    pool = DeviceBuffer(static_cast<std::size_t>(n_blocks * page_bytes));
    // Values of the magnitudes a model leaves (the top-k's work depends on them: scores that all
    // tie are its slowest case): main KV fp8 codes of about 0.5..3, rope dims bf16 of about 0.1..2,
    // UE8M0 scales 2^-2..2^2; indexer FP4 codes of any value with the same scales.
    // 64 random pages made on the host, repeated through the pool.
    constexpr std::int64_t kTemplatePages = 64;
    std::vector<std::uint8_t> host(static_cast<std::size_t>(kTemplatePages * page_bytes));
    std::uniform_int_distribution<int> any(0, 255), code(0x30, 0x45), rope_hi(0x3d, 0x3f), scale(125, 129);
    for (std::int64_t p = 0; p < kTemplatePages; ++p) {
      std::uint8_t* page = host.data() + p * page_bytes;
      for (std::int64_t e = 0; e < entries_per_block; ++e) {
        std::uint8_t* d = page + e * data_bytes;
        const bool fp8_index = data_bytes == kIndexFp8Data;  // e4m3 codes and one fp32 scale
        for (std::int64_t b = 0; b < data_bytes; ++b) {
          const bool main_kv = data_bytes == kMainEntryData, rope = main_kv && b >= kNope;
          const int v = fp8_index ? code(rng) | (any(rng) & 0x80) : !main_kv ? any(rng) : !rope ? code(rng) : (b - kNope) % 2 == 0 ? any(rng) : rope_hi(rng);
          d[b] = static_cast<std::uint8_t>(v);
        }
        std::uint8_t* sc = page + entries_per_block * data_bytes + e * scale_bytes;
        if (fp8_index) {
          const float f = std::ldexp(1.0f, scale(rng) - 127 - 6);
          std::memcpy(sc, &f, 4);
        } else {
          for (std::int64_t b = 0; b < scale_bytes; ++b) sc[b] = static_cast<std::uint8_t>(scale(rng));
        }
      }
    }
    for (std::int64_t p = 0; p < n_blocks; p += kTemplatePages) {
      const std::int64_t count = std::min(kTemplatePages, n_blocks - p);
      gpu::copy_to_device(pool.as<std::uint8_t>() + p * page_bytes, host.data(), static_cast<std::size_t>(count * page_bytes), s);
    }
    s.synchronize();  // `host` goes out of scope
    group.table_base = table_base.as<std::int32_t>();
    group.table_start = table_start.as<std::int32_t>();
    group.block_ids = block_ids.as<std::int32_t>();
    group.page_table = page_table.as<std::int32_t>();
    group.pool = pool.as<std::uint8_t>();
    group.page_bytes = page_bytes;
    group.layers = 1;
    group.entries_per_block = static_cast<std::int32_t>(entries_per_block);
    group.data_bytes = static_cast<std::int32_t>(data_bytes);
    group.scale_bytes = static_cast<std::int32_t>(scale_bytes);
  }
};

// `copies` DeviceSteps of the same tokens (positions, RoPE values) that differ in their rows:
// copy c reads rows c * seqs .. c * seqs + seqs - 1 of the groups.
struct SyntheticSteps {
  DeviceBuffer positions, rope;
  std::vector<DeviceBuffer> rows, steps;
  const gpu::DeviceStep* get(int copy) const { return steps[static_cast<std::size_t>(copy)].as<gpu::DeviceStep>(); }

  SyntheticSteps(const std::vector<std::int32_t>& pos, const std::vector<std::int32_t>& token_seq, std::int64_t seqs, int copies,
                 const std::vector<const gpu::DeviceCacheGroup*>& groups, gpu::Stream& s) {
    const auto n = static_cast<std::int64_t>(pos.size());
    positions = upload(pos, s);
    rope = DeviceBuffer(static_cast<std::size_t>(n * 2 * gpu::kRopeHalf * 4));
    gpu::fill_uniform_f32(rope.as<float>(), n * 2 * gpu::kRopeHalf, 0x5eed0a01, -1.0f, 1.0f, s.handle());
    for (int c = 0; c < copies; ++c) {
      std::vector<std::int32_t> r(pos.size());
      for (std::size_t i = 0; i < r.size(); ++i) r[i] = static_cast<std::int32_t>(c * seqs + token_seq[i]);
      rows.push_back(upload(r, s));
      gpu::DeviceStep h;
      h.n_tokens = static_cast<std::int32_t>(n);
      h.n_rows = static_cast<std::int32_t>(seqs * copies);
      h.positions = positions.as<std::int32_t>();
      h.token_ids = positions.as<std::int32_t>();  // unread by these kernels
      h.token_row = rows.back().as<std::int32_t>();
      h.rope_window = rope.as<float>();
      h.rope_compressed = rope.as<float>();
      h.n_groups = static_cast<std::int32_t>(groups.size());
      for (std::size_t g = 0; g < groups.size(); ++g) h.groups[g] = *groups[g];
      steps.emplace_back(sizeof h);
      gpu::copy_to_device(steps.back().data(), &h, sizeof h, s);
      s.synchronize();  // `h` and `r` go out of scope
    }
  }
};

// Median microseconds of `reps` runs of run(r), the first run outside the graph (first launches).
template <class Run>
double time_runs(gpu::Stream& stream, int reps, Run&& run) {
  run(0);
  stream.synchronize();
  const std::vector<gpu::Event> events = bench::events_of_graph_runs(stream, reps, 1, [&](int r, auto&& mark) {
    mark(0);
    run(r);
  });
  std::vector<double> us;
  for (int r = 0; r < reps; ++r) us.push_back(bench::us_between(events, static_cast<std::size_t>(r), static_cast<std::size_t>(r) + 1));
  return median(us);
}

int copies_for(double bytes_per_run, double max_pool_bytes, double pool_bytes_per_copy) {
  const double want = std::ceil(kRotateBytes / std::max(bytes_per_run, 1.0));
  const double room = std::floor(max_pool_bytes / std::max(pool_bytes_per_copy, 1.0));
  return static_cast<int>(std::clamp(std::min(want, room), 1.0, static_cast<double>(kMaxCopies)));
}

struct Ceilings {
  double bw = 0, bf16 = 0;  // bytes/s, TFLOP/s
};

// Random distinct sorted entries of [0, n), k of them (all when n <= k).
std::vector<std::int32_t> random_top(std::int64_t n, std::int64_t k, std::mt19937_64& rng) {
  std::vector<std::int32_t> all(static_cast<std::size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  if (n > k) {
    for (std::int64_t i = 0; i < k; ++i) {
      std::uniform_int_distribution<std::int64_t> pick(i, n - 1);
      std::swap(all[static_cast<std::size_t>(i)], all[static_cast<std::size_t>(pick(rng))]);
    }
    all.resize(static_cast<std::size_t>(k));
  }
  std::sort(all.begin(), all.end());
  return all;
}

struct AttentionCase {
  const char* name;
  std::int64_t heads, ratio, top_k;
};

// Sparse attention over `seqs` sequences of `s_q` query tokens each, the last at position ctx - 1;
// returns the median microseconds and fills flops / bytes.
double run_attention(const AttentionCase& ac, std::int64_t seqs, std::int64_t s_q, std::int64_t ctx, int reps, bool rotate,
                     int forced_splits, double* flops, double* bytes, int* copies_out, int* splits_out) {
  gpu::Stream stream;
  const gpu_stream_t st = stream.handle();
  const std::int64_t H = ac.heads, T = seqs * s_q, window = 128;
  std::vector<std::int32_t> pos(static_cast<std::size_t>(T)), seq_of(static_cast<std::size_t>(T));
  for (std::int64_t t = 0; t < T; ++t) {
    pos[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(ctx - s_q + t % s_q);
    seq_of[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(t / s_q);
  }
  // Keys per token and the CSA lists.
  std::mt19937_64 rng(0x5eed0b00 + static_cast<std::uint64_t>(H));
  const std::int64_t top_k = std::max<std::int64_t>(ac.top_k, 1);
  std::vector<std::int32_t> top(static_cast<std::size_t>(T * top_k), 0), count(static_cast<std::size_t>(T), 0);
  double keys_total = 0;
  std::int64_t max_keys = 0;
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t p = pos[static_cast<std::size_t>(t)];
    std::int64_t n_comp = 0;
    if (ac.ratio == 4) {
      const std::vector<std::int32_t> list = random_top((p + 1) / 4, ac.top_k, rng);
      std::copy(list.begin(), list.end(), top.begin() + t * top_k);
      n_comp = static_cast<std::int64_t>(list.size());
      count[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(n_comp);
    } else if (ac.ratio == 128) {
      n_comp = (p + 1) / 128;
    }
    const std::int64_t keys = std::min(window, p + 1) + n_comp;
    keys_total += static_cast<double>(keys);
    max_keys = std::max(max_keys, keys);
  }
  *flops = keys_total * static_cast<double>(H) * 2.0 * (kDim + kDim);
  *bytes = keys_total * static_cast<double>(kMainEntryData + kMainEntryScales) + static_cast<double>(T * H * kDim * 2 * 2);

  // Pools: the window group holds each row's last two blocks; the compressed group all blocks.
  const std::int64_t last_block = (ctx - 1) / kBlockPositions;
  const std::int64_t entry = kMainEntryData + kMainEntryScales;
  const std::int64_t comp_epb = ac.ratio > 0 ? kBlockPositions / ac.ratio : 1;
  const std::int64_t comp_blocks = ac.ratio > 0 ? (ctx / ac.ratio + comp_epb - 1) / comp_epb : 1;
  const double pool_per_seq = static_cast<double>((2 * kBlockPositions + comp_blocks * comp_epb) * entry);
  const gpu::DeviceInfo info = gpu::device_info();
  const double room = std::min(60e9, static_cast<double>(info.free_bytes) - 8e9);
  const int copies = rotate ? copies_for(*bytes, room, pool_per_seq * static_cast<double>(seqs)) : 1;
  *copies_out = copies;
  const std::int64_t rows = seqs * copies;
  SyntheticGroup win(rows, 2, last_block - 1, kBlockPositions, kMainEntryData, kMainEntryScales, 0x5eed0c01, stream);
  SyntheticGroup comp(rows, comp_blocks, 0, comp_epb, kMainEntryData, kMainEntryScales, 0x5eed0c02, stream);
  SyntheticSteps steps(pos, seq_of, seqs, copies, {&win.group, &comp.group}, stream);

  DeviceBuffer q(static_cast<std::size_t>(T * H * kDim * 2)), out(static_cast<std::size_t>(T * H * kDim * 2)),
      sink(static_cast<std::size_t>(H * 4));
  gpu::fill_uniform_bf16(q.as<std::uint16_t>(), T * H * kDim, 0x5eed0d01, -1.0f, 1.0f, st);
  gpu::fill_uniform_f32(sink.as<float>(), H, 0x5eed0d02, -1.0f, 1.0f, st);
  DeviceBuffer top_d = upload(top, stream), count_d = upload(count, stream);

  gpu::AttentionArgs a;
  a.capacity = static_cast<std::int32_t>(T);
  a.q = q.as<std::uint16_t>();
  a.heads = static_cast<std::int32_t>(H);
  a.sink = sink.as<float>();
  a.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  a.window = static_cast<std::int32_t>(window);
  a.window_group = 0;
  a.ratio = static_cast<std::int32_t>(ac.ratio);
  a.compressed_group = 1;
  a.top_idx = top_d.as<std::int32_t>();
  a.top_count = count_d.as<std::int32_t>();
  a.top_k = static_cast<std::int32_t>(top_k);
  a.kv_fp8 = true;
  a.compressed_rope = ac.ratio > 0;
  a.out = out.as<std::uint16_t>();
  // (a forced count within the partial buffers' bound of 256 split states a head)
  a.splits = forced_splits > 0 ? static_cast<int>(std::min<std::int64_t>(forced_splits, std::max<std::int64_t>(1, 256 / T)))
                               : gpu::attention_splits(T, H, max_keys, info.sm_count);
  *splits_out = a.splits;
  DeviceBuffer part_acc, part_ml;
  if (a.splits > 1) {
    part_acc = DeviceBuffer(static_cast<std::size_t>(a.splits * T * H * kDim * 4));
    part_ml = DeviceBuffer(static_cast<std::size_t>(a.splits * T * H * 2 * 4));
    a.part_acc = part_acc.as<float>();
    a.part_ml = part_ml.as<float>();
  }
  stream.synchronize();
  return time_runs(stream, reps, [&](int r) {
    gpu::AttentionArgs ar = a;
    ar.step = steps.get(r % copies);
    gpu::sparse_attention(ar, st);
  });
}

// FlashMLA's figures (issue text; its harness on an H200, FP8 cache, sink on); 0 = none.
double flashmla_decode_us(const std::string& name, std::int64_t batch) {
  struct Row {
    const char* name;
    double b1, b64, b128;
  };
  static const Row rows[] = {{"V4-Flash CSA", 14.1, 49.5, 92.8}, {"V4-Pro CSA", 16.6, 106.4, 206.2}, {"V4-Flash HCA", 14.6, 77.1, 114.2}};
  for (const Row& r : rows)
    if (name == r.name) return batch == 1 ? r.b1 : batch == 64 ? r.b64 : batch == 128 ? r.b128 : 0.0;
  return 0.0;
}

void bench_decode(const std::vector<std::int64_t>& batches, int reps, int forced_splits, std::int64_t top_k,
                  bool rotate, const Ceilings& c) {
  AttentionCase cases[] = {{"V4-Flash CSA", 64, 4, 512}, {"V4-Pro CSA", 128, 4, 1024}, {"V4-Flash HCA", 64, 128, 0}};
  if (top_k > 0) {
    cases[0].top_k = top_k;
    cases[1].top_k = top_k;
    fmt::print("(CSA top-k {} instead of 512 / 1024: the FlashMLA figures do not apply)\n", top_k);
  }
  fmt::print("Decode attention: s_q = 2, context 16384, FP8 cache; time = median of {} runs\n\n", reps);
  fmt::print("| case (decode, s_q = 2) | batch | splits | copies | time (us) | FlashMLA (us) | vs FlashMLA | TFLOP/s | of bf16 peak | GB/s | of HBM |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const AttentionCase& ac : cases) {
    for (std::int64_t b : batches) {
      double flops = 0, bytes = 0;
      int copies = 0, splits = 0;
      const double us = run_attention(ac, b, 2, 16384, reps, rotate, forced_splits, &flops, &bytes, &copies, &splits);
      const double ref = top_k > 0 && ac.ratio == 4 ? 0.0 : flashmla_decode_us(ac.name, b);
      const double tf = flops / (us * 1e-6) / 1e12, gbs = bytes / (us * 1e-6) / 1e9;
      fmt::print("| {} | {} | {} | {} | {:.1f} | {} | {} | {:.0f} | {:.0f}% | {:.0f} | {:.0f}% |\n", ac.name, b, splits, copies, us,
                 ref > 0 ? fmt::format("{:.1f}", ref) : "-", ref > 0 ? fmt::format("{:.2f}x", ref / us) : "-", tf,
                 100.0 * tf / c.bf16, gbs, 100.0 * gbs * 1e9 / c.bw);
      std::fflush(stdout);
    }
  }
  fmt::print("\n");
}

void bench_prefill(int reps, const Ceilings& c) {
  struct Case {
    AttentionCase ac;
    std::int64_t ctx;
    double flashmla_us;
  };
  const Case cases[] = {{{"h64, 128 + top-512", 64, 4, 512}, 8192, 612},
                        {{"h64, 128 + top-512", 64, 4, 512}, 65536, 698},
                        {{"h128, 128 + top-1024", 128, 4, 1024}, 8192, 1944},
                        {{"h128, 128 + top-1024", 128, 4, 1024}, 65536, 2115}};
  fmt::print("Prefill attention: 4096 queries of one sequence, FP8 cache (FlashMLA: bf16 keys); median of {} runs\n\n", reps);
  fmt::print("| case (prefill, 4096 queries) | context | time (us) | TFLOP/s | of bf16 peak | FlashMLA (us) | of FlashMLA's TFLOP/s |\n");
  fmt::print("|---|---|---|---|---|---|---|\n");
  for (const Case& k : cases) {
    double flops = 0, bytes = 0;
    int copies = 0, splits = 0;
    const double us = run_attention(k.ac, 1, 4096, k.ctx, reps, false, 0, &flops, &bytes, &copies, &splits);
    const double tf = flops / (us * 1e-6) / 1e12;
    fmt::print("| {} | {}K | {:.0f} | {:.0f} | {:.0f}% | {:.0f} | {:.0f}% |\n", k.ac.name, k.ctx / 1024, us, tf, 100.0 * tf / c.bf16,
               k.flashmla_us, 100.0 * k.flashmla_us / us);
    std::fflush(stdout);
  }
  fmt::print("\n");
}

// Indexer scores (+ top-512) of `seqs` sequences of one query each at position ctx - 1 against
// the FP4 (68 B) or FP8 (132 B) indexer cache. The queries are FP4-simulated, as indexer_query
// leaves them (random e2m1 codes under block scales 2^-3..2^0).
// Overrides of the indexer's launch choices (0: the library's own): --top-k-segments, --ctas-per-token.
struct IndexerKnobs {
  std::int32_t top_k_segments = 0, ctas_per_token = 0;
};

void bench_indexer_case(const char* label, gpu::IndexerFormat format, std::int64_t seqs, std::int64_t ctx, int reps, const IndexerKnobs& knobs,
                        const Ceilings& c) {
  gpu::Stream stream;
  const gpu_stream_t st = stream.handle();
  constexpr std::int64_t kHeads = 64, kHeadDim = 128, kTop = 512;
  const std::int64_t data = format == gpu::IndexerFormat::kFp4 ? kIndexData : kIndexFp8Data;
  const std::int64_t entries = ctx / 4, epb = kBlockPositions / 4, blocks = (entries + epb - 1) / epb;
  const double bytes = static_cast<double>(seqs * entries * (data + kIndexScales));
  const double flops = 2.0 * static_cast<double>(seqs * entries * kHeads * kHeadDim);
  const gpu::DeviceInfo info = gpu::device_info();
  const double room = std::min(60e9, static_cast<double>(info.free_bytes) - 8e9);
  const int copies = copies_for(bytes, room, static_cast<double>(seqs * blocks * epb * (data + kIndexScales)));
  SyntheticGroup keys(seqs * copies, blocks, 0, epb, data, kIndexScales, 0x5eed0e01, stream);
  std::vector<std::int32_t> pos(static_cast<std::size_t>(seqs), static_cast<std::int32_t>(ctx - 1)), seq_of(pos.size());
  std::iota(seq_of.begin(), seq_of.end(), 0);
  SyntheticSteps steps(pos, seq_of, seqs, copies, {&keys.group}, stream);
  DeviceBuffer q(static_cast<std::size_t>(seqs * kHeads * kHeadDim * 2)), w(static_cast<std::size_t>(seqs * kHeads * 2)),
      scores(static_cast<std::size_t>(seqs * entries * 4)), top(static_cast<std::size_t>(seqs * kTop * 4)),
      count(static_cast<std::size_t>(seqs * 4)),
      q_work(static_cast<std::size_t>(gpu::indexer_q_work_bytes(seqs))),
      key_counts(static_cast<std::size_t>(4 * gpu::indexer_key_count_ints(seqs))),
      top_work(static_cast<std::size_t>(std::max<std::int64_t>(
          1, 4 * gpu::indexer_top_k_work_ints(seqs, knobs.top_k_segments > 0 ? knobs.top_k_segments
                                                                             : gpu::indexer_top_k_segments(seqs, entries, gpu::device_info().sm_count)))));
  {
    std::mt19937_64 rng(0x5eed0e02);
    std::uniform_int_distribution<int> nib(0, 15), block_exp(-3, 0);
    std::vector<std::uint16_t> host(static_cast<std::size_t>(seqs * kHeads * kHeadDim));
    for (std::size_t b = 0; b < host.size(); b += 32) {
      const int e = block_exp(rng);
      for (std::size_t v = b; v < b + 32; ++v) {
        const int code = nib(rng), mag = code & 7;
        const float m = mag < 2 ? 0.5f * static_cast<float>(mag) : std::ldexp(1.0f + 0.5f * static_cast<float>(mag & 1), (mag >> 1) - 1);
        const float x = std::ldexp((code & 8) ? -m : m, e);
        std::uint32_t u;
        std::memcpy(&u, &x, 4);
        host[v] = static_cast<std::uint16_t>(u >> 16);  // exact: two significant bits
      }
    }
    gpu::copy_to_device(q.data(), host.data(), host.size() * 2, stream);
    stream.synchronize();
  }
  gpu::fill_uniform_bf16(w.as<std::uint16_t>(), seqs * kHeads, 0x5eed0e03, -1.0f, 1.0f, st);
  gpu::IndexerArgs a;
  a.capacity = static_cast<std::int32_t>(seqs);
  a.heads = static_cast<std::int32_t>(kHeads);
  a.q = q.as<std::uint16_t>();
  a.weights = w.as<std::uint16_t>();
  a.key_group = 0;
  a.format = format;
  a.q_work = q_work.as<std::uint8_t>();
  gpu::fill_bytes(key_counts.data(), 0, key_counts.size(), stream);  // (each call leaves them zero)
  a.key_counts = key_counts.as<std::int32_t>();
  a.top_k_work = top_work.as<std::int32_t>();
  a.scores = scores.as<float>();
  a.max_entries = entries;
  a.top_k = static_cast<std::int32_t>(kTop);
  a.top_idx = top.as<std::int32_t>();
  a.top_count = count.as<std::int32_t>();
  a.sm_count = info.sm_count;
  a.top_k_segments = knobs.top_k_segments;
  a.ctas_per_token = knobs.ctas_per_token;
  stream.synchronize();
  auto with_step = [&](int r) {
    gpu::IndexerArgs ar = a;
    ar.step = steps.get(r % copies);
    return ar;
  };
  const double score_us = time_runs(stream, reps, [&](int r) { gpu::indexer_scores(with_step(r), st); });
  const double top_us = time_runs(stream, reps, [&](int r) { gpu::indexer_top_k(with_step(r), st); });
  const double both_us = time_runs(stream, reps, [&](int r) {
    gpu::indexer_scores(with_step(r), st);
    gpu::indexer_top_k(with_step(r), st);
  });
  const double gbs = bytes / (score_us * 1e-6) / 1e9;
  fmt::print("| {} | {} | {} | {:.1f} | {:.0f} | {:.0f}% | {:.1f} | {:.1f} | {:.1f} |\n", label, seqs, copies, score_us, gbs,
             100.0 * gbs * 1e9 / c.bw, flops / (score_us * 1e-6) / 1e12, top_us, both_us);
  std::fflush(stdout);
}

void bench_indexer(int reps, const Ceilings& c, const IndexerKnobs& knobs) {
  fmt::print("Indexer: 64 heads x 128, FP4 (68 B) and FP8 (132 B) keys, top-512; scores alone, top-k alone, both (median of {} runs)\n\n", reps);
  fmt::print("| case | queries | copies | scores (us) | scores GB/s | of HBM | TFLOP/s | top-512 (us) | scores + top-512 (us) |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|\n");
  bench_indexer_case("FP4, 1M tokens (262,144 entries)", gpu::IndexerFormat::kFp4, 1, 1 << 20, reps, knobs, c);
  bench_indexer_case("FP4, 128K context, batch 64", gpu::IndexerFormat::kFp4, 64, 1 << 17, reps, knobs, c);
  bench_indexer_case("FP8, 1M tokens (262,144 entries)", gpu::IndexerFormat::kFp8, 1, 1 << 20, reps, knobs, c);
  bench_indexer_case("FP8, 128K context, batch 64", gpu::IndexerFormat::kFp8, 64, 1 << 17, reps, knobs, c);
  fmt::print("\n");
}

int run(int argc, char** argv) {
  std::vector<std::int64_t> batches = {1, 64, 128};
  std::string cases = "decode,prefill,indexer";
  int reps = 50;
  IndexerKnobs knobs;
  int splits = 0;
  std::int64_t top_k = 0;
  bool rotate = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--batches")
      batches = bench::parse_list(value);
    else if (key == "--reps")
      reps = std::max(3, std::atoi(value.c_str()));
    else if (key == "--cases")
      cases = value;
    else if (key == "--top-k-segments")
      knobs.top_k_segments = std::max(0, std::atoi(value.c_str()));
    else if (key == "--ctas-per-token")
      knobs.ctas_per_token = std::max(0, std::atoi(value.c_str()));
    else if (key == "--top-k")
      top_k = std::clamp<std::int64_t>(std::atoll(value.c_str()), 0, 4096);
    else if (key == "--splits")
      splits = std::clamp(std::atoi(value.c_str()), 0, 32);
    else if (key == "--rotate") {
      if (value != "0" && value != "1") throw Error(fmt::format("--rotate {} (0 or 1)", value));
      rotate = value == "1";
    }
    else
      throw Error(fmt::format("unknown option {}", key));
  }
  if (argc % 2 == 0) throw Error(fmt::format("option {} has no value", argv[argc - 1]));
  for (std::int64_t b : batches)
    if (b < 1 || b > 4096) throw Error(fmt::format("batch {} (1 to 4096)", b));
  const std::vector<std::string> chosen = bench::split_list(cases);
  for (const std::string& k : chosen)
    if (k != "decode" && k != "prefill" && k != "indexer") throw Error(fmt::format("unknown case '{}' (decode, prefill, indexer)", k));
  auto wanted = [&](const char* k) { return std::find(chosen.begin(), chosen.end(), k) != chosen.end(); };

  const gpu::DeviceInfo info = gpu::device_info();
  Ceilings c;
  c.bw = bench::measure_hbm_bandwidth();
  c.bf16 = bench::measure_mma_peak_tflops(false);
  fmt::print("device: {} ({} SMs, L2 {} MB)\nHBM bandwidth (4 GiB copy, read + write): {:.2f} TB/s\n", info.name, info.sm_count,
             info.l2_bytes >> 20, c.bw / 1e12);
  fmt::print("mma.sync peak: bf16 {:.0f} TFLOP/s\n\n", c.bf16);
  if (wanted("decode")) bench_decode(batches, reps, splits, top_k, rotate, c);
  if (wanted("prefill")) bench_prefill(std::min(reps, 20), c);
  if (wanted("indexer")) bench_indexer(reps, c, knobs);
  return 0;
}

}  // namespace
}  // namespace dsv4

int main(int argc, char** argv) { return dsv4::bench::guarded_main("bench_gpu_attention", dsv4::run, argc, argv); }
