// DeviceStep: one step plan as the GPU kernels read it -- the StepPlan's flat int32 arrays
// (executor/step_plan.h) plus the RoPE cos/sin values of the step's positions, all in one
// device buffer that the executor fills with a single host-to-device copy per step.
//
// The struct itself lives at the start of that buffer and holds device pointers into it, so
// kernels take one `const DeviceStep*` and read counts at run time: a CUDA graph captured for
// a batch bucket replays correctly for any step that fits the bucket (grids are sized for the
// bucket; blocks past the step's counts return at once).
//
// Plain C++ (no CUDA types): included by host code and kernels alike.
#pragma once

#include <cstdint>

namespace dsv4::gpu {

inline constexpr int kMaxCacheGroups = 7;
inline constexpr int kRopeHalf = 32;  // rope_dim / 2 (64 rope dims; checked at load)

// Addressing of one cache group's entries: slot = block * entries_per_block + entry; the page
// of a layer of a block from the device page table; bytes at pool + page * page_bytes.
struct DeviceCacheGroup {
  std::int32_t* slot_mapping = nullptr;   // [tokens] (-1 = no write)
  std::int32_t* table_base = nullptr;     // [rows]
  std::int32_t* table_start = nullptr;    // [rows + 1]
  std::int32_t* block_ids = nullptr;      // [table_start[rows]]
  const std::int32_t* page_table = nullptr;  // [max_blocks * layers] (persistent, not per step)
  std::uint8_t* pool = nullptr;           // the bucket's memory
  std::int64_t page_bytes = 0;
  std::int32_t layers = 0;                // pages per block (layers of this kind)
  std::int32_t entries_per_block = 0;     // also entries per page
  std::int32_t data_bytes = 0;            // per entry (EntryFormat)
  std::int32_t scale_bytes = 0;
};

// Entries completed in the step for one compress ratio (executor/step_plan.h CompressionPlan).
struct DeviceCompression {
  std::int32_t ratio = 0;
  std::int32_t writes = 0;
  std::int32_t* token = nullptr;          // [writes]
  std::int32_t* entry = nullptr;          // [writes]
  std::int32_t* source = nullptr;         // [writes * slots]
  std::int32_t* state_slot[2] = {nullptr, nullptr};  // [writes * slots] per state group (main, indexer)
  float* rope = nullptr;                  // [writes][2 * kRopeHalf] cos then sin at position j * ratio
};

struct DeviceStep {
  std::int32_t n_tokens = 0;
  std::int32_t n_rows = 0;
  std::int32_t n_logits = 0;
  std::int32_t n_groups = 0;
  std::int32_t* token_ids = nullptr;      // [tokens]
  std::int32_t* positions = nullptr;      // [tokens]
  std::int32_t* token_row = nullptr;      // [tokens]
  std::int32_t* logits_tokens = nullptr;  // [n_logits]
  std::int32_t* mtp_source = nullptr;     // MTP sub-step only: the main-step token of each token
  // cos then sin of every token's position, [tokens][2 * kRopeHalf], for the window-only layers'
  // table (rope_theta) and the compressed layers' table (compress_rope_theta with YaRN).
  float* rope_window = nullptr;
  float* rope_compressed = nullptr;
  DeviceCacheGroup groups[kMaxCacheGroups];
  DeviceCompression c4, c128;
  // Page-table entries to set before anything reads the cache (the plan's PageTableChanges),
  // [page_updates][3]: group, index (block * layers + layer slot), page.
  std::int32_t page_updates = 0;
  std::int32_t* page_update = nullptr;
};

}  // namespace dsv4::gpu
