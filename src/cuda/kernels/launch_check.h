// Argument errors and environment switches of the kernel launchers. The .cu files cannot use fmt
// (nvcc rejects its compile-time format strings), so they report through this plain function:
// each "{}" of `message` is replaced by the next value. Throws dsv4::Error.
#pragma once

#include <initializer_list>
#include <string_view>

namespace dsv4::gpu {

[[noreturn]] void launch_error(const char* message, std::initializer_list<long long> values = {});

// Whether environment variable `name` holds `value` (the opt-in switches such as
// DSV4_GEMM_LIBRARY=1; callers keep the answer in a static).
bool env_is(const char* name, std::string_view value);

}  // namespace dsv4::gpu
