#include "common/json_io.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>
#include <system_error>
#include <unordered_set>
#include <utility>

namespace dsv4 {

namespace {

std::string parent_path(const std::vector<std::string>& path) {
  std::string out;
  for (std::size_t i = 0; i + 1 < path.size(); ++i) {
    if (!out.empty() && !path[i].starts_with('[')) out += '.';
    out += path[i];
  }
  return out;
}

// Follows the parser's events to refuse, as soon as they are read, nesting deeper than
// `max_depth` (which keeps parsing and destruction bounded) and a key an object already has.
// nlohmann reports a container's start at its parent's depth (the document at 0) and the keys
// and values inside it one deeper; levels_[d] is the container whose contents are at depth d.
template <typename J>
class ParseGuard {
 public:
  ParseGuard(std::string_view where, std::size_t max_depth) : where_(where), max_depth_(max_depth) {}

  bool operator()(int depth, typename J::parse_event_t event, J& parsed) {
    const auto d = static_cast<std::size_t>(depth);
    switch (event) {
      case J::parse_event_t::object_start:
      case J::parse_event_t::array_start:
        if (d + 1 > max_depth_) fail("{}: JSON nested deeper than {} levels", where_, max_depth_);
        start_element(d);
        if (levels_.size() <= d + 1) levels_.resize(d + 2);
        levels_[d + 1] = Level{event == J::parse_event_t::array_start, 0, {}, {}};
        break;
      case J::parse_event_t::key: {
        Level& level = levels_[d];
        const auto& key = parsed.template get_ref<const std::string&>();
        if (!level.keys.insert(key).second) {
          std::vector<std::string> path;
          for (std::size_t i = 1; i < d; ++i)
            path.push_back(levels_[i].is_array ? fmt::format("[{}]", levels_[i].next_index - 1) : levels_[i].key);
          path.push_back(key);
          throw DuplicateKeyError(where_, std::move(path));
        }
        level.key = key;
        break;
      }
      case J::parse_event_t::value:
        start_element(d);
        break;
      default:
        break;
    }
    return true;
  }

 private:
  struct Level {
    bool is_array = false;
    std::size_t next_index = 0;           // arrays: the index of the next element
    std::string key;                      // objects: the key being read
    std::unordered_set<std::string> keys;  // objects: the keys so far
  };

  void start_element(std::size_t d) {
    if (d < levels_.size() && d > 0 && levels_[d].is_array) ++levels_[d].next_index;
  }

  std::string_view where_;
  std::size_t max_depth_;
  std::vector<Level> levels_;
};

template <typename J>
J parse_guarded(std::string_view text, std::string_view where, std::size_t max_depth) {
  ParseGuard<J> guard(where, max_depth);
  try {
    return J::parse(
        text.begin(), text.end(),
        [&guard](int depth, typename J::parse_event_t event, J& parsed) { return guard(depth, event, parsed); },
        /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const typename J::exception& e) {
    fail("{}: invalid JSON: {}", where, e.what());
  }
}

}  // namespace

DuplicateKeyError::DuplicateKeyError(std::string_view where, std::vector<std::string> path)
    : Error(fmt::format("{}: key '{}' is listed more than once{}", where, path.back(),
                        path.size() > 1 ? fmt::format(" in \"{}\"", parent_path(path)) : std::string())),
      path_(std::move(path)) {}

Json parse_json(std::string_view text, std::string_view where, std::size_t max_depth) {
  return parse_guarded<Json>(text, where, max_depth);
}

OrderedJson parse_ordered_json(std::string_view text, std::string_view where, std::size_t max_depth) {
  return parse_guarded<OrderedJson>(text, where, max_depth);
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
