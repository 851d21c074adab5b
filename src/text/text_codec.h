// TextCodec: what serving needs from a tokenizer -- prompts and rendered chats to token ids,
// token ids back to text (incrementally, for streaming), and one token's text for logprobs.
//
// Two kinds:
//   tokenizer  the model's tokenizer.json (tokenizer.h);
//   bytes      for checkpoints without a tokenizer.json: byte b is token b + 3, ids 0..2
//              are special -- the mapping `dsv4 generate` used before the tokenizer. Chats
//              are rendered the same way for both (chat_encoding.h), then encoded.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4 {

// What a codec needs to know of the model (its config.json): the vocabulary size and the
// BOS / EOS ids.
struct ModelVocab {
  std::int64_t size = 0;
  std::int32_t bos_id = 0;
  std::int32_t eos_id = 0;
};

class TextCodec {
 public:
  virtual ~TextCodec() = default;

  // Turns token ids into text as they arrive; push returns only complete UTF-8 characters.
  class Decoder {
   public:
    virtual ~Decoder() = default;
    virtual std::string push(std::int32_t id) = 0;
    virtual std::string flush() = 0;  // whatever is held, invalid bytes included
  };

  virtual std::string_view kind() const = 0;  // "tokenizer" or "bytes"
  // A completion prompt: BOS when the tokenizer's config asks for it (add_bos_token), then
  // the text, special tokens in it matched (as Hugging Face tokenizers, and so vLLM, do).
  virtual std::vector<std::int32_t> encode_prompt(std::string_view text) const = 0;
  // A rendered chat prompt (chat_encoding.h: it starts with the BOS text); special
  // tokens in it become their ids.
  virtual std::vector<std::int32_t> encode_chat(std::string_view rendered) const = 0;
  virtual std::string token_text(std::int32_t id) const = 0;  // raw bytes, possibly a partial character
  virtual std::unique_ptr<Decoder> decoder(bool skip_special) const = 0;
};

// The model's tokenizer when `model_dir` has a tokenizer.json, otherwise the byte codec
// (which needs a vocabulary of at least 259 tokens; Error otherwise).
std::unique_ptr<TextCodec> make_text_codec(const std::filesystem::path& model_dir, const ModelVocab& vocab);
std::unique_ptr<TextCodec> make_byte_codec(const ModelVocab& vocab);

}  // namespace dsv4
