// JSON from outside (config.json, tokenizer.json, safetensors headers, index files, HTTP
// bodies) is parsed here, with limits: nesting depth is bounded so a "JSON bomb" of deeply
// nested arrays is rejected with a clear error instead of exhausting the stack; an object that
// repeats a key is rejected (nlohmann would silently keep the last value, so a file or request
// that says two things would mean one of them); every error names the source. Typed reading
// of the parsed fields is json_reader.h.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace dsv4 {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;  // keeps objects' keys in document order

inline constexpr std::size_t kMaxJsonDepth = 64;

// A repeated key. The message names the source, the key and where it is
// ("x.json: key 'a' is listed more than once in \"b[2]\"").
class DuplicateKeyError : public Error {
 public:
  DuplicateKeyError(std::string_view where, std::vector<std::string> path);
  // The keys from the root to the repeated one; array elements appear as "[i]".
  const std::vector<std::string>& path() const { return path_; }

 private:
  std::vector<std::string> path_;
};

// Parses `text`; `where` names the source in error messages. Throws Error (DuplicateKeyError
// for a repeated key).
Json parse_json(std::string_view text, std::string_view where, std::size_t max_depth = kMaxJsonDepth);
// The same, keeping keys in document order (for JSON that is rendered back as written).
OrderedJson parse_ordered_json(std::string_view text, std::string_view where,
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
