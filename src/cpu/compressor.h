// KV compressor of CSA (ratio 4, overlapping) and HCA (ratio 128) layers, and of the lightning
// indexer (SPEC.md 3.3, 5, 5a; DeepSeek-V4 inference/model.py Compressor).
//
// Per token t (fp32 on the fp32 -- bf16-valued -- input x_t):
//   a_t = wkv . x_t,  g_t = wgate . x_t + ape[t mod r]      (linear_f32; each coff*hd values)
// stored as one "slot" of slot_floats() = 2*coff*hd floats: a_t, then g_t.
//
// State ring of one sequence (num_slots() slots, row-major, slot_floats() each) -- the layout
// the pooling reads and the executor keeps between steps:
//   r = 4 (coff 2): slots 0..3 = tokens 4(j-1)..4(j-1)+3 (the previous block, slot t mod 4),
//                   slots 4..7 = tokens 4j..4j+3 (this block, slot 4 + t mod 4).
//   r = 128 (coff 1): slot t mod 128 = token t of this block.
// compressor_slot(t) says where a token's projection goes; when token t completes its block
// (compressor_block_complete), pool + finish give entry j = t / r, then compressor_shift moves
// this block's slots into the previous-block slots (r = 4; a no-op for r = 128).
//
// Pooling (fp32), per channel c < hd, over the slots of entry j:
//   r = 4: the previous block's FIRST halves (a[c], g[c], slots 0..3; skipped when j = 0, i.e.
//          weight 0) then this block's SECOND halves (a[hd+c], g[hd+c], slots 4..7);
//   r = 128: a[c], g[c] of slots 0..127.
//   w_s = exp(g_s - max) / sum_s exp(g_s - max); entry[c] = sum_s a_s * w_s (slot order).
// Finish (the entry rounded to bf16 first, as the reference's kv.to(bf16)):
//   rms_norm with the compressor norm weight (bf16 out); RoPE on the last rope_dim dims at
//   position j*r (fp32 rotation, bf16 store); then
//   kAttention: FP8-simulate dims [0, hd - rope_dim) in blocks of 64 (dims after untouched);
//   kIndexer:   Hadamard over all hd dims (scale hd^-0.5), bf16, then FP4-simulate in blocks of 32.
// Size mismatches throw std::invalid_argument.
#pragma once

#include <cstdint>
#include <span>

#include "common/thread_pool.h"
#include "cpu/dense_weight.h"
#include "numerics/rope.h"

namespace dsv4 {

enum class CompressorKind { kAttention, kIndexer };

inline constexpr std::int64_t kKvFp8Block = 64;       // cached kv: FP8 blocks on the no-rope dims
inline constexpr std::int64_t kIndexerFp4Block = 32;  // indexer q and keys: FP4 blocks

struct CompressorParams {
  std::int64_t ratio = 4;       // 4 or 128
  std::int64_t head_dim = 512;  // hd: 512 (attention) or index_head_dim 128 (indexer)
  std::int64_t rope_dim = 64;
  CompressorKind kind = CompressorKind::kAttention;
  float norm_eps = 1e-6f;

  std::int64_t coff() const { return ratio == 4 ? 2 : 1; }
  std::int64_t proj_dim() const { return coff() * head_dim; }  // a_t and g_t sizes
  std::int64_t slot_floats() const { return 2 * proj_dim(); }  // a_t then g_t
  std::int64_t num_slots() const { return coff() * ratio; }    // 8 or 128
  std::int64_t ring_floats() const { return num_slots() * slot_floats(); }
};

// x [rows, D], positions [rows] (absolute t), ape [r, coff*hd] -> slots [rows, slot_floats()].
void compressor_project(std::span<const float> x, std::int64_t rows, std::span<const std::int64_t> positions,
                        const DenseWeight& wkv, const DenseWeight& wgate, std::span<const float> ape,
                        const CompressorParams& params, std::span<float> slots, ThreadPool* pool = nullptr);

// The ring slot of token t, whether t completes its block ((t + 1) % r == 0), and the shift
// after an entry was emitted.
std::int64_t compressor_slot(std::int64_t position, const CompressorParams& params);
bool compressor_block_complete(std::int64_t position, const CompressorParams& params);
void compressor_shift(std::span<float> ring, const CompressorParams& params);

// ring [ring_floats()] -> pooled entry [hd] (fp32). has_previous: j > 0 (used for r = 4 only).
void compressor_pool(std::span<const float> ring, bool has_previous, const CompressorParams& params,
                     std::span<float> entry);

// In place on the pooled entry [hd]: bf16, norm, RoPE at block_index * r, (indexer: Hadamard,)
// quantization. With simulate_quant false the last step (the FP8 / FP4 simulation) is left to
// the cache encoder, which quantizes the same values once (cache_codec.h): that is what the
// executors store, so CPU and GPU write the same bytes.
void compressor_finish(std::span<float> entry, std::span<const float> norm_weight, const RopeTable& rope,
                       std::int64_t block_index, const CompressorParams& params, bool simulate_quant = true);

// compressor_pool then compressor_finish for entry j = block_index.
void compressor_entry(std::span<const float> ring, std::int64_t block_index, std::span<const float> norm_weight,
                      const RopeTable& rope, const CompressorParams& params, std::span<float> entry,
                      bool simulate_quant = true);

// The rope-dims-then-FP8 tail shared with the window kv (SPEC 3.2 step 2): dims [0, n - rope)
// FP8-simulated in blocks of 64, the last rope dims untouched.
void fp8_simulate_kv_nope(std::span<float> kv, std::int64_t rope_dim);

}  // namespace dsv4
