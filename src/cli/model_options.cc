#include "cli/model_options.h"

#include <cstdlib>
#include <thread>

#include "common/error.h"
#include "cli/executor_factory.h"
#include "model/presets.h"
#include "model/synthetic_checkpoint.h"
#include "text/bpe_trainer.h"

namespace dsv4::cli {

void add_model_options(CLI::App* cmd, ModelOptions& o, bool require_model, bool serving) {
  auto* model = cmd->add_option("--model", o.model,
                                require_model ? "model directory (config.json + safetensors)"
                                              : "model directory (default: the built-in tiny model)")
                    ->check(CLI::ExistingDirectory)
                    ->envname("DSV4_MODEL");
  if (require_model) model->required();
  cmd->add_option("--device", o.device, "where the model runs: cpu or cuda (an NVIDIA Hopper GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->envname("DSV4_DEVICE");
  cmd->add_option("--load-format", o.load_format,
                  "auto: the checkpoint's weights; dummy: random weights of config.json's shapes drawn on the GPU "
                  "(benchmarks; needs --device cuda and only config.json in --model)")
      ->check(CLI::IsMember({"auto", "dummy"}))
      ->envname("DSV4_LOAD_FORMAT");
  cmd->add_option("--gpu-memory-utilization", o.gpu_memory_utilization,
                  "share of the GPU's memory for weights, scratch and KV cache (default 0.9)")
      ->check(CLI::Range(0.01, 1.0))
      ->envname("DSV4_GPU_MEMORY_UTILIZATION");
  cmd->add_flag("--enforce-eager", o.enforce_eager, "cuda: run every step eagerly (no CUDA graphs)")
      ->envname("DSV4_ENFORCE_EAGER");
  cmd->add_option("--threads", o.threads, "CPU threads (default: all cores)")
      ->check(CLI::NonNegativeNumber)
      ->envname("DSV4_THREADS");
  cmd->add_option("--kv-cache-dtype", o.kv_cache_dtype, "main KV cache entries: fp8 (584 B) or bf16 (1024 B)")
      ->check(CLI::IsMember({"fp8", "bf16"}))
      ->envname("DSV4_KV_CACHE_DTYPE");
  cmd->add_option("--indexer-cache-dtype", o.indexer_cache_dtype, "indexer key entries: fp4, fp8 or bf16")
      ->check(CLI::IsMember({"fp4", "fp8", "bf16"}))
      ->envname("DSV4_INDEXER_CACHE_DTYPE");
  cmd->add_option("--cache-gb", o.cache_gb, "KV cache memory in GB (default: 1 on the CPU; on cuda what is left)")
      ->check(CLI::NonNegativeNumber)
      ->envname("DSV4_CACHE_GB");
  if (serving) {
    cmd->add_option("--max-num-seqs", o.max_num_seqs, "most sequences in one step")
        ->check(CLI::PositiveNumber)
        ->envname("DSV4_MAX_NUM_SEQS");
    cmd->add_option("--max-num-batched-tokens", o.max_num_batched_tokens, "token budget of one step")
        ->check(CLI::PositiveNumber)
        ->envname("DSV4_MAX_NUM_BATCHED_TOKENS");
    cmd->add_option("--max-model-len", o.max_model_len, "longest prompt + output (default: the model's)")
        ->check(CLI::NonNegativeNumber)
        ->envname("DSV4_MAX_MODEL_LEN");
    cmd->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", o.enable_prefix_caching,
                  "reuse cached prompt prefixes (default on)")
        ->envname("DSV4_ENABLE_PREFIX_CACHING");
  }
}

std::filesystem::path builtin_tiny_model() {
  std::filesystem::path root;
  if (const char* home = std::getenv("DSV4_HOME"); home && *home) {
    root = home;
  } else if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    root = std::filesystem::path(xdg) / "dsv4";
  } else if (const char* user = std::getenv("HOME"); user && *user) {
    root = std::filesystem::path(user) / ".cache" / "dsv4";
  } else {
    fail("cannot place the built-in model: set DSV4_HOME or pass --model");
  }
  const std::filesystem::path dir = root / "tiny";
  if (!std::filesystem::exists(dir / "config.json")) {
    // Write next to the final place, then rename, so an interrupted run leaves nothing half-made.
    const std::filesystem::path tmp = root / "tiny.partial";
    std::filesystem::remove_all(tmp);
    write_synthetic_checkpoint(tiny_config(), tmp, {.seed = 0});
    write_tiny_tokenizer(tmp);
    std::filesystem::remove_all(dir);
    std::filesystem::rename(tmp, dir);
  }
  return dir;
}

LoadedEngine load_engine(const ModelOptions& o) {
  LoadedEngine loaded;
  loaded.model_dir = o.model.empty() ? builtin_tiny_model() : std::filesystem::path(o.model);
  CacheOptions cache;
  cache.kv_dtype = parse_kv_cache_dtype(o.kv_cache_dtype);
  cache.indexer_dtype = parse_indexer_cache_dtype(o.indexer_cache_dtype);
  EngineConfig config;
  config.prefix_caching = o.enable_prefix_caching;
  config.max_num_seqs = o.max_num_seqs;
  config.max_num_batched_tokens = o.max_num_batched_tokens;
  config.max_model_len = o.max_model_len;
  ExecutorRequest request{o.device, o.load_format, loaded.model_dir, cache, o.threads, o.gpu_memory_utilization,
                          !o.enforce_eager};
  MadeExecutor made = make_executor(request, config);
  config.cache_bytes = o.cache_gb > 0 ? static_cast<std::int64_t>(o.cache_gb * 1e9) : made.default_cache_bytes;
  loaded.executor = made.executor.get();
  loaded.engine = std::make_unique<Engine>(std::move(made.executor), config);
  return loaded;
}

std::vector<std::int32_t> parse_token_list(const std::string& text) {
  std::vector<std::int32_t> ids;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) fail("--tokens: empty item at character {} of \"{}\"", pos, text);
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < 0 || v > INT32_MAX) fail("--tokens: \"{}\" is not a token id", item);
    ids.push_back(static_cast<std::int32_t>(v));
    pos = comma + 1;
  }
  if (ids.empty()) fail("--tokens: no token ids");
  return ids;
}

}  // namespace dsv4::cli
