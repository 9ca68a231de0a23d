// The Thrust backend's Sinkhorn iteration in the log domain (ssr/math/sinkhorn.hpp): a pass over blocks of
// rows, the column sums in block order, the decision, and the column update; and, for a problem shared by
// ranks, the log-domain columns and the exact sums around the reductions. The decision is taken on the
// device and every item after it does nothing, so a caller may queue iterations without reading it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "ssr/backend/thrust/tuning.hpp"
#include "ssr/detail/hd.hpp"
#include "ssr/math/exact_sum.hpp"
#include "ssr/math/sinkhorn.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace thrust_kernels {

// A solve's state in device memory: its statistics so far, whether it has stopped, and (distributed) how
// many columns take the log-domain update this iteration.
struct SolveState {
  SolveStats stats{};
  std::int32_t done = 0;
  std::int32_t log_columns = 0;
};

// One block of rows of an iteration: each row's potential f_i (math::row_potential) and the block's
// column sums of the plan exp(K + f + g).
template <class T>
struct SinkhornBlock {
  const T* logk = nullptr;
  const double* g = nullptr;
  double* f = nullptr;
  double* partial = nullptr;
  const SolveState* state = nullptr;
  index_t m = 0, n = 0;

  SSR_HD void operator()(index_t b) const {
    if (state->done) return;
    double* part = partial + b * n;
    for (index_t j = 0; j < n; ++j) part[j] = 0;
    const index_t end = std::min(m, (b + 1) * ThrustTuning::block_rows);
    const double* pot = g;
    for (index_t i = b * ThrustTuning::block_rows; i < end; ++i) {
      const T* krow = logk + i * n;
      f[i] = math::row_potential(n, [krow, pot](index_t j) { return static_cast<double>(krow[j]) + pot[j]; });
      for (index_t j = 0; j < n; ++j) part[j] += std::exp(static_cast<double>(krow[j]) + g[j] + f[i]);
    }
  }
};

// Column j's plan sum: its blocks' sums in block order.
struct ColumnSum {
  const double* partial = nullptr;
  double* colsum = nullptr;
  const SolveState* state = nullptr;
  index_t n = 0, blocks = 0;

  SSR_HD void operator()(index_t j) const {
    if (state->done) return;
    double sum = 0;
    for (index_t b = 0; b < blocks; ++b) sum += partial[b * n + j];
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
    state->log_columns = distributed ? log_columns : 0;
  }
};

// Column j's next potential: math::next_column_potential, or where math::takes_log_update the log-domain
// update over this call's m rows (one process; distributed solves leave those columns to LogColumns).
template <class T>
struct ColumnUpdate {
  const T* logk = nullptr;
  const double* f = nullptr;
  const double* colsum = nullptr;
  double* g = nullptr;
  const SolveState* state = nullptr;
  index_t m = 0, rows = 0, n = 0;
  bool distributed = false;

  SSR_HD void operator()(index_t j) const {
    if (state->done) return;
    const math::ColumnTarget target = math::column_target(rows, n);
    if (!math::takes_log_update<T>(colsum[j], distributed)) {
      g[j] = math::next_column_potential<T>(g[j], colsum[j], target);
    } else if (!distributed) {
      const T* kernel = logk;
      const double* row_potentials = f;
      const index_t cols = n;
      const auto entry = [kernel, row_potentials, cols, j](index_t i) {
        return static_cast<double>(kernel[i * cols + j]) + row_potentials[i];
      };
      g[j] = math::recovered_column_potential<T>(m, entry, target);
    }
  }
};

// A distributed solve's log-domain columns, in three steps around two reductions over ranks: each
// flagged column's maximum of K_ij + f_i over this call's rows (Max), then the sum of exp(K_ij + f_i - max)
// below the global maximum (Sum), then the potential (Update). Unflagged columns hold -inf and 0.
template <class T>
struct LogColumns {
  const T* logk = nullptr;
  const double* f = nullptr;
  const double* colsum = nullptr;
  double* column_max = nullptr;
  double* column_sum = nullptr;
  double* g = nullptr;
  index_t m = 0, rows = 0, n = 0;

  SSR_HD bool flagged(index_t j) const { return math::takes_log_update<T>(colsum[j], true); }
  SSR_HD double entry(index_t i, index_t j) const { return static_cast<double>(logk[i * n + j]) + f[i]; }
};

template <class T>
struct LogColumnMax : LogColumns<T> {
  SSR_HD void operator()(index_t j) const {
    double top = -std::numeric_limits<double>::infinity();
    if (this->flagged(j))
      for (index_t i = 0; i < this->m; ++i) top = top < this->entry(i, j) ? this->entry(i, j) : top;
    this->column_max[j] = top;
  }
};

template <class T>
struct LogColumnSum : LogColumns<T> {
  SSR_HD void operator()(index_t j) const {
    double sum = 0;
    if (this->flagged(j))
      for (index_t i = 0; i < this->m; ++i) sum += std::exp(this->entry(i, j) - this->column_max[j]);
    this->column_sum[j] = sum;
  }
};

template <class T>
struct LogColumnUpdate : LogColumns<T> {
  SSR_HD void operator()(index_t j) const {
    if (!this->flagged(j)) return;
    const double lse = this->column_max[j] + std::log(this->column_sum[j]);
    this->g[j] = math::column_potential_from_lse<T>(lse, math::column_target(this->rows, this->n));
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
