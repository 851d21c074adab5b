// Safetensors reader and writer.
//
// File layout: u64 little-endian header length N, then N bytes of UTF-8 JSON
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
//  "__metadata__": {"k": "v"}}, then the data section; offsets are relative to its start.
//
// The reader memory-maps files and validates everything before handing out a view:
// header length inside the file and at most 100 MB, valid JSON of the expected shape
// (nesting depth bounded, duplicate keys rejected), known dtype, non-negative shape,
// end - begin == product(shape) * dtype size (no overflow), ranges inside the data section
// and not overlapping. Gaps between tensors are allowed (the reference writer never makes
// them, but nothing depends on contiguity here). Errors name the file and tensor.
// A sharded checkpoint (model.safetensors.index.json with "weight_map") is read as one
// set of tensors; the index must agree with the shards' contents.
//
// The writer pads the header with spaces so the data section starts 8-byte aligned and
// packs tensors back to back in the given order, as the reference implementation does
// (its reader requires contiguous data), so a tensor is aligned to its element size
// only if the byte sizes of the tensors before it keep it so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "model/dtype.h"

namespace dsv4 {

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<std::int64_t> shape;
  std::span<const std::uint8_t> bytes;  // into the mapped file
  std::filesystem::path file;           // the shard that holds it

  std::int64_t numel() const;  // product of shape (1 for a scalar); Error on overflow
};

// Largest header the reader accepts, in bytes.
inline constexpr std::uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// One safetensors file, mapped and validated.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::filesystem::path& path);
  // Parses and validates an in-memory image (used by the fuzzer and tests); `where` names it
  // in errors and becomes TensorView::file. The views point into `image`, which must outlive
  // them.
  static SafetensorsFile parse(std::span<const std::uint8_t> image, const std::string& where);

  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::shared_ptr<MappedFile> file_;  // keeps the mapping alive for the views
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a model directory: model.safetensors, or the shards listed by
// model.safetensors.index.json, or (if neither) every *.safetensors file in the directory.
// With an index, every shard must be a plain file name inside `dir` (no "/" or ".."), exist,
// and hold exactly the tensors the index assigns to it; all such problems are reported in
// one Error. Without one, tensor names must be unique across the files.
class Checkpoint {
 public:
  static Checkpoint open(const std::filesystem::path& dir);

  const TensorView* find(const std::string& name) const;  // nullptr if absent
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::vector<std::filesystem::path>& files() const { return files_; }

 private:
  std::vector<SafetensorsFile> shards_;
  std::map<std::string, TensorView> tensors_;
  std::vector<std::filesystem::path> files_;
};

// A tensor to write: name, dtype, shape and exactly numel * dtype_size bytes.
struct TensorData {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> bytes;
};

// Writes one safetensors file (tensors in the given order, data section 8-byte aligned).
// Validates every tensor first (bytes.size() == numel * dtype size, non-negative shape,
// unique names, none called "__metadata__"); writes `path` + ".tmp" and renames it.
// An empty `metadata` writes no "__metadata__" entry.
void write_safetensors(const std::filesystem::path& path, std::span<const TensorData> tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The same file image in memory (tests, fuzzer seeds, small checkpoints).
std::vector<std::uint8_t> encode_safetensors(std::span<const TensorData> tensors,
                                             const std::map<std::string, std::string>& metadata = {});

// Streams tensors into shards of at most `max_shard_bytes` of tensor data each (headers not
// counted; a tensor larger than the limit gets a shard of its own):
// model-0000K-of-0000N.safetensors plus model.safetensors.index.json
// ({"metadata": {"total_size": bytes}, "weight_map": {name: shard}}), or a single
// model.safetensors and no index when everything fits in one shard.
// Shards are written under temporary names (".dsv4-shard-K.partial") as they fill up; finish()
// then removes any previous checkpoint in `dir` (model.safetensors,
// model.safetensors.index.json, model-NNNNN-of-NNNNN.safetensors), renames the new shards into
// place and writes the index, so old and new files are never mixed. A writer destroyed
// without finish() removes its temporary shards and leaves the old checkpoint untouched.
class ShardedCheckpointWriter {
 public:
  ShardedCheckpointWriter(std::filesystem::path dir, std::size_t max_shard_bytes);
  ~ShardedCheckpointWriter();
  ShardedCheckpointWriter(ShardedCheckpointWriter&&) = default;
  ShardedCheckpointWriter& operator=(ShardedCheckpointWriter&&) = delete;
  ShardedCheckpointWriter(const ShardedCheckpointWriter&) = delete;
  ShardedCheckpointWriter& operator=(const ShardedCheckpointWriter&) = delete;

  void add(TensorData tensor);  // validates, buffers until the current shard is full, then writes it
  void finish();                // writes the remaining shard and the index; call once

 private:
  std::filesystem::path dir_;
  std::size_t max_shard_bytes_;
  std::vector<TensorData> pending_;
  std::size_t pending_bytes_ = 0;
  std::vector<std::filesystem::path> written_;  // temporary shard names until the count is known
  std::vector<std::vector<std::string>> shard_names_;
  std::size_t total_bytes_ = 0;
  bool finished_ = false;
  std::set<std::string> all_names_;  // every tensor added, to reject duplicates across shards

  void flush_pending();
};

}  // namespace dsv4
