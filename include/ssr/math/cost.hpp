// The cost of DESIGN section 1, element by element: C = c(S) (linear or row softmax), shifted so each
// row's clean maximum is 0, plus the noise alpha * eps, clamped; and the Sinkhorn kernel
// K = clamp((C - max C) / xi, -B, 0). A per-row shift changes neither a top-k nor the Sinkhorn plan,
// and it keeps every value finite.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

#include "ssr/detail/hd.hpp"
#include "ssr/math/exp.hpp"
#include "ssr/math/numeric.hpp"
#include "ssr/spec.hpp"

namespace ssr {
namespace math {

// What a row's cost is shifted by: its largest logit, and for the softmax cost the normaliser
// sum_j exp(S_ij - top) (1 for the linear cost). The softmax's exp is math::exp, the same bits everywhere.
struct CostShift {
  double top;
  double sum;
};

// s(j) is logit j of the row, as a double; summed in index order.
template <class Logit>
SSR_HD CostShift cost_shift(index_t n, Cost cost, const Logit& s) {
  CostShift shift{-std::numeric_limits<double>::infinity(), 1.0};
  for (index_t j = 0; j < n; ++j) shift.top = std::max(shift.top, static_cast<double>(s(j)));
  if (cost == Cost::softmax) {
    shift.sum = 0;
    for (index_t j = 0; j < n; ++j) shift.sum += math::exp(static_cast<double>(s(j)) - shift.top);
  }
  return shift;
}

// c(S)_ij minus the row's maximum of c(S): S_ij - top (linear), softmax(S_i)_j - 1/sum (softmax).
SSR_HD inline double shifted_cost(Cost cost, double s, const CostShift& shift) {
  return cost == Cost::linear ? s - shift.top : math::exp(s - shift.top) / shift.sum - 1.0 / shift.sum;
}

// x_ij = clamp(clamp(shifted cost) + clamp(z)) in [-B, B], B = cost_bound<T>(); z is the noise
// alpha * eps_ij, null for none. Each term is clamped before the sum, so that an infinite shifted cost
// (a logit of -DBL_MAX beside one of +DBL_MAX) and an infinite noise (a huge alpha) never meet as
// inf - inf; for terms inside [-B, B] the inner clamps change nothing.
template <class T>
SSR_HD double cost_value(double shifted, const double* z) {
  const double b = cost_bound<T>(), c = clamp(shifted, -b, b);
  return z ? clamp(c + clamp(*z, -b, b), -b, b) : c;
}

// The kernel's shift of a row: max(-B, max_j x(j)).
template <class T, class Cost_>
SSR_HD double kernel_shift(index_t n, const Cost_& x) {
  double top = -cost_bound<T>();
  for (index_t j = 0; j < n; ++j) top = std::max(top, static_cast<double>(x(j)));
  return top;
}

// K_ij = clamp((x_ij - shift) / xi, -B, 0): the cost in units of xi, each row's maximum 0.
template <class T>
SSR_HD double kernel_value(double x, double shift, double xi) {
  return clamp((x - shift) / xi, -cost_bound<T>(), 0.0);
}

// The whole row, as the definitions above compose: x[j] = cost_value<T>(shifted_cost(S_ij)) with noise z
// (null: none), for a backend with scratch for a row. s(j) is logit j.
template <class T, class Logit>
SSR_HD void cost_row(index_t n, Cost cost, const Logit& s, const double* z, double* x) {
  const CostShift shift = cost_shift(n, cost, s);
  for (index_t j = 0; j < n; ++j)
    x[j] = cost_value<T>(shifted_cost(cost, static_cast<double>(s(j)), shift), z ? z + j : nullptr);
}

// k[j] = kernel_value<T>(x[j], kernel_shift<T>(x), xi) for a row of costs x.
template <class T, class Out>
SSR_HD void kernel_row(index_t n, const double* x, double xi, Out* kernel) {
  const double shift = kernel_shift<T>(n, [x](index_t j) { return x[j]; });
  for (index_t j = 0; j < n; ++j) kernel[j] = static_cast<Out>(kernel_value<T>(x[j], shift, xi));
}

}  // namespace math
}  // namespace ssr
