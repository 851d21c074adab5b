// How an FP8 tensor-core product (e4m3 x e4m3, fp32 accumulator) forms one output: a model with
// the undocumented choices as parameters.
//
// Hopper's FP8 `wgmma` does not add in fp32. DeepSeek-V3's report (section 3.5.2) describes a
// fixed-point sum: the exact products are aligned by right shifts to the largest exponent, only
// the highest bits of each shifted product are kept, and the sum keeps about 14 bits. Probes by
// others report 13 fraction bits, rounded toward zero. The reference's fp8 and fp4 GEMMs
// (DeepSeek's inference/kernel.py) run on exactly this arithmetic inside each 128-wide (fp8) or
// 32-wide (fp4) k block, then scale the block's result into an fp32 total. An executor that wants
// the tensor core's bits on the CPU needs the exact rules, and they are not published:
//   - how many bits of an aligned product are kept, and whether the cut truncates toward zero
//     or toward minus infinity (a two's complement shift);
//   - which exponent a product aligns on: its exponent field sum (the top of its 8-bit
//     significand product) or its leading one;
//   - whether the accumulator C joins that alignment (and is cut with the products) or is added
//     to the rounded product sum afterwards;
//   - how many products one fixed-point sum takes (an instruction's k of 32, or groups of 16, 8
//     or 4 chained through the accumulator);
//   - how the sum is rounded to the result's fraction bits.
// `fp8_dot` computes one output under a given choice; `fp8_dot_candidates` lists every choice
// the GPU probe tries (test_device_language's WgmmaE4m3SumsMatchTheFp8DotModel runs wgmma on
// random and crafted operands and names the choices that reproduce every output bit).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dsv4 {

struct Fp8DotModel {
  enum class Accumulator : std::uint8_t {
    kJoint,            // C is aligned and cut with the products, in the same fixed-point sum
    kAfterNearest,     // the products' rounded sum is added to C in fp32, to nearest even
    kAfterTowardZero,  // ... and that fp32 addition rounded toward zero
  };
  enum class Rounding : std::uint8_t { kTowardZero, kNearestEven, kFloor };

  int window_bits = 13;        // bits kept below the alignment point (the top of the largest term)
  bool floor_shifts = false;   // aligned terms cut toward minus infinity, else toward zero
  bool align_on_field = true;  // a product's top is ea + eb + 8 (its significand field), else its leading one
  Accumulator accumulator = Accumulator::kJoint;
  int group = 32;        // products per fixed-point sum (1..32); groups chain through the accumulator
  int result_bits = 13;  // fraction bits of a group's result (23: fp32)
  Rounding result_rounding = Rounding::kTowardZero;

  friend bool operator==(const Fp8DotModel&, const Fp8DotModel&) = default;
};

// The choice this project takes for Hopper (H100 / H200) until the probe says otherwise, and what
// the simulator's FP8 wgmma computes. A window of 14 bits below the largest product's field (the
// report's "highest 14 bits"), cut as a two's complement shift cuts ("sign-fill right shifting"),
// C joining the sum, 13 fraction bits toward zero in the result (the probes' "13 bits"). Evidence
// so far: the indexer's FP8 scores kernel gave the CPU's exact scores, bit for bit, on an H100
// and an H200 (test_gpu_ops IndexerScoresAndTopK, 954 and 1,954 scores a set); run through the
// simulator, a window of 13 with C joining changes 1 or 2 of them, a window of 14 none. The
// probe's test asserts the rest.
inline constexpr Fp8DotModel kHopperFp8Dot{
    14, true, true, Fp8DotModel::Accumulator::kJoint, 32, 13, Fp8DotModel::Rounding::kTowardZero};

// One output: C plus the dot product of the e4m3 codes a and b (the same length, a multiple of
// the model's group), groups taken in k order. Any NaN code gives NaN.
float fp8_dot(const Fp8DotModel& model, float c, std::span<const std::uint8_t> a, std::span<const std::uint8_t> b);

// "window 13, cut toward zero, field alignment, C joint, groups of 32, result 13 bits toward zero".
std::string describe(const Fp8DotModel& model);

// Every combination the probe tries (a few thousand), kHopperFp8Dot among them.
std::vector<Fp8DotModel> fp8_dot_candidates();

// One observed output of a tensor-core product: d = C + a . b over k values.
struct Fp8DotCase {
  float c = 0.0f;
  const std::uint8_t* a = nullptr;
  const std::uint8_t* b = nullptr;
  int k = 0;
  float d = 0.0f;
};

// The number of cases a model gets wrong (bits compared; +0 and -0 are equal, NaN equals NaN),
// stopping early once `stop_after` are wrong.
std::int64_t fp8_dot_mismatches(const Fp8DotModel& model, std::span<const Fp8DotCase> cases, std::int64_t stop_after);

}  // namespace dsv4
