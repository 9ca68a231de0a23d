// Routing weights of one token over its k chosen experts, normalised in double, written once for a
// double and for a vector of doubles (the CPU's lanes: a tile's rows).
// Score weights: the scores s(S) over the chosen experts divided by their sum (the softmax of the logits
// for softmax scores). Plan weights (SSR, Proposition 1): the plan's row restricted to the chosen experts
// and renormalised, from plan values or from log Pi.
#pragma once

#include <limits>

#include "ssr/detail/hd.hpp"
#include "ssr/math/exp.hpp"
#include "ssr/math/lanes.hpp"
#include "ssr/math/select.hpp"
#include "ssr/spec.hpp"

SSR_LANES_BEGIN
namespace ssr {
namespace math {

// out(r, w_r) with w_r = exp(v_r - max) / sum_l exp(v_l - max), r in [0, k), summed in order: v(r, x) sets x
// to v_r, the r-th chosen expert's logit (score weights) or log-plan value (plan weights), a D (a double or a
// vector of doubles); exp(x, y) sets y = math::exp's value lane by lane.
template <class D, int Piece = piece_bytes, class Value, class Out, class Exp>
SSR_HD SSR_INLINE void softmax_weights_of(int k, const Value& v, const Out& out, const Exp& exp) {
  D top = D{} - std::numeric_limits<double>::infinity(), x;
  for (int r = 0; r < k; ++r) {
    v(r, x);
    raise_to<Piece>(top, x);
  }
  // The first terms are kept, so the common k take one exp each.
  constexpr int kept = 8;
  D term[kept], sum = D{}, e;
  for (int r = 0; r < k; ++r) {
    v(r, x);
    exp(x - top, e);
    if (r < kept) term[r] = e;
    sum = sum + e;
  }
  for (int r = 0; r < k; ++r) {
    if (r < kept) {
      e = term[r];
    } else {
      v(r, x);
      exp(x - top, e);
    }
    out(r, D(e / sum));
  }
}

// out(r, p_r / sum_l p_l): plan weights from the chosen experts' plan values, p(r, x) setting x to p_r.
template <class D, class Value, class Out>
SSR_HD SSR_INLINE void normalised_weights_of(int k, const Value& p, const Out& out) {
  D sum = D{}, x;
  for (int r = 0; r < k; ++r) {
    p(r, x);
    sum = sum + x;
  }
  for (int r = 0; r < k; ++r) {
    p(r, x);
    out(r, D(x / sum));
  }
}

// exp(x, y) for scalars: y = math::exp(x).
struct ExpScalar {
  SSR_HD void operator()(double x, double& y) const { y = math::exp(x); }
};

template <class Value, class Out>
SSR_HD void softmax_weights(int k, const Value& v, const Out& out) {
  softmax_weights_of<double>(
      k, [&](int r, double& x) { x = static_cast<double>(v(r)); }, out, ExpScalar{});
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
  normalised_weights_of<double>(
      k, [&](int r, double& x) { x = static_cast<double>(p(r)); }, out);
}

}  // namespace math
}  // namespace ssr
SSR_LANES_END
