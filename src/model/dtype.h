// Tensor element types found in V4 checkpoints, with their safetensors names and sizes.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string_view>

namespace dsv4 {

enum class DType { kF32, kF16, kBF16, kF8E4M3, kF8E8M0, kI8, kU8, kI32, kI64 };

std::string_view dtype_name(DType t);                         // "F32", "BF16", "F8_E4M3", ...
std::optional<DType> dtype_from_name(std::string_view name);  // nullopt for unknown names
std::size_t dtype_size(DType t);                              // bytes per element
bool dtype_is_float(DType t);                                 // F32, F16, BF16
std::span<const DType> all_dtypes();                          // every DType, in enum order

}  // namespace dsv4
