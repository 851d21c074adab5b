// `dsv4 inspect`: layer schedule, tensor inventory, parameter counts and every
// inconsistency between a checkpoint and its config.
#include <fmt/format.h>

#include <map>
#include <memory>

#include "cli/commands.h"
#include "common/error.h"
#include "common/json_io.h"
#include "model/model_weights.h"
#include "model/parameter_count.h"
#include "model/safetensors.h"

namespace dsv4::cli {
namespace {

struct InspectOptions {
  std::string model;
  std::string config;
  bool json = false;
};

const char* kind_name(AttentionKind kind) {
  switch (kind) {
    case AttentionKind::kCsa: return "csa";
    case AttentionKind::kHca: return "hca";
    case AttentionKind::kWindow: return "window";
  }
  return "?";
}

std::string billions(std::int64_t n) { return fmt::format("{:.1f}B", static_cast<double>(n) / 1e9); }

// Returns the process exit code: 0 when consistent, 1 when problems were found.
int run_inspect(const InspectOptions& o) {
  std::filesystem::path config_path = o.config.empty() ? std::filesystem::path(o.model) / "config.json" : std::filesystem::path(o.config);
  ModelConfig c = ModelConfig::from_file(config_path);
  ParameterCount count = count_parameters(c);

  Json schedule = Json::array();
  for (std::int64_t i = 0; i < c.num_blocks_total(); ++i) {
    schedule.push_back({{"block", i},
                        {"mtp", i >= c.num_hidden_layers},
                        {"attention", kind_name(c.attention_kind(i))},
                        {"compress_ratio", c.compress_ratio(i)},
                        {"routing", c.is_hash_layer(i) ? "hash" : "score"}});
  }
  std::map<std::string, std::int64_t> expected_by_role_bytes;
  std::int64_t expected_tensors_count = 0;
  for (const TensorSpec& spec : expected_tensors(c)) {
    ++expected_tensors_count;
    std::int64_t bytes = static_cast<std::int64_t>(dtype_size(spec.dtypes.front()));
    for (auto s : spec.shape) bytes *= s;
    expected_by_role_bytes[std::string(dtype_name(spec.dtypes.front()))] += bytes;
  }

  Json report;
  report["config"] = config_path.string();
  report["layers"] = {{"decoder", c.num_hidden_layers},
                      {"mtp", c.num_nextn_predict_layers},
                      {"window_only", c.layers_of_ratio(0)},
                      {"csa", c.layers_of_ratio(4)},
                      {"hca", c.layers_of_ratio(128)},
                      {"hash_routed", c.num_hash_layers}};
  report["schedule"] = schedule;
  report["parameters"] = {{"total", count.total},
                          {"activated", count.activated},
                          {"embedding", count.embedding},
                          {"routed_experts", count.routed_experts},
                          {"mtp_total", count.mtp_total},
                          {"mtp_activated", count.mtp_activated},
                          {"stored_bytes", count.stored_bytes}};
  report["expected_tensors"] = {{"count", expected_tensors_count}, {"bytes_by_dtype", expected_by_role_bytes}};

  std::vector<std::string> problems;
  if (!o.model.empty()) {
    Checkpoint checkpoint = Checkpoint::open(o.model);
    std::map<std::string, std::int64_t> bytes_by_dtype;
    std::int64_t total_bytes = 0;
    for (const auto& [name, view] : checkpoint.tensors()) {
      bytes_by_dtype[std::string(dtype_name(view.dtype))] += static_cast<std::int64_t>(view.bytes.size());
      total_bytes += static_cast<std::int64_t>(view.bytes.size());
    }
    std::vector<std::string> files;
    for (const auto& f : checkpoint.files()) files.push_back(f.filename().string());
    report["checkpoint"] = {{"directory", o.model},
                            {"files", files},
                            {"tensors", checkpoint.tensors().size()},
                            {"bytes", total_bytes},
                            {"bytes_by_dtype", bytes_by_dtype}};
    problems = check_weights(c, checkpoint);
  }
  report["problems"] = problems;

  if (o.json) {
    fmt::print("{}\n", report.dump(2));
    return problems.empty() ? 0 : 1;
  }
  fmt::print("config: {}\n", config_path.string());
  fmt::print("layers: {} decoder + {} MTP; {} window-only, {} CSA (ratio 4), {} HCA (ratio 128); "
             "{} hash-routed\n",
             c.num_hidden_layers, c.num_nextn_predict_layers, c.layers_of_ratio(0), c.layers_of_ratio(4),
             c.layers_of_ratio(128), c.num_hash_layers);
  fmt::print("schedule:");
  for (std::int64_t i = 0; i < c.num_blocks_total(); ++i) {
    if (i % 16 == 0) fmt::print("\n ");
    fmt::print(" {}{}:{}{}", i >= c.num_hidden_layers ? "mtp" : "", i, kind_name(c.attention_kind(i)),
               c.is_hash_layer(i) ? "/hash" : "");
  }
  fmt::print("\n");
  fmt::print("parameters: {} total, {} activated per token (embedding excluded, {} of {} routed experts); "
             "MTP +{}\n",
             billions(count.total), billions(count.activated), c.num_experts_per_tok, c.n_routed_experts,
             billions(count.mtp_total));
  fmt::print("  exact: total {}, activated {}, embedding {}, routed experts {}, MTP {} ({} activated)\n", count.total,
             count.activated, count.embedding, count.routed_experts, count.mtp_total, count.mtp_activated);
  fmt::print("tensors expected: {} ({:.2f} GB stored)\n", expected_tensors_count,
             static_cast<double>(count.stored_bytes) / 1e9);
  if (report.contains("checkpoint")) {
    const Json& ck = report["checkpoint"];
    fmt::print("checkpoint: {} tensors in {} file(s), {:.2f} GB\n", ck["tensors"].get<std::size_t>(),
               ck["files"].size(), ck["bytes"].get<double>() / 1e9);
  }
  if (problems.empty()) {
    fmt::print("consistent: {}\n", o.model.empty() ? "config only (no checkpoint given)" : "yes");
    return 0;
  }
  fmt::print("inconsistencies ({}):\n", problems.size());
  for (const auto& p : problems) fmt::print("  - {}\n", p);
  return 1;
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto o = std::make_shared<InspectOptions>();
  CLI::App* cmd = app.add_subcommand("inspect", "Show a model's layer schedule, tensors, parameter counts and problems");
  auto* model = cmd->add_option("--model", o->model, "model directory (config.json + safetensors)")
                    ->check(CLI::ExistingDirectory);
  auto* config = cmd->add_option("--config", o->config, "config.json alone")->check(CLI::ExistingFile);
  model->excludes(config);
  config->excludes(model);
  cmd->add_flag("--json", o->json, "machine-readable output");
  cmd->callback([o] {
    if (o->model.empty() && o->config.empty()) throw CLI::RequiredError("--model or --config");
    int code = run_inspect(*o);
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace dsv4::cli
