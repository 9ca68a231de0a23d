// CpuBackend<T>: routing on the host with Eigen, over OpenMP threads where the build has them.
// Rows are independent except in the Sinkhorn column sums, which are added per fixed block of rows and
// then in block order, so any thread count gives the same bits.
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "ssr/backend/cpu_sinkhorn.hpp"
#include "ssr/backend/cpu_tuning.hpp"
#include "ssr/detail/aligned.hpp"
#include "ssr/detail/cost.hpp"
#include "ssr/detail/parallel.hpp"
#include "ssr/detail/topk.hpp"
#include "ssr/detail/weights.hpp"
#include "ssr/error.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {

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
  // The threads a call over `elements` matrix elements uses.
  int threads_for(index_t elements) const { return elements < CpuTuning::parallel_min_elements ? 1 : threads(); }

  // Bytes of workspace held; it only grows, so a loop over same-shaped calls allocates once.
  std::size_t workspace_bytes() const {
    return sinkhorn_.workspace_bytes() + xbuf_.capacity() * sizeof(double);
  }

  // Throws ssr::Error naming the first non-finite logit in row-major order.
  void check_finite(ConstMatrixView<T> s) const {
    index_t first = std::numeric_limits<index_t>::max();
    const index_t m = s.rows, n = s.cols;
    const int nt = threads_for(m * n);
    SSR_OMP(parallel for schedule(static) num_threads(nt) reduction(min : first))
    for (index_t i = 0; i < m; ++i) {
      const T* row = s.row(i);
      // x - x is 0 for finite x and NaN otherwise, so a row is finite when the sum is 0: one vector pass.
      const Eigen::Map<const Eigen::Array<T, 1, Eigen::Dynamic>> r(row, 1, n);
      if ((r - r).sum() == T(0)) continue;
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
    RouteInfo info = initial_info(spec);
    if (s.rows == 0) {  // no tokens: nothing to route
    } else if (spec.path == Path::sinkhorn) {
      sinkhorn_.solve(spec, s, out, info, threads_for(s.rows * s.cols));
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
    const int nt = threads_for(m * n);
    SSR_OMP(parallel for schedule(static) num_threads(nt))
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
  void route_softmax(const RouteSpec& spec, ConstMatrixView<T> s, const RouteOutputs<T>& out) {
    const index_t m = s.rows, n = s.cols;
    const int nt = threads_for(m * n);
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
      detail::softmax_weights(row, idx, spec.k, out.weights.row(i));
      if (!out.noise.empty()) {
        T* d = out.noise.row(i);
        for (index_t j = 0; j < n; ++j) d[j] = spec.noisy() ? static_cast<T>(z[j]) : T(0);
      }
    }
  }

  static void count_load(MatrixView<std::int32_t> experts, VectorView<std::int32_t> load) {
    std::fill(load.data, load.data + load.size, 0);
    for (index_t i = 0; i < experts.rows; ++i)
      for (index_t r = 0; r < experts.cols; ++r) ++load[experts(i, r)];
  }

  int threads_;
  CpuSinkhorn<T> sinkhorn_;
  detail::AlignedBuffer<double> xbuf_;
};

}  // namespace ssr
