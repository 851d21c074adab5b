#include "common/npy.h"

#include <charconv>
#include <cstring>
#include <fstream>
#include <string>

#include "common/error.h"
#include "common/json_io.h"

namespace dsv4 {
namespace {

// Product of the dims; -1 for a negative dim or a product that overflows.
std::int64_t element_count(std::span<const std::int64_t> shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return -1;
  }
  return n;
}

void check_shape(const std::filesystem::path& path, std::span<const std::int64_t> shape, std::size_t size) {
  const std::int64_t count = element_count(shape);
  if (count < 0) fail("write_npy {}: shape has a negative dimension or too many elements", path.string());
  if (count != static_cast<std::int64_t>(size))
    fail("write_npy {}: shape holds {} elements, data {}", path.string(), count, size);
}

void write_npy_bytes(const std::filesystem::path& path, const char* descr, const void* data,
                     std::size_t bytes, std::span<const std::int64_t> shape) {
  std::string shape_text = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    shape_text += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) shape_text += ",";
    if (i + 1 < shape.size()) shape_text += " ";
  }
  shape_text += ")";
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr,
                                   shape_text);
  // magic(6) + version(2) + header_len(2) + header, padded with spaces to 64 bytes, ending in \n.
  std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("cannot write {}", path.string());
  const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  out.write(magic, 8);
  std::uint16_t len = static_cast<std::uint16_t>(header.size());
  char len_bytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(len_bytes, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!out) fail("write to {} failed", path.string());
}

}  // namespace

void write_npy(const std::filesystem::path& path, std::span<const float> data,
               std::span<const std::int64_t> shape) {
  check_shape(path, shape, data.size());
  write_npy_bytes(path, "<f4", data.data(), data.size_bytes(), shape);
}

void write_npy(const std::filesystem::path& path, std::span<const std::int32_t> data,
               std::span<const std::int64_t> shape) {
  check_shape(path, shape, data.size());
  write_npy_bytes(path, "<i4", data.data(), data.size_bytes(), shape);
}

NpyArray read_npy(const std::filesystem::path& path) {
  std::string bytes = read_text_file(path, std::size_t{1} << 34);
  if (bytes.size() < 10 || std::memcmp(bytes.data(), "\x93NUMPY\x01\x00", 8) != 0)
    fail("{}: not a version 1.0 .npy file", path.string());
  std::size_t len = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
  if (10 + len > bytes.size()) fail("{}: header runs past the end of the file", path.string());
  std::string header = bytes.substr(10, len);
  NpyArray array;
  if (header.find("'<f4'") != std::string::npos) {
    array.kind = 'f';
  } else if (header.find("'<i4'") != std::string::npos) {
    array.kind = 'i';
  } else {
    fail("{}: only <f4 and <i4 arrays are supported", path.string());
  }
  if (header.find("'fortran_order': False") == std::string::npos)
    fail("{}: only C-order arrays are supported", path.string());
  auto open = header.find('(', header.find("'shape'"));
  auto close = header.find(')', open);
  if (open == std::string::npos || close == std::string::npos) fail("{}: no shape in header", path.string());
  std::string dims = header.substr(open + 1, close - open - 1);
  std::size_t pos = 0;
  while (pos < dims.size()) {
    while (pos < dims.size() && (dims[pos] == ' ' || dims[pos] == ',')) ++pos;
    if (pos >= dims.size()) break;
    std::size_t end = pos;
    while (end < dims.size() && dims[end] >= '0' && dims[end] <= '9') ++end;
    std::int64_t dim = 0;
    auto [ptr, ec] = std::from_chars(dims.data() + pos, dims.data() + end, dim);
    if (end == pos || ec != std::errc() || ptr != dims.data() + end) fail("{}: bad shape '{}'", path.string(), dims);
    array.shape.push_back(dim);
    pos = end;
  }
  const std::int64_t elements = element_count(array.shape);
  if (elements < 0) fail("{}: bad shape '{}'", path.string(), dims);
  const auto count = static_cast<std::size_t>(elements);
  const std::size_t data_bytes = bytes.size() - 10 - len;
  if (data_bytes % 4 != 0 || data_bytes / 4 != count)
    fail("{}: {} data bytes for {} elements", path.string(), data_bytes, count);
  const char* data = bytes.data() + 10 + len;
  if (array.kind == 'f') {
    array.f32.resize(count);
    if (count > 0) std::memcpy(array.f32.data(), data, count * 4);
  } else {
    array.i32.resize(count);
    if (count > 0) std::memcpy(array.i32.data(), data, count * 4);
  }
  return array;
}

}  // namespace dsv4
