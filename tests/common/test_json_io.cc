// json_io: parsing with a depth limit (JSON bombs), file reading with a size limit, and
// error messages that name the source.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "../support/test_support.h"
#include "common/error.h"
#include "common/json_io.h"

namespace dsv4 {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class JsonIoTest : public testing_support::TempDirTest {
 protected:
};

using testing_support::error_of;

std::string nested_arrays(std::size_t levels, const std::string& inner) {
  return std::string(levels, '[') + inner + std::string(levels, ']');
}

std::string nested_objects(std::size_t levels, const std::string& inner) {
  std::string s;
  for (std::size_t i = 0; i < levels; ++i) s += "{\"a\":";
  s += inner;
  s += std::string(levels, '}');
  return s;
}

TEST(JsonIo, ParsesValidJson) {
  Json j = parse_json(R"({"a": 1, "b": [1.5, "x", true, null], "c": {"d": -7}})", "test input");
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.at("a").get<int>(), 1);
  ASSERT_TRUE(j.at("b").is_array());
  ASSERT_EQ(j.at("b").size(), 4u);
  EXPECT_DOUBLE_EQ(j.at("b")[0].get<double>(), 1.5);
  EXPECT_EQ(j.at("b")[1].get<std::string>(), "x");
  EXPECT_TRUE(j.at("b")[2].get<bool>());
  EXPECT_TRUE(j.at("b")[3].is_null());
  EXPECT_EQ(j.at("c").at("d").get<int>(), -7);
  // Scalars are valid documents too.
  EXPECT_EQ(parse_json("42", "scalar").get<int>(), 42);
}

TEST(JsonIo, InvalidJsonErrorNamesTheSource) {
  for (const char* bad : {"", "{", "[1,]", "{\"a\" 1}", "{\"a\":1} trailing", "nul", "\"unterminated", "[1 2]",
                          "// comment\n{}"}) {
    std::string message = error_of([&] { parse_json(bad, "some/dir/config.json"); });
    EXPECT_NE(message.find("some/dir/config.json"), std::string::npos) << bad << " -> " << message;
    EXPECT_NE(message.find("invalid JSON"), std::string::npos) << bad << " -> " << message;
  }
}

TEST(JsonIo, NumberOverflowIsAnError) {
  std::string message = error_of([] { parse_json("[1e999]", "big.json"); });
  EXPECT_NE(message.find("big.json"), std::string::npos) << message;
}

// A repeated key is refused (nlohmann alone keeps the last value without a word), naming the
// source, the key and the keys leading to it; the ordered parse does the same.
TEST(JsonIo, DuplicateKeysAreRejected) {
  struct Case {
    const char* text;
    std::vector<std::string> path;
    const char* message;
  };
  const Case cases[] = {
      {R"({"a": 1, "a": 2})", {"a"}, "dup.json: key 'a' is listed more than once"},
      {R"({"a": 1, "b": {"c": 1, "c": 1}})", {"b", "c"}, "dup.json: key 'c' is listed more than once in \"b\""},
      {R"({"m": [{"r": 1}, {"r": 1, "x": 0, "r": 2}]})", {"m", "[1]", "r"},
       "dup.json: key 'r' is listed more than once in \"m[1]\""},
      {R"([[0, {"k": 1, "k": {}}]])", {"[0]", "[1]", "k"}, "dup.json: key 'k' is listed more than once in \"[0][1]\""},
      {R"({"a": {"b": [1, [2, {"c": null, "c": null}]]}})", {"a", "b", "[1]", "[1]", "c"},
       "key 'c' is listed more than once in \"a.b[1][1]\""},
  };
  for (const Case& c : cases) {
    for (bool ordered : {false, true}) {
      try {
        if (ordered) {
          parse_ordered_json(c.text, "dup.json");
        } else {
          parse_json(c.text, "dup.json");
        }
        ADD_FAILURE() << "accepted " << c.text;
      } catch (const DuplicateKeyError& e) {
        EXPECT_EQ(e.path(), c.path) << c.text;
        EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << e.what();
      }
    }
  }
  // The same key in sibling objects, at other depths, or as a value is fine.
  EXPECT_NO_THROW(parse_json(R"({"a": {"a": 1}, "b": {"a": 2}, "c": [{"a": 1}, {"a": 2}], "d": "a"})", "ok"));
  EXPECT_NO_THROW(parse_json(R"([{"x": 1}, {"x": 2}, [{"x": 3}]])", "ok"));
  // Keys differing only in escapes are the same key once decoded.
  EXPECT_THROW(parse_json(R"({"\u0061": 1, "a": 2})", "esc"), DuplicateKeyError);
}

TEST_F(JsonIoTest, DuplicateKeyInAFileNamesTheFile) {
  const fs::path path = dir_ / "config.json";
  write_text_file(path, R"({"hidden_size": 4096, "vocab_size": 8, "hidden_size": 2048})");
  const std::string message = error_of([&] { read_json_file(path); });
  EXPECT_NE(message.find(path.string() + ": key 'hidden_size' is listed more than once"), std::string::npos)
      << message;
}

TEST(JsonIo, OrderedParseKeepsKeyOrderAndLimits) {
  const OrderedJson j = parse_ordered_json(R"({"z": 1, "a": {"y": 2, "b": 3}})", "ordered");
  std::vector<std::string> keys;
  for (const auto& [key, value] : j.items()) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"z", "a"}));
  EXPECT_EQ(j["a"].begin().key(), "y");
  EXPECT_NE(error_of([] { parse_ordered_json(nested_arrays(100, "1"), "deep"); }).find("deep: JSON nested deeper than 64"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_ordered_json("{", "broken"); }).find("broken: invalid JSON"), std::string::npos);
}

TEST(JsonIo, ArrayBombRejectedWithDepthMessage) {
  const std::string bomb(100000, '[');
  std::string message = error_of([&] { parse_json(bomb, "bomb.json"); });
  EXPECT_NE(message.find("bomb.json"), std::string::npos) << message;
  EXPECT_NE(message.find("nested deeper than 64 levels"), std::string::npos) << message;
  // Balanced, otherwise valid, still rejected for depth.
  message = error_of([&] { parse_json(nested_arrays(100000, "1"), "balanced.json"); });
  EXPECT_NE(message.find("balanced.json: JSON nested deeper than 64 levels"), std::string::npos) << message;
}

TEST(JsonIo, ObjectBombRejectedWithDepthMessage) {
  std::string bomb;
  for (int i = 0; i < 100000; ++i) bomb += "{\"a\":";
  std::string message = error_of([&] { parse_json(bomb, "objbomb.json"); });
  EXPECT_NE(message.find("objbomb.json: JSON nested deeper than 64 levels"), std::string::npos) << message;
  message = error_of([&] { parse_json(nested_objects(100000, "1"), "objbalanced.json"); });
  EXPECT_NE(message.find("objbalanced.json: JSON nested deeper than 64 levels"), std::string::npos) << message;
}

TEST(JsonIo, DepthExactlyAtLimitAccepted) {
  ASSERT_EQ(kMaxJsonDepth, 64u);
  Json a = parse_json(nested_arrays(kMaxJsonDepth, "7"), "arrays");
  const Json* p = &a;
  for (std::size_t i = 0; i < kMaxJsonDepth; ++i) {
    ASSERT_TRUE(p->is_array()) << i;
    ASSERT_EQ(p->size(), 1u);
    p = &(*p)[0];
  }
  EXPECT_EQ(p->get<int>(), 7);

  Json o = parse_json(nested_objects(kMaxJsonDepth, "\"leaf\""), "objects");
  p = &o;
  for (std::size_t i = 0; i < kMaxJsonDepth; ++i) {
    ASSERT_TRUE(p->is_object()) << i;
    p = &p->at("a");
  }
  EXPECT_EQ(p->get<std::string>(), "leaf");

  // One more level is refused.
  EXPECT_NE(error_of([] { parse_json(nested_arrays(kMaxJsonDepth + 1, "7"), "a"); }).find("deeper than 64"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_json(nested_objects(kMaxJsonDepth + 1, "1"), "o"); }).find("deeper than 64"),
            std::string::npos);
}

TEST(JsonIo, CustomDepthLimit) {
  EXPECT_NO_THROW(parse_json("[[[1]]]", "x", 3));
  EXPECT_NO_THROW(parse_json(R"({"a":{"b":{"c":1}}})", "x", 3));
  EXPECT_NO_THROW(parse_json("[[[]]]", "x", 3));
  EXPECT_NO_THROW(parse_json("[[1],[2,[3]],{\"k\":[4]}]", "x", 3));
  EXPECT_NE(error_of([] { parse_json("[[[[1]]]]", "x", 3); }).find("x: JSON nested deeper than 3 levels"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_json(R"({"a":{"b":{"c":{"d":1}}}})", "x", 3); }).find("deeper than 3"),
            std::string::npos);
  // Scalars have no nesting.
  EXPECT_NO_THROW(parse_json("\"s\"", "x", 0));
}

// The limit counts open containers, whether or not they hold anything: four nested empty
// arrays are as deep as four nested arrays around a number.
TEST(JsonIo, EmptyContainersCountTowardsDepth) {
  EXPECT_NE(error_of([] { parse_json("[[[[]]]]", "x", 3); }).find("deeper than 3"), std::string::npos);
  EXPECT_NE(error_of([] { parse_json(R"({"a":{"b":{"c":{}}}})", "x", 3); }).find("deeper than 3"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_json(nested_arrays(kMaxJsonDepth + 1, ""), "x"); }).find("deeper than 64"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_json("[]", "x", 0); }).find("deeper than 0"), std::string::npos);
}

TEST_F(JsonIoTest, WriteThenReadBack) {
  std::mt19937 rng(1234);
  std::string text;
  for (int i = 0; i < 5000; ++i) text += static_cast<char>(1 + rng() % 255);  // any byte but NUL
  text += std::string("\0mid", 4);  // and an embedded NUL
  const fs::path path = dir_ / "data.txt";
  write_text_file(path, text);
  EXPECT_EQ(read_text_file(path), text);
  EXPECT_FALSE(fs::exists(dir_ / "data.txt.tmp"));
  // Overwriting replaces the whole content.
  write_text_file(path, "short");
  EXPECT_EQ(read_text_file(path), "short");
  write_text_file(path, "");
  EXPECT_EQ(read_text_file(path), "");
}

TEST_F(JsonIoTest, ReadJsonFile) {
  const fs::path path = dir_ / "c.json";
  write_text_file(path, R"({"x": [1, 2, 3]})");
  Json j = read_json_file(path);
  EXPECT_EQ(j.at("x").size(), 3u);
  EXPECT_EQ(j.at("x")[2].get<int>(), 3);

  write_text_file(path, R"({"x": [1, 2, 3)");
  std::string message = error_of([&] { read_json_file(path); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("invalid JSON"), std::string::npos) << message;

  write_text_file(path, nested_arrays(1000, ""));
  message = error_of([&] { read_json_file(path); });
  EXPECT_NE(message.find(path.string() + ": JSON nested deeper than 64 levels"), std::string::npos) << message;
}

TEST_F(JsonIoTest, ReadMissingFileNamesThePath) {
  const fs::path path = dir_ / "does_not_exist.json";
  std::string message = error_of([&] { read_text_file(path); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  message = error_of([&] { read_json_file(path); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
}

TEST_F(JsonIoTest, ReadDirectoryIsAnError) {
  std::string message = error_of([&] { read_text_file(dir_); });
  EXPECT_NE(message.find(dir_.string()), std::string::npos) << message;
}

TEST_F(JsonIoTest, FileOverMaxBytesRejected) {
  const fs::path path = dir_ / "big.txt";
  write_text_file(path, std::string(1001, 'x'));
  EXPECT_EQ(read_text_file(path, 1001).size(), 1001u);  // exactly at the limit
  std::string message = error_of([&] { read_text_file(path, 1000); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("1001"), std::string::npos) << message;
  EXPECT_NE(message.find("1000"), std::string::npos) << message;
  write_text_file(path, "[" + std::string(2000, ' ') + "]");
  message = error_of([&] { read_json_file(path, 100); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
}

TEST_F(JsonIoTest, WriteIntoMissingDirectoryNamesThePath) {
  const fs::path path = dir_ / "no" / "such" / "dir" / "f.txt";
  std::string message = error_of([&] { write_text_file(path, "x"); });
  EXPECT_NE(message.find((dir_ / "no" / "such" / "dir").string()), std::string::npos) << message;
}

TEST(JsonIo, TypeNames) {
  EXPECT_EQ(json_type_name(Json()), "null");
  EXPECT_EQ(json_type_name(Json::object()), "object");
  EXPECT_EQ(json_type_name(Json::array()), "array");
  EXPECT_EQ(json_type_name(Json("s")), "string");
  EXPECT_EQ(json_type_name(Json(true)), "boolean");
  EXPECT_EQ(json_type_name(Json(-3)), "integer");
  EXPECT_EQ(json_type_name(Json(std::uint64_t{3})), "integer");
  EXPECT_EQ(json_type_name(Json(1.5)), "number");
  EXPECT_EQ(json_type_name(parse_json("18446744073709551615", "x")), "integer");
  EXPECT_EQ(json_type_name(Json::binary({1, 2})), "binary");
}

TEST(JsonIo, ErrorInPrefixesContext) {
  Error e("inner problem");
  Error outer = e.in("while reading m/config.json");
  EXPECT_STREQ(outer.what(), "while reading m/config.json: inner problem");
  EXPECT_STREQ(e.what(), "inner problem");
  try {
    fail("value {} of {}", 3, "x");
    FAIL() << "fail() returned";
  } catch (const Error& err) {
    EXPECT_STREQ(err.what(), "value 3 of x");
  }
}

}  // namespace
}  // namespace dsv4
