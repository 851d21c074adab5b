// What the two warpgroup-mma kernels of the routed experts share (gemm_experts_wgmma.cu: f16
// products; gemm_experts_fp8.cu: FP8 products): a tile's token rows and activation scales, the
// pipeline of a unit's four 32-wide blocks, each block's product times its weight scale into the
// unit's sum, the unit's sum times the activation scales, and the outputs. Accumulators are in
// wgmma's layout: thread (warp w, g = lane / 4, q = lane % 4) holds d[4 jj + e] of the warp's 16
// rows, row g + 8 (e / 2) and token 8 jj + 2 q + e % 2.
#pragma once

#include <cstdint>

#include "cuda/device.h"
#include "cuda/kernels/gemm.h"
#include "cuda/kernels/gemm_output.cuh"
#include "cuda/kernels/numerics.cuh"

namespace dsv4::gpu {

// A launch's arguments: the quantized activations, the stacked experts, where the outputs go and
// the tile map.
struct ExpertProductArgs {
  const std::uint8_t* a_codes;  // [rows][k] e4m3
  const float* a_scales;        // [rows][k / 128]
  std::int64_t k;
  DeviceWeight w;
  GemmOutput out;
  ExpertTiles tiles;
};
// The most 128-wide units of k a tiled fp4 weight has.
inline constexpr int kMaxExpertUnits = static_cast<int>(kFp4TiledMaxK / 128);

// Tile `tile` of the map: its first row, its row count (0 past the map's *num_tiles: nothing to
// do) and its expert.
struct TileRows {
  std::int64_t first;
  int count;
  int expert;
};
__device__ __forceinline__ TileRows tile_rows(const ExpertTiles& tiles, int tile) {
  if (tile >= *tiles.num_tiles) return {0, 0, 0};
  return {tiles.tile_row0[tile], tiles.tile_rows[tile], tiles.tile_expert[tile]};
}

// The activation row of the tile's token m.
__device__ __forceinline__ std::int64_t tile_token_row(const ExpertTiles& tiles, std::int64_t first, int m) {
  return tiles.source_row != nullptr ? tiles.source_row[first + m] : first + m;
}

// The 16 weight rows (`group`) a warp takes of expert `expert` in the tiled fp4 layout (gemm.h
// fp4_tiled): its units' 1,024-byte blocks and their 64-byte scale blocks. A warp past the
// weight's end takes the last group again and stores nothing (active false: a warpgroup's products
// need all four warps).
struct WarpRows {
  bool active;
  const std::uint8_t* data;
  const std::uint8_t* scale;
};
__device__ __forceinline__ WarpRows warp_rows(const DeviceWeight& w, int expert, std::int64_t group, int units) {
  const std::int64_t groups = w.n / 16;
  const bool active = group < groups;
  const std::int64_t src = active ? group : groups - 1;
  return {active, static_cast<const std::uint8_t*>(w.data) + expert * w.expert_stride + src * units * 1024,
          static_cast<const std::uint8_t*>(w.scale) + expert * w.scale_stride + src * units * 64};
}

// Unit u of the warp's rows into a stage, by bulk copy on `bar` (lane 0 issues; one arrival a
// warp): the weight block at `weights` + 1,024 warp, the scale block at `scales` + 64 warp.
__device__ __forceinline__ void copy_warp_unit(std::uint8_t* weights, std::uint8_t* scales, std::uint64_t* bar,
                                               const WarpRows& rows, int u, int warp, int lane) {
  if (lane == 0) {
    mbarrier_arrive_expect_tx(bar, 1024 + 64);
    bulk_copy_to_shared(weights + warp * 1024, rows.data + static_cast<std::int64_t>(u) * 1024, 1024, bar);
    bulk_copy_to_shared(scales + warp * 64, rows.scale + static_cast<std::int64_t>(u) * 64, 64, bar);
  }
}

// A thread's share of the tile's token codes, 16-byte chunks of a unit: chunk c = tid + threads i
// is chunk c % 8 (k 16 (c % 8) ..) of token c / 8, copied to `dst` bytes into a stage (-1: past the
// tile's kTokens x 8 chunks, none); past the tile's rows the copies write zeros.
template <int kChunks>
struct TokenChunks {
  const std::uint8_t* src[kChunks];
  bool ok[kChunks];
  int dst[kChunks];
};
template <int kTokens, int kChunks, class Offset>
__device__ __forceinline__ void token_chunks(TokenChunks<kChunks>& t, const ExpertTiles& tiles,
                                             const std::uint8_t* codes, std::int64_t k, std::int64_t first, int count,
                                             int tid, int threads, Offset offset) {
  DSV4_UNROLL
  for (int i = 0; i < kChunks; ++i) {
    const int c = tid + threads * i, m = c >> 3, j = c & 7;
    t.ok[i] = m < count;
    const std::int64_t r = t.ok[i] ? tile_token_row(tiles, first, m) : 0;
    t.src[i] = codes + r * k + 16 * j;
    t.dst[i] = c < kTokens * 8 ? offset(m, j) : -1;
  }
}
template <int kChunks>
__device__ __forceinline__ void copy_token_chunks(std::uint8_t* stage, const TokenChunks<kChunks>& t, int u) {
  DSV4_UNROLL
  for (int i = 0; i < kChunks; ++i) {
    if (t.dst[i] >= 0) cp_async_16_zfill(stage + t.dst[i], t.src[i] + static_cast<std::int64_t>(u) * 128, t.ok[i]);
  }
}

// The tile's activation scales [unit][token] into shared memory, zero past its `count` tokens.
template <int kTokens>
__device__ __forceinline__ void load_tile_scales(float* sas, const float* a_scales, const ExpertTiles& tiles,
                                                 std::int64_t first, int count, int units, int tid, int threads) {
  for (int i = tid; i < units * kTokens; i += threads) {
    const int u = i / kTokens, m = i % kTokens;
    sas[i] = m < count ? a_scales[tile_token_row(tiles, first, m) * units + u] : 0.0f;
  }
}

// A unit's four 32-wide blocks with two in flight: issue_block(s) starts block s's product (one
// commit group); add_block(s) runs once the wait covers it, so the tensor cores work on block
// s + 1 while block s is added.
template <class IssueBlock, class AddBlock>
__device__ __forceinline__ void four_blocks_two_in_flight(IssueBlock&& issue_block, AddBlock&& add_block) {
  issue_block(0);
  DSV4_UNROLL
  for (int s = 0; s < 4; ++s) {
    if (s < 3) {
      issue_block(s + 1);
      wgmma_wait<1>();
    } else {
      wgmma_wait<0>();
    }
    add_block(s);
  }
}

// Block s's product times its weight scale (ws_g for rows g, ws_h for rows g + 8) into the unit's
// sum (block 0 starts it).
template <int N>
__device__ __forceinline__ void add_scaled_block(float (&unit)[N], const float (&part)[N], int s, float ws_g,
                                                 float ws_h) {
  DSV4_UNROLL
  for (int i = 0; i < N; ++i) {
    const float scaled = part[i] * ((i & 2) ? ws_h : ws_g);
    unit[i] = s == 0 ? scaled : unit[i] + scaled;
  }
}

// The unit's sums times the activation scales of their tokens 8 jj + 2 q and 8 jj + 2 q + 1 into the
// accumulators; `sa` is the unit's row of the tile's scales plus 2 q.
template <int N>
__device__ __forceinline__ void add_unit(float (&acc)[N], const float (&unit)[N], const float* sa) {
  DSV4_UNROLL
  for (int jj = 0; jj < N / 4; ++jj) {
    const float2 s2 = *reinterpret_cast<const float2*>(sa + 8 * jj);
    acc[4 * jj + 0] += unit[4 * jj + 0] * s2.x;
    acc[4 * jj + 1] += unit[4 * jj + 1] * s2.y;
    acc[4 * jj + 2] += unit[4 * jj + 2] * s2.x;
    acc[4 * jj + 3] += unit[4 * jj + 3] * s2.y;
  }
}

// The outputs of the warp's 16 weight rows (`group`) for the tile's `count` tokens, times
// kFp4Rebuild (the fp4 values were rebuilt times 2^-6).
template <int N>
__device__ __forceinline__ void store_tile(const GemmOutput& out, const float (&acc)[N], std::int64_t first, int count,
                                           std::int64_t group, int g, int q) {
  DSV4_UNROLL
  for (int i = 0; i < N; ++i) {
    const int m = 8 * (i / 4) + 2 * q + (i & 1);
    const std::int64_t n = group * 16 + g + 8 * ((i >> 1) & 1);
    if (m < count) store_out(out, first + m, n, acc[i] * kFp4Rebuild);
  }
}

}  // namespace dsv4::gpu
