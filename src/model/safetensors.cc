// Safetensors: a validating reader over memory-mapped files, checkpoint directories
// (one file, sharded with an index, or a loose set of files) and the writers.
// safetensors.h describes the format and every check; this file only implements them.
#include "model/safetensors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <optional>
#include <string_view>
#include <system_error>
#include <unordered_set>
#include <utility>

#include "common/error.h"
#include "common/json_io.h"

namespace dsv4 {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kMetadataKey = "__metadata__";
constexpr std::string_view kIndexFileName = "model.safetensors.index.json";
constexpr std::string_view kSingleFileName = "model.safetensors";
constexpr std::string_view kSafetensorsSuffix = ".safetensors";
// A valid header nests three levels ({"t": {"shape": [..]}}); anything much deeper is junk.
constexpr std::size_t kMaxHeaderDepth = 16;
// Checkpoint errors list at most this many problems, then a count of the rest.
constexpr std::size_t kMaxReportedProblems = 20;

// ---- small helpers ----

std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

std::string format_shape(const std::vector<std::int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// A JSON value for an error message: numbers and strings as written (ASCII-escaped,
// shortened), containers by their type.
std::string describe(const Json& value) {
  if (value.is_number() || value.is_string() || value.is_boolean() || value.is_null()) {
    std::string text = value.dump(-1, ' ', /*ensure_ascii=*/true);
    if (text.size() > 64) text = text.substr(0, 60) + "...";
    return fmt::format("{} {}", json_type_name(value), text);
  }
  if (value.is_array()) return fmt::format("an array of {} elements", value.size());
  return json_type_name(value);
}

std::optional<std::uint64_t> as_non_negative_integer(const Json& value) {
  if (value.is_number_unsigned()) return value.get<std::uint64_t>();
  if (value.is_number_integer()) {
    auto v = value.get<std::int64_t>();
    if (v >= 0) return static_cast<std::uint64_t>(v);
  }
  return std::nullopt;
}

std::string supported_dtype_names() {
  std::vector<std::string_view> names;
  for (DType t : all_dtypes()) names.push_back(dtype_name(t));
  return fmt::format("{}", fmt::join(names, ", "));
}

// ---- reading ----

struct Range {
  std::uint64_t begin;
  std::uint64_t end;
  const std::string* name;
};

void parse_metadata(const Json& value, const std::string& where,
                    std::map<std::string, std::string>& out) {
  if (!value.is_object()) {
    fail("{}: __metadata__: expected an object of string to string, found {}", where,
         describe(value));
  }
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      fail("{}: __metadata__ key '{}': expected a string value, found {}", where, key,
           describe(item));
    }
    out.emplace(key, item.get<std::string>());
  }
}

TensorView parse_entry(const std::string& where, const std::string& name, const Json& entry,
                       std::span<const std::uint8_t> data, Range& range) {
  const std::string ctx = fmt::format("{}: tensor '{}'", where, name);
  if (!entry.is_object()) {
    fail("{}: expected an object with dtype, shape and data_offsets, found {}", ctx,
         describe(entry));
  }
  for (const auto& [key, item] : entry.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      fail("{}: unexpected key '{}' (expected exactly dtype, shape and data_offsets)", ctx, key);
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key)) {
      fail("{}: missing '{}' (expected dtype, shape and data_offsets)", ctx, key);
    }
  }

  TensorView view;
  view.name = name;
  view.file = where;

  const Json& dtype = entry["dtype"];
  if (!dtype.is_string()) fail("{}: dtype: expected a string, found {}", ctx, describe(dtype));
  auto parsed = dtype_from_name(dtype.get_ref<const std::string&>());
  if (!parsed) {
    fail("{}: unsupported dtype {} (expected one of {})", ctx, describe(dtype),
         supported_dtype_names());
  }
  view.dtype = *parsed;

  const Json& shape = entry["shape"];
  if (!shape.is_array()) {
    fail("{}: shape: expected an array of non-negative integers, found {}", ctx,
         describe(shape));
  }
  constexpr auto kMaxDim = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  for (std::size_t i = 0; i < shape.size(); ++i) {
    auto dim = as_non_negative_integer(shape[i]);
    if (!dim) {
      fail("{}: shape[{}]: expected a non-negative integer, found {}", ctx, i,
           describe(shape[i]));
    }
    if (*dim > kMaxDim) fail("{}: shape[{}] is {}, more than the limit of {}", ctx, i, *dim, kMaxDim);
    view.shape.push_back(static_cast<std::int64_t>(*dim));
  }
  std::uint64_t numel = 1;
  for (std::int64_t dim : view.shape) {
    auto product = checked_mul(numel, static_cast<std::uint64_t>(dim));
    if (!product || *product > kMaxDim) {
      fail("{}: shape {} has more than 2^63 elements", ctx, format_shape(view.shape));
    }
    numel = *product;
  }
  auto byte_size = checked_mul(numel, dtype_size(view.dtype));
  if (!byte_size) {
    fail("{}: shape {} of {} needs more than 2^64 bytes", ctx, format_shape(view.shape),
         dtype_name(view.dtype));
  }

  const Json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    fail("{}: data_offsets: expected an array of two non-negative integers, found {}", ctx,
         describe(offsets));
  }
  std::uint64_t bounds[2] = {0, 0};
  for (std::size_t i = 0; i < 2; ++i) {
    auto value = as_non_negative_integer(offsets[i]);
    if (!value) {
      fail("{}: data_offsets[{}]: expected a non-negative integer, found {}", ctx, i,
           describe(offsets[i]));
    }
    bounds[i] = *value;
  }
  const auto [begin, end] = bounds;
  if (begin > end) fail("{}: data_offsets [{}, {}] are reversed (expected begin <= end)", ctx, begin, end);
  if (end > data.size()) {
    fail("{}: data_offsets [{}, {}] end past the data section ({} bytes)", ctx, begin, end,
         data.size());
  }
  if (end - begin != *byte_size) {
    fail("{}: data_offsets [{}, {}] hold {} bytes, but shape {} of {} needs {} bytes", ctx,
         begin, end, end - begin, format_shape(view.shape), dtype_name(view.dtype), *byte_size);
  }
  view.bytes = data.subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(end - begin));
  range = Range{begin, end, nullptr};
  return view;
}

// ---- checkpoint directories ----

// A shard name from an index must name a file directly inside the checkpoint directory.
bool is_plain_file_name(std::string_view name) {
  return !name.empty() && name.find('/') == std::string_view::npos &&
         name.find('\\') == std::string_view::npos && name.find("..") == std::string_view::npos &&
         name.find('\0') == std::string_view::npos && name != ".";
}

// model-NNNNN-of-NNNNN.safetensors (any number of digits).
bool is_shard_file_name(std::string_view name) {
  constexpr std::string_view kPrefix = "model-";
  constexpr std::string_view kSeparator = "-of-";
  if (!name.starts_with(kPrefix) || !name.ends_with(kSafetensorsSuffix)) return false;
  name = name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSafetensorsSuffix.size());
  auto digits = [](std::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  auto pos = name.find(kSeparator);
  return pos != std::string_view::npos && digits(name.substr(0, pos)) &&
         digits(name.substr(pos + kSeparator.size()));
}

[[noreturn]] void fail_with_problems(const std::string& where, const std::string& what,
                                     const std::vector<std::string>& problems) {
  std::string text = fmt::format("{}: {} ({} problem{}):", where, what, problems.size(),
                                 problems.size() == 1 ? "" : "s");
  for (std::size_t i = 0; i < problems.size() && i < kMaxReportedProblems; ++i) {
    text += "\n  " + problems[i];
  }
  if (problems.size() > kMaxReportedProblems) {
    text += fmt::format("\n  ... and {} more", problems.size() - kMaxReportedProblems);
  }
  throw Error(text);
}

// ---- writing ----

// Bytes `tensor` must hold; Error naming `where` when the tensor cannot be written.
std::uint64_t checked_tensor_bytes(const TensorData& tensor, const std::string& where) {
  if (tensor.name == kMetadataKey) {
    fail("{}: a tensor cannot be named '__metadata__' (the key is reserved for metadata)", where);
  }
  std::uint64_t numel = 1;
  for (std::int64_t dim : tensor.shape) {
    if (dim < 0) {
      fail("{}: tensor '{}': shape {} has a negative dimension", where, tensor.name,
           format_shape(tensor.shape));
    }
    auto product = checked_mul(numel, static_cast<std::uint64_t>(dim));
    if (!product) fail("{}: tensor '{}': shape {} overflows", where, tensor.name, format_shape(tensor.shape));
    numel = *product;
  }
  auto bytes = checked_mul(numel, dtype_size(tensor.dtype));
  if (!bytes) fail("{}: tensor '{}': shape {} overflows", where, tensor.name, format_shape(tensor.shape));
  if (tensor.bytes.size() != *bytes) {
    fail("{}: tensor '{}': {} bytes given, but shape {} of {} needs {} bytes", where, tensor.name,
         tensor.bytes.size(), format_shape(tensor.shape), dtype_name(tensor.dtype), *bytes);
  }
  return *bytes;
}

// The header text, padded with spaces to a multiple of 8 bytes so the data section that
// follows the 8-byte length starts 8-byte aligned.
std::string build_header(std::span<const TensorData> tensors,
                         const std::map<std::string, std::string>& metadata,
                         const std::string& where) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto& meta = header[std::string(kMetadataKey)];
    meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
  }
  std::unordered_set<std::string_view> seen;
  std::uint64_t offset = 0;
  for (const TensorData& tensor : tensors) {
    std::uint64_t bytes = checked_tensor_bytes(tensor, where);
    if (!seen.insert(tensor.name).second) fail("{}: tensor '{}' is given twice", where, tensor.name);
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = std::string(dtype_name(tensor.dtype));
    entry["shape"] = tensor.shape;
    entry["data_offsets"] = {offset, offset + bytes};
    header[tensor.name] = std::move(entry);
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::exception& e) {
    fail("{}: cannot write the header (tensor names and metadata must be UTF-8): {}", where,
         e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

void append_u64_le(std::string& out, std::uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

// ---- TensorView ----

std::int64_t TensorView::numel() const {
  std::int64_t n = 1;
  for (std::int64_t dim : shape) {
    if (dim < 0 || __builtin_mul_overflow(n, dim, &n)) {
      fail("tensor '{}': shape {} has no valid element count", name, format_shape(shape));
    }
  }
  return n;
}

// ---- SafetensorsFile ----

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  auto mapped = std::make_shared<MappedFile>(MappedFile::open(path));
  SafetensorsFile file = parse(mapped->bytes(), path.string());
  file.file_ = std::move(mapped);
  return file;
}

SafetensorsFile SafetensorsFile::parse(std::span<const std::uint8_t> image, const std::string& where) {
  if (image.size() < 8) {
    fail("{}: file is {} bytes, too short for the 8-byte header length", where, image.size());
  }
  std::uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<std::uint64_t>(image[i]) << (8 * i);
  if (header_len > kMaxSafetensorsHeaderBytes) {
    fail("{}: header length {} is more than the limit of {} bytes", where, header_len,
         kMaxSafetensorsHeaderBytes);
  }
  if (header_len > image.size() - 8) {
    fail("{}: header length {} runs past the end of the file ({} bytes, so at most {})", where,
         header_len, image.size(), image.size() - 8);
  }
  const auto header_size = static_cast<std::size_t>(header_len);
  std::string_view text(reinterpret_cast<const char*>(image.data()) + 8, header_size);
  Json header;
  try {
    header = parse_json(text, where + ": header", kMaxHeaderDepth);
  } catch (const DuplicateKeyError& e) {  // said in the header's terms: tensors and their fields
    const auto& path = e.path();
    if (path.size() == 1) fail("{}: header: tensor '{}' is listed more than once", where, path[0]);
    if (path[0] == kMetadataKey) {
      fail("{}: header: __metadata__ key '{}' is listed more than once", where, path.back());
    }
    fail("{}: tensor '{}': key '{}' is listed more than once", where, path[0], path.back());
  }
  if (!header.is_object()) {
    fail("{}: header: expected a JSON object of tensors, found {}", where, describe(header));
  }

  const std::span<const std::uint8_t> data = image.subspan(8 + header_size);
  SafetensorsFile file;
  std::vector<Range> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      parse_metadata(entry, where, file.metadata_);
      continue;
    }
    Range range{};
    TensorView view = parse_entry(where, name, entry, data, range);
    auto [it, inserted] = file.tensors_.emplace(name, std::move(view));
    range.name = &it->first;
    ranges.push_back(range);
  }

  // Sorted by begin, a non-empty range overlaps an earlier one exactly when it begins
  // before the furthest end seen so far. Empty ranges hold no bytes and overlap nothing.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const Range* furthest = nullptr;
  for (const Range& range : ranges) {
    if (range.begin == range.end) continue;
    if (furthest != nullptr && range.begin < furthest->end) {
      fail("{}: tensor '{}': data_offsets [{}, {}] overlap those of tensor '{}' ([{}, {}])", where,
           *range.name, range.begin, range.end, *furthest->name, furthest->begin, furthest->end);
    }
    if (furthest == nullptr || range.end > furthest->end) furthest = &range;
  }
  return file;
}

// ---- Checkpoint ----

const TensorView* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Checkpoint Checkpoint::open(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    fail("{}: expected a checkpoint directory, {}", dir.string(),
         ec ? ec.message() : std::string("but it is not a directory"));
  }
  Checkpoint checkpoint;
  std::vector<std::string> problems;
  // Adds a shard's tensors, noting names already held by another shard.
  auto add_shard = [&](SafetensorsFile shard, const fs::path& path) {
    for (const auto& [name, view] : shard.tensors()) {
      auto [it, inserted] = checkpoint.tensors_.emplace(name, view);
      if (!inserted) {
        problems.push_back(fmt::format("tensor '{}' is in both {} and {}", name,
                                       it->second.file.filename().string(),
                                       path.filename().string()));
      }
    }
    checkpoint.files_.push_back(path);
    checkpoint.shards_.push_back(std::move(shard));
  };

  const fs::path index_path = dir / kIndexFileName;
  if (fs::exists(index_path, ec)) {
    const std::string where = index_path.string();
    const std::string text = read_text_file(index_path);
    const Json index = parse_json(text, where);  // a repeated key: "key 'x' is listed more than once in ..."
    if (!index.is_object()) fail("{}: expected a JSON object with \"weight_map\", found {}", where, describe(index));
    auto weight_map = index.find("weight_map");
    if (weight_map == index.end() || !weight_map->is_object()) {
      fail("{}: expected \"weight_map\" to be an object of tensor name to shard file, found {}",
           where, weight_map == index.end() ? std::string("nothing") : describe(*weight_map));
    }
    if (weight_map->empty()) fail("{}: \"weight_map\" lists no tensors", where);

    std::map<std::string, std::vector<std::string>> by_shard;  // shard -> tensors, per the index
    std::map<std::string, std::string> shard_of;               // tensor -> shard, per the index
    std::set<std::string> bad_names;
    for (const auto& [name, value] : weight_map->items()) {
      if (!value.is_string()) {
        problems.push_back(fmt::format("weight_map entry '{}': expected a shard file name, found {}",
                                       name, describe(value)));
        continue;
      }
      const auto& shard = value.get_ref<const std::string&>();
      if (!is_plain_file_name(shard)) {
        if (bad_names.insert(shard).second) {
          problems.push_back(fmt::format(
              "shard {} (of tensor '{}') is not a plain file name in the checkpoint directory",
              describe(value), name));
        }
        continue;
      }
      by_shard[shard].push_back(name);
      shard_of.emplace(name, shard);
    }
    for (const auto& [shard_name, listed] : by_shard) {
      const fs::path path = dir / shard_name;
      if (!fs::exists(path, ec)) {
        problems.push_back(fmt::format("shard {} (listed for {} tensor{}, e.g. '{}') does not exist",
                                       shard_name, listed.size(), listed.size() == 1 ? "" : "s",
                                       listed.front()));
        continue;
      }
      std::optional<SafetensorsFile> shard;
      try {
        shard = SafetensorsFile::open(path);
      } catch (const Error& e) {
        problems.push_back(e.what());
        continue;
      }
      for (const std::string& name : listed) {
        if (shard->tensors().count(name) == 0) {
          problems.push_back(fmt::format("tensor '{}' is listed in the index for {} but is not in it",
                                         name, shard_name));
        }
      }
      for (const auto& [name, view] : shard->tensors()) {
        auto it = shard_of.find(name);
        if (it == shard_of.end()) {
          problems.push_back(fmt::format("tensor '{}' is in {} but not in the index", name, shard_name));
        } else if (it->second != shard_name) {
          problems.push_back(fmt::format("tensor '{}' is in {} but the index puts it in {}", name,
                                         shard_name, it->second));
        }
      }
      add_shard(std::move(*shard), path);
    }
    if (!problems.empty()) fail_with_problems(where, "the index does not match the shards", problems);
    return checkpoint;
  }

  const fs::path single_path = dir / kSingleFileName;
  if (fs::exists(single_path, ec)) {
    add_shard(SafetensorsFile::open(single_path), single_path);
    return checkpoint;
  }

  std::vector<fs::path> paths;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& path = it->path();
    std::error_code type_ec;
    if (path.filename().string().ends_with(kSafetensorsSuffix) && it->is_regular_file(type_ec)) {
      paths.push_back(path);
    }
  }
  if (ec) fail("{}: cannot list the directory: {}", dir.string(), ec.message());
  if (paths.empty()) {
    fail("{}: no checkpoint found (expected {}, {} or *.safetensors files)", dir.string(),
         kIndexFileName, kSingleFileName);
  }
  std::sort(paths.begin(), paths.end());
  for (const fs::path& path : paths) add_shard(SafetensorsFile::open(path), path);
  if (!problems.empty()) {
    fail_with_problems(dir.string(), "tensor names repeat across the *.safetensors files", problems);
  }
  return checkpoint;
}

// ---- writers ----

std::vector<std::uint8_t> encode_safetensors(std::span<const TensorData> tensors,
                                             const std::map<std::string, std::string>& metadata) {
  std::string head;
  append_u64_le(head, 0);
  head += build_header(tensors, metadata, "safetensors image");
  const std::uint64_t header_len = head.size() - 8;
  for (int i = 0; i < 8; ++i) head[static_cast<std::size_t>(i)] = static_cast<char>((header_len >> (8 * i)) & 0xff);
  std::size_t total = head.size();
  for (const TensorData& tensor : tensors) total += tensor.bytes.size();
  std::vector<std::uint8_t> out;
  out.reserve(total);
  out.insert(out.end(), head.begin(), head.end());
  for (const TensorData& tensor : tensors) out.insert(out.end(), tensor.bytes.begin(), tensor.bytes.end());
  return out;
}

void write_safetensors(const std::filesystem::path& path, std::span<const TensorData> tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string where = path.string();
  const std::string header = build_header(tensors, metadata, where);
  std::string length;
  append_u64_le(length, header.size());

  fs::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot write {}", tmp.string());
    out.write(length.data(), static_cast<std::streamsize>(length.size()));
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (const TensorData& tensor : tensors) {
      out.write(reinterpret_cast<const char*>(tensor.bytes.data()),
                static_cast<std::streamsize>(tensor.bytes.size()));
    }
    out.close();
    if (!out) {
      std::error_code ignored;
      fs::remove(tmp, ignored);
      fail("writing {} failed (disk full?)", tmp.string());
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    fail("cannot rename {} to {}: {}", tmp.string(), where, ec.message());
  }
}

ShardedCheckpointWriter::ShardedCheckpointWriter(std::filesystem::path dir, std::size_t max_shard_bytes)
    : dir_(std::move(dir)), max_shard_bytes_(max_shard_bytes) {}

ShardedCheckpointWriter::~ShardedCheckpointWriter() {
  for (const auto& path : written_) {
    std::error_code ignored;
    fs::remove(path, ignored);
  }
}

void ShardedCheckpointWriter::add(TensorData tensor) {
  if (finished_) fail("{}: tensor '{}' added after finish()", dir_.string(), tensor.name);
  const std::uint64_t bytes = checked_tensor_bytes(tensor, dir_.string());
  if (!all_names_.insert(tensor.name).second) {
    fail("{}: tensor '{}' is added twice", dir_.string(), tensor.name);
  }
  if (!pending_.empty() && pending_bytes_ + bytes > max_shard_bytes_) {
    flush_pending();
  }
  pending_bytes_ += bytes;
  total_bytes_ += bytes;
  pending_.push_back(std::move(tensor));
}

void ShardedCheckpointWriter::flush_pending() {
  if (written_.empty()) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) fail("cannot create {}: {}", dir_.string(), ec.message());
  }
  const fs::path path = dir_ / fmt::format(".dsv4-shard-{:05}.partial", written_.size() + 1);
  write_safetensors(path, pending_);
  written_.push_back(path);
  std::vector<std::string> names;
  names.reserve(pending_.size());
  for (const TensorData& tensor : pending_) names.push_back(tensor.name);
  shard_names_.push_back(std::move(names));
  pending_.clear();
  pending_bytes_ = 0;
}

void ShardedCheckpointWriter::finish() {
  if (finished_) fail("{}: finish() called twice", dir_.string());
  finished_ = true;
  // An empty checkpoint is a single model.safetensors holding no tensors.
  if (!pending_.empty() || written_.empty()) flush_pending();

  // Remove the previous checkpoint, index first, so a reader never sees an index that
  // points at a mix of old and new shards.
  std::error_code ec;
  fs::remove(dir_ / kIndexFileName, ec);
  if (ec) fail("cannot remove the old {}: {}", (dir_ / kIndexFileName).string(), ec.message());
  std::vector<fs::path> old_files;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == kSingleFileName || is_shard_file_name(name)) old_files.push_back(it->path());
  }
  if (ec) fail("cannot list {}: {}", dir_.string(), ec.message());
  for (const fs::path& path : old_files) {
    fs::remove(path, ec);
    if (ec) fail("cannot remove the old {}: {}", path.string(), ec.message());
  }

  const std::size_t count = written_.size();
  if (count == 1) {
    const fs::path target = dir_ / kSingleFileName;
    fs::rename(written_[0], target, ec);
    if (ec) fail("cannot rename {} to {}: {}", written_[0].string(), target.string(), ec.message());
    written_.clear();
    return;
  }
  Json weight_map = Json::object();
  for (std::size_t k = 0; k < count; ++k) {
    const std::string name = fmt::format("model-{:05}-of-{:05}.safetensors", k + 1, count);
    fs::rename(written_[k], dir_ / name, ec);
    if (ec) fail("cannot rename {} to {}: {}", written_[k].string(), (dir_ / name).string(), ec.message());
    for (const std::string& tensor : shard_names_[k]) weight_map[tensor] = name;
  }
  written_.clear();
  Json index = {{"metadata", {{"total_size", total_bytes_}}}, {"weight_map", std::move(weight_map)}};
  write_text_file(dir_ / kIndexFileName, index.dump(2) + "\n");
}

}  // namespace dsv4
