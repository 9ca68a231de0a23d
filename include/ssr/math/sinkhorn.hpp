// The Sinkhorn iteration (docs/routers.md) in potentials: the plan is Pi_ij = exp(K_ij + f_i + g_j).
// A row update makes every row sum to 1, a column update every column to m/n; the error after an
// iteration is sum_j |colsum_j - m/n| / m, and the solve stops when it is below tol or after max_iters.
// When ranks share the problem, m is the rows of all of them (RouteSpec::total_rows).
// The sweep itself, in scaled form, and the order of its sums are in sinkhorn_scaled.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

#include "ssr/detail/hd.hpp"
#include "ssr/math/exact_sum.hpp"
#include "ssr/math/exp.hpp"
#include "ssr/math/log.hpp"
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
  return {mass, math::log(mass)};
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
  return clamp(g + (target.log_mass - math::log(sum)), -potential_bound<T>(), potential_bound<T>());
}

// The same update in the log domain: log(m/n) - lse with lse = logsumexp_i(K_ij + f_i), for a column whose
// sum underflowed, so that a column nobody favours gets its share at once instead of creeping towards it.
template <class T>
SSR_HD double column_potential_from_lse(double lse, const ColumnTarget& target) {
  return clamp(target.log_mass - lse, -potential_bound<T>(), potential_bound<T>());
}

// The two halves of a column's logsumexp where ranks share the problem, so that they can reduce each (the
// maxima, then the sums below the common maximum): max_i entry(i), and sum_i exp(entry(i) - top) in row
// order, over this rank's `count` rows.
template <class Entry>
SSR_HD double log_column_max(index_t count, const Entry& entry) {
  double top = -std::numeric_limits<double>::infinity();
  for (index_t i = 0; i < count; ++i) top = std::max(top, static_cast<double>(entry(i)));
  return top;
}
template <class Entry>
SSR_HD double log_column_sum(index_t count, const Entry& entry, double top) {
  double sum = 0;
  for (index_t i = 0; i < count; ++i) sum += math::exp(static_cast<double>(entry(i)) - top);
  return sum;
}

// The log-domain update from a column's halves: top + log(sum) is its logsumexp.
template <class T>
SSR_HD double column_potential_from_halves(double top, double sum, const ColumnTarget& target) {
  return column_potential_from_lse<T>(top + math::log(sum), target);
}

// One process's log-domain column in the order every backend keeps, so that a GPU can spread a column over
// log_lanes threads and still give the host's bits: lane l takes the rows l, l + log_lanes, ... in row
// order, their maximum and the sum of exp(entry - maximum); then the lanes merge pairwise (lane l takes
// lane l + h for h = log_lanes / 2, ..., 1), each sum rescaled to the larger maximum.
constexpr index_t log_lanes = 256;

struct LogLane {
  double top;  // the lane's maximum entry; -inf when it has none
  double sum;  // sum of exp(entry - top) over the lane's rows
};

template <class Entry>
SSR_HD LogLane log_lane(index_t count, const Entry& entry, index_t lane) {
  LogLane x{-std::numeric_limits<double>::infinity(), 0.0};
  for (index_t i = lane; i < count; i += log_lanes) x.top = std::max(x.top, static_cast<double>(entry(i)));
  if (x.top == -std::numeric_limits<double>::infinity()) return x;  // exp(-inf - -inf) would be NaN
  for (index_t i = lane; i < count; i += log_lanes) x.sum += math::exp(static_cast<double>(entry(i)) - x.top);
  return x;
}

SSR_HD inline LogLane merge_log_lanes(const LogLane& a, const LogLane& b) {
  const double top = std::max(a.top, b.top);
  if (top == -std::numeric_limits<double>::infinity()) return a;
  const double from_a = a.sum == 0 ? 0.0 : a.sum * math::exp(a.top - top);
  const double from_b = b.sum == 0 ? 0.0 : b.sum * math::exp(b.top - top);
  return {top, from_a + from_b};
}

// The column's logsumexp from its log_lanes lanes, merged in place.
SSR_HD inline double log_lanes_lse(LogLane* lanes) {
  for (index_t h = log_lanes / 2; h >= 1; h /= 2)
    for (index_t l = 0; l < h; ++l) lanes[l] = merge_log_lanes(lanes[l], lanes[l + h]);
  return lanes[0].top + math::log(lanes[0].sum);
}

// column_potential_from_lse over the column's m entries, entry(i) = K_ij + f_i (one process).
template <class T, class Entry>
SSR_HD double recovered_column_potential(index_t m, const Entry& entry, const ColumnTarget& target) {
  LogLane lanes[log_lanes];
  for (index_t l = 0; l < log_lanes; ++l) lanes[l] = log_lane(m, entry, l);
  return column_potential_from_lse<T>(log_lanes_lse(lanes), target);
}

// Whether a column takes the log-domain update: its sum underflowed, or, when ranks share the problem,
// it lies below what their exact sums resolve well (math/exact_sum.hpp).
template <class T>
SSR_HD bool takes_log_update(double sum, bool distributed) {
  return column_underflowed<T>(sum) || (distributed && sum < exact_sum_floor);
}

// Column j's share of the marginal error, |colsum_j - m/n|; the error is the sum of the shares over m.
SSR_HD inline double column_error(double sum, const ColumnTarget& target) { return std::fabs(sum - target.mass); }

SSR_HD inline double marginal_error(double error_sum, index_t m) { return error_sum / static_cast<double>(m); }

SSR_HD inline bool converged(double err, const SinkhornParams& params) { return err < params.tol; }

// After `iterations` iterations with error err: stop? A NaN error (from NaN logits, routed unchecked)
// stops at once: its NaN column sums make every later one NaN.
SSR_HD inline bool stop(double err, int iterations, const SinkhornParams& params) {
  return converged(err, params) || iterations >= params.max_iters || err != err;
}

// The rows the plan's columns are balanced over: the whole problem's, or this call's (m) alone.
SSR_HD inline index_t problem_rows(const RouteSpec& spec, index_t m) {
  return spec.total_rows > 0 ? static_cast<index_t>(spec.total_rows) : m;
}

}  // namespace math
}  // namespace ssr
