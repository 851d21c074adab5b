// exp_float: the single-precision exponential both executors use (softmax of attention and of
// the compressors, sigmoids of the hyper-connections, SiLU, softplus), so that the CPU executor
// and the GPU kernels produce the same bits from the same inputs. The C library's expf and
// CUDA's expf differ in the last bit for a good share of inputs, and one ulp in a probability
// that is then rounded to bf16, or in a value quantized to FP8, is enough to move a result by a
// whole quantization step (docs/NUMERICS.md, "Why comparisons go block by block").
//
// Algorithm (fp32 throughout, every operation rounded on its own -- no fused multiply-adds):
//   k = rint(x * log2(e)); r = (x - k * ln2_hi) - k * ln2_lo   (Cody-Waite: k * ln2_hi is exact)
//   exp(r) = 1 + r + r^2/2! + ... + r^7/7!                      (Horner, |r| <= 0.35)
//   exp(x) = ldexp(exp(r), k)                                   (exact scaling; IEEE underflow)
// Within 2 ulp of the true value (tests/numerics/test_exp_float.cc); exp(+-inf), NaN and the
// overflow / underflow ranges behave like expf.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define DSV4_HOST_DEVICE __host__ __device__
#else
#define DSV4_HOST_DEVICE
#endif

namespace dsv4 {
namespace exp_float_detail {

// One rounding per operation on the device too (nvcc would contract a * b + c into an fma).
DSV4_HOST_DEVICE inline float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
DSV4_HOST_DEVICE inline float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

}  // namespace exp_float_detail

DSV4_HOST_DEVICE inline float exp_float(float x) {
  using exp_float_detail::add;
  using exp_float_detail::mul;
  if (x != x) return x;                          // NaN
  if (x > 88.8f) return HUGE_VALF;               // exp(88.8) > FLT_MAX
  if (x < -104.0f) return 0.0f;                  // below half the smallest subnormal
  const float k = rintf(mul(x, 1.44269502f));    // round half to even
  const float r = add(add(x, -mul(k, 0.693359375f)), -mul(k, -2.12194440e-4f));
  float p = 1.98412698e-4f;                      // 1/7!
  p = add(mul(p, r), 1.38888889e-3f);            // 1/6!
  p = add(mul(p, r), 8.33333333e-3f);            // 1/5!
  p = add(mul(p, r), 4.16666667e-2f);            // 1/4!
  p = add(mul(p, r), 1.66666667e-1f);            // 1/3!
  p = add(mul(p, r), 0.5f);
  p = add(mul(p, r), 1.0f);
  p = add(mul(p, r), 1.0f);
  return ldexpf(p, static_cast<int>(k));
}

}  // namespace dsv4
