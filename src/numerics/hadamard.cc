#include "numerics/hadamard.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace dsv4 {

void hadamard_transform(std::span<float> x) {
  const std::size_t n = x.size();
  if (n == 0 || (n & (n - 1)) != 0) {
    throw std::invalid_argument("hadamard_transform: size must be a power of two, got " +
                                std::to_string(n));
  }
  // Butterflies over strides 1, 2, 4, ...: natural (Sylvester) order.
  for (std::size_t h = 1; h < n; h *= 2) {
    for (std::size_t i = 0; i < n; i += 2 * h) {
      for (std::size_t j = i; j < i + h; ++j) {
        const float a = x[j];
        const float b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  for (float& v : x) v *= scale;
}

}  // namespace dsv4
