// MappedFile: byte-exact read-only mappings, errors naming the path, move semantics.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "../support/test_support.h"
#include "common/error.h"
#include "common/mapped_file.h"

namespace dsv4 {
namespace {

namespace fs = std::filesystem;

class MappedFileTest : public testing_support::TempDirTest {
 protected:

  fs::path write_random(const std::string& name, std::size_t size, std::uint32_t seed,
                        std::vector<std::uint8_t>* content) {
    std::mt19937 rng(seed);
    content->resize(size);
    for (auto& b : *content) b = static_cast<std::uint8_t>(1 + rng() % 255);
    fs::path path = dir_ / name;
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(content->data()), static_cast<std::streamsize>(size));
    EXPECT_TRUE(out.good());
    return path;
  }

};

using testing_support::error_of;

bool same_bytes(const MappedFile& f, const std::vector<std::uint8_t>& expected) {
  auto bytes = f.bytes();
  return bytes.size() == expected.size() &&
         (expected.empty() || std::memcmp(bytes.data(), expected.data(), expected.size()) == 0);
}

TEST_F(MappedFileTest, MapsRandomContentByteExact) {
  // Sizes around page boundaries and a multi-page file.
  std::uint32_t seed = 11;
  for (std::size_t size : {std::size_t{1}, std::size_t{4095}, std::size_t{4096}, std::size_t{4097},
                           std::size_t{3 << 20} + 5}) {
    std::vector<std::uint8_t> content;
    fs::path path = write_random(fmt::format("r{}.bin", size), size, seed++, &content);
    MappedFile f = MappedFile::open(path);
    EXPECT_EQ(f.size(), size);
    EXPECT_EQ(f.bytes().size(), size);
    EXPECT_EQ(f.path(), path);
    EXPECT_TRUE(same_bytes(f, content)) << size;
  }
}

TEST_F(MappedFileTest, EmptyFile) {
  fs::path path = dir_ / "empty.bin";
  { std::ofstream out(path, std::ios::binary); }
  MappedFile f = MappedFile::open(path);
  EXPECT_EQ(f.size(), 0u);
  EXPECT_TRUE(f.bytes().empty());
  EXPECT_EQ(f.path(), path);
}

TEST_F(MappedFileTest, MissingFileErrorNamesThePath) {
  fs::path path = dir_ / "no_such_file.safetensors";
  std::string message = error_of([&] { MappedFile::open(path); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("No such file"), std::string::npos) << message;
}

TEST_F(MappedFileTest, DirectoryRejected) {
  std::string message = error_of([&] { MappedFile::open(dir_); });
  EXPECT_NE(message.find(dir_.string()), std::string::npos) << message;
  EXPECT_NE(message.find("not a regular file"), std::string::npos) << message;
}

TEST_F(MappedFileTest, DefaultConstructedIsEmpty) {
  MappedFile f;
  EXPECT_EQ(f.size(), 0u);
  EXPECT_TRUE(f.bytes().empty());
  EXPECT_TRUE(f.path().empty());
}

TEST_F(MappedFileTest, MoveConstructionTransfersTheMapping) {
  std::vector<std::uint8_t> content;
  fs::path path = write_random("a.bin", 10000, 21, &content);
  MappedFile a = MappedFile::open(path);
  const std::uint8_t* data = a.bytes().data();
  MappedFile b(std::move(a));
  EXPECT_EQ(b.bytes().data(), data);
  EXPECT_EQ(b.path(), path);
  EXPECT_TRUE(same_bytes(b, content));
  // The moved-from object is empty and safe to destroy.
  EXPECT_EQ(a.size(), 0u);  // NOLINT(bugprone-use-after-move)
  EXPECT_TRUE(a.bytes().empty());
  EXPECT_EQ(a.bytes().data(), nullptr);
}

TEST_F(MappedFileTest, MoveAssignmentReplacesTheMapping) {
  std::vector<std::uint8_t> ca, cb;
  fs::path pa = write_random("a.bin", 5000, 31, &ca);
  fs::path pb = write_random("b.bin", 7000, 32, &cb);
  MappedFile a = MappedFile::open(pa);
  MappedFile b = MappedFile::open(pb);
  b = std::move(a);  // b's old mapping is released, a's moves over
  EXPECT_EQ(b.size(), 5000u);
  EXPECT_EQ(b.path(), pa);
  EXPECT_TRUE(same_bytes(b, ca));
  EXPECT_EQ(a.size(), 0u);  // NOLINT(bugprone-use-after-move)
  EXPECT_TRUE(a.bytes().empty());

  // Assigning into an empty object, and back.
  MappedFile c;
  c = std::move(b);
  EXPECT_TRUE(same_bytes(c, ca));
  EXPECT_TRUE(b.bytes().empty());  // NOLINT(bugprone-use-after-move)
  a = std::move(c);
  EXPECT_TRUE(same_bytes(a, ca));

  // Self-assignment (through a reference, so the compiler does not see it) keeps it.
  MappedFile& alias = a;
  a = std::move(alias);
  EXPECT_TRUE(same_bytes(a, ca));

  // A moved-into vector of mappings stays valid as the vector grows.
  std::vector<MappedFile> files;
  for (int i = 0; i < 20; ++i) files.push_back(MappedFile::open(i % 2 ? pa : pb));
  for (int i = 0; i < 20; ++i) EXPECT_TRUE(same_bytes(files[static_cast<std::size_t>(i)], i % 2 ? ca : cb)) << i;
}

TEST_F(MappedFileTest, MappingOutlivesTheFileName) {
  std::vector<std::uint8_t> content;
  fs::path path = write_random("gone.bin", 8192, 41, &content);
  MappedFile f = MappedFile::open(path);
  fs::remove(path);
  EXPECT_TRUE(same_bytes(f, content));
}

}  // namespace
}  // namespace dsv4
