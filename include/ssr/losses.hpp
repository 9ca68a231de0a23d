// The auxiliary losses of the baselines SSR is compared with, and their gradients with respect to the logits.
// Host memory; rows are visited in order, so the sums do not depend on any thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ssr/error.hpp"
#include "ssr/validate.hpp"
#include "ssr/view.hpp"

namespace ssr {

namespace detail {
// Row softmax and log-sum-exp of one row, in double.
template <class T>
double softmax_row(const T* s, index_t n, double* p) {
  double top = -std::numeric_limits<double>::infinity();
  for (index_t j = 0; j < n; ++j) top = std::max(top, static_cast<double>(s[j]));
  double sum = 0;
  for (index_t j = 0; j < n; ++j) sum += (p[j] = std::exp(static_cast<double>(s[j]) - top));
  for (index_t j = 0; j < n; ++j) p[j] /= sum;
  return top + std::log(sum);
}

template <class T>
void require_loss_input(ConstMatrixView<T> logits, MatrixView<T> grad) {
  detail::require(logits.rows >= 1, "logits.rows", logits.rows, "must be at least 1");
  detail::require(logits.cols >= 1, "logits.cols", logits.cols, "must be at least 1");
  require_shape(logits, "logits", logits.rows, logits.cols);
  if (!grad.empty()) require_shape(grad, "grad", logits.rows, logits.cols);
  for (index_t i = 0; i < logits.rows; ++i)
    for (index_t j = 0; j < logits.cols; ++j)
      if (!std::isfinite(logits(i, j))) fail_non_finite_logit(i, j, logits(i, j));
}
}  // namespace detail

// Switch/GShard load-balancing loss n * sum_j f_j P_j: f_j the share of the m*k assignments sent to
// expert j (a constant), P_j the mean router softmax. Writes dL/dS into grad when given.
template <class T>
double load_balancing_loss(ConstMatrixView<T> logits, ConstMatrixView<std::int32_t> experts, MatrixView<T> grad = {}) {
  detail::require_loss_input(logits, grad);
  const index_t m = logits.rows, n = logits.cols;
  detail::require_shape(experts, "experts", m, experts.cols);
  detail::require(experts.cols >= 1 && experts.cols <= n, "experts.cols", experts.cols, "must be in [1, n = ", n, "]");
  std::vector<double> f(static_cast<std::size_t>(n), 0.0), mean_p(static_cast<std::size_t>(n), 0.0),
      p(static_cast<std::size_t>(n));
  for (index_t i = 0; i < m; ++i) {
    for (index_t r = 0; r < experts.cols; ++r) {
      const std::int32_t e = experts(i, r);
      detail::require(e >= 0 && e < n, detail::Indexed{"experts", i, r}, e, "must be in [0, ", n, ")");
      f[static_cast<std::size_t>(e)] += 1.0 / static_cast<double>(m * experts.cols);
    }
  }
  for (index_t i = 0; i < m; ++i) {
    detail::softmax_row(logits.row(i), n, p.data());
    double fp = 0;  // sum_l f_l p_il
    for (index_t j = 0; j < n; ++j) {
      mean_p[static_cast<std::size_t>(j)] += p[static_cast<std::size_t>(j)];
      fp += f[static_cast<std::size_t>(j)] * p[static_cast<std::size_t>(j)];
    }
    if (!grad.empty()) {  // dL/dS_ij = (n/m) p_ij (f_j - sum_l f_l p_il)
      for (index_t j = 0; j < n; ++j)
        grad(i, j) = static_cast<T>(static_cast<double>(n) / static_cast<double>(m) * p[static_cast<std::size_t>(j)] *
                                    (f[static_cast<std::size_t>(j)] - fp));
    }
  }
  double loss = 0;
  for (index_t j = 0; j < n; ++j)
    loss += f[static_cast<std::size_t>(j)] * mean_p[static_cast<std::size_t>(j)] / static_cast<double>(m);
  return static_cast<double>(n) * loss;
}

// ST-MoE router z-loss mean_i (logsumexp_j S_ij)^2. Writes dL/dS = (2/m) lse_i softmax(S_i) into grad when given.
template <class T>
double z_loss(ConstMatrixView<T> logits, MatrixView<T> grad = {}) {
  detail::require_loss_input(logits, grad);
  const index_t m = logits.rows, n = logits.cols;
  std::vector<double> p(static_cast<std::size_t>(n));
  double loss = 0;
  for (index_t i = 0; i < m; ++i) {
    const double lse = detail::softmax_row(logits.row(i), n, p.data());
    loss += lse * lse;
    if (!grad.empty())
      for (index_t j = 0; j < n; ++j)
        grad(i, j) = static_cast<T>(2.0 / static_cast<double>(m) * lse * p[static_cast<std::size_t>(j)]);
  }
  return loss / static_cast<double>(m);
}

}  // namespace ssr
