// Fast Walsh-Hadamard transform, scaled by n^-0.5 so it is orthonormal and its own inverse.
// Natural (Sylvester) order: H_1 = [1], H_2n = [[H_n, H_n], [H_n, -H_n]], i.e. entry (i, j)
// is (-1)^popcount(i & j), like fast_hadamard_transform used by the reference.
// The indexer applies it over 128 dims (SPEC.md 3.3, 3.4). Computed in fp32.
#pragma once

#include <span>

namespace dsv4 {

// In place; x.size() must be a power of two (1 included); throws std::invalid_argument otherwise.
void hadamard_transform(std::span<float> x);

}  // namespace dsv4
