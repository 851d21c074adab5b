// Options shared by the commands that run a model (logits, generate, later serve): which
// model, how many threads, the cache formats and size; and building a CPU engine from them.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "engine/engine.h"

namespace dsv4::cli {

struct ModelOptions {
  std::string model;               // empty: the built-in tiny model (made on first use)
  std::string device = "cpu";      // cpu or cuda
  std::string load_format = "auto";  // auto (the checkpoint) or dummy (random weights of config.json's shapes; cuda)
  double gpu_memory_utilization = 0.9;
  bool enforce_eager = false;      // cuda: no CUDA graphs
  int threads = 0;                 // 0: all cores
  std::string kv_cache_dtype = "fp8";
  std::string indexer_cache_dtype = "fp4";
  double cache_gb = 0;             // 0: 1 GB on the CPU, what the GPU has left on cuda
  bool enable_prefix_caching = true;
  std::int64_t max_num_seqs = 64;
  std::int64_t max_num_batched_tokens = 2048;
  std::int64_t max_model_len = 0;
};

// Adds --model, --device, --load-format, --gpu-memory-utilization, --enforce-eager, --threads,
// --kv-cache-dtype, --indexer-cache-dtype, --cache-gb and the batching flags to `cmd` (the
// batching flags only with `serving`).
void add_model_options(CLI::App* cmd, ModelOptions& options, bool require_model, bool serving = false);

// The directory of the built-in tiny model: $DSV4_HOME/tiny, else $XDG_CACHE_HOME/dsv4/tiny,
// else ~/.cache/dsv4/tiny. Written (seed 0) when missing.
std::filesystem::path builtin_tiny_model();

struct LoadedEngine {
  std::unique_ptr<Engine> engine;
  Executor* executor = nullptr;  // the engine's executor (owned by the engine)
  std::filesystem::path model_dir;
};
// The executor of --device (the one factory every command uses) and the engine over it.
LoadedEngine load_engine(const ModelOptions& options);

// Parses "1,2,3" (spaces allowed) into token ids; throws Error naming the bad item.
std::vector<std::int32_t> parse_token_list(const std::string& text);

}  // namespace dsv4::cli
