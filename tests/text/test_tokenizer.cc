// Tokenizer tests: the built-in tiny tokenizer against goldens from an independent
// implementation (tokenizers.js, see make_goldens.mjs), round trips on multilingual text,
// invalid UTF-8 and long runs, special-token handling, streaming decode, merge ranks and
// split behaviors on crafted tokenizer.json files, and the errors malformed files give.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/json_io.h"
#include "text/bpe_trainer.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace dsv4 {
namespace {

const std::filesystem::path kGoldens =
    std::filesystem::path(DSV4_SOURCE_DIR) / "tests/text/tiny_tokenizer_goldens.json";

// ---- helpers -------------------------------------------------------------------------------------

std::uint64_t fnv1a64(std::string_view bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

// GPT-2's byte-level spelling of one byte, written out independently of tokenizer.cc.
std::string byte_symbol(int b) {
  int cp = b;
  if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
    int n = 0;
    for (int x = 0; x < b; ++x)
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) ++n;
    cp = 256 + n;
  }
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// A crafted tokenizer.json: the 256 byte symbols (ids = bytes), `extra` tokens after them,
// `merges`, and a pre-tokenizer (default: ByteLevel without regex: the text is one piece).
Json crafted(const std::vector<std::string>& extra, const Json& merges,
             Json pre_tokenizer = Json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_symbol(b)] = b;
  int id = 256;
  for (const auto& t : extra) vocab[t] = id++;
  return Json{{"normalizer", nullptr},
              {"pre_tokenizer", pre_tokenizer},
              {"decoder", {{"type", "ByteLevel"}}},
              {"added_tokens", Json::array()},
              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
}

Tokenizer load(const Json& j) { return Tokenizer::from_json_text(j.dump(), "crafted.json"); }

std::vector<std::int32_t> ids(std::initializer_list<std::int32_t> list) { return list; }

// Pre-tokenizer that is one Split step before ByteLevel.
Json split_step(const Json& pattern, const char* behavior, bool invert = false) {
  return Json{{"type", "Sequence"},
              {"pretokenizers",
               {{{"type", "Split"}, {"pattern", pattern}, {"behavior", behavior}, {"invert", invert}},
                {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
}

// ---- the built-in tiny tokenizer --------------------------------------------------------------

// Trained once per process, in memory (ctest may run the tests of this suite in parallel).
class TinyTokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    json_ = new std::string(train_bpe_tokenizer(tiny_tokenizer_corpus(), v4_tokenizer_options(4096)));
    tokenizer_ = new Tokenizer(Tokenizer::from_json_text(*json_, "tiny tokenizer.json"));
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete json_;
    tokenizer_ = nullptr;
    json_ = nullptr;
  }
  static const Tokenizer& tok() { return *tokenizer_; }
  static const std::string& json() { return *json_; }
  static Tokenizer* tokenizer_;
  static std::string* json_;
};
Tokenizer* TinyTokenizer::tokenizer_ = nullptr;
std::string* TinyTokenizer::json_ = nullptr;

// write_tiny_tokenizer writes what training gives. With DSV4_WRITE_TINY_TOKENIZER=<dir> set,
// it writes there (for make_goldens.mjs); otherwise into a directory of this process's own.
TEST_F(TinyTokenizer, WritesFiles) {
  const char* env = std::getenv("DSV4_WRITE_TINY_TOKENIZER");
  const std::filesystem::path dir = env != nullptr ? std::filesystem::path(env)
                                                   : std::filesystem::path(DSV4_BINARY_DIR) / "tests/text" /
                                                         fmt::format("tiny_tokenizer.{}", ::getpid());
  write_tiny_tokenizer(dir);
  EXPECT_EQ(read_text_file(dir / "tokenizer.json"), json());
  EXPECT_EQ(Tokenizer::from_file(dir / "tokenizer.json").vocab_size(), 4096);
  const Json config = read_json_file(dir / "tokenizer_config.json");
  EXPECT_EQ(config.at("bos_token"), "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(config.at("eos_token"), "<｜end▁of▁sentence｜>");
  if (env == nullptr) std::filesystem::remove_all(dir);
}

TEST_F(TinyTokenizer, VocabularyLayout) {
  EXPECT_EQ(tok().vocab_size(), 4096);
  EXPECT_EQ(tok().token_id("<｜begin▁of▁sentence｜>"), 0);
  EXPECT_EQ(tok().token_id("<｜end▁of▁sentence｜>"), 1);
  EXPECT_TRUE(tok().is_special(0));
  EXPECT_TRUE(tok().is_special(1));
  for (const char* t : {"<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜", "<｜latest_reminder｜>"})
    EXPECT_TRUE(tok().token_id(t).has_value()) << t;
  EXPECT_FALSE(tok().is_special(*tok().token_id("</think>")));  // kept by skip_special decoding
  // Every id in [0, 4096) is a token.
  for (std::int32_t id = 0; id < 4096; ++id) ASSERT_TRUE(tok().token_text(id).has_value()) << id;
  EXPECT_FALSE(tok().token_text(4096).has_value());
}

TEST_F(TinyTokenizer, TrainingIsDeterministic) {
  EXPECT_EQ(train_bpe_tokenizer(tiny_tokenizer_corpus(), v4_tokenizer_options(4096)), json());
}

TEST_F(TinyTokenizer, MatchesTokenizersJsGoldens) {
  const Json goldens = read_json_file(kGoldens);
  const std::string hash = fmt::format("{:016x}", fnv1a64(json()));
  EXPECT_EQ(hash, goldens.at("tokenizer_json_fnv1a64").get<std::string>())
      << "the trained tokenizer differs from the one the goldens were made for (changed license "
         "texts in /usr/share/common-licenses, or a trainer change): regenerate them with "
         "tests/text/make_goldens.mjs";
  ASSERT_GE(goldens.at("cases").size(), 20u);
  for (const auto& c : goldens.at("cases")) {
    const std::string text = c.at("text").get<std::string>();
    const auto want = c.at("ids").get<std::vector<std::int32_t>>();
    EXPECT_EQ(tok().encode(text), want) << text;
    EXPECT_EQ(tok().decode(want), text);
  }
}

TEST_F(TinyTokenizer, DeepSeekPreTokenizer) {
  using V = std::vector<std::string>;
  EXPECT_EQ(tok().pre_tokenize("1234567"), (V{"123", "456", "7"}));
  EXPECT_EQ(tok().pre_tokenize("今天abc"), (V{"今天", "abc"}));
  EXPECT_EQ(tok().pre_tokenize("Hello, world!"), (V{"Hello", ",", " world", "!"}));
  EXPECT_EQ(tok().pre_tokenize("a" + std::string(40, ' ') + "b"), (V{"a", std::string(39, ' '), " b"}));
  EXPECT_EQ(tok().pre_tokenize("x\n\n  y"), (V{"x", "\n\n", " ", " y"}));
  // An invalid byte is a piece of its own; the valid text around it is split as usual.
  EXPECT_EQ(tok().pre_tokenize("ab\xff" "12345"), (V{"ab", "\xff", "123", "45"}));
}

TEST_F(TinyTokenizer, RoundTripsMultilingualText) {
  const std::vector<std::string> texts = {
      "中文测试：机器学习和自然语言处理。",
      "日本語のテキスト、カタカナ、ひらがな。",
      "العربية: مرحبا بكم في عالم الحوسبة",
      "हिन्दी: क्षत्रिय ज्ञान श्री",
      "emoji ZWJ: 👩‍👩‍👧‍👦 👨🏽‍🚀 🧑‍🤝‍🧑 🏴‍☠️ flags 🇺🇳🇧🇷",
      "combining: a\u0300\u0301\u0302\u0303 o\u0308 Z\u0336 \u0915\u094d\u0937",
      "zero width: a\u200bb\u200cc\u200dd\ufeffe",
      "mixed 混合 テキスト with 123 and ١٢٣ and 𝟘𝟙𝟚",
  };
  for (const auto& text : texts) {
    const auto encoded = tok().encode(text);
    EXPECT_EQ(tok().decode(encoded), text);
    for (auto id : encoded) EXPECT_FALSE(tok().is_special(id)) << text;
  }
}

TEST_F(TinyTokenizer, RoundTripsInvalidUtf8) {
  const std::vector<std::string> inputs = {
      "\x80",                          // lone continuation byte
      "abc\xbf\xbf def",               // continuation bytes after ASCII
      "\xe4\xbd",                      // truncated 3-byte sequence (你 is e4 bd a0)
      "x\xf0\x9f\x98 y",               // truncated emoji
      "\xed\xa0\x80",                  // UTF-16 surrogate encoded in UTF-8
      "\xc0\xaf \xe0\x80\xaf",         // overlong encodings
      "\xf5\x80\x80\x80 \xff\xfe",     // bytes that never appear in UTF-8
      "ok\xe4\xbd\xa0ok\xe4\xbd",      // a valid character then a truncated one
      std::string("nul\0byte", 8),
      "<｜User｜>\xff<｜Assistant｜>",  // invalid bytes next to special tokens
  };
  for (const auto& input : inputs) {
    const auto encoded = tok().encode(input);
    EXPECT_EQ(tok().decode(encoded), input);
    for (auto id : encoded) EXPECT_LT(id, tok().vocab_size());
  }
}

TEST_F(TinyTokenizer, LongRunsOfWhitespaceAndDigits) {
  std::string digits;
  for (int i = 0; i < 5000; ++i) digits += "1234567890";
  const std::vector<std::string> inputs = {std::string(100000, ' '), std::string(20000, '\n'),
                                           std::string(10000, '\t') + "x" + std::string(10000, ' '), digits,
                                           " \r\n\t\v\f" + std::string(5000, ' ') + "end"};
  for (const auto& input : inputs) EXPECT_EQ(tok().decode(tok().encode(input)), input);
  // Digits are pre-tokenized in groups of at most three: no token holds more.
  for (auto id : tok().encode(digits)) {
    const std::string text = *tok().token_text(id);
    EXPECT_LE(text.size(), 3u);
  }
  EXPECT_GE(tok().encode(digits).size(), 50000u / 3 + 1);
}

TEST_F(TinyTokenizer, SpecialTokensOnlyWhenAllowed) {
  const std::string text = "<｜User｜>hi<｜Assistant｜>";
  const auto user = *tok().token_id("<｜User｜>"), assistant = *tok().token_id("<｜Assistant｜>");
  const auto allowed = tok().encode(text, true);
  ASSERT_GE(allowed.size(), 3u);
  EXPECT_EQ(allowed.front(), user);
  EXPECT_EQ(allowed.back(), assistant);

  const auto plain = tok().encode(text, false);
  for (auto id : plain) EXPECT_FALSE(tok().is_special(id));
  EXPECT_GT(plain.size(), allowed.size());
  EXPECT_EQ(tok().decode(plain), text);

  // Non-special added tokens are matched either way (as in HF tokenizers).
  const auto think = *tok().token_id("</think>");
  EXPECT_EQ(tok().encode("</think>", false), ids({think}));
  EXPECT_EQ(tok().encode("</think>", true), ids({think}));
  // A prefix of a special token is plain text.
  for (auto id : tok().encode("<｜User", true)) EXPECT_FALSE(tok().is_special(id));
  // Longest match wins; adjacent specials split cleanly.
  EXPECT_EQ(tok().encode("<｜end▁of▁sentence｜><｜begin▁of▁sentence｜>"), ids({1, 0}));
}

TEST_F(TinyTokenizer, DecodeSkipsSpecialTokensOnRequest) {
  const auto encoded = tok().encode("<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜></think>ok<｜end▁of▁sentence｜>");
  EXPECT_EQ(tok().decode(encoded, true), "hi</think>ok");
  EXPECT_EQ(tok().decode(encoded, false), "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜></think>ok<｜end▁of▁sentence｜>");
  // Unknown ids decode to nothing.
  EXPECT_EQ(tok().decode(ids({-1, 4096, 1 << 30})), "");
}

TEST_F(TinyTokenizer, StreamDecoderMatchesDecodeAndKeepsCharactersWhole) {
  const std::vector<std::string> texts = {"Hello, 世界! 👩‍💻 emoji 🇯🇵 and नमस्ते", "😀😀😀 \xe4\xbd\xa0\xe5\xa5\xbd",
                                          "bad \x80\xff bytes \xe4\xbd", "<think>x</think>y<｜end▁of▁sentence｜>"};
  for (bool skip : {false, true}) {
    for (const auto& text : texts) {
      const auto encoded = tok().encode(text);
      Tokenizer::StreamDecoder stream(tok(), skip);
      std::string joined;
      for (auto id : encoded) {
        const std::string chunk = stream.push(id);
        if (utf8::is_valid(text)) {
          EXPECT_TRUE(utf8::is_valid(chunk)) << "split character in " << text;
        }
        joined += chunk;
      }
      joined += stream.flush();
      EXPECT_EQ(joined, tok().decode(encoded, skip));
    }
  }
}

TEST_F(TinyTokenizer, StreamDecoderHoldsPartialCharacters) {
  // Byte tokens: id = 3 + byte in the tiny tokenizer's layout (bos, eos, pad first).
  auto byte = [](unsigned b) { return static_cast<std::int32_t>(3 + b); };
  ASSERT_EQ(tok().token_text(byte(0xF0)), std::string("\xF0"));
  Tokenizer::StreamDecoder stream(tok());
  EXPECT_EQ(stream.push(byte(0xF0)), "");
  EXPECT_EQ(stream.push(byte(0x9F)), "");
  EXPECT_EQ(stream.push(byte(0x98)), "");
  EXPECT_EQ(stream.push(byte(0x80)), "😀");
  // A byte that can never start or continue a character is passed on at once.
  EXPECT_EQ(stream.push(byte(0x80)), "\x80");
  EXPECT_EQ(stream.push(byte(0xFF)), "\xFF");
  // A partial character followed by something else is released as it is.
  EXPECT_EQ(stream.push(byte(0xE4)), "");
  EXPECT_EQ(stream.push(byte('a')), "\xE4" "a");
  // An impossible second byte (E0 needs A0..BF) is not held.
  EXPECT_EQ(stream.push(byte(0xE0)), "");
  EXPECT_EQ(stream.push(byte(0x80)), "\xE0\x80");
  // flush hands over what is held.
  EXPECT_EQ(stream.push(byte(0xE4)), "");
  EXPECT_EQ(stream.push(byte(0xBD)), "");
  EXPECT_EQ(stream.flush(), "\xE4\xBD");
  EXPECT_EQ(stream.flush(), "");
}

// ---- crafted tokenizers -------------------------------------------------------------------------

TEST(TokenizerMerges, AppliedByRank) {
  // ids: a=97, b=98, c=99; ab=256, bc=257, abc=258
  const std::vector<std::string> extra = {"ab", "bc", "abc"};
  EXPECT_EQ(load(crafted(extra, Json::array({"b c", "a b"}))).encode("abc"), ids({97, 257}));
  EXPECT_EQ(load(crafted(extra, Json::array({"a b", "b c"}))).encode("abc"), ids({256, 99}));
  EXPECT_EQ(load(crafted(extra, Json::array({"a b", "ab c"}))).encode("abc"), ids({258}));
  // Pair form of merges is accepted too.
  EXPECT_EQ(load(crafted(extra, Json::array({Json::array({"b", "c"}), Json::array({"a", "bc"})}))).encode("abc"),
            ids({258}));
  // Equal ranks: leftmost first.
  EXPECT_EQ(load(crafted({"aa"}, Json::array({"a a"}))).encode("aaa"), ids({256, 97}));
  // A merge only applies where both halves exist at that moment.
  EXPECT_EQ(load(crafted({"aa", "aaaa"}, Json::array({"a a", "aa aa"}))).encode("aaaaa"), ids({257, 97}));
}

TEST(TokenizerMerges, IgnoreMergesTakesWholeWords) {
  Json j = crafted({"ab", "abc"}, Json::array({"a b"}));
  EXPECT_EQ(load(j).encode("abc"), ids({256, 99}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(load(j).encode("abc"), ids({257}));
}

TEST(TokenizerSplit, Behaviors) {
  using V = std::vector<std::string>;
  const Json dash = {{"String", "-"}};
  auto pieces = [&](const char* behavior, bool invert = false) {
    return load(crafted({}, Json::array(), split_step(dash, behavior, invert))).pre_tokenize("the-final--countdown");
  };
  // The examples of HF's SplitDelimiterBehavior documentation.
  EXPECT_EQ(pieces("Removed"), (V{"the", "final", "countdown"}));
  EXPECT_EQ(pieces("Isolated"), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(pieces("MergedWithPrevious"), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(pieces("MergedWithNext"), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(pieces("Contiguous"), (V{"the", "-", "final", "--", "countdown"}));
  EXPECT_EQ(pieces("Removed", true), (V{"-", "-", "-"}));
  // A String pattern is literal; a Regex is not.
  EXPECT_EQ(load(crafted({}, Json::array(), split_step({{"String", "."}}, "Isolated"))).pre_tokenize("a.b"),
            (V{"a", ".", "b"}));
  EXPECT_EQ(load(crafted({}, Json::array(), split_step({{"Regex", "."}}, "Isolated"))).pre_tokenize("a.b"),
            (V{"a", ".", "b"}));
  EXPECT_EQ(load(crafted({}, Json::array(), split_step({{"Regex", "\\p{Han}+"}}, "Isolated"))).pre_tokenize("ab中文cd"),
            (V{"ab", "中文", "cd"}));
  // Empty matches do not loop or produce empty pieces.
  EXPECT_EQ(load(crafted({}, Json::array(), split_step({{"Regex", "x*"}}, "Isolated"))).pre_tokenize("axb"),
            (V{"a", "x", "b"}));
  // Removed text is gone from the encoding.
  EXPECT_EQ(load(crafted({}, Json::array(), split_step(dash, "Removed"))).decode(
                load(crafted({}, Json::array(), split_step(dash, "Removed"))).encode("a-b")),
            "ab");
}

TEST(TokenizerSplit, ByteLevelRegexAndDigits) {
  using V = std::vector<std::string>;
  const Json gpt2 = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  EXPECT_EQ(load(crafted({}, Json::array(), gpt2)).pre_tokenize("Hello world's  end"),
            (V{"Hello", " world", "'s", " ", " end"}));
  const Json digits = {{"type", "Sequence"},
                       {"pretokenizers",
                        {{{"type", "Digits"}, {"individual_digits", true}},
                         {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  EXPECT_EQ(load(crafted({}, Json::array(), digits)).pre_tokenize("a123"), (V{"a", "1", "2", "3"}));
}

TEST(TokenizerAddedTokens, LoadedAndMatchedLongestFirst) {
  Json j = crafted({}, Json::array());
  j["added_tokens"] = {{{"id", 300}, {"content", "<s>"}, {"special", true}},
                       {{"id", 301}, {"content", "<s>x"}, {"special", true}},
                       {{"id", 302}, {"content", "café"}, {"special", false}}};
  const Tokenizer t = load(j);
  EXPECT_EQ(t.encode("<s><s>xy"), ids({300, 301, 121}));
  EXPECT_EQ(t.vocab_size(), 303);
  EXPECT_TRUE(t.is_special(300));
  EXPECT_FALSE(t.is_special(302));
  EXPECT_FALSE(t.token_text(299).has_value());  // a hole in the id space
  EXPECT_EQ(t.decode(t.encode("a café")), "a café");  // added content decodes as is
  EXPECT_EQ(t.encode("café", false), ids({302}));
}

// ---- malformed files ----------------------------------------------------------------------------

void expect_text_error(const std::string& text, const std::string& fragment) {
  try {
    Tokenizer::from_json_text(text, "bad/tokenizer.json");
    ADD_FAILURE() << "accepted; expected an error with " << fragment;
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("bad/tokenizer.json"), std::string::npos) << message;
    EXPECT_NE(message.find(fragment), std::string::npos) << "wanted '" << fragment << "' in: " << message;
  }
}

void expect_error(const Json& j, const std::string& fragment) { expect_text_error(j.dump(), fragment); }

TEST(TokenizerErrors, MalformedFiles) {
  const Json good = crafted({"ab"}, Json::array({"a b"}));
  ASSERT_NO_THROW(load(good));

  expect_text_error("{not json", "invalid JSON");
  {
    // A token listed twice in the vocab (HF would keep one silently): refused, naming it.
    std::string text = good.dump();
    const std::size_t at = text.find("\"vocab\":{");
    ASSERT_NE(at, std::string::npos);
    text.insert(at + std::string("\"vocab\":{").size(), "\"ab\":3,");
    expect_text_error(text, "key 'ab' is listed more than once in \"model.vocab\"");
  }
  expect_text_error("[1, 2]", "expected a JSON object");
  {
    Json j = good;
    j.erase("model");
    expect_error(j, "missing field 'model'");
  }
  {
    Json j = good;
    j["model"]["type"] = "WordPiece";
    expect_error(j, "WordPiece");
  }
  {
    Json j = good;
    j["model"]["merges"] = Json::array({"a c d"});
    expect_error(j, "merges[0]");
  }
  {
    Json j = good;
    j["model"]["merges"] = Json::array({"a zz"});
    expect_error(j, "\"zz\" is not in the vocab");
  }
  {
    Json j = good;
    j["model"]["merges"] = Json::array({"b c"});
    expect_error(j, "merged token \"bc\"");
  }
  {
    Json j = good;
    j["model"]["merges"] = Json::array({"a b", "a b"});
    expect_error(j, "duplicate merge");
  }
  {
    Json j = good;
    j["model"]["merges"] = Json::array({42});
    expect_error(j, "merges[0]");
  }
  {
    Json j = good;
    j["model"]["vocab"]["zz"] = 97;  // the id of "a"
    expect_error(j, "duplicate id 97");
  }
  {
    Json j = good;
    j["model"]["vocab"]["zz"] = -3;
    expect_error(j, "out of range");
  }
  {
    Json j = good;
    j["model"]["vocab"].erase(byte_symbol(' '));
    expect_error(j, "byte 0x20");
  }
  {
    Json j = good;
    j["model"]["dropout"] = 0.1;
    expect_error(j, "dropout");
  }
  {
    Json j = good;
    j["model"]["continuing_subword_prefix"] = "##";
    expect_error(j, "continuing_subword_prefix");
  }
  expect_error(crafted({}, Json::array(), split_step({{"Regex", "(unclosed"}}, "Isolated")), "bad regex");
  expect_error(crafted({}, Json::array(), split_step({{"Regex", "a"}}, "Sideways")), "Sideways");
  expect_error(crafted({}, Json::array(), split_step({{"Glob", "a"}}, "Isolated")), "\"Regex\" or \"String\"");
  expect_error(crafted({}, Json::array(), Json{{"type", "Whitespace"}}), "Whitespace");
  expect_error(crafted({}, Json::array(), Json{{"type", "Sequence"}, {"pretokenizers", Json::array()}}),
               "no ByteLevel");
  expect_error(crafted({}, Json::array(), Json{{"type", "ByteLevel"}, {"add_prefix_space", true}}),
               "add_prefix_space");
  {
    Json j = good;
    j["pre_tokenizer"] = nullptr;
    expect_error(j, "pre_tokenizer is missing");
  }
  {
    Json j = good;
    j["truncation"] = {{"max_length", 8}};
    expect_error(j, "\"truncation\" is not supported");
  }
  {
    Json j = good;
    j["normalizer"] = {{"type", "NFC"}};
    expect_error(j, "NFC");
  }
  {
    Json j = good;
    j["decoder"] = {{"type", "WordPiece"}};
    expect_error(j, "decoder \"WordPiece\"");
  }
  {
    Json j = good;
    j["added_tokens"] = {{{"id", 300}, {"content", "<x>"}, {"lstrip", true}}};
    expect_error(j, "lstrip");
  }
  {
    Json j = good;
    j["added_tokens"] = {{{"id", 300}, {"content", "<x>"}}, {{"id", 300}, {"content", "<y>"}}};
    expect_error(j, "duplicate added token id 300");
  }
  {
    Json j = good;
    j["added_tokens"] = {{{"id", 97}, {"content", "<x>"}}};
    expect_error(j, "id 97 is the vocab's");
  }
  {
    Json j = good;
    j["added_tokens"] = {{{"id", 300}, {"content", "ab"}}};
    expect_error(j, "\"ab\" has id 256");
  }
  {
    Json j = good;
    j["added_tokens"] = {{{"id", 300}, {"content", ""}}};
    expect_error(j, "empty content");
  }
  {
    // Fields are read by the one JSON reader: source, field, expected and found.
    Json j = good;
    j["added_tokens"] = {{{"id", 300}, {"content", "<x>"}, {"special", "yes"}}};
    expect_error(j, "bad/tokenizer.json: field 'added_tokens[0].special' must be true or false, found string");
    j["added_tokens"] = {{{"id", 1.5}, {"content", "<x>"}}};
    expect_error(j, "field 'added_tokens[0].id' must be an integer, found number 1.5");
    j["added_tokens"] = {{{"content", "<x>"}}};
    expect_error(j, "missing field 'added_tokens[0].id'");
  }
}

TEST(TokenizerErrors, MissingFileNamesThePath) {
  try {
    Tokenizer::from_file("/nonexistent/dir/tokenizer.json");
    ADD_FAILURE() << "accepted a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/tokenizer.json"), std::string::npos);
  }
}

}  // namespace
}  // namespace dsv4
