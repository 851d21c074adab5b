// UTF-8 (utf8.h).
#include "text/utf8.h"

namespace dsv4::utf8 {
namespace {

// The bounds of the byte after a lead byte: narrower than 80..BF exactly where the strict rule
// forbids overlongs (E0, F0), surrogates (ED) and code points above U+10FFFF (F4).
struct SecondByte {
  unsigned char lo = 0x80, hi = 0xBF;
};
SecondByte second_byte(unsigned char lead) {
  switch (lead) {
    case 0xE0: return {0xA0, 0xBF};
    case 0xED: return {0x80, 0x9F};
    case 0xF0: return {0x90, 0xBF};
    case 0xF4: return {0x80, 0x8F};
    default: return {};
  }
}

// How many bytes from text[at] are a well-formed start of the character text[at] leads (at
// most its length); 0 when text[at] is not a lead byte.
std::size_t valid_run(std::string_view text, std::size_t at, std::size_t length) {
  if (length == 0) return 0;
  const SecondByte second = second_byte(static_cast<unsigned char>(text[at]));
  std::size_t n = 1;
  for (; n < length && at + n < text.size(); ++n) {
    const auto b = static_cast<unsigned char>(text[at + n]);
    const unsigned char lo = n == 1 ? second.lo : 0x80, hi = n == 1 ? second.hi : 0xBF;
    if (b < lo || b > hi) break;
  }
  return n;
}

}  // namespace

std::size_t lead_length(unsigned char byte) {
  if (byte < 0x80) return 1;
  if (byte >= 0xC2 && byte <= 0xDF) return 2;
  if (byte >= 0xE0 && byte <= 0xEF) return 3;
  if (byte >= 0xF0 && byte <= 0xF4) return 4;
  return 0;
}

std::size_t char_length(std::string_view text, std::size_t at) {
  const std::size_t length = lead_length(static_cast<unsigned char>(text[at]));
  return length != 0 && valid_run(text, at, length) == length ? length : 0;
}

bool is_valid(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t length = char_length(text, i);
    if (length == 0) return false;
    i += length;
  }
  return true;
}

char32_t decode(std::string_view text, std::size_t at, std::size_t length) {
  const auto b0 = static_cast<unsigned char>(text[at]);
  if (length == 1) return b0;
  char32_t cp = b0 & (0x7F >> length);
  for (std::size_t k = 1; k < length; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[at + k]) & 0x3F);
  return cp;
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::size_t incomplete_tail(std::string_view text) {
  const std::size_t n = text.size();
  for (std::size_t back = 1; back <= 3 && back <= n; ++back) {
    const std::size_t at = n - back;
    if (is_continuation(static_cast<unsigned char>(text[at]))) continue;  // look further back for the lead
    const std::size_t length = lead_length(static_cast<unsigned char>(text[at]));
    // Waiting makes sense only for a lead whose bytes so far are all well-formed and too few.
    return length > back && valid_run(text, at, length) == back ? back : 0;
  }
  return 0;
}

std::size_t complete_prefix(std::string_view text) { return text.size() - incomplete_tail(text); }

std::size_t char_start(std::string_view text, std::size_t at) {
  if (at >= text.size() || !is_continuation(static_cast<unsigned char>(text[at]))) return at;
  for (std::size_t back = 1; back <= 3 && back <= at; ++back) {
    const std::size_t lead = at - back;
    if (is_continuation(static_cast<unsigned char>(text[lead]))) continue;
    const std::size_t length = lead_length(static_cast<unsigned char>(text[lead]));
    // Inside the character at `lead` when its well-formed bytes reach past `at`, and they are
    // either all of it or all there is so far.
    const std::size_t run = valid_run(text, lead, length);
    const bool inside = run > back && (run == length || lead + run == text.size());
    return inside ? lead : at;
  }
  return at;  // a stray continuation byte is a character of its own
}

std::size_t count_char_starts(std::string_view text) {
  std::size_t n = 0;
  for (char c : text) n += !is_continuation(static_cast<unsigned char>(c));
  return n;
}

std::string replace_invalid(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t length = lead_length(static_cast<unsigned char>(text[i]));
    const std::size_t run = valid_run(text, i, length);
    if (length != 0 && run == length) {
      out.append(text.substr(i, length));
      i += length;
    } else {
      out.append(kReplacement);  // one per maximal subpart: the lead and its well-formed bytes
      i += length == 0 ? 1 : run;
    }
  }
  return out;
}

}  // namespace dsv4::utf8
