// DeviceSteps for the GPU op tests: hand-built ones (token ids, positions, logits tokens) for the
// kernels that read only counts and token arrays, and a cache harness that drives the real KV
// cache manager (kvcache/kv_cache_manager.h) and finish_step_plan, keeps device pools and page
// tables next to a host copy of the pools that the CPU encoders write, and packs each StepPlan
// into a DeviceStep the way CudaExecutor::pack does.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/device_step.h"
#include "executor/page_table.h"
#include "executor/step_plan.h"
#include "gpu_test_util.h"
#include "kvcache/kv_cache_manager.h"
#include "model/model_config.h"
#include "numerics/rope.h"

namespace dsv4::gputest {

// A DeviceStep in device memory with its arrays.
struct PackedStep {
  Uploads arrays;
  gpu::DeviceStep host;  // device pointers
  gpu::DeviceBuffer device{sizeof(gpu::DeviceStep)};
  const gpu::DeviceStep* get() const { return device.as<gpu::DeviceStep>(); }
  void upload() { gpu::copy_to_device(device.data(), &host, sizeof host, stream()); }
};

// A step without caches: n tokens with ids, positions and rows given; logits tokens; MTP sources.
std::unique_ptr<PackedStep> simple_step(const std::vector<std::int32_t>& token_ids, const std::vector<std::int32_t>& positions,
                                        const std::vector<std::int32_t>& logits_tokens = {},
                                        const std::vector<std::int32_t>& mtp_source = {});

RopeParams window_rope_params(const ModelConfig& c);
RopeParams compressed_rope_params(const ModelConfig& c);

// cos then sin of `position` ([2 * kRopeHalf]) appended to `out`.
void append_cos_sin(const RopeTable& table, std::int64_t position, std::vector<float>& out);

class CacheHarness {
 public:
  // The tiny preset's layer kinds with the real head sizes (512 / 64 rope, indexer 128), room for
  // `max_seqs` sequences of up to `max_positions` positions in steps of at most `max_step` tokens
  // per sequence (skip() moves in steps of kSkipChunk).
  static constexpr std::int64_t kSkipChunk = 256;
  CacheHarness(KvCacheDtype kv, IndexerCacheDtype index, std::int64_t max_seqs = 4, std::int64_t max_positions = 400,
               std::int64_t max_step = kSkipChunk);

  const ModelConfig& config() const { return config_; }
  const CacheSpec& spec() const { return spec_; }
  KvCacheManager& manager() { return *mgr_; }
  const RopeTable& rope_window() const { return rope_window_; }
  const RopeTable& rope_compressed() const { return rope_compressed_; }
  int group(CacheKind kind) const { return spec_.group_of(kind); }
  std::int32_t layer_slot(CacheKind kind, std::int64_t layer) const;

  // Adds a sequence (its prompt: `length` random tokens).
  void add_sequence(SeqId id, std::int64_t length);
  // Allocates the slices and builds the finished plan (page changes taken and applied to the
  // host page table; the device page tables are updated by pack(), through apply_page_updates).
  StepPlan plan(const std::vector<StepSlice>& slices);
  void commit(const StepPlan& plan);
  // allocate + commit without running anything (moves sequences forward).
  void skip(SeqId id, std::int64_t tokens);

  // The plan as a DeviceStep; runs apply_page_updates for its page changes and checks the device
  // page tables against the host's afterwards.
  std::unique_ptr<PackedStep> pack(const StepPlan& plan);

  // Host copy of the pools ("CPU cache"), and the device pools.
  std::uint8_t* host_entry(int group, std::int64_t slot, std::int64_t layer_slot, bool scales);
  std::uint8_t* device_pool(int bucket) { return pools_[static_cast<std::size_t>(bucket)].as<std::uint8_t>(); }
  std::vector<std::uint8_t>& host_pool(int bucket) { return host_pools_[static_cast<std::size_t>(bucket)]; }
  void upload_pools();                                   // host -> device
  std::vector<std::vector<std::uint8_t>> download_pools();  // device contents
  std::int64_t entry_offset(int group, std::int64_t slot, std::int64_t layer_slot, bool scales) const;

  // Bytes that changed between two pool snapshots outside the listed (bucket, offset, length) regions.
  struct Region {
    int bucket;
    std::int64_t offset, length;
  };
  static std::int64_t stray_bytes(const std::vector<std::vector<std::uint8_t>>& before,
                                  const std::vector<std::vector<std::uint8_t>>& after, const std::vector<Region>& allowed);
  Region entry_region(int group, std::int64_t slot, std::int64_t layer_slot, bool scales) const;

 private:
  ModelConfig config_;
  CacheSpec spec_;
  std::vector<std::int64_t> pages_;
  std::unique_ptr<KvCacheManager> mgr_;
  PageTable table_;
  std::vector<gpu::DeviceBuffer> pools_;
  std::vector<std::vector<std::uint8_t>> host_pools_;
  std::vector<DevArray<std::int32_t>> page_tables_;
  RopeTable rope_window_, rope_compressed_;
  std::mt19937_64 rng_{7};
};

}  // namespace dsv4::gputest
