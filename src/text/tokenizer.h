// Tokenizer: the byte-level BPE of a Hugging Face tokenizer.json (the kind DeepSeek ships):
// added/special tokens matched first, the pre-tokenizer's split regexes (PCRE2, Unicode
// classes), the byte-to-unicode mapping, merges applied by rank; decoding back to UTF-8.
// What is supported, and what is refused with an Error naming it: see tokenizer.cc's header.
// A loaded Tokenizer is immutable; its const methods may be called from any thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4 {

class Tokenizer {
 public:
  // Parses and validates a tokenizer.json; errors (dsv4::Error) name the file and the field.
  static Tokenizer from_file(const std::filesystem::path& path);
  static Tokenizer from_json_text(std::string_view text, const std::string& where);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Special tokens in `text` (e.g. "<｜User｜>") become their ids when allow_special is set;
  // otherwise they are encoded as plain text. Added tokens that are not special (e.g.
  // "<think>" in the tiny tokenizer) are always matched, as in Hugging Face tokenizers. Like
  // HF's encode(add_special_tokens=False): no BOS is added (post_processor is not applied).
  // Throws Error only if a split regex fails at match time (PCRE2 match limit).
  std::vector<std::int32_t> encode(std::string_view text, bool allow_special = true) const;
  // Invalid UTF-8 produced by a byte sequence is kept as the raw bytes.
  std::string decode(std::span<const std::int32_t> ids, bool skip_special = false) const;

  // The pre-tokenizer's pieces of plain `text` (no added-token matching), as raw bytes, in
  // order; their concatenation is `text` (less what a Split with behavior "Removed" drops). Bytes that are not valid UTF-8 are pieces of their
  // own (the split regexes only see valid UTF-8). Used by the BPE trainer.
  std::vector<std::string> pre_tokenize(std::string_view text) const;

  // `token` is the vocabulary's spelling (byte-level characters, e.g. "Ġthe" for " the")
  // or an added token's content.
  std::optional<std::int32_t> token_id(std::string_view token) const;
  std::optional<std::string> token_text(std::int32_t id) const;  // the token's decoded bytes
  bool is_special(std::int32_t id) const;
  std::int64_t vocab_size() const;  // highest id + 1

  // Incremental decoding for streaming: feed ids one at a time, get back only complete
  // UTF-8 characters (a token that ends mid-character is held until the rest arrives).
  class StreamDecoder {
   public:
    explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false);
    std::string push(std::int32_t id);
    std::string flush();  // whatever is held, invalid bytes included

   private:
    const Tokenizer* tokenizer_;
    bool skip_special_;
    std::string pending_;
  };

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv4
