// The CPU Sinkhorn solver: stabilised scaling with absorption into log-domain potentials.
//
// The plan is Pi_ij = exp(K_ij + f_i + g_j), K = cost / xi with each row's maximum at 0. The solver keeps
// Q_ij = exp(K_ij + h_j - c_i) for an absorbed copy h of g and c_i = max_j (K_ij + h_j), and the scaling
// v = exp(g - h), so an iteration needs no exp: for each row, t = Q_i * v, r = sum t, the row's plan is
// t / r (row sum exactly 1, f_i = -(c_i + log r)), and t / r goes straight into the column sums, which give
// both the error and the next g. One pass over Q.
// Q <= 1 with a 1 in every row, and v stays within exp(+-bound): when some |g_j - h_j| grows past the
// bound, h absorbs g and Q is recomputed (one exp pass). So r never overflows or underflows. A column
// whose sum underflows is summed in the log domain: g_j = log(m/n) - logsumexp_i(K_ij + f_i).
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "ssr/backend/cpu_tuning.hpp"
#include "ssr/detail/aligned.hpp"
#include "ssr/detail/cost.hpp"
#include "ssr/detail/parallel.hpp"
#include "ssr/detail/topk.hpp"
#include "ssr/detail/weights.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {

template <class T>
class CpuSinkhorn {
 public:
  std::size_t workspace_bytes() const {
    return (logk_.capacity() + q_.capacity() + v_.capacity() + gt_.capacity() + ht_.capacity() + partial_.capacity() +
            scratch_.capacity() + row_top_.capacity() + row_sum_.capacity()) * sizeof(T) +
           (g_.capacity() + colsum_.capacity() + xbuf_.capacity()) * sizeof(double);
  }

  void solve(const RouteSpec& spec, ConstMatrixView<T> s, const RouteOutputs<T>& out, RouteInfo& info, int nt) {
    const index_t m = s.rows, n = s.cols, np = CpuTuning::padded(n);
    const index_t rows = CpuTuning::rows_per_block(n), blocks = (m + rows - 1) / rows;
    const auto mp = static_cast<std::size_t>(m * np), npz = static_cast<std::size_t>(np);
    T* logk = logk_.reserve(mp);
    T* q = q_.reserve(mp);
    T* v = v_.reserve(npz);
    T* gt = gt_.reserve(npz);  // g rounded to T: what both paths use
    T* ht = ht_.reserve(npz);  // h, the absorbed part of g
    T* partial = partial_.reserve(static_cast<std::size_t>(blocks * n));
    T* scratch = scratch_.reserve(3 * npz * static_cast<std::size_t>(nt));  // rows t, e and part per thread
    T* row_top = row_top_.reserve(static_cast<std::size_t>(m));  // c_i; f_i = -(row_top_i + log row_sum_i)
    T* row_sum = row_sum_.reserve(static_cast<std::size_t>(m));
    double* g = g_.reserve(static_cast<std::size_t>(n));
    double* colsum = colsum_.reserve(static_cast<std::size_t>(n));
    double* xbuf = xbuf_.reserve(static_cast<std::size_t>(2 * n * nt));
    std::fill(g, g + n, 0.0);
    std::fill(gt, gt + np, T(0));
    std::fill(ht, ht + np, T(0));
    std::fill(v, v + n, T(1));
    std::fill(v + n, v + np, T(0));  // padding: t = Q * v is 0 there

    const double target = static_cast<double>(m) / static_cast<double>(n);
    // Below this a sum has lost precision to underflow, and the log domain takes over.
    const T tiny = static_cast<T>(std::sqrt(static_cast<double>(std::numeric_limits<T>::min())));
    bool done = false, absorb = false;
    int iterations = 0;
    double err = 0;

    SSR_OMP(parallel num_threads(nt))
    {
      const int tid = detail::thread_id();
      T* t_buf = scratch + 3 * tid * np;
      T* e_buf = t_buf + np;
      T* p_buf = e_buf + np;
      double* x = xbuf + 2 * n * tid;
      double* z = x + n;

      // K = cost / xi, padded with -inf; Q = exp(K) (h = 0, c = 0).
      SSR_OMP(for schedule(static))
      for (index_t i = 0; i < m; ++i) {
        if (spec.noisy()) detail::noise_row(spec, i, n, z);
        detail::cost_row(s.row(i), n, spec.cost, spec.noisy() ? z : nullptr, x);
        T* krow = logk + i * np;
        detail::kernel_row(x, n, spec.sinkhorn.xi, krow);
        std::fill(krow + n, krow + np, -std::numeric_limits<T>::infinity());
        Aligned<Row>(q + i * np, 1, np) = Aligned<const Row>(krow, 1, np).exp();
        row_top[i] = T(0);
        if (!out.noise.empty()) {
          T* d = out.noise.row(i);
          for (index_t j = 0; j < n; ++j) d[j] = spec.noisy() ? static_cast<T>(z[j]) : T(0);
        }
      }

      // Row i in the log domain: a = K_i + g into t_buf, e = exp(a - max a) into e_buf; returns the sum
      // of e over the real columns, and max a in top.
      auto log_row = [&](index_t i, T& top) -> T {
        Aligned<Row> a(t_buf, 1, np), e(e_buf, 1, np);
        a = Aligned<const Row>(logk + i * np, 1, np) + Aligned<const Row>(gt, 1, np);
        top = a.maxCoeff();
        e = (a - top).exp();
        return e.head(n).sum();
      };

      for (;;) {
        if (absorb) {
          SSR_OMP(for schedule(static))
          for (index_t i = 0; i < m; ++i) {
            Aligned<Row> a(t_buf, 1, np);
            a = Aligned<const Row>(logk + i * np, 1, np) + Aligned<const Row>(ht, 1, np);
            row_top[i] = a.maxCoeff();
            Aligned<Row>(q + i * np, 1, np) = (a - row_top[i]).exp();
          }
        }
        SSR_OMP(for schedule(static))
        for (index_t b = 0; b < blocks; ++b) {
          Aligned<Row> part(p_buf, 1, np), t(t_buf, 1, np);
          part.setZero();
          for (index_t i = b * rows; i < std::min(m, (b + 1) * rows); ++i) {
            t = Aligned<const Row>(q + i * np, 1, np) * Aligned<const Row>(v, 1, np);
            const T r = t.sum();  // >= exp(-bound): Q has a 1 in the row
            part += t * (T(1) / r);
            row_sum[i] = r;
          }
          std::copy(p_buf, p_buf + n, partial + b * n);
        }
        SSR_OMP(single)
        {
          ++iterations;
          std::fill(colsum, colsum + n, 0.0);
          for (index_t b = 0; b < blocks; ++b)
            for (index_t j = 0; j < n; ++j) colsum[j] += partial[b * n + j];
          err = 0;
          for (index_t j = 0; j < n; ++j) err += std::abs(colsum[j] - target);
          err /= static_cast<double>(m);
          done = err < spec.sinkhorn.tol || iterations >= spec.sinkhorn.max_iters;
          if (!done) absorb = update_columns(logk, np, row_top, row_sum, m, n, target, tiny, colsum, g, gt, ht, v);
        }
        if (done) break;
      }

      // The plan of the last pass, in the log domain: its top-k, weights and, when asked, the plan itself.
      SSR_OMP(for schedule(static))
      for (index_t i = 0; i < m; ++i) {
        T top;
        const T sum = log_row(i, top);
        std::int32_t* idx = out.experts.row(i);
        detail::topk_row(t_buf, n, spec.k, idx);  // ranking by log Pi: exact where Pi would tie
        if (spec.weights == Weights::plan) {
          detail::plan_weights(e_buf, idx, spec.k, out.weights.row(i));
        } else {
          detail::softmax_weights(s.row(i), idx, spec.k, out.weights.row(i));
        }
        if (!out.plan.empty()) {
          T* p = out.plan.row(i);
          const T inv = T(1) / sum;
          for (index_t j = 0; j < n; ++j) p[j] = e_buf[j] * inv;
        }
      }
    }
    info.iterations = iterations;
    info.marginal_error = err;
    info.converged = err < spec.sinkhorn.tol;
  }

 private:
  using Row = Eigen::Array<T, 1, Eigen::Dynamic>;
  template <class A>
  using Aligned = Eigen::Map<A, Eigen::Aligned64>;

  // g_j += log(m/n) - log(column sum j), which makes every column sum m/n; a column whose sum underflowed
  // gets g_j = log(m/n) - logsumexp_i(K_ij + f_i) instead. Then gt and v follow; returns true when h
  // absorbed g, so Q must be recomputed.
  static bool update_columns(const T* logk, index_t np, const T* row_top, const T* row_sum, index_t m, index_t n,
                             double target, T tiny, const double* colsum, double* g, T* gt, T* ht, T* v) {
    const double log_target = std::log(target), bound = detail::cost_bound<T>();
    for (index_t j = 0; j < n; ++j) {
      if (colsum[j] >= static_cast<double>(tiny)) {
        g[j] += log_target - std::log(colsum[j]);
        continue;
      }
      auto log_entry = [&](index_t i) {  // K_ij + f_i
        return static_cast<double>(logk[i * np + j]) - static_cast<double>(row_top[i]) -
               std::log(static_cast<double>(row_sum[i]));
      };
      double top = -std::numeric_limits<double>::infinity();
      for (index_t i = 0; i < m; ++i) top = std::max(top, log_entry(i));
      double sum = 0;
      for (index_t i = 0; i < m; ++i) sum += std::exp(log_entry(i) - top);
      g[j] = log_target - top - std::log(sum);
    }
    bool absorb = false;
    for (index_t j = 0; j < n; ++j) {
      g[j] = detail::clamp(g[j], -2 * bound, 2 * bound);
      gt[j] = static_cast<T>(g[j]);
      absorb = absorb || std::abs(static_cast<double>(gt[j]) - static_cast<double>(ht[j])) > CpuTuning::absorb_bound<T>();
    }
    if (absorb) std::copy(gt, gt + n, ht);
    for (index_t j = 0; j < n; ++j) v[j] = static_cast<T>(std::exp(static_cast<double>(gt[j]) - static_cast<double>(ht[j])));
    return absorb;
  }

  detail::AlignedBuffer<T> logk_, q_, v_, gt_, ht_, partial_, scratch_, row_top_, row_sum_;
  detail::AlignedBuffer<double> g_, colsum_, xbuf_;
};

}  // namespace ssr
