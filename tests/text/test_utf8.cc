// text/utf8.h: the one UTF-8 rule (RFC 3629, strict), against the definition (the encodings of
// all Unicode scalar values), nlohmann::json's replacement of invalid UTF-8, and the cases where
// the copies it replaced disagreed (the server's lax lead-byte rule, its stop-string cut).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <unordered_set>

#include "text/byte_level.h"
#include "text/utf8.h"

namespace dsv4 {
namespace {

std::string encode(char32_t cp) {
  std::string s;
  utf8::append(s, cp);
  return s;
}

bool is_scalar(char32_t cp) { return cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF); }

// The valid characters, by definition: the encodings of the scalar values.
const std::unordered_set<std::string>& valid_characters() {
  static const auto* set = [] {
    auto* s = new std::unordered_set<std::string>;
    for (char32_t cp = 0; cp <= 0x10FFFF; ++cp)
      if (is_scalar(cp)) s->insert(encode(cp));
    return s;
  }();
  return *set;
}

TEST(Utf8, AppendAndDecodeRoundTripEveryScalarValue) {
  for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (!is_scalar(cp)) continue;
    const std::string s = encode(cp);
    const std::size_t expected = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    ASSERT_EQ(s.size(), expected) << std::hex << static_cast<std::uint32_t>(cp);
    ASSERT_EQ(utf8::char_length(s, 0), expected) << std::hex << static_cast<std::uint32_t>(cp);
    ASSERT_EQ(utf8::decode(s, 0, expected), cp);
    ASSERT_TRUE(utf8::is_valid(s));
  }
}

TEST(Utf8, CharLengthAcceptsExactlyTheEncodingsOfScalarValues) {
  const auto& valid = valid_characters();
  // Every 1- and 2-byte string, every 3-byte string with an E0..EF lead, and 4-byte strings
  // with an F0..F7 lead around the continuation-byte boundaries.
  for (int a = 0; a < 256; ++a) {
    const std::string one(1, static_cast<char>(a));
    EXPECT_EQ(utf8::char_length(one, 0) == 1, valid.count(one) == 1) << a;
    for (int b = 0; b < 256; ++b) {
      const std::string two{static_cast<char>(a), static_cast<char>(b)};
      ASSERT_EQ(utf8::char_length(two, 0) == 2, valid.count(two) == 1) << a << " " << b;
    }
  }
  for (int a = 0xE0; a <= 0xEF; ++a)
    for (int b = 0; b < 256; ++b)
      for (int c = 0; c < 256; ++c) {
        const std::string three{static_cast<char>(a), static_cast<char>(b), static_cast<char>(c)};
        ASSERT_EQ(utf8::char_length(three, 0) == 3, valid.count(three) == 1) << a << " " << b << " " << c;
      }
  for (int a = 0xF0; a <= 0xF7; ++a)
    for (int b = 0; b < 256; ++b)
      for (int c : {0x00, 0x7F, 0x80, 0x9F, 0xA0, 0xBF, 0xC0})
        for (int d : {0x7F, 0x80, 0xBF, 0xC0}) {
          const std::string four{static_cast<char>(a), static_cast<char>(b), static_cast<char>(c),
                                 static_cast<char>(d)};
          ASSERT_EQ(utf8::char_length(four, 0) == 4, valid.count(four) == 1) << a << " " << b;
        }
}

TEST(Utf8, StrictRule) {
  for (const char* bad : {"\xC0\x80", "\xC1\xBF",           // overlong 2-byte
                          "\xE0\x80\x80", "\xE0\x9F\xBF",   // overlong 3-byte
                          "\xED\xA0\x80", "\xED\xBF\xBF",   // surrogates
                          "\xF0\x80\x80\x80", "\xF0\x8F\xBF\xBF",  // overlong 4-byte
                          "\xF4\x90\x80\x80", "\xF5\x80\x80\x80", "\xF7\xBF\xBF\xBF",  // above U+10FFFF
                          "\x80", "\xBF", "\xFE", "\xFF", "\xE2\x98"}) {
    EXPECT_FALSE(utf8::is_valid(bad)) << bad;
    EXPECT_EQ(utf8::char_length(bad, 0), 0u) << bad;
  }
  for (const char* good : {"\x7F", "\xC2\x80", "\xDF\xBF", "\xE0\xA0\x80", "\xED\x9F\xBF", "\xEE\x80\x80",
                           "\xEF\xBF\xBF", "\xF0\x90\x80\x80", "\xF4\x8F\xBF\xBF"}) {
    EXPECT_TRUE(utf8::is_valid(good)) << good;
  }
  EXPECT_EQ(utf8::lead_length('a'), 1u);
  EXPECT_EQ(utf8::lead_length(0xC1), 0u);
  EXPECT_EQ(utf8::lead_length(0xC2), 2u);
  EXPECT_EQ(utf8::lead_length(0xED), 3u);
  EXPECT_EQ(utf8::lead_length(0xF4), 4u);
  EXPECT_EQ(utf8::lead_length(0xF5), 0u);
  EXPECT_EQ(utf8::lead_length(0x80), 0u);
}

TEST(Utf8, IncompleteTailWaitsOnlyForWhatCanStillBecomeValid) {
  EXPECT_EQ(utf8::incomplete_tail(""), 0u);
  EXPECT_EQ(utf8::incomplete_tail("abc"), 0u);
  EXPECT_EQ(utf8::incomplete_tail("a\xE2"), 1u);
  EXPECT_EQ(utf8::incomplete_tail("a\xE2\x98"), 2u);
  EXPECT_EQ(utf8::incomplete_tail("a\xE2\x98\x83"), 0u);
  EXPECT_EQ(utf8::incomplete_tail("\xF0\x9F\x98"), 3u);
  EXPECT_EQ(utf8::incomplete_tail("a\x80"), 0u);  // a stray continuation byte
  EXPECT_EQ(utf8::incomplete_tail("a\xFF"), 0u);
  EXPECT_EQ(utf8::incomplete_tail("\xE2\x98\x83\x83"), 0u);
  // Where the server's old rule (lead-byte shape only) waited for bytes that cannot help:
  EXPECT_EQ(utf8::incomplete_tail("\xC0"), 0u);          // overlong lead
  EXPECT_EQ(utf8::incomplete_tail("\xC1"), 0u);
  EXPECT_EQ(utf8::incomplete_tail("\xE0\x80"), 0u);      // overlong 3-byte
  EXPECT_EQ(utf8::incomplete_tail("\xED\xA0"), 0u);      // surrogate
  EXPECT_EQ(utf8::incomplete_tail("\xF0\x8F"), 0u);      // overlong 4-byte
  EXPECT_EQ(utf8::incomplete_tail("\xF4\x90\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(utf8::incomplete_tail("\xF5"), 0u);
  EXPECT_EQ(utf8::incomplete_tail("\xF7\xBF\xBF"), 0u);
  // ... and their valid neighbours, which are waited for.
  EXPECT_EQ(utf8::incomplete_tail("\xE0\xA0"), 2u);
  EXPECT_EQ(utf8::incomplete_tail("\xED\x9F"), 2u);
  EXPECT_EQ(utf8::incomplete_tail("\xF4\x8F\xBF"), 3u);

  // What the byte codec's stream releases (these were the server's own copy's cases).
  EXPECT_EQ(utf8::complete_prefix("abc"), 3u);
  EXPECT_EQ(utf8::complete_prefix("a\xe2"), 1u);
  EXPECT_EQ(utf8::complete_prefix("a\xe2\x98"), 1u);
  EXPECT_EQ(utf8::complete_prefix("a\xe2\x98\x83"), 4u);
  EXPECT_EQ(utf8::complete_prefix("\xf0\x9f\x98"), 0u);
  EXPECT_EQ(utf8::complete_prefix("a\x80"), 2u);  // a stray continuation byte is not waited for
  EXPECT_EQ(utf8::complete_prefix("a\xff"), 2u);
  EXPECT_EQ(utf8::complete_prefix(""), 0u);
  EXPECT_EQ(utf8::complete_prefix("\xC0"), 1u);  // the server's copy held this (and the cases above)
}

// Property: incomplete_tail holds back exactly a suffix that some valid character starts with
// (a proper prefix of one), so it never waits in vain and never releases half a character.
TEST(Utf8, IncompleteTailAgreesWithTheDefinition) {
  std::unordered_set<std::string> proper_prefixes;
  for (const std::string& c : valid_characters())
    for (std::size_t k = 1; k < c.size(); ++k) proper_prefixes.insert(c.substr(0, k));
  std::mt19937 rng(7);
  const unsigned char interesting[] = {'a', 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF,
                                       0xE0, 0xE2, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF};
  for (int trial = 0; trial < 200000; ++trial) {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < n; ++i) s += static_cast<char>(interesting[rng() % std::size(interesting)]);
    std::size_t expected = 0;
    for (std::size_t k = 1; k <= 3 && k <= s.size(); ++k)
      if (proper_prefixes.count(s.substr(s.size() - k)) == 1) expected = k;
    ASSERT_EQ(utf8::incomplete_tail(s), expected) << testing::PrintToString(s);
  }
}

TEST(Utf8, CharStartNeverSplitsACharacter) {
  const std::string snowman = "a\xE2\x98\x83" "b";
  EXPECT_EQ(utf8::char_start(snowman, 0), 0u);
  EXPECT_EQ(utf8::char_start(snowman, 1), 1u);
  EXPECT_EQ(utf8::char_start(snowman, 2), 1u);
  EXPECT_EQ(utf8::char_start(snowman, 3), 1u);
  EXPECT_EQ(utf8::char_start(snowman, 4), 4u);
  EXPECT_EQ(utf8::char_start(snowman, 5), 5u);
  EXPECT_EQ(utf8::char_start("a\xE2\x98", 2), 1u);  // still incomplete at the end
  // Where the stop-string cut's old rule (back over any continuation byte) moved too far:
  EXPECT_EQ(utf8::char_start("\x80\x80\x80", 2), 2u);      // stray continuation bytes
  EXPECT_EQ(utf8::char_start("\xC0\x80", 1), 1u);          // overlong
  EXPECT_EQ(utf8::char_start("\xE0\x80\x80", 2), 2u);      // overlong
  EXPECT_EQ(utf8::char_start("\xED\xA0\x80", 1), 1u);      // surrogate
  EXPECT_EQ(utf8::char_start("x\xE2\x98\x83\x83", 4), 4u);  // one continuation byte too many
}

TEST(Utf8, CountCharStartsIsAdditive) {
  EXPECT_EQ(utf8::count_char_starts("a\xE2\x98\x83"), 2u);
  EXPECT_EQ(utf8::count_char_starts("\xE2"), 1u);
  EXPECT_EQ(utf8::count_char_starts("\x98\x83"), 0u);
  EXPECT_EQ(utf8::count_char_starts("\xF0\x9F\x98\x80 \xE4\xB8\xAD"), 3u);
}

TEST(Utf8, ReplaceInvalidSubstitutesMaximalSubparts) {
  EXPECT_EQ(utf8::replace_invalid("abc"), "abc");
  EXPECT_EQ(utf8::replace_invalid("a\xE2\x98" "b"), "a\xEF\xBF\xBD" "b");  // one per truncated character
  EXPECT_EQ(utf8::replace_invalid("\xC0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8::replace_invalid("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8::replace_invalid("\xF0\x9F\x98"), "\xEF\xBF\xBD");
  EXPECT_EQ(utf8::replace_invalid("\xF4\x90\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_TRUE(utf8::is_valid(utf8::replace_invalid("\xFF\xFE\x80")));
}

// nlohmann::json's dump with error_handler_t::replace implements the same substitution; the
// server writes its JSON that way, so the two must agree byte for byte.
TEST(Utf8, ReplaceInvalidAgreesWithNlohmann) {
  std::mt19937 rng(11);
  const unsigned char interesting[] = {'a', ' ', 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC2,
                                       0xDF, 0xE0, 0xE2, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF};
  for (int trial = 0; trial < 100000; ++trial) {
    std::string s;
    const int n = static_cast<int>(rng() % 9);
    for (int i = 0; i < n; ++i) s += static_cast<char>(interesting[rng() % std::size(interesting)]);
    const std::string by_nlohmann = nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    ASSERT_EQ(nlohmann::json(utf8::replace_invalid(s)).dump(), by_nlohmann) << testing::PrintToString(s);
  }
}

TEST(ByteLevel, GptTwoAlphabet) {
  EXPECT_EQ(byte_level::symbol('a'), "a");
  EXPECT_EQ(byte_level::symbol(' '), "\xC4\xA0");  // Ġ U+0120
  EXPECT_EQ(byte_level::symbol('\n'), "\xC4\x8A");  // Ċ U+010A
  EXPECT_EQ(byte_level::symbol(0), "\xC4\x80");     // Ā U+0100
  EXPECT_EQ(byte_level::symbol(0xE9), "\xC3\xA9");  // é stands for itself
  std::unordered_set<std::string> symbols;
  std::string all;
  for (int b = 0; b < 256; ++b) {
    symbols.insert(byte_level::symbol(static_cast<unsigned char>(b)));
    all += static_cast<char>(b);
  }
  EXPECT_EQ(symbols.size(), 256u);
  EXPECT_EQ(byte_level::decode(byte_level::encode(all)), all);
  EXPECT_EQ(byte_level::encode(" the"), "\xC4\xA0the");
  EXPECT_EQ(byte_level::decode("\xE4\xB8\xAD"), std::nullopt);  // 中 is not in the alphabet
  EXPECT_EQ(byte_level::decode("\xC4"), std::nullopt);          // not UTF-8
}

}  // namespace
}  // namespace dsv4
