// Where a lane points ldmatrix_x4 (device.h) to load bf16 mma fragments (mma_m16n8k16_bf16), and
// the pair of products one such load feeds. Offsets are (row, column) in 16-bit values inside the
// tile whose corner the caller adds.
//
//   A, a 16 x 16 tile (rows = M, columns = K):           r[0..3] = the A fragment
//   B, two n-tiles stored [n][k] (16 rows of n, 16 of k): r[0..1] = n-tile 0's fragment, r[2..3] = n-tile 1's
//   B, two n-tiles stored [k][n] (16 rows of k, 16 of n), loaded with ldmatrix_x4_trans: the same split
#pragma once

#include <cstdint>

#include "cuda/device.h"

namespace dsv4::gpu {

struct LaneOffset {
  int row, col;
};

__device__ __forceinline__ LaneOffset a_fragment_lane(int lane) { return {(lane & 7) + 8 * ((lane >> 3) & 1), 8 * (lane >> 4)}; }
__device__ __forceinline__ LaneOffset b_rows_n_lane(int lane) { return {(lane & 7) + 8 * (lane >> 4), 8 * ((lane >> 3) & 1)}; }
__device__ __forceinline__ LaneOffset b_rows_k_lane(int lane) { return a_fragment_lane(lane); }

// d0 += A * (n-tile 0 of b), d1 += A * (n-tile 1 of b), b as one ldmatrix_x4 above delivers it.
__device__ __forceinline__ void mma_bf16_two_tiles(float (&d0)[4], float (&d1)[4], const std::uint32_t (&a)[4],
                                                   const std::uint32_t (&b)[4]) {
  const std::uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
  mma_m16n8k16_bf16(d0, a, b0, d0);
  mma_m16n8k16_bf16(d1, a, b1, d1);
}

}  // namespace dsv4::gpu
