// The dtype table: safetensors names (exactly as the Python library writes them) and sizes.
#include "model/dtype.h"

#include <array>

namespace dsv4 {
namespace {

struct DTypeInfo {
  DType type;
  std::string_view name;
  std::size_t size;
  bool is_float;
};

// F8_E8M0 (UE8M0 block scales) is "float" only in the exponent sense; it is not one of the
// dtypes a loader may substitute for bf16/fp32 weights, so dtype_is_float is false for it.
constexpr std::array<DTypeInfo, 9> kDTypes{{
    {DType::kF32, "F32", 4, true},
    {DType::kF16, "F16", 2, true},
    {DType::kBF16, "BF16", 2, true},
    {DType::kF8E4M3, "F8_E4M3", 1, false},
    {DType::kF8E8M0, "F8_E8M0", 1, false},
    {DType::kI8, "I8", 1, false},
    {DType::kU8, "U8", 1, false},
    {DType::kI32, "I32", 4, false},
    {DType::kI64, "I64", 8, false},
}};

const DTypeInfo& info(DType t) {
  for (const auto& entry : kDTypes) {
    if (entry.type == t) return entry;
  }
  return kDTypes[0];  // unreachable for valid enum values
}

}  // namespace

std::string_view dtype_name(DType t) { return info(t).name; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& entry : kDTypes) {
    if (entry.name == name) return entry.type;
  }
  return std::nullopt;
}

std::size_t dtype_size(DType t) { return info(t).size; }

bool dtype_is_float(DType t) { return info(t).is_float; }

std::span<const DType> all_dtypes() {
  static constexpr std::array<DType, kDTypes.size()> kAll = [] {
    std::array<DType, kDTypes.size()> all{};
    for (std::size_t i = 0; i < kDTypes.size(); ++i) all[i] = kDTypes[i].type;
    return all;
  }();
  return kAll;
}

}  // namespace dsv4
