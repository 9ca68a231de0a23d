// The Thrust backend's per-token work items (one row each), written with the scalar mathematics of
// ssr/math/: softmax top-k (any selection), the Sinkhorn kernel, the final plan, and backward. The CUDA backend runs
// the same items on its stream where it has no fused kernel.
#pragma once

#include <cmath>
#include <cstdint>

#include "ssr/detail/hd.hpp"
#include "ssr/detail/scalar.hpp"
#include "ssr/math/backward.hpp"
#include "ssr/math/cost.hpp"
#include "ssr/math/noise.hpp"
#include "ssr/math/select.hpp"
#include "ssr/math/topk.hpp"
#include "ssr/math/weights.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace thrust_kernels {

// The cost of row i, element by element without scratch memory (math/cost.hpp with its noise).
template <class In, class T>
struct RowCost {
  const RouteSpec& spec;
  const In* s = nullptr;
  index_t n = 0, row = 0;
  math::CostShift shift{};

  SSR_HD RowCost(const RouteSpec& spec_, const In* s_, index_t n_, index_t row_)
      : spec(spec_),
        s(s_),
        n(n_),
        row(row_),
        shift(math::cost_shift(n_, spec_.cost, [s_](index_t j) { return detail::to_double(s_[j]); })) {}
  // With the row's shift computed elsewhere (math::cost_shift's bits).
  SSR_HD RowCost(const RouteSpec& spec_, const In* s_, index_t n_, index_t row_, math::CostShift shift_)
      : spec(spec_), s(s_), n(n_), row(row_), shift(shift_) {}
  SSR_HD double noise(index_t j) const { return math::noise_value(spec, row, n, j); }
  SSR_HD double operator()(index_t j) const {
    const double z = spec.noisy() ? noise(j) : 0.0;
    return math::cost_value<T>(math::shifted_cost(spec.cost, detail::to_double(s[j]), shift),
                               spec.noisy() ? &z : nullptr);
  }
};

// Softmax top-k of row i: experts, score weights, and the noise when asked.
template <class In, class T>
struct SoftmaxRow {
  RouteSpec spec{};
  ConstMatrixView<In> s{};
  MatrixView<std::int32_t> experts{};
  MatrixView<T> weights{}, noise{};

  SSR_HD void operator()(index_t i) const {
    const In* row = s.row(i);
    std::int32_t* idx = experts.row(i);
    const auto logit = [row](index_t j) { return detail::to_double(row[j]); };
    if (spec.noisy()) {
      math::topk(s.cols, spec.k, idx, RowCost<In, T>(spec, row, s.cols, i));
    } else {
      math::select_row(spec, s.cols, idx, logit);
    }
    T* w = weights.row(i);
    math::score_weights(
        spec.select.score, spec.k, [&](int r) { return logit(idx[r]); },
        [w](int r, double v) { w[r] = static_cast<T>(v); });
    if (!noise.empty()) {
      const RowCost<In, T> cost(spec, row, s.cols, i);
      math::noise_output(
          spec, s.cols, [&cost](index_t j) { return cost.noise(j); }, noise.row(i));
    }
  }
};

// Row i of the Sinkhorn kernel K (math::kernel_value of the row's costs), and the noise when asked.
template <class In, class T>
struct KernelRow {
  RouteSpec spec{};
  ConstMatrixView<In> s{};
  T* logk = nullptr;
  MatrixView<T> noise{};

  SSR_HD void operator()(index_t i) const {
    const index_t n = s.cols;
    const RowCost<In, T> cost(spec, s.row(i), n, i);
    const double shift = math::kernel_shift<T>(n, cost);
    for (index_t j = 0; j < n; ++j)
      logk[i * n + j] = static_cast<T>(math::kernel_value<T>(cost(j), shift, spec.sinkhorn.xi));
    if (!noise.empty())
      math::noise_output(
          spec, n, [&cost](index_t j) { return cost.noise(j); }, noise.row(i));
  }
};

// The weights w[0, k) of a row's chosen experts idx[0, k): the plan's (Pi over the chosen, renormalised), or
// the scores' of the row's logits s.
template <class In, class T, class LogPlan>
SSR_HD void plan_weights(const RouteSpec& spec, const In* s, const std::int32_t* idx, const LogPlan& log_plan, T* w) {
  const auto write = [w](int r, double v) { w[r] = static_cast<T>(v); };
  if (spec.weights == Weights::plan) {
    math::softmax_weights(
        spec.k, [&](int r) { return log_plan(idx[r]); }, write);
  } else {
    math::score_weights(
        spec.select.score, spec.k, [s, idx](int r) { return detail::to_double(s[idx[r]]); }, write);
  }
}

// The final plan of row i, log Pi_ij = K_ij + g_j - logsumexp: top-k by log Pi, plan or score weights,
// and the plan row when asked.
template <class In, class T>
struct PlanRow {
  RouteSpec spec{};
  ConstMatrixView<In> s{};
  const T* logk = nullptr;
  const double* g = nullptr;
  MatrixView<std::int32_t> experts{};
  MatrixView<T> weights{}, plan{};

  SSR_HD void operator()(index_t i) const {
    const index_t n = s.cols;
    const T* krow = logk + i * n;
    const double* pot = g;
    const auto log_plan = [krow, pot](index_t j) { return static_cast<double>(krow[j]) + pot[j]; };
    std::int32_t* idx = experts.row(i);
    math::topk(n, spec.k, idx, log_plan);
    plan_weights(spec, s.row(i), idx, log_plan, weights.row(i));
    if (!plan.empty()) {
      const double lse = math::logsumexp(n, log_plan);
      for (index_t j = 0; j < n; ++j) plan(i, j) = static_cast<T>(std::exp(log_plan(j) - lse));
    }
  }
};

// Row i of dL/dS (math::backward_row): zero, then the chosen experts' entries when the weights pass gradient.
template <class T>
struct Backward {
  MatrixView<const std::int32_t> experts{};
  MatrixView<const T> weights{}, grad_weights{};
  MatrixView<T> grad_logits{};
  bool pass = false;
  Score score = Score::softmax;
  MatrixView<const T> logits{};  // read for sigmoid scores only

  SSR_HD void operator()(index_t i) const {
    T* out = grad_logits.row(i);
    for (index_t j = 0; j < grad_logits.cols; ++j) out[j] = T(0);
    if (!pass) return;
    const std::int32_t* e = experts.row(i);
    const T *w = weights.row(i), *g = grad_weights.row(i);
    const T* s = logits.empty() ? nullptr : logits.row(i);
    math::backward_row(
        score, static_cast<int>(experts.cols), [w](int r) { return w[r]; }, [g](int r) { return g[r]; },
        [s, e](int r) { return s[e[r]]; }, [out, e](int r, double d) { out[e[r]] = static_cast<T>(d); });
  }
};

}  // namespace thrust_kernels
}  // namespace ssr
