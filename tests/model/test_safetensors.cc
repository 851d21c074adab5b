// Tests of the safetensors reader and writers: round trips of every dtype and of sharded
// checkpoints, one test per validation rule (each checks the error text), index/shard
// consistency, and a random-mutation loop that must only ever produce dsv4::Error.
#include "model/safetensors.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "common/json_io.h"
#include "model/dtype.h"

namespace dsv4 {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;

Bytes random_bytes(std::size_t n, std::mt19937_64& rng) {
  Bytes out(n);
  for (auto& b : out) b = static_cast<std::uint8_t>(rng());
  return out;
}

std::int64_t product(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

TensorData make_tensor(std::string name, DType dtype, std::vector<std::int64_t> shape,
                       std::mt19937_64& rng) {
  const auto n = static_cast<std::size_t>(product(shape)) * dtype_size(dtype);
  return TensorData{std::move(name), dtype, std::move(shape), random_bytes(n, rng)};
}

// An image with the given header text (declared length `declared`, default its size) and
// `data_bytes` bytes of data.
Bytes raw_image(const std::string& header, std::size_t data_bytes,
                std::optional<std::uint64_t> declared = std::nullopt) {
  const std::uint64_t len = declared.value_or(header.size());
  Bytes out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(len >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  for (std::size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<std::uint8_t>(i * 7 + 1));
  return out;
}

// The Error message parsing `image` produces; a test failure if it parses or throws
// anything else.
std::string parse_error(const Bytes& image, const std::string& where = "bad.safetensors") {
  try {
    SafetensorsFile::parse(image, where);
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-dsv4 exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "parsed without error";
  return {};
}

std::string header_error(const std::string& header, std::size_t data_bytes) {
  return parse_error(raw_image(header, data_bytes));
}

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "missing \"" << (part) << "\" in: " << (text)

Bytes read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const fs::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::string> sorted_listing(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

void expect_same(const TensorView& view, const TensorData& tensor) {
  EXPECT_EQ(view.name, tensor.name);
  EXPECT_EQ(view.dtype, tensor.dtype) << tensor.name;
  EXPECT_EQ(view.shape, tensor.shape) << tensor.name;
  EXPECT_EQ(view.numel(), product(tensor.shape)) << tensor.name;
  EXPECT_TRUE(std::equal(view.bytes.begin(), view.bytes.end(), tensor.bytes.begin(), tensor.bytes.end()))
      << tensor.name;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           (std::string("dsv4_safetensors_") + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A checkpoint of `count` tensors of 300 bytes each, sharded at 1000 bytes (3 per shard).
  std::vector<TensorData> write_sharded(const fs::path& dir, int count, std::uint64_t seed = 1) {
    std::mt19937_64 rng(seed);
    std::vector<TensorData> tensors;
    ShardedCheckpointWriter writer(dir, 1000);
    for (int i = 0; i < count; ++i) {
      tensors.push_back(make_tensor("layers." + std::to_string(i) + ".w", DType::kBF16, {10, 15}, rng));
      writer.add(tensors.back());
    }
    writer.finish();
    return tensors;
  }

  fs::path dir_;
};

// ---- dtypes ----

TEST(DTypeTest, NamesSizesAndKinds) {
  const std::vector<std::tuple<DType, std::string, std::size_t, bool>> expected = {
      {DType::kF32, "F32", 4, true},      {DType::kF16, "F16", 2, true},
      {DType::kBF16, "BF16", 2, true},    {DType::kF8E4M3, "F8_E4M3", 1, false},
      {DType::kF8E8M0, "F8_E8M0", 1, false}, {DType::kI8, "I8", 1, false},
      {DType::kU8, "U8", 1, false},       {DType::kI32, "I32", 4, false},
      {DType::kI64, "I64", 8, false}};
  ASSERT_EQ(all_dtypes().size(), expected.size());
  for (const auto& [type, name, size, is_float] : expected) {
    EXPECT_EQ(dtype_name(type), name);
    EXPECT_EQ(dtype_from_name(name), type) << name;
    EXPECT_EQ(dtype_size(type), size) << name;
    EXPECT_EQ(dtype_is_float(type), is_float) << name;
  }
  EXPECT_FALSE(dtype_from_name("f32").has_value());
  EXPECT_FALSE(dtype_from_name("F64").has_value());
  EXPECT_FALSE(dtype_from_name("F8_E5M2").has_value());
  EXPECT_FALSE(dtype_from_name("").has_value());
}

// ---- round trips ----

TEST_F(SafetensorsTest, RoundTripEveryDtype) {
  std::mt19937_64 rng(42);
  std::vector<TensorData> tensors;
  for (DType t : all_dtypes()) {
    tensors.push_back(make_tensor(std::string("t.") + std::string(dtype_name(t)), t, {3, 5}, rng));
  }
  tensors.push_back(make_tensor("scalar", DType::kF32, {}, rng));
  tensors.push_back(make_tensor("empty", DType::kBF16, {0, 7}, rng));
  tensors.push_back(make_tensor("odd", DType::kU8, {13}, rng));
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "é \" \\"}};

  const fs::path path = dir_ / "all.safetensors";
  write_safetensors(path, tensors, metadata);
  const Bytes on_disk = read_file(path);
  EXPECT_EQ(on_disk, encode_safetensors(tensors, metadata));
  EXPECT_FALSE(fs::exists(dir_ / "all.safetensors.tmp"));

  // Header padded with spaces so the data section starts 8-byte aligned.
  std::uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= std::uint64_t{on_disk[static_cast<std::size_t>(i)]} << (8 * i);
  EXPECT_EQ((8 + header_len) % 8, 0u);
  Json header = parse_json(std::string(on_disk.begin() + 8, on_disk.begin() + 8 + static_cast<std::ptrdiff_t>(header_len)), "test");
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["t.F8_E4M3"]["dtype"], "F8_E4M3");

  const SafetensorsFile file = SafetensorsFile::open(path);
  ASSERT_EQ(file.tensors().size(), tensors.size());
  EXPECT_EQ(file.metadata(), metadata);
  for (const TensorData& tensor : tensors) {
    auto it = file.tensors().find(tensor.name);
    ASSERT_NE(it, file.tensors().end()) << tensor.name;
    expect_same(it->second, tensor);
    EXPECT_EQ(it->second.file, path);
  }
  EXPECT_EQ(file.tensors().at("scalar").numel(), 1);
  EXPECT_EQ(file.tensors().at("empty").numel(), 0);
  EXPECT_TRUE(file.tensors().at("empty").bytes.empty());

  // Data is packed in the given order, right after the header.
  const std::uint8_t* expected_start = file.tensors().at(tensors[0].name).bytes.data();
  std::size_t offset = 0;
  for (const TensorData& tensor : tensors) {
    EXPECT_EQ(file.tensors().at(tensor.name).bytes.data(), expected_start + offset) << tensor.name;
    offset += tensor.bytes.size();
  }
  EXPECT_EQ(8 + header_len + offset, on_disk.size());
}

TEST_F(SafetensorsTest, CopiesOfACheckpointKeepTheMappingAlive) {
  std::mt19937_64 rng(3);
  std::vector<TensorData> tensors = {make_tensor("a", DType::kF32, {64}, rng)};
  write_safetensors(dir_ / "model.safetensors", tensors);
  std::optional<Checkpoint> copy;
  {
    Checkpoint original = Checkpoint::open(dir_);
    copy = original;
  }  // the original's shards are gone; the copy shares their mappings
  Checkpoint moved = std::move(*copy);
  copy.reset();
  ASSERT_NE(moved.find("a"), nullptr);
  expect_same(*moved.find("a"), tensors[0]);
  EXPECT_EQ(moved.files(), std::vector<fs::path>{dir_ / "model.safetensors"});
}

TEST_F(SafetensorsTest, ShardedRoundTrip) {
  std::mt19937_64 rng(7);
  std::vector<TensorData> tensors;
  ShardedCheckpointWriter writer(dir_ / "ckpt", 1000);
  for (int i = 0; i < 7; ++i) {
    tensors.push_back(make_tensor("layers." + std::to_string(i) + ".w", DType::kBF16, {10, 15}, rng));
  }
  tensors.push_back(make_tensor("big", DType::kF32, {700}, rng));  // 2800 bytes > 1000
  tensors.push_back(make_tensor("tail.a", DType::kI32, {10}, rng));
  tensors.push_back(make_tensor("tail.b", DType::kF8E8M0, {0}, rng));
  for (const TensorData& t : tensors) writer.add(t);
  writer.finish();

  // 300-byte tensors three to a shard: [0,1,2] [3,4,5] [6] [big] [tail.a, tail.b].
  const std::vector<std::string> expected_files = {
      "model-00001-of-00005.safetensors", "model-00002-of-00005.safetensors",
      "model-00003-of-00005.safetensors", "model-00004-of-00005.safetensors",
      "model-00005-of-00005.safetensors", "model.safetensors.index.json"};
  EXPECT_EQ(sorted_listing(dir_ / "ckpt"), expected_files);

  const Json index = read_json_file(dir_ / "ckpt" / "model.safetensors.index.json");
  std::uint64_t total = 0;
  for (const auto& t : tensors) total += t.bytes.size();
  EXPECT_EQ(index["metadata"]["total_size"].get<std::uint64_t>(), total);
  EXPECT_EQ(index["weight_map"].size(), tensors.size());
  EXPECT_EQ(index["weight_map"]["layers.0.w"], "model-00001-of-00005.safetensors");
  EXPECT_EQ(index["weight_map"]["layers.3.w"], "model-00002-of-00005.safetensors");
  EXPECT_EQ(index["weight_map"]["big"], "model-00004-of-00005.safetensors");
  EXPECT_EQ(index["weight_map"]["tail.b"], "model-00005-of-00005.safetensors");

  const SafetensorsFile big_shard = SafetensorsFile::open(dir_ / "ckpt" / "model-00004-of-00005.safetensors");
  EXPECT_EQ(big_shard.tensors().size(), 1u);

  const Checkpoint checkpoint = Checkpoint::open(dir_ / "ckpt");
  EXPECT_EQ(checkpoint.files().size(), 5u);
  ASSERT_EQ(checkpoint.tensors().size(), tensors.size());
  for (const TensorData& t : tensors) {
    const TensorView* view = checkpoint.find(t.name);
    ASSERT_NE(view, nullptr) << t.name;
    expect_same(*view, t);
  }
  EXPECT_EQ(checkpoint.find("big")->file.filename(), "model-00004-of-00005.safetensors");
  EXPECT_EQ(checkpoint.find("missing"), nullptr);
}

TEST_F(SafetensorsTest, SingleShardWritesModelSafetensorsWithoutIndex) {
  std::mt19937_64 rng(8);
  ShardedCheckpointWriter writer(dir_, 1 << 20);
  TensorData a = make_tensor("a", DType::kF16, {4, 4}, rng);
  TensorData b = make_tensor("b", DType::kI64, {3}, rng);
  writer.add(a);
  writer.add(b);
  writer.finish();
  EXPECT_EQ(sorted_listing(dir_), std::vector<std::string>{"model.safetensors"});
  const Checkpoint checkpoint = Checkpoint::open(dir_);
  ASSERT_EQ(checkpoint.tensors().size(), 2u);
  expect_same(*checkpoint.find("a"), a);
  expect_same(*checkpoint.find("b"), b);
}

TEST_F(SafetensorsTest, EmptyWriterWritesAnEmptyFile) {
  ShardedCheckpointWriter writer(dir_, 100);
  writer.finish();
  EXPECT_EQ(sorted_listing(dir_), std::vector<std::string>{"model.safetensors"});
  EXPECT_TRUE(Checkpoint::open(dir_).tensors().empty());
}

TEST_F(SafetensorsTest, RewritingADirectoryLeavesNoOldFiles) {
  write_sharded(dir_, 7, 1);  // three shards and an index
  ASSERT_TRUE(fs::exists(dir_ / "model.safetensors.index.json"));
  write_file(dir_ / "notes.txt", {'h', 'i'});

  std::mt19937_64 rng(9);
  TensorData only = make_tensor("only", DType::kF32, {2}, rng);
  {
    ShardedCheckpointWriter writer(dir_, 1000);
    writer.add(only);
    writer.finish();
  }
  EXPECT_EQ(sorted_listing(dir_), (std::vector<std::string>{"model.safetensors", "notes.txt"}));
  Checkpoint single = Checkpoint::open(dir_);
  ASSERT_EQ(single.tensors().size(), 1u);
  expect_same(*single.find("only"), only);

  // And back: a sharded write removes the old model.safetensors.
  const auto tensors = write_sharded(dir_, 4, 2);
  EXPECT_EQ(sorted_listing(dir_),
            (std::vector<std::string>{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                      "model.safetensors.index.json", "notes.txt"}));
  Checkpoint sharded = Checkpoint::open(dir_);
  EXPECT_EQ(sharded.tensors().size(), 4u);
  EXPECT_EQ(sharded.find("only"), nullptr);
  expect_same(*sharded.find("layers.3.w"), tensors[3]);
}

TEST_F(SafetensorsTest, AbandonedWriterRemovesItsPartialShardsAndKeepsTheOldCheckpoint) {
  const auto old_tensors = write_sharded(dir_, 4, 5);
  const auto before = sorted_listing(dir_);
  {
    std::mt19937_64 rng(10);
    ShardedCheckpointWriter writer(dir_, 100);
    for (int i = 0; i < 3; ++i) writer.add(make_tensor(fmt::format("n{}", i), DType::kU8, {80}, rng));
    bool saw_partial = false;
    for (const auto& name : sorted_listing(dir_)) saw_partial |= name.ends_with(".partial");
    EXPECT_TRUE(saw_partial);  // full shards go to disk before finish()
  }
  EXPECT_EQ(sorted_listing(dir_), before);
  expect_same(*Checkpoint::open(dir_).find("layers.0.w"), old_tensors[0]);
}

TEST_F(SafetensorsTest, WriterRejectsBadTensors) {
  std::mt19937_64 rng(11);
  TensorData good = make_tensor("good", DType::kBF16, {2, 3}, rng);
  TensorData short_bytes = good;
  short_bytes.name = "short";
  short_bytes.bytes.pop_back();
  try {
    write_safetensors(dir_ / "x.safetensors", std::vector<TensorData>{good, short_bytes});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "tensor 'short': 11 bytes given, but shape [2, 3] of BF16 needs 12 bytes");
  }
  EXPECT_FALSE(fs::exists(dir_ / "x.safetensors"));
  EXPECT_FALSE(fs::exists(dir_ / "x.safetensors.tmp"));

  TensorData negative = good;
  negative.shape = {-2, -3};
  try {
    encode_safetensors(std::vector<TensorData>{negative});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "negative dimension");
  }
  try {
    encode_safetensors(std::vector<TensorData>{good, good});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "tensor 'good' is given twice");
  }
  TensorData reserved = good;
  reserved.name = "__metadata__";
  try {
    encode_safetensors(std::vector<TensorData>{reserved});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "reserved");
  }

  ShardedCheckpointWriter writer(dir_, 10);
  writer.add(good);
  try {
    writer.add(good);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "tensor 'good' is added twice");
  }
  EXPECT_THROW(writer.add(short_bytes), Error);
  writer.finish();
  EXPECT_THROW(writer.finish(), Error);
  EXPECT_THROW(writer.add(make_tensor("late", DType::kU8, {1}, rng)), Error);
}

// ---- validation, one rule at a time ----

TEST(SafetensorsValidation, FileShorterThanEightBytes) {
  const std::string msg = parse_error(Bytes{1, 2, 3, 4, 5});
  EXPECT_CONTAINS(msg, "bad.safetensors: file is 5 bytes, too short for the 8-byte header length");
  EXPECT_CONTAINS(parse_error(Bytes{}), "file is 0 bytes");
}

TEST(SafetensorsValidation, HeaderLengthPastEndOfFile) {
  const std::string msg = parse_error(raw_image("{}", 0, 100));
  EXPECT_CONTAINS(msg, "bad.safetensors: header length 100 runs past the end of the file (10 bytes");
}

TEST(SafetensorsValidation, HeaderLengthHuge) {
  EXPECT_CONTAINS(parse_error(raw_image("{}", 0, 100'000'001)),
                  "header length 100000001 is more than the limit of 100000000 bytes");
  EXPECT_CONTAINS(parse_error(raw_image("{}", 0, ~std::uint64_t{0})),
                  "header length 18446744073709551615 is more than the limit");
}

TEST(SafetensorsValidation, HeaderNotJson) {
  EXPECT_CONTAINS(header_error("{\"a\": ", 0), "bad.safetensors: header: invalid JSON");
  EXPECT_CONTAINS(header_error("", 0), "bad.safetensors: header: invalid JSON");
  EXPECT_CONTAINS(header_error("{} x", 0), "invalid JSON");
  EXPECT_CONTAINS(header_error(std::string("{\"\xff\": 1}"), 0), "invalid JSON");  // not UTF-8
}

TEST(SafetensorsValidation, HeaderNotAnObject) {
  EXPECT_CONTAINS(header_error("[]", 0), "bad.safetensors: header: expected a JSON object of tensors, found an array of 0 elements");
  EXPECT_CONTAINS(header_error("7", 0), "expected a JSON object of tensors, found integer 7");
}

TEST(SafetensorsValidation, JsonBomb) {
  EXPECT_CONTAINS(header_error(std::string(100000, '['), 0), "bad.safetensors: header: JSON nested deeper than");
  std::string objects;
  for (int i = 0; i < 50000; ++i) objects += "{\"a\":";
  EXPECT_CONTAINS(header_error(objects, 0), "nested deeper than");
}

TEST(SafetensorsValidation, EmptyHeaderObjectIsValid) {
  const auto file = SafetensorsFile::parse(raw_image("{}", 0), "empty");
  EXPECT_TRUE(file.tensors().empty());
  // Trailing spaces (padding) are allowed.
  EXPECT_TRUE(SafetensorsFile::parse(raw_image("{}      ", 3), "padded").tensors().empty());
}

TEST(SafetensorsValidation, UnknownDtype) {
  const std::string msg = header_error(R"({"w": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", 8);
  EXPECT_CONTAINS(msg, "bad.safetensors: tensor 'w': unsupported dtype string \"F64\" (expected one of F32, F16, BF16, F8_E4M3");
  EXPECT_CONTAINS(header_error(R"({"w": {"dtype": 4, "shape": [1], "data_offsets": [0, 4]}})", 4),
                  "tensor 'w': dtype: expected a string, found integer 4");
}

TEST(SafetensorsValidation, BadShape) {
  EXPECT_CONTAINS(header_error(R"({"w": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 4]}})", 4),
                  "tensor 'w': shape[1]: expected a non-negative integer, found integer -1");
  EXPECT_CONTAINS(header_error(R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4),
                  "tensor 'w': shape[0]: expected a non-negative integer, found number 1.5");
  EXPECT_CONTAINS(header_error(R"({"w": {"dtype": "F32", "shape": ["3"], "data_offsets": [0, 12]}})", 12),
                  "shape[0]: expected a non-negative integer, found string \"3\"");
  EXPECT_CONTAINS(header_error(R"({"w": {"dtype": "F32", "shape": 3, "data_offsets": [0, 12]}})", 12),
                  "tensor 'w': shape: expected an array of non-negative integers, found integer 3");
  EXPECT_CONTAINS(header_error(R"({"w": {"dtype": "F32", "shape": [9223372036854775808], "data_offsets": [0, 4]}})", 4),
                  "shape[0] is 9223372036854775808, more than the limit");
}

TEST(SafetensorsValidation, ShapeProductOverflow) {
  EXPECT_CONTAINS(header_error(R"({"w": {"dtype": "U8", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})", 0),
                  "tensor 'w': shape [4294967296, 4294967296] has more than 2^63 elements");
  EXPECT_CONTAINS(header_error(R"({"w": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 0]}})", 0),
                  "tensor 'w': shape [4611686018427387904] of F32 needs more than 2^64 bytes");
  // A zero dimension makes any product fine.
  EXPECT_NO_THROW(SafetensorsFile::parse(
      raw_image(R"({"w": {"dtype": "F32", "shape": [4294967296, 0, 4294967296], "data_offsets": [0, 0]}})", 0), "ok"));
}

TEST(SafetensorsValidation, BadOffsets) {
  EXPECT_CONTAINS(header_error(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [8, 4]}})", 16),
                  "bad.safetensors: tensor 'w': data_offsets [8, 4] are reversed (expected begin <= end)");
  EXPECT_CONTAINS(header_error(R"({"w": {"dtype": "U8", "shape": [20], "data_offsets": [0, 20]}})", 16),
                  "bad.safetensors: tensor 'w': data_offsets [0, 20] end past the data section (16 bytes)");
  EXPECT_CONTAINS(header_error(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0]}})", 16),
                  "tensor 'w': data_offsets: expected an array of two non-negative integers, found an array of 1 elements");
  EXPECT_CONTAINS(header_error(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [-4, 0]}})", 16),
                  "tensor 'w': data_offsets[0]: expected a non-negative integer, found integer -4");
  EXPECT_CONTAINS(header_error(R"({"w": {"dtype": "U8", "shape": [0], "data_offsets": [0, 1e3]}})", 16),
                  "data_offsets[1]: expected a non-negative integer, found number 1000.0");
}

TEST(SafetensorsValidation, SizeMismatch) {
  EXPECT_CONTAINS(header_error(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}})", 16),
                  "tensor 'w': data_offsets [0, 8] hold 8 bytes, but shape [4] of F32 needs 16 bytes");
}

TEST(SafetensorsValidation, OverlappingTensors) {
  const std::string msg = header_error(
      R"({"a": {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]},
          "b": {"dtype": "U8", "shape": [4], "data_offsets": [20, 24]},
          "c": {"dtype": "U8", "shape": [4], "data_offsets": [12, 16]}})", 24);
  EXPECT_CONTAINS(msg, "bad.safetensors: tensor 'c': data_offsets [12, 16] overlap those of tensor 'a' ([0, 16])");
  // Adjacent and empty ranges do not overlap.
  EXPECT_NO_THROW(SafetensorsFile::parse(raw_image(
      R"({"a": {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]},
          "e": {"dtype": "F32", "shape": [0, 5], "data_offsets": [4, 4]},
          "b": {"dtype": "U8", "shape": [4], "data_offsets": [16, 20]}})", 24), "ok"));
}

TEST(SafetensorsValidation, TruncatedFile) {
  std::mt19937_64 rng(5);
  const std::vector<TensorData> tensors = {make_tensor("a", DType::kF32, {8}, rng),
                                           make_tensor("layers.0.attn.wkv.weight", DType::kBF16, {4, 4}, rng)};
  Bytes image = encode_safetensors(tensors);
  EXPECT_NO_THROW(SafetensorsFile::parse(image, "whole"));
  image.resize(image.size() - 3);
  EXPECT_CONTAINS(parse_error(image, "model-00002-of-00003.safetensors"),
                  "model-00002-of-00003.safetensors: tensor 'layers.0.attn.wkv.weight': data_offsets [32, 64] "
                  "end past the data section (61 bytes)");
}

TEST(SafetensorsValidation, DuplicateNames) {
  EXPECT_CONTAINS(header_error(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                                   "w": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}})", 8),
                  "bad.safetensors: header: tensor 'w' is listed more than once");
  EXPECT_CONTAINS(header_error(R"({"w": {"dtype": "U8", "dtype": "I8", "shape": [4], "data_offsets": [0, 4]}})", 8),
                  "tensor 'w': key 'dtype' is listed more than once");
  EXPECT_CONTAINS(header_error(R"({"__metadata__": {"k": "1", "k": "2"}})", 0),
                  "__metadata__ key 'k' is listed more than once");
}

TEST(SafetensorsValidation, BadMetadata) {
  EXPECT_CONTAINS(header_error(R"({"__metadata__": ["format", "pt"]})", 0),
                  "bad.safetensors: __metadata__: expected an object of string to string, found an array of 2 elements");
  EXPECT_CONTAINS(header_error(R"({"__metadata__": {"format": "pt", "n": 3}})", 0),
                  "bad.safetensors: __metadata__ key 'n': expected a string value, found integer 3");
  const auto ok = SafetensorsFile::parse(raw_image(R"({"__metadata__": {"format": "pt"}})", 0), "ok");
  EXPECT_EQ(ok.metadata().at("format"), "pt");
}

TEST(SafetensorsValidation, BadEntryShape) {
  EXPECT_CONTAINS(header_error(R"({"w": [1, 2]})", 0),
                  "tensor 'w': expected an object with dtype, shape and data_offsets, found an array of 2 elements");
  EXPECT_CONTAINS(header_error(R"({"w": {"dtype": "U8", "shape": [4]}})", 4),
                  "tensor 'w': missing 'data_offsets'");
  EXPECT_CONTAINS(header_error(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4], "x": 1}})", 4),
                  "tensor 'w': unexpected key 'x'");
}

TEST_F(SafetensorsTest, OpenNamesThePath) {
  write_file(dir_ / "tiny.safetensors", Bytes{1, 2, 3});
  try {
    SafetensorsFile::open(dir_ / "tiny.safetensors");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), (dir_ / "tiny.safetensors").string() + ": file is 3 bytes");
  }
  EXPECT_THROW(SafetensorsFile::open(dir_ / "absent.safetensors"), Error);
}

// ---- checkpoint directories ----

std::string open_error(const fs::path& dir) {
  try {
    Checkpoint::open(dir);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "opened without error";
  return {};
}

void edit_index(const fs::path& dir, const std::function<void(Json&)>& edit) {
  const fs::path path = dir / "model.safetensors.index.json";
  Json index = read_json_file(path);
  edit(index);
  write_text_file(path, index.dump(1));
}

TEST_F(SafetensorsTest, IndexMissingShardFile) {
  write_sharded(dir_, 7);
  fs::remove(dir_ / "model-00002-of-00003.safetensors");
  EXPECT_CONTAINS(open_error(dir_),
                  "shard model-00002-of-00003.safetensors (listed for 3 tensors, e.g. 'layers.3.w') does not exist");
}

TEST_F(SafetensorsTest, IndexListsTensorAbsentFromShard) {
  write_sharded(dir_, 7);
  edit_index(dir_, [](Json& index) { index["weight_map"]["ghost"] = "model-00001-of-00003.safetensors"; });
  const std::string msg = open_error(dir_);
  EXPECT_CONTAINS(msg, "model.safetensors.index.json: the index does not match the shards (1 problem):");
  EXPECT_CONTAINS(msg, "tensor 'ghost' is listed in the index for model-00001-of-00003.safetensors but is not in it");
}

TEST_F(SafetensorsTest, ShardHoldsTensorMissingFromIndex) {
  write_sharded(dir_, 7);
  edit_index(dir_, [](Json& index) { index["weight_map"].erase("layers.4.w"); });
  EXPECT_CONTAINS(open_error(dir_), "tensor 'layers.4.w' is in model-00002-of-00003.safetensors but not in the index");
}

TEST_F(SafetensorsTest, IndexPutsTensorInTheWrongShard) {
  write_sharded(dir_, 7);
  edit_index(dir_, [](Json& index) { index["weight_map"]["layers.0.w"] = "model-00002-of-00003.safetensors"; });
  const std::string msg = open_error(dir_);
  EXPECT_CONTAINS(msg, "tensor 'layers.0.w' is listed in the index for model-00002-of-00003.safetensors but is not in it");
  EXPECT_CONTAINS(msg, "tensor 'layers.0.w' is in model-00001-of-00003.safetensors but the index puts it in "
                       "model-00002-of-00003.safetensors");
}

TEST_F(SafetensorsTest, IndexPathTraversal) {
  const fs::path ckpt = dir_ / "ckpt";
  write_sharded(ckpt, 7);
  // A perfectly valid file outside the directory must still not be read.
  std::mt19937_64 rng(1);
  write_safetensors(dir_ / "outside.safetensors", std::vector<TensorData>{make_tensor("evil", DType::kU8, {1}, rng)});
  fs::create_directories(ckpt / "sub");
  fs::copy_file(dir_ / "outside.safetensors", ckpt / "sub" / "inner.safetensors");
  edit_index(ckpt, [](Json& index) {
    index["weight_map"]["evil"] = "../outside.safetensors";
    index["weight_map"]["evil2"] = "sub/inner.safetensors";
    index["weight_map"]["evil3"] = "..";
  });
  const std::string msg = open_error(ckpt);
  EXPECT_CONTAINS(msg, "(3 problems)");
  EXPECT_CONTAINS(msg, "shard string \"../outside.safetensors\" (of tensor 'evil') is not a plain file name");
  EXPECT_CONTAINS(msg, "shard string \"sub/inner.safetensors\" (of tensor 'evil2') is not a plain file name");
  EXPECT_CONTAINS(msg, "shard string \"..\" (of tensor 'evil3') is not a plain file name");
}

TEST_F(SafetensorsTest, IndexProblemsAreReportedTogether) {
  write_sharded(dir_, 7);
  fs::remove(dir_ / "model-00003-of-00003.safetensors");
  edit_index(dir_, [](Json& index) {
    index["weight_map"]["ghost"] = "model-00001-of-00003.safetensors";
    index["weight_map"].erase("layers.4.w");
    index["weight_map"]["n"] = 5;
  });
  const std::string msg = open_error(dir_);
  EXPECT_CONTAINS(msg, "(4 problems)");
  EXPECT_CONTAINS(msg, "model-00003-of-00003.safetensors (listed for 1 tensor, e.g. 'layers.6.w') does not exist");
  EXPECT_CONTAINS(msg, "tensor 'ghost' is listed in the index");
  EXPECT_CONTAINS(msg, "tensor 'layers.4.w' is in model-00002-of-00003.safetensors but not in the index");
  EXPECT_CONTAINS(msg, "weight_map entry 'n': expected a shard file name, found integer 5");
}

TEST_F(SafetensorsTest, IndexShardThatFailsToParseIsReported) {
  write_sharded(dir_, 7);
  write_file(dir_ / "model-00002-of-00003.safetensors", Bytes{0, 0});
  EXPECT_CONTAINS(open_error(dir_), "model-00002-of-00003.safetensors: file is 2 bytes");
}

TEST_F(SafetensorsTest, BadIndexFiles) {
  write_sharded(dir_, 4);
  write_text_file(dir_ / "model.safetensors.index.json", R"({"metadata": {}})");
  EXPECT_CONTAINS(open_error(dir_), "expected \"weight_map\" to be an object of tensor name to shard file, found nothing");
  write_text_file(dir_ / "model.safetensors.index.json", R"({"weight_map": {}})");
  EXPECT_CONTAINS(open_error(dir_), "\"weight_map\" lists no tensors");
  write_text_file(dir_ / "model.safetensors.index.json", "[1]");
  EXPECT_CONTAINS(open_error(dir_), "expected a JSON object with \"weight_map\"");
  write_text_file(dir_ / "model.safetensors.index.json",
                  R"({"weight_map": {"layers.0.w": "model-00001-of-00002.safetensors",
                                     "layers.0.w": "model-00002-of-00002.safetensors"}})");
  EXPECT_CONTAINS(open_error(dir_), "key 'layers.0.w' is listed more than once in \"weight_map\"");
}

TEST_F(SafetensorsTest, LooseFilesAreReadTogetherAndMustNotRepeatNames) {
  std::mt19937_64 rng(12);
  const TensorData a = make_tensor("a", DType::kF32, {3}, rng);
  const TensorData b = make_tensor("b", DType::kI8, {5}, rng);
  write_safetensors(dir_ / "second.safetensors", std::vector<TensorData>{b});
  write_safetensors(dir_ / "first.safetensors", std::vector<TensorData>{a});
  write_file(dir_ / "readme.md", {'x'});
  const Checkpoint checkpoint = Checkpoint::open(dir_);
  ASSERT_EQ(checkpoint.files().size(), 2u);
  EXPECT_EQ(checkpoint.files()[0].filename(), "first.safetensors");  // sorted
  EXPECT_EQ(checkpoint.files()[1].filename(), "second.safetensors");
  expect_same(*checkpoint.find("a"), a);
  expect_same(*checkpoint.find("b"), b);

  write_safetensors(dir_ / "third.safetensors", std::vector<TensorData>{a});
  EXPECT_CONTAINS(open_error(dir_), "tensor 'a' is in both first.safetensors and third.safetensors");
}

TEST_F(SafetensorsTest, NothingToOpen) {
  EXPECT_CONTAINS(open_error(dir_), "no checkpoint found");
  EXPECT_CONTAINS(open_error(dir_ / "absent"), "expected a checkpoint directory");
  write_file(dir_ / "file", {'x'});
  EXPECT_CONTAINS(open_error(dir_ / "file"), "expected a checkpoint directory");
}

// ---- random mutations ----

TEST(SafetensorsFuzz, RandomMutationsOnlyEverThrowError) {
  std::mt19937_64 rng(20240501);
  std::vector<TensorData> tensors;
  int i = 0;
  for (DType t : all_dtypes()) tensors.push_back(make_tensor(fmt::format("t{}", i++), t, {2, 3}, rng));
  tensors.push_back(make_tensor("z", DType::kU8, {0}, rng));
  const Bytes base = encode_safetensors(tensors, {{"format", "pt"}});
  std::uint64_t header_len = 0;
  for (int k = 0; k < 8; ++k) header_len |= std::uint64_t{base[static_cast<std::size_t>(k)]} << (8 * k);

  const std::string interesting = "{}[],:\"0123456789-.eE \\";
  int parsed = 0;
  int rejected = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    Bytes image = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !image.empty(); ++e) {
      const auto kind = rng() % 10;
      // Mostly edit the header, where the parser's decisions are.
      const std::size_t limit = (rng() % 4 != 0) ? std::min<std::size_t>(8 + header_len, image.size()) : image.size();
      const std::size_t pos = rng() % limit;
      if (kind < 5) {
        image[pos] = static_cast<std::uint8_t>(interesting[rng() % interesting.size()]);
      } else if (kind < 7) {
        image[pos] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
      } else if (kind < 8) {
        image.resize(pos);
      } else if (kind < 9) {
        image.erase(image.begin() + static_cast<std::ptrdiff_t>(pos));
      } else {
        image.insert(image.begin() + static_cast<std::ptrdiff_t>(pos), static_cast<std::uint8_t>(rng()));
      }
    }
    try {
      const SafetensorsFile file = SafetensorsFile::parse(image, "mutant");
      ++parsed;
      for (const auto& [name, view] : file.tensors()) {
        ASSERT_GE(view.bytes.data(), image.data() + 8) << name;
        ASSERT_LE(view.bytes.data() + view.bytes.size(), image.data() + image.size()) << name;
        ASSERT_EQ(view.bytes.size(), static_cast<std::size_t>(view.numel()) * dtype_size(view.dtype)) << name;
      }
    } catch (const Error& e) {
      ++rejected;
      ASSERT_EQ(std::string(e.what()).rfind("mutant", 0), 0u) << "error does not name the source: " << e.what();
    } catch (const std::exception& e) {
      FAIL() << "iteration " << iter << ": non-dsv4 exception: " << e.what();
    }
  }
  // Both outcomes must occur, or the loop is not exercising the parser.
  std::cout << "mutants parsed: " << parsed << ", rejected: " << rejected << "\n";
  EXPECT_GT(parsed, 20);
  EXPECT_GT(rejected, 1000);
}

// ---- the fuzzer's seed corpus ----

// Valid and invalid seeds for fuzz/fuzz_safetensors. With DSV4_WRITE_SAFETENSORS_CORPUS=1 in
// the environment this test (re)writes them under fuzz/corpus/safetensors; it always checks
// that valid_* files parse and invalid_* files fail with an Error.
std::vector<std::pair<std::string, Bytes>> seed_corpus() {
  std::mt19937_64 rng(99);
  std::vector<std::pair<std::string, Bytes>> seeds;
  std::vector<TensorData> all;
  for (DType t : all_dtypes()) all.push_back(make_tensor(std::string(dtype_name(t)), t, {2, 2}, rng));
  seeds.emplace_back("valid_all_dtypes", encode_safetensors(all, {{"format", "pt"}}));
  seeds.emplace_back("valid_empty", encode_safetensors({}));
  seeds.emplace_back("valid_scalar_and_zero",
                     encode_safetensors(std::vector<TensorData>{make_tensor("s", DType::kF32, {}, rng),
                                                                make_tensor("z", DType::kBF16, {0, 4}, rng)}));
  seeds.emplace_back("valid_v4_names",
                     encode_safetensors(std::vector<TensorData>{
                         make_tensor("layers.0.attn.wkv.weight", DType::kF8E4M3, {4, 8}, rng),
                         make_tensor("layers.0.attn.wkv.scale", DType::kF8E8M0, {1, 1}, rng),
                         make_tensor("layers.0.ffn.gate.tid2eid", DType::kI32, {3, 6}, rng)}));
  Bytes truncated = seeds[0].second;
  truncated.resize(truncated.size() - 5);
  seeds.emplace_back("invalid_truncated", truncated);
  seeds.emplace_back("invalid_short", Bytes{3, 0, 0});
  seeds.emplace_back("invalid_overlap", raw_image(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", 8));
  seeds.emplace_back("invalid_duplicate", raw_image(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2));
  seeds.emplace_back("invalid_size", raw_image(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 12));
  seeds.emplace_back("invalid_dtype", raw_image(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8));
  seeds.emplace_back("invalid_shape", raw_image(R"({"a":{"dtype":"U8","shape":[-1,1.5],"data_offsets":[0,8]}})", 8));
  seeds.emplace_back("invalid_overflow", raw_image(R"({"a":{"dtype":"I64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8));
  seeds.emplace_back("invalid_metadata", raw_image(R"({"__metadata__":{"k":1}})", 0));
  seeds.emplace_back("invalid_nesting", raw_image(std::string(200, '['), 0));
  seeds.emplace_back("invalid_header_length", raw_image("{}", 0, 1ull << 40));
  return seeds;
}

TEST(SafetensorsCorpus, SeedsParseAsNamed) {
  const fs::path dir = fs::path(DSV4_SOURCE_DIR) / "fuzz" / "corpus" / "safetensors";
  const char* write = std::getenv("DSV4_WRITE_SAFETENSORS_CORPUS");
  const auto seeds = seed_corpus();
  if (write != nullptr && std::string(write) == "1") {
    fs::create_directories(dir);
    for (const auto& [name, bytes] : seeds) write_file(dir / name, bytes);
  }
  for (const auto& [name, bytes] : seeds) {
    EXPECT_LT(bytes.size(), 4096u) << name;
    if (name.starts_with("valid_")) {
      EXPECT_NO_THROW(SafetensorsFile::parse(bytes, name)) << name;
    } else {
      EXPECT_THROW(SafetensorsFile::parse(bytes, name), Error) << name;
    }
    ASSERT_TRUE(fs::exists(dir / name)) << dir / name << " is missing: run with DSV4_WRITE_SAFETENSORS_CORPUS=1";
    EXPECT_EQ(read_file(dir / name), bytes) << name << " differs from the generator";
  }
}

}  // namespace
}  // namespace dsv4
