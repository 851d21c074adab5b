// Rotary position embedding on the last `rope_dim` (64) dims of a head, interleaved pairs
// (dims 2i, 2i+1 rotate together), with optional YaRN frequency scaling (SPEC.md 3.7).
//
// Precision follows the reference (DeepSeek-V4 inference/model.py precompute_freqs_cis and
// apply_rotary_emb), which works in fp32 throughout:
//   inv_freq_i = 1 / base^(fp32(2i) / rope_dim)   (fp32 tensor ops)
//   YaRN: smooth = 1 - ramp, inv_freq = inv_freq / factor * (1 - smooth) + inv_freq * smooth (fp32)
//   angle = fp32(position) * inv_freq_i            (torch.outer of int64 positions with an fp32
//                                                  table promotes to fp32)
//   cos/sin of the fp32 angle (torch.polar, complex64), complex multiply in fp32.
// So at large positions the angle carries fp32 rounding (e.g. ~0.03 rad at 1e6); that is
// intended. Only the correction range (low, high) is computed in double (Python math.log).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace dsv4 {

struct RopeParams {
  int rope_dim = 64;
  double base = 10000.0;
  bool yarn = false;        // compressed layers: true
  double factor = 1.0;      // rope_scaling.factor
  double original_max_position = 0;  // rope_scaling.original_max_position_embeddings
  double beta_fast = 32.0;
  double beta_slow = 1.0;
};

// YaRN correction range: low = floor(corr(beta_fast)), high = ceil(corr(beta_slow)),
// corr(n) = rope_dim * ln(L0 / (n * 2 pi)) / (2 ln base), computed in double. Clamped like the
// reference: low = max(low, 0), high = min(high, rope_dim - 1) (for every real config both lie in
// [0, rope_dim - 1]). Requires original_max_position > 0 and positive betas.
struct YarnRange {
  int low = 0;
  int high = 0;
};
YarnRange yarn_correction_range(const RopeParams& params);

class RopeTable {
 public:
  // Throws std::invalid_argument for rope_dim not positive and even, base <= 1, or (with
  // yarn) factor <= 0, original_max_position <= 0, or non-positive betas.
  explicit RopeTable(const RopeParams& params);

  int rope_dim() const { return rope_dim_; }
  // inv_freq[i], i < rope_dim/2, after YaRN blending when enabled.
  std::span<const float> inv_freq() const { return inv_freq_; }

  // cos and sin of fp32(position) * inv_freq[i], each rope_dim/2 long.
  void cos_sin(std::int64_t position, std::span<float> cos, std::span<float> sin) const;

  // Rotates x[0..rope_dim) in place by the angle of `position` (inverse: by its conjugate).
  // x.size() must equal rope_dim (pass the head's rope slice); position must be >= 0.
  void apply(std::span<float> x, std::int64_t position, bool inverse = false) const;

  // x holds consecutive heads of head_dim (>= rope_dim) values; rotates the last rope_dim dims
  // of every head at the same position (cos/sin computed once).
  void apply_heads(std::span<float> x, std::size_t head_dim, std::int64_t position,
                   bool inverse = false) const;

 private:
  int rope_dim_;
  std::vector<float> inv_freq_;
};

}  // namespace dsv4
