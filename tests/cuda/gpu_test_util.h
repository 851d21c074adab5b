// Helpers of the GPU op tests (test_gpu_ops.cc): typed device arrays with poisoning, seeded
// random inputs, error statistics against a CPU reference, cache-entry byte comparison, and a
// one-line summary per case (collected and printed as a table at the end of the run).
//
// Plain host C++: compiled by the host compiler in both builds (the real one links the nvcc-built
// kernels, the _sim one the simulator's). Kernels are reached through their launcher headers.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "cpu/dense_weight.h"
#include "cuda/kernels/gemm.h"
#include "cuda/runtime.h"
#include "kvcache/cache_spec.h"
#include "numerics/bf16.h"

namespace dsv4::gputest {

namespace gpu = dsv4::gpu;

gpu::Stream& stream();
// Threads for the CPU references (their results do not depend on the pool).
ThreadPool* cpu_pool();
inline gpu_stream_t st() { return stream().handle(); }
inline void sync() { stream().synchronize(); }
inline bool sim() { return gpu::simulated(); }
// The simulator's smaller sizes: in the simulator, or on a GPU with DSV4_GPU_TEST_SMALL=1 set (the
// sanitizer runs of tools/gpu-check.sh). Tolerances still follow sim(): only the simulator sums
// in exact k order.
inline bool small() {
  static const bool env = [] {
    const char* v = std::getenv("DSV4_GPU_TEST_SMALL");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }();
  return sim() || env;
}

// A typed device array. New arrays (and poison()) are filled with 0xFF bytes: NaN as fp32 or
// bf16, -1 as int32, the e4m3 NaN code as fp8 -- so an output the kernel fails to write fails.
template <class T>
class DevArray {
 public:
  DevArray() = default;
  explicit DevArray(std::size_t n) : buf_(std::max<std::size_t>(n, 1) * sizeof(T)), n_(n) { poison(); }
  explicit DevArray(const std::vector<T>& host) : DevArray(host.size()) { upload(host); }

  T* get() { return buf_.as<T>(); }
  const T* get() const { return buf_.as<T>(); }
  std::size_t size() const { return n_; }
  void poison(int byte = 0xFF) { gpu::fill_bytes(buf_.data(), byte, buf_.size(), stream()); }
  void upload(const std::vector<T>& host) {
    if (host.size() > n_) throw std::runtime_error("DevArray::upload: too many values");
    if (!host.empty()) gpu::copy_to_device(buf_.data(), host.data(), host.size() * sizeof(T), stream());
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_ > 0) gpu::copy_to_host(host.data(), buf_.data(), n_ * sizeof(T), stream());
    sync();
    return host;
  }

 private:
  gpu::DeviceBuffer buf_;
  std::size_t n_ = 0;
};

// ---- random inputs -------------------------------------------------------------------------------
// A seed from the case's parameters, so each case draws its own fixed inputs.
std::uint64_t seed_of(std::initializer_list<std::int64_t> parts);

std::vector<float> normal(std::size_t n, float sigma, std::mt19937_64& rng);
std::vector<float> uniform(std::size_t n, float lo, float hi, std::mt19937_64& rng);
// Activation-like bf16 values: normal(sigma), a few outliers (x8..x40), never exactly zero.
std::vector<float> bf16_activations(std::size_t n, float sigma, std::mt19937_64& rng);
void round_all_bf16(std::vector<float>& v);
std::vector<std::uint16_t> to_bf16(std::span<const float> v);
std::vector<float> from_bf16(std::span<const std::uint16_t> v);

// ---- comparisons ---------------------------------------------------------------------------------
struct ErrStats {
  std::int64_t n = 0;
  std::int64_t nonfinite = 0;   // got values that are NaN or Inf (where ref is finite)
  std::int64_t differing = 0;   // got != ref
  double max_abs = 0, diff2 = 0, ref2 = 0;
  double rel_l2() const { return ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2); }
  void add(float got, float ref);
  void merge(const ErrStats& o);
};
ErrStats compare(std::span<const float> got, std::span<const float> ref);
// bf16 spacing at |x| (2^(floor(log2|x|) - 7)); the smallest normal's spacing for 0.
float bf16_ulp(float x);

// Cache entries compared byte for byte; where bytes differ the entries are decoded (cpu/cache_codec.h)
// and every differing value is classified: within one step of its format (an FP8 code step, an
// FP4 code step, one bf16 ulp) or a hard difference.
struct EntryDiff {
  std::int64_t entries = 0, bytes = 0, bytes_differing = 0;
  std::int64_t fp8_steps = 0, fp4_steps = 0, bf16_ulps = 0, hard = 0;
  std::string first_hard;
  std::int64_t steps() const { return fp8_steps + fp4_steps + bf16_ulps; }
  std::string summary() const;  // "123/4672 B (fp8 steps 1)"
  void merge(const EntryDiff& o);
};
void compare_main_kv_entry(const std::uint8_t* got_data, const std::uint8_t* got_scales, const std::uint8_t* ref_data,
                           const std::uint8_t* ref_scales, KvCacheDtype dtype, EntryDiff& diff, const std::string& where);
void compare_indexer_entry(const std::uint8_t* got_data, const std::uint8_t* got_scales, const std::uint8_t* ref_data,
                           const std::uint8_t* ref_scales, IndexerCacheDtype dtype, EntryDiff& diff,
                           const std::string& where);
// Raw bytes (fp32 compressor state): every byte must match.
void compare_raw_entry(const std::uint8_t* got, const std::uint8_t* ref, std::int64_t bytes, EntryDiff& diff,
                       const std::string& where);
// Checks of an EntryDiff the tests share: no hard differences, one-step differences counted and
// at most `max_step_fraction` of the entries' bytes.
void expect_entries_ok(const EntryDiff& d, const std::string& what, double max_step_fraction = 0.01);

// ---- the summary table ---------------------------------------------------------------------------
// Prints "| op | shape | max abs | rel L2 | bytes differing | note |" now and again in the table
// at the end of the program.
void report(const std::string& op, const std::string& shape, const ErrStats& s, const std::string& bytes = "-",
            const std::string& note = "");
void report_line(const std::string& op, const std::string& shape, const std::string& max_abs, const std::string& rel,
                 const std::string& bytes, const std::string& note);
// Cases swept over sizes (row counts): statistics merged per key, one line each at flush() with
// `sweep` (e.g. "rows 1..130 x11") appended to the shape.
class Sweep {
 public:
  void add(const std::string& op, const std::string& shape, const ErrStats& s, const std::string& note);
  void flush(const std::string& sweep);

 private:
  struct Entry {
    std::string op, shape, note;
    ErrStats stats;
  };
  std::vector<Entry> entries_;
};
// Prints the collected table (gtest environment teardown).
void print_summary_table();

// Uploads of host arrays for a DeviceStep (each array its own device buffer).
class Uploads {
 public:
  template <class T>
  T* put(const std::vector<T>& v) {
    buffers_.emplace_back(std::max<std::size_t>(v.size(), 1) * sizeof(T));
    if (!v.empty()) gpu::copy_to_device(buffers_.back().data(), v.data(), v.size() * sizeof(T), stream());
    return buffers_.back().template as<T>();
  }

 private:
  std::vector<gpu::DeviceBuffer> buffers_;
};

// ---- weights -----------------------------------------------------------------------------------
// A weight in one of the GPU formats (gemm.h) with its exact values, drawn as normal(sigma) and
// quantized with the checkpoint writer's functions (numerics/block_quant.h).
struct TestWeight {
  gpu::WeightFormat format = gpu::WeightFormat::kBf16;
  std::int64_t n = 0, k = 0;
  std::vector<std::uint8_t> data;        // fp8 codes [n][k] / fp4 packed [n][k/2] / bf16 [n][k] little-endian
  std::vector<std::uint8_t> scales_u8;   // fp8: UE8M0 [ceil(n/128)][ceil(k/128)]; fp4: UE8M0 [n][k/32]
  std::vector<float> scales_f32;         // fp8: the same scales widened
  std::vector<float> values;             // [n][k] dequantized
  DenseWeight dense(const std::string& name = "w") const;
};
TestWeight make_weight(gpu::WeightFormat format, std::int64_t n, std::int64_t k, float sigma, std::mt19937_64& rng);

// Device copies; `experts` weights of one shape stacked (expert e at e * stride).
struct DevWeight {
  DevArray<std::uint8_t> data;
  DevArray<float> scales_f32;
  DevArray<std::uint8_t> scales_u8;
  gpu::DeviceWeight w;
};
DevWeight upload_weight(const TestWeight& w);
DevWeight upload_experts(const std::vector<const TestWeight*>& experts);

}  // namespace dsv4::gputest
