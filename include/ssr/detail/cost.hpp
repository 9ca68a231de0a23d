// The cost of one token's row: c(S_i), shifted so its maximum is 0, plus the noise alpha * eps.
// A per-row shift changes neither the top-k nor the Sinkhorn plan, and it keeps every value finite.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "ssr/detail/hd.hpp"
#include "ssr/random.hpp"
#include "ssr/spec.hpp"

namespace ssr {
namespace detail {

// Costs are clamped to [-bound, bound], far enough inside T's range that the Sinkhorn potentials
// built from them stay finite, and far enough out that no realistic logit reaches it.
template <class T>
SSR_HD constexpr double cost_bound() {
  return static_cast<double>(std::numeric_limits<T>::max()) / 1024;
}

SSR_HD inline double clamp(double v, double lo, double hi) { return std::min(std::max(v, lo), hi); }

// alpha * eps for the n elements of row `row`, element (row, j) being number row * n + j of the stream.
inline void noise_row(const RouteSpec& spec, index_t row, index_t n, double* z) {
  const double scale = spec.noise_alpha * spec.noise_sigma;
  const std::uint64_t first = static_cast<std::uint64_t>(row) * static_cast<std::uint64_t>(n);
  double block[4];
  std::uint64_t loaded = ~std::uint64_t{0};
  for (index_t j = 0; j < n; ++j) {
    const std::uint64_t e = first + static_cast<std::uint64_t>(j);
    if ((e >> 2) != loaded) {
      loaded = e >> 2;
      random::normals4(spec.seed, spec.layer, spec.step, loaded, block);
    }
    z[j] = scale * block[e & 3u];
  }
}

// x_j = clamp(c(S)_j - max_l c(S)_l + z_j) for one row, in double. z may be null (no noise).
template <class T>
void cost_row(const T* s, index_t n, Cost cost, const double* z, double* x) {
  const double bound = cost_bound<T>();
  double top = -std::numeric_limits<double>::infinity();
  for (index_t j = 0; j < n; ++j) top = std::max(top, static_cast<double>(s[j]));
  if (cost == Cost::linear) {
    for (index_t j = 0; j < n; ++j) x[j] = static_cast<double>(s[j]) - top;
  } else {
    double sum = 0;
    for (index_t j = 0; j < n; ++j) sum += (x[j] = std::exp(static_cast<double>(s[j]) - top));
    for (index_t j = 0; j < n; ++j) x[j] = x[j] / sum - 1.0 / sum;  // softmax minus its maximum 1/sum
  }
  for (index_t j = 0; j < n; ++j) x[j] = clamp(z ? x[j] + z[j] : x[j], -bound, bound);
}

// Sinkhorn kernel row K_j = clamp((x_j - max x) / xi, -bound, 0): the cost in units of xi, maximum 0.
template <class T>
void kernel_row(const double* x, index_t n, double xi, T* k) {
  const double bound = cost_bound<T>();
  double top = -bound;
  for (index_t j = 0; j < n; ++j) top = std::max(top, x[j]);
  for (index_t j = 0; j < n; ++j) k[j] = static_cast<T>(clamp((x[j] - top) / xi, -bound, 0.0));
}

// The same cost, element by element without scratch memory, for backends where each row is one thread:
// x(j) equals cost_row's x[j] bit for bit.
template <class T>
struct RowCost {
  const T* s;
  index_t n;
  index_t row;
  RouteSpec spec;
  double top = 0, sum = 1;

  SSR_HD RowCost(const T* s_, index_t n_, index_t row_, const RouteSpec& spec_) : s(s_), n(n_), row(row_), spec(spec_) {
    top = -std::numeric_limits<double>::infinity();
    for (index_t j = 0; j < n; ++j) top = std::max(top, static_cast<double>(s[j]));
    if (spec.cost == Cost::softmax) {
      sum = 0;
      for (index_t j = 0; j < n; ++j) sum += std::exp(static_cast<double>(s[j]) - top);
    }
  }
  // alpha * eps of element (row, j).
  SSR_HD double noise(index_t j) const {
    return spec.noise_alpha * spec.noise_sigma *
           random::normal(spec.seed, spec.layer, spec.step, static_cast<std::uint64_t>(row) * static_cast<std::uint64_t>(n) + static_cast<std::uint64_t>(j));
  }
  SSR_HD double operator()(index_t j) const {
    const double c = spec.cost == Cost::linear ? static_cast<double>(s[j]) - top
                                                : std::exp(static_cast<double>(s[j]) - top) / sum - 1.0 / sum;
    const double bound = cost_bound<T>();
    return clamp(spec.noisy() ? c + noise(j) : c, -bound, bound);
  }
};

}  // namespace detail
}  // namespace ssr
