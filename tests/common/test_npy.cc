// .npy writer and reader: round trips, the on-disk header format, and rejection of files
// the reader does not understand.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "../support/test_support.h"
#include "common/error.h"
#include "common/json_io.h"
#include "common/npy.h"

namespace dsv4 {
namespace {

namespace fs = std::filesystem;

class NpyTest : public testing_support::TempDirTest {
 protected:
};

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected dsv4::Error, got another exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "expected dsv4::Error, nothing was thrown";
  return {};
}

std::int64_t product(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

// Random non-zero floats, with a few special values mixed in (compared bit-exactly).
std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-100.f, 100.f);
  std::vector<float> v(n);
  for (auto& x : v) {
    do x = dist(rng);
    while (x == 0.f);
  }
  const float specials[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min(),
                            -0.0f, std::numeric_limits<float>::max()};
  for (std::size_t i = 0; i < std::size(specials) && i * 7 < n; ++i) v[i * 7] = specials[i];
  return v;
}

std::vector<std::int32_t> random_ints(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> v(n);
  for (auto& x : v) {
    do x = static_cast<std::int32_t>(rng());
    while (x == 0);
  }
  if (n > 2) {
    v[0] = std::numeric_limits<std::int32_t>::min();
    v[1] = std::numeric_limits<std::int32_t>::max();
    v[2] = -1;
  }
  return v;
}

const std::vector<std::vector<std::int64_t>> kShapes = {
    {17}, {1}, {0}, {3, 5}, {1, 64}, {4, 0}, {0, 3}, {2, 3, 7}, {2, 0, 5}, {1, 1, 1}, {5, 4, 3, 2},
};

TEST_F(NpyTest, Float32RoundTrip) {
  std::uint32_t seed = 1;
  for (const auto& shape : kShapes) {
    std::vector<float> data = random_floats(static_cast<std::size_t>(product(shape)), seed++);
    fs::path path = dir_ / "f.npy";
    write_npy(path, std::span<const float>(data), std::span<const std::int64_t>(shape));
    NpyArray a = read_npy(path);
    EXPECT_EQ(a.kind, 'f');
    EXPECT_EQ(a.shape, shape);
    EXPECT_TRUE(a.i32.empty());
    ASSERT_EQ(a.f32.size(), data.size());
    if (!data.empty()) {
      EXPECT_EQ(std::memcmp(a.f32.data(), data.data(), data.size() * sizeof(float)), 0)
          << "shape rank " << shape.size();
    }
  }
}

TEST_F(NpyTest, Int32RoundTrip) {
  std::uint32_t seed = 100;
  for (const auto& shape : kShapes) {
    std::vector<std::int32_t> data = random_ints(static_cast<std::size_t>(product(shape)), seed++);
    fs::path path = dir_ / "i.npy";
    write_npy(path, std::span<const std::int32_t>(data), std::span<const std::int64_t>(shape));
    NpyArray a = read_npy(path);
    EXPECT_EQ(a.kind, 'i');
    EXPECT_EQ(a.shape, shape);
    EXPECT_TRUE(a.f32.empty());
    EXPECT_EQ(a.i32, data);
  }
}

TEST_F(NpyTest, ScalarRoundTrip) {
  const std::vector<float> data = {3.25f};
  fs::path path = dir_ / "s.npy";
  write_npy(path, std::span<const float>(data), std::span<const std::int64_t>());
  NpyArray a = read_npy(path);
  EXPECT_TRUE(a.shape.empty());
  ASSERT_EQ(a.f32.size(), 1u);
  EXPECT_EQ(a.f32[0], 3.25f);
  EXPECT_NE(read_text_file(path).find("'shape': ()"), std::string::npos);
}

TEST_F(NpyTest, HeaderFormat) {
  for (const auto& shape : kShapes) {
    std::vector<float> data = random_floats(static_cast<std::size_t>(product(shape)), 7);
    fs::path path = dir_ / "h.npy";
    write_npy(path, std::span<const float>(data), std::span<const std::int64_t>(shape));
    std::string bytes = read_text_file(path);
    ASSERT_GE(bytes.size(), 10u);
    EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
    std::size_t len = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
    EXPECT_EQ((10 + len) % 64, 0u) << "header + preamble must be 64-byte aligned";
    ASSERT_EQ(bytes.size(), 10 + len + data.size() * 4);
    std::string header = bytes.substr(10, len);
    EXPECT_EQ(header.back(), '\n');
    EXPECT_EQ(header.front(), '{');
    EXPECT_NE(header.find("'descr': '<f4'"), std::string::npos) << header;
    EXPECT_NE(header.find("'fortran_order': False"), std::string::npos) << header;
    std::string dims;
    for (std::size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
    if (shape.size() == 1) dims += ",";
    EXPECT_NE(header.find("'shape': (" + dims + ")"), std::string::npos) << header;
    // Data follows the header directly, little-endian.
    if (!data.empty()) {
      EXPECT_EQ(std::memcmp(bytes.data() + 10 + len, data.data(), data.size() * 4), 0);
    }
  }
  std::vector<std::int32_t> ints = {1, 2, 3};
  std::vector<std::int64_t> shape = {3};
  write_npy(dir_ / "i.npy", std::span<const std::int32_t>(ints), std::span<const std::int64_t>(shape));
  std::string bytes = read_text_file(dir_ / "i.npy");
  EXPECT_NE(bytes.find("'descr': '<i4'"), std::string::npos);
}

TEST_F(NpyTest, ShapeMismatchOnWrite) {
  std::vector<float> data(6, 1.f);
  std::vector<std::int64_t> shape = {2, 4};
  fs::path path = dir_ / "m.npy";
  std::string message =
      error_of([&] { write_npy(path, std::span<const float>(data), std::span<const std::int64_t>(shape)); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("8"), std::string::npos) << message;
  EXPECT_NE(message.find("6"), std::string::npos) << message;
  std::vector<std::int32_t> ints(5, 1);
  error_of([&] { write_npy(path, std::span<const std::int32_t>(ints), std::span<const std::int64_t>(shape)); });
}

TEST_F(NpyTest, RejectsTruncatedAndPaddedData) {
  std::vector<float> data = random_floats(24, 3);
  std::vector<std::int64_t> shape = {4, 6};
  fs::path path = dir_ / "t.npy";
  write_npy(path, std::span<const float>(data), std::span<const std::int64_t>(shape));
  const std::string good = read_text_file(path);

  fs::path bad = dir_ / "bad.npy";
  // Missing the last element, missing one byte, one extra byte.
  for (const std::string& variant : {good.substr(0, good.size() - 4), good.substr(0, good.size() - 1), good + "x"}) {
    write_text_file(bad, variant);
    std::string message = error_of([&] { read_npy(bad); });
    EXPECT_NE(message.find(bad.string()), std::string::npos) << message;
    EXPECT_NE(message.find("24 elements"), std::string::npos) << message;
  }
  // Cut inside the header, and before the header length.
  for (std::size_t keep : {std::size_t{40}, std::size_t{9}, std::size_t{0}}) {
    write_text_file(bad, good.substr(0, keep));
    std::string message = error_of([&] { read_npy(bad); });
    EXPECT_NE(message.find(bad.string()), std::string::npos) << keep << ": " << message;
  }
}

TEST_F(NpyTest, RejectsOtherFormats) {
  std::vector<float> data = random_floats(6, 4);
  std::vector<std::int64_t> shape = {2, 3};
  fs::path path = dir_ / "g.npy";
  write_npy(path, std::span<const float>(data), std::span<const std::int64_t>(shape));
  const std::string good = read_text_file(path);
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    auto pos = s.find(from);
    EXPECT_NE(pos, std::string::npos) << from;
    s.replace(pos, from.size(), to);  // same length keeps the layout
    return s;
  };
  fs::path bad = dir_ / "bad.npy";
  struct Case {
    std::string bytes, expect;
  };
  const Case cases[] = {
      {replaced("'<f4'", "'<f8'"), "<f4 and <i4"},
      {replaced("'<f4'", "'>f4'"), "<f4 and <i4"},
      {replaced("'<f4'", "'<u4'"), "<f4 and <i4"},
      {replaced("False", "True "), "C-order"},
      {replaced("NUMPY", "NUMPZ"), "not a version 1.0"},
      {replaced(std::string("\x01\x00", 2), std::string("\x02\x00", 2)), "not a version 1.0"},
      {replaced("(2, 3)", "(2, x)"), "bad shape"},
      {replaced("(2, 3)", "(2, 4)"), "data bytes"},
  };
  for (const auto& c : cases) {
    write_text_file(bad, c.bytes);
    std::string message = error_of([&] { read_npy(bad); });
    EXPECT_NE(message.find(bad.string()), std::string::npos) << message;
    EXPECT_NE(message.find(c.expect), std::string::npos) << c.expect << " -> " << message;
  }
  std::string message = error_of([&] { read_npy(dir_ / "missing.npy"); });
  EXPECT_NE(message.find("missing.npy"), std::string::npos) << message;
}

// A .npy file with the given header dictionary (padded as numpy pads it) and data bytes.
std::string npy_bytes(const std::string& dict, const std::string& data) {
  std::string header = dict;
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string bytes("\x93NUMPY\x01\x00", 8);
  bytes += static_cast<char>(header.size() & 0xff);
  bytes += static_cast<char>(header.size() >> 8);
  return bytes + header + data;
}

TEST_F(NpyTest, HandMadeHeaderAccepted) {
  // The helper itself produces readable files (so the rejections below are about the shape).
  const std::int32_t values[3] = {7, -8, 9};
  fs::path path = dir_ / "ok.npy";
  write_text_file(path, npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }",
                                  std::string(reinterpret_cast<const char*>(values), sizeof values)));
  NpyArray a = read_npy(path);
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{3}));
  EXPECT_EQ(a.i32, (std::vector<std::int32_t>{7, -8, 9}));
}

// A header whose shape does not fit in 64 bits, or whose element count overflows, must be
// rejected with an Error -- not accepted with no data, nor escape as std::out_of_range.
TEST_F(NpyTest, RejectsAbsurdShapes) {
  fs::path path = dir_ / "absurd.npy";
  for (const char* shape :
       {"(99999999999999999999,)", "(4611686018427387904, 4)", "(3037000500, 3037000500)"}) {
    write_text_file(path, npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': " + std::string(shape) + ", }",
                                    std::string(16, '\1')));
    std::string message = error_of([&] { read_npy(path); });
    EXPECT_NE(message.find(path.string()), std::string::npos) << shape << ": " << message;
  }
  // Zero data bytes for a shape whose element count wraps to 0 in 64 bits.
  write_text_file(path, npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }",
                                  ""));
  std::string message = error_of([&] { read_npy(path); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
}

TEST_F(NpyTest, NegativeDimensionsRejectedOnWrite) {
  std::vector<float> data(6, 1.f);
  std::vector<std::int64_t> shape = {-2, -3};  // product 6 matches the data
  fs::path path = dir_ / "neg.npy";
  std::string message =
      error_of([&] { write_npy(path, std::span<const float>(data), std::span<const std::int64_t>(shape)); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
}

// numpy itself reads what we write, and we read what numpy writes.
TEST_F(NpyTest, NumpyInterop) {
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "/usr/bin/python3 with numpy (python3-numpy) is not available; numpy interop not checked";
  std::vector<std::int64_t> shape = {3, 4, 5};
  std::vector<float> data = random_floats(60, 9);
  std::vector<std::int32_t> ints = random_ints(60, 10);
  write_npy(dir_ / "f.npy", std::span<const float>(data), std::span<const std::int64_t>(shape));
  write_npy(dir_ / "i.npy", std::span<const std::int32_t>(ints), std::span<const std::int64_t>(shape));
  const fs::path script = dir_ / "check.py";
  write_text_file(script,
                  "import sys, numpy as np\n"
                  "d = sys.argv[1]\n"
                  "f = np.load(d + '/f.npy'); i = np.load(d + '/i.npy')\n"
                  "assert f.dtype == np.float32 and f.shape == (3, 4, 5), (f.dtype, f.shape)\n"
                  "assert i.dtype == np.int32 and i.shape == (3, 4, 5), (i.dtype, i.shape)\n"
                  "np.save(d + '/f2.npy', f); np.save(d + '/i2.npy', i)\n"
                  "np.save(d + '/s.npy', np.float32(2.5))\n");
  ASSERT_EQ(std::system(("/usr/bin/python3 '" + script.string() + "' '" + dir_.string() + "'").c_str()), 0);
  NpyArray f = read_npy(dir_ / "f2.npy");
  EXPECT_EQ(f.shape, shape);
  ASSERT_EQ(f.f32.size(), data.size());
  EXPECT_EQ(std::memcmp(f.f32.data(), data.data(), data.size() * 4), 0);
  NpyArray i = read_npy(dir_ / "i2.npy");
  EXPECT_EQ(i.shape, shape);
  EXPECT_EQ(i.i32, ints);
  NpyArray s = read_npy(dir_ / "s.npy");
  EXPECT_TRUE(s.shape.empty());
  ASSERT_EQ(s.f32.size(), 1u);
  EXPECT_EQ(s.f32[0], 2.5f);
}

}  // namespace
}  // namespace dsv4
