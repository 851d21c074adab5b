// Typed JSON fields (json_reader.h).
#include "common/json_reader.h"

#include <fmt/format.h>

#include <cmath>
#include <utility>

namespace dsv4 {
namespace {

constexpr std::int64_t kMinInt = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t kMaxInt = std::numeric_limits<std::int64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::string message(JsonFieldError::Kind kind, const std::string& source, const std::string& field,
                    const std::string& expected, const std::string& found) {
  switch (kind) {
    case JsonFieldError::Kind::kMissing:
      return fmt::format("{}: missing field '{}'", source, field);
    case JsonFieldError::Kind::kWrongType:
      if (field.empty()) return fmt::format("{}: expected {}, found {}", source, expected, found);
      return fmt::format("{}: field '{}' must be {}, found {}", source, field, expected, found);
    case JsonFieldError::Kind::kOutOfRange:
      if (field.empty()) return fmt::format("{}: {} is out of range: expected {}", source, found, expected);
      return fmt::format("{}: field '{}' = {} is out of range: expected {}", source, field, found, expected);
  }
  return source;
}

// The type of a value, with the value itself when it is short (numbers, booleans).
std::string describe(const Json& value) {
  std::string text = json_type_name(value);
  if (value.is_number() || value.is_boolean()) {
    text += ' ';
    text += value.dump();
  }
  return text;
}

// 65536.0 is, 1.5 and 1e300 are not (nor anything a double cannot count exactly).
bool is_exact_integer(double d) { return std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15; }

std::string integer_range(std::int64_t min, std::int64_t max) {
  if (min == kMinInt && max == kMaxInt) return "an integer";
  if (max == kMaxInt) return fmt::format("an integer >= {}", min);
  if (min == kMinInt) return fmt::format("an integer <= {}", max);
  return fmt::format("an integer in [{}, {}]", min, max);
}

std::string number_range(double min, double max, bool min_open) {
  if (min == -kInf && max == kInf) return "a finite number";
  if (min == 0 && min_open && max == kInf) return "a positive number";
  if (max == kInf) return fmt::format("a number {} {}", min_open ? ">" : ">=", min);
  if (min == -kInf) return fmt::format("a number <= {}", max);
  return fmt::format("a number in {}{}, {}]", min_open ? "(" : "[", min, max);
}

}  // namespace

JsonFieldError::JsonFieldError(Kind kind, std::string source, std::string field, std::string expected,
                               std::string found)
    : Error(message(kind, source, field, expected, found)),
      kind_(kind),
      source_(std::move(source)),
      field_(std::move(field)),
      expected_(std::move(expected)),
      found_(std::move(found)) {}

// ---- JsonField ----------------------------------------------------------------------------------

JsonField::JsonField(const Json& value, std::string source, std::string path, JsonRules rules)
    : value_(&value), source_(std::move(source)), path_(std::move(path)), rules_(rules) {}

std::string JsonField::where() const { return path_.empty() ? source_ : source_ + ": " + path_; }

void JsonField::wrong_type(std::string_view expected) const {
  throw JsonFieldError(JsonFieldError::Kind::kWrongType, source_, path_, std::string(expected), describe(*value_));
}

void JsonField::out_of_range(std::string_view expected, std::string found) const {
  throw JsonFieldError(JsonFieldError::Kind::kOutOfRange, source_, path_, std::string(expected), std::move(found));
}

std::int64_t JsonField::integer(std::int64_t min, std::int64_t max) const {
  const Json& v = *value_;
  std::int64_t i = 0;
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (max < 0 || u > static_cast<std::uint64_t>(max)) out_of_range(integer_range(min, max), fmt::format("{}", u));
    i = static_cast<std::int64_t>(u);
  } else if (v.is_number_integer()) {
    i = v.get<std::int64_t>();
  } else if (rules_.integral_floats && v.is_number_float() && is_exact_integer(v.get<double>())) {
    i = static_cast<std::int64_t>(v.get<double>());
  } else {
    wrong_type("an integer");
  }
  if (i < min || i > max) out_of_range(integer_range(min, max), fmt::format("{}", i));
  return i;
}

double JsonField::number(double min, double max, bool min_open) const {
  if (!value_->is_number()) wrong_type("a number");
  const double d = value_->get<double>();
  if (!std::isfinite(d) || d < min || (min_open && d == min) || d > max)
    out_of_range(number_range(min, max, min_open), fmt::format("{}", d));
  return d;
}

bool JsonField::boolean() const {
  if (!value_->is_boolean()) wrong_type("true or false");
  return value_->get<bool>();
}

std::string JsonField::string() const {
  if (!value_->is_string()) wrong_type("a string");
  return value_->get<std::string>();
}

JsonObject JsonField::object() const { return JsonObject(*this); }

std::vector<JsonField> JsonField::array() const {
  if (!value_->is_array()) wrong_type("an array");
  std::vector<JsonField> out;
  out.reserve(value_->size());
  for (std::size_t i = 0; i < value_->size(); ++i)
    out.emplace_back((*value_)[i], source_, fmt::format("{}[{}]", path_, i), rules_);
  return out;
}

// ---- JsonObject ---------------------------------------------------------------------------------

JsonObject::JsonObject(const Json& value, std::string source, JsonRules rules)
    : JsonObject(JsonField(value, std::move(source), "", rules)) {}

JsonObject::JsonObject(const JsonField& field) : field_(field) {
  if (!field_.json().is_object()) field_.wrong_type("a JSON object");
}

std::string JsonObject::path(std::string_view key) const {
  return field_.path().empty() ? std::string(key) : fmt::format("{}.{}", field_.path(), key);
}

std::optional<JsonField> JsonObject::find(std::string_view key) const {
  const Json& object = field_.json();
  const auto it = object.find(std::string(key));
  if (it == object.end() || (it->is_null() && field_.rules().null_is_absent)) return std::nullopt;
  return JsonField(*it, field_.source(), path(key), field_.rules());
}

bool JsonObject::has(std::string_view key) const { return find(key).has_value(); }

JsonField JsonObject::get(std::string_view key) const {
  std::optional<JsonField> field = find(key);
  if (!field) throw JsonFieldError(JsonFieldError::Kind::kMissing, field_.source(), path(key), "", "");
  return std::move(*field);
}

std::int64_t JsonObject::integer(std::string_view key, std::int64_t min, std::int64_t max) const {
  return get(key).integer(min, max);
}
double JsonObject::number(std::string_view key, double min, double max, bool min_open) const {
  return get(key).number(min, max, min_open);
}
bool JsonObject::boolean(std::string_view key) const { return get(key).boolean(); }
std::string JsonObject::string(std::string_view key) const { return get(key).string(); }
JsonObject JsonObject::object(std::string_view key) const { return get(key).object(); }
std::vector<JsonField> JsonObject::array(std::string_view key) const { return get(key).array(); }

std::optional<std::int64_t> JsonObject::optional_integer(std::string_view key, std::int64_t min,
                                                         std::int64_t max) const {
  auto field = find(key);
  return field ? std::optional(field->integer(min, max)) : std::nullopt;
}
std::optional<double> JsonObject::optional_number(std::string_view key, double min, double max, bool min_open) const {
  auto field = find(key);
  return field ? std::optional(field->number(min, max, min_open)) : std::nullopt;
}
std::optional<bool> JsonObject::optional_boolean(std::string_view key) const {
  auto field = find(key);
  return field ? std::optional(field->boolean()) : std::nullopt;
}
std::optional<std::string> JsonObject::optional_string(std::string_view key) const {
  auto field = find(key);
  return field ? std::optional(field->string()) : std::nullopt;
}
std::optional<JsonObject> JsonObject::optional_object(std::string_view key) const {
  auto field = find(key);
  return field ? std::optional(field->object()) : std::nullopt;
}
std::optional<std::vector<JsonField>> JsonObject::optional_array(std::string_view key) const {
  auto field = find(key);
  return field ? std::optional(field->array()) : std::nullopt;
}

}  // namespace dsv4
