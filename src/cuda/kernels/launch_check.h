// Argument errors of the kernel launchers. The .cu files cannot use fmt (nvcc rejects its
// compile-time format strings), so they report through this plain function: each "{}" of
// `message` is replaced by the next value. Throws dsv4::Error.
#pragma once

#include <initializer_list>

namespace dsv4::gpu {

[[noreturn]] void launch_error(const char* message, std::initializer_list<long long> values = {});

}  // namespace dsv4::gpu
