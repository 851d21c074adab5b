// libFuzzer target: tokenizer.json parsing, encoding and decoding, and chat-completion parsing.
//
// The first byte picks the mode (seeds start with an ASCII digit):
//   even ('0'): the rest is a tokenizer.json; if it loads, it encodes and decodes the input
//     itself and a few fixed strings. Loading may only fail with a dsv4::Error naming the
//     source; ids must be < vocab_size; streaming decode must equal decode.
//   odd  ('1'): the rest is text for a fixed tokenizer (the built-in tiny one, trained once on
//     first use): decode(encode(text)) must give the same bytes, with and without special
//     tokens; no special id may appear when they are not allowed; streaming decode must equal
//     decode; parse_completion must not throw on it.
// Any other exception, a crash, a sanitizer report or a broken invariant is a bug.
//
//   ./fuzz_tokenizer -max_total_time=60 <scratch dir> fuzz/corpus/tokenizer
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "text/bpe_trainer.h"
#include "text/chat_encoding.h"
#include "text/tokenizer.h"

namespace {

constexpr const char* kWhere = "fuzz/tokenizer.json";

[[noreturn]] void bug(const char* what, std::string_view detail) {
  std::fprintf(stderr, "fuzz_tokenizer: %s\n%.*s\n", what, static_cast<int>(detail.size()), detail.data());
  std::abort();
}

std::string stream_decode(const dsv4::Tokenizer& tokenizer, const std::vector<std::int32_t>& ids, bool skip) {
  dsv4::Tokenizer::StreamDecoder stream(tokenizer, skip);
  std::string out;
  for (auto id : ids) out += stream.push(id);
  return out + stream.flush();
}

void check_encoding(const dsv4::Tokenizer& tokenizer, std::string_view text, bool strict) {
  for (bool allow : {true, false}) {
    std::vector<std::int32_t> ids;
    try {
      ids = tokenizer.encode(text, allow);
    } catch (const dsv4::Error&) {
      if (strict) bug("encode failed on the fixed tokenizer", text);
      return;  // a fuzzed regex may hit PCRE2's match limit
    }
    for (auto id : ids) {
      if (id < 0 || id >= tokenizer.vocab_size()) bug("id out of range", text);
      if (!allow && tokenizer.is_special(id)) bug("special id although not allowed", text);
    }
    const std::string decoded = tokenizer.decode(ids);
    if (strict && decoded != text) bug("decode(encode(text)) != text", text);
    if (stream_decode(tokenizer, ids, false) != decoded) bug("stream decode differs from decode", text);
    if (stream_decode(tokenizer, ids, true) != tokenizer.decode(ids, true))
      bug("stream decode (skip special) differs from decode", text);
  }
}

const dsv4::Tokenizer& fixed_tokenizer() {
  static const dsv4::Tokenizer tokenizer = dsv4::Tokenizer::from_json_text(
      dsv4::train_bpe_tokenizer(dsv4::tiny_tokenizer_corpus(), dsv4::v4_tokenizer_options(4096)), "tiny");
  return tokenizer;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) != 0) {
    check_encoding(fixed_tokenizer(), input, /*strict=*/true);
    for (bool thinking : {false, true}) (void)dsv4::parse_completion(input, thinking);
    return 0;
  }
  try {
    const dsv4::Tokenizer tokenizer = dsv4::Tokenizer::from_json_text(input, kWhere);
    for (std::string_view text : {input, std::string_view("Hello, 世界! 123456 \xff\x80 <｜User｜>")})
      check_encoding(tokenizer, text.substr(0, 4096), /*strict=*/false);
  } catch (const dsv4::Error& e) {
    if (std::string_view(e.what()).find(kWhere) == std::string_view::npos) bug("error does not name the source", e.what());
  }
  return 0;
}
