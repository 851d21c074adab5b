// Typed fields of JSON from outside -- config.json, tokenizer.json, HTTP request bodies -- read
// by one reader, so every source reports a bad field the same way: the source, the field's
// path, what was expected and what was found.
//
//   config.json: missing field 'vocab_size'
//   config.json: field 'rope_scaling.factor' must be a number, found string
//   config.json: field 'hidden_size' = 0 is out of range: expected an integer in [1, 1048576]
//
// Failures are JsonFieldError (a dsv4::Error) and carry those parts, so a caller with its own
// error protocol words them its way (the server turns them into OpenAI 400 errors).
// Parsing itself (depth limit, duplicate keys) is json_io.h's parse_json.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/json_io.h"

namespace dsv4 {

// How a source spells things.
struct JsonRules {
  bool null_is_absent = false;   // a null field reads as a missing one (OpenAI bodies, tokenizer.json)
  bool integral_floats = false;  // 65536.0 reads as the integer 65536 (exported config.json files)
};

class JsonFieldError : public Error {
 public:
  enum class Kind { kMissing, kWrongType, kOutOfRange };
  JsonFieldError(Kind kind, std::string source, std::string field, std::string expected, std::string found);

  Kind kind() const { return kind_; }
  const std::string& source() const { return source_; }  // the file, or "the request body"
  // The field's path ("rope_scaling.factor", "messages[0].role"); "" for the whole document.
  const std::string& field() const { return field_; }
  const std::string& expected() const { return expected_; }  // "an integer in [1, 4096]", "a JSON object", ...
  // kWrongType: the type found, with the value for numbers ("string", "number 1.5");
  // kOutOfRange: the value ("0"); kMissing: "".
  const std::string& found() const { return found_; }

 private:
  Kind kind_;
  std::string source_, field_, expected_, found_;
};

class JsonObject;

// One JSON value and where it came from. The typed accessors check its type (and range) and
// throw JsonFieldError naming the source and `path`.
class JsonField {
 public:
  JsonField(const Json& value, std::string source, std::string path, JsonRules rules = {});

  const Json& json() const { return *value_; }
  const std::string& source() const { return source_; }
  const std::string& path() const { return path_; }
  const JsonRules& rules() const { return rules_; }
  // "source: path" (just the source for the whole document), for a caller's own messages.
  std::string where() const;

  std::int64_t integer(std::int64_t min = std::numeric_limits<std::int64_t>::min(),
                       std::int64_t max = std::numeric_limits<std::int64_t>::max()) const;
  // Finite, in [min, max] ((min, max] with min_open).
  double number(double min = -std::numeric_limits<double>::infinity(),
                double max = std::numeric_limits<double>::infinity(), bool min_open = false) const;
  bool boolean() const;
  std::string string() const;
  JsonObject object() const;
  std::vector<JsonField> array() const;  // the elements, with paths "path[i]"

  // For checks of the caller's own: throw as a wrong type, or as a value out of range.
  [[noreturn]] void wrong_type(std::string_view expected) const;
  [[noreturn]] void out_of_range(std::string_view expected, std::string found) const;

 private:
  const Json* value_;
  std::string source_;
  std::string path_;
  JsonRules rules_;
};

// The fields of one JSON object. `get` and the plain getters require the field; find and the
// optional_ getters return nullopt when it is absent (or null, with rules.null_is_absent).
class JsonObject {
 public:
  // Throws JsonFieldError (kWrongType) unless `value` is an object.
  JsonObject(const Json& value, std::string source, JsonRules rules = {});
  explicit JsonObject(const JsonField& field);

  const Json& json() const { return field_.json(); }
  const std::string& source() const { return field_.source(); }
  std::string where() const { return field_.where(); }
  std::string path(std::string_view key) const;  // "rope_scaling.factor"

  bool has(std::string_view key) const;
  std::optional<JsonField> find(std::string_view key) const;
  JsonField get(std::string_view key) const;  // JsonFieldError (kMissing) when absent

  std::int64_t integer(std::string_view key, std::int64_t min = std::numeric_limits<std::int64_t>::min(),
                       std::int64_t max = std::numeric_limits<std::int64_t>::max()) const;
  double number(std::string_view key, double min = -std::numeric_limits<double>::infinity(),
                double max = std::numeric_limits<double>::infinity(), bool min_open = false) const;
  bool boolean(std::string_view key) const;
  std::string string(std::string_view key) const;
  JsonObject object(std::string_view key) const;
  std::vector<JsonField> array(std::string_view key) const;

  std::optional<std::int64_t> optional_integer(std::string_view key,
                                               std::int64_t min = std::numeric_limits<std::int64_t>::min(),
                                               std::int64_t max = std::numeric_limits<std::int64_t>::max()) const;
  std::optional<double> optional_number(std::string_view key, double min = -std::numeric_limits<double>::infinity(),
                                        double max = std::numeric_limits<double>::infinity(),
                                        bool min_open = false) const;
  std::optional<bool> optional_boolean(std::string_view key) const;
  std::optional<std::string> optional_string(std::string_view key) const;
  std::optional<JsonObject> optional_object(std::string_view key) const;
  std::optional<std::vector<JsonField>> optional_array(std::string_view key) const;

 private:
  JsonField field_;
};

}  // namespace dsv4
