// launch_error and env_is (launch_check.h).
#include "cuda/kernels/launch_check.h"

#include <cstdlib>
#include <string>

#include "common/error.h"

namespace dsv4::gpu {

void launch_error(const char* message, std::initializer_list<long long> values) {
  std::string text;
  auto next = values.begin();
  for (const char* p = message; *p != '\0'; ++p) {
    if (p[0] == '{' && p[1] == '}' && next != values.end()) {
      text += std::to_string(*next++);
      ++p;
    } else {
      text += *p;
    }
  }
  throw Error(text);
}

bool env_is(const char* name, std::string_view value) {
  const char* env = std::getenv(name);
  return env != nullptr && std::string_view(env) == value;
}

}  // namespace dsv4::gpu
