// `dsv4 logits`: fp32 logits of every position of a token sequence, as .npy, for comparing
// engines and for checking that chunked prefill and decode reproduce one-shot prefill.
#include <fmt/format.h>

#include <memory>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "common/error.h"
#include "common/npy.h"
#include "executor/dump_recorder.h"

namespace dsv4::cli {
namespace {

struct LogitsOptions {
  ModelOptions model;
  std::string tokens;
  std::int64_t chunk = 0;
  std::int64_t decode_from = -1;
  std::string out;
  std::string mtp_out;
  std::string dump_hidden;
  std::string dump_attention;
};

void run_logits(const LogitsOptions& o) {
  std::vector<std::int32_t> tokens = parse_token_list(o.tokens);
  LoadedEngine loaded = load_engine(o.model);
  const std::int64_t T = static_cast<std::int64_t>(tokens.size());
  const std::int64_t decode_from = o.decode_from < 0 ? T : o.decode_from;
  std::unique_ptr<DumpRecorder> recorder;
  if (!o.dump_hidden.empty() || !o.dump_attention.empty()) {
    recorder = std::make_unique<DumpRecorder>(loaded.engine->model_config(), T);
    loaded.executor->set_inspector(recorder.get());
  }
  std::vector<float> mtp;
  std::vector<float> logits = loaded.engine->score(tokens, o.chunk, decode_from, o.mtp_out.empty() ? nullptr : &mtp);
  if (!o.mtp_out.empty()) {
    if (T < 2) fail("--mtp-out needs at least two tokens");
    const std::int64_t mtp_shape[2] = {T - 1, loaded.engine->model_config().vocab_size};
    write_npy(o.mtp_out, mtp, mtp_shape);
  }
  if (recorder) {
    loaded.executor->set_inspector(nullptr);
    if (!o.dump_hidden.empty()) recorder->write_hidden(o.dump_hidden);
    if (!o.dump_attention.empty()) recorder->write_attention(o.dump_attention);
  }
  const std::int64_t shape[2] = {T, loaded.engine->model_config().vocab_size};
  write_npy(o.out, logits, shape);
  fmt::print("wrote {} [{} x {}] (model {}, chunk {}, decode from {})\n", o.out, shape[0], shape[1],
             loaded.model_dir.string(), o.chunk, decode_from);
}

}  // namespace

void add_logits_command(CLI::App& app) {
  auto o = std::make_shared<LogitsOptions>();
  CLI::App* cmd = app.add_subcommand("logits", "Write the fp32 logits of every position of a token sequence (.npy)");
  add_model_options(cmd, o->model, /*require_model=*/false);
  cmd->add_option("--tokens", o->tokens, "token ids, comma separated")->required();
  cmd->add_option("--chunk", o->chunk, "prefill in chunks of N tokens (default: one shot)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--decode-from", o->decode_from, "one-token decode steps from position K on")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--out", o->out, "output .npy file, float32 [T, vocab]")->required();
  cmd->add_option("--mtp-out", o->mtp_out,
                  "also write the MTP block's logits, float32 [T-1, vocab] (row t predicts token t+2)");
  cmd->add_option("--dump-hidden", o->dump_hidden,
                  "write DIR/hiddenL.npy: float32 [T, hc, D] residual streams after every block L");
  cmd->add_option("--dump-attention", o->dump_attention,
                  "write DIR/window_keysL.npy, compressed_keysL.npy (int32, -1 padded) and "
                  "indexer_scoresL.npy (CSA layers): the key set of every query");
  cmd->callback([o] { run_logits(*o); });
}

}  // namespace dsv4::cli
