// json_reader: typed fields, and errors that name the source, the field, what was expected and
// what was found -- the one format config.json, tokenizer.json and request bodies share.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>

#include "common/json_io.h"
#include "common/json_reader.h"

namespace dsv4 {
namespace {

// The JsonFieldError `f` throws.
template <typename F>
JsonFieldError field_error(F&& f) {
  try {
    f();
  } catch (const JsonFieldError& e) {
    return e;
  }
  ADD_FAILURE() << "expected a JsonFieldError";
  return JsonFieldError(JsonFieldError::Kind::kMissing, "", "", "", "");
}

const Json kDoc = parse_json(R"({
  "n": 7, "neg": -3, "big": 18446744073709551615, "f": 1.5, "whole": 65536.0, "huge": 1e300,
  "s": "text", "b": true, "nil": null,
  "obj": {"inner": {"x": "deep"}, "list": [1, "two", {"y": 3}]},
  "arr": [10, 20]
})", "doc");

TEST(JsonReader, ReadsTypedFields) {
  const JsonObject o(kDoc, "c.json");
  EXPECT_EQ(o.integer("n"), 7);
  EXPECT_EQ(o.integer("neg", -5, 0), -3);
  EXPECT_DOUBLE_EQ(o.number("f"), 1.5);
  EXPECT_DOUBLE_EQ(o.number("n"), 7.0);  // an integer is a number
  EXPECT_EQ(o.string("s"), "text");
  EXPECT_TRUE(o.boolean("b"));
  EXPECT_EQ(o.object("obj").object("inner").string("x"), "deep");
  const auto list = o.object("obj").array("list");
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0].integer(), 1);
  EXPECT_EQ(list[1].string(), "two");
  EXPECT_EQ(list[2].object().integer("y"), 3);
  EXPECT_EQ(list[2].path(), "obj.list[2]");
  EXPECT_EQ(list[2].where(), "c.json: obj.list[2]");
  EXPECT_EQ(o.object("obj").path("list"), "obj.list");
  EXPECT_EQ(o.where(), "c.json");
  EXPECT_FALSE(o.optional_integer("absent"));
  EXPECT_EQ(o.optional_string("s"), "text");
  EXPECT_FALSE(o.has("absent"));
  EXPECT_TRUE(o.has("nil"));  // null is a value unless the rules say otherwise
}

TEST(JsonReader, MissingField) {
  const JsonObject o(kDoc, "c.json");
  const JsonFieldError e = field_error([&] { o.object("obj").object("inner").integer("gone"); });
  EXPECT_EQ(e.kind(), JsonFieldError::Kind::kMissing);
  EXPECT_EQ(e.source(), "c.json");
  EXPECT_EQ(e.field(), "obj.inner.gone");
  EXPECT_STREQ(e.what(), "c.json: missing field 'obj.inner.gone'");
}

TEST(JsonReader, WrongTypeNamesExpectedAndFound) {
  const JsonObject o(kDoc, "c.json");
  struct Case {
    std::function<void()> read;
    std::string message;
  };
  const Case cases[] = {
      {[&] { o.integer("s"); }, "c.json: field 's' must be an integer, found string"},
      {[&] { o.integer("f"); }, "c.json: field 'f' must be an integer, found number 1.5"},
      {[&] { o.integer("whole"); }, "c.json: field 'whole' must be an integer, found number 65536.0"},
      {[&] { o.number("b"); }, "c.json: field 'b' must be a number, found boolean true"},
      {[&] { o.string("n"); }, "c.json: field 'n' must be a string, found integer 7"},
      {[&] { o.boolean("nil"); }, "c.json: field 'nil' must be true or false, found null"},
      {[&] { o.object("arr"); }, "c.json: field 'arr' must be a JSON object, found array"},
      {[&] { o.array("obj"); }, "c.json: field 'obj' must be an array, found object"},
      {[&] { o.object("obj").array("list")[1].integer(); },
       "c.json: field 'obj.list[1]' must be an integer, found string"},
      {[&] { JsonObject(kDoc["arr"], "top.json"); }, "top.json: expected a JSON object, found array"},
      {[&] { o.get("obj").wrong_type("a widget"); }, "c.json: field 'obj' must be a widget, found object"},
  };
  for (const Case& c : cases) {
    const JsonFieldError e = field_error(c.read);
    EXPECT_EQ(e.kind(), JsonFieldError::Kind::kWrongType) << c.message;
    EXPECT_EQ(e.what(), c.message);
  }
  const JsonFieldError e = field_error([&] { o.integer("s"); });
  EXPECT_EQ(e.field(), "s");
  EXPECT_EQ(e.expected(), "an integer");
  EXPECT_EQ(e.found(), "string");
}

TEST(JsonReader, RangesNameTheBounds) {
  const JsonObject o(kDoc, "c.json");
  constexpr double kInf = std::numeric_limits<double>::infinity();
  struct Case {
    std::function<void()> read;
    std::string message;
  };
  const Case cases[] = {
      {[&] { o.integer("n", 8, 10); }, "c.json: field 'n' = 7 is out of range: expected an integer in [8, 10]"},
      {[&] { o.integer("n", 8); }, "c.json: field 'n' = 7 is out of range: expected an integer >= 8"},
      {[&] { o.integer("n", std::numeric_limits<std::int64_t>::min(), 6); },
       "c.json: field 'n' = 7 is out of range: expected an integer <= 6"},
      {[&] { o.integer("big", 0, 100); },
       "c.json: field 'big' = 18446744073709551615 is out of range: expected an integer in [0, 100]"},
      {[&] { o.integer("big"); },
       "c.json: field 'big' = 18446744073709551615 is out of range: expected an integer"},
      {[&] { o.integer("n", -10, -1); }, "c.json: field 'n' = 7 is out of range: expected an integer in [-10, -1]"},
      {[&] { o.number("f", 0, 1); }, "c.json: field 'f' = 1.5 is out of range: expected a number in [0, 1]"},
      {[&] { o.number("neg", 0, kInf, true); }, "c.json: field 'neg' = -3 is out of range: expected a positive number"},
      {[&] { o.number("neg", 0, 1, true); }, "c.json: field 'neg' = -3 is out of range: expected a number in (0, 1]"},
      {[&] { o.number("neg", 0); }, "c.json: field 'neg' = -3 is out of range: expected a number >= 0"},
      {[&] { o.get("s").out_of_range("one of a, b", "\"text\""); },
       "c.json: field 's' = \"text\" is out of range: expected one of a, b"},
  };
  for (const Case& c : cases) {
    const JsonFieldError e = field_error(c.read);
    EXPECT_EQ(e.kind(), JsonFieldError::Kind::kOutOfRange) << c.message;
    EXPECT_EQ(e.what(), c.message);
  }
  // Non-finite numbers (only constructible in code: JSON text has none) are out of range.
  const Json inf = {{"x", kInf}};
  EXPECT_EQ(std::string(field_error([&] { JsonObject(inf, "i").number("x"); }).what()),
            "i: field 'x' = inf is out of range: expected a finite number");
  EXPECT_EQ(o.number("f", 1.5, 1.5), 1.5);  // closed bounds include themselves
}

TEST(JsonReader, Rules) {
  const JsonObject strict(kDoc, "c.json");
  const JsonObject lenient(kDoc, "c.json", {.null_is_absent = true, .integral_floats = true});
  // null_is_absent: a null field is missing (optional getters give nullopt).
  EXPECT_FALSE(lenient.has("nil"));
  EXPECT_FALSE(lenient.optional_boolean("nil"));
  EXPECT_EQ(field_error([&] { lenient.boolean("nil"); }).kind(), JsonFieldError::Kind::kMissing);
  EXPECT_EQ(field_error([&] { strict.optional_boolean("nil"); }).kind(), JsonFieldError::Kind::kWrongType);
  // integral_floats: 65536.0 is an integer; 1.5 and 1e300 are not.
  EXPECT_EQ(lenient.integer("whole"), 65536);
  EXPECT_EQ(field_error([&] { lenient.integer("f"); }).kind(), JsonFieldError::Kind::kWrongType);
  EXPECT_EQ(field_error([&] { lenient.integer("huge"); }).kind(), JsonFieldError::Kind::kWrongType);
  EXPECT_EQ(field_error([&] { lenient.integer("whole", 0, 100); }).kind(), JsonFieldError::Kind::kOutOfRange);
  // The rules travel to nested objects and array elements.
  const Json nested = parse_json(R"({"o": {"v": null, "w": 2.0}, "a": [3.0]})", "n");
  const JsonObject n(nested, "n.json", {.null_is_absent = true, .integral_floats = true});
  EXPECT_FALSE(n.object("o").has("v"));
  EXPECT_EQ(n.object("o").integer("w"), 2);
  EXPECT_EQ(n.array("a")[0].integer(), 3);
}

}  // namespace
}  // namespace dsv4
