// The cost of a route (docs/routers.md), element by element: C = c(S) (linear or row softmax), shifted so each
// row's clean maximum is 0, plus the noise alpha * eps, clamped; and the Sinkhorn kernel
// K = clamp((C - max C) / xi, -B, 0). A per-row shift changes neither a top-k nor the Sinkhorn plan,
// and it keeps every value finite. Each element's formula is written once for a double and for a vector
// of doubles (the CPU's lanes: a tile's rows); a row's shifts are sums and maxima in index order.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

#include "ssr/detail/hd.hpp"
#include "ssr/math/exp.hpp"
#include "ssr/math/lanes.hpp"
#include "ssr/math/numeric.hpp"
#include "ssr/spec.hpp"

SSR_LANES_BEGIN
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

// c(S)_ij minus the row's maximum of c(S), for logits s (D: a double or a vector of doubles) with the row's
// top and scale = 1 / sum: s - top (linear), (exp(s - top) - 1) * scale (softmax: softmax(S_i)_j - 1 / sum).
// exp(x, y) sets y = math::exp's value lane by lane.
template <class D, class Exp>
SSR_HD SSR_INLINE void shifted_cost_of(Cost cost, const D& s, const D& top, const D& scale, const Exp& exp, D& out) {
  if (cost == Cost::linear) {
    out = s - top;
    return;
  }
  exp(s - top, out);
  out = (out - 1.0) * scale;
}

SSR_HD inline double shifted_cost(Cost cost, double s, const CostShift& shift) {
  double out;
  shifted_cost_of(
      cost, s, shift.top, 1.0 / shift.sum, [](double x, double& y) { y = math::exp(x); }, out);
  return out;
}

// x = clamp(clamp(shifted cost) + clamp(z)) in [-B, B], B = cost_bound<T>(), in place of the shifted cost;
// z is the noise alpha * eps_ij (noisy: false for none). Each term is clamped before the sum, so that an
// infinite shifted cost (a logit of -DBL_MAX beside one of +DBL_MAX) and an infinite noise (a huge alpha)
// never meet as inf - inf; for terms inside [-B, B] the inner clamps change nothing.
template <class T, int Piece = piece_bytes, class D>
SSR_HD SSR_INLINE void cost_value_of(D& x, bool noisy, const D& z) {
  const D lo = D{} - cost_bound<T>(), hi = D{} + cost_bound<T>();
  clamp_in<Piece>(x, lo, hi);
  if (!noisy) return;
  D noise = z;
  clamp_in<Piece>(noise, lo, hi);
  x = x + noise;
  clamp_in<Piece>(x, lo, hi);
}

template <class T>
SSR_HD double cost_value(double shifted, const double* z) {
  cost_value_of<T>(shifted, z != nullptr, z ? *z : 0.0);
  return shifted;
}

// 1 / xi, or the largest double where that overflows: the kernel multiplies by it, and a zero cost
// difference times it stays 0.
SSR_HD inline double inverse_xi(double xi) { return std::min(1.0 / xi, std::numeric_limits<double>::max()); }

// The kernel's shift of a row: max(-B, max_j x(j)).
template <class T, class Cost_>
SSR_HD double kernel_shift(index_t n, const Cost_& x) {
  double top = -cost_bound<T>();
  for (index_t j = 0; j < n; ++j) top = std::max(top, static_cast<double>(x(j)));
  return top;
}

// K_ij = clamp((x_ij - shift) * (1 / xi), -B, 0): the cost in units of xi, each row's maximum 0, in place of x.
// clamp false leaves the clamp out, for rows where it changes nothing (direct_kernel).
template <class T, int Piece = piece_bytes, class D>
SSR_HD SSR_INLINE void kernel_value_of(D& x, const D& shift, double inv_xi, bool clamp = true) {
  x = (x - shift) * inv_xi;
  if (clamp) clamp_in<Piece>(x, D{} - cost_bound<T>(), D{} + 0.0);
}

// Whether a row's kernel is K_ij = (S_ij - top) * (1 / xi), as kernel_value_of(shifted cost, +0, inv_xi)
// without its clamp: for the linear cost without noise, when the row's largest logit top is not 0 and
// top - bottom (its least) and (top - bottom) / xi are at most B. Then no clamp changes a cost S_ij - top
// in [-(top - bottom), 0] (rounding keeps the order), the largest of them is top - top = +0 (a nonzero
// number less itself), so the kernel's shift is +0, and x - (+0) = x. A NaN logit gives a NaN either way;
// no finite logit (top - bottom NaN or -inf) says no. (Under IEEE gradual underflow: a caller's
// flush-to-zero mode can turn a tiny difference into -0.)
template <class T>
SSR_HD bool direct_kernel(Cost cost, bool noisy, double top, double bottom, double inv_xi) {
  const double range = top - bottom;
  return cost == Cost::linear && !noisy && top != 0 && range >= 0 && range <= cost_bound<T>() &&
         range * inv_xi <= cost_bound<T>();
}

template <class T>
SSR_HD double kernel_value(double x, double shift, double inv_xi) {
  kernel_value_of<T>(x, shift, inv_xi);
  return x;
}

}  // namespace math
}  // namespace ssr
SSR_LANES_END
