// Simulator: CUDA's built-in vector types, dim3, and the bf16 types of <cuda_bf16.h>, for .cu files
// compiled by the host compiler. Included by cuda/sim/simt.h; do not include directly.
#pragma once

#include <bit>
#include <cstdint>

// ---- vector types (same members, sizes and alignments as CUDA's vector_types.h) ----
#define DSV4_SIM_VEC2(T, N, A)                                        \
  struct alignas(A) N##2 {                                           \
    T x, y;                                                          \
  };                                                                 \
  inline constexpr N##2 make_##N##2(T x, T y) { return N##2{x, y}; }
#define DSV4_SIM_VEC3(T, N)                                                      \
  struct N##3 {                                                                 \
    T x, y, z;                                                                  \
  };                                                                            \
  inline constexpr N##3 make_##N##3(T x, T y, T z) { return N##3{x, y, z}; }
#define DSV4_SIM_VEC4(T, N, A)                                                            \
  struct alignas(A) N##4 {                                                               \
    T x, y, z, w;                                                                        \
  };                                                                                     \
  inline constexpr N##4 make_##N##4(T x, T y, T z, T w) { return N##4{x, y, z, w}; }

DSV4_SIM_VEC2(signed char, char, 2)
DSV4_SIM_VEC4(signed char, char, 4)
DSV4_SIM_VEC2(unsigned char, uchar, 2)
DSV4_SIM_VEC4(unsigned char, uchar, 4)
DSV4_SIM_VEC2(short, short, 4)
DSV4_SIM_VEC4(short, short, 8)
DSV4_SIM_VEC2(unsigned short, ushort, 4)
DSV4_SIM_VEC4(unsigned short, ushort, 8)
DSV4_SIM_VEC2(int, int, 8)
DSV4_SIM_VEC3(int, int)
DSV4_SIM_VEC4(int, int, 16)
DSV4_SIM_VEC2(unsigned int, uint, 8)
DSV4_SIM_VEC3(unsigned int, uint)
DSV4_SIM_VEC4(unsigned int, uint, 16)
DSV4_SIM_VEC2(long long, longlong, 16)
DSV4_SIM_VEC2(unsigned long long, ulonglong, 16)
DSV4_SIM_VEC2(float, float, 8)
DSV4_SIM_VEC3(float, float)
DSV4_SIM_VEC4(float, float, 16)
DSV4_SIM_VEC2(double, double, 16)

#undef DSV4_SIM_VEC2
#undef DSV4_SIM_VEC3
#undef DSV4_SIM_VEC4

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

// ---- bf16 (<cuda_bf16.h>) ----
// Conversions round to nearest even; NaN becomes the canonical NaN 0x7fff, as CUDA's conversion does.
// Arithmetic operators compute in fp32 and round once to bf16: fp32 has more than 2*8+2 significand
// bits, so this equals bf16 arithmetic rounded correctly (what sm_90's bf16 instructions do).

namespace dsv4::gpu::sim {
inline std::uint16_t float_to_bf16_rn(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
inline std::uint16_t float_to_bf16_rz(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  return static_cast<std::uint16_t>(u >> 16);
}
// double -> bf16 with a single rounding: round to float with the lost bits folded into a sticky
// bit (round to odd), then round to nearest even.
inline std::uint16_t double_to_bf16_rn(double d) {
  float f = static_cast<float>(d);
  if (f != f) return 0x7fff;
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const double back = static_cast<double>(f);
  if (back != d && (u & 0x7fffffffu) != 0x7f800000u) {
    // f was rounded: step back toward d if it was rounded away, then set the sticky bit.
    if ((d > 0 && back > d) || (d < 0 && back < d)) --u;
    u |= 1u;
  }
  return float_to_bf16_rn(std::bit_cast<float>(u));
}
inline float bf16_to_float(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }
}  // namespace dsv4::gpu::sim

struct __nv_bfloat16_raw {
  unsigned short x;
};

struct __nv_bfloat16 {
  __nv_bfloat16() = default;
  constexpr __nv_bfloat16(__nv_bfloat16_raw r) : bits_(r.x) {}
  __nv_bfloat16(float f) : bits_(dsv4::gpu::sim::float_to_bf16_rn(f)) {}
  __nv_bfloat16(double d) : bits_(dsv4::gpu::sim::double_to_bf16_rn(d)) {}
  __nv_bfloat16(short v) : __nv_bfloat16(static_cast<double>(v)) {}
  __nv_bfloat16(unsigned short v) : __nv_bfloat16(static_cast<double>(v)) {}
  __nv_bfloat16(int v) : __nv_bfloat16(static_cast<double>(v)) {}
  __nv_bfloat16(unsigned int v) : __nv_bfloat16(static_cast<double>(v)) {}
  __nv_bfloat16(long long v) : __nv_bfloat16(static_cast<double>(v)) {}
  __nv_bfloat16(unsigned long long v) : __nv_bfloat16(static_cast<double>(v)) {}

  operator float() const { return dsv4::gpu::sim::bf16_to_float(bits_); }
  constexpr operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{bits_}; }
  __nv_bfloat16& operator=(__nv_bfloat16_raw r) {
    bits_ = r.x;
    return *this;
  }

 private:
  unsigned short bits_;
};

struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
  __nv_bfloat162() = default;
  constexpr __nv_bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) : x(a), y(b) {}
};

inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16_raw{dsv4::gpu::sim::float_to_bf16_rn(f)}; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16_raw{dsv4::gpu::sim::float_to_bf16_rn(f)}; }
inline __nv_bfloat16 __float2bfloat16_rz(float f) { return __nv_bfloat16_raw{dsv4::gpu::sim::float_to_bf16_rz(f)}; }
inline __nv_bfloat16 __double2bfloat16(double d) { return __nv_bfloat16_raw{dsv4::gpu::sim::double_to_bf16_rn(d)}; }
inline float __bfloat162float(__nv_bfloat16 h) { return static_cast<float>(h); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return static_cast<__nv_bfloat16_raw>(h).x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short b) { return __nv_bfloat16_raw{b}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return __nv_bfloat162(__float2bfloat16_rn(a), __float2bfloat16_rn(b));
}
inline __nv_bfloat162 __float2bfloat162_rn(float a) { return __floats2bfloat162_rn(a, a); }
inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat162(a, b); }
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return float2{float(h.x), float(h.y)}; }
inline float __low2float(__nv_bfloat162 h) { return float(h.x); }
inline float __high2float(__nv_bfloat162 h) { return float(h.y); }
inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 h) { return h.x; }
inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 h) { return h.y; }
inline bool __hisnan(__nv_bfloat16 h) { return (__bfloat16_as_ushort(h) & 0x7fffu) > 0x7f80u; }

// Arithmetic: fp32 then one rounding to bf16 (see above).
inline __nv_bfloat16 operator+(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat16(float(a) + float(b)); }
inline __nv_bfloat16 operator-(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat16(float(a) - float(b)); }
inline __nv_bfloat16 operator*(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat16(float(a) * float(b)); }
inline __nv_bfloat16 operator/(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat16(float(a) / float(b)); }
inline __nv_bfloat16& operator+=(__nv_bfloat16& a, __nv_bfloat16 b) { return a = a + b; }
inline __nv_bfloat16& operator-=(__nv_bfloat16& a, __nv_bfloat16 b) { return a = a - b; }
inline __nv_bfloat16& operator*=(__nv_bfloat16& a, __nv_bfloat16 b) { return a = a * b; }
inline __nv_bfloat16& operator/=(__nv_bfloat16& a, __nv_bfloat16 b) { return a = a / b; }
inline __nv_bfloat16 operator+(__nv_bfloat16 a) { return a; }
inline __nv_bfloat16 operator-(__nv_bfloat16 a) {
  return __ushort_as_bfloat16(static_cast<unsigned short>(__bfloat16_as_ushort(a) ^ 0x8000u));
}
inline bool operator==(__nv_bfloat16 a, __nv_bfloat16 b) { return float(a) == float(b); }
inline bool operator!=(__nv_bfloat16 a, __nv_bfloat16 b) { return float(a) != float(b); }
inline bool operator<(__nv_bfloat16 a, __nv_bfloat16 b) { return float(a) < float(b); }
inline bool operator>(__nv_bfloat16 a, __nv_bfloat16 b) { return float(a) > float(b); }
inline bool operator<=(__nv_bfloat16 a, __nv_bfloat16 b) { return float(a) <= float(b); }
inline bool operator>=(__nv_bfloat16 a, __nv_bfloat16 b) { return float(a) >= float(b); }
inline __nv_bfloat162 operator+(__nv_bfloat162 a, __nv_bfloat162 b) { return {a.x + b.x, a.y + b.y}; }
inline __nv_bfloat162 operator-(__nv_bfloat162 a, __nv_bfloat162 b) { return {a.x - b.x, a.y - b.y}; }
inline __nv_bfloat162 operator*(__nv_bfloat162 a, __nv_bfloat162 b) { return {a.x * b.x, a.y * b.y}; }
inline __nv_bfloat162 operator/(__nv_bfloat162 a, __nv_bfloat162 b) { return {a.x / b.x, a.y / b.y}; }

static_assert(sizeof(__nv_bfloat16) == 2 && alignof(__nv_bfloat16) == 2);
static_assert(sizeof(__nv_bfloat162) == 4 && alignof(__nv_bfloat162) == 4);
static_assert(sizeof(float4) == 16 && alignof(float4) == 16 && alignof(uint2) == 8);
