// `dsv4 make-model`: writes a synthetic checkpoint (official layout and dtypes) for a
// config file or a built-in preset.
#include <fmt/format.h>

#include <memory>

#include "cli/commands.h"
#include "common/error.h"
#include "model/parameter_count.h"
#include "model/presets.h"
#include "model/synthetic_checkpoint.h"
#include "text/bpe_trainer.h"

namespace dsv4::cli {
namespace {

struct MakeModelOptions {
  std::string config;
  std::string preset;
  std::string out;
  std::uint64_t seed = 0;
  double max_shard_mb = 2048;
  double max_total_gb = 8;
};

void run_make_model(const MakeModelOptions& o) {
  ModelConfig config = o.config.empty() ? preset_config(o.preset) : ModelConfig::from_file(o.config);
  SyntheticOptions options;
  options.seed = o.seed;
  if (!(o.max_shard_mb > 0)) fail("--max-shard-mb must be positive");
  options.max_shard_bytes = static_cast<std::size_t>(o.max_shard_mb * 1024 * 1024);
  options.max_total_bytes = static_cast<std::size_t>(o.max_total_gb * 1e9);
  write_synthetic_checkpoint(config, o.out, options);
  // The built-in tokenizer (4096 ids) serves any model whose vocabulary holds it.
  const bool tokenizer = config.vocab_size >= v4_tokenizer_options().vocab_size;
  if (tokenizer) write_tiny_tokenizer(o.out);
  ParameterCount count = count_parameters(config);
  fmt::print("wrote {} ({} layers + {} MTP, {:.2f} M parameters, {:.1f} MB) seed {}{}\n", o.out,
             config.num_hidden_layers, config.num_nextn_predict_layers,
             static_cast<double>(count.total + count.mtp_total) / 1e6, static_cast<double>(count.stored_bytes) / 1e6,
             o.seed, tokenizer ? ", with the built-in tokenizer" : " (vocabulary too small for the built-in tokenizer)");
}

}  // namespace

void add_make_model_command(CLI::App& app) {
  auto o = std::make_shared<MakeModelOptions>();
  CLI::App* cmd = app.add_subcommand("make-model", "Write a synthetic checkpoint in the official V4 layout");
  auto* config = cmd->add_option("--config", o->config, "config.json to build the model from")->check(CLI::ExistingFile);
  auto* preset = cmd->add_option("--preset", o->preset, "built-in configuration: tiny, flash or pro");
  config->excludes(preset);
  preset->excludes(config);
  cmd->add_option("--out", o->out, "output directory")->required();
  cmd->add_option("--seed", o->seed, "random seed (values depend only on seed and tensor name)");
  cmd->add_option("--max-shard-mb", o->max_shard_mb, "largest shard in MiB (default 2048)");
  cmd->add_option("--max-total-gb", o->max_total_gb, "refuse checkpoints larger than this (GB, default 8)");
  cmd->callback([o] {
    if (o->config.empty() && o->preset.empty()) throw CLI::RequiredError("--config or --preset");
    run_make_model(*o);
  });
}

}  // namespace dsv4::cli
