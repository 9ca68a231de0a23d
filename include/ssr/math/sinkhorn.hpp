// The Sinkhorn iteration of DESIGN section 1 in potentials: the plan is Pi_ij = exp(K_ij + f_i + g_j).
// A row update makes every row sum to 1, a column update every column to m/n; the error after an
// iteration is sum_j |colsum_j - m/n| / m, and the solve stops when it is below tol or after max_iters.
// When ranks share the problem, m is the rows of all of them (RouteSpec::total_rows).
// Backends differ in how they sweep the matrix (log domain, or scaled with absorption) and in
// the order they add the column sums in, never in these definitions.
#pragma once

#include <cmath>

#include "ssr/detail/hd.hpp"
#include "ssr/math/exact_sum.hpp"
#include "ssr/math/numeric.hpp"
#include "ssr/spec.hpp"

namespace ssr {
namespace math {

// What each column of the plan must sum to: m/n, and its log.
struct ColumnTarget {
  double mass;
  double log_mass;
};

SSR_HD inline ColumnTarget column_target(index_t m, index_t n) {
  const double mass = static_cast<double>(m) / static_cast<double>(n);
  return {mass, std::log(mass)};
}

// f_i = -log sum_j exp(K_ij + g_j), entry(j) = K_ij + g_j: row i of the plan then sums to 1.
template <class Entry>
SSR_HD double row_potential(index_t n, const Entry& entry) {
  return -logsumexp(n, entry);
}

// A column sum below the threshold has lost its precision to underflow: recover its potential from the
// log domain instead of scaling it.
template <class T>
SSR_HD bool column_underflowed(double sum) {
  return !(sum >= underflow_threshold<T>());
}

// g_j's next value from column j's plan sum: g_j + (log(m/n) - log(sum)), so the column sums to m/n.
template <class T>
SSR_HD double next_column_potential(double g, double sum, const ColumnTarget& target) {
  return clamp(g + (target.log_mass - std::log(sum)), -potential_bound<T>(), potential_bound<T>());
}

// The same update in the log domain: log(m/n) - lse with lse = logsumexp_i(K_ij + f_i), for a column whose
// sum underflowed, so that a column nobody favours gets its share at once instead of creeping towards it.
template <class T>
SSR_HD double column_potential_from_lse(double lse, const ColumnTarget& target) {
  return clamp(target.log_mass - lse, -potential_bound<T>(), potential_bound<T>());
}

// column_potential_from_lse over the column's m entries, entry(i) = K_ij + f_i.
template <class T, class Entry>
SSR_HD double recovered_column_potential(index_t m, const Entry& entry, const ColumnTarget& target) {
  return column_potential_from_lse<T>(logsumexp(m, entry), target);
}

// Whether a column takes the log-domain update: its sum underflowed, or, when ranks share the problem,
// it lies below what their exact sums resolve well (math/exact_sum.hpp).
template <class T>
SSR_HD bool takes_log_update(double sum, bool distributed) {
  return column_underflowed<T>(sum) || (distributed && sum < exact_sum_floor);
}

// The scaled form (a backend's Q_ij = exp(K_ij + h_j - c_i) and v_j = exp(g_j - h_j)) absorbs g into h once
// some |g_j - h_j| exceeds this, in T: v then stays within exp(+-bound), and Q's row sums, which hold a 1,
// far from T's underflow and overflow.
template <class T>
SSR_HD constexpr double absorb_bound() {
  return sizeof(T) <= sizeof(float) ? 30.0 : 300.0;
}

// Whether h must absorb g, for column potentials g and h both held in T.
template <class T>
SSR_HD bool absorbs(T g, T h) {
  return std::fabs(static_cast<double>(g) - static_cast<double>(h)) > absorb_bound<T>();
}

// The scaling v_j = exp(g_j - h_j) of the scaled form, from g and h in T.
template <class T>
SSR_HD T scaling(T g, T h) {
  return static_cast<T>(std::exp(static_cast<double>(g) - static_cast<double>(h)));
}

// Column j's share of the marginal error, |colsum_j - m/n|; the error is the sum of the shares over m.
SSR_HD inline double column_error(double sum, const ColumnTarget& target) { return std::fabs(sum - target.mass); }

SSR_HD inline double marginal_error(double error_sum, index_t m) { return error_sum / static_cast<double>(m); }

SSR_HD inline bool converged(double err, const SinkhornParams& params) { return err < params.tol; }

// After `iterations` iterations with error err: stop?
SSR_HD inline bool stop(double err, int iterations, const SinkhornParams& params) {
  return converged(err, params) || iterations >= params.max_iters;
}

// The rows the plan's columns are balanced over: the whole problem's, or this call's (m) alone.
SSR_HD inline index_t problem_rows(const RouteSpec& spec, index_t m) {
  return spec.total_rows > 0 ? static_cast<index_t>(spec.total_rows) : m;
}

}  // namespace math
}  // namespace ssr
