// CpuBackend<T>: routing on the host with Eigen, over OpenMP threads where the build has them.
// Work is cut into blocks of rows whose size depends only on the shape, and every reduction over
// tokens adds the blocks' partial results in block order, so any thread count gives the same bits.
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "ssr/detail/aligned.hpp"
#include "ssr/detail/cost.hpp"
#include "ssr/detail/parallel.hpp"
#include "ssr/detail/topk.hpp"
#include "ssr/error.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {

// Tuning constants of the CPU backend.
struct CpuTuning {
  // Rows are padded to a multiple of this many elements (one AVX-512 register of floats), so every
  // vector operation runs on whole packets, independent of where the caller's data lies.
  static constexpr index_t pad = 16;
  // A block holds about this many padded elements (its working set stays in L1/L2), at least min_rows rows.
  static constexpr index_t block_elements = 4096;
  static constexpr index_t min_rows = 8;

  static constexpr index_t padded(index_t n) { return (n + pad - 1) / pad * pad; }
  static constexpr index_t rows_per_block(index_t n) {
    return std::max(min_rows, block_elements / padded(n));
  }
};

template <class T>
class CpuBackend {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                "ssr::CpuBackend<T>: T must be float or double");

 public:
  using value_type = T;

  // threads = 0: as many as OpenMP offers; results never depend on it.
  CpuBackend() : CpuBackend(0) {}
  explicit CpuBackend(int threads) : threads_(threads) {
    detail::require(threads >= 0, "threads", threads, "must be >= 0 (0: all available)");
  }

  int threads() const { return threads_ > 0 ? threads_ : detail::max_threads(); }

  // Bytes of workspace held; it only grows, so a loop over same-shaped calls allocates once.
  std::size_t workspace_bytes() const {
    std::size_t b = (kernel_.capacity() + col_pot_.capacity() + partial_.capacity() + scratch_.capacity()) * sizeof(T);
    return b + (row_pot_.capacity() + colsum_.capacity() + xbuf_.capacity()) * sizeof(double);
  }

  // Throws ssr::Error naming the first non-finite logit in row-major order.
  void check_finite(ConstMatrixView<T> s) const {
    index_t first = std::numeric_limits<index_t>::max();
    const index_t m = s.rows, n = s.cols;
    SSR_OMP(parallel for schedule(static) num_threads(threads()) reduction(min : first))
    for (index_t i = 0; i < m; ++i) {
      const T* row = s.row(i);
      for (index_t j = 0; j < n; ++j) {
        if (!std::isfinite(row[j])) {
          first = std::min(first, i * n + j);
          break;
        }
      }
    }
    if (first != std::numeric_limits<index_t>::max()) {
      const index_t i = first / n, j = first % n;
      throw Error("invalid " + detail::describe(("logits(" + std::to_string(i) + ", " + std::to_string(j) + ")").c_str(), s(i, j)) +
                  ": logits must be finite");
    }
  }

  // Throws ssr::Error unless every expert index is in [0, n) and every weight and its gradient is finite.
  void check_backward(ConstMatrixView<std::int32_t> experts, ConstMatrixView<T> weights,
                      ConstMatrixView<T> grad_weights, index_t n) const {
    for (index_t i = 0; i < experts.rows; ++i) {
      for (index_t r = 0; r < experts.cols; ++r) {
        if (experts(i, r) >= 0 && experts(i, r) < n && std::isfinite(weights(i, r)) && std::isfinite(grad_weights(i, r)))
          continue;
        const std::string at = "(" + std::to_string(i) + ", " + std::to_string(r) + ")";
        detail::require(experts(i, r) >= 0 && experts(i, r) < n, ("experts" + at).c_str(), experts(i, r),
                        "must be in [0, " + std::to_string(n) + ")");
        detail::require(std::isfinite(weights(i, r)), ("weights" + at).c_str(), weights(i, r), "must be finite");
        detail::require(std::isfinite(grad_weights(i, r)), ("grad_weights" + at).c_str(), grad_weights(i, r),
                        "must be finite");
      }
    }
  }

  // Runs a resolved spec; arguments were validated by the Router.
  RouteInfo route(const RouteSpec& spec, ConstMatrixView<T> s, const RouteOutputs<T>& out) {
    RouteInfo info;
    info.path = spec.path;
    info.weights = spec.path == Path::sinkhorn ? spec.weights : Weights::scores;
    if (s.rows == 0) {  // no tokens: nothing to route
    } else if (spec.path == Path::sinkhorn) {
      solve_sinkhorn(spec, s, out, info);
    } else {
      route_softmax(spec, s, out);
    }
    if (!out.load.empty()) count_load(out.experts, out.load);
    return info;
  }

  // dL/dS from dL/dw: w_ij (g_ij - sum_r w_ir g_ir) on the chosen experts, 0 elsewhere and for plan weights.
  void backward(const RouteInfo& info, ConstMatrixView<std::int32_t> experts, ConstMatrixView<T> weights,
                ConstMatrixView<T> grad_weights, MatrixView<T> grad_logits) const {
    const index_t m = grad_logits.rows, n = grad_logits.cols, k = experts.cols;
    const bool pass = info.weights == Weights::scores;
    SSR_OMP(parallel for schedule(static) num_threads(threads()))
    for (index_t i = 0; i < m; ++i) {
      T* out = grad_logits.row(i);
      std::fill(out, out + n, T(0));
      if (!pass) continue;
      const T* w = weights.row(i);
      const T* g = grad_weights.row(i);
      double dot = 0;
      for (index_t r = 0; r < k; ++r) dot += static_cast<double>(w[r]) * g[r];
      for (index_t r = 0; r < k; ++r) out[experts(i, r)] = static_cast<T>(w[r] * (g[r] - dot));
    }
  }

 private:
  using Array = Eigen::Array<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Column = Eigen::Array<T, Eigen::Dynamic, 1>;
  using Row = Eigen::Array<T, 1, Eigen::Dynamic>;
  template <class A>
  using Aligned = Eigen::Map<A, Eigen::Aligned64>;

  // Softmax over the chosen experts of a row of scores, in double: w_r = exp(v_r - max) / sum.
  template <class V>
  static void normalise_exp(const V* v, const std::int32_t* idx, index_t k, T* w) {
    double top = -std::numeric_limits<double>::infinity();
    for (index_t r = 0; r < k; ++r) top = std::max(top, static_cast<double>(v[idx[r]]));
    double e[64], sum = 0;  // k <= 64 here; larger k takes the loop below
    if (k <= 64) {
      for (index_t r = 0; r < k; ++r) sum += (e[r] = std::exp(static_cast<double>(v[idx[r]]) - top));
      for (index_t r = 0; r < k; ++r) w[r] = static_cast<T>(e[r] / sum);
    } else {
      for (index_t r = 0; r < k; ++r) sum += std::exp(static_cast<double>(v[idx[r]]) - top);
      for (index_t r = 0; r < k; ++r) w[r] = static_cast<T>(std::exp(static_cast<double>(v[idx[r]]) - top) / sum);
    }
  }

  // Plan weights: the plan's row restricted to the chosen experts and renormalised (Proposition 1).
  static void normalise(const T* p, const std::int32_t* idx, index_t k, T* w) {
    double sum = 0;
    for (index_t r = 0; r < k; ++r) sum += p[idx[r]];
    for (index_t r = 0; r < k; ++r) w[r] = static_cast<T>(p[idx[r]] / sum);
  }

  void route_softmax(const RouteSpec& spec, ConstMatrixView<T> s, const RouteOutputs<T>& out) {
    const index_t m = s.rows, n = s.cols;
    const int nt = threads();
    double* xbuf = xbuf_.reserve(static_cast<std::size_t>(2 * n * nt));
    SSR_OMP(parallel for schedule(static) num_threads(nt))
    for (index_t i = 0; i < m; ++i) {
      double* x = xbuf + 2 * n * detail::thread_id();
      double* z = x + n;
      const T* row = s.row(i);
      std::int32_t* idx = out.experts.row(i);
      if (spec.noisy()) {
        detail::noise_row(spec, i, n, z);
        detail::cost_row(row, n, spec.cost, z, x);
        detail::topk_row(x, n, spec.k, idx);
      } else {
        detail::topk_row(row, n, spec.k, idx);  // top-k of S and of c(S) agree
      }
      normalise_exp(row, idx, spec.k, out.weights.row(i));
      if (!out.noise.empty()) {
        T* d = out.noise.row(i);
        for (index_t j = 0; j < n; ++j) d[j] = spec.noisy() ? static_cast<T>(z[j]) : T(0);
      }
    }
  }

  // Log-domain Sinkhorn with potentials f (rows) and g (columns): Pi_ij = exp(K_ij + f_i + g_j).
  // One pass per iteration: each row's f makes the row sum exactly 1 and the row's plan entries go
  // straight into its block's column sums, which give both the error and the next g.
  void solve_sinkhorn(const RouteSpec& spec, ConstMatrixView<T> s, const RouteOutputs<T>& out, RouteInfo& info) {
    const index_t m = s.rows, n = s.cols, np = CpuTuning::padded(n);
    const index_t rows = CpuTuning::rows_per_block(n), blocks = (m + rows - 1) / rows;
    const int nt = threads();
    T* kernel = kernel_.reserve(static_cast<std::size_t>(m * np));
    T* g = col_pot_.reserve(static_cast<std::size_t>(np));
    T* partial = partial_.reserve(static_cast<std::size_t>(blocks * n));
    const index_t rs = CpuTuning::padded(rows);  // keeps every scratch array aligned
    T* scratch = scratch_.reserve(static_cast<std::size_t>(nt * 2 * rows * np + nt * 2 * rs));
    double* f = row_pot_.reserve(static_cast<std::size_t>(m));
    double* colsum = colsum_.reserve(static_cast<std::size_t>(n));
    double* xbuf = xbuf_.reserve(static_cast<std::size_t>(2 * n * nt));
    std::fill(g, g + np, T(0));

    const double target = static_cast<double>(m) / static_cast<double>(n);
    // Below this a column sum has lost precision to underflow; such a column is summed in the log domain.
    const double tiny = std::sqrt(static_cast<double>(std::numeric_limits<T>::min()));
    bool done = false;
    int iterations = 0;
    double err = 0;

    SSR_OMP(parallel num_threads(nt))
    {
      const int tid = detail::thread_id();
      T* a_buf = scratch + tid * 2 * rows * np;
      T* e_buf = a_buf + rows * np;
      T* r_buf = scratch + nt * 2 * rows * np + tid * 2 * rs;
      double* x = xbuf + 2 * n * tid;
      double* z = x + n;

      // The kernel K = cost / xi, rows padded with -inf (exp gives 0 there, the max ignores them).
      SSR_OMP(for schedule(static))
      for (index_t i = 0; i < m; ++i) {
        if (spec.noisy()) detail::noise_row(spec, i, n, z);
        detail::cost_row(s.row(i), n, spec.cost, spec.noisy() ? z : nullptr, x);
        T* krow = kernel + i * np;
        detail::kernel_row(x, n, spec.sinkhorn.xi, krow);
        std::fill(krow + n, krow + np, -std::numeric_limits<T>::infinity());
        if (!out.noise.empty()) {
          T* d = out.noise.row(i);
          for (index_t j = 0; j < n; ++j) d[j] = spec.noisy() ? static_cast<T>(z[j]) : T(0);
        }
      }

      // Rows r0 .. r0+len of block b: a = K + g, e = exp(a - max a), s = sum of e over the real columns.
      auto block_pass = [&](index_t b, index_t& r0, index_t& len) {
        r0 = b * rows;
        len = std::min(rows, m - r0);
        Aligned<const Array> kb(kernel + r0 * np, len, np);
        Aligned<const Row> gv(g, 1, np);
        Aligned<Array> a(a_buf, len, np), e(e_buf, len, np);
        Aligned<Column> top(r_buf, len), sum(r_buf + rs, len);
        a = kb.rowwise() + gv;
        top = a.rowwise().maxCoeff();
        e = (a.colwise() - top).exp();
        sum = e.leftCols(n).rowwise().sum();
      };

      for (;;) {
        SSR_OMP(for schedule(static))
        for (index_t b = 0; b < blocks; ++b) {
          index_t r0, len;
          block_pass(b, r0, len);
          Aligned<Array> e(e_buf, len, np);
          Aligned<Column> top(r_buf, len), sum(r_buf + rs, len);
          Eigen::Map<Row> part(partial + b * n, 1, n);
          part = (e.leftCols(n).colwise() / sum).colwise().sum();
          for (index_t r = 0; r < len; ++r) f[r0 + r] = -(static_cast<double>(top(r)) + std::log(static_cast<double>(sum(r))));
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
          if (!done) update_columns(kernel, np, f, m, n, target, tiny, colsum, g);
        }
        if (done) break;
      }

      // The plan of the last pass: its top-k, weights and, when asked, the plan itself.
      SSR_OMP(for schedule(static))
      for (index_t b = 0; b < blocks; ++b) {
        index_t r0, len;
        block_pass(b, r0, len);
        Aligned<Array> a(a_buf, len, np), e(e_buf, len, np);
        Aligned<Column> sum(r_buf + rs, len);
        for (index_t r = 0; r < len; ++r) {
          const index_t i = r0 + r;
          std::int32_t* idx = out.experts.row(i);
          detail::topk_row(&a(r, 0), n, spec.k, idx);  // ranking by log Pi: exact where Pi would tie
          if (spec.weights == Weights::plan) {
            normalise(&e(r, 0), idx, spec.k, out.weights.row(i));
          } else {
            normalise_exp(s.row(i), idx, spec.k, out.weights.row(i));
          }
          if (!out.plan.empty()) {
            T* p = out.plan.row(i);
            const T inv = T(1) / sum(r);
            for (index_t j = 0; j < n; ++j) p[j] = e(r, j) * inv;
          }
        }
      }
    }
    info.iterations = iterations;
    info.marginal_error = err;
    info.converged = err < spec.sinkhorn.tol;
  }

  // g_j += log(m/n) - log(column sum j), which makes every column sum m/n. A column whose sum
  // underflowed is summed again in the log domain: g_j = log(m/n) - logsumexp_i(K_ij + f_i).
  static void update_columns(const T* kernel, index_t np, const double* f, index_t m, index_t n, double target,
                             double tiny, const double* colsum, T* g) {
    const double log_target = std::log(target);
    for (index_t j = 0; j < n; ++j) {
      if (colsum[j] >= tiny) {
        g[j] = static_cast<T>(static_cast<double>(g[j]) + log_target - std::log(colsum[j]));
        continue;
      }
      double top = -std::numeric_limits<double>::infinity();
      for (index_t i = 0; i < m; ++i) top = std::max(top, static_cast<double>(kernel[i * np + j]) + f[i]);
      double sum = 0;
      for (index_t i = 0; i < m; ++i) sum += std::exp(static_cast<double>(kernel[i * np + j]) + f[i] - top);
      g[j] = static_cast<T>(detail::clamp(log_target - top - std::log(sum), -2 * detail::cost_bound<T>(),
                                          2 * detail::cost_bound<T>()));
    }
  }

  static void count_load(MatrixView<std::int32_t> experts, VectorView<std::int32_t> load) {
    std::fill(load.data, load.data + load.size, 0);
    for (index_t i = 0; i < experts.rows; ++i)
      for (index_t r = 0; r < experts.cols; ++r) ++load[experts(i, r)];
  }

  int threads_;
  detail::AlignedBuffer<T> kernel_, col_pot_, partial_, scratch_;
  detail::AlignedBuffer<double> row_pot_, colsum_, xbuf_;
};

}  // namespace ssr
