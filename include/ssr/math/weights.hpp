// Routing weights of one token over its k chosen experts, normalised in double.
// Score weights: the softmax of the logits over the chosen experts. Plan weights (SSR, Proposition 1):
// the plan's row restricted to the chosen experts and renormalised, from plan values or from log Pi.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

#include "ssr/detail/hd.hpp"

namespace ssr {
namespace math {

// out(r, w_r) with w_r = exp(v(r) - max) / sum_l exp(v(l) - max), r in [0, k): v(r) is the r-th chosen
// expert's logit (score weights) or log-plan value (plan weights).
template <class Value, class Out>
SSR_HD void softmax_weights(int k, const Value& v, const Out& out) {
  double top = -std::numeric_limits<double>::infinity();
  for (int r = 0; r < k; ++r) top = std::max(top, static_cast<double>(v(r)));
  double sum = 0;
  for (int r = 0; r < k; ++r) sum += std::exp(static_cast<double>(v(r)) - top);
  for (int r = 0; r < k; ++r) out(r, std::exp(static_cast<double>(v(r)) - top) / sum);
}

// out(r, p(r) / sum_l p(l)): plan weights from the chosen experts' plan values.
template <class Value, class Out>
SSR_HD void normalised_weights(int k, const Value& p, const Out& out) {
  double sum = 0;
  for (int r = 0; r < k; ++r) sum += static_cast<double>(p(r));
  for (int r = 0; r < k; ++r) out(r, static_cast<double>(p(r)) / sum);
}

}  // namespace math
}  // namespace ssr
