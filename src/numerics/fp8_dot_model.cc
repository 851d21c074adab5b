#include "numerics/fp8_dot_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <climits>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace dsv4 {
namespace {

// A value ±sig x 2^x, sig an integer; `top` is where the model aligns it (the value is below 2^top).
struct Term {
  bool neg = false;
  std::uint64_t sig = 0;
  int x = 0;
  int top = 0;
};

// An e4m3 code as ±sig x 2^x: normal (8 + m) x 2^(e - 10), subnormal m x 2^-9.
Term e4m3_term(std::uint8_t code) {
  const int e = (code >> 3) & 15, m = code & 7;
  Term t;
  t.neg = (code & 0x80u) != 0;
  t.sig = static_cast<std::uint64_t>(e == 0 ? m : 8 + m);
  t.x = e == 0 ? -9 : e - 10;
  return t;
}

bool is_nan_code(std::uint8_t code) { return (code & 0x7fu) == 0x7fu; }

Term float_term(float v) {
  Term t;
  if (v == 0.0f) return t;
  int e = 0;
  const double f = std::frexp(static_cast<double>(v), &e);  // |f| in [0.5, 1)
  t.neg = f < 0;
  t.sig = static_cast<std::uint64_t>(std::ldexp(std::fabs(f), 24));  // exact: 24 significant bits at most
  t.x = e - 24;
  t.top = e;
  return t;
}

// ±mag x 2^lsb rounded to `bits` fraction bits (bits + 1 significant) as a float.
float round_to(bool neg, std::uint64_t mag, int lsb, int bits, Fp8DotModel::Rounding rounding) {
  if (mag == 0) return neg ? -0.0f : 0.0f;
  const int keep = bits + 1, n = std::bit_width(mag);
  if (n > keep) {
    const int drop = n - keep;
    const std::uint64_t low = mag & ((std::uint64_t{1} << drop) - 1), half = std::uint64_t{1} << (drop - 1);
    mag >>= drop;
    lsb += drop;
    switch (rounding) {
      case Fp8DotModel::Rounding::kTowardZero: break;
      case Fp8DotModel::Rounding::kNearestEven:
        if (low > half || (low == half && (mag & 1) != 0)) ++mag;
        break;
      case Fp8DotModel::Rounding::kFloor:
        if (neg && low != 0) ++mag;
        break;
    }
  }
  const float v = std::ldexp(static_cast<float>(mag), lsb);  // mag <= 2^24: exact
  return neg ? -v : v;
}

// The exact sum of two terms (signed), rounded to a float with `rounding` (the fp32 addition of
// the kAfter* accumulators). A term more than 30 bits below the other's top lies below the
// result's last bit and only decides the rounding, so it is replaced by one unit 31 bits below,
// keeping its sign (both terms then fit in 55 bits).
float add_rounded(Term p, Term q, Fp8DotModel::Rounding rounding) {
  if (p.sig == 0 && q.sig == 0) return (p.neg && q.neg) ? -0.0f : 0.0f;
  if (p.sig == 0) std::swap(p, q);
  if (q.sig == 0) return round_to(p.neg, p.sig, p.x, 23, rounding);
  const int top = std::max(p.top, q.top);
  for (Term* t : {&p, &q})
    if (t->top < top - 30) *t = Term{t->neg, 1, top - 31, top - 30};
  const int lsb = std::min(p.x, q.x);
  const std::uint64_t a = p.sig << (p.x - lsb), b = q.sig << (q.x - lsb);
  if (p.neg == q.neg) return round_to(p.neg, a + b, lsb, 23, rounding);
  if (a >= b) return round_to(p.neg, a - b, lsb, 23, rounding);
  return round_to(q.neg, b - a, lsb, 23, rounding);
}

// One fixed-point sum: the terms aligned on the largest top, each cut to `window_bits` below it,
// added exactly, the total rounded to the model's result bits.
float fixed_point_sum(const Fp8DotModel& m, std::span<const Term> terms) {
  int top = INT_MIN;
  for (const Term& t : terms)
    if (t.sig != 0) top = std::max(top, t.top);
  if (top == INT_MIN) return 0.0f;
  const int lsb = top - m.window_bits;
  std::int64_t total = 0;  // below 33 x 2^window_bits
  for (const Term& t : terms) {
    if (t.sig == 0) continue;
    const int shift = t.x - lsb;
    std::uint64_t q = 0;
    bool cut = false;
    if (shift >= 0) {
      q = t.sig << shift;  // below 2^window_bits: the term's top is at most `top`
    } else if (-shift < 64) {
      q = t.sig >> -shift;
      cut = (t.sig & ((std::uint64_t{1} << -shift) - 1)) != 0;
    } else {
      cut = true;
    }
    if (m.floor_shifts && t.neg && cut) ++q;
    total += t.neg ? -static_cast<std::int64_t>(q) : static_cast<std::int64_t>(q);
  }
  const bool neg = total < 0;
  return round_to(neg, static_cast<std::uint64_t>(neg ? -total : total), lsb, m.result_bits, m.result_rounding);
}

}  // namespace

float fp8_dot(const Fp8DotModel& m, float c, std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) {
  if (a.size() != b.size() || m.group <= 0 || m.group > 32 || a.size() % static_cast<std::size_t>(m.group) != 0)
    throw std::invalid_argument(fmt::format("fp8_dot: {} and {} values, group {}", a.size(), b.size(), m.group));
  if (m.window_bits < 1 || m.window_bits > 56 || m.result_bits < 1 || m.result_bits > 23)
    throw std::invalid_argument(fmt::format("fp8_dot: window {} bits, result {} bits", m.window_bits, m.result_bits));
  for (std::size_t i = 0; i < a.size(); ++i)
    if (is_nan_code(a[i]) || is_nan_code(b[i])) return std::numeric_limits<float>::quiet_NaN();
  if (!std::isfinite(c)) return c;
  static const std::array<Term, 256> decoded = [] {
    std::array<Term, 256> t;
    for (int code = 0; code < 256; ++code)
      t[static_cast<std::size_t>(code)] = e4m3_term(static_cast<std::uint8_t>(code));
    return t;
  }();
  const std::size_t group = static_cast<std::size_t>(m.group);
  std::array<Term, 33> terms;
  float acc = c;
  for (std::size_t g = 0; g < a.size(); g += group) {
    for (std::size_t i = 0; i < group; ++i) {
      const Term& ta = decoded[a[g + i]];
      const Term& tb = decoded[b[g + i]];
      Term& p = terms[i];
      p = Term{ta.neg != tb.neg, ta.sig * tb.sig, ta.x + tb.x, 0};
      p.top = m.align_on_field ? p.x + 8 : p.x + std::bit_width(p.sig);
    }
    if (m.accumulator == Fp8DotModel::Accumulator::kJoint) {
      terms[group] = float_term(acc);
      acc = fixed_point_sum(m, std::span<const Term>(terms).first(group + 1));
    } else {
      const float products = fixed_point_sum(m, std::span<const Term>(terms).first(group));
      const auto rounding = m.accumulator == Fp8DotModel::Accumulator::kAfterNearest
                                ? Fp8DotModel::Rounding::kNearestEven
                                : Fp8DotModel::Rounding::kTowardZero;
      acc = add_rounded(float_term(acc), float_term(products), rounding);
    }
  }
  return acc;
}

std::string describe(const Fp8DotModel& m) {
  const char* acc = m.accumulator == Fp8DotModel::Accumulator::kJoint          ? "C joint"
                    : m.accumulator == Fp8DotModel::Accumulator::kAfterNearest ? "C after (nearest)"
                                                                               : "C after (toward zero)";
  const char* rounding = m.result_rounding == Fp8DotModel::Rounding::kTowardZero    ? "toward zero"
                         : m.result_rounding == Fp8DotModel::Rounding::kNearestEven ? "nearest even"
                                                                                    : "floor";
  return fmt::format("window {}, cut {}, {} alignment, {}, groups of {}, result {} bits {}", m.window_bits,
                     m.floor_shifts ? "floor" : "toward zero", m.align_on_field ? "field" : "leading-one", acc, m.group,
                     m.result_bits, rounding);
}

std::vector<Fp8DotModel> fp8_dot_candidates() {
  std::vector<Fp8DotModel> out;
  for (int window : {12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 40})
    for (bool floor_shifts : {false, true})
      for (bool field : {true, false})
        for (auto acc : {Fp8DotModel::Accumulator::kJoint, Fp8DotModel::Accumulator::kAfterNearest,
                         Fp8DotModel::Accumulator::kAfterTowardZero})
          for (int group : {32, 16, 8, 4})
            for (int bits : {13, 14, 23})
              for (auto rounding : {Fp8DotModel::Rounding::kTowardZero, Fp8DotModel::Rounding::kNearestEven,
                                    Fp8DotModel::Rounding::kFloor})
                out.push_back(Fp8DotModel{window, floor_shifts, field, acc, group, bits, rounding});
  return out;
}

std::int64_t fp8_dot_mismatches(const Fp8DotModel& model, std::span<const Fp8DotCase> cases, std::int64_t stop_after) {
  std::int64_t wrong = 0;
  for (const Fp8DotCase& k : cases) {
    const auto n = static_cast<std::size_t>(k.k);
    const float got = fp8_dot(model, k.c, {k.a, n}, {k.b, n});
    const bool same = (std::isnan(got) && std::isnan(k.d)) || got == k.d;  // +0 == -0
    if (!same && ++wrong >= stop_after) break;
  }
  return wrong;
}

}  // namespace dsv4
