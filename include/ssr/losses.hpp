// The auxiliary losses of the baselines SSR is compared with, and their gradients with respect to the logits:
// the balancing losses (Switch/GShard per batch, global-batch, DeepSeek-V3 per sequence), which share one
// term, and the z-loss. Host memory; rows are visited in order, so the sums do not depend on any thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ssr/call.hpp"
#include "ssr/communicator.hpp"
#include "ssr/error.hpp"
#include "ssr/math/select.hpp"
#include "ssr/spec.hpp"
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

namespace detail {
// The normalised scores of one row, p_j = s(S_j) / sum_l s(S_l) (the softmax for softmax scores), in double:
// the softmax of log s, as score weights take it, finite where every sigmoid of a row underflows.
template <class T>
void normalised_scores(const T* s, index_t n, Score score, double* p) {
  for (index_t j = 0; j < n; ++j) p[j] = math::log_score(score, static_cast<double>(s[j]));
  softmax_row(p, n, p);  // in place: each element is read before it is written
}

// The term every balancing loss is made of, over rows [begin, end): sum_i sum_j f_j p_ij, f a constant.
// Writes its gradient times scale into those rows of grad when given:
// scale * p_ij * d log s / dS_ij * (f_j - sum_l f_l p_il) (the last factor but one is 1 for softmax scores).
template <class T>
double balance_term(ConstMatrixView<T> logits, index_t begin, index_t end, const std::vector<double>& f, Score score,
                    double scale, MatrixView<T> grad) {
  const index_t n = logits.cols;
  std::vector<double> p(static_cast<std::size_t>(n));
  double term = 0;
  for (index_t i = begin; i < end; ++i) {
    normalised_scores(logits.row(i), n, score, p.data());
    double fp = 0;  // sum_l f_l p_il
    for (index_t j = 0; j < n; ++j) fp += f[static_cast<std::size_t>(j)] * p[static_cast<std::size_t>(j)];
    term += fp;
    if (grad.empty()) continue;
    for (index_t j = 0; j < n; ++j) {
      const auto u = static_cast<std::size_t>(j);
      const double slope = math::log_score_slope(score, static_cast<double>(logits(i, j)));
      grad(i, j) = static_cast<T>(scale * p[u] * slope * (f[u] - fp));
    }
  }
  return term;
}

// Each expert's assignments among rows [begin, end) of experts, checked to lie in [0, n).
inline std::vector<double> expert_counts(ConstMatrixView<std::int32_t> experts, index_t begin, index_t end, index_t n) {
  std::vector<double> count(static_cast<std::size_t>(n), 0.0);
  for (index_t i = begin; i < end; ++i) {
    for (index_t r = 0; r < experts.cols; ++r) {
      const std::int32_t e = experts(i, r);
      require(e >= 0 && e < n, Indexed{"experts", i, r}, e, "must be in [0, ", n, ")");
      count[static_cast<std::size_t>(e)] += 1;
    }
  }
  return count;
}

template <class T>
void require_experts(ConstMatrixView<T> logits, ConstMatrixView<std::int32_t> experts) {
  require(experts.cols >= 1 && experts.cols <= logits.cols, "experts.cols", experts.cols,
          "must be in [1, n = ", logits.cols, "]");
  require_shape(experts, "experts", logits.rows, experts.cols);
}
}  // namespace detail

// Switch/GShard load-balancing loss n * sum_j f_j P_j: f_j the share of the m*k assignments sent to
// expert j (a constant), P_j the mean normalised score (the router softmax for softmax scores). Writes
// dL/dS into grad when given.
template <class T>
double load_balancing_loss(ConstMatrixView<T> logits, ConstMatrixView<std::int32_t> experts, MatrixView<T> grad = {},
                           Score score = Score::softmax) {
  detail::require_loss_input(logits, grad);
  detail::require_experts(logits, experts);
  const index_t m = logits.rows, n = logits.cols;
  std::vector<double> f = detail::expert_counts(experts, 0, m, n);
  for (double& x : f) x /= static_cast<double>(m * experts.cols);
  const double scale = static_cast<double>(n) / static_cast<double>(m);
  return scale * detail::balance_term(logits, 0, m, f, score, scale, grad);
}

// The global-batch load-balancing loss (Qwen, Megatron-LM's global auxiliary loss): n * sum_j f_j P_j with
// f_j = counts_j / (k * tokens) from the assignments of the whole batch, over micro-batches (the caller's
// counts) and ranks (summed here when ranks are given: every rank calls it together), and P_j the mean
// normalised score of this call's tokens. Writes dL/dS into grad when given.
template <class T, class Count>
double global_load_balancing_loss(ConstMatrixView<T> logits, VectorView<const Count> counts, std::int64_t tokens, int k,
                                  MatrixView<T> grad = {}, Score score = Score::softmax,
                                  const Communicator<HostStream>* ranks = nullptr) {
  const index_t m = logits.rows, n = logits.cols;
  const auto checks = [&] {
    detail::require_loss_input(logits, grad);
    detail::require_size(counts, "counts", n);
    detail::require(k >= 1 && k <= n, "k", k, "must be in [1, n = ", n, "]");
    detail::require(tokens >= 0, "tokens", tokens, "must be >= 0");
    for (index_t j = 0; j < n; ++j)
      detail::require(counts[j] >= 0, detail::Indexed{"counts", j}, counts[j], "must be >= 0");
  };
  if (ranks) {
    agree(*ranks, HostStream{}, 0, checks, {static_cast<std::uint64_t>(n), "numbers of experts"});
  } else {
    checks();
  }
  std::vector<std::int64_t> global(static_cast<std::size_t>(n) + 1);  // once the ranks agree on n
  for (index_t j = 0; j < n; ++j) global[static_cast<std::size_t>(j)] = static_cast<std::int64_t>(counts[j]);
  global[static_cast<std::size_t>(n)] = tokens;
  if (ranks) ranks->sum_on_host(global.data(), global.size(), HostStream{});
  const std::int64_t all_tokens = global[static_cast<std::size_t>(n)];
  detail::require(all_tokens >= 1, "tokens", all_tokens, "summed over the batch must be at least 1");
  std::vector<double> f(static_cast<std::size_t>(n));
  for (index_t j = 0; j < n; ++j)
    f[static_cast<std::size_t>(j)] = static_cast<double>(global[static_cast<std::size_t>(j)]) /
                                     (static_cast<double>(k) * static_cast<double>(all_tokens));
  const double scale = static_cast<double>(n) / static_cast<double>(m);
  return scale * detail::balance_term(logits, 0, m, f, score, scale, grad);
}

// DeepSeek-V3's sequence-wise balance loss, averaged over the m / seq_len sequences of consecutive rows:
// per sequence alpha * sum_j f_j P_j with f_j = n / (k * seq_len) * the sequence's assignments to expert j
// and P_j the sequence's mean normalised score. Writes dL/dS into grad when given.
template <class T>
double sequence_balance_loss(ConstMatrixView<T> logits, ConstMatrixView<std::int32_t> experts, index_t seq_len,
                             double alpha, MatrixView<T> grad = {}, Score score = Score::softmax) {
  detail::require_loss_input(logits, grad);
  detail::require_experts(logits, experts);
  const index_t m = logits.rows, n = logits.cols, k = experts.cols;
  detail::require(seq_len >= 1 && m % seq_len == 0, "seq_len", seq_len, "must be >= 1 and divide the rows m = ", m);
  detail::require(std::isfinite(alpha) && alpha >= 0, "alpha", alpha, "must be finite and >= 0");
  const index_t sequences = m / seq_len;
  // Each sequence's term carries alpha / seq_len (P's mean) and 1 / sequences (the mean over sequences).
  const double scale = alpha / static_cast<double>(m);
  double loss = 0;
  for (index_t q = 0; q < sequences; ++q) {
    const index_t begin = q * seq_len, end = begin + seq_len;
    std::vector<double> f = detail::expert_counts(experts, begin, end, n);
    for (double& x : f) x *= static_cast<double>(n) / static_cast<double>(k * seq_len);
    loss += scale * detail::balance_term(logits, begin, end, f, score, scale, grad);
  }
  return loss;
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
