#include "cpu/rope_bf16.h"

#include "numerics/bf16.h"

namespace dsv4 {

void rope_heads_bf16(std::span<float> x, std::int64_t head_dim, const RopeTable& rope, std::int64_t position,
                     bool inverse) {
  const auto hd = static_cast<std::size_t>(head_dim);
  rope.apply_heads(x, hd, position, inverse);  // validates the sizes
  const auto rd = static_cast<std::size_t>(rope.rope_dim());
  for (std::size_t h = 0; h < x.size(); h += hd) {
    for (std::size_t k = h + hd - rd; k < h + hd; ++k) x[k] = round_to_bf16(x[k]);
  }
}

}  // namespace dsv4
