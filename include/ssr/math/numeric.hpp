// The numeric building blocks of the routing mathematics: the bounds that keep every value finite, the
// finiteness test and clamping. Host and device functions, computing in double.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

#include "ssr/detail/hd.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace math {

// Costs are clamped to [-cost_bound, cost_bound]: far enough inside T's range that potentials built
// from them stay finite, far enough out that no realistic logit reaches it.
template <class T>
SSR_HD constexpr double cost_bound() {
  return static_cast<double>(std::numeric_limits<T>::max()) / 1024;
}

// Column potentials are clamped to [-potential_bound, potential_bound].
template <class T>
SSR_HD constexpr double potential_bound() {
  return 2 * cost_bound<T>();
}

// A plan value or column sum below this has lost precision to underflow (sqrt of T's smallest normal:
// 2^-63 for float, 2^-511 for double, both exact in either type).
template <class T>
SSR_HD inline double underflow_threshold() {
  return std::sqrt(static_cast<double>(std::numeric_limits<T>::min()));
}

SSR_HD inline double clamp(double v, double lo, double hi) { return std::min(std::max(v, lo), hi); }

// x - x is 0 for finite x and NaN for NaN and +-inf: a test that no compiler flag folds away.
template <class V>
SSR_HD bool is_finite(V x) {
  return x - x == V(0);  // NOLINT(misc-redundant-expression): the test itself
}

}  // namespace math
}  // namespace ssr
