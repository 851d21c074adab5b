// UTF-8 by one rule, the strict one of RFC 3629 (the Unicode standard's table of well-formed
// byte sequences): a character is 1 to 4 bytes, with no overlong forms (C0, C1, E0 80..9F,
// F0 80..8F), no surrogates (ED A0..BF) and nothing above U+10FFFF (F4 90..BF, F5..FF).
// Everything in dsv4 that looks inside UTF-8 -- the tokenizer, the streaming decoders, stop
// strings, logprob offsets -- asks here, so they cannot disagree about what a character is.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dsv4::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Continuation bytes are 80..BF.
constexpr bool is_continuation(unsigned char byte) { return (byte & 0xC0) == 0x80; }

// The length (1-4) of the character a lead byte starts, or 0 for a byte that never starts one
// (a continuation byte, C0, C1, F5..FF).
std::size_t lead_length(unsigned char byte);

// The length (1-4) of the valid character at text[at], or 0 when the bytes there are not one
// (ill-formed, or cut off by the end of `text`). `at` must be < text.size().
std::size_t char_length(std::string_view text, std::size_t at);

bool is_valid(std::string_view text);

// The code point of the valid character of `length` bytes (from char_length) at text[at].
char32_t decode(std::string_view text, std::size_t at, std::size_t length);

// Appends the UTF-8 of `code_point` (at most U+10FFFF).
void append(std::string& out, char32_t code_point);

// How many bytes (0-3) at the end of `text` begin a valid character that is still missing
// bytes: what a streaming decoder holds back until the rest arrives. Bytes that can never
// become valid are not waited for.
std::size_t incomplete_tail(std::string_view text);

// text.size() - incomplete_tail(text): the part of `text` that can be released now.
std::size_t complete_prefix(std::string_view text);

// Where the character containing text[at] starts: `at` itself unless text[at] is inside a
// valid character (or inside one still incomplete at the end of `text`). Cutting `text` there
// never splits a character. `at` may be text.size().
std::size_t char_start(std::string_view text, std::size_t at);

// The number of characters that start in `text`: its bytes that are not continuation bytes.
// Equal to the number of code points for valid UTF-8, and additive over any split of a string,
// so summed over tokens it gives character offsets into their concatenation.
std::size_t count_char_starts(std::string_view text);

// `text` with each maximal ill-formed subsequence replaced by U+FFFD (Unicode's "substitution
// of maximal subparts": what Python's errors="replace" and nlohmann::json's replace handler
// produce).
std::string replace_invalid(std::string_view text);

}  // namespace dsv4::utf8
