// Device twins of src/numerics: bf16 rounding, the power-of-two block scale, e4m3 / e2m1 /
// UE8M0 codecs, bit for bit the CPU's (numerics/bf16.h, block_quant.h, minifloat.h), plus the
// exact fp32 operations the reference's order of arithmetic needs (no fused multiply-adds
// where the CPU rounds each product: nvcc would otherwise contract a * b + c).
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/device.h"
#include "numerics/exp_float.h"

// Full unrolling of a constant-trip loop (register arrays indexed by its counter stay in
// registers); nothing for the host compiler of the simulator.
// DSV4_UNROLL_8 / _4: unrolled by 8 / 4 (a serial loop whose loads can be issued ahead).
#if defined(__CUDACC__)
#define DSV4_UNROLL _Pragma("unroll")
#define DSV4_UNROLL_8 _Pragma("unroll 8")
#define DSV4_UNROLL_4 _Pragma("unroll 4")
#else
#define DSV4_UNROLL
#define DSV4_UNROLL_8
#define DSV4_UNROLL_4
#endif

namespace dsv4::gpu {

inline constexpr float kFp8Max = 448.0f;
inline constexpr float kFp4Max = 6.0f;
inline constexpr float kFp8AmaxFloor = 1e-4f;
inline constexpr float kFp4AmaxFloor = 6.0f * 0x1p-126f;

// Exact fp32 arithmetic, one rounding per operation.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub_rn(float a, float b) { return __fadd_rn(a, -b); }

// ---- bf16 ------------------------------------------------------------------------------------
__device__ __forceinline__ std::uint16_t bf16_bits(float x) {
  std::uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
__device__ __forceinline__ float bf16_value(std::uint16_t bits) { return __uint_as_float(static_cast<std::uint32_t>(bits) << 16); }
__device__ __forceinline__ float round_bf16(float x) { return bf16_value(bf16_bits(x)); }
__device__ __forceinline__ float load_bf16(const std::uint16_t* p) { return bf16_value(*p); }
__device__ __forceinline__ void store_bf16(std::uint16_t* p, float x) { *p = bf16_bits(x); }

// ---- power-of-two block scale (block_quant.h pow2_block_scale) -------------------------------
// p = fp32(max(amax, floor) * fp32(1 / fmt_max)); scale = 2^(exponent of p), doubled when p's
// mantissa is not zero.
__device__ __forceinline__ float pow2_scale(float amax, float amax_floor, float fmt_max) {
  const float inv_max = 1.0f / fmt_max;  // a compile-time constant: fp32(1/448) or fp32(1/6)
  const float p = mul_rn(fmaxf(amax, amax_floor), inv_max);
  const std::uint32_t bits = __float_as_uint(p);
  const std::uint32_t exp = (bits >> 23) & 0xffu;
  const std::uint32_t scale_exp = exp + ((bits & 0x7fffffu) != 0 ? 1u : 0u);
  return __uint_as_float(scale_exp << 23);
}
__device__ __forceinline__ float fp8_scale(float amax) { return pow2_scale(amax, kFp8AmaxFloor, kFp8Max); }
__device__ __forceinline__ float fp4_scale(float amax) { return pow2_scale(amax, kFp4AmaxFloor, kFp4Max); }
// The UE8M0 byte of a power-of-two scale in [2^-126, 2^127] (2^-127 is byte 0).
__device__ __forceinline__ std::uint8_t ue8m0_byte(float scale) {
  const std::uint32_t u = __float_as_uint(scale);
  return u == 0x00400000u ? std::uint8_t{0} : static_cast<std::uint8_t>((u >> 23) & 0xffu);
}
// Byte 0xff is NaN. Selects, not branches (a scale byte per 16 or 32 values in hot loops).
__device__ __forceinline__ float ue8m0_value(std::uint8_t e) {
  std::uint32_t bits = static_cast<std::uint32_t>(e) << 23;
  bits = e == 0 ? 0x00400000u : bits;
  bits = e == 0xff ? 0x7fc00000u : bits;
  return __uint_as_float(bits);
}

// ---- e4m3 / e2m1 (minifloat.h round_to_minifloat) -------------------------------------------
template <int kMantBits, int kMinExp>
__device__ __forceinline__ std::uint32_t round_to_minifloat(float a) {
  const std::uint32_t u = __float_as_uint(a);
  const int biased = static_cast<int>(u >> 23);
  const int e = biased - 127;
  if (e >= kMinExp) {
    constexpr int kShift = 23 - kMantBits;
    const std::uint32_t r = u + ((1u << (kShift - 1)) - 1u) + ((u >> kShift) & 1u);
    return (r >> kShift) - (static_cast<std::uint32_t>(127 + kMinExp - 1) << kMantBits);
  }
  const std::uint32_t sig = biased == 0 ? (u & 0x7fffffu) : ((u & 0x7fffffu) | 0x800000u);
  const int exp = biased == 0 ? -126 : e;
  const int k = 23 + kMinExp - kMantBits - exp;
  if (k > 24) return 0;
  const std::uint32_t q = sig >> k;
  const std::uint32_t rem = sig & ((1u << k) - 1u);
  const std::uint32_t half = 1u << (k - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

// e4m3 code of x (saturating to +-448, NaN -> 0x7f), as numerics/fp8_e4m3.cc f32_to_e4m3.
__device__ __forceinline__ std::uint8_t e4m3_code(float x) {
  const std::uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7f;
  const std::uint8_t sign = (u >> 31) ? 0x80 : 0x00;
  const float a = __uint_as_float(u & 0x7fffffffu);
  if (a >= kFp8Max) return sign | 0x7e;
  return static_cast<std::uint8_t>(sign | round_to_minifloat<3, -6>(a));
}
// e2m1 code 0..15 of x (saturating to +-6, NaN -> 7).
__device__ __forceinline__ std::uint8_t e2m1_code(float x) {
  const std::uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7;
  const std::uint8_t sign = (u >> 31) ? 0x8 : 0x0;
  const float a = __uint_as_float(u & 0x7fffffffu);
  if (a >= kFp4Max) return sign | 0x7;
  return static_cast<std::uint8_t>(sign | round_to_minifloat<1, 0>(a));
}

__device__ __forceinline__ float e4m3_value(std::uint8_t code) {
  const std::uint32_t exp = (code >> 3) & 0xfu, mant = code & 7u;
  float mag;
  if (exp == 15 && mant == 7) {
    mag = __uint_as_float(0x7fc00000u);
  } else if (exp == 0) {
    mag = static_cast<float>(mant) * 0x1p-9f;
  } else {
    mag = __uint_as_float(((exp + 120u) << 23) | (mant << 20));
  }
  return (code & 0x80) ? -mag : mag;
}
__device__ __forceinline__ float e2m1_value(std::uint8_t code) {
  const std::uint32_t mag = code & 7u;
  // 0, 0.5, 1, 1.5, 2, 3, 4, 6
  const float v = mag < 2 ? 0.5f * static_cast<float>(mag)
                          : __uint_as_float((((mag >> 1) + 126u) << 23) | ((mag & 1u) << 22));
  return (code & 8) ? -v : v;
}
// e2m1 codes as e4m3 bytes holding the value times 2^-6, by moving bits: e2m1's two exponent
// bits and one mantissa bit land on e4m3's two lowest exponent bits and its top mantissa bit, the
// sign on the sign. Exact for every code: the normal values 2^(e-1) (1 + m/2) become 2^(e-7)
// (1 + m/2), and e2m1's subnormal 0.5 becomes e4m3's subnormal 2^-7 (zero stays zero). Products
// of such bytes are multiplied by 64 once at the end (kFp4Rebuild). The fp4 GPU layout keeps
// value j of a word in the low nibble of byte j and value j + 4 in its high nibble
// (fp4_to_gpu_layout), so one word gives values 0..3 and 4..7 as two e4m3 words in order.
inline constexpr float kFp4Rebuild = 64.0f;
__device__ __forceinline__ std::uint32_t e2m1_low_nibbles_as_e4m3(std::uint32_t w) {
  return ((w << 2) & 0x1c1c1c1cu) | ((w << 4) & 0x80808080u);
}
__device__ __forceinline__ std::uint32_t e2m1_high_nibbles_as_e4m3(std::uint32_t w) {
  return ((w >> 2) & 0x1c1c1c1cu) | (w & 0x80808080u);
}
// Either of the two, chosen per lane without a branch: the e4m3 bytes of a word's values 0..3
// (low nibbles: r1 = 2, r2 = 4) or 4..7 (high nibbles: r1 = 30, r2 = 0). Rotating by r1 puts the
// magnitude bits at 2..4 of each byte and by r2 the sign at bit 7 (what rotates around lands
// outside the masks).
__device__ __forceinline__ std::uint32_t e2m1_half_as_e4m3(std::uint32_t w, unsigned r1, unsigned r2) {
  return (__funnelshift_l(w, w, r1) & 0x1c1c1c1cu) | (__funnelshift_l(w, w, r2) & 0x80808080u);
}

// The values of the four UE8M0 bytes of a word (byte s -> scale[s]). Bytes 1..254 are exact
// exponent fields; 0 (2^-127, a subnormal) and 255 (NaN) take ue8m0_value, in a branch that
// real checkpoints never enter. kNormalOnly: the caller knows every byte is 1..254 (a weight
// checked once by fp4_scales_normal), so the test is left out.
template <bool kNormalOnly = false>
__device__ __forceinline__ void ue8m0x4_values(std::uint32_t word, float (&scale)[4]) {
  scale[0] = __uint_as_float((word << 23) & 0x7f800000u);
  scale[1] = __uint_as_float((word << 15) & 0x7f800000u);
  scale[2] = __uint_as_float((word << 7) & 0x7f800000u);
  scale[3] = __uint_as_float((word >> 1) & 0x7f800000u);
  if constexpr (!kNormalOnly) {
    const std::uint32_t zero_byte = (word - 0x01010101u) & ~word & 0x80808080u;
    const std::uint32_t ff_byte = (~word - 0x01010101u) & word & 0x80808080u;
    if ((zero_byte | ff_byte) != 0) {
      DSV4_UNROLL
      for (int s = 0; s < 4; ++s) scale[s] = ue8m0_value(static_cast<std::uint8_t>(word >> (8 * s)));
    }
  }
}

// Two e4m3 codes (the low 16 bits) times a power-of-two scale, as two bf16 (low half = low
// byte): exact, as the tile kernels' bf16_bits(e4m3_value(code) * scale). The device converts
// with the hardware's e4m3 -> f16 instruction (every e4m3 value is a normal f16 or zero).
__device__ __forceinline__ std::uint32_t e4m3x2_to_bf16x2(std::uint32_t codes, float scale) {
#if defined(__CUDA_ARCH__)
  std::uint32_t h2;
  const unsigned short in = static_cast<unsigned short>(codes);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(in));
  float lo, hi;
  asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(static_cast<unsigned short>(h2 & 0xffffu)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(static_cast<unsigned short>(h2 >> 16)));
  std::uint32_t out;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(hi * scale), "f"(lo * scale));
  return out;
#else
  const std::uint32_t lo = bf16_bits(e4m3_value(static_cast<std::uint8_t>(codes & 0xffu)) * scale);
  const std::uint32_t hi = bf16_bits(e4m3_value(static_cast<std::uint8_t>((codes >> 8) & 0xffu)) * scale);
  return lo | (hi << 16);
#endif
}

// Two e4m3 codes (the low 16 bits) as two f16 (low half = low byte): exact (every e4m3 value is
// a normal f16 or zero; NaN stays NaN). The device's conversion instruction; the simulator's by
// the value.
__device__ __forceinline__ std::uint32_t e4m3x2_to_f16x2(std::uint32_t codes) {
#if defined(__CUDA_ARCH__)
  std::uint32_t h2;
  const unsigned short in = static_cast<unsigned short>(codes);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(in));
  return h2;
#else
  auto half_bits = [](std::uint8_t code) -> std::uint32_t {
    const float v = e4m3_value(code);
    const std::uint32_t sign = (code & 0x80u) != 0 ? 0x8000u : 0u;
    if (v != v) return 0x7E00u;
    if (v == 0.0f) return sign;
    int e = 0;
    const float f = std::frexp(std::fabs(v), &e);  // |v| = f 2^e, f in [0.5, 1)
    return sign | (static_cast<std::uint32_t>(e - 1 + 15) << 10) | static_cast<std::uint32_t>((2.0f * f - 1.0f) * 1024.0f);
  };
  return half_bits(static_cast<std::uint8_t>(codes & 0xffu)) | (half_bits(static_cast<std::uint8_t>((codes >> 8) & 0xffu)) << 16);
#endif
}

// A UE8M0 scale exponent e (2^(e - 127)) as the bf16 pair 2^(e - 15) | 2^(e - 15), the factor
// e4m3x2_to_bf16x2_pow2 takes. For e in [15, 142] (the caller checks; it is a normal bf16).
__device__ __forceinline__ std::uint32_t ue8m0_pow2_factor(std::uint32_t e) {
  const std::uint32_t b = (e + 112u) << 7;
  return b | (b << 16);
}

// Whether the four UE8M0 exponents (bytes) of `word` all lie in [15, 142], where
// ue8m0_pow2_factor is defined: a byte b does iff (b >= 128) differs from (b & 127 >= 15), and
// adding 113 to the low 7 bits of every byte at once carries into bit 7 exactly when b & 127 >= 15.
__device__ __forceinline__ bool ue8m0x4_in_pow2_range(std::uint32_t word) {
  return (((word & 0x80808080u) ^ ((word & 0x7f7f7f7fu) + 0x71717171u)) & 0x80808080u) == 0x80808080u;
}

// Two e4m3 codes (the low 16 bits) times the power of two 2^(e - 127) as two bf16 (low half =
// low byte), for the factor ue8m0_pow2_factor(e), e in [15, 142]: exact, the same bits as
// e4m3x2_to_bf16x2. An e4m3 value is a normal f16 with three mantissa bits (or zero), so its f16
// magnitude shifted right by 3 is a bf16 of the value times 2^-112 (the exponent field keeps its
// bits, bias 15 read as bias 127); one bf16x2 multiply by 2^(e - 15) then scales it, exactly, as
// the products stay normal. Five instructions a pair instead of six. The NaN codes (0x7f, 0xff)
// come out finite here, where e4m3x2_to_bf16x2 keeps them NaN.
__device__ __forceinline__ std::uint32_t e4m3x2_to_bf16x2_pow2(std::uint32_t codes, std::uint32_t factor) {
  const std::uint32_t h = e4m3x2_to_f16x2(codes);
  const std::uint32_t bits = ((h & 0x7fff7fffu) >> 3) | (h & 0x80008000u);
#if defined(__CUDA_ARCH__)
  std::uint32_t out;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(out) : "r"(bits), "r"(factor));
  return out;
#else
  auto half = [](std::uint32_t b) { return __uint_as_float((b & 0xffffu) << 16); };
  return static_cast<std::uint32_t>(bf16_bits(half(bits) * half(factor))) |
         (static_cast<std::uint32_t>(bf16_bits(half(bits >> 16) * half(factor >> 16))) << 16);
#endif
}

// Two floats rounded to bf16 (round to nearest even, as bf16_bits; a NaN stays a NaN but may lose
// its payload), packed with `lo` in the low half: the hardware's conversion on the device.
__device__ __forceinline__ std::uint32_t pack_bf16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  std::uint32_t out;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(hi), "f"(lo));
  return out;
#else
  return static_cast<std::uint32_t>(bf16_bits(lo)) | (static_cast<std::uint32_t>(bf16_bits(hi)) << 16);
#endif
}

// Quantized value of x under `inv_scale` (= 1 / scale, exact for powers of two): the code of
// the clamped product, as block_quant.cc encode_scaled.
__device__ __forceinline__ std::uint8_t fp8_encode_scaled(float x, float inv_scale) { return e4m3_code(mul_rn(x, inv_scale)); }
__device__ __forceinline__ std::uint8_t fp4_encode_scaled(float x, float inv_scale) { return e2m1_code(mul_rn(x, inv_scale)); }

// Word j (0..3) of a 16-byte vector.
__device__ __forceinline__ std::uint32_t word_of(const uint4& v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }

// Byte j (0..15) of a 16-byte vector (little-endian words, as in memory).
__device__ __forceinline__ std::uint32_t byte_of(const uint4& v, int j) {
  const std::uint32_t w = j < 4 ? v.x : j < 8 ? v.y : j < 12 ? v.z : v.w;
  return (w >> (8 * (j & 3))) & 0xffu;
}

__device__ __forceinline__ float sigmoid_ref(float z) { return 1.0f / (1.0f + exp_float(-z)); }
__device__ __forceinline__ float silu_ref(float z) { return z / (1.0f + exp_float(-z)); }

}  // namespace dsv4::gpu
