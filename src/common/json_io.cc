#include "common/json_io.h"

#include <fstream>
#include <sstream>
#include <system_error>

#include "common/error.h"

namespace dsv4 {

Json parse_json(std::string_view text, std::string_view where, std::size_t max_depth) {
  bool too_deep = false;
  // The callback sees every event with its depth; refusing deep values early keeps
  // both parsing and destruction bounded.
  // nlohmann reports a container's start event at its parent's depth; count it as one deeper
  // so empty containers weigh like non-empty ones.
  auto limit_depth = [&](int depth, Json::parse_event_t event, Json&) {
    const bool opens = event == Json::parse_event_t::array_start || event == Json::parse_event_t::object_start;
    if (static_cast<std::size_t>(depth) + (opens ? 1 : 0) > max_depth) too_deep = true;
    return !too_deep;
  };
  Json value;
  try {
    value = Json::parse(text.begin(), text.end(), limit_depth, /*allow_exceptions=*/true,
                        /*ignore_comments=*/false);
  } catch (const Json::exception& e) {
    if (too_deep) fail("{}: JSON nested deeper than {} levels", where, max_depth);
    fail("{}: invalid JSON: {}", where, e.what());
  }
  if (too_deep) fail("{}: JSON nested deeper than {} levels", where, max_depth);
  return value;
}

std::string read_text_file(const std::filesystem::path& path, std::size_t max_bytes) {
  std::error_code ec;
  auto size = std::filesystem::file_size(path, ec);
  if (ec) fail("cannot read {}: {}", path.string(), ec.message());
  if (size > max_bytes) fail("{} is {} bytes, more than the limit of {}", path.string(), size, max_bytes);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open {}", path.string());
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

Json read_json_file(const std::filesystem::path& path, std::size_t max_bytes) {
  return parse_json(read_text_file(path, max_bytes), path.string());
}

void write_text_file(const std::filesystem::path& path, std::string_view text) {
  auto tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot write {}", tmp.string());
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    if (!out) fail("write to {} failed", tmp.string());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail("cannot rename {} to {}: {}", tmp.string(), path.string(), ec.message());
}

std::string json_type_name(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::object: return "object";
    case Json::value_t::array: return "array";
    case Json::value_t::string: return "string";
    case Json::value_t::boolean: return "boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "integer";
    case Json::value_t::number_float: return "number";
    case Json::value_t::binary: return "binary";
    case Json::value_t::discarded: return "discarded";
  }
  return "unknown";
}

}  // namespace dsv4
