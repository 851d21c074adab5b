// Writer (and a small reader for tests) of NumPy .npy files, version 1.0, little endian,
// C order. Used to dump logits and hidden states for comparison with other engines.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

namespace dsv4 {

void write_npy(const std::filesystem::path& path, std::span<const float> data,
               std::span<const std::int64_t> shape);
void write_npy(const std::filesystem::path& path, std::span<const std::int32_t> data,
               std::span<const std::int64_t> shape);

struct NpyArray {
  char kind = 'f';  // 'f' float32, 'i' int32
  std::vector<std::int64_t> shape;
  std::vector<float> f32;
  std::vector<std::int32_t> i32;
};
// Reads the float32 / int32 arrays this writer produces; throws Error on anything else.
NpyArray read_npy(const std::filesystem::path& path);

}  // namespace dsv4
