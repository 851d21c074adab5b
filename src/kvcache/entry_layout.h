// Byte layout of cache entries inside a page, shared by the CPU and GPU executors so that
// both read and write the very same bytes (SPEC.md section 5).
//
// Every page stores its entries "data first, then scales": entry i's data lives at
// i * data_bytes, and its scales at entries * data_bytes + i * scale_bytes. The page is then
// padded to its bucket size (cache_spec.h). The formats:
//
//   main KV bf16   data = head_dim bf16 (1024 B)                          no scales
//   main KV fp8    data = nope fp8 (448 B) + rope bf16 (64 x 2 = 128 B) = 576 B,
//                  scales = one UE8M0 per 64 nope dims (7 B) + pad to 8 B    -> 584 B/entry
//   indexer bf16   data = index_head_dim bf16 (256 B)                     no scales
//   indexer fp8    data = index_head_dim fp8 (128 B), scales = one fp32 per 128 dims (4 B) -> 132 B
//   indexer fp4    data = index_head_dim/2 B of packed e2m1, the low nibble holding the even
//                  element (64 B), scales = one UE8M0 per 32 dims (4 B)            -> 68 B
//   compressor     one position of state: coff*hd fp32 values (a_t = wkv x_t) followed by
//   state fp32     coff*hd fp32 scores (g_t = wgate x_t + ape[t mod r]), no scales:
//                  c4 main 2*2*512*4 = 8192 B, c4 indexer 2*2*128*4 = 2048 B, c128 main 4096 B
//
// The window KV uses the main-KV format (one entry per position); compressed main KV one
// entry per r positions; indexer keys one entry per 4 positions.
#pragma once

#include <cstdint>

namespace dsv4 {

// The bytes of one cache entry: `data_bytes` of payload, then (stored apart, after all
// entries' data) `scale_bytes` of quantization scales.
struct EntryFormat {
  std::int64_t data_bytes = 0;
  std::int64_t scale_bytes = 0;

  std::int64_t entry_bytes() const { return data_bytes + scale_bytes; }
  bool operator==(const EntryFormat&) const = default;
};

// Where entry i of a page of `entries` entries keeps its data and scales.
struct PageLayout {
  EntryFormat format;
  std::int64_t entries = 0;     // entries per page
  std::int64_t page_bytes = 0;  // the page's bucket size, >= used_bytes()

  std::int64_t data_offset(std::int64_t i) const { return i * format.data_bytes; }
  std::int64_t scale_offset(std::int64_t i) const {
    return entries * format.data_bytes + i * format.scale_bytes;
  }
  std::int64_t used_bytes() const { return entries * format.entry_bytes(); }
  std::int64_t waste_bytes() const { return page_bytes - used_bytes(); }
};

// Inside the data of an fp8 main-KV entry: the no-rope dims as fp8 e4m3 first, then the
// rope dims as bf16. Inside its scales: one UE8M0 byte per block of 64 no-rope dims.
struct MainKvFp8Layout {
  std::int64_t nope_dims = 448;
  std::int64_t rope_dims = 64;

  static constexpr std::int64_t kScaleBlock = 64;
  std::int64_t nope_offset() const { return 0; }
  std::int64_t rope_offset() const { return nope_dims; }
  std::int64_t scale_count() const { return (nope_dims + kScaleBlock - 1) / kScaleBlock; }
};

// Inside a compressor-state position: the values, then the scores, both fp32.
struct CompressorStateLayout {
  std::int64_t width = 0;  // coff * hd

  std::int64_t value_offset() const { return 0; }
  std::int64_t score_offset() const { return width * 4; }
  std::int64_t bytes() const { return width * 8; }
};

}  // namespace dsv4
