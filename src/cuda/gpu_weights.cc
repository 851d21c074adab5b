// Loading the GPU weights (gpu_weights.h): one walk over the model's tensors, run twice -- once
// to size the device arena, once to fill it from a checkpoint or with dummy values.
#include "cuda/gpu_weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "common/error.h"
#include "cuda/kernels/fill.h"
#include "model/model_weights.h"
#include "numerics/bf16.h"
#include "numerics/ue8m0.h"

namespace dsv4::gpu {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Device memory handed out in order, 256-byte aligned. Without a base it only counts (planning).
class Arena {
 public:
  explicit Arena(std::uint8_t* base) : base_(base) {}
  template <class T>
  T* take(std::int64_t count) {
    offset_ = (offset_ + 255) / 256 * 256;
    T* p = base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + offset_);
    offset_ += count * static_cast<std::int64_t>(sizeof(T));
    return p;
  }
  bool planning() const { return base_ == nullptr; }
  std::int64_t used() const { return offset_; }

 private:
  std::uint8_t* base_;
  std::int64_t offset_ = 0;
};

// Where tensor values come from. Destinations are device pointers.
class Source {
 public:
  virtual ~Source() = default;
  // FP8 weight `prefix`.weight [out, in] with `prefix`.scale -> e4m3 codes + fp32 scales
  // [ceil(out/128)][ceil(in/128)], at codes / scales (row stride = in, scale row stride = ceil(in/128)).
  virtual void fp8(const std::string& prefix, std::int64_t out, std::int64_t in, std::uint8_t* codes, float* scales) = 0;
  // FP4 weight: packed [out, in/2] + UE8M0 [out, in/32].
  virtual void fp4(const std::string& prefix, std::int64_t out, std::int64_t in, std::uint8_t* packed,
                   std::uint8_t* scales) = 0;
  // A bf16 matrix or vector of n values (embedding, head, bf16 linears).
  virtual void bf16(const std::string& name, std::int64_t n, std::int64_t fan_in, std::uint16_t* dst) = 0;
  // Small float tensors as fp32 (norm weights rounded to bf16 values).
  virtual void f32(const std::string& name, std::int64_t n, bool norm, float* dst) = 0;
  virtual void ids(const std::string& name, std::int64_t rows, std::int32_t k, std::int32_t experts, std::int32_t* dst) = 0;
};

// ---- the walk -------------------------------------------------------------------------------------
class Builder {
 public:
  Builder(const ModelConfig& c, Arena& arena, Source* source) : c_(c), a_(arena), src_(source) {}

  void model(GpuModelWeights& m) {
    const std::int64_t V = c_.vocab_size, D = c_.hidden_size;
    auto* embed = a_.take<std::uint16_t>(V * D);
    if (src_) src_->bf16("embed.weight", V * D, D, embed);
    m.embed = embed;
    m.head = bf16_linear("head.weight", V, D);
    m.norm = f32("norm.weight", D, true);
    m.hc_head = hc("", "head", c_.hc_mult);
    m.blocks.clear();
    for (std::int64_t i = 0; i < c_.num_hidden_layers; ++i) m.blocks.push_back(block(fmt::format("layers.{}.", i), i));
    m.mtp.clear();
    for (std::int64_t k = 0; k < c_.num_nextn_predict_layers; ++k) {
      const std::string p = fmt::format("mtp.{}.", k);
      GpuMtpWeights t;
      t.block = block(p, c_.num_hidden_layers + k);
      t.e_proj = fp8_linear(p + "e_proj", D, D);
      t.h_proj = fp8_linear(p + "h_proj", D, D);
      t.enorm = f32(p + "enorm.weight", D, true);
      t.hnorm = f32(p + "hnorm.weight", D, true);
      t.norm = f32(p + "norm.weight", D, true);
      t.hc_head = hc(p, "head", c_.hc_mult);
      m.mtp.push_back(t);
    }
  }

 private:
  const float* f32(const std::string& name, std::int64_t n, bool norm) {
    float* p = a_.take<float>(n);
    if (src_) src_->f32(name, n, norm, p);
    return p;
  }

  HcWeights hc(const std::string& p, const std::string& sub, std::int64_t n_mix) {
    const std::int64_t width = c_.hc_mult * c_.hidden_size;
    const std::string stem = sub == "head" ? p + "hc_head_" : p + "hc_" + sub + "_";
    HcWeights w;
    w.fn = f32(stem + "fn", n_mix * width, false);
    w.base = f32(stem + "base", n_mix, false);
    w.scale = f32(stem + "scale", sub == "head" ? 1 : 3, false);
    return w;
  }

  DeviceWeight fp8_linear(const std::string& prefix, std::int64_t out, std::int64_t in) {
    DeviceWeight w;
    w.format = WeightFormat::kFp8;
    w.n = out;
    w.k = in;
    auto* codes = a_.take<std::uint8_t>(out * in);
    auto* scales = a_.take<float>(ceil_div(out, 128) * ceil_div(in, 128));
    if (src_) src_->fp8(prefix, out, in, codes, scales);
    w.data = codes;
    w.scale = scales;
    return w;
  }

  DeviceWeight bf16_linear(const std::string& name, std::int64_t out, std::int64_t in) {
    DeviceWeight w;
    w.format = WeightFormat::kBf16;
    w.n = out;
    w.k = in;
    auto* p = a_.take<std::uint16_t>(out * in);
    if (src_) src_->bf16(name, out * in, in, p);
    w.data = p;
    return w;
  }

  GpuCompressorWeights compressor(const std::string& p, std::int64_t ratio, std::int64_t coff, std::int64_t hd) {
    GpuCompressorWeights w;
    w.ape = f32(p + "ape", ratio * coff * hd, false);
    w.wkv = bf16_linear(p + "wkv.weight", coff * hd, c_.hidden_size);
    w.wgate = bf16_linear(p + "wgate.weight", coff * hd, c_.hidden_size);
    w.norm = f32(p + "norm.weight", hd, true);
    return w;
  }

  // Routed experts, stacked: w13 rows [0, I) = w1, [I, 2I) = w3; w2 [D][I].
  void experts(const std::string& p, GpuBlockWeights& b) {
    const std::int64_t E = c_.n_routed_experts, I = c_.moe_intermediate_size, D = c_.hidden_size;
    const bool fp8 = c_.expert_dtype == "fp8";
    DeviceWeight w13, w2;
    w13.n = 2 * I;
    w13.k = D;
    w2.n = D;
    w2.k = I;
    if (fp8) {
      if (I % 128 != 0) fail("GPU executor: fp8 experts need moe_intermediate_size divisible by 128, found {}", I);
      w13.format = w2.format = WeightFormat::kFp8;
      const std::int64_t s13 = ceil_div(2 * I, 128) * ceil_div(D, 128), s2 = ceil_div(D, 128) * ceil_div(I, 128);
      auto* c13 = a_.take<std::uint8_t>(E * 2 * I * D);
      auto* sc13 = a_.take<float>(E * s13);
      auto* c2 = a_.take<std::uint8_t>(E * D * I);
      auto* sc2 = a_.take<float>(E * s2);
      for (std::int64_t e = 0; e < E && src_; ++e) {
        const std::string ep = fmt::format("{}ffn.experts.{}.", p, e);
        src_->fp8(ep + "w1", I, D, c13 + e * 2 * I * D, sc13 + e * s13);
        src_->fp8(ep + "w3", I, D, c13 + e * 2 * I * D + I * D, sc13 + e * s13 + (I / 128) * ceil_div(D, 128));
        src_->fp8(ep + "w2", D, I, c2 + e * D * I, sc2 + e * s2);
      }
      w13.data = c13;
      w13.scale = sc13;
      w13.expert_stride = 2 * I * D;
      w13.scale_stride = s13;
      w2.data = c2;
      w2.scale = sc2;
      w2.expert_stride = D * I;
      w2.scale_stride = s2;
    } else {
      if (D % 32 != 0 || I % 32 != 0) fail("GPU executor: fp4 experts need dims divisible by 32 ({}, {})", D, I);
      w13.format = w2.format = WeightFormat::kFp4;
      auto* c13 = a_.take<std::uint8_t>(E * 2 * I * D / 2);
      auto* sc13 = a_.take<std::uint8_t>(E * 2 * I * D / 32);
      auto* c2 = a_.take<std::uint8_t>(E * D * I / 2);
      auto* sc2 = a_.take<std::uint8_t>(E * D * I / 32);
      for (std::int64_t e = 0; e < E && src_; ++e) {
        const std::string ep = fmt::format("{}ffn.experts.{}.", p, e);
        src_->fp4(ep + "w1", I, D, c13 + e * I * D, sc13 + e * 2 * I * D / 32);
        src_->fp4(ep + "w3", I, D, c13 + e * I * D + I * D / 2, sc13 + e * 2 * I * D / 32 + I * D / 32);
        src_->fp4(ep + "w2", D, I, c2 + e * D * I / 2, sc2 + e * D * I / 32);
      }
      w13.data = c13;
      w13.scale = sc13;
      w13.expert_stride = I * D;  // 2I rows of D/2 bytes
      w13.scale_stride = 2 * I * D / 32;
      w2.data = c2;
      w2.scale = sc2;
      w2.expert_stride = D * I / 2;
      w2.scale_stride = D * I / 32;
    }
    b.experts_w13 = w13;
    b.experts_w2 = w2;
  }

  GpuBlockWeights block(const std::string& p, std::int64_t layer) {
    const std::int64_t D = c_.hidden_size, hc_n = c_.hc_mult, H = c_.num_attention_heads, d = c_.head_dim;
    const std::int64_t G = c_.o_groups, r = c_.compress_ratio(layer);
    GpuBlockWeights b;
    b.layer = layer;
    b.ratio = r;
    b.hash_routed = c_.is_hash_layer(layer);
    b.hc_attn = hc(p, "attn", (2 + hc_n) * hc_n);
    b.hc_ffn = hc(p, "ffn", (2 + hc_n) * hc_n);
    b.attn_norm = f32(p + "attn_norm.weight", D, true);
    b.ffn_norm = f32(p + "ffn_norm.weight", D, true);
    b.attn_sink = f32(p + "attn.attn_sink", H, false);
    b.wq_a = fp8_linear(p + "attn.wq_a", c_.q_lora_rank, D);
    b.q_norm = f32(p + "attn.q_norm.weight", c_.q_lora_rank, true);
    b.wq_b = fp8_linear(p + "attn.wq_b", H * d, c_.q_lora_rank);
    b.wkv = fp8_linear(p + "attn.wkv", d, D);
    b.kv_norm = f32(p + "attn.kv_norm.weight", d, true);
    b.wo_a = fp8_linear(p + "attn.wo_a", G * c_.o_lora_rank, H * d / G);
    b.wo_b = fp8_linear(p + "attn.wo_b", D, G * c_.o_lora_rank);
    if (r > 0) b.compressor = compressor(p + "attn.compressor.", r, r == 4 ? 2 : 1, d);
    if (r == 4) {
      GpuIndexerWeights ix;
      ix.wq_b = fp8_linear(p + "attn.indexer.wq_b", c_.index_n_heads * c_.index_head_dim, c_.q_lora_rank);
      ix.weights_proj = bf16_linear(p + "attn.indexer.weights_proj.weight", c_.index_n_heads, D);
      ix.compressor = compressor(p + "attn.indexer.compressor.", 4, 2, c_.index_head_dim);
      b.indexer = ix;
    }
    b.gate = bf16_linear(p + "ffn.gate.weight", c_.n_routed_experts, D);
    if (b.hash_routed) {
      auto* ids = a_.take<std::int32_t>(c_.vocab_size * c_.num_experts_per_tok);
      if (src_)
        src_->ids(p + "ffn.gate.tid2eid", c_.vocab_size, static_cast<std::int32_t>(c_.num_experts_per_tok),
                  static_cast<std::int32_t>(c_.n_routed_experts), ids);
      b.tid2eid = ids;
    } else {
      b.gate_bias = f32(p + "ffn.gate.bias", c_.n_routed_experts, false);
    }
    experts(p, b);
    const std::int64_t I = c_.moe_intermediate_size;
    b.shared_w1 = fp8_linear(p + "ffn.shared_experts.w1", I, D);
    b.shared_w2 = fp8_linear(p + "ffn.shared_experts.w2", D, I);
    b.shared_w3 = fp8_linear(p + "ffn.shared_experts.w3", I, D);
    return b;
  }

  const ModelConfig& c_;
  Arena& a_;
  Source* src_;
};

// ---- checkpoint source: host conversion into pinned staging, asynchronous copies ----------------
class Stager {
 public:
  explicit Stager(bool progress, std::int64_t total) : progress_(progress), total_(total) {
    for (auto& s : slots_) s.buffer = PinnedBuffer(kChunk);
  }
  // Fills `bytes` of device memory at dst chunk by chunk: produce(host, offset, length).
  void upload(void* dst, std::size_t bytes, const std::function<void(std::uint8_t*, std::size_t, std::size_t)>& produce) {
    for (std::size_t off = 0; off < bytes; off += kChunk) {
      const std::size_t len = std::min(kChunk, bytes - off);
      Slot& s = slots_[next_];
      next_ = (next_ + 1) % 2;
      if (s.used) s.done.synchronize();
      produce(s.buffer.as<std::uint8_t>(), off, len);
      copy_to_device(static_cast<std::uint8_t*>(dst) + off, s.buffer.data(), len, stream_);
      s.done.record(stream_);
      s.used = true;
      done_ += static_cast<std::int64_t>(len);
      report(false);
    }
  }
  void finish() {
    stream_.synchronize();
    report(true);
  }

 private:
  static constexpr std::size_t kChunk = std::size_t{64} << 20;
  struct Slot {
    PinnedBuffer buffer;
    Event done;
    bool used = false;
  };
  void report(bool last) {
    if (!progress_) return;
    const int percent = total_ > 0 ? static_cast<int>(100 * done_ / total_) : 100;
    if (!last && percent == reported_) return;
    reported_ = percent;
    std::fprintf(stderr, "\rloading weights to the GPU: %.2f / %.2f GB (%d%%)%s", static_cast<double>(done_) / 1e9,
                 static_cast<double>(total_) / 1e9, percent, last ? "\n" : "");
    std::fflush(stderr);
  }
  bool progress_;
  std::int64_t total_, done_ = 0;
  int reported_ = -1;
  Stream stream_;
  Slot slots_[2];
  std::size_t next_ = 0;
};

class CheckpointSource final : public Source {
 public:
  CheckpointSource(const BoundWeights& bound, Stager& stager) : w_(bound), stager_(stager) {}

  void fp8(const std::string& prefix, std::int64_t out, std::int64_t in, std::uint8_t* codes, float* scales) override {
    const TensorView& weight = w_.at(prefix + ".weight");
    const TensorView& scale = w_.at(prefix + ".scale");
    if (weight.dtype != DType::kF8E4M3) fail("tensor '{}': {} where the GPU executor needs F8_E4M3", weight.name, dtype_name(weight.dtype));
    raw(weight, codes, static_cast<std::size_t>(out * in));
    const std::int64_t n = ceil_div(out, 128) * ceil_div(in, 128);
    stager_.upload(scales, static_cast<std::size_t>(n) * 4, [&](std::uint8_t* host, std::size_t off, std::size_t len) {
      for (std::size_t i = off / 4; i < (off + len) / 4; ++i) {
        const float v = scale_value(scale, i);
        std::memcpy(host + (i * 4 - off), &v, 4);
      }
    });
  }

  void fp4(const std::string& prefix, std::int64_t out, std::int64_t in, std::uint8_t* packed,
           std::uint8_t* scales) override {
    const TensorView& weight = w_.at(prefix + ".weight");
    const TensorView& scale = w_.at(prefix + ".scale");
    if (weight.dtype == DType::kF8E4M3) fail("tensor '{}': FP8 expert weights with expert_dtype fp4", weight.name);
    raw(weight, packed, static_cast<std::size_t>(out * in / 2));
    const auto n = static_cast<std::size_t>(out * in / 32);
    stager_.upload(scales, n, [&](std::uint8_t* host, std::size_t off, std::size_t len) {
      for (std::size_t i = off; i < off + len; ++i) host[i - off] = f32_to_ue8m0(scale_value(scale, i));
    });
  }

  void bf16(const std::string& name, std::int64_t n, std::int64_t /*fan_in*/, std::uint16_t* dst) override {
    const TensorView& v = w_.at(name);
    if (v.dtype == DType::kBF16) return raw(v, dst, static_cast<std::size_t>(n) * 2);
    stager_.upload(dst, static_cast<std::size_t>(n) * 2, [&](std::uint8_t* host, std::size_t off, std::size_t len) {
      for (std::size_t i = off / 2; i < (off + len) / 2; ++i) {
        const std::uint16_t b = f32_to_bf16_bits(float_at(v, i));
        std::memcpy(host + (i * 2 - off), &b, 2);
      }
    });
  }

  void f32(const std::string& name, std::int64_t n, bool norm, float* dst) override {
    const TensorView& v = w_.at(name);
    stager_.upload(dst, static_cast<std::size_t>(n) * 4, [&](std::uint8_t* host, std::size_t off, std::size_t len) {
      for (std::size_t i = off / 4; i < (off + len) / 4; ++i) {
        float x = float_at(v, i);
        if (norm) x = round_to_bf16(x);  // bf16 parameters in the reference
        std::memcpy(host + (i * 4 - off), &x, 4);
      }
    });
  }

  void ids(const std::string& name, std::int64_t rows, std::int32_t k, std::int32_t experts, std::int32_t* dst) override {
    const TensorView& v = w_.at(name);
    stager_.upload(dst, static_cast<std::size_t>(rows * k) * 4, [&](std::uint8_t* host, std::size_t off, std::size_t len) {
      for (std::size_t i = off / 4; i < (off + len) / 4; ++i) {
        std::int64_t id = 0;
        if (v.dtype == DType::kI32) {
          std::int32_t x;
          std::memcpy(&x, v.bytes.data() + 4 * i, 4);
          id = x;
        } else {
          std::memcpy(&id, v.bytes.data() + 8 * i, 8);
        }
        if (id < 0 || id >= experts) fail("{}: expert id {} at index {} is outside [0, {})", name, id, i, experts);
        const auto x = static_cast<std::int32_t>(id);
        std::memcpy(host + (i * 4 - off), &x, 4);
      }
    });
  }

 private:
  void raw(const TensorView& v, void* dst, std::size_t bytes) {
    if (v.bytes.size() != bytes) fail("tensor '{}': {} bytes, expected {}", v.name, v.bytes.size(), bytes);
    stager_.upload(dst, bytes, [&](std::uint8_t* host, std::size_t off, std::size_t len) { std::memcpy(host, v.bytes.data() + off, len); });
  }
  static float scale_value(const TensorView& s, std::size_t i) {
    if (s.dtype == DType::kF8E8M0) {
      const std::uint8_t b = s.bytes[i];
      if (b == 0xff) fail("tensor '{}': UE8M0 scale {} is 0xff (NaN)", s.name, i);
      return ue8m0_to_f32(b);
    }
    float x;
    std::memcpy(&x, s.bytes.data() + 4 * i, 4);
    if (!(x > 0.0f) || !std::isfinite(x)) fail("tensor '{}': scale {} is {}", s.name, i, x);
    return x;
  }
  static float float_at(const TensorView& v, std::size_t i) {
    switch (v.dtype) {
      case DType::kF32: {
        float x;
        std::memcpy(&x, v.bytes.data() + 4 * i, 4);
        return x;
      }
      case DType::kBF16: {
        std::uint16_t b;
        std::memcpy(&b, v.bytes.data() + 2 * i, 2);
        return bf16_bits_to_f32(b);
      }
      case DType::kF16: {
        std::uint16_t b;
        std::memcpy(&b, v.bytes.data() + 2 * i, 2);
        // IEEE half -> float.
        const std::uint32_t sign = (b & 0x8000u) << 16, exp = (b >> 10) & 0x1f, mant = b & 0x3ff;
        float mag;
        if (exp == 0) mag = std::ldexp(static_cast<float>(mant), -24);
        else if (exp == 31) mag = mant ? NAN : INFINITY;
        else mag = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
        return sign ? -mag : mag;
      }
      default:
        fail("tensor '{}': dtype {} is not a float type", v.name, dtype_name(v.dtype));
    }
  }

  const BoundWeights& w_;
  Stager& stager_;
};

// ---- dummy source: values drawn on the GPU ------------------------------------------------------
std::uint64_t name_seed(std::uint64_t seed, const std::string& name) {
  std::uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// The power of two >= x.
float pow2_ceil(float x) { return std::exp2(std::ceil(std::log2(x))); }

class DummySource final : public Source {
 public:
  DummySource(const ModelConfig& c, std::uint64_t seed) : c_(c), seed_(seed) {}

  void fp8(const std::string& prefix, std::int64_t out, std::int64_t in, std::uint8_t* codes, float* scales) override {
    fill_fp8_codes(codes, out * in, name_seed(seed_, prefix), stream_.handle());
    fill_const_f32(scales, ceil_div(out, 128) * ceil_div(in, 128), pow2_ceil(range(prefix, in) / 448.0f), stream_.handle());
  }
  void fp4(const std::string& prefix, std::int64_t out, std::int64_t in, std::uint8_t* packed,
           std::uint8_t* scales) override {
    fill_fp4_bytes(packed, out * in / 2, name_seed(seed_, prefix), stream_.handle());
    fill_const_u8(scales, out * in / 32, f32_to_ue8m0(pow2_ceil(range(prefix, in) / 6.0f)), stream_.handle());
  }
  void bf16(const std::string& name, std::int64_t n, std::int64_t fan_in, std::uint16_t* dst) override {
    const float a = name == "embed.weight" ? 1.0f : range(name, fan_in);
    fill_uniform_bf16(dst, n, name_seed(seed_, name), -a, a, stream_.handle());
  }
  void f32(const std::string& name, std::int64_t n, bool norm, float* dst) override {
    float lo = -0.5f, hi = 0.5f;
    auto ends = [&](const char* s) {
      const std::string suffix(s);
      return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (norm) {
      lo = 0.9f;
      hi = 1.1f;
    } else if (ends("_fn")) {
      hi = std::sqrt(3.0f / static_cast<float>(c_.hc_mult * c_.hidden_size));
      lo = -hi;
    } else if (ends("_scale")) {
      lo = 0.5f;
      hi = 1.0f;
    } else if (ends("attn_sink")) {
      lo = -1.0f;
      hi = 1.0f;
    } else if (ends("gate.bias")) {
      lo = -0.1f;
      hi = 0.1f;
    }
    fill_uniform_f32(dst, n, name_seed(seed_, name), lo, hi, stream_.handle());
  }
  void ids(const std::string& name, std::int64_t rows, std::int32_t k, std::int32_t experts, std::int32_t* dst) override {
    fill_expert_ids(dst, rows, k, experts, name_seed(seed_, name), stream_.handle());
  }
  void finish() { stream_.synchronize(); }

 private:
  // Uniform range of a linear's weights: sqrt(3 / fan_in), halved for output projections.
  static float range(const std::string& name, std::int64_t fan_in) {
    float a = std::sqrt(3.0f / static_cast<float>(std::max<std::int64_t>(fan_in, 1)));
    if (name.find("wo_b") != std::string::npos || name.find(".w2") != std::string::npos) a *= 0.5f;
    return a;
  }
  const ModelConfig& c_;
  std::uint64_t seed_;
  Stream stream_;
};

void check_supported(const ModelConfig& c) {
  if (c.head_dim != 512 || c.qk_rope_head_dim != 64)
    fail("GPU executor: head_dim 512 with 64 rope dims is supported, the config has {} and {}", c.head_dim, c.qk_rope_head_dim);
  if (c.hc_mult < 1 || c.hc_mult > 4) fail("GPU executor: hc_mult {} (1..4 supported)", c.hc_mult);
  if (c.hidden_size % 128 != 0) fail("GPU executor: hidden_size {} must be a multiple of 128", c.hidden_size);
  for (std::int64_t k : {c.q_lora_rank, c.o_lora_rank * c.o_groups, c.moe_intermediate_size})
    if (k % 32 != 0) fail("GPU executor: q_lora_rank, o_groups * o_lora_rank and moe_intermediate_size must be multiples of 32");
  if (c.num_attention_heads * c.head_dim % c.o_groups != 0) fail("GPU executor: heads * head_dim not divisible by o_groups");
}

// The routed experts' fp4 weights arrive in checkpoint order; the products read the GPU layout
// (gemm.h fp4_to_gpu_layout). Also notes whether their scale bytes are all plain exponents (gemm.h
// fp4_scales_normal). Run once the uploads are done.
void fp4_experts_to_gpu_layout(const ModelConfig& config, GpuModelWeights& m) {
  Stream stream;
  auto convert = [&](GpuBlockWeights& b) {
    for (DeviceWeight* w : {&b.experts_w13, &b.experts_w2})
      if (w->format == WeightFormat::kFp4 && w->data != nullptr) {
        fp4_to_gpu_layout(const_cast<void*>(w->data), const_cast<void*>(w->scale), config.n_routed_experts, w->n, w->k,
                          stream.handle());
        w->fp4_scales_normal = fp4_scales_normal(w->scale, config.n_routed_experts * w->n * (w->k / 32), stream);
      }
  };
  for (GpuBlockWeights& b : m.blocks) convert(b);
  for (GpuMtpWeights& t : m.mtp) convert(t.block);
  stream.synchronize();
}

GpuModelWeights build(const ModelConfig& config, Source* source, std::int64_t budget_bytes) {
  check_supported(config);
  GpuModelWeights m;
  Arena plan(nullptr);
  Builder(config, plan, nullptr).model(m);
  m.bytes = plan.used();
  if (budget_bytes > 0 && m.bytes > budget_bytes)
    fail("the model's weights need {:.2f} GB of GPU memory; {:.2f} GB are available for them", m.bytes / 1e9, budget_bytes / 1e9);
  m.memory = DeviceBuffer(static_cast<std::size_t>(m.bytes));
  Arena arena(m.memory.as<std::uint8_t>());
  Builder(config, arena, source).model(m);
  return m;
}

}  // namespace

std::int64_t GpuModelWeights::required_bytes(const ModelConfig& config) {
  check_supported(config);
  GpuModelWeights m;
  Arena plan(nullptr);
  Builder(config, plan, nullptr).model(m);
  return plan.used();
}

GpuModelWeights GpuModelWeights::load(const ModelConfig& config, const Checkpoint& checkpoint, std::int64_t budget_bytes,
                                      bool progress) {
  const BoundWeights bound = bind_weights(config, checkpoint);
  Stager stager(progress, required_bytes(config));
  CheckpointSource source(bound, stager);
  GpuModelWeights m = build(config, &source, budget_bytes);
  stager.finish();
  fp4_experts_to_gpu_layout(config, m);
  return m;
}

GpuModelWeights GpuModelWeights::dummy(const ModelConfig& config, std::uint64_t seed, std::int64_t budget_bytes) {
  DummySource source(config, seed);
  GpuModelWeights m = build(config, &source, budget_bytes);
  source.finish();
  fp4_experts_to_gpu_layout(config, m);
  return m;
}

}  // namespace dsv4::gpu
