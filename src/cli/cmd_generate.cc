// `dsv4 generate`: sample a continuation of a prompt. Text prompts go through the model's
// tokenizer.json (BOS first); a model directory without one maps text byte by byte
// (id = byte + 3; ids 0..2 are special) and prints the output back the same way.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <memory>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "common/error.h"
#include "text/tokenizer.h"

#include <optional>

namespace dsv4::cli {
namespace {

constexpr std::int32_t kByteOffset = 3;

struct GenerateOptions {
  ModelOptions model;
  std::string prompt;
  std::string tokens;
  std::int64_t max_tokens = 32;
  double temperature = 0.0;
  double top_p = 1.0;
  std::int64_t top_k = 0;
  std::uint64_t seed = 0;
  bool ignore_eos = false;
};

std::string render(const std::vector<std::int32_t>& ids) {
  std::string text;
  for (std::int32_t id : ids) {
    if (id >= kByteOffset && id < kByteOffset + 256) {
      text += static_cast<char>(id - kByteOffset);
    } else {
      text += fmt::format("<{}>", id);
    }
  }
  return text;
}

void run_generate(const GenerateOptions& o) {
  LoadedEngine loaded = load_engine(o.model);
  const ModelConfig& config = loaded.engine->model_config();
  std::optional<Tokenizer> tokenizer;
  if (std::filesystem::exists(loaded.model_dir / "tokenizer.json"))
    tokenizer = Tokenizer::from_file(loaded.model_dir / "tokenizer.json");
  std::vector<std::int32_t> prompt;
  if (!o.tokens.empty()) {
    prompt = parse_token_list(o.tokens);
  } else if (tokenizer) {
    prompt.push_back(static_cast<std::int32_t>(config.bos_token_id));
    for (std::int32_t id : tokenizer->encode(o.prompt)) prompt.push_back(id);
  } else {
    if (config.vocab_size < kByteOffset + 256)
      fail("the model's vocabulary ({}) is too small for byte prompts; pass --tokens", config.vocab_size);
    for (unsigned char ch : o.prompt) prompt.push_back(kByteOffset + ch);
  }
  if (prompt.empty()) fail("the prompt is empty");
  SamplingParams params;
  params.temperature = o.temperature;
  params.top_p = o.top_p;
  params.top_k = o.top_k;
  params.seed = o.seed;
  params.max_tokens = o.max_tokens;
  params.ignore_eos = o.ignore_eos;
  const auto start = std::chrono::steady_clock::now();
  std::vector<RequestOutput> out = loaded.engine->generate({prompt}, {params});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const RequestOutput& r = out.at(0);
  if (r.finish_reason == FinishReason::kError) fail("generation failed: {}", r.error);
  fmt::print("model: {}\n", loaded.model_dir.string());
  fmt::print("prompt tokens: {}\n", fmt::join(prompt, ","));
  fmt::print("output tokens: {}\n", fmt::join(r.new_tokens, ","));
  if (tokenizer) {
    fmt::print("output text: {}\n", tokenizer->decode(r.new_tokens));
  } else if (o.tokens.empty()) {
    fmt::print("output text: {}\n", render(r.new_tokens));
  }
  fmt::print("{} prompt + {} generated tokens in {:.2f} s ({:.1f} tokens/s), finish: {}\n", prompt.size(),
             r.new_tokens.size(), seconds, static_cast<double>(prompt.size() + r.new_tokens.size()) / seconds,
             finish_reason_name(r.finish_reason));
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "generate",
      "Generate a continuation (no --model: the built-in tiny model). --prompt text goes through the "
      "model's tokenizer.json; without one, text maps to ids byte by byte (id = byte + 3)");
  add_model_options(cmd, o->model, /*require_model=*/false);
  auto* prompt = cmd->add_option("--prompt", o->prompt, "prompt text");
  auto* tokens = cmd->add_option("--tokens", o->tokens, "prompt token ids, comma separated");
  prompt->excludes(tokens);
  tokens->excludes(prompt);
  cmd->add_option("--max-tokens", o->max_tokens, "tokens to generate (default 32)")->check(CLI::PositiveNumber);
  cmd->add_option("--temperature", o->temperature, "0 = greedy (default)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", o->top_p, "nucleus sampling mass (default 1)")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--top-k", o->top_k, "sample among the k most likely (0 = off)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", o->seed, "sampling seed (default 0)");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "keep generating past the end-of-sequence token");
  cmd->callback([o] {
    if (o->prompt.empty() && o->tokens.empty()) throw CLI::RequiredError("--prompt or --tokens");
    run_generate(*o);
  });
}

}  // namespace dsv4::cli
