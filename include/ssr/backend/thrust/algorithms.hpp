// The Thrust backend's algorithms: each a sequence of thrust::for_each over work items, on any execution
// policy (thrust::device for ThrustBackend, a CUDA stream for CudaBackend's paths without a fused kernel),
// on buffers laid out in the call's workspace; the Sinkhorn iteration also for a problem shared by ranks.
#pragma once

#include <thrust/copy.h>
#include <thrust/device_ptr.h>
#include <thrust/fill.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform_reduce.h>

#include <cstdint>
#include <limits>

#include "ssr/backend/thrust/row_kernels.hpp"
#include "ssr/backend/thrust/scan_kernels.hpp"
#include "ssr/backend/thrust/sinkhorn_kernels.hpp"
#include "ssr/backend/thrust/tuning.hpp"
#include "ssr/communicator.hpp"
#include "ssr/detail/workspace.hpp"
#include "ssr/math/exact_sum.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace thrust_algorithms {

// Runs f(i) for i in [0, count) on exec.
template <class Exec, class F>
void for_each_index(const Exec& exec, index_t count, const F& f) {
  if (count <= 0) return;
  const thrust::counting_iterator<index_t> first(0);
  thrust::for_each(exec, first, first + count, f);
}

// One value from the device system's memory, read on the host.
template <class V>
V read_value(const V* p) {
  V v;
  thrust::copy(thrust::device_pointer_cast(p), thrust::device_pointer_cast(p) + 1, &v);
  return v;
}

template <class T>
struct SinkhornBuffers {
  T *logk, *q;                        // m x n: K and Q
  T *top, *row_sum, *inv;             // m each: c_i, r_i and 1 / r_i
  T* lanes;                           // sum_blocks x sum_lanes x n: the column shares' lanes
  T *gt, *h, *v;                      // n each
  double *g, *colsum;                 // n each
  thrust_kernels::SolveState* state;  // one
  std::int64_t* limbs;                // exact sums over ranks: exact_limbs x n
  double *column_max, *column_sum;    // log-domain columns of a distributed solve: n, n
  math::LogLane* log_lanes;           // log-domain columns of one process: n x log_lanes

  SSR_HD thrust_kernels::ScaledSolve<T> solve(index_t m, index_t n) const {
    return {logk, q, top, row_sum, inv, lanes, gt, h, v, g, state, m, n};
  }
};

template <class T>
SinkhornBuffers<T> sinkhorn_layout(detail::Carve& c, index_t m, index_t n) {
  const auto cols = static_cast<std::size_t>(n), rows = static_cast<std::size_t>(m);
  SinkhornBuffers<T> b{};
  b.logk = c.take<T>(rows * cols);
  b.q = c.take<T>(rows * cols);
  b.top = c.take<T>(rows);
  b.row_sum = c.take<T>(rows);
  b.inv = c.take<T>(rows);
  b.lanes = c.take<T>(static_cast<std::size_t>(math::sum_blocks(m, n) * math::sum_lanes) * cols);
  b.gt = c.take<T>(cols);
  b.h = c.take<T>(cols);
  b.v = c.take<T>(cols);
  b.g = c.take<double>(cols);
  b.colsum = c.take<double>(cols);
  b.state = c.take<thrust_kernels::SolveState>(1);
  b.limbs = c.take<std::int64_t>(math::exact_limbs * cols);
  b.column_max = c.take<double>(cols);
  b.column_sum = c.take<double>(cols);
  b.log_lanes = c.take<math::LogLane>(static_cast<std::size_t>(math::log_lanes) * cols);
  return b;
}

// Per-block load counts of count_load.
inline std::int32_t* load_layout(detail::Carve& c, index_t m, index_t n) {
  return c.take<std::int32_t>(static_cast<std::size_t>(ThrustTuning::blocks(m) * n));
}

template <class Exec, class In, class T>
void softmax_topk(const Exec& exec, const RouteSpec& spec, const Context& ctx, ConstMatrixView<In> s,
                  const RouteOutputs<T>& out) {
  for_each_index(exec, s.rows, thrust_kernels::SoftmaxRow<In, T>{spec, ctx, s, out.experts, out.weights, out.noise});
}

// The kernel K of every row into logk (m x n), and the noise when asked.
template <class Exec, class In, class T>
void sinkhorn_kernel(const Exec& exec, const RouteSpec& spec, const Context& ctx, ConstMatrixView<In> s, T* logk,
                     MatrixView<T> noise) {
  for_each_index(exec, s.rows, thrust_kernels::KernelRow<In, T>{spec, ctx, s, logk, noise});
}

// Iterates from g = 0 until the device decides to stop. decide_every > 0: reads the decision (read_state)
// after every decide_every-th iteration and the last, and stops there; 0: queues max_iters iterations
// without waiting, those after the decision doing nothing. With comm, the problem's `rows` are shared by
// ranks: the column sums (and the log-domain columns' maxima and sums) are reduced over them exactly, on
// `stream`, and the host decides after every iteration, so that every rank makes the same reductions.
// Returns the statistics when the host decides.
template <class Exec, class T, class Stream, class ReadState>
SolveStats sinkhorn_iterate(const Exec& exec, const SinkhornBuffers<T>& b, index_t m, index_t rows, index_t n,
                            const SinkhornParams& params, const Communicator<Stream>* comm, Stream stream,
                            int decide_every, const ReadState& read_state) {
  namespace kernels = thrust_kernels;
  const index_t blocks = math::sum_blocks(m, n);
  const bool distributed = comm != nullptr;
  if (distributed) decide_every = 1;
  const auto sum_over_ranks = [&](double* values) {  // NOLINT(readability-non-const-parameter): FromExact writes
    for_each_index(exec, n, kernels::ToExact{values, b.limbs});
    comm->sum(b.limbs, static_cast<std::size_t>(math::exact_limbs * n), stream);
    for_each_index(exec, n, kernels::FromExact{b.limbs, values});
  };
  const kernels::ScaledSolve<T> solve = b.solve(m, n);
  thrust::fill(exec, b.g, b.g + n, 0.0);
  thrust::fill(exec, b.gt, b.gt + n, T(0));
  thrust::fill(exec, b.h, b.h + n, T(0));
  thrust::fill(exec, b.v, b.v + n, T(1));
  thrust::fill(exec, b.state, b.state + 1, kernels::SolveState{});
  kernels::SolveState host{};
  for (int it = 0; it < params.max_iters; ++it) {
    for_each_index(exec, m, kernels::ScaledRows<T>{solve});
    for_each_index(exec, m, kernels::RowSum<T>{solve});
    for_each_index(exec, blocks * math::sum_lanes * n, kernels::ColumnLane<T>{solve});
    for_each_index(exec, n, kernels::ColumnSum<T>{b.lanes, b.v, b.colsum, b.state, n, blocks});
    if (distributed) sum_over_ranks(b.colsum);
    for_each_index(exec, 1, kernels::Decide<T>{b.colsum, b.state, params, rows, n, distributed});
    if (decide_every > 0 && ((it + 1) % decide_every == 0 || it + 1 == params.max_iters)) {
      host = read_state(b.state);
      if (host.done) break;
    }
    if (!distributed && (decide_every != 1 || host.log_columns > 0))  // host is this iteration's state
      for_each_index(exec, n * math::log_lanes, kernels::LogLanes<T>{solve, b.colsum, b.log_lanes});
    if (distributed && host.log_columns > 0) {  // the same columns on every rank: their sums are the same bits
      const kernels::LogColumns<T> columns{solve, b.colsum, b.column_max, b.column_sum, rows};
      for_each_index(exec, n, kernels::LogColumnMax<T>{columns});
      comm->max(b.column_max, static_cast<std::size_t>(n), stream);
      for_each_index(exec, n, kernels::LogColumnSum<T>{columns});
      sum_over_ranks(b.column_sum);
      for_each_index(exec, n, kernels::LogColumnUpdate<T>{columns});
    }
    for_each_index(exec, n, kernels::ColumnUpdate<T>{solve, b.colsum, rows, distributed, b.log_lanes});
    for_each_index(exec, 1, kernels::Scale<T>{solve});
  }
  return host.stats;
}

// The outputs of every row from the last pass of sinkhorn_iterate (math::solved_row).
template <class Exec, class In, class T>
void solved_rows(const Exec& exec, const RouteSpec& spec, ConstMatrixView<In> s, const SinkhornBuffers<T>& b,
                 const RouteOutputs<T>& out) {
  for_each_index(
      exec, s.rows,
      thrust_kernels::SolvedRow<In, T>{spec, s, b.logk, b.q, b.v, b.gt, b.row_sum, out.experts, out.weights, out.plan});
}

// load[j] = number of assignments to expert j; counts from load_layout.
template <class Exec>
void count_load(const Exec& exec, ConstMatrixView<std::int32_t> experts, VectorView<std::int32_t> load,
                std::int32_t* counts) {
  const index_t n = load.size, blocks = ThrustTuning::blocks(experts.rows);
  for_each_index(exec, blocks, thrust_kernels::BlockLoad{experts, counts, n});
  for_each_index(exec, n, thrust_kernels::LoadSum{counts, load.data, n, blocks});
}

template <class Exec, class T>
void backward(const Exec& exec, const RouteInfo& info, const BackwardArgs<T>& a) {
  for_each_index(exec, a.experts.rows,
                 thrust_kernels::Backward<T>{a.experts, a.weights, a.grad_weights, a.grad_logits,
                                             info.weights == Weights::scores, info.score, a.logits});
}

// The row-major index of the first non-finite logit, or max index; the result is read on the host.
template <class Exec, class In>
index_t first_non_finite(const Exec& exec, ConstMatrixView<In> s) {
  const thrust::counting_iterator<index_t> first(0);
  return thrust::transform_reduce(exec, first, first + s.rows, thrust_kernels::FirstNonFinite<In>{s},
                                  std::numeric_limits<index_t>::max(), thrust_kernels::Min{});
}

// The index i * k + r of the first assignment backward cannot use, or max index; read on the host.
template <class Exec, class T>
index_t first_bad_assignment(const Exec& exec, ConstMatrixView<std::int32_t> experts, ConstMatrixView<T> weights,
                             ConstMatrixView<T> grad_weights, index_t n) {
  const thrust::counting_iterator<index_t> first(0);
  return thrust::transform_reduce(exec, first, first + experts.rows * experts.cols,
                                  thrust_kernels::FirstBadAssignment<T>{experts, weights, grad_weights, n},
                                  std::numeric_limits<index_t>::max(), thrust_kernels::Min{});
}

}  // namespace thrust_algorithms
}  // namespace ssr
