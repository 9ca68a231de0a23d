// The Thrust backend's Sinkhorn iteration in the log domain (ssr/math/sinkhorn.hpp): a pass over blocks of
// rows, the column sums in block order, the decision, and the column update. The decision is taken on the
// device and every item after it does nothing, so a caller may queue iterations without reading it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ssr/backend/thrust/tuning.hpp"
#include "ssr/detail/hd.hpp"
#include "ssr/math/sinkhorn.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace thrust_kernels {

// A solve's state in device memory: its statistics so far, and whether it has stopped.
struct SolveState {
  SolveStats stats{};
  std::int32_t done = 0;
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
struct Decide {
  const double* colsum = nullptr;
  SolveState* state = nullptr;
  SinkhornParams params{};
  index_t m = 0, n = 0;

  SSR_HD void operator()(index_t /*item*/) const {
    if (state->done) return;
    const math::ColumnTarget target = math::column_target(m, n);
    double error_sum = 0;
    for (index_t j = 0; j < n; ++j) error_sum += math::column_error(colsum[j], target);
    const double err = math::marginal_error(error_sum, m);
    const int iterations = state->stats.iterations + 1;
    state->stats = SolveStats{iterations, math::converged(err, params) ? 1 : 0, err};
    state->done = math::stop(err, iterations, params) ? 1 : 0;
  }
};

// Column j's next potential: math::next_column_potential, or, where its sum underflowed,
// math::recovered_column_potential over the column's log entries K_ij + f_i.
template <class T>
struct ColumnUpdate {
  const T* logk = nullptr;
  const double* f = nullptr;
  const double* colsum = nullptr;
  double* g = nullptr;
  const SolveState* state = nullptr;
  index_t m = 0, n = 0;

  SSR_HD void operator()(index_t j) const {
    if (state->done) return;
    const math::ColumnTarget target = math::column_target(m, n);
    if (!math::column_underflowed<T>(colsum[j])) {
      g[j] = math::next_column_potential<T>(g[j], colsum[j], target);
    } else {
      const T* kernel = logk;
      const double* rows = f;
      const index_t cols = n;
      const auto entry = [kernel, rows, cols, j](index_t i) {
        return static_cast<double>(kernel[i * cols + j]) + rows[i];
      };
      g[j] = math::recovered_column_potential<T>(m, entry, target);
    }
  }
};

}  // namespace thrust_kernels
}  // namespace ssr
