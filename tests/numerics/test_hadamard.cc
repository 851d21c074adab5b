// Orthonormal fast Walsh-Hadamard transform in Sylvester order.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "numerics/hadamard.h"

namespace dsv4 {
namespace {

std::vector<float> random_vector(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

// Explicit Sylvester matrix entry: H[i][j] = (-1)^popcount(i & j) / sqrt(n).
double sylvester(std::size_t i, std::size_t j, std::size_t n) {
  return (std::popcount(i & j) % 2 == 0 ? 1.0 : -1.0) / std::sqrt(static_cast<double>(n));
}

TEST(Hadamard, MatchesSylvesterMatrixProduct) {
  for (std::size_t n = 2; n <= 128; n *= 2) {
    const std::vector<float> x = random_vector(n, static_cast<std::uint32_t>(n));
    std::vector<float> y = x;
    hadamard_transform(y);
    for (std::size_t i = 0; i < n; ++i) {
      double expect = 0;
      for (std::size_t j = 0; j < n; ++j) expect += sylvester(i, j, n) * x[j];
      EXPECT_NEAR(y[i], expect, 2e-6) << "n " << n << " row " << i;
    }
  }
}

TEST(Hadamard, SmallCasesByHand) {
  std::vector<float> x = {3.0f, 1.0f};
  hadamard_transform(x);
  EXPECT_FLOAT_EQ(x[0], 4.0f / std::sqrt(2.0f));
  EXPECT_FLOAT_EQ(x[1], 2.0f / std::sqrt(2.0f));
  std::vector<float> y = {1.0f, 2.0f, 3.0f, 4.0f};  // H4 rows: ++++, +-+-, ++--, +--+
  hadamard_transform(y);
  EXPECT_FLOAT_EQ(y[0], 5.0f);
  EXPECT_FLOAT_EQ(y[1], -1.0f);
  EXPECT_FLOAT_EQ(y[2], -2.0f);
  EXPECT_FLOAT_EQ(y[3], 0.0f);
  std::vector<float> one = {7.0f};
  hadamard_transform(one);
  EXPECT_EQ(one[0], 7.0f);
}

TEST(Hadamard, RowsOrthonormalForN128) {
  // Transforming basis vectors e_j gives the columns (= rows, H is symmetric) of the matrix.
  const std::size_t n = 128;
  std::vector<std::vector<float>> rows(n, std::vector<float>(n, 0.0f));
  for (std::size_t j = 0; j < n; ++j) {
    rows[j][j] = 1.0f;
    hadamard_transform(rows[j]);
    for (std::size_t i = 0; i < n; ++i) ASSERT_NEAR(rows[j][i], sylvester(i, j, n), 1e-7);
  }
  for (std::size_t a = 0; a < n; ++a) {
    for (std::size_t b = a; b < n; ++b) {
      double dot = 0;
      for (std::size_t i = 0; i < n; ++i) dot += static_cast<double>(rows[a][i]) * rows[b][i];
      EXPECT_NEAR(dot, a == b ? 1.0 : 0.0, 1e-6) << a << "," << b;
    }
  }
}

TEST(Hadamard, PreservesNormAndIsItsOwnInverse) {
  for (std::size_t n : {1u, 2u, 16u, 64u, 128u, 1024u}) {
    const std::vector<float> x = random_vector(n, 77);
    std::vector<float> y = x;
    hadamard_transform(y);
    double nx = 0, ny = 0;
    for (std::size_t i = 0; i < n; ++i) {
      nx += static_cast<double>(x[i]) * x[i];
      ny += static_cast<double>(y[i]) * y[i];
    }
    EXPECT_NEAR(std::sqrt(ny), std::sqrt(nx), 1e-5 * std::sqrt(nx)) << n;
    if (n > 1) {
      EXPECT_NE(y, x);
    }
    hadamard_transform(y);
    for (std::size_t i = 0; i < n; ++i) EXPECT_NEAR(y[i], x[i], 1e-6) << n << " " << i;
  }
}

TEST(Hadamard, RejectsNonPowersOfTwo) {
  for (std::size_t n : {0u, 3u, 6u, 96u, 129u}) {
    std::vector<float> x(n, 1.0f);
    EXPECT_THROW(hadamard_transform(x), std::invalid_argument) << n;
  }
}

}  // namespace
}  // namespace dsv4
