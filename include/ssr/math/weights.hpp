// Routing weights of one token over its k chosen experts, normalised in double.
// Score weights: the scores s(S) over the chosen experts divided by their sum (the softmax of the logits
// for softmax scores). Plan weights (SSR, Proposition 1): the plan's row restricted to the chosen experts
// and renormalised, from plan values or from log Pi.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

#include "ssr/detail/hd.hpp"
#include "ssr/math/exp.hpp"
#include "ssr/math/select.hpp"
#include "ssr/spec.hpp"

namespace ssr {
namespace math {

// out(r, w_r) with w_r = exp(v(r) - max) / sum_l exp(v(l) - max), r in [0, k): v(r) is the r-th chosen
// expert's logit (score weights) or log-plan value (plan weights). exp is math::exp, the same bits on
// every backend and in the CPU's vectors.
template <class Value, class Out>
SSR_HD void softmax_weights(int k, const Value& v, const Out& out) {
  double top = -std::numeric_limits<double>::infinity();
  for (int r = 0; r < k; ++r) top = std::max(top, static_cast<double>(v(r)));
  // The first terms are kept, so the common k take one exp each.
  constexpr int kept = 8;
  double term[kept];
  double sum = 0;
  for (int r = 0; r < k; ++r) {
    const double d = static_cast<double>(v(r)) - top;
    const double e = d == 0 ? 1.0 : math::exp(d);  // exp(0) is 1: the largest term needs no call
    if (r < kept) term[r] = e;
    sum += e;
  }
  for (int r = 0; r < k; ++r) out(r, (r < kept ? term[r] : math::exp(static_cast<double>(v(r)) - top)) / sum);
}

// Score weights: out(r, s_r / sum_l s_l), s_r = s(logit(r)) of the r-th chosen expert, as the softmax of
// log s (finite where s itself would underflow).
template <class Logit, class Out>
SSR_HD void score_weights(Score score, int k, const Logit& logit, const Out& out) {
  softmax_weights(
      k, [&](int r) { return log_score(score, static_cast<double>(logit(r))); }, out);
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
