// CudaExecutor: the whole DeepSeek-V4 forward on a Hopper GPU, behind the same Executor
// interface, over the same step plan, page layouts and weights as the CPU executor, which is
// its oracle (every kernel has a CPU twin named in its header under cuda/kernels/).
//
// Memory is planned once: the weights (gpu_weights.h), one pool per page bucket (byte for byte
// the CPU executor's pages), the device page tables, and step scratch sized for the engine's
// step limits; nothing is allocated inside a step. A step is one host-to-device copy of the
// packed plan (DeviceStep: slots, block tables, compression writes, RoPE cos/sin of its
// positions, page-table changes), the kernels of every layer on one stream, and one
// device-to-host copy of the requested logits. Decode steps (one token per row, no MTP, no
// taps) run as CUDA graphs captured per batch bucket (1, 2, 4, ... tokens): kernels read the
// step's counts from device memory, so a graph replays for any step of its bucket.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cuda/device_step.h"
#include "cuda/gpu_weights.h"
#include "cuda/runtime.h"
#include "executor/executor.h"
#include "executor/inspector.h"
#include "kvcache/cache_spec.h"
#include "model/model_config.h"
#include "numerics/rope.h"

namespace dsv4::gpu {

struct CudaOptions {
  double gpu_memory_utilization = 0.9;  // share of the GPU's memory this process may take (vLLM's flag)
  bool cuda_graphs = true;              // replay decode steps as graphs (never in the simulator)
  bool progress = true;                 // weight-loading progress on stderr
  std::int64_t indexer_scores_bytes = std::int64_t{256} << 20;  // scratch for indexer scores per call
  std::int64_t max_logits_rows = 0;     // logits rows a step may ask for (0: every step token, plus MTP rows)
  // Most blocks one query's keys are split over in sparse attention (0: as many as fill the GPU).
  // Splitting merges partial softmaxes whose bf16 probabilities were rounded against their own
  // maxima, not the running one: 1 keeps a token's result independent of the step's size.
  int max_attention_splits = 0;
};

class CudaExecutor final : public Executor {
 public:
  CudaExecutor(ModelConfig config, GpuModelWeights weights, CacheSpec spec, CudaOptions options);
  ~CudaExecutor() override;
  // Reads DIR/config.json and the checkpoint, uploads the weights.
  static std::unique_ptr<CudaExecutor> load(const std::filesystem::path& dir, const CacheOptions& cache,
                                            const CudaOptions& options);
  // Dummy weights of `config`'s shapes (--load-format dummy).
  static std::unique_ptr<CudaExecutor> dummy(const ModelConfig& config, const CacheOptions& cache,
                                             const CudaOptions& options, std::uint64_t seed = 0);

  const ModelConfig& config() const override { return config_; }
  const CacheSpec& cache_spec() const override { return spec_; }
  void allocate(std::span<const std::int64_t> pages_per_bucket, const StepLimits& limits) override;
  void launch(const StepPlan& plan) override;
  std::span<const float> collect_logits() override;
  void set_inspector(Inspector* inspector) override { inspector_ = inspector; }
  std::vector<std::uint8_t> cache_snapshot(int bucket) const override;

  // Bytes of GPU memory left for the KV cache once the weights and the scratch of `limits` are
  // taken, under gpu_memory_utilization; fails with the numbers when nothing is left.
  std::int64_t cache_budget_bytes(const StepLimits& limits) const;
  // Bytes of step scratch for `limits` (without the cache).
  std::int64_t scratch_bytes(const StepLimits& limits) const;
  const GpuModelWeights& weights() const { return weights_; }
  // Steps replayed from CUDA graphs so far (for tests and benchmarks).
  std::int64_t graph_replays() const { return graph_replays_; }

  // Per-kernel-family GPU time of later steps (benchmarks): events around each family of launches.
  // A profiled decode step is captured as a graph with the events as record nodes (GPU time only,
  // as the graph replays run); other steps run eagerly. take_profile() returns and resets the totals.
  struct KernelTime {
    std::string family;
    double ms = 0;
    std::int64_t calls = 0;
  };
  void set_profiling(bool on) { profiling_ = on; }
  std::vector<KernelTime> take_profile();
  // Fills every cache pool with random bytes whose values are finite in every entry format
  // (benchmarks at long context without a long prefill; never timed on zeros).
  void randomize_cache(std::uint64_t seed);

 private:
  struct Scratch;
  struct Packed;
  std::int64_t pack(const StepPlan& plan, const StepPlan* mtp, std::uint8_t* host, std::uint8_t* device) const;
  void forward(std::int32_t capacity, std::int64_t n_logits, std::int64_t n_mtp, const StepPlan* plan);
  void attention_layer(const DeviceStep* step, std::int32_t cap, const GpuBlockWeights& w, const std::uint16_t* h,
                       std::uint16_t* h_out, const StepPlan* taps);
  void ffn_layer(const DeviceStep* step, std::int32_t cap, const GpuBlockWeights& w, const std::uint16_t* h,
                 std::uint16_t* h_out);
  void mtp_block(std::int64_t n_mtp, std::int64_t n_logits);
  void tap_hidden(const StepPlan& plan, std::int64_t layer, const std::uint16_t* h);
  int group_index(CacheKind kind) const { return spec_.group_of(kind); }

  ModelConfig config_;
  GpuModelWeights weights_;
  CacheSpec spec_;
  CudaOptions options_;
  DeviceInfo device_;
  RopeTable rope_window_, rope_compressed_;
  Stream stream_;
  Stream side_stream_;                 // the MoE's shared expert, beside the routed experts (ffn_layer)
  Event shared_fork_, shared_join_;  // its fork from and join into stream_
  Event done_;
  StepLimits limits_;
  std::vector<DeviceBuffer> pools_;        // per bucket
  std::vector<DeviceBuffer> page_tables_;  // per cache group
  std::vector<std::int64_t> pool_pages_;
  std::unique_ptr<Scratch> scratch_;
  PinnedBuffer plan_host_;
  DeviceBuffer plan_device_;
  PinnedBuffer logits_host_;
  std::map<std::int32_t, Graph> graphs_;   // decode steps by bucket
  std::set<std::int32_t> warm_buckets_;    // buckets run once eagerly (module loads) before capture
  Graph profile_graph_;                    // the last profiled decode step (kept until the next)
  bool capturing_ = false;                 // inside profile_graph_'s capture
  GemmPath gemm_path_ = GemmPath::kAuto;   // this step's GEMM kernel policy (launch)
  std::int64_t graph_replays_ = 0;
  // The launched step.
  const StepPlan* launched_ = nullptr;
  std::int64_t launched_rows_ = 0;
  DeviceStep* main_step_ = nullptr;  // device addresses inside plan_device_
  DeviceStep* mtp_step_ = nullptr;
  Inspector* inspector_ = nullptr;
  // Profiling: (family, start, end) event triples of the launched step.
  class ProfileScope;
  bool profiling_ = false;
  std::vector<Event> events_;
  std::vector<std::pair<std::string, std::size_t>> marks_;  // family, index of its start event
  std::vector<KernelTime> profile_;
};

}  // namespace dsv4::gpu
