// Shared by the CPU op benchmarks (bench_cpu_*.cc, Google Benchmark): random inputs and weights
// of the kinds V4 stores, the thread pools, and the FLOP/s and bytes/s counters.
//
// Every benchmark takes its thread count as its last argument (1: the calling thread alone, no
// pool; 2: a pool of two, the calling thread included) and reports
//   FLOP/s   the op's multiply-adds x 2 (or its own count, said where it is defined), per second;
//   bytes/s  the bytes the op must read (weights, keys, activations) and write, per second
//            (printed in binary units: G = 2^30).
#pragma once

#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "cpu/dense_weight.h"

namespace dsv4::bench {

// Uniform values in [-scale, scale), rounded to bf16 when `bf16` (what bf16 / fp8 / fp4 weights
// and cached activations hold); a fixed generator per seed.
std::vector<float> random_values(std::size_t n, std::uint64_t seed, float scale = 1.0f, bool bf16 = true);

// A weight of `kind` [out, in] with random values, packed as the executor packs it.
DenseWeight random_weight(const std::string& name, std::int64_t out, std::int64_t in, WeightKind kind,
                          std::uint64_t seed);

// nullptr for 1 thread, else a pool of `threads` that lives as long as the program.
ThreadPool* pool_for(std::int64_t threads);

// Sets the FLOP/s and bytes/s counters from per-iteration amounts.
void set_rates(benchmark::State& state, double flop_per_iteration, double bytes_per_iteration);

}  // namespace dsv4::bench
