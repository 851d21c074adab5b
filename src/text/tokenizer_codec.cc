// The TextCodec of a model with a tokenizer.json (text_codec.h, tokenizer.h).
#include <fmt/format.h>

#include "common/error.h"
#include "common/json_io.h"
#include "common/json_reader.h"
#include "text/text_codec.h"
#include "text/tokenizer.h"

namespace dsv4 {

std::unique_ptr<TextCodec> make_tokenizer_codec(const std::filesystem::path& tokenizer_json, const ModelVocab& vocab);

namespace {

class TokenizerCodec final : public TextCodec {
 public:
  TokenizerCodec(Tokenizer tokenizer, const ModelVocab& vocab, bool add_bos)
      : tokenizer_(std::move(tokenizer)), bos_(vocab.bos_id), add_bos_(add_bos) {}

  std::string_view kind() const override { return "tokenizer"; }

  std::vector<std::int32_t> encode_prompt(std::string_view text) const override {
    std::vector<std::int32_t> ids;
    if (add_bos_) ids.push_back(bos_);
    const std::vector<std::int32_t> body = tokenizer_.encode(text, /*allow_special=*/true);
    ids.insert(ids.end(), body.begin(), body.end());
    return ids;
  }

  std::vector<std::int32_t> encode_chat(std::string_view rendered) const override {
    return tokenizer_.encode(rendered, /*allow_special=*/true);
  }

  std::string token_text(std::int32_t id) const override { return tokenizer_.token_text(id).value_or(std::string()); }

  std::unique_ptr<Decoder> decoder(bool skip_special) const override {
    return std::make_unique<StreamDecoder>(tokenizer_, skip_special);
  }

 private:
  class StreamDecoder final : public Decoder {
   public:
    StreamDecoder(const Tokenizer& tokenizer, bool skip_special) : decoder_(tokenizer, skip_special) {}
    std::string push(std::int32_t id) override { return decoder_.push(id); }
    std::string flush() override { return decoder_.flush(); }

   private:
    Tokenizer::StreamDecoder decoder_;
  };

  Tokenizer tokenizer_;
  std::int32_t bos_;
  bool add_bos_;
};

}  // namespace

std::unique_ptr<TextCodec> make_tokenizer_codec(const std::filesystem::path& tokenizer_json, const ModelVocab& vocab) {
  Tokenizer tokenizer = Tokenizer::from_file(tokenizer_json);
  if (tokenizer.vocab_size() > vocab.size) {
    fail("{} has {} tokens, more than the model's vocab_size {}", tokenizer_json.string(), tokenizer.vocab_size(),
         vocab.size);
  }
  // Hugging Face's add_bos_token (tokenizer_config.json) decides whether prompts start with BOS.
  bool add_bos = false;
  const std::filesystem::path config_json = tokenizer_json.parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config_json)) {
    const Json tc = read_json_file(config_json);
    const JsonObject fields(tc, config_json.string(), {.null_is_absent = true});
    add_bos = fields.optional_boolean("add_bos_token").value_or(false);
  }
  return std::make_unique<TokenizerCodec>(std::move(tokenizer), vocab, add_bos);
}

}  // namespace dsv4
