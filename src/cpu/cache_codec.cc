#include "cpu/cache_codec.h"

#include <cstring>
#include <stdexcept>
#include <vector>

#include "numerics/bf16.h"
#include "numerics/block_quant.h"
#include "numerics/fp4_e2m1.h"
#include "numerics/fp8_e4m3.h"
#include "numerics/ue8m0.h"

namespace dsv4 {
namespace {

constexpr std::size_t kKvBlock = 64;       // FP8 blocks of the cached kv's no-rope dims
constexpr std::size_t kIndexerBlock = 32;  // FP4 blocks of indexer keys

void store_bf16(std::span<const float> values, std::uint8_t* out) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::uint16_t b = f32_to_bf16_bits(values[i]);
    std::memcpy(out + 2 * i, &b, 2);
  }
}

void load_bf16(const std::uint8_t* in, std::span<float> values) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::uint16_t b;
    std::memcpy(&b, in + 2 * i, 2);
    values[i] = bf16_bits_to_f32(b);
  }
}

void check_nope(std::size_t head_dim, std::int64_t rope_dim) {
  if (rope_dim <= 0 || static_cast<std::size_t>(rope_dim) >= head_dim ||
      (head_dim - static_cast<std::size_t>(rope_dim)) % kKvBlock != 0)
    throw std::invalid_argument("main kv: head_dim - rope_dim must be a positive multiple of 64");
}

}  // namespace

void encode_main_kv(std::span<const float> kv, std::int64_t rope_dim, KvCacheDtype dtype, std::uint8_t* data,
                    std::uint8_t* scales) {
  check_nope(kv.size(), rope_dim);
  const std::size_t nope = kv.size() - static_cast<std::size_t>(rope_dim);
  if (dtype == KvCacheDtype::kBf16) {
    std::vector<float> v(kv.begin(), kv.end());
    simulate_quant_blocks(std::span<float>(v).first(nope), kKvBlock, QuantFormat::kFp8E4m3);
    store_bf16(v, data);
    return;
  }
  const std::size_t blocks = nope / kKvBlock;
  std::vector<float> block_scales(blocks);
  quantize_blocks(kv.first(nope), kKvBlock, QuantFormat::kFp8E4m3, std::span<std::uint8_t>(data, nope),
                  block_scales);
  store_bf16(kv.subspan(nope), data + nope);
  for (std::size_t b = 0; b < blocks; ++b) scales[b] = f32_to_ue8m0(block_scales[b]);
  for (std::size_t b = blocks; b < (blocks + 7) / 8 * 8; ++b) scales[b] = 0;  // pad byte(s)
}

void decode_main_kv(const std::uint8_t* data, const std::uint8_t* scales, std::int64_t rope_dim, KvCacheDtype dtype,
                    std::span<float> kv) {
  check_nope(kv.size(), rope_dim);
  if (dtype == KvCacheDtype::kBf16) {
    load_bf16(data, kv);
    return;
  }
  const std::size_t nope = kv.size() - static_cast<std::size_t>(rope_dim);
  for (std::size_t i = 0; i < nope; ++i) kv[i] = e4m3_to_f32(data[i]) * ue8m0_to_f32(scales[i / kKvBlock]);
  load_bf16(data + nope, kv.subspan(nope));
}

void encode_indexer_key(std::span<const float> key, IndexerCacheDtype dtype, std::uint8_t* data,
                        std::uint8_t* scales) {
  if (key.size() % kIndexerBlock != 0) throw std::invalid_argument("indexer key: size must be a multiple of 32");
  const std::size_t n = key.size();
  if (dtype == IndexerCacheDtype::kFp4) {
    std::vector<std::uint8_t> codes(n);
    std::vector<float> block_scales(n / kIndexerBlock);
    quantize_blocks(key, kIndexerBlock, QuantFormat::kFp4E2m1, codes, block_scales);
    pack_e2m1(codes, std::span<std::uint8_t>(data, n / 2));
    for (std::size_t b = 0; b < block_scales.size(); ++b) scales[b] = f32_to_ue8m0(block_scales[b]);
    return;
  }
  std::vector<float> v(key.begin(), key.end());
  simulate_quant_blocks(v, kIndexerBlock, QuantFormat::kFp4E2m1);
  if (dtype == IndexerCacheDtype::kBf16) {
    store_bf16(v, data);
    return;
  }
  // fp8: one power-of-two fp32 scale per 128 dims (the last group may be shorter).
  for (std::size_t g = 0; g * 128 < n; ++g) {
    const std::size_t begin = g * 128, end = std::min(n, begin + 128);
    float amax = 0;
    for (std::size_t i = begin; i < end; ++i) amax = std::max(amax, std::abs(v[i]));
    const float scale = pow2_block_scale(amax, QuantFormat::kFp8E4m3);
    for (std::size_t i = begin; i < end; ++i) data[i] = f32_to_e4m3(v[i] / scale);
    std::memcpy(scales + 4 * g, &scale, 4);
  }
}

void decode_indexer_key(const std::uint8_t* data, const std::uint8_t* scales, IndexerCacheDtype dtype,
                        std::span<float> key) {
  const std::size_t n = key.size();
  switch (dtype) {
    case IndexerCacheDtype::kBf16:
      load_bf16(data, key);
      return;
    case IndexerCacheDtype::kFp4:
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint8_t code = (i % 2 == 0) ? (data[i / 2] & 0x0f) : (data[i / 2] >> 4);
        key[i] = e2m1_to_f32(code) * ue8m0_to_f32(scales[i / kIndexerBlock]);
      }
      return;
    case IndexerCacheDtype::kFp8:
      for (std::size_t i = 0; i < n; ++i) {
        float scale;
        std::memcpy(&scale, scales + 4 * (i / 128), 4);
        key[i] = e4m3_to_f32(data[i]) * scale;
      }
      return;
  }
}

}  // namespace dsv4
