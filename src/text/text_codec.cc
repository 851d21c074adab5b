// The byte codec and the choice between it and the model's tokenizer (text_codec.h).
#include "text/text_codec.h"

#include <fmt/format.h>

#include "common/error.h"
#include "text/utf8.h"

namespace dsv4 {

std::unique_ptr<TextCodec> make_tokenizer_codec(const std::filesystem::path& tokenizer_json, const ModelVocab& vocab);

namespace {

constexpr std::int32_t kByteOffset = 3;

class ByteCodec final : public TextCodec {
 public:
  explicit ByteCodec(const ModelVocab& vocab) : bos_(vocab.bos_id), eos_(vocab.eos_id) {}

  std::string_view kind() const override { return "bytes"; }

  std::vector<std::int32_t> encode_prompt(std::string_view text) const override {
    std::vector<std::int32_t> ids;
    append_bytes(text, ids);
    return ids;
  }

  std::vector<std::int32_t> encode_chat(std::string_view rendered) const override {
    std::vector<std::int32_t> ids;
    append_bytes(rendered, ids);
    return ids;
  }

  std::string token_text(std::int32_t id) const override {
    if (id >= kByteOffset && id < kByteOffset + 256) return std::string(1, static_cast<char>(id - kByteOffset));
    return special_text(id);
  }

  std::unique_ptr<Decoder> decoder(bool skip_special) const override {
    return std::make_unique<ByteDecoder>(*this, skip_special);
  }

 private:
  static void append_bytes(std::string_view text, std::vector<std::int32_t>& ids) {
    for (unsigned char c : text) ids.push_back(kByteOffset + c);
  }
  std::string special_text(std::int32_t id) const {
    if (id == bos_) return "<bos>";
    if (id == eos_) return "<eos>";
    return fmt::format("<{}>", id);
  }

  class ByteDecoder final : public Decoder {
   public:
    ByteDecoder(const ByteCodec& codec, bool skip_special) : codec_(codec), skip_special_(skip_special) {}
    std::string push(std::int32_t id) override {
      if (id >= kByteOffset && id < kByteOffset + 256) {
        pending_ += static_cast<char>(id - kByteOffset);
      } else if (!skip_special_) {
        pending_ += codec_.special_text(id);
      }
      const std::size_t ready = utf8::complete_prefix(pending_);
      std::string out = pending_.substr(0, ready);
      pending_.erase(0, ready);
      return out;
    }
    std::string flush() override { return std::exchange(pending_, {}); }

   private:
    const ByteCodec& codec_;
    bool skip_special_;
    std::string pending_;
  };

  std::int32_t bos_;
  std::int32_t eos_;
};

}  // namespace

std::unique_ptr<TextCodec> make_byte_codec(const ModelVocab& vocab) {
  if (vocab.size < kByteOffset + 256) {
    fail("the model has no tokenizer.json and its vocabulary ({} tokens) is too small for the byte codec (259)",
         vocab.size);
  }
  return std::make_unique<ByteCodec>(vocab);
}

std::unique_ptr<TextCodec> make_text_codec(const std::filesystem::path& model_dir, const ModelVocab& vocab) {
  const std::filesystem::path tokenizer_json = model_dir / "tokenizer.json";
  if (std::filesystem::exists(tokenizer_json)) return make_tokenizer_codec(tokenizer_json, vocab);
  return make_byte_codec(vocab);
}

}  // namespace dsv4
