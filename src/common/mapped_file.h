// A read-only memory-mapped file. Checkpoints are mapped, never read into memory:
// tensors are views into the mapping and pages load on first touch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>

namespace dsv4 {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps the whole file; throws Error naming the path when it cannot.
  static MappedFile open(const std::filesystem::path& path);

  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const std::uint8_t> bytes() const { return {data_, size_}; }
  std::size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  void reset();
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  std::filesystem::path path_;
};

}  // namespace dsv4
