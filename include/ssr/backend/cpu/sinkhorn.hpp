// The CPU Sinkhorn solver: stabilised scaling with absorption into log-domain potentials.
//
// The plan is Pi_ij = exp(K_ij + f_i + g_j) (ssr/math/sinkhorn.hpp). The solver keeps
// Q_ij = exp(K_ij + h_j - c_i) for an absorbed copy h of g and c_i = max_j (K_ij + h_j), and the scaling
// v = exp(g - h), so an iteration needs no exp: for each row, t = Q_i * v, r = sum t, the row's plan is
// t / r (row sum exactly 1, f_i = -(c_i + log r)), and t / r goes straight into the column sums, which give
// both the error and the next g. One pass over Q.
// Q <= 1 with a 1 in every row, and v stays within exp(+-bound): when some |g_j - h_j| grows past the
// bound, h absorbs g and Q is recomputed (one exp pass). So r never overflows or underflows. A column
// whose sum underflows takes the log-domain update (math::column_potential_from_lse).
// With a communicator, the column sums (and a log-domain column's maximum and sum) are reduced over the
// ranks that share the problem, exactly (detail::sum_over_ranks), so every rank takes the same steps.
// The setup builds K and Q row by row and makes the first pass on the way; the final plan, top-k and
// weights are the last pass's t / r, from Q and v without exp, except for rows whose chosen experts' Q
// underflowed, which are redone in the log domain.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "ssr/backend/cpu/simd.hpp"
#include "ssr/backend/cpu/tuning.hpp"
#include "ssr/call.hpp"
#include "ssr/communicator.hpp"
#include "ssr/detail/parallel.hpp"
#include "ssr/detail/sum_over_ranks.hpp"
#include "ssr/detail/workspace.hpp"
#include "ssr/math/noise.hpp"
#include "ssr/math/sinkhorn.hpp"
#include "ssr/math/weights.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace cpu {

template <class T>
class Sinkhorn {
  using V = Simd<T>;
  static constexpr index_t W = V::W;
  using Row = typename V::Row;
  using Chunk = typename V::Chunk;
  template <class A>
  using At = typename V::template At<A>;

 public:
  // The solve's buffers, laid out in a workspace.
  struct Buffers {
    T *logk, *q, *v, *gt, *ht, *partial, *scratch, *tiles, *row_top, *row_sum;
    double *g, *colsum, *xbuf;
    // Distributed solves: exact-sum limbs, and the log-domain columns' flags, maxima and sums.
    std::int64_t* limbs;
    std::int32_t* log_update;
    double *column_max, *column_sum;
  };

  // Lays out the buffers of an m x n solve on nt threads.
  static Buffers layout(detail::Carve& c, index_t m, index_t n, int nt) {
    const index_t np = CpuTuning::padded(n), blocks = CpuTuning::blocks(m, n);
    const auto mp = static_cast<std::size_t>(m * np), npz = static_cast<std::size_t>(np);
    const auto threads = static_cast<std::size_t>(nt);
    Buffers b{};
    b.logk = c.take<T>(mp);
    b.q = c.take<T>(mp);
    b.v = c.take<T>(npz);
    b.gt = c.take<T>(npz);  // g rounded to T: what both forms use
    b.ht = c.take<T>(npz);  // h, the absorbed part of g
    b.partial = c.take<T>(static_cast<std::size_t>(blocks * n));
    b.scratch = c.take<T>(4 * npz * threads);                                // rows t, e, part and S per thread
    b.tiles = c.take<T>(static_cast<std::size_t>(V::tile) * npz * threads);  // a tile of rows per thread
    b.row_top = c.take<T>(static_cast<std::size_t>(m));                      // c_i; f_i = -(row_top_i + log row_sum_i)
    b.row_sum = c.take<T>(static_cast<std::size_t>(m));
    b.g = c.take<double>(static_cast<std::size_t>(n));
    b.colsum = c.take<double>(static_cast<std::size_t>(n));
    b.xbuf = c.take<double>(2 * npz * threads);
    b.limbs = c.take<std::int64_t>(static_cast<std::size_t>(math::exact_limbs * n));
    b.log_update = c.take<std::int32_t>(static_cast<std::size_t>(n));
    b.column_max = c.take<double>(static_cast<std::size_t>(n));
    b.column_sum = c.take<double>(static_cast<std::size_t>(n));
    return b;
  }

  // comm: the ranks sharing the problem (spec.total_rows rows in all), or null.
  static void solve(const Buffers& b, const RouteSpec& spec, ConstMatrixView<T> s, const RouteOutputs<T>& out,
                    RouteInfo& info, int nt, const Communicator<HostStream>* comm) {
    const index_t m = s.rows, n = s.cols, np = CpuTuning::padded(n);
    const index_t rows = CpuTuning::rows_per_block(n), blocks = CpuTuning::blocks(m, n);
    T *logk = b.logk, *q = b.q, *v = b.v, *gt = b.gt, *ht = b.ht, *partial = b.partial, *row_top = b.row_top,
      *row_sum = b.row_sum;
    double *g = b.g, *colsum = b.colsum;
    std::fill(g, g + n, 0.0);
    std::fill(gt, gt + np, T(0));
    std::fill(ht, ht + np, T(0));
    std::fill(v, v + n, T(1));
    std::fill(v + n, v + np, T(0));  // padding: t = Q * v is 0 there

    const index_t rows_total = math::problem_rows(spec, m);
    const math::ColumnTarget target = math::column_target(rows_total, n);
    const T tiny = static_cast<T>(math::underflow_threshold<T>());
    bool done = false, absorb = false;
    int iterations = 0;
    double err = 0;

    detail::parallel(nt, [&] {
      const int tid = detail::thread_id();
      T* t_buf = b.scratch + index_t{4} * tid * np;
      T* e_buf = t_buf + np;
      T* p_buf = e_buf + np;
      T* s_buf = p_buf + np;
      double* x = b.xbuf + index_t{2} * np * tid;
      double* z = x + np;
      std::fill(z + n, z + np, 0.0);  // noise padding

      // One pass over the rows of block b, into the block's column sums.
      auto pass = [&](index_t blk) {
        V::pass(q, v, np, blk * rows, std::min(m, (blk + 1) * rows), row_sum, p_buf);
        std::copy(p_buf, p_buf + n, partial + blk * n);
      };

      // K = cost / xi, padded with -inf; Q = exp(K) (h = 0, c = 0); and with it the first pass.
      SSR_OMP(for schedule(static))
      for (index_t blk = 0; blk < blocks; ++blk) {
        for (index_t i = blk * rows; i < std::min(m, (blk + 1) * rows); ++i) {
          if (spec.noisy()) math::noise_row(spec, i, n, z);
          T* krow = logk + i * np;
          V::kernel_row(s.row(i), n, np, spec, spec.noisy() ? z : nullptr, s_buf, x, krow);
          V::exp_row(krow, q + i * np, np);
          row_top[i] = T(0);
          if (!out.noise.empty())
            math::noise_output(
                spec, n, [z](index_t j) { return z[j]; }, out.noise.row(i));
        }
        pass(blk);
      }

      // Row i in the log domain: a = K_i + g into t_buf, e = exp(a - max a) into e_buf; returns the sum
      // of e over the real columns.
      auto log_row = [&](index_t i) -> T {
        At<Row> a(t_buf, 1, np), e(e_buf, 1, np);
        a = At<const Row>(logk + i * np, 1, np) + At<const Row>(gt, 1, np);
        e = (a - a.maxCoeff()).exp();
        return e.head(n).sum();
      };

      for (;;) {
        // The calling thread (master) alone adds the sums and talks to other ranks, so MPI needs no more
        // than MPI_THREAD_FUNNELED; the barrier after it is the one single would have had.
        SSR_OMP(master) {
          ++iterations;
          std::fill(colsum, colsum + n, 0.0);
          for (index_t blk = 0; blk < blocks; ++blk)
            for (index_t j = 0; j < n; ++j) colsum[j] += partial[blk * n + j];
          if (comm) detail::sum_over_ranks(*comm, HostStream{}, colsum, n, b.limbs);
          double error_sum = 0;
          for (index_t j = 0; j < n; ++j) error_sum += math::column_error(colsum[j], target);
          err = math::marginal_error(error_sum, rows_total);
          done = math::stop(err, iterations, spec.sinkhorn);
          if (!done) absorb = update_columns(b, m, n, target, comm);
        }
        SSR_OMP(barrier)
        if (done) break;
        if (absorb) {
          SSR_OMP(for schedule(static))
          for (index_t i = 0; i < m; ++i) {
            At<Row> a(t_buf, 1, np);
            a = At<const Row>(logk + i * np, 1, np) + At<const Row>(ht, 1, np);
            row_top[i] = a.maxCoeff();
            At<Row>(q + i * np, 1, np) = (a - row_top[i]).exp();
          }
        }
        SSR_OMP(for schedule(static))
        for (index_t blk = 0; blk < blocks; ++blk) pass(blk);
      }

      // The plan of the last pass, t / r, from Q and v without exp: its top-k, weights and, when asked,
      // the plan itself. Where a chosen expert's Q has underflowed below tiny, the values near it have
      // lost precision and could tie, so that row is redone in the log domain, where the ranking is exact.
      const auto exact = [&](index_t i) {
        const std::int32_t* idx = out.experts.row(i);
        bool all = true;
        for (int r = 0; r < spec.k; ++r) all = all && q[i * np + idx[r]] >= tiny;
        return all;
      };
      // Score weights from the chosen experts' logits (plan weights come from the plan values).
      const auto score_weights = [&](index_t i) {
        const std::int32_t* idx = out.experts.row(i);
        const T* srow = s.row(i);
        T* w = out.weights.row(i);
        math::score_weights(
            spec.select.score, spec.k, [srow, idx](int r) { return srow[idx[r]]; },
            [w](int r, double value) { w[r] = static_cast<T>(value); });
      };
      const auto final_row = [&](index_t i) {
        std::int32_t* idx = out.experts.row(i);
        const T* qrow = q + i * np;
        for (index_t c = 0; c < np; c += W) At<Chunk>(t_buf + c) = At<const Chunk>(qrow + c) * At<const Chunk>(v + c);
        V::topk_row(t_buf, n, np, spec.k, idx);
        const T* p_row = t_buf;
        T inv = T(1) / row_sum[i];
        if (!exact(i)) {
          inv = T(1) / log_row(i);
          V::topk_row(t_buf, n, np, spec.k, idx);  // ranking by log Pi: exact where Pi would tie
          p_row = e_buf;
        }
        if (spec.weights == Weights::plan) {
          T* w = out.weights.row(i);
          math::normalised_weights(
              spec.k, [p_row, idx](int r) { return p_row[idx[r]]; },
              [w](int r, double value) { w[r] = static_cast<T>(value); });
        } else {
          score_weights(i);
        }
        if (!out.plan.empty()) {
          T* p = out.plan.row(i);
          for (index_t j = 0; j < n; ++j) p[j] = p_row[j] * inv;
        }
      };
      if (spec.k > V::tile_k || !out.plan.empty()) {
        SSR_OMP(for schedule(static))
        for (index_t i = 0; i < m; ++i) final_row(i);
      } else {
        // Tiles of rows by columns: t = Q * v, the same bits as a row's, then top-k and plan weights of
        // the whole tile at once (V::topk_tile_weights); rows it cannot take go through final_row.
        const index_t tiles = (m + V::tile - 1) / V::tile;
        T* by_columns = b.tiles + V::tile * np * tid;
        SSR_OMP(for schedule(static))
        for (index_t tl = 0; tl < tiles; ++tl) {
          const index_t i0 = tl * V::tile, in_tile = std::min<index_t>(V::tile, m - i0);
          V::load_tile(q + i0 * np, np, in_tile, n, by_columns);
          V::scale_tile(by_columns, v, n);
          const MatrixView<std::int32_t> experts(out.experts.row(i0), in_tile, spec.k, out.experts.stride);
          const MatrixView<T> weights(out.weights.row(i0), in_tile, spec.k, out.weights.stride);
          const bool tiled = V::topk_tile_weights(Weights::plan, by_columns, n, spec.k, in_tile, experts, weights);
          for (index_t i = i0; i < i0 + in_tile; ++i) {
            if (!tiled || !exact(i)) {
              final_row(i);
            } else if (spec.weights == Weights::scores) {
              score_weights(i);  // over the plan weights the tile wrote
            }
          }
        }
      }
    });
    info.set(SolveStats{iterations, math::converged(err, spec.sinkhorn) ? 1 : 0, err});
  }

 private:
  // The next g (math::next_column_potential, or the log-domain update where math::takes_log_update);
  // then gt and v follow. Returns true when h absorbed g, so Q must be recomputed.
  static bool update_columns(const Buffers& b, index_t m, index_t n, const math::ColumnTarget& target,
                             const Communicator<HostStream>* comm) {
    bool any_log = false;
    for (index_t j = 0; j < n; ++j) {
      b.log_update[j] = math::takes_log_update<T>(b.colsum[j], comm != nullptr) ? 1 : 0;
      any_log = any_log || b.log_update[j];
      if (!b.log_update[j]) b.g[j] = math::next_column_potential<T>(b.g[j], b.colsum[j], target);
    }
    if (any_log) log_domain_columns(b, m, n, target, comm);
    bool absorb = false;
    for (index_t j = 0; j < n; ++j) {
      b.gt[j] = static_cast<T>(b.g[j]);
      absorb = absorb ||
               std::abs(static_cast<double>(b.gt[j]) - static_cast<double>(b.ht[j])) > CpuTuning::absorb_bound<T>();
    }
    if (absorb) std::copy(b.gt, b.gt + n, b.ht);
    for (index_t j = 0; j < n; ++j)
      b.v[j] = static_cast<T>(std::exp(static_cast<double>(b.gt[j]) - static_cast<double>(b.ht[j])));
    return absorb;
  }

  // The log-domain update of the flagged columns, g_j from logsumexp_i(K_ij + f_i): over this call's rows,
  // or over every rank's (the maxima, then the sums below them, reduced exactly). Every rank flags the same
  // columns, as their sums are the same bits.
  static void log_domain_columns(const Buffers& b, index_t m, index_t n, const math::ColumnTarget& target,
                                 const Communicator<HostStream>* comm) {
    const index_t np = CpuTuning::padded(n);
    const auto entry = [&](index_t i, index_t j) {  // K_ij + f_i
      return static_cast<double>(b.logk[i * np + j]) - static_cast<double>(b.row_top[i]) -
             std::log(static_cast<double>(b.row_sum[i]));
    };
    if (!comm) {
      for (index_t j = 0; j < n; ++j)
        if (b.log_update[j])
          b.g[j] = math::recovered_column_potential<T>(
              m, [&](index_t i) { return entry(i, j); }, target);
      return;
    }
    for (index_t j = 0; j < n; ++j) {
      b.column_max[j] = -std::numeric_limits<double>::infinity();
      if (b.log_update[j])
        for (index_t i = 0; i < m; ++i) b.column_max[j] = std::max(b.column_max[j], entry(i, j));
    }
    comm->max(b.column_max, static_cast<std::size_t>(n), HostStream{});
    for (index_t j = 0; j < n; ++j) {
      b.column_sum[j] = 0;
      if (b.log_update[j])
        for (index_t i = 0; i < m; ++i) b.column_sum[j] += std::exp(entry(i, j) - b.column_max[j]);
    }
    detail::sum_over_ranks(*comm, HostStream{}, b.column_sum, n, b.limbs);
    for (index_t j = 0; j < n; ++j)
      if (b.log_update[j])
        b.g[j] = math::column_potential_from_lse<T>(b.column_max[j] + std::log(b.column_sum[j]), target);
  }
};

}  // namespace cpu
}  // namespace ssr
