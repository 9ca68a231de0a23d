// One token's routing composed from the definitions of math/: the softmax path's experts and weights, the
// Sinkhorn kernel's row, and a row's outputs from a solve's last pass. Backends that go a row at a time run
// these (the Thrust backend, the CPU's rows beyond its tiles); the CPU's tiles run the same definitions in
// lanes, and the tests hold every backend to them.
#pragma once

#include <cstdint>

#include "ssr/detail/hd.hpp"
#include "ssr/detail/scalar.hpp"
#include "ssr/math/cost.hpp"
#include "ssr/math/exp.hpp"
#include "ssr/math/noise.hpp"
#include "ssr/math/numeric.hpp"
#include "ssr/math/select.hpp"
#include "ssr/math/sinkhorn_scaled.hpp"
#include "ssr/math/topk.hpp"
#include "ssr/math/weights.hpp"
#include "ssr/spec.hpp"

namespace ssr {
namespace math {

// The cost of element j of a row (logits s): cost_value of shifted_cost with the row's shift, plus the
// noise z(j) (a RowNoise) where the call draws it.
template <class T, class In>
SSR_HD double row_cost(const RouteSpec& spec, const In* s, const CostShift& shift, const RowNoise& z, index_t j) {
  const double shifted = shifted_cost(spec.cost, detail::to_double(s[j]), shift);
  if (!spec.noisy()) return cost_value<T>(shifted, nullptr);
  const double noise = z(j);
  return cost_value<T>(shifted, &noise);
}

// The softmax path of the call's row `row`: experts idx[0, k) (top-k of the noisy cost where the call
// draws noise, else select_row with the context's expert bias), their score weights w, and the noise output
// (null: not asked).
template <class T, class In>
SSR_HD void softmax_row(const RouteSpec& spec, const Context& ctx, const In* s, index_t row, index_t n,
                        std::int32_t* idx, T* w, T* noise) {
  const auto logit = [s](index_t j) { return detail::to_double(s[j]); };
  const RowNoise z(spec, ctx, row, n);
  if (spec.noisy()) {
    const CostShift shift = cost_shift(n, spec.cost, logit);
    topk(n, spec.k, idx, [&](index_t j) { return row_cost<T>(spec, s, shift, z, j); });
  } else {
    select_row(spec, ctx.expert_bias.data, n, idx, logit);
  }
  score_weights(
      spec.select.score, spec.k, [&](int r) { return logit(idx[r]); },
      [w](int r, double v) { w[r] = static_cast<T>(v); });
  if (noise) noise_output(spec, n, z, noise);
}

// Row `row` of the Sinkhorn kernel K (kernel_value of the row's costs) into k, and the noise output: two
// passes over the row (its kernel shift, then K and the noise), each drawing the noise once.
template <class T, class In>
SSR_HD void kernel_row(const RouteSpec& spec, const Context& ctx, const In* s, index_t row, index_t n, T* k, T* noise) {
  const CostShift shift = cost_shift(n, spec.cost, [s](index_t j) { return detail::to_double(s[j]); });
  const RowNoise z(spec, ctx, row, n);
  const auto cost = [&](index_t j) { return row_cost<T>(spec, s, shift, z, j); };
  const double kshift = kernel_shift<T>(n, cost), inv_xi = inverse_xi(spec.sinkhorn.xi);
  for (index_t j = 0; j < n; ++j) {
    const double x = cost(j);
    k[j] = static_cast<T>(kernel_value<T>(x, kshift, inv_xi));
    if (noise) noise[j] = noise_output_at<T>(spec, z, j);  // z(j) of the block cost(j) has just drawn
  }
}

// A row's outputs from a solve's last pass (sinkhorn_scaled.hpp), its plan row being t_j / r with
// t_j = Q_j v_j: experts idx, the top-k of t; weights w, t's over the chosen (plan weights) or the scores'
// of the logits s; and the plan t_j (1 / r) where asked (plan not null). q(j), k(j): Q and K of the row;
// v, gt: the scaling and g as rounded to T. Where a chosen expert's Q is below the underflow threshold,
// the values near it have lost precision and could tie, so the row is routed in the log domain instead,
// where the ranking is exact: a_j = K_j + g_j, top-k of a, e_j = exp(a_j - max a), weights e's over the
// chosen, plan e_j / sum_l e_l.
template <class T, class In, class Q, class K>
SSR_HD void solved_row(const RouteSpec& spec, index_t n, const Q& q, const K& k, const T* v, const T* gt, T r,
                       const In* s, std::int32_t* idx, T* w, T* plan) {
  const auto write = [w](int e, double value) { w[e] = static_cast<T>(value); };
  const auto t = [&](index_t j) { return static_cast<T>(q(j) * v[j]); };
  topk(n, spec.k, idx, t);
  bool exact = true;
  for (int e = 0; e < spec.k; ++e) exact = exact && q(idx[e]) >= static_cast<T>(underflow_threshold<T>());
  const auto a = [&](index_t j) { return static_cast<double>(k(j)) + static_cast<double>(gt[j]); };
  if (!exact) topk(n, spec.k, idx, a);
  const double top = exact ? 0.0 : a(idx[0]);
  const auto e = [&](index_t j) { return math::exp(a(j) - top); };
  if (spec.weights == Weights::scores) {
    score_weights(
        spec.select.score, spec.k, [&](int c) { return detail::to_double(s[idx[c]]); }, write);
  } else if (exact) {
    normalised_weights(
        spec.k, [&](int c) { return t(idx[c]); }, write);
  } else {
    normalised_weights(
        spec.k, [&](int c) { return e(idx[c]); }, write);
  }
  if (!plan) return;
  if (exact) {
    const T inv = inverse_row_sum(r);
    for (index_t j = 0; j < n; ++j) plan[j] = t(j) * inv;
    return;
  }
  double sum = 0;
  for (index_t j = 0; j < n; ++j) sum += e(j);
  for (index_t j = 0; j < n; ++j) plan[j] = static_cast<T>(e(j) / sum);
}

}  // namespace math
}  // namespace ssr
