// The Thrust backend's per-token work items (one row each), the scalar mathematics of ssr/math/ (rows.hpp):
// softmax top-k (any selection), the Sinkhorn kernel, a solve's outputs, and backward. The CUDA backend runs
// the same items on its stream where it has no fused kernel.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "ssr/context.hpp"
#include "ssr/detail/hd.hpp"
#include "ssr/detail/scalar.hpp"
#include "ssr/math/backward.hpp"
#include "ssr/math/cost.hpp"
#include "ssr/math/noise.hpp"
#include "ssr/math/rows.hpp"
#include "ssr/math/select.hpp"
#include "ssr/math/sinkhorn.hpp"
#include "ssr/math/topk.hpp"
#include "ssr/math/weights.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace thrust_kernels {

// Softmax top-k of row i (math::softmax_row): experts, score weights, and the noise when asked.
template <class In, class T>
struct SoftmaxRow {
  RouteSpec spec{};
  Context ctx{};
  ConstMatrixView<In> s{};
  MatrixView<std::int32_t> experts{};
  MatrixView<T> weights{}, noise{};

  SSR_HD void operator()(index_t i) const {
    math::softmax_row<T>(spec, ctx, s.row(i), i, s.cols, experts.row(i), weights.row(i),
                         noise.empty() ? nullptr : noise.row(i));
  }
};

// Row i of the Sinkhorn kernel K (math::kernel_row), and the noise when asked.
template <class In, class T>
struct KernelRow {
  RouteSpec spec{};
  Context ctx{};
  ConstMatrixView<In> s{};
  T* logk = nullptr;
  MatrixView<T> noise{};

  SSR_HD void operator()(index_t i) const {
    math::kernel_row<T>(spec, ctx, s.row(i), i, s.cols, logk + i * s.cols, noise.empty() ? nullptr : noise.row(i));
  }
};

// Row i's outputs from the last pass of a scaled solve (math::solved_row).
template <class In, class T>
struct SolvedRow {
  RouteSpec spec{};
  ConstMatrixView<In> s{};
  const T *logk = nullptr, *q = nullptr, *v = nullptr, *gt = nullptr, *row_sum = nullptr;
  MatrixView<std::int32_t> experts{};
  MatrixView<T> weights{}, plan{};

  SSR_HD void operator()(index_t i) const {
    const index_t n = s.cols;
    const T *qi = q + i * n, *ki = logk + i * n;
    math::solved_row<T>(
        spec, n, [qi](index_t j) { return qi[j]; }, [ki](index_t j) { return ki[j]; }, v, gt, row_sum[i], s.row(i),
        experts.row(i), weights.row(i), plan.empty() ? nullptr : plan.row(i));
  }
};

// Row i of dL/dS (math::backward_row): zero, then the chosen experts' entries (math::write_slot) when the
// weights pass gradient; NaN where the row names an expert outside [0, n).
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
    if (!math::experts_in_range(e, static_cast<int>(experts.cols), grad_logits.cols)) {
      for (index_t j = 0; j < grad_logits.cols; ++j) out[j] = std::numeric_limits<T>::quiet_NaN();
      return;
    }
    const T *w = weights.row(i), *g = grad_weights.row(i);
    const T* s = logits.empty() ? nullptr : logits.row(i);
    math::backward_row(
        score, static_cast<int>(experts.cols), [w](int r) { return w[r]; }, [g](int r) { return g[r]; },
        [s, e](int r) { return s[e[r]]; }, [out, e](int r, double d) { math::write_slot(out[e[r]], d); });
  }
};

}  // namespace thrust_kernels
}  // namespace ssr
