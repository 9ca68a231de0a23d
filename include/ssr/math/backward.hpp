// The gradient of a route (docs/routers.md): dL/dS from dL/dw for one token. With score weights (softmax path,
// S-BASE) dL/dS_ij = w_ij (g_ij - sum_r w_ir g_ir) on the chosen experts and 0 elsewhere, times
// d log s / dS_ij for sigmoid scores (1 - sigmoid(S_ij)); plan weights pass no gradient (the paper's
// stop-gradient), so their dL/dS is 0. Noise, bias and the choice of experts are constants.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ssr/detail/hd.hpp"
#include "ssr/math/numeric.hpp"
#include "ssr/math/select.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace math {

// out(r, dL/dS at the r-th chosen expert) for r in [0, k), w(r) and g(r) its weight and dL/dw, logit(r)
// its logit (read for sigmoid scores only). An expert a row names twice is two terms of its weights'
// normalisation: the caller adds the outputs of its slots (write_slot).
template <class W, class G, class Logit, class Out>
SSR_HD void backward_row(Score score, int k, const W& w, const G& g, const Logit& logit, const Out& out) {
  double dot = 0;
  for (int r = 0; r < k; ++r) dot += static_cast<double>(w(r)) * static_cast<double>(g(r));
  if (!is_finite(dot)) {
    // A convex combination of finite g whose sum rounded past the largest double (found by fuzz_route):
    // again in units of max |g|, clamped to the bound the combination has, [-max |g|, max |g|].
    double top = 0;
    for (int r = 0; r < k; ++r) top = std::max(top, std::fabs(static_cast<double>(g(r))));
    double scaled = 0;
    for (int r = 0; r < k; ++r) scaled += static_cast<double>(w(r)) * (static_cast<double>(g(r)) / top);
    dot = clamp(scaled, -1.0, 1.0) * top;
  }
  // slope (w g) - slope (w dot), not w (g - dot): with weights and slopes in [0, 1] every product is
  // finite for finite g and dot, where g - dot may overflow and a zero weight (or a slope that underflowed
  // to zero) would make 0 * inf a NaN (found by fuzz_route).
  for (int r = 0; r < k; ++r) {
    const auto wr = static_cast<double>(w(r));
    const double slope = score == Score::softmax ? 1.0 : log_score_slope(score, static_cast<double>(logit(r)));
    out(r, slope * (wr * static_cast<double>(g(r))) - slope * (wr * dot));
  }
}

// Writes a slot's dL/dS d into its zeroed row entry o: d rounded once (its sign of zero too) for an expert's
// first slot, added to the entry for a slot repeating an expert (assigned onto a zero total: the same value).
template <class T>
SSR_HD void write_slot(T& o, double d) {
  o = o == T(0) ? static_cast<T>(d) : static_cast<T>(static_cast<double>(o) + d);
}

// Whether a row's k experts all lie in [0, n): where one does not (an unchecked call's), the backends give
// the row NaN gradients rather than read or write outside it.
SSR_HD inline bool experts_in_range(const std::int32_t* e, int k, index_t n) {
  for (int r = 0; r < k; ++r)
    if (e[r] < 0 || e[r] >= n) return false;
  return true;
}

// An assignment backward can use: its expert in [0, n), its weight and gradient finite.
template <class V>
SSR_HD bool valid_assignment(std::int32_t expert, index_t n, V weight, V grad) {
  return expert >= 0 && expert < n && is_finite(weight) && is_finite(grad);
}

}  // namespace math
}  // namespace ssr
