// ThrustBackend<T>: routing on Thrust's device system. Views hold device pointers and nothing is copied
// to the host but a few scalars per Sinkhorn iteration. Built with the CUDA system it runs on the GPU;
// with -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP (or _CPP) it runs on the CPU with g++ alone.
//
// Each row (token) is one work item; the Sinkhorn column sums are added per fixed block of rows and then
// in block order, as in the CPU backend, so results do not depend on how the device schedules work.
// The solver is the log-domain iteration (two exps per element and iteration); the same costs, noise,
// stopping rule, column fallback and top-k as the CPU backend, so routes agree with it to rounding.
#pragma once

#include <thrust/copy.h>
#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/fill.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform_reduce.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include "ssr/detail/cost.hpp"
#include "ssr/detail/hd.hpp"
#include "ssr/detail/topk.hpp"
#include "ssr/detail/weights.hpp"
#include "ssr/error.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#define SSR_THRUST_SYSTEM_NAMESPACE thrust_cuda
#elif THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_OMP
#define SSR_THRUST_SYSTEM_NAMESPACE thrust_omp
#elif THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_TBB
#define SSR_THRUST_SYSTEM_NAMESPACE thrust_tbb
#else
#define SSR_THRUST_SYSTEM_NAMESPACE thrust_cpp
#endif

namespace ssr {

struct ThrustTuning {
  // Rows per block of the Sinkhorn column sums (a function of the shape only, for reproducibility).
  static constexpr index_t block_rows = 256;
};

namespace detail {
namespace thrust_kernels {

// Softmax top-k of row i: experts, weights, and the noise when asked.
template <class T>
struct SoftmaxRow {
  RouteSpec spec;
  ConstMatrixView<T> s;
  MatrixView<std::int32_t> experts;
  MatrixView<T> weights, noise;

  SSR_HD void operator()(index_t i) const {
    const T* row = s.row(i);
    std::int32_t* idx = experts.row(i);
    const RowCost<T> cost(row, s.cols, i, spec);
    if (spec.noisy()) {
      topk_by(s.cols, spec.k, idx, cost);
    } else {
      topk_row(row, s.cols, spec.k, idx);  // top-k of S and of c(S) agree
    }
    softmax_weights(row, idx, spec.k, weights.row(i));
    if (!noise.empty())
      for (index_t j = 0; j < s.cols; ++j) noise(i, j) = spec.noisy() ? static_cast<T>(cost.noise(j)) : T(0);
  }
};

// Row i of the kernel K = clamp((x - max x) / xi, -B, 0), x the shifted noisy cost; and the noise.
template <class T>
struct KernelRow {
  RouteSpec spec;
  ConstMatrixView<T> s;
  T* logk;
  MatrixView<T> noise;

  SSR_HD void operator()(index_t i) const {
    const index_t n = s.cols;
    const RowCost<T> cost(s.row(i), n, i, spec);
    const double bound = cost_bound<T>();
    double top = -bound;
    for (index_t j = 0; j < n; ++j) top = std::max(top, cost(j));
    for (index_t j = 0; j < n; ++j) logk[i * n + j] = static_cast<T>(clamp((cost(j) - top) / spec.sinkhorn.xi, -bound, 0.0));
    if (!noise.empty())
      for (index_t j = 0; j < n; ++j) noise(i, j) = spec.noisy() ? static_cast<T>(cost.noise(j)) : T(0);
  }
};

// log sum_j exp(K_ij + g_j), in double.
template <class T>
SSR_HD inline double row_lse(const T* k, const double* g, index_t n, double& top) {
  top = -std::numeric_limits<double>::infinity();
  for (index_t j = 0; j < n; ++j) top = std::max(top, static_cast<double>(k[j]) + g[j]);
  double sum = 0;
  for (index_t j = 0; j < n; ++j) sum += std::exp(static_cast<double>(k[j]) + g[j] - top);
  return top + std::log(sum);
}

// One block of rows: each row's f (the row sums 1) and the block's column sums of the plan.
template <class T>
struct SinkhornBlock {
  const T* logk;
  const double* g;
  double* f;
  double* partial;
  index_t m, n;

  SSR_HD void operator()(index_t b) const {
    double* part = partial + b * n;
    for (index_t j = 0; j < n; ++j) part[j] = 0;
    const index_t end = std::min(m, (b + 1) * ThrustTuning::block_rows);
    for (index_t i = b * ThrustTuning::block_rows; i < end; ++i) {
      const T* k = logk + i * n;
      double top;
      f[i] = -row_lse(k, g, n, top);
      for (index_t j = 0; j < n; ++j) part[j] += std::exp(static_cast<double>(k[j]) + g[j] + f[i]);
    }
  }
};

// Column j's sum over the blocks, in block order.
struct ColumnSum {
  const double* partial;
  double* colsum;
  index_t n, blocks;

  SSR_HD void operator()(index_t j) const {
    double sum = 0;
    for (index_t b = 0; b < blocks; ++b) sum += partial[b * n + j];
    colsum[j] = sum;
  }
};

// Column j's potential for the next iteration, given its plan sum: g_j + log(m/n) - log(sum), or, where
// the sum underflowed, log(m/n) - logsumexp_i(K_ij + f_i). Shared by the Thrust and CUDA backends.
template <class T>
SSR_HD inline double next_column_potential(const T* logk, const double* f, index_t m, index_t n, index_t j, double sum,
                                           double g) {
  const double log_target = std::log(static_cast<double>(m) / static_cast<double>(n));
  if (sum >= std::sqrt(static_cast<double>(std::numeric_limits<T>::min()))) return g + log_target - std::log(sum);
  double top = -std::numeric_limits<double>::infinity();
  for (index_t i = 0; i < m; ++i) top = std::max(top, static_cast<double>(logk[i * n + j]) + f[i]);
  double total = 0;
  for (index_t i = 0; i < m; ++i) total += std::exp(static_cast<double>(logk[i * n + j]) + f[i] - top);
  const double bound = 2 * cost_bound<T>();
  return clamp(log_target - top - std::log(total), -bound, bound);
}

template <class T>
struct ColumnUpdate {
  const T* logk;
  const double* f;
  const double* colsum;
  double* g;
  index_t m, n;

  SSR_HD void operator()(index_t j) const { g[j] = next_column_potential(logk, f, m, n, j, colsum[j], g[j]); }
};

// The final plan of row i: top-k by log Pi, the weights, and the plan row when asked.
template <class T>
struct PlanRow {
  RouteSpec spec;
  ConstMatrixView<T> s;
  const T* logk;
  const double* g;
  MatrixView<std::int32_t> experts;
  MatrixView<T> weights, plan;

  SSR_HD void operator()(index_t i) const {
    const index_t n = s.cols;
    const T* k = logk + i * n;
    double top;
    const double lse = row_lse(k, g, n, top);
    std::int32_t* idx = experts.row(i);
    topk_by(n, spec.k, idx, [k, this](index_t j) { return static_cast<double>(k[j]) + g[j]; });
    if (spec.weights == Weights::plan) {
      plan_weights(idx, spec.k, weights.row(i), k, g);
    } else {
      softmax_weights(s.row(i), idx, spec.k, weights.row(i));
    }
    if (!plan.empty())
      for (index_t j = 0; j < n; ++j) plan(i, j) = static_cast<T>(std::exp(static_cast<double>(k[j]) + g[j] - lse));
  }

  // Plan weights Pi_ij / sum_{T_i} Pi_il = softmax of log Pi over the chosen experts.
  SSR_HD static void plan_weights(const std::int32_t* idx, index_t kk, T* w, const T* k, const double* g) {
    double top = -std::numeric_limits<double>::infinity();
    for (index_t r = 0; r < kk; ++r) top = std::max(top, static_cast<double>(k[idx[r]]) + g[idx[r]]);
    double sum = 0;
    for (index_t r = 0; r < kk; ++r) sum += std::exp(static_cast<double>(k[idx[r]]) + g[idx[r]] - top);
    for (index_t r = 0; r < kk; ++r) w[r] = static_cast<T>(std::exp(static_cast<double>(k[idx[r]]) + g[idx[r]] - top) / sum);
  }
};

// The normalised L1 column error, summed in column order.
struct ColumnError {
  const double* colsum;
  double* err;
  index_t m, n;
  SSR_HD void operator()(index_t) const {
    double e = 0;
    for (index_t j = 0; j < n; ++j) {
      const double d = colsum[j] - static_cast<double>(m) / static_cast<double>(n);
      e += d < 0 ? -d : d;
    }
    *err = e / static_cast<double>(m);
  }
};

template <class T>
struct Backward {
  MatrixView<const std::int32_t> experts;
  MatrixView<const T> weights, grad_weights;
  MatrixView<T> grad_logits;
  bool pass;

  SSR_HD void operator()(index_t i) const {
    T* out = grad_logits.row(i);
    for (index_t j = 0; j < grad_logits.cols; ++j) out[j] = T(0);
    if (!pass) return;
    double dot = 0;
    for (index_t r = 0; r < experts.cols; ++r) dot += static_cast<double>(weights(i, r)) * grad_weights(i, r);
    for (index_t r = 0; r < experts.cols; ++r) out[experts(i, r)] = static_cast<T>(weights(i, r) * (grad_weights(i, r) - dot));
  }
};

// Row-major index of the first element of row i that is not finite (max index if none).
template <class T>
struct FirstNonFinite {
  ConstMatrixView<T> s;
  SSR_HD index_t operator()(index_t i) const {
    for (index_t j = 0; j < s.cols; ++j)
      if (!(s(i, j) - s(i, j) == T(0))) return i * s.cols + j;  // false exactly for NaN and +-Inf
    return std::numeric_limits<index_t>::max();
  }
};

// First index of an assignment whose expert, weight or gradient is out of range (max index if none).
template <class T>
struct FirstBadAssignment {
  MatrixView<const std::int32_t> experts;
  MatrixView<const T> weights, grad_weights;
  index_t n;
  SSR_HD index_t operator()(index_t e) const {
    const index_t i = e / experts.cols, r = e % experts.cols;
    const bool ok = experts(i, r) >= 0 && experts(i, r) < n && weights(i, r) - weights(i, r) == T(0) &&
                    grad_weights(i, r) - grad_weights(i, r) == T(0);
    return ok ? std::numeric_limits<index_t>::max() : e;
  }
};

struct Min {
  SSR_HD index_t operator()(index_t a, index_t b) const { return a < b ? a : b; }
};

template <class T>
struct Count {
  MatrixView<const std::int32_t> experts;
  std::int32_t* load;
  SSR_HD void operator()(index_t j) const {
    std::int32_t c = 0;
    for (index_t i = 0; i < experts.rows; ++i)
      for (index_t r = 0; r < experts.cols; ++r) c += experts(i, r) == j;
    load[j] = c;
  }
};

}  // namespace thrust_kernels
}  // namespace detail

// The backend's members and code depend on the Thrust device system a translation unit is compiled for,
// so each system gets its own (inline) namespace: one program may link a TU built for Thrust's OMP system
// with one built by nvcc for CUDA without the two ThrustBackend<T> colliding at link time.
inline namespace SSR_THRUST_SYSTEM_NAMESPACE {

template <class T>
class ThrustBackend {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                "ssr::ThrustBackend<T>: T must be float or double");

 public:
  using value_type = T;

  // Bytes of device workspace held; it only grows.
  std::size_t workspace_bytes() const {
    return logk_.capacity() * sizeof(T) + (f_.capacity() + g_.capacity() + partial_.capacity() + colsum_.capacity() + err_.capacity()) * sizeof(double);
  }

  void check_finite(ConstMatrixView<T> s) const {
    namespace k = detail::thrust_kernels;
    const index_t none = std::numeric_limits<index_t>::max();
    const index_t first = thrust::transform_reduce(thrust::device, thrust::counting_iterator<index_t>(0),
                                                   thrust::counting_iterator<index_t>(s.rows), k::FirstNonFinite<T>{s}, none, k::Min{});
    if (first == none) return;
    const T value = read(&s(first / s.cols, first % s.cols));
    throw Error("invalid " + detail::describe(("logits(" + std::to_string(first / s.cols) + ", " + std::to_string(first % s.cols) + ")").c_str(), value) +
                ": logits must be finite");
  }

  void check_backward(ConstMatrixView<std::int32_t> experts, ConstMatrixView<T> weights, ConstMatrixView<T> grad_weights, index_t n) const {
    namespace k = detail::thrust_kernels;
    const index_t none = std::numeric_limits<index_t>::max();
    const index_t first = thrust::transform_reduce(thrust::device, thrust::counting_iterator<index_t>(0),
                                                   thrust::counting_iterator<index_t>(experts.rows * experts.cols),
                                                   k::FirstBadAssignment<T>{experts, weights, grad_weights, n}, none, k::Min{});
    if (first == none) return;
    const index_t i = first / experts.cols, r = first % experts.cols;
    const std::int32_t e = read(&experts(i, r));
    const T w = read(&weights(i, r)), g = read(&grad_weights(i, r));
    const std::string at = "(" + std::to_string(i) + ", " + std::to_string(r) + ")";
    detail::require(e >= 0 && e < n, ("experts" + at).c_str(), e, "must be in [0, " + std::to_string(n) + ")");
    detail::require(std::isfinite(w), ("weights" + at).c_str(), w, "must be finite");
    detail::require(std::isfinite(g), ("grad_weights" + at).c_str(), g, "must be finite");
  }

  RouteInfo route(const RouteSpec& spec, ConstMatrixView<T> s, const RouteOutputs<T>& out) {
    namespace k = detail::thrust_kernels;
    RouteInfo info = initial_info(spec);
    const auto rows = [&](index_t count) {
      return std::make_pair(thrust::counting_iterator<index_t>(0), thrust::counting_iterator<index_t>(count));
    };
    if (s.rows > 0 && spec.path == Path::softmax) {
      const auto r = rows(s.rows);
      thrust::for_each(thrust::device, r.first, r.second, k::SoftmaxRow<T>{spec, s, out.experts, out.weights, out.noise});
    } else if (s.rows > 0) {
      solve_sinkhorn(spec, s, out, info);
    }
    if (!out.load.empty()) {
      const auto r = rows(out.load.size);
      thrust::for_each(thrust::device, r.first, r.second, k::Count<T>{out.experts, out.load.data});
    }
    return info;
  }

  void backward(const RouteInfo& info, ConstMatrixView<std::int32_t> experts, ConstMatrixView<T> weights,
                ConstMatrixView<T> grad_weights, MatrixView<T> grad_logits) const {
    thrust::for_each(thrust::device, thrust::counting_iterator<index_t>(0), thrust::counting_iterator<index_t>(experts.rows),
                     detail::thrust_kernels::Backward<T>{experts, weights, grad_weights, grad_logits, info.weights == Weights::scores});
  }

 private:
  void solve_sinkhorn(const RouteSpec& spec, ConstMatrixView<T> s, const RouteOutputs<T>& out, RouteInfo& info) {
    namespace k = detail::thrust_kernels;
    const index_t m = s.rows, n = s.cols, blocks = (m + ThrustTuning::block_rows - 1) / ThrustTuning::block_rows;
    grow(logk_, m * n);
    grow(f_, m);
    grow(g_, n);
    grow(partial_, blocks * n);
    grow(colsum_, n);
    grow(err_, 1);
    T* logk = thrust::raw_pointer_cast(logk_.data());
    double *f = thrust::raw_pointer_cast(f_.data()), *g = thrust::raw_pointer_cast(g_.data()),
           *partial = thrust::raw_pointer_cast(partial_.data()), *colsum = thrust::raw_pointer_cast(colsum_.data()),
           *err = thrust::raw_pointer_cast(err_.data());
    thrust::fill(thrust::device, g, g + n, 0.0);
    const thrust::counting_iterator<index_t> zero(0);
    thrust::for_each(thrust::device, zero, zero + m, k::KernelRow<T>{spec, s, logk, out.noise});
    for (;;) {
      thrust::for_each(thrust::device, zero, zero + blocks, k::SinkhornBlock<T>{logk, g, f, partial, m, n});
      thrust::for_each(thrust::device, zero, zero + n, k::ColumnSum{partial, colsum, n, blocks});
      thrust::for_each(thrust::device, zero, zero + 1, k::ColumnError{colsum, err, m, n});
      const double e = read(err);
      ++info.iterations;
      info.marginal_error = e;
      if (e < spec.sinkhorn.tol || info.iterations >= spec.sinkhorn.max_iters) break;
      thrust::for_each(thrust::device, zero, zero + n, k::ColumnUpdate<T>{logk, f, colsum, g, m, n});
    }
    info.converged = info.marginal_error < spec.sinkhorn.tol;
    thrust::for_each(thrust::device, zero, zero + m, k::PlanRow<T>{spec, s, logk, g, out.experts, out.weights, out.plan});
  }

  // One value from device memory.
  template <class V>
  static V read(const V* p) {
    V v;
    thrust::copy(thrust::device_pointer_cast(p), thrust::device_pointer_cast(p) + 1, &v);
    return v;
  }

  template <class V>
  static void grow(thrust::device_vector<V>& v, index_t size) {
    if (static_cast<index_t>(v.size()) < size) v.resize(static_cast<std::size_t>(size));
  }

  thrust::device_vector<T> logk_;
  thrust::device_vector<double> f_, g_, partial_, colsum_, err_;
};

}  // namespace SSR_THRUST_SYSTEM_NAMESPACE
}  // namespace ssr
