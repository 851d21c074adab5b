// DenseWeight loading (SPEC.md 2): FP8 + UE8M0 128x128 scales, packed FP4 + per-32 scales,
// BF16 / F32 / F16, against numerics' dequantizers, and errors naming the tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <string>

#include "common/error.h"
#include "cpu/dense_weight.h"
#include "cpu_test_util.h"
#include "numerics/block_quant.h"
#include "numerics/fp4_e2m1.h"
#include "numerics/ue8m0.h"

namespace dsv4 {
namespace {

using test::make_tensor;
using test::OwnedTensor;

struct Fp8Fixture {
  std::int64_t out = 200, in = 300;  // edge tiles on both axes
  std::vector<std::uint8_t> codes, scales;
  std::vector<float> expected;
  Fp8Fixture() {
    std::mt19937 rng(11);
    const std::vector<float> w = test::random_floats(rng, static_cast<std::size_t>(out * in), -3.0f, 3.0f);
    codes.resize(w.size());
    scales.resize(2 * 3);
    quantize_weight_fp8_128x128(w.data(), 200, 300, codes.data(), scales.data());
    expected.resize(w.size());
    dequantize_weight_fp8_128x128(codes.data(), scales.data(), 200, 300, expected.data());
  }
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no dsv4::Error>";
}

TEST(DenseWeight, Fp8MatchesNumericsDequantizer) {
  Fp8Fixture f;
  OwnedTensor w = make_tensor("l.wq_a.weight", DType::kF8E4M3, {200, 300}, f.codes);
  OwnedTensor s = make_tensor("l.wq_a.scale", DType::kF8E8M0, {2, 3}, f.scales);
  const DenseWeight dw = load_dense_weight(w.view, &s.view, 200, 300);
  EXPECT_EQ(dw.kind, WeightKind::kFp8);
  EXPECT_EQ(dw.name, "l.wq_a.weight");
  ASSERT_EQ(dw.w.size(), f.expected.size());
  EXPECT_EQ(dw.w, f.expected);
  for (float v : dw.w) ASSERT_EQ(round_to_bf16(v), v);  // exact in bf16 too
  EXPECT_EQ(dw.row(150)[299], f.expected[150 * 300 + 299]);

  // The same scales stored as F32 values.
  std::vector<float> sf(f.scales.size());
  for (std::size_t i = 0; i < sf.size(); ++i) sf[i] = ue8m0_to_f32(f.scales[i]);
  OwnedTensor s32 = make_tensor("l.wq_a.scale", DType::kF32, {2, 3}, test::f32_bytes(sf));
  EXPECT_EQ(load_dense_weight(w.view, &s32.view).w, f.expected);
}

TEST(DenseWeight, Fp4MatchesNumericsDequantizerAndNibbleOrder) {
  std::mt19937 rng(12);
  const std::int64_t out = 40, in = 96;
  const std::vector<float> w = test::random_floats(rng, static_cast<std::size_t>(out * in), -2.0f, 2.0f);
  std::vector<std::uint8_t> packed(w.size() / 2), scales(w.size() / 32);
  quantize_weight_fp4_1x32(w.data(), out, in, packed.data(), scales.data());
  std::vector<float> expected(w.size());
  dequantize_weight_fp4_1x32(packed.data(), scales.data(), out, in, expected.data());
  for (DType dt : {DType::kI8, DType::kU8}) {
    OwnedTensor wt = make_tensor("e.w1.weight", dt, {out, in / 2}, packed);
    OwnedTensor st = make_tensor("e.w1.scale", DType::kF8E8M0, {out, in / 32}, scales);
    const DenseWeight dw = load_dense_weight(wt.view, &st.view, out, in);
    EXPECT_EQ(dw.kind, WeightKind::kFp4);
    EXPECT_EQ(dw.w, expected);
  }
  // Hand-made: byte 0x2b holds element 0 = code 0xb (-1.5) and element 1 = code 0x2 (+1.0);
  // scale 2^1 (byte 128).
  std::vector<std::uint8_t> one_row(16, 0x00);
  one_row[0] = 0x2b;
  one_row[15] = 0x70;  // element 30 = 0, element 31 = code 7 (+6)
  OwnedTensor wt = make_tensor("hand.weight", DType::kU8, {1, 16}, one_row);
  OwnedTensor st = make_tensor("hand.scale", DType::kF8E8M0, {1, 1}, {128});
  const DenseWeight dw = load_dense_weight(wt.view, &st.view);
  EXPECT_EQ(dw.w[0], -3.0f);
  EXPECT_EQ(dw.w[1], 2.0f);
  EXPECT_EQ(dw.w[30], 0.0f);
  EXPECT_EQ(dw.w[31], 12.0f);
}

TEST(DenseWeight, FloatDtypes) {
  std::mt19937 rng(13);
  const std::vector<float> v = test::random_bf16(rng, 6 * 5, -4.0f, 4.0f);
  OwnedTensor b = make_tensor("g.weight", DType::kBF16, {6, 5}, test::bf16_bytes(v));
  const DenseWeight db = load_dense_weight(b.view, nullptr, 6, 5);
  EXPECT_EQ(db.kind, WeightKind::kBf16);
  EXPECT_EQ(db.w, v);
  const std::vector<float> f = test::random_floats(rng, 30);
  OwnedTensor t = make_tensor("g.weight", DType::kF32, {6, 5}, test::f32_bytes(f));
  DenseWeight dt = load_dense_weight(t.view, nullptr);
  EXPECT_EQ(dt.kind, WeightKind::kF32);
  EXPECT_EQ(dt.w, f);
  round_weight_to_bf16(dt);
  EXPECT_EQ(dt.kind, WeightKind::kBf16);
  for (std::size_t i = 0; i < f.size(); ++i) EXPECT_EQ(dt.w[i], round_to_bf16(f[i]));

  // F16: 1, -2, the smallest subnormal 2^-24, the largest 65504, -0.
  const std::vector<std::uint16_t> h = {0x3c00, 0xc000, 0x0001, 0x7bff, 0x8000, 0x3555};
  std::vector<std::uint8_t> hb(h.size() * 2);
  std::memcpy(hb.data(), h.data(), hb.size());
  OwnedTensor ht = make_tensor("x.ape", DType::kF16, {2, 3}, hb);
  const std::vector<std::int64_t> shape = {2, 3};
  const std::vector<float> hv = read_float_tensor(ht.view, shape);
  EXPECT_EQ(hv[0], 1.0f);
  EXPECT_EQ(hv[1], -2.0f);
  EXPECT_EQ(hv[2], std::ldexp(1.0f, -24));
  EXPECT_EQ(hv[3], 65504.0f);
  EXPECT_TRUE(std::signbit(hv[4]) && hv[4] == 0.0f);
  EXPECT_EQ(hv[5], 0x1.554p-2f);
  EXPECT_EQ(load_dense_weight(ht.view, nullptr).kind, WeightKind::kF32);
}

TEST(DenseWeight, ErrorsNameTheTensor) {
  Fp8Fixture f;
  OwnedTensor w = make_tensor("l.wkv.weight", DType::kF8E4M3, {200, 300}, f.codes);
  OwnedTensor s = make_tensor("l.wkv.scale", DType::kF8E8M0, {2, 3}, f.scales);
  OwnedTensor bad_scale = make_tensor("l.wkv.scale", DType::kF8E8M0, {3, 2}, f.scales);
  EXPECT_NE(error_of([&] { load_dense_weight(w.view, &bad_scale.view); }).find("l.wkv.scale"), std::string::npos);
  EXPECT_NE(error_of([&] { load_dense_weight(w.view, nullptr); }).find("l.wkv.weight"), std::string::npos);
  EXPECT_NE(error_of([&] { load_dense_weight(w.view, &s.view, 300, 200); }).find("l.wkv.weight"), std::string::npos);
  EXPECT_NO_THROW(load_dense_weight(w.view, &s.view, 200, 300));

  std::vector<std::uint8_t> nan_scales = f.scales;
  nan_scales[4] = 0xff;
  OwnedTensor ns = make_tensor("l.wkv.scale", DType::kF8E8M0, {2, 3}, nan_scales);
  EXPECT_NE(error_of([&] { load_dense_weight(w.view, &ns.view); }).find("0xff"), std::string::npos);
  OwnedTensor neg = make_tensor("l.wkv.scale", DType::kF32, {2, 3}, test::f32_bytes({1, 1, 1, -1, 1, 1}));
  EXPECT_NE(error_of([&] { load_dense_weight(w.view, &neg.view); }).find("l.wkv.scale"), std::string::npos);

  OwnedTensor b = make_tensor("n.weight", DType::kBF16, {2, 2}, std::vector<std::uint8_t>(8, 0));
  EXPECT_NE(error_of([&] { load_dense_weight(b.view, &s.view); }).find("n.weight"), std::string::npos);
  OwnedTensor b1 = make_tensor("n.weight", DType::kBF16, {4}, std::vector<std::uint8_t>(8, 0));
  EXPECT_NE(error_of([&] { load_dense_weight(b1.view, nullptr); }).find("not 2-D"), std::string::npos);
  OwnedTensor i32 = make_tensor("t.tid2eid", DType::kI32, {2, 1}, std::vector<std::uint8_t>(8, 0));
  EXPECT_NE(error_of([&] { load_dense_weight(i32.view, nullptr); }).find("t.tid2eid"), std::string::npos);
  EXPECT_NE(error_of([&] { read_float_tensor(i32.view); }).find("t.tid2eid"), std::string::npos);
  const std::vector<std::int64_t> wrong = {4};
  EXPECT_NE(error_of([&] { read_float_tensor(b.view, wrong); }).find("n.weight"), std::string::npos);
  OwnedTensor short_bytes = make_tensor("n.weight", DType::kBF16, {2, 2}, std::vector<std::uint8_t>(6, 0));
  EXPECT_NE(error_of([&] { read_float_tensor(short_bytes.view); }).find("n.weight"), std::string::npos);

  // FP4: packed width 8 -> 16 inputs, not a multiple of 32; scale of the wrong shape.
  OwnedTensor p = make_tensor("e.w2.weight", DType::kU8, {2, 8}, std::vector<std::uint8_t>(16, 0));
  OwnedTensor ps = make_tensor("e.w2.scale", DType::kF8E8M0, {2, 1}, {127, 127});
  EXPECT_NE(error_of([&] { load_dense_weight(p.view, &ps.view); }).find("e.w2.weight"), std::string::npos);
  OwnedTensor p2 = make_tensor("e.w2.weight", DType::kU8, {2, 16}, std::vector<std::uint8_t>(32, 0));
  OwnedTensor ps_bad = make_tensor("e.w2.scale", DType::kF8E8M0, {1, 2}, {127, 127});
  EXPECT_NE(error_of([&] { load_dense_weight(p2.view, &ps_bad.view); }).find("e.w2.scale"), std::string::npos);
  OwnedTensor ps2 = make_tensor("e.w2.scale", DType::kF8E8M0, {2, 1}, {127, 127});
  EXPECT_NO_THROW(load_dense_weight(p2.view, &ps2.view, 2, 32));

  EXPECT_THROW(make_dense_weight("m", 2, 2, WeightKind::kBf16, {1.0f, 2.0f, 3.0f, 0.1f}), Error);
  EXPECT_THROW(make_dense_weight("m", 2, 2, WeightKind::kF32, {1.0f, 2.0f, 3.0f}), Error);
  EXPECT_NO_THROW(make_dense_weight("m", 2, 2, WeightKind::kF32, {1.0f, 2.0f, 3.0f, 0.1f}));
}

}  // namespace
}  // namespace dsv4
