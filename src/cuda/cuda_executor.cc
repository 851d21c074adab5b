// The GPU executor's host side: memory plan, plan packing, the layer sequence, graphs
// (cuda_executor.h). The math is in cuda/kernels/*.cu; this file only orders the launches.
#include "cuda/cuda_executor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "cuda/kernels/attention.h"
#include "cuda/kernels/compressor.h"
#include "cuda/kernels/fill.h"
#include "cuda/kernels/gemm.h"
#include "cuda/kernels/hyper.h"
#include "cuda/kernels/indexer.h"
#include "cuda/kernels/moe.h"
#include "cuda/kernels/page_table.h"
#include "cuda/kernels/qkv.h"
#include "numerics/bf16.h"

namespace dsv4::gpu {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

RopeParams window_rope(const ModelConfig& c) {
  RopeParams p;
  p.rope_dim = static_cast<int>(c.qk_rope_head_dim);
  p.base = c.rope_theta;
  return p;
}

RopeParams compressed_rope(const ModelConfig& c) {
  RopeParams p = window_rope(c);
  p.base = c.compress_rope_theta;
  p.yarn = true;
  p.factor = c.rope_scaling.factor;
  p.original_max_position = static_cast<double>(c.rope_scaling.original_max_position_embeddings);
  p.beta_fast = c.rope_scaling.beta_fast;
  p.beta_slow = c.rope_scaling.beta_slow;
  return p;
}

// Carves aligned pieces out of one allocation; without a base it only counts.
class Carver {
 public:
  explicit Carver(std::uint8_t* base) : base_(base) {}
  template <class T>
  T* take(std::int64_t count) {
    offset_ = (offset_ + 255) / 256 * 256;
    T* p = base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + offset_);
    offset_ += std::max<std::int64_t>(count, 1) * static_cast<std::int64_t>(sizeof(T));
    return p;
  }
  std::int64_t used() const { return offset_; }

 private:
  std::uint8_t* base_;
  std::int64_t offset_ = 0;
};

const std::int32_t* field(const DeviceStep* step, std::size_t offset) {
  return reinterpret_cast<const std::int32_t*>(reinterpret_cast<const std::uint8_t*>(step) + offset);
}
const std::int32_t* n_tokens_of(const DeviceStep* step) { return field(step, offsetof(DeviceStep, n_tokens)); }
const std::int32_t* n_logits_of(const DeviceStep* step) { return field(step, offsetof(DeviceStep, n_logits)); }

constexpr std::int32_t kMaxGraphBucket = 512;
constexpr std::int64_t kPartialTokens = 256;  // attention split partials: splits * tokens

}  // namespace

// ---- scratch ---------------------------------------------------------------------------------------
struct CudaExecutor::Scratch {
  DeviceBuffer memory;
  std::uint16_t *h0 = nullptr, *h1 = nullptr, *x = nullptr, *qa = nullptr, *qr = nullptr, *q = nullptr, *kv = nullptr;
  std::uint16_t *iq = nullptr, *iw = nullptr, *o = nullptr, *z = nullptr, *attn_out = nullptr, *ffn_out = nullptr;
  std::uint16_t *gu = nullptr, *y = nullptr, *gus = nullptr, *ys = nullptr, *head_y = nullptr;
  std::uint8_t *xq = nullptr, *qrq = nullptr, *index_q_work = nullptr, *zq = nullptr, *hq = nullptr, *hsq = nullptr;
  float *xs = nullptr, *qrs = nullptr, *zs = nullptr, *hs = nullptr, *hss = nullptr;
  std::uint8_t* xsq = nullptr;  // the shared expert's quantized x (its own stream, ffn_layer)
  float* xss = nullptr;
  float *post = nullptr, *comb = nullptr, *state_main = nullptr, *state_index = nullptr, *scores = nullptr;
  float *gate_logits = nullptr, *route_w = nullptr, *slot_w = nullptr, *part_acc = nullptr, *part_ml = nullptr;
  float* logits = nullptr;
  float* hc_scratch = nullptr;
  std::int32_t *top_idx = nullptr, *top_count = nullptr, *top_k_work = nullptr, *key_counts = nullptr, *route_e = nullptr, *source_row = nullptr, *slot_of = nullptr;
  std::int32_t *tile_expert = nullptr, *tile_row0 = nullptr, *tile_rows = nullptr, *num_tiles = nullptr, *num_rows = nullptr;
  // MTP block inputs
  std::uint16_t *mtp_h0 = nullptr, *mtp_h1 = nullptr, *mtp_hn = nullptr, *mtp_hp = nullptr, *mtp_e = nullptr,
                *mtp_ep = nullptr;
  std::uint8_t* mtp_q = nullptr;
  float* mtp_s = nullptr;
  std::int64_t max_tokens = 0, logits_rows = 0, index_chunk = 0, max_entries = 0, max_tiles = 0;

  // Lays the buffers out for `limits` (base null: sizing only); returns the bytes.
  std::int64_t layout(const ModelConfig& c, const StepLimits& limits, const CudaOptions& options, int sm_count,
                      std::uint8_t* base) {
    Carver k(base);
    const std::int64_t T = std::max<std::int64_t>(limits.max_tokens, 1);
    const std::int64_t D = c.hidden_size, hc = c.hc_mult, H = c.num_attention_heads, ql = c.q_lora_rank;
    const std::int64_t E = c.n_routed_experts, K = c.num_experts_per_tok, I = c.moe_intermediate_size;
    const std::int64_t GO = c.o_groups * c.o_lora_rank, IH = c.index_n_heads, V = c.vocab_size;
    bool csa = false;
    for (std::int64_t r : c.compress_ratios) csa = csa || r == 4;
    max_tokens = T;
    logits_rows = options.max_logits_rows > 0 ? options.max_logits_rows : T + (c.num_nextn_predict_layers > 0 ? T : 0);
    // rows of the indexer scores padded to 4 entries: indexer_top_k reads them 16 bytes at a time
    max_entries = csa ? (std::max<std::int64_t>(1, limits.max_context / 4) + 3) / 4 * 4 : 0;
    index_chunk = csa ? std::clamp<std::int64_t>(options.indexer_scores_bytes / (max_entries * 4), 1, T) : 0;
    index_chunk = std::min<std::int64_t>(index_chunk, 65535);
    max_tiles = moe_max_tiles(T, K, E, kSmallRows);
    h0 = k.take<std::uint16_t>(T * hc * D);
    h1 = k.take<std::uint16_t>(T * hc * D);
    x = k.take<std::uint16_t>(T * D);
    xq = k.take<std::uint8_t>(T * D);
    xs = k.take<float>(T * ceil_div(D, 128));
    post = k.take<float>(T * hc);
    hc_scratch = k.take<float>(hc_scratch_floats(std::max(T, logits_rows), HcShape{static_cast<int>(hc), D, 1, 0, 0}));
    comb = k.take<float>(T * hc * hc);
    qa = k.take<std::uint16_t>(T * ql);
    qr = k.take<std::uint16_t>(T * ql);
    qrq = k.take<std::uint8_t>(T * ql);
    qrs = k.take<float>(T * ceil_div(ql, 128));
    q = k.take<std::uint16_t>(T * H * 512);
    kv = k.take<std::uint16_t>(T * 512);
    state_main = k.take<float>(T * 2 * 2 * 512);
    if (csa) {
      state_index = k.take<float>(T * 2 * 2 * c.index_head_dim);
      iq = k.take<std::uint16_t>(T * IH * c.index_head_dim);
      iw = k.take<std::uint16_t>(T * IH);
      scores = k.take<float>(index_chunk * max_entries);
      top_idx = k.take<std::int32_t>(T * c.index_topk);
      top_count = k.take<std::int32_t>(T);
      // top-k workspace for the largest need of any call size (fewer tokens, more segments)
      std::int64_t work = 0;
      for (std::int64_t n = 1; n <= index_chunk; ++n)
        work = std::max(work, indexer_top_k_work_ints(n, indexer_top_k_segments(n, max_entries, sm_count)));
      top_k_work = k.take<std::int32_t>(std::max<std::int64_t>(work, 1));
      index_q_work = k.take<std::uint8_t>(indexer_q_work_bytes(index_chunk));
      key_counts = k.take<std::int32_t>(indexer_key_count_ints(index_chunk));  // zeroed by allocate()
    }
    o = k.take<std::uint16_t>(T * H * 512);
    part_acc = k.take<float>(kPartialTokens * H * 512);
    part_ml = k.take<float>(kPartialTokens * H * 2);
    z = k.take<std::uint16_t>(T * GO);
    zq = k.take<std::uint8_t>(T * GO);
    zs = k.take<float>(T * ceil_div(GO, 128));
    attn_out = k.take<std::uint16_t>(T * D);
    ffn_out = k.take<std::uint16_t>(T * D);
    gate_logits = k.take<float>(moe_gate_logit_floats(T, E));
    route_e = k.take<std::int32_t>(T * K);
    route_w = k.take<float>(T * K);
    source_row = k.take<std::int32_t>(T * K);
    slot_of = k.take<std::int32_t>(T * K);
    slot_w = k.take<float>(T * K);
    tile_expert = k.take<std::int32_t>(max_tiles);
    tile_row0 = k.take<std::int32_t>(max_tiles);
    tile_rows = k.take<std::int32_t>(max_tiles);
    num_tiles = k.take<std::int32_t>(1);
    num_rows = k.take<std::int32_t>(1);
    gu = k.take<std::uint16_t>(T * K * 2 * I);
    hq = k.take<std::uint8_t>(T * K * I);
    hs = k.take<float>(T * K * ceil_div(I, 128));
    y = k.take<std::uint16_t>(T * K * D);
    gus = k.take<std::uint16_t>(T * 2 * I);
    hsq = k.take<std::uint8_t>(T * I);
    hss = k.take<float>(T * ceil_div(I, 128));
    xsq = k.take<std::uint8_t>(T * D);
    xss = k.take<float>(T * ceil_div(D, 128));
    ys = k.take<std::uint16_t>(T * D);
    head_y = k.take<std::uint16_t>(logits_rows * D);
    logits = k.take<float>(logits_rows * V);
    if (c.num_nextn_predict_layers > 0) {
      mtp_h0 = k.take<std::uint16_t>(T * hc * D);
      mtp_h1 = k.take<std::uint16_t>(T * hc * D);
      mtp_hn = k.take<std::uint16_t>(T * hc * D);
      mtp_hp = k.take<std::uint16_t>(T * hc * D);
      mtp_e = k.take<std::uint16_t>(T * D);
      mtp_ep = k.take<std::uint16_t>(T * D);
      mtp_q = k.take<std::uint8_t>(T * hc * D);
      mtp_s = k.take<float>(T * hc * ceil_div(D, 128));
    }
    return k.used();
  }
};

// ---- profiling ---------------------------------------------------------------------------------
// Records an event pair around one family of launches when profiling is on.
class CudaExecutor::ProfileScope {
 public:
  ProfileScope(CudaExecutor& e, const char* family) : e_(e) {
    if (!e_.profiling_) return;
    index_ = e_.marks_.size() * 2;
    while (e_.events_.size() < index_ + 2) e_.events_.emplace_back();
    record(e_.events_[index_]);
    e_.marks_.emplace_back(family, index_);
  }
  ~ProfileScope() {
    if (e_.profiling_) record(e_.events_[index_ + 1]);
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  void record(Event& event) {
    if (e_.capturing_) event.record_in_graph(e_.stream_);
    else event.record(e_.stream_);
  }
  CudaExecutor& e_;
  std::size_t index_ = 0;
};

std::vector<CudaExecutor::KernelTime> CudaExecutor::take_profile() {
  std::vector<KernelTime> out;
  out.swap(profile_);
  return out;
}

// ---- construction and memory -------------------------------------------------------------------
CudaExecutor::CudaExecutor(ModelConfig config, GpuModelWeights weights, CacheSpec spec, CudaOptions options)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      spec_(std::move(spec)),
      options_(options),
      device_(device_info()),
      rope_window_(window_rope(config_)),
      rope_compressed_(compressed_rope(config_)) {
  if (spec_.options.mtp_layers != (config_.num_nextn_predict_layers > 0) && config_.num_nextn_predict_layers > 0)
    fail("GPU executor: the cache must include the MTP layers");
}

CudaExecutor::~CudaExecutor() = default;

namespace {
std::int64_t usable_bytes(const DeviceInfo& d, double utilization) {
  if (!(utilization > 0.0 && utilization <= 1.0)) fail("--gpu-memory-utilization must be in (0, 1], found {}", utilization);
  return static_cast<std::int64_t>(static_cast<double>(d.total_bytes) * utilization);
}
}  // namespace

std::unique_ptr<CudaExecutor> CudaExecutor::load(const std::filesystem::path& dir, const CacheOptions& cache,
                                                 const CudaOptions& options) {
  ModelConfig config = ModelConfig::from_file(dir / "config.json");
  const DeviceInfo device = device_info();
  GpuModelWeights weights;
  try {
    weights = GpuModelWeights::load(config, Checkpoint::open(dir), usable_bytes(device, options.gpu_memory_utilization),
                                    options.progress);
  } catch (const Error& e) {
    throw e.in(dir.string());
  }
  CacheSpec spec = CacheSpec::build(config, cache);
  return std::make_unique<CudaExecutor>(std::move(config), std::move(weights), std::move(spec), options);
}

std::unique_ptr<CudaExecutor> CudaExecutor::dummy(const ModelConfig& config, const CacheOptions& cache,
                                                  const CudaOptions& options, std::uint64_t seed) {
  const DeviceInfo device = device_info();
  GpuModelWeights weights = GpuModelWeights::dummy(config, seed, usable_bytes(device, options.gpu_memory_utilization));
  CacheSpec spec = CacheSpec::build(config, cache);
  return std::make_unique<CudaExecutor>(config, std::move(weights), std::move(spec), options);
}

std::int64_t CudaExecutor::scratch_bytes(const StepLimits& limits) const {
  Scratch s;
  return s.layout(config_, limits, options_, device_.sm_count, nullptr);
}

std::int64_t CudaExecutor::cache_budget_bytes(const StepLimits& limits) const {
  const std::int64_t usable = usable_bytes(device_, options_.gpu_memory_utilization);
  const std::int64_t reserve = std::int64_t{512} << 20;  // CUDA context, graphs, library workspaces
  const std::int64_t taken = weights_.bytes + scratch_bytes(limits) + reserve;
  const std::int64_t left = usable - taken;
  if (left <= 0) {
    fail("GPU memory: the weights ({:.2f} GB) and step scratch ({:.2f} GB for {} tokens a step) leave no room for the KV "
         "cache in {:.2f} GB ({} x {:.2f} GB); lower --max-num-batched-tokens or raise --gpu-memory-utilization",
         weights_.bytes / 1e9, scratch_bytes(limits) / 1e9, limits.max_tokens, usable / 1e9,
         options_.gpu_memory_utilization, device_.total_bytes / 1e9);
  }
  return left;
}

void CudaExecutor::allocate(std::span<const std::int64_t> pages_per_bucket, const StepLimits& limits) {
  if (pages_per_bucket.size() != spec_.buckets.size())
    fail("GPU executor: {} page counts for {} buckets", pages_per_bucket.size(), spec_.buckets.size());
  limits_ = limits;
  if (limits_.max_context <= 0) limits_.max_context = config_.max_position_embeddings;
  std::int64_t cache_bytes = 0;
  for (std::size_t b = 0; b < spec_.buckets.size(); ++b) cache_bytes += pages_per_bucket[b] * spec_.buckets[b];
  const std::int64_t need = cache_bytes + scratch_bytes(limits_);
  const DeviceInfo now = device_info();
  if (need > now.free_bytes) {
    fail("GPU memory: the KV cache ({:.2f} GB) and step scratch ({:.2f} GB) need {:.2f} GB, {:.2f} GB are free",
         cache_bytes / 1e9, scratch_bytes(limits_) / 1e9, need / 1e9, now.free_bytes / 1e9);
  }
  pools_.clear();
  pool_pages_.assign(pages_per_bucket.begin(), pages_per_bucket.end());
  for (std::size_t b = 0; b < spec_.buckets.size(); ++b) {
    pools_.emplace_back(static_cast<std::size_t>(pages_per_bucket[b] * spec_.buckets[b]));
    fill_bytes(pools_.back().data(), 0, pools_.back().size(), stream_);
  }
  page_tables_.clear();
  for (const CacheGroup& g : spec_.groups) {
    const std::int64_t blocks = pages_per_bucket[static_cast<std::size_t>(g.bucket)] / std::max<std::int64_t>(g.num_layers(), 1);
    page_tables_.emplace_back(static_cast<std::size_t>(std::max<std::int64_t>(blocks * g.num_layers(), 1)) * 4);
    fill_bytes(page_tables_.back().data(), 0xff, page_tables_.back().size(), stream_);
  }
  scratch_ = std::make_unique<Scratch>();
  const std::int64_t bytes = scratch_->layout(config_, limits_, options_, device_.sm_count, nullptr);
  scratch_->memory = DeviceBuffer(static_cast<std::size_t>(bytes));
  scratch_->layout(config_, limits_, options_, device_.sm_count, scratch_->memory.as<std::uint8_t>());
  // the indexer's key counts start at zero (each scores call leaves them so)
  if (scratch_->key_counts != nullptr)
    fill_bytes(scratch_->key_counts, 0, static_cast<std::size_t>(indexer_key_count_ints(scratch_->index_chunk)) * 4, stream_);
  logits_host_ = PinnedBuffer(static_cast<std::size_t>(scratch_->logits_rows * config_.vocab_size) * sizeof(float));
  graphs_.clear();
  warm_buckets_.clear();
  stream_.synchronize();
}

std::vector<std::uint8_t> CudaExecutor::cache_snapshot(int bucket) const {
  const DeviceBuffer& pool = pools_.at(static_cast<std::size_t>(bucket));
  std::vector<std::uint8_t> bytes(pool.size());
  Stream copy;
  copy_to_host(bytes.data(), pool.data(), bytes.size(), copy);
  copy.synchronize();
  return bytes;
}

void CudaExecutor::randomize_cache(std::uint64_t seed) {
  // Bytes 0x30..0x37: e4m3 codes 0.5 .. 0.94, UE8M0 scales 2^-79 .. 2^-72, bf16 / fp32 values
  // around 1e-9 .. 0.7 -- finite whatever format a byte belongs to. The UE8M0 scales of an
  // entry stay within 8 binades, as a model's FP4 indexer keys do (16 binades, the range of
  // 0x30..0x3f, sent most cache blocks down the indexer's exact path, which real keys -- their
  // four block scales a few binades apart after the Hadamard rotation -- practically never take).
  for (std::size_t b = 0; b < pools_.size(); ++b)
    fill_bytes_in_range(pools_[b].as<std::uint8_t>(), static_cast<std::int64_t>(pools_[b].size()), seed + b, 0x30, 0x37,
                        stream_.handle());
  stream_.synchronize();
}

// ---- plan packing ------------------------------------------------------------------------------------
namespace {

// Appends arrays to the host staging buffer and returns where they will be on the device.
class PlanWriter {
 public:
  PlanWriter(std::uint8_t* host, std::uint8_t* device) : host_(host), device_(device) {}
  template <class T>
  T* put(const T* values, std::size_t n) {
    T* dst = reserve<T>(n);
    if (host_ != nullptr && n > 0) std::memcpy(host_ + (reinterpret_cast<std::uint8_t*>(dst) - device_), values, n * sizeof(T));
    return dst;
  }
  template <class T>
  T* put(const std::vector<T>& v) {
    return put(v.data(), v.size());
  }
  template <class T>
  T* reserve(std::size_t n) {
    offset_ = (offset_ + 15) / 16 * 16;
    T* dst = reinterpret_cast<T*>(device_ + offset_);
    offset_ += static_cast<std::int64_t>(std::max<std::size_t>(n, 1) * sizeof(T));
    return dst;
  }
  template <class T>
  T* host_of(T* device_ptr) {
    return reinterpret_cast<T*>(host_ + (reinterpret_cast<std::uint8_t*>(device_ptr) - device_));
  }
  bool sizing() const { return host_ == nullptr; }
  std::int64_t used() const { return offset_; }

 private:
  std::uint8_t* host_;
  std::uint8_t* device_;
  std::int64_t offset_ = 0;
};

void put_rope(PlanWriter& w, const RopeTable& table, const std::vector<std::int32_t>& positions, std::int64_t scale,
              float** out) {
  float* dev = w.reserve<float>(positions.size() * 2 * kRopeHalf);
  *out = dev;
  if (w.sizing()) return;
  float* host = w.host_of(dev);
  for (std::size_t i = 0; i < positions.size(); ++i) {
    float* cs = host + i * 2 * kRopeHalf;
    table.cos_sin(static_cast<std::int64_t>(positions[i]) * scale, std::span<float>(cs, kRopeHalf),
                  std::span<float>(cs + kRopeHalf, kRopeHalf));
  }
}

}  // namespace

// Packs `plan` (and the MTP sub-plan) into host staging that mirrors the device buffer;
// host null: sizing only. Returns the bytes.
std::int64_t CudaExecutor::pack(const StepPlan& plan, const StepPlan* mtp, std::uint8_t* host, std::uint8_t* device) const {
  PlanWriter w(host, device);
  DeviceStep* steps[2] = {w.reserve<DeviceStep>(1), mtp != nullptr ? w.reserve<DeviceStep>(1) : nullptr};
  const StepPlan* plans[2] = {&plan, mtp};
  for (int which = 0; which < 2; ++which) {
    const StepPlan* p = plans[which];
    if (p == nullptr) continue;
    DeviceStep s;
    s.n_tokens = static_cast<std::int32_t>(p->num_tokens());
    s.n_rows = static_cast<std::int32_t>(p->num_rows());
    s.n_logits = static_cast<std::int32_t>(p->logits_tokens.size());
    s.n_groups = spec_.num_groups();
    s.token_ids = w.put(p->token_ids);
    s.positions = w.put(p->view.positions);
    s.token_row = w.put(p->token_row);
    s.logits_tokens = w.put(p->logits_tokens);
    if (which == 1) s.mtp_source = w.put(plan.mtp_rows);
    put_rope(w, rope_window_, p->view.positions, 1, &s.rope_window);
    put_rope(w, rope_compressed_, p->view.positions, 1, &s.rope_compressed);
    for (int g = 0; g < spec_.num_groups(); ++g) {
      const CacheGroup& cg = spec_.groups[static_cast<std::size_t>(g)];
      const GroupStepView& v = p->view.groups[static_cast<std::size_t>(g)];
      DeviceCacheGroup& d = s.groups[g];
      d.slot_mapping = w.put(v.slot_mapping);
      d.table_base = w.put(v.table_base);
      d.table_start = w.put(v.table_start);
      d.block_ids = w.put(v.block_ids);
      d.page_table = page_tables_.empty() ? nullptr : page_tables_[static_cast<std::size_t>(g)].as<std::int32_t>();
      d.pool = pools_.empty() ? nullptr : const_cast<std::uint8_t*>(pools_[static_cast<std::size_t>(cg.bucket)].as<std::uint8_t>());
      d.page_bytes = cg.page_bytes;
      d.layers = static_cast<std::int32_t>(cg.num_layers());
      d.entries_per_block = static_cast<std::int32_t>(cg.entries_per_block());
      d.data_bytes = static_cast<std::int32_t>(cg.format.data_bytes);
      d.scale_bytes = static_cast<std::int32_t>(cg.format.scale_bytes);
    }
    for (int r = 0; r < 2; ++r) {
      const CompressionPlan& cp = r == 0 ? p->c4 : p->c128;
      DeviceCompression& d = r == 0 ? s.c4 : s.c128;
      d.ratio = cp.ratio;
      d.writes = static_cast<std::int32_t>(cp.num_writes());
      d.token = w.put(cp.token);
      d.entry = w.put(cp.entry);
      d.source = w.put(cp.source);
      for (std::size_t i = 0; i < 2; ++i) d.state_slot[i] = i < cp.state_slots.size() ? w.put(cp.state_slots[i]) : nullptr;
      std::vector<std::int32_t> entry_positions;
      for (std::int32_t j : cp.entry) entry_positions.push_back(j);
      put_rope(w, rope_compressed_, entry_positions, cp.ratio, &d.rope);
    }
    if (which == 0) {
      std::vector<std::int32_t> updates;
      for (std::size_t g = 0; g < p->page_changes.groups.size(); ++g) {
        const PageTableChanges::Group& c = p->page_changes.groups[g];
        const std::int64_t layers = spec_.groups[g].num_layers();
        for (std::size_t b = 0; b < c.blocks.size(); ++b) {
          for (std::int64_t l = 0; l < layers; ++l) {
            updates.push_back(static_cast<std::int32_t>(g));
            updates.push_back(static_cast<std::int32_t>(c.blocks[b] * layers + l));
            updates.push_back(c.pages[b * static_cast<std::size_t>(layers) + static_cast<std::size_t>(l)]);
          }
        }
      }
      s.page_updates = static_cast<std::int32_t>(updates.size() / 3);
      s.page_update = w.put(updates);
    }
    if (!w.sizing()) std::memcpy(w.host_of(steps[which]), &s, sizeof s);
  }
  return w.used();
}

// ---- a step --------------------------------------------------------------------------------------------
void CudaExecutor::launch(const StepPlan& plan) {
  if (!scratch_) fail("GPU executor: allocate was not called");
  if (launched_ != nullptr) fail("GPU executor: a step was launched and not collected");
  const std::int64_t T = plan.num_tokens();
  if (T > limits_.max_tokens || plan.num_rows() > std::max<std::int64_t>(limits_.max_rows, limits_.max_tokens))
    fail("GPU executor: a step of {} tokens in {} rows exceeds the prepared {} tokens", T, plan.num_rows(), limits_.max_tokens);
  if (plan.token_row.size() != static_cast<std::size_t>(T)) fail("GPU executor: the plan was not finished (finish_step_plan)");
  if (!plan.mtp_tokens.empty() && weights_.mtp.empty()) fail("GPU executor: the model has no MTP block");
  for (std::int32_t id : plan.token_ids)
    if (id < 0 || id >= config_.vocab_size) fail("token id {} is outside the vocabulary [0, {})", id, config_.vocab_size);
  const std::int64_t n_mtp = plan.num_mtp_tokens();
  const std::int64_t n_logits = static_cast<std::int64_t>(plan.logits_tokens.size());
  if (n_logits + n_mtp > scratch_->logits_rows) fail("GPU executor: {} logits rows exceed the prepared {}", n_logits + n_mtp, scratch_->logits_rows);

  std::unique_ptr<StepPlan> sub;
  if (n_mtp > 0) sub = std::make_unique<StepPlan>(mtp_sub_plan(plan));
  const std::int64_t bytes = pack(plan, sub.get(), nullptr, nullptr);
  if (static_cast<std::int64_t>(plan_host_.size()) < bytes) {
    const auto grown = static_cast<std::size_t>(std::max<std::int64_t>(bytes, std::int64_t{1} << 20) * 2);
    stream_.synchronize();
    plan_host_ = PinnedBuffer(grown);
    plan_device_ = DeviceBuffer(grown);
    graphs_.clear();  // the graphs read the old plan buffer
    warm_buckets_.clear();
  }
  pack(plan, sub.get(), plan_host_.as<std::uint8_t>(), plan_device_.as<std::uint8_t>());
  main_step_ = plan_device_.as<DeviceStep>();
  mtp_step_ = n_mtp > 0 ? main_step_ + 1 : nullptr;
  copy_to_device(plan_device_.data(), plan_host_.data(), static_cast<std::size_t>(bytes), stream_);
  const std::int32_t updates = [&] {
    std::int64_t n = 0;
    for (std::size_t g = 0; g < plan.page_changes.groups.size(); ++g)
      n += static_cast<std::int64_t>(plan.page_changes.groups[g].blocks.size()) * spec_.groups[g].num_layers();
    return static_cast<std::int32_t>(n);
  }();
  apply_page_updates(main_step_, updates, stream_.handle());

  bool decode = n_mtp == 0 && inspector_ == nullptr && options_.cuda_graphs && !simulated() && T <= kMaxGraphBucket;
  for (std::int64_t r = 0; decode && r < plan.num_rows(); ++r)
    decode = plan.view.token_start[static_cast<std::size_t>(r) + 1] - plan.view.token_start[static_cast<std::size_t>(r)] == 1;
  // Decode steps pick GEMM kernels for speed; steps with prompt tokens take cuBLASLt's
  // block-scaled product for dense fp8 weights (else the tile kernels) from 17 rows on (GemmPath).
  // cuBLASLt may pick another algorithm for another row count, so a prompt chunked differently
  // can differ in summation order (tests/cuda PathsAgreeOnTheGpu bounds it).
  gemm_path_ = decode ? GemmPath::kAuto : GemmPath::kAutoPrefill;
  std::int32_t bucket = 1;
  while (bucket < T) bucket *= 2;
  bucket = std::min<std::int32_t>(bucket, static_cast<std::int32_t>(limits_.max_tokens));
  if (decode && profiling_ && warm_buckets_.count(bucket) != 0) {
    // A profiled decode step runs as a graph too, with its event pairs as record nodes: the times
    // are the GPU's alone, not paced by the host's launches.
    profile_graph_ = Graph();
    capturing_ = true;
    profile_graph_.begin_capture(stream_);
    forward(bucket, 0, 0, nullptr);
    profile_graph_.end_capture(stream_);
    capturing_ = false;
    profile_graph_.replay(stream_);
  } else if (decode && !profiling_) {
    auto it = graphs_.find(bucket);
    if (it != graphs_.end()) {
      it->second.replay(stream_);
      ++graph_replays_;
    } else if (warm_buckets_.count(bucket) != 0) {
      Graph& g = graphs_[bucket];
      g.begin_capture(stream_);
      forward(bucket, 0, 0, nullptr);
      g.end_capture(stream_);
      g.replay(stream_);
      ++graph_replays_;
    } else {
      forward(bucket, 0, 0, nullptr);
      warm_buckets_.insert(bucket);
    }
  } else {
    forward(static_cast<std::int32_t>(T), n_logits, n_mtp, &plan);
  }
  launched_rows_ = n_logits + n_mtp;
  copy_to_host(logits_host_.data(), scratch_->logits, static_cast<std::size_t>(launched_rows_ * config_.vocab_size) * sizeof(float),
               stream_);
  done_.record(stream_);
  launched_ = &plan;
}

std::span<const float> CudaExecutor::collect_logits() {
  if (launched_ == nullptr) fail("GPU executor: collect without a launched step");
  launched_ = nullptr;
  done_.synchronize();
  for (const auto& [family, index] : marks_) {
    const double ms = Event::elapsed_ms(events_[index], events_[index + 1]);
    auto it = std::find_if(profile_.begin(), profile_.end(), [&](const KernelTime& k) { return k.family == family; });
    if (it == profile_.end()) {
      profile_.push_back({family, ms, 1});
    } else {
      it->ms += ms;
      ++it->calls;
    }
  }
  marks_.clear();
  // The logits stay in the pinned buffer they were copied to (valid until the next launch).
  const auto n = static_cast<std::size_t>(launched_rows_ * config_.vocab_size);
  return {static_cast<const float*>(logits_host_.data()), n};
}

// The whole model for `capacity` tokens (a graph bucket, or the step's tokens). n_logits /
// n_mtp: the head's rows when the host knows them; a decode bucket passes 0 and the head covers
// `capacity` rows, reading the step's count on the device. `plan` (set outside graphs) feeds
// the inspector.
void CudaExecutor::forward(std::int32_t capacity, std::int64_t n_logits, std::int64_t n_mtp, const StepPlan* plan) {
  const ModelConfig& c = config_;
  Scratch& s = *scratch_;
  const gpu_stream_t st = stream_.handle();
  const HcShape shape{static_cast<int>(c.hc_mult), c.hidden_size, static_cast<int>(c.hc_sinkhorn_iters),
                      static_cast<float>(c.rms_norm_eps), static_cast<float>(c.hc_eps)};
  {
    ProfileScope prof(*this, "embed");
    embed_streams(main_step_, capacity, weights_.embed, s.h0, shape, st);
  }
  std::uint16_t* h = s.h0;
  std::uint16_t* other = s.h1;
  for (const GpuBlockWeights& w : weights_.blocks) {
    attention_layer(main_step_, capacity, w, h, other, inspector_ != nullptr ? plan : nullptr);
    ffn_layer(main_step_, capacity, w, other, h);
    if (inspector_ != nullptr && plan != nullptr) tap_hidden(*plan, w.layer, h);
  }
  // Head (SPEC 3.1 end): pre-only mixing, final norm, fp32 logits of the wanted tokens.
  const std::int32_t head_rows = n_logits > 0 ? static_cast<std::int32_t>(n_logits) : capacity;
  if (n_logits > 0 || plan == nullptr) {
    {
      ProfileScope prof(*this, "head");
      hc_head(h, main_step_, false, head_rows, weights_.hc_head, weights_.norm, shape, s.head_y, s.hc_scratch, st);
      gemm_bf16(s.head_y, c.hidden_size, head_rows, weights_.head, 1, GemmOutput{s.logits, c.vocab_size, true},
                n_logits_of(main_step_), st, gemm_path_);
    }
  }
  if (n_mtp > 0) mtp_block(n_mtp, n_logits);
}

// SPEC.md 3.6, as CpuExecutor::mtp_block: the MTP block over the step tokens whose next token is
// known, from the main model's final streams; its logits rows follow the main ones.
void CudaExecutor::mtp_block(std::int64_t n_mtp, std::int64_t n_logits) {
  const ModelConfig& c = config_;
  Scratch& s = *scratch_;
  const gpu_stream_t st = stream_.handle();
  const GpuMtpWeights& m = weights_.mtp.front();
  const std::int64_t D = c.hidden_size, hc = c.hc_mult;
  const auto n = static_cast<std::int32_t>(n_mtp);
  const float eps = static_cast<float>(c.rms_norm_eps);
  const HcShape shape{static_cast<int>(hc), D, static_cast<int>(c.hc_sinkhorn_iters), eps, static_cast<float>(c.hc_eps)};
  const HcShape one{1, D, 1, eps, static_cast<float>(c.hc_eps)};
  // stream_i = bf16(h_proj(hnorm(h_t,i)) + e_proj(enorm(embed(token t+1)))).
  gather_mtp_rows(s.h0, mtp_step_, n, hc * D, s.mtp_hn, st);
  rms_norm_rows(s.mtp_hn, m.hnorm, n * hc, D, eps, s.mtp_hn, nullptr, st);
  quantize_activations(s.mtp_hn, D, n * hc, D, s.mtp_q, s.mtp_s, nullptr, st);
  gemm_quantized(QuantizedRows{s.mtp_q, s.mtp_s, D}, n * hc, m.h_proj, GemmOutput{s.mtp_hp, D, false}, nullptr, st, gemm_path_);
  embed_streams(mtp_step_, n, weights_.embed, s.mtp_e, one, st);
  rms_norm_rows(s.mtp_e, m.enorm, n, D, eps, s.mtp_e, nullptr, st);
  quantize_activations(s.mtp_e, D, n, D, s.mtp_q, s.mtp_s, nullptr, st);
  gemm_quantized(QuantizedRows{s.mtp_q, s.mtp_s, D}, n, m.e_proj, GemmOutput{s.mtp_ep, D, false}, nullptr, st, gemm_path_);
  mtp_streams(s.mtp_hp, s.mtp_ep, shape, n, s.mtp_h0, st);
  attention_layer(mtp_step_, n, m.block, s.mtp_h0, s.mtp_h1, nullptr);
  ffn_layer(mtp_step_, n, m.block, s.mtp_h1, s.mtp_h0);
  hc_head(s.mtp_h0, mtp_step_, true, n, m.hc_head, m.norm, shape, s.head_y, s.hc_scratch, st);
  gemm_bf16(s.head_y, D, n, weights_.head, 1, GemmOutput{s.logits + n_logits * c.vocab_size, c.vocab_size, true}, nullptr, st, gemm_path_);
}

void CudaExecutor::attention_layer(const DeviceStep* step, std::int32_t cap, const GpuBlockWeights& w, const std::uint16_t* h,
                                   std::uint16_t* h_out, const StepPlan* taps) {
  const ModelConfig& c = config_;
  Scratch& s = *scratch_;
  const gpu_stream_t st = stream_.handle();
  const std::int32_t* n_dev = n_tokens_of(step);
  const std::int64_t D = c.hidden_size, H = c.num_attention_heads, ql = c.q_lora_rank, r = w.ratio;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const HcShape shape{static_cast<int>(c.hc_mult), D, static_cast<int>(c.hc_sinkhorn_iters), eps, static_cast<float>(c.hc_eps)};
  const bool kv_fp8 = spec_.options.kv_dtype == KvCacheDtype::kFp8;
  auto slot_of_layer = [&](CacheKind kind) {
    return static_cast<std::int32_t>(spec_.groups[static_cast<std::size_t>(group_index(kind))].layer_slot(w.layer));
  };

  // hc pre + attn_norm; q and kv projections; q / kv finished, kv into the window cache.
  const QuantizedRows xq{s.xq, s.xs, D};
  const QuantizedRows qrq{s.qrq, s.qrs, ql};
  {
    ProfileScope prof(*this, "attn: hc_pre + q/kv projections");
    hc_pre(h, w.hc_attn, w.attn_norm, shape, cap, s.x, s.post, s.comb, n_dev, s.hc_scratch, st);
    quantize_activations(s.x, D, cap, D, s.xq, s.xs, n_dev, st);
    gemm_quantized(xq, cap, w.wq_a, GemmOutput{s.qa, ql, false}, n_dev, st, gemm_path_);
    rms_norm_rows(s.qa, w.q_norm, cap, ql, eps, s.qr, n_dev, st);
    quantize_activations(s.qr, ql, cap, ql, s.qrq, s.qrs, n_dev, st);
    gemm_quantized(qrq, cap, w.wq_b, GemmOutput{s.q, H * 512, false}, n_dev, st, gemm_path_);
    gemm_quantized(xq, cap, w.wkv, GemmOutput{s.kv, 512, false}, n_dev, st, gemm_path_);
  }
  {
    ProfileScope prof(*this, "attn: q/kv norm + RoPE + window insert");
    QkvArgs qkv;
    qkv.step = step;
    qkv.capacity = cap;
    qkv.compressed_rope = r > 0;
    qkv.q = s.q;
    qkv.heads = static_cast<std::int32_t>(H);
    qkv.kv = s.kv;
    qkv.kv_norm = w.kv_norm;
    qkv.eps = eps;
    qkv.window_group = group_index(CacheKind::kWindowKv);
    qkv.layer_slot = slot_of_layer(CacheKind::kWindowKv);
    qkv.kv_fp8 = kv_fp8;
    finish_q_and_window_kv(qkv, st);
  }

  // Compressor projections (fp32) into the step's state rows and the state cache (SPEC 3.3).
  CompressorArgs main_c, index_c;
  if (r > 0) {
    ProfileScope prof(*this, "attn: compressor projections + state");
    const GpuCompressorWeights& cw = *w.compressor;
    const std::int64_t pd = (r == 4 ? 2 : 1) * 512;
    gemm_bf16(s.x, D, cap, cw.wkv, 1, GemmOutput{s.state_main, 2 * pd, true}, n_dev, st, gemm_path_);
    gemm_bf16(s.x, D, cap, cw.wgate, 1, GemmOutput{s.state_main + pd, 2 * pd, true}, n_dev, st, gemm_path_);
    main_c.step = step;
    main_c.capacity = cap;
    main_c.ratio = static_cast<std::int32_t>(r);
    main_c.head_dim = 512;
    main_c.state = s.state_main;
    main_c.ape = cw.ape;
    const CacheKind state_kind = r == 4 ? CacheKind::kCsaState : CacheKind::kHcaState;
    main_c.state_group = group_index(state_kind);
    main_c.state_index = 0;
    main_c.state_layer_slot = slot_of_layer(state_kind);
    main_c.norm = cw.norm;
    main_c.eps = eps;
    const CacheKind entry_kind = r == 4 ? CacheKind::kCsaKv : CacheKind::kHcaKv;
    main_c.entry_group = group_index(entry_kind);
    main_c.entry_layer_slot = slot_of_layer(entry_kind);
    main_c.target = CompressorTarget::kMainKv;
    main_c.kv_fp8 = kv_fp8;
    finish_compressor_state(main_c, st);
  }
  const IndexerFormat index_format = spec_.options.indexer_dtype == IndexerCacheDtype::kFp4   ? IndexerFormat::kFp4
                                     : spec_.options.indexer_dtype == IndexerCacheDtype::kFp8 ? IndexerFormat::kFp8
                                                                                              : IndexerFormat::kBf16;
  IndexerArgs ix;
  if (r == 4) {
    ProfileScope prof(*this, "attn: indexer query + weights + compressor");
    const GpuIndexerWeights& iw = *w.indexer;
    const std::int64_t IH = c.index_n_heads, ID = c.index_head_dim;
    gemm_quantized(qrq, cap, iw.wq_b, GemmOutput{s.iq, IH * ID, false}, n_dev, st, gemm_path_);
    ix.step = step;
    ix.capacity = cap;
    ix.heads = static_cast<std::int32_t>(IH);
    ix.q = s.iq;
    ix.weights = s.iw;
    ix.key_group = group_index(CacheKind::kIndexerKv);
    ix.layer_slot = slot_of_layer(CacheKind::kIndexerKv);
    ix.format = index_format;
    ix.max_entries = s.max_entries;
    ix.top_k = static_cast<std::int32_t>(c.index_topk);
    ix.sm_count = device_.sm_count;
    indexer_query(ix, st);
    gemm_bf16(s.x, D, cap, iw.weights_proj, 1, GemmOutput{s.iw, IH, false}, n_dev, st, gemm_path_);
    const std::int64_t pd = 2 * ID;
    gemm_bf16(s.x, D, cap, iw.compressor.wkv, 1, GemmOutput{s.state_index, 2 * pd, true}, n_dev, st, gemm_path_);
    gemm_bf16(s.x, D, cap, iw.compressor.wgate, 1, GemmOutput{s.state_index + pd, 2 * pd, true}, n_dev, st, gemm_path_);
    index_c = main_c;
    index_c.head_dim = static_cast<std::int32_t>(ID);
    index_c.state = s.state_index;
    index_c.ape = iw.compressor.ape;
    index_c.state_group = group_index(CacheKind::kIndexerState);
    index_c.state_index = 1;
    index_c.state_layer_slot = slot_of_layer(CacheKind::kIndexerState);
    index_c.norm = iw.compressor.norm;
    index_c.entry_group = group_index(CacheKind::kIndexerKv);
    index_c.entry_layer_slot = slot_of_layer(CacheKind::kIndexerKv);
    index_c.target = CompressorTarget::kIndexerKey;
    index_c.index_format = index_format;
    finish_compressor_state(index_c, st);
  }
  // Entries completed by this step's tokens (each token completes at most one per ratio).
  {
    ProfileScope prof(*this, "attn: compressed entries");
    if (r > 0) write_compressed_entries(main_c, cap, st);
    if (r == 4) write_compressed_entries(index_c, cap, st);
  }

  // Indexer scores and top-k, in token chunks that fit the scores buffer.
  std::vector<std::vector<float>> tap_scores;
  if (r == 4) {
    ProfileScope prof(*this, "attn: indexer scores + top-k");
    for (std::int32_t t0 = 0; t0 < cap; t0 += static_cast<std::int32_t>(s.index_chunk)) {
      IndexerArgs part = ix;
      part.token0 = t0;
      part.capacity = std::min<std::int32_t>(static_cast<std::int32_t>(s.index_chunk), cap - t0);
      part.scores = s.scores;
      part.top_idx = s.top_idx + static_cast<std::int64_t>(t0) * c.index_topk;
      part.top_count = s.top_count + t0;
      part.top_k_work = s.top_k_work;
      part.q_work = s.index_q_work;
      part.key_counts = s.key_counts;
      indexer_scores(part, st);
      indexer_top_k(part, st);
      if (taps != nullptr) {
        for (std::int32_t i = 0; i < part.capacity; ++i) {
          const std::int64_t n = (static_cast<std::int64_t>(taps->view.positions[static_cast<std::size_t>(t0 + i)]) + 1) / 4;
          std::vector<float> row(static_cast<std::size_t>(n));
          copy_to_host(row.data(), s.scores + static_cast<std::int64_t>(i) * s.max_entries, row.size() * sizeof(float), stream_);
          stream_.synchronize();
          tap_scores.push_back(std::move(row));
        }
      }
    }
  }

  // Sparse attention over the window and the compressed entries, one softmax with the sink.
  AttentionArgs at;
  at.step = step;
  at.capacity = cap;
  at.q = s.q;
  at.heads = static_cast<std::int32_t>(H);
  at.sink = w.attn_sink;
  at.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  at.window = static_cast<std::int32_t>(c.sliding_window);
  at.window_group = group_index(CacheKind::kWindowKv);
  at.window_layer_slot = slot_of_layer(CacheKind::kWindowKv);
  at.ratio = static_cast<std::int32_t>(r);
  if (r > 0) {
    const CacheKind kind = r == 4 ? CacheKind::kCsaKv : CacheKind::kHcaKv;
    at.compressed_group = group_index(kind);
    at.compressed_layer_slot = slot_of_layer(kind);
  }
  at.top_idx = s.top_idx;
  at.top_count = s.top_count;
  at.top_k = static_cast<std::int32_t>(c.index_topk);
  at.kv_fp8 = kv_fp8;
  at.compressed_rope = r > 0;
  at.out = s.o;
  const std::int64_t max_keys = c.sliding_window + (r == 4 ? c.index_topk : r == 128 ? limits_.max_context / 128 : 0);
  at.splits = attention_splits(cap, H, max_keys, device_.sm_count);
  if (options_.max_attention_splits > 0) at.splits = std::min(at.splits, options_.max_attention_splits);
  at.part_acc = s.part_acc;
  at.part_ml = s.part_ml;
  {
    ProfileScope prof(*this, "attn: sparse attention");
    sparse_attention(at, st);
  }
  if (taps != nullptr && w.layer < c.num_hidden_layers) {
    std::vector<std::int32_t> top(static_cast<std::size_t>(cap) * static_cast<std::size_t>(std::max<std::int64_t>(c.index_topk, 1)));
    std::vector<std::int32_t> counts(static_cast<std::size_t>(cap));
    if (r == 4) {
      copy_to_host(top.data(), s.top_idx, top.size() * sizeof(std::int32_t), stream_);
      copy_to_host(counts.data(), s.top_count, counts.size() * sizeof(std::int32_t), stream_);
    }
    stream_.synchronize();
    for (std::int32_t t = 0; t < cap; ++t) {
      const std::int64_t p = taps->view.positions[static_cast<std::size_t>(t)];
      std::vector<std::int64_t> window, entries;
      for (std::int64_t q = std::max<std::int64_t>(0, p - c.sliding_window + 1); q <= p; ++q) window.push_back(q);
      if (r == 128) {
        for (std::int64_t j = 0; 128 * (j + 1) <= p + 1; ++j) entries.push_back(j);
      } else if (r == 4) {
        for (std::int32_t k = 0; k < counts[static_cast<std::size_t>(t)]; ++k)
          entries.push_back(top[static_cast<std::size_t>(t) * static_cast<std::size_t>(c.index_topk) + static_cast<std::size_t>(k)]);
      }
      const std::vector<float> none;
      const auto row = static_cast<std::size_t>(taps->token_row[static_cast<std::size_t>(t)]);
      inspector_->attention(w.layer, AttentionTap{taps->view.seqs[row], p, window, entries,
                                                  r == 4 ? tap_scores[static_cast<std::size_t>(t)] : none});
    }
  }

  // Grouped low-rank output (bf16 einsum over wo_a's values), wo_b, hc post.
  const std::int64_t GO = c.o_groups * c.o_lora_rank;
  {
    ProfileScope prof(*this, "attn: output projections + hc_post");
    gemm_bf16(s.o, H * 512, cap, w.wo_a, static_cast<int>(c.o_groups), GemmOutput{s.z, GO, false}, n_dev, st, gemm_path_);
    quantize_activations(s.z, GO, cap, GO, s.zq, s.zs, n_dev, st);
    gemm_quantized(QuantizedRows{s.zq, s.zs, GO}, cap, w.wo_b, GemmOutput{s.attn_out, D, false}, n_dev, st, gemm_path_);
    hc_post(s.attn_out, h, s.post, s.comb, shape, cap, h_out, n_dev, st);
  }
}

void CudaExecutor::ffn_layer(const DeviceStep* step, std::int32_t cap, const GpuBlockWeights& w, const std::uint16_t* h,
                             std::uint16_t* h_out) {
  const ModelConfig& c = config_;
  Scratch& s = *scratch_;
  const gpu_stream_t st = stream_.handle();
  const std::int32_t* n_dev = n_tokens_of(step);
  const std::int64_t D = c.hidden_size, E = c.n_routed_experts, K = c.num_experts_per_tok, I = c.moe_intermediate_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const HcShape shape{static_cast<int>(c.hc_mult), D, static_cast<int>(c.hc_sinkhorn_iters), eps, static_cast<float>(c.hc_eps)};
  const float limit = static_cast<float>(c.swiglu_limit);

  {
    ProfileScope prof(*this, "moe: hc_pre");
    hc_pre(h, w.hc_ffn, w.ffn_norm, shape, cap, s.x, s.post, s.comb, n_dev, s.hc_scratch, st);
  }
  // The shared expert (weight 1) needs only x: it runs on a second stream beside the routing and
  // the routed experts, whose routing kernels leave most SMs idle, and is joined before the
  // combine. It quantizes its own copy of x, so that the routed chain keeps the quantization
  // between the permutation and the expert products (gemm_quantized_experts wants the tile map
  // from two launches back). A profiled step runs it in line, so that each family's time is its own.
  const bool beside = !profiling_;
  if (beside) {
    shared_fork_.record(stream_);
    shared_fork_.wait(side_stream_);
  }
  {
    ProfileScope prof(*this, "moe: shared expert");
    const gpu_stream_t sst = beside ? side_stream_.handle() : st;
    quantize_activations(s.x, D, cap, D, s.xsq, s.xss, n_dev, sst);
    gemm_quantized(QuantizedRows{s.xsq, s.xss, D}, cap, w.shared_w1, GemmOutput{s.gus, 2 * I, false}, n_dev, sst, gemm_path_);
    gemm_quantized(QuantizedRows{s.xsq, s.xss, D}, cap, w.shared_w3, GemmOutput{s.gus + I, 2 * I, false}, n_dev, sst, gemm_path_);
    swiglu_quantize(s.gus, cap, n_dev, I, limit, nullptr, s.hsq, s.hss, sst);
    gemm_quantized(QuantizedRows{s.hsq, s.hss, I}, cap, w.shared_w2, GemmOutput{s.ys, D, false}, n_dev, sst, gemm_path_);
  }
  if (beside) shared_join_.record(side_stream_);
  {
    ProfileScope prof(*this, "moe: gate + route");
    // Routing (fp32 gate; at decode its k is split over more CTAs, and route adds the partials).
    MoeRouteArgs route;
    route.step = step;
    route.capacity = cap;
    route.logits = s.gate_logits;
    route.logit_splits = moe_gate(s.x, cap, w.gate, s.gate_logits, n_dev, gemm_path_, st);
    route.split_stride = cap * E;
    route.experts = static_cast<std::int32_t>(E);
    route.top_k = static_cast<std::int32_t>(K);
    route.routed_scale = static_cast<float>(c.routed_scaling_factor);
    route.bias = w.gate_bias;
    route.tid2eid = w.tid2eid;
    route.route_expert = s.route_e;
    route.route_weight = s.route_w;
    moe_route(route, st);
  }
  // Routed experts over rows grouped by expert.
  {
    ProfileScope prof(*this, "moe: routed experts");
    const std::int32_t tile_m = expert_tile_rows(static_cast<std::int64_t>(cap) * K, E, w.experts_w13, w.experts_w2);
    MoePermuteArgs perm;
    perm.step = step;
    perm.experts = static_cast<std::int32_t>(E);
    perm.top_k = static_cast<std::int32_t>(K);
    perm.route_expert = s.route_e;
    perm.route_weight = s.route_w;
    perm.tile_m = tile_m;
    perm.source_row = s.source_row;
    perm.slot_of = s.slot_of;
    perm.slot_weight = s.slot_w;
    perm.num_rows = s.num_rows;
    perm.tile_expert = s.tile_expert;
    perm.tile_row0 = s.tile_row0;
    perm.tile_rows = s.tile_rows;
    perm.num_tiles = s.num_tiles;
    moe_permute(perm, st);
    quantize_activations(s.x, D, cap, D, s.xq, s.xs, n_dev, st);  // (two launches after the tile map)
    ExpertTiles tiles{s.source_row, s.tile_expert, s.tile_row0, s.tile_rows, s.num_tiles,
                      moe_max_tiles(cap, K, E, tile_m), tile_m, cap};
    gemm_quantized_experts(QuantizedRows{s.xq, s.xs, D}, tiles, w.experts_w13, GemmOutput{s.gu, 2 * I, false}, st);
    swiglu_quantize(s.gu, static_cast<std::int64_t>(cap) * K, s.num_rows, I, limit, s.slot_w, s.hq, s.hs, st);
    tiles.source_row = nullptr;  // w2 reads the permuted rows themselves
    gemm_quantized_experts(QuantizedRows{s.hq, s.hs, I}, tiles, w.experts_w2, GemmOutput{s.y, D, false}, st);
  }
  if (beside) shared_join_.wait(stream_);
  {
    ProfileScope prof(*this, "moe: combine + hc_post");
    moe_combine(step, cap, static_cast<std::int32_t>(K), s.route_e, s.slot_of, s.y, s.ys, D, s.ffn_out, st);
    hc_post(s.ffn_out, h, s.post, s.comb, shape, cap, h_out, n_dev, st);
  }
}

void CudaExecutor::tap_hidden(const StepPlan& plan, std::int64_t layer, const std::uint16_t* h) {
  const std::int64_t T = plan.num_tokens(), width = config_.hc_mult * config_.hidden_size;
  std::vector<std::uint16_t> bits(static_cast<std::size_t>(T * width));
  copy_to_host(bits.data(), h, bits.size() * 2, stream_);
  stream_.synchronize();
  std::vector<float> values(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) values[i] = bf16_bits_to_f32(bits[i]);
  std::vector<std::int64_t> seqs, positions;
  for (std::int64_t t = 0; t < T; ++t) {
    seqs.push_back(plan.view.seqs[static_cast<std::size_t>(plan.token_row[static_cast<std::size_t>(t)])]);
    positions.push_back(plan.view.positions[static_cast<std::size_t>(t)]);
  }
  inspector_->hidden(layer, seqs, positions, values);
}

}  // namespace dsv4::gpu
