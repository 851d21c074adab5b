// A byte-level BPE trainer that writes the Hugging Face tokenizer.json format Tokenizer reads,
// with DeepSeek-V3/V4's normalizer, pre-tokenizer (the same three Split regexes + ByteLevel)
// and decoder. It exists to give the built-in tiny model a real tokenizer of the V4 kind:
// write_tiny_tokenizer trains one deterministically on text every Debian system ships
// (/usr/share/common-licenses/GPL-3 and GPL-2, from base-files) plus a small multilingual
// sample embedded in bpe_trainer.cc.
//
// Id layout (like DeepSeek's: BOS/EOS/pad first, the other added tokens last):
//   [0, head)                   head_tokens (BOS = 0, EOS = 1, pad = 2)
//   [head, head + 256)          the 256 byte-level symbols, in byte order
//   [head + 256, size - tail)   one new token per merge, in merge order
//   [size - tail, size)         tail_tokens
// Pairs are picked by count, ties by the smaller (left id, right id): the result depends only
// on the corpus and the options.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4 {

struct AddedTokenSpec {
  std::string content;
  bool special = true;  // false: matched even when encode(allow_special=false), kept by skip_special
};

struct BpeTrainOptions {
  std::int32_t vocab_size = 4096;  // total ids; must leave room for the 256 byte symbols
  std::vector<AddedTokenSpec> head_tokens;
  std::vector<AddedTokenSpec> tail_tokens;
};

// The V4 family's added tokens for a `vocab_size`-id tokenizer: BOS `<｜begin▁of▁sentence｜>`
// (0), EOS `<｜end▁of▁sentence｜>` (1), pad `<｜▁pad▁｜>` (2); last, the chat-encoding tokens
// `<｜User｜>`, `<｜Assistant｜>`, `<｜latest_reminder｜>`, the task tokens, and `<think>`,
// `</think>`, `｜DSML｜` (these three not special, so skip_special decoding keeps the markup
// that parse_completion needs).
BpeTrainOptions v4_tokenizer_options(std::int32_t vocab_size = 4096);

// Trains on `corpus` and returns the tokenizer.json text. Throws Error if the corpus has too
// few distinct pairs to fill the vocabulary.
std::string train_bpe_tokenizer(std::string_view corpus, const BpeTrainOptions& options);

// GPL-3 and GPL-2 from /usr/share/common-licenses (Error if missing) followed by the
// embedded sample.
std::string tiny_tokenizer_corpus();

// tokenizer_config.json for a tokenizer trained with `options` (bos/eos/pad names, no BOS
// added on encode, no chat template: V4 prompts come from chat_encoding.h).
std::string tokenizer_config_json(const BpeTrainOptions& options);

// Trains the built-in tiny model's tokenizer (4096 ids, bos 0, eos 1) and writes
// `dir`/tokenizer.json and `dir`/tokenizer_config.json (dir is created if needed).
// Deterministic; takes well under a second in an optimized build.
void write_tiny_tokenizer(const std::filesystem::path& dir);

}  // namespace dsv4
