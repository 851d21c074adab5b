// `dsv4 plan`: KV cache bytes per sequence of N tokens, per cache kind and in total, the
// page buckets, the V3.2 comparison, and how many sequences fit in a GPU after the weights
// (kvcache/memory_plan.h does the arithmetic; this file only reads flags and prints).
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "common/error.h"
#include "kvcache/memory_plan.h"
#include "model/model_config.h"
#include "model/parameter_count.h"
#include "model/presets.h"
#include "model/safetensors.h"

namespace dsv4::cli {
namespace {

struct PlanOptions {
  std::string config;
  std::string model;
  std::string preset;
  std::int64_t context = 0;
  std::string kv_dtype = "bf16";
  std::string indexer_dtype = "bf16";
  double gpu_memory_gib = 0;
  double weights_gib = -1;
  bool no_mtp = false;
  bool json = false;
};

std::int64_t gib_to_bytes(double gib, const char* flag) {
  if (!std::isfinite(gib) || gib < 0 || gib > 1e9) fail("{}: expected a size in GiB, found {}", flag, gib);
  return static_cast<std::int64_t>(std::llround(gib * static_cast<double>(std::int64_t{1} << 30)));
}

void run_plan(const PlanOptions& o) {
  const int sources = !o.config.empty() + !o.model.empty() + !o.preset.empty();
  if (sources != 1) fail("plan: give exactly one of --config FILE, --model DIR or --preset NAME");
  if (o.context <= 0) fail("plan: --context must be a positive number of tokens, found {}", o.context);

  ModelConfig config;
  PlanRequest request;
  std::optional<std::int64_t> weights;
  if (!o.preset.empty()) {
    config = preset_config(o.preset);
    request.model_name = o.preset;
  } else if (!o.config.empty()) {
    config = ModelConfig::from_file(o.config);
    request.model_name = o.config;
  } else {
    config = ModelConfig::from_file(std::filesystem::path(o.model) / "config.json");
    request.model_name = o.model;
  }
  request.context = o.context;
  request.cache.kv_dtype = parse_kv_cache_dtype(o.kv_dtype);
  request.cache.indexer_dtype = parse_indexer_cache_dtype(o.indexer_dtype);
  request.cache.mtp_layers = !o.no_mtp;
  if (o.gpu_memory_gib > 0) {
    request.gpu_memory_bytes = gib_to_bytes(o.gpu_memory_gib, "--gpu-memory");
    if (o.weights_gib >= 0) {
      request.weight_bytes = gib_to_bytes(o.weights_gib, "--weights");
    } else if (!o.model.empty()) {
      const Checkpoint checkpoint = Checkpoint::open(o.model);
      std::int64_t total = 0;
      for (const auto& [name, view] : checkpoint.tensors()) total += static_cast<std::int64_t>(view.bytes.size());
      request.weight_bytes = total;
    } else {
      request.weight_bytes = count_parameters(config).stored_bytes;  // what the checkpoint would hold
    }
  }
  const MemoryPlan plan = plan_memory(config, request);
  if (o.json) {
    fmt::print("{}\n", plan_to_json(plan).dump(2));
  } else {
    fmt::print("{}", format_plan(plan));
  }
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand("plan", "KV cache memory per sequence, page buckets, and sequences that fit");
  auto* config = cmd->add_option("--config", o->config, "config.json of the model")->check(CLI::ExistingFile);
  auto* model = cmd->add_option("--model", o->model, "model directory (config.json; weights = its tensor bytes)")
                    ->check(CLI::ExistingDirectory);
  auto* preset = cmd->add_option("--preset", o->preset, "built-in config: flash, pro or tiny");
  config->excludes(model)->excludes(preset);
  model->excludes(config)->excludes(preset);
  preset->excludes(config)->excludes(model);
  cmd->add_option("--context", o->context, "tokens per sequence")->required();
  cmd->add_option("--kv-cache-dtype", o->kv_dtype, "main KV entries: bf16 (1024 B) or fp8 (584 B)")->capture_default_str();
  cmd->add_option("--indexer-cache-dtype", o->indexer_dtype, "indexer keys: bf16 (256 B), fp8 (132 B) or fp4 (68 B)")->capture_default_str();
  cmd->add_option("--gpu-memory", o->gpu_memory_gib, "GPU memory in GiB: also print how many sequences fit");
  cmd->add_option("--weights", o->weights_gib,
                  "weight bytes in GiB (default: the checkpoint's tensors with --model, else estimated from the config)");
  cmd->add_flag("--no-mtp", o->no_mtp, "leave out the MTP blocks' window caches");
  cmd->add_flag("--json", o->json, "machine-readable output");
  cmd->callback([o] { run_plan(*o); });
}

}  // namespace dsv4::cli
