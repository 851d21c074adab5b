// GPT-2's byte-level alphabet (byte_level.h).
#include "text/byte_level.h"

#include <array>
#include <cstdint>
#include <unordered_map>

#include "text/utf8.h"

namespace dsv4::byte_level {
namespace {

struct Alphabet {
  std::array<std::string, 256> symbol;              // byte -> UTF-8 of its character
  std::unordered_map<char32_t, unsigned char> byte;  // character -> byte

  Alphabet() {
    char32_t next = 256;
    for (std::uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      const char32_t cp = printable ? b : next++;
      utf8::append(symbol[b], cp);
      byte[cp] = static_cast<unsigned char>(b);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet instance;
  return instance;
}

}  // namespace

const std::string& symbol(unsigned char byte) { return alphabet().symbol[byte]; }

std::string encode(std::string_view bytes) {
  const Alphabet& a = alphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += a.symbol[static_cast<unsigned char>(c)];
  return out;
}

std::optional<std::string> decode(std::string_view spelling) {
  const auto& table = alphabet().byte;
  std::string out;
  for (std::size_t i = 0; i < spelling.size();) {
    const std::size_t length = utf8::char_length(spelling, i);
    if (length == 0) return std::nullopt;
    const auto it = table.find(utf8::decode(spelling, i, length));
    if (it == table.end()) return std::nullopt;
    out += static_cast<char>(it->second);
    i += length;
  }
  return out;
}

}  // namespace dsv4::byte_level
