// JSON from outside (config.json, safetensors headers, index files, HTTP bodies) is
// parsed here, with limits: nesting depth is bounded so a "JSON bomb" of deeply nested
// arrays is rejected with a clear error instead of exhausting the stack, and every
// error names the source.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

namespace dsv4 {

using Json = nlohmann::json;

inline constexpr std::size_t kMaxJsonDepth = 64;

// Parses `text`; `where` names the source in error messages.
Json parse_json(std::string_view text, std::string_view where,
                std::size_t max_depth = kMaxJsonDepth);

// Reads and parses a JSON file of at most `max_bytes`.
Json read_json_file(const std::filesystem::path& path,
                    std::size_t max_bytes = std::size_t{64} << 20);

// Reads a whole text file (at most `max_bytes`), with an Error naming the path on failure.
std::string read_text_file(const std::filesystem::path& path,
                           std::size_t max_bytes = std::size_t{64} << 20);

// Writes `text` to `path` atomically enough for our uses (write then rename).
void write_text_file(const std::filesystem::path& path, std::string_view text);

// A short human-readable name of a JSON value's type ("number", "string", ...).
std::string json_type_name(const Json& value);

}  // namespace dsv4
