// The Thrust backend's Sinkhorn iteration, the scaled form of math/sinkhorn_scaled.hpp a row at a time, in
// the order of its sums, so that it gives the CPU backend's bits: each row's Q (ScaledRows), a pass (each
// row's sum, RowSum, then each block's column lanes, ColumnLane), the column sums in block order, the decision, the
// column update and the scalings (Scale); and, for a problem shared by ranks, the log-domain columns and the exact sums
// around the reductions. The decision is taken on the device and every item after it does nothing, so a caller may
// queue iterations without reading it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "ssr/detail/hd.hpp"
#include "ssr/math/exact_sum.hpp"
#include "ssr/math/lanes.hpp"
#include "ssr/math/sinkhorn.hpp"
#include "ssr/math/sinkhorn_scaled.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace thrust_kernels {

// A solve's state in device memory: its statistics so far, whether it has stopped, whether h has just
// absorbed g, and how many columns take the log-domain update this iteration.
struct SolveState {
  SolveStats stats{};
  std::int32_t done = 0;
  std::int32_t absorb = 1;  // the first Q is computed as an absorption of g = 0
  std::int32_t log_columns = 0;
};

// The solve's arrays: K and Q (m x n), each row's c_i (top), r_i and 1 / r_i, the lanes of each block's
// column shares (lanes: sum_blocks x sum_lanes x n), and per column g (double), g rounded to T, h and v.
template <class T>
struct ScaledSolve {
  const T* logk = nullptr;
  T *q = nullptr, *top = nullptr, *row_sum = nullptr, *inv = nullptr, *lanes = nullptr, *gt = nullptr, *h = nullptr,
    *v = nullptr;
  double* g = nullptr;
  SolveState* state = nullptr;
  index_t m = 0, n = 0;

  // K_ij + f_i, the log-domain column update's entries (f_i from the last pass).
  SSR_HD double entry(index_t i, index_t j) const {
    return static_cast<double>(logk[i * n + j]) + math::row_potential(top[i], row_sum[i]);
  }
};

// Row i's c_i and Q_i from K_i and h, where h has just absorbed g.
template <class T>
struct ScaledRows : ScaledSolve<T> {
  SSR_HD void operator()(index_t i) const {
    if (this->state->done || !this->state->absorb) return;
    const T *k = this->logk + i * this->n, *absorbed = this->h;
    T c;
    math::row_shift_of(
        this->n, [k](index_t j, T& x) { x = k[j]; }, [absorbed](index_t j, T& x) { x = absorbed[j]; }, c);
    for (index_t j = 0; j < this->n; ++j) this->q[i * this->n + j] = math::exp_as<T>((k[j] + absorbed[j]) - c);
    this->top[i] = c;
  }
};

// Row i's r and 1 / r in a pass.
template <class T>
struct RowSum : ScaledSolve<T> {
  SSR_HD void operator()(index_t i) const {
    if (this->state->done) return;
    const T *row = this->q + i * this->n, *scaling = this->v;
    math::row_sum_of(
        this->n, [row](index_t j, T& x) { x = row[j]; }, [scaling](index_t j, T& x) { x = scaling[j]; }, math::Fused{},
        this->row_sum[i]);
    math::inverse_row_sum_of<T>(this->row_sum[i], this->inv[i]);
  }
};

// One lane of a block's share of a column's plan sum: item (b, l, j), j fastest, adds Q_ij (1 / r_i) over
// block b's rows i = l (mod sum_lanes) in order, into lanes[(b * sum_lanes + l) * n + j].
template <class T>
struct ColumnLane : ScaledSolve<T> {
  SSR_HD void operator()(index_t item) const {
    if (this->state->done) return;
    const index_t cols = this->n, j = item % cols, l = item / cols % math::sum_lanes;
    const index_t first = item / cols / math::sum_lanes * math::sum_block_rows(cols);
    const index_t last = std::min(this->m, first + math::sum_block_rows(cols));
    T sum = 0;
    for (index_t i = first + l; i < last; i += math::sum_lanes)
      sum = std::fma(this->q[i * cols + j], this->inv[i], sum);
    this->lanes[item] = sum;
  }
};

// Column j's plan sum: each block's lanes folded, times v_j (the block's share, in T), added in block order
// in double.
template <class T>
struct ColumnSum {
  const T *lanes = nullptr, *v = nullptr;
  double* colsum = nullptr;
  const SolveState* state = nullptr;
  index_t n = 0, blocks = 0;

  SSR_HD void operator()(index_t j) const {
    if (state->done) return;
    double sum = 0;
    for (index_t b = 0; b < blocks; ++b) {
      T lane[math::sum_lanes];
      for (index_t l = 0; l < math::sum_lanes; ++l) lane[l] = lanes[(b * math::sum_lanes + l) * n + j];
      sum += static_cast<double>(math::fold_lanes(lane) * v[j]);
    }
    colsum[j] = sum;
  }
};

// The iteration's error (its column shares added in column order) and the stopping decision: one item.
// rows: the problem's (every rank's); distributed: count the columns that take the log-domain update.
template <class T>
struct Decide {
  const double* colsum = nullptr;
  SolveState* state = nullptr;
  SinkhornParams params{};
  index_t rows = 0, n = 0;
  bool distributed = false;

  SSR_HD void operator()(index_t /*item*/) const {
    if (state->done) return;
    const math::ColumnTarget target = math::column_target(rows, n);
    double error_sum = 0;
    std::int32_t log_columns = 0;
    for (index_t j = 0; j < n; ++j) {
      error_sum += math::column_error(colsum[j], target);
      log_columns += math::takes_log_update<T>(colsum[j], distributed) ? 1 : 0;
    }
    const double err = math::marginal_error(error_sum, rows);
    const int iterations = state->stats.iterations + 1;
    state->stats = SolveStats{iterations, math::converged(err, params) ? 1 : 0, err};
    state->done = math::stop(err, iterations, params) ? 1 : 0;
    state->log_columns = log_columns;
  }
};

// One process's log-domain columns, an item per column and lane (item j * log_lanes + l): lane l of each
// column whose sum underflowed (math::log_lane), which ColumnUpdate then merges.
template <class T>
struct LogLanes : ScaledSolve<T> {
  const double* colsum = nullptr;
  math::LogLane* lanes = nullptr;  // n x log_lanes

  SSR_HD void operator()(index_t item) const {
    const index_t j = item / math::log_lanes;
    if (this->state->done || !math::takes_log_update<T>(colsum[j], false)) return;
    const ScaledSolve<T>& solve = *this;
    lanes[item] = math::log_lane(
        this->m, [&solve, j](index_t i) { return solve.entry(i, j); }, item % math::log_lanes);
  }
};

// Column j's next potential: math::next_column_potential, or where math::takes_log_update the log-domain
// update over this call's m rows from LogLanes' lanes (one process; distributed solves leave those columns
// to LogColumns).
template <class T>
struct ColumnUpdate : ScaledSolve<T> {
  const double* colsum = nullptr;
  index_t rows = 0;
  bool distributed = false;
  math::LogLane* lanes = nullptr;  // n x log_lanes, merged in place

  SSR_HD void operator()(index_t j) const {
    if (this->state->done) return;
    const math::ColumnTarget target = math::column_target(rows, this->n);
    if (!math::takes_log_update<T>(colsum[j], distributed)) {
      this->g[j] = math::next_column_potential<T>(this->g[j], colsum[j], target);
    } else if (!distributed) {
      this->g[j] = math::column_potential_from_lse<T>(math::log_lanes_lse(lanes + j * math::log_lanes), target);
    }
  }
};

// After the column update: g rounded to T, whether h absorbs it, and v: one item.
template <class T>
struct Scale : ScaledSolve<T> {
  SSR_HD void operator()(index_t /*item*/) const {
    if (this->state->done) return;
    bool absorb = false;
    for (index_t j = 0; j < this->n; ++j) {
      this->gt[j] = static_cast<T>(this->g[j]);
      absorb = absorb || math::absorbs(this->gt[j], this->h[j]);
    }
    for (index_t j = 0; j < this->n; ++j) {
      if (absorb) this->h[j] = this->gt[j];
      this->v[j] = math::scaling(this->gt[j], this->h[j]);
    }
    this->state->absorb = absorb ? 1 : 0;
  }
};

// A distributed solve's log-domain columns, in three steps around two reductions over ranks: each
// flagged column's maximum of K_ij + f_i over this call's rows (Max), then the sum of exp(K_ij + f_i - max)
// below the global maximum (Sum), then the potential (Update). Unflagged columns hold -inf and 0.
template <class T>
struct LogColumns : ScaledSolve<T> {
  const double* colsum = nullptr;
  double *column_max = nullptr, *column_sum = nullptr;
  index_t rows = 0;

  SSR_HD bool flagged(index_t j) const { return math::takes_log_update<T>(colsum[j], true); }
  SSR_HD auto column(index_t j) const {
    return [this, j](index_t i) { return this->entry(i, j); };
  }
};

template <class T>
struct LogColumnMax : LogColumns<T> {
  SSR_HD void operator()(index_t j) const {
    this->column_max[j] =
        this->flagged(j) ? math::log_column_max(this->m, this->column(j)) : -std::numeric_limits<double>::infinity();
  }
};

template <class T>
struct LogColumnSum : LogColumns<T> {
  SSR_HD void operator()(index_t j) const {
    this->column_sum[j] = this->flagged(j) ? math::log_column_sum(this->m, this->column(j), this->column_max[j]) : 0.0;
  }
};

template <class T>
struct LogColumnUpdate : LogColumns<T> {
  SSR_HD void operator()(index_t j) const {
    if (!this->flagged(j)) return;
    this->g[j] = math::column_potential_from_halves<T>(this->column_max[j], this->column_sum[j],
                                                       math::column_target(this->rows, this->n));
  }
};

// Exact sums over ranks (math/exact_sum.hpp): values[j] to limbs, and back.
struct ToExact {
  const double* values = nullptr;
  std::int64_t* limbs = nullptr;
  SSR_HD void operator()(index_t j) const { math::to_exact(values[j], limbs + math::exact_limbs * j); }
};

struct FromExact {
  const std::int64_t* limbs = nullptr;
  double* values = nullptr;
  SSR_HD void operator()(index_t j) const { values[j] = math::from_exact(limbs + math::exact_limbs * j); }
};

}  // namespace thrust_kernels
}  // namespace ssr
