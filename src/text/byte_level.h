// GPT-2's byte-level alphabet (bytes_to_unicode in its encoder.py, HF's ByteLevel): a printable
// character for every byte, so that a byte-level BPE vocabulary can spell any byte string as
// text. Printable bytes (! to ~, ¡ to ¬, ® to ÿ) stand for themselves; the other 68 bytes map
// to U+0100 onwards, in byte order (the space 0x20 is "Ġ" U+0120).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace dsv4::byte_level {

// The UTF-8 of the character that stands for `byte`.
const std::string& symbol(unsigned char byte);

// The spelling of `bytes`: each byte's symbol.
std::string encode(std::string_view bytes);

// The bytes `spelling` stands for; nullopt when it is not valid UTF-8 or has a character
// outside the alphabet.
std::optional<std::string> decode(std::string_view spelling);

}  // namespace dsv4::byte_level
