// Simulator: CUDA's device math, integer and bit intrinsics, min/max overloads, atomics and cache
// hinted loads, for .cu files compiled by the host compiler. Included by cuda/sim/simt.h.
//
// The fast-math intrinsics (__expf, __logf, __fdividef, rsqrtf, ...) are the precise functions here:
// results can differ from the GPU's approximations by a few ulp, so compare such kernels with a
// tolerance. Atomics are plain read-modify-writes: simulated threads switch only at barriers and
// warp collectives, so nothing can interleave with them.
#pragma once

#include <math.h>  // the float functions in the global namespace, as CUDA has them (expf, sincosf, ...)

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

// ---- float intrinsics ----
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float rcbrtf(float x) { return 1.0f / cbrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return powf(10.0f, x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline void __sincosf(float x, float* s, float* c) {
  *s = sinf(x);
  *c = cosf(x);
}
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __saturatef(float x) {  // clamp to [0, 1]; NaN -> 0
  return x >= 1.0f ? 1.0f : (x > 0.0f ? x : 0.0f);
}

// ---- float <-> int conversions (saturating; NaN -> 0, as cvt.rni/rzi.s32.f32) ----
namespace dsv4::gpu::sim {
template <class I>
inline I saturate_to(float r) {
  if (r != r) return 0;
  constexpr double lo = static_cast<double>(std::numeric_limits<I>::min());
  constexpr double hi = static_cast<double>(std::numeric_limits<I>::max());
  if (static_cast<double>(r) <= lo) return std::numeric_limits<I>::min();
  if (static_cast<double>(r) >= hi) return std::numeric_limits<I>::max();
  return static_cast<I>(r);
}
}  // namespace dsv4::gpu::sim
inline int __float2int_rn(float x) { return dsv4::gpu::sim::saturate_to<int>(nearbyintf(x)); }
inline int __float2int_rz(float x) { return dsv4::gpu::sim::saturate_to<int>(truncf(x)); }
inline int __float2int_rd(float x) { return dsv4::gpu::sim::saturate_to<int>(floorf(x)); }
inline int __float2int_ru(float x) { return dsv4::gpu::sim::saturate_to<int>(ceilf(x)); }
inline unsigned int __float2uint_rn(float x) { return dsv4::gpu::sim::saturate_to<unsigned int>(nearbyintf(x)); }
inline unsigned int __float2uint_rz(float x) { return dsv4::gpu::sim::saturate_to<unsigned int>(truncf(x)); }
inline long long __float2ll_rn(float x) { return dsv4::gpu::sim::saturate_to<long long>(nearbyintf(x)); }
inline long long __float2ll_rz(float x) { return dsv4::gpu::sim::saturate_to<long long>(truncf(x)); }
inline float __int2float_rn(int x) { return static_cast<float>(x); }
inline float __uint2float_rn(unsigned int x) { return static_cast<float>(x); }

// ---- bit casts ----
inline unsigned int __float_as_uint(float x) { return std::bit_cast<unsigned int>(x); }
inline float __uint_as_float(unsigned int x) { return std::bit_cast<float>(x); }
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }

// ---- integer intrinsics ----
inline int __clz(int x) { return std::countl_zero(static_cast<unsigned int>(x)); }
inline int __clzll(long long x) { return std::countl_zero(static_cast<unsigned long long>(x)); }
inline int __popc(unsigned int x) { return std::popcount(x); }
inline int __popcll(unsigned long long x) { return std::popcount(x); }
inline int __ffs(int x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned int>(x)) + 1; }
inline int __ffsll(long long x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned long long>(x)) + 1; }
inline unsigned int __brev(unsigned int x) {
  unsigned int r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
inline unsigned long long __brevll(unsigned long long x) {
  return (static_cast<unsigned long long>(__brev(static_cast<unsigned int>(x))) << 32) |
         __brev(static_cast<unsigned int>(x >> 32));
}
// Byte i of the result is byte (s >> 4i) & 7 of the 8-byte value {y, x} (CUDA's documented semantics).
inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
  const unsigned long long v = (static_cast<unsigned long long>(y) << 32) | x;
  unsigned int r = 0;
  for (int i = 0; i < 4; ++i) {
    const unsigned int sel = (s >> (4 * i)) & 7u;
    r |= static_cast<unsigned int>((v >> (8 * sel)) & 0xffu) << (8 * i);
  }
  return r;
}
// The high (l) / low (r) 32 bits of the 64-bit {hi, lo} shifted by shift & 31.
inline unsigned int __funnelshift_l(unsigned int lo, unsigned int hi, unsigned int shift) {
  const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
  return static_cast<unsigned int>((v << (shift & 31u)) >> 32);
}
inline unsigned int __funnelshift_r(unsigned int lo, unsigned int hi, unsigned int shift) {
  const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
  return static_cast<unsigned int>(v >> (shift & 31u));
}
// Clamped variants: the shift is min(shift, 32).
inline unsigned int __funnelshift_lc(unsigned int lo, unsigned int hi, unsigned int shift) {
  const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
  return static_cast<unsigned int>((v << (shift < 32u ? shift : 32u)) >> 32);
}
inline unsigned int __funnelshift_rc(unsigned int lo, unsigned int hi, unsigned int shift) {
  const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
  return static_cast<unsigned int>(v >> (shift < 32u ? shift : 32u));
}
inline unsigned int __umulhi(unsigned int a, unsigned int b) {
  return static_cast<unsigned int>((static_cast<unsigned long long>(a) * b) >> 32);
}
inline int __mulhi(int a, int b) { return static_cast<int>((static_cast<long long>(a) * b) >> 32); }
namespace dsv4::gpu::sim {
__extension__ typedef unsigned __int128 u128;
__extension__ typedef __int128 i128;
}  // namespace dsv4::gpu::sim
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return static_cast<unsigned long long>((static_cast<dsv4::gpu::sim::u128>(a) * b) >> 64);
}
inline long long __mul64hi(long long a, long long b) {
  return static_cast<long long>((static_cast<dsv4::gpu::sim::i128>(a) * b) >> 64);
}

// ---- min / max: CUDA's device overloads ----
inline int min(int a, int b) { return a < b ? a : b; }
inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
inline unsigned int min(int a, unsigned int b) { return min(static_cast<unsigned int>(a), b); }
inline unsigned int min(unsigned int a, int b) { return min(a, static_cast<unsigned int>(b)); }
inline long min(long a, long b) { return a < b ? a : b; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline unsigned long min(long a, unsigned long b) { return min(static_cast<unsigned long>(a), b); }
inline unsigned long min(unsigned long a, long b) { return min(a, static_cast<unsigned long>(b)); }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long min(long long a, unsigned long long b) { return min(static_cast<unsigned long long>(a), b); }
inline unsigned long long min(unsigned long long a, long long b) { return min(a, static_cast<unsigned long long>(b)); }
inline float min(float a, float b) { return fminf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double min(float a, double b) { return fmin(static_cast<double>(a), b); }
inline double min(double a, float b) { return fmin(a, static_cast<double>(b)); }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
inline unsigned int max(int a, unsigned int b) { return max(static_cast<unsigned int>(a), b); }
inline unsigned int max(unsigned int a, int b) { return max(a, static_cast<unsigned int>(b)); }
inline long max(long a, long b) { return a > b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
inline unsigned long max(long a, unsigned long b) { return max(static_cast<unsigned long>(a), b); }
inline unsigned long max(unsigned long a, long b) { return max(a, static_cast<unsigned long>(b)); }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline unsigned long long max(long long a, unsigned long long b) { return max(static_cast<unsigned long long>(a), b); }
inline unsigned long long max(unsigned long long a, long long b) { return max(a, static_cast<unsigned long long>(b)); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
inline double max(float a, double b) { return fmax(static_cast<double>(a), b); }
inline double max(double a, float b) { return fmax(a, static_cast<double>(b)); }

// ---- loads with cache hints: plain loads and stores here ----
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
template <class T>
inline T __ldcg(const T* p) {
  return *p;
}
template <class T>
inline T __ldca(const T* p) {
  return *p;
}
template <class T>
inline T __ldcs(const T* p) {
  return *p;
}
template <class T>
inline T __ldlu(const T* p) {
  return *p;
}
template <class T>
inline T __ldcv(const T* p) {
  return *p;
}
template <class T>
inline void __stcg(T* p, T v) {
  *p = v;
}
template <class T>
inline void __stcs(T* p, T v) {
  *p = v;
}
template <class T>
inline void __stwb(T* p, T v) {
  *p = v;
}
template <class T>
inline void __stwt(T* p, T v) {
  *p = v;
}

// ---- atomics (return the old value, as CUDA's) ----
namespace dsv4::gpu::sim {
template <class T, class F>
inline T atomic_rmw(T* address, F op) {
  const T old = *address;
  *address = op(old);
  return old;
}
}  // namespace dsv4::gpu::sim

#define DSV4_SIM_ATOMIC(NAME, T, EXPR) \
  inline T NAME(T* address, T val) { return dsv4::gpu::sim::atomic_rmw(address, [val](T old) { return EXPR; }); }

// Integer sums wrap (done in unsigned arithmetic: signed overflow would be undefined in C++).
DSV4_SIM_ATOMIC(atomicAdd, int, static_cast<int>(static_cast<unsigned int>(old) + static_cast<unsigned int>(val)))
DSV4_SIM_ATOMIC(atomicAdd, unsigned int, old + val)
DSV4_SIM_ATOMIC(atomicAdd, unsigned long long, old + val)
DSV4_SIM_ATOMIC(atomicAdd, float, old + val)
DSV4_SIM_ATOMIC(atomicAdd, double, old + val)
DSV4_SIM_ATOMIC(atomicSub, int, static_cast<int>(static_cast<unsigned int>(old) - static_cast<unsigned int>(val)))
DSV4_SIM_ATOMIC(atomicSub, unsigned int, old - val)
DSV4_SIM_ATOMIC(atomicExch, int, (static_cast<void>(old), val))
DSV4_SIM_ATOMIC(atomicExch, unsigned int, (static_cast<void>(old), val))
DSV4_SIM_ATOMIC(atomicExch, unsigned long long, (static_cast<void>(old), val))
DSV4_SIM_ATOMIC(atomicExch, float, (static_cast<void>(old), val))
DSV4_SIM_ATOMIC(atomicMin, int, old < val ? old : val)
DSV4_SIM_ATOMIC(atomicMin, unsigned int, old < val ? old : val)
DSV4_SIM_ATOMIC(atomicMin, long long, old < val ? old : val)
DSV4_SIM_ATOMIC(atomicMin, unsigned long long, old < val ? old : val)
DSV4_SIM_ATOMIC(atomicMax, int, old > val ? old : val)
DSV4_SIM_ATOMIC(atomicMax, unsigned int, old > val ? old : val)
DSV4_SIM_ATOMIC(atomicMax, long long, old > val ? old : val)
DSV4_SIM_ATOMIC(atomicMax, unsigned long long, old > val ? old : val)
DSV4_SIM_ATOMIC(atomicAnd, int, old & val)
DSV4_SIM_ATOMIC(atomicAnd, unsigned int, old & val)
DSV4_SIM_ATOMIC(atomicAnd, unsigned long long, old & val)
DSV4_SIM_ATOMIC(atomicOr, int, old | val)
DSV4_SIM_ATOMIC(atomicOr, unsigned int, old | val)
DSV4_SIM_ATOMIC(atomicOr, unsigned long long, old | val)
DSV4_SIM_ATOMIC(atomicXor, int, old ^ val)
DSV4_SIM_ATOMIC(atomicXor, unsigned int, old ^ val)
DSV4_SIM_ATOMIC(atomicXor, unsigned long long, old ^ val)
// atomicInc: old >= val ? 0 : old + 1; atomicDec: (old == 0 || old > val) ? val : old - 1.
DSV4_SIM_ATOMIC(atomicInc, unsigned int, old >= val ? 0u : old + 1u)
DSV4_SIM_ATOMIC(atomicDec, unsigned int, (old == 0u || old > val) ? val : old - 1u)
#undef DSV4_SIM_ATOMIC

#define DSV4_SIM_ATOMIC_CAS(T)                                 \
  inline T atomicCAS(T* address, T compare, T val) {          \
    const T old = *address;                                   \
    if (old == compare) *address = val;                       \
    return old;                                               \
  }
DSV4_SIM_ATOMIC_CAS(int)
DSV4_SIM_ATOMIC_CAS(unsigned int)
DSV4_SIM_ATOMIC_CAS(unsigned long long)
DSV4_SIM_ATOMIC_CAS(unsigned short)
#undef DSV4_SIM_ATOMIC_CAS
