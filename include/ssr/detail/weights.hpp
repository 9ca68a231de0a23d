// Routing weights of one token from its chosen experts, normalised in double.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "ssr/detail/hd.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace detail {

// Softmax of the scores v over the chosen experts: w_r = exp(v_r - max) / sum.
template <class V, class T>
SSR_HD void softmax_weights(const V* v, const std::int32_t* idx, index_t k, T* w) {
  double top = -std::numeric_limits<double>::infinity();
  for (index_t r = 0; r < k; ++r) top = std::max(top, static_cast<double>(v[idx[r]]));
  double sum = 0;
  for (index_t r = 0; r < k; ++r) sum += std::exp(static_cast<double>(v[idx[r]]) - top);
  for (index_t r = 0; r < k; ++r) w[r] = static_cast<T>(std::exp(static_cast<double>(v[idx[r]]) - top) / sum);
}

// The plan's row restricted to the chosen experts and renormalised: the KL-optimal weights (Proposition 1).
template <class T>
SSR_HD void plan_weights(const T* p, const std::int32_t* idx, index_t k, T* w) {
  double sum = 0;
  for (index_t r = 0; r < k; ++r) sum += p[idx[r]];
  for (index_t r = 0; r < k; ++r) w[r] = static_cast<T>(p[idx[r]] / sum);
}

}  // namespace detail
}  // namespace ssr
