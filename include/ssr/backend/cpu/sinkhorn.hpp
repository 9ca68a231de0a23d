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
// K and Q are held in tiles of 8 rows by columns (Simd::at_tile): a vector holds one column of several
// rows, so a row's sum needs no horizontal additions and the final top-k reads the tiles as they are.
// With a communicator, the column sums (and a log-domain column's maximum and sum) are reduced over the
// ranks that share the problem, exactly (detail::sum_over_ranks), so every rank takes the same steps.
// The setup builds K and Q a tile at a time (from the logits by columns, in float or double; with noise, a
// block's drawn at once into tiles, in double) and makes the first pass on the way. The float kernel is
// built in Q's place and exponentiated there, so K is never written out: the steps that read K again, all
// rare (absorption, rows and columns redone in the log domain), build it again from the logits, the same
// bits. The final plan, top-k and weights are the last pass's t / r, from Q and v without exp, except for
// rows whose chosen experts' Q underflowed, which are redone in the log domain; a pass that looks like the
// last takes that top-k as it goes, kept where the pass was the last. The float kernel's setup
// also tells whether every logit it read was finite, so the backend need not scan them beforehand
// (CpuBackend::checks_while_routing).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>

#include "ssr/backend/cpu/lanes.hpp"
#include "ssr/backend/cpu/noise.hpp"
#include "ssr/backend/cpu/pass.hpp"
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
    T *logk, *q, *v, *vt, *gt, *ht, *partial, *scratch, *tiles, *row_top, *row_sum;
    double *g, *colsum, *noise, *cost_tile;
    // Distributed solves: exact-sum limbs, and the log-domain columns' flags, maxima and sums.
    std::int64_t* limbs;
    std::int32_t* log_update;
    double *column_max, *column_sum;
    std::uint8_t* taken;   // per group of tiles: its top-k taken by the pass that looked like the last
    std::uint32_t* below;  // per group of tiles: the rows it leaves to final_row (Simd::topk_tiles_weights)
  };

  // Lays out the buffers of an m x n solve on nt threads.
  static Buffers layout(detail::Carve& c, index_t m, index_t n, int nt) {
    const index_t np = CpuTuning::padded(n), blocks = CpuTuning::blocks(m, n);
    const auto mt = static_cast<std::size_t>((m + V::tile - 1) / V::tile * V::tile);  // whole tiles
    const auto nz = static_cast<std::size_t>(n), npz = static_cast<std::size_t>(np);
    const auto threads = static_cast<std::size_t>(nt);
    Buffers b{};
    b.logk = c.take<T>(mt * nz);  // K and Q in tiles by columns (Simd::at_tile)
    b.q = c.take<T>(mt * nz);
    b.v = c.take<T>(nz);
    b.vt = c.take<T>(static_cast<std::size_t>(V::tile) * nz);  // v spread over a tile's columns (Simd::spread)
    b.gt = c.take<T>(npz);                                     // g rounded to T: what both forms use; padded with zeros
    b.ht = c.take<T>(nz);                                      // h, the absorbed part of g
    b.partial = c.take<T>(static_cast<std::size_t>(blocks * n));
    b.scratch = c.take<T>(2 * npz * threads);                               // rows t and e per thread
    b.tiles = c.take<T>(static_cast<std::size_t>(V::tile) * nz * threads);  // a tile per thread
    b.row_top = c.take<T>(mt);                                              // c_i; f_i = -(row_top_i + log row_sum_i)
    b.row_sum = c.take<T>(mt);
    b.g = c.take<double>(nz);
    b.colsum = c.take<double>(nz);
    b.noise = c.take<double>(static_cast<std::size_t>(noise_tiles(m, n)) * V::tile * nz * threads);  // a block's
    b.cost_tile = c.take<double>(static_cast<std::size_t>(V::tile) * nz * threads);  // a tile per thread (kernel_tiles)
    b.limbs = c.take<std::int64_t>(static_cast<std::size_t>(math::exact_limbs * n));
    b.log_update = c.take<std::int32_t>(nz);
    b.column_max = c.take<double>(nz);
    b.column_sum = c.take<double>(nz);
    b.taken = c.take<std::uint8_t>(static_cast<std::size_t>((m + V::group_rows - 1) / V::group_rows));
    b.below = c.take<std::uint32_t>(static_cast<std::size_t>((m + V::group_rows - 1) / V::group_rows));
    return b;
  }

  // Whether the setup reads each logit once, into the float kernel (V::float_kernel_tiles), so that it can
  // tell whether they were all finite.
  static bool checks_logits(const RouteSpec& spec) { return !spec.noisy() && V::float_kernel(spec); }

  // comm: the ranks sharing the problem (spec.total_rows rows in all), or null. check (where
  // checks_logits): returns false, having written nothing, where a logit is not finite; else true.
  static bool solve(const Buffers& b, const RouteSpec& spec, ConstMatrixView<T> s, const RouteOutputs<T>& out,
                    RouteInfo& info, int nt, const Communicator<HostStream>* comm, bool check = false) {
    constexpr index_t tile = V::tile;
    const index_t m = s.rows, n = s.cols, np = CpuTuning::padded(n), size = n * tile;  // size: a tile's elements
    const index_t tiles = (m + tile - 1) / tile, last_rows = m - (tiles - 1) * tile;
    const index_t tiles_per_block = CpuTuning::rows_per_block(n) / tile, blocks = CpuTuning::blocks(m, n);
    T *logk = b.logk, *q = b.q, *v = b.v, *gt = b.gt, *ht = b.ht, *partial = b.partial, *row_top = b.row_top,
      *row_sum = b.row_sum;
    double *g = b.g, *colsum = b.colsum;
    std::fill(g, g + n, 0.0);
    std::fill(gt, gt + np, T(0));
    std::fill(ht, ht + n, T(0));
    std::fill(v, v + n, T(1));
    V::spread(v, n, b.vt);

    const index_t rows_total = math::problem_rows(spec, m);
    const math::ColumnTarget target = math::column_target(rows_total, n);
    const T tiny = static_cast<T>(math::underflow_threshold<T>());
    const bool float_form = checks_logits(spec);
    const auto bound = static_cast<T>(math::cost_bound<T>()), scale = static_cast<T>(1.0 / spec.sinkhorn.xi);
    bool done = false, absorb = false, non_finite = false, kernel_held = !float_form;
    int iterations = 0;
    double err = 0, errs[2] = {0, 0};  // the errors of the two iterations before
    // The final top-k goes a group of tiles at a time (V::topk_tiles_weights) where k <= tile_k and the plan
    // is not asked. A pass that looks like the last (`speculate`) takes each group's top-k as soon as it has
    // gone over the group's tiles, still in the caches; if the pass was the last, the final stage keeps the
    // groups it took (b.taken), so that it need not read Q again. Same bits: the same function of the same
    // Q and v.
    const bool by_tiles = spec.k <= V::tile_k && out.plan.empty();
    const index_t groups = (tiles + V::group - 1) / V::group;
    bool speculate = false;

    detail::parallel(nt, [&] {
      const int tid = detail::thread_id();
      T* t_buf = b.scratch + index_t{2} * tid * np;
      T* e_buf = t_buf + np;
      T* by_columns = b.tiles + size * tid;
      double* noise = b.noise + noise_tiles(m, n) * size * tid;  // a block's noise in tiles (noise::tiles)
      double* cost_tile = b.cost_tile + size * tid;

      // Tiles [t0, t1) of block blk; the real rows of tile tl.
      const auto block_tiles = [&](index_t blk) {
        return std::pair<index_t, index_t>(blk * tiles_per_block, std::min(tiles, (blk + 1) * tiles_per_block));
      };
      const auto rows_of = [&](index_t tl) { return tl == tiles - 1 ? last_rows : tile; };
      const bool plan_weights = spec.weights == Weights::plan;  // else the experts alone, then score weights
      // The top-k of group grp from Q and v, and its plan weights where asked; false where the group must go
      // row by row (the outputs then undefined). The rows whose chosen Q underflowed below tiny are left to
      // final_row: their bits in b.below[grp].
      const auto group_by_tiles = [&](index_t grp) {
        const index_t i0 = grp * V::group_rows, rows = std::min(V::group_rows, m - i0);
        const MatrixView<std::int32_t> experts(out.experts.row(i0), rows, spec.k, out.experts.stride);
        const MatrixView<T> weights(out.weights.row(i0), rows, spec.k, out.weights.stride);
        return V::topk_tiles_weights(Weights::plan, q + grp * V::group * size, n, v, spec.k, rows, experts,
                                     plan_weights ? weights : MatrixView<T>{}, tiny, b.below + grp);
      };
      // One pass over the tiles of block blk, into the block's column sums, inside the caller's scope that
      // flushes subnormals; the pass reads block `ahead` (the one after it, where not -1 and as long)
      // meanwhile.
      const auto pass = [&](const lanes::FlushSubnormals& flushed, index_t blk, index_t ahead) {
        const auto [t0, t1] = block_tiles(blk);
        const T* next = nullptr;
        if (ahead >= 0) {
          const auto [a0, a1] = block_tiles(ahead);
          if (a1 - a0 >= t1 - t0) next = q + a0 * size;
        }
        V::pass_tiles(flushed, q + t0 * size, v, b.vt, n, t1 - t0, row_sum + t0 * tile, partial + blk * n, next);
      };
      // Each thread takes the same blocks in every pass; where its share is small enough
      // (CpuTuning::alternate_max_bytes) it walks them forward and backward in turn, so that a pass starts on
      // the blocks the one before it read last, still in the core's caches. The order of the blocks changes
      // no bits (each has its own column sums, added in block order). `backward` is the next walk's
      // direction; the setup walks forward.
      const std::pair<index_t, index_t> own = detail::own_range(blocks);
      const bool alternate =
          (own.second - own.first) * tiles_per_block * size * index_t{sizeof(T)} <= CpuTuning::alternate_max_bytes;
      bool backward = alternate;
      // The groups whose tiles all lie in this thread's blocks: [own_groups.first, own_groups.second).
      const index_t own_t0 = own.first < own.second ? block_tiles(own.first).first : 0;
      const index_t own_t1 = own.first < own.second ? block_tiles(own.second - 1).second : 0;
      const index_t first_own_group = (own_t0 + V::group - 1) / V::group;
      const std::pair<index_t, index_t> own_groups(
          first_own_group, std::max(first_own_group, own_t1 == tiles ? groups : own_t1 / V::group));
      // Subnormals are flushed once for the whole walk, but for each block alone where the walk takes top-ks
      // between the blocks (those keep their subnormals).
      const auto pass_own = [&] {
        const index_t count = own.second - own.first;
        const auto pass_at = [&](const lanes::FlushSubnormals& flushed, index_t i) {  // the walk's i-th block
          const index_t blk = backward ? own.second - 1 - i : own.first + i, ahead = backward ? blk - 1 : blk + 1;
          pass(flushed, blk, ahead >= own.first && ahead < own.second ? ahead : -1);
          return blk;
        };
        if (!speculate) {
          const lanes::FlushSubnormals flush;
          for (index_t i = 0; i < count; ++i) pass_at(flush, i);
        } else {
          index_t g0 = own_groups.first, g1 = own_groups.second;  // the groups not yet taken
          for (index_t i = 0; i < count; ++i) {
            const index_t blk = [&] {
              const lanes::FlushSubnormals flush;
              return pass_at(flush, i);
            }();
            const auto [t0, t1] = block_tiles(blk);  // the pass has gone over [own_t0, t1) or [t0, own_t1)
            if (!backward)
              for (; g0 < g1 && std::min(tiles, (g0 + 1) * V::group) <= t1; ++g0) b.taken[g0] = group_by_tiles(g0);
            else
              for (; g1 > g0 && (g1 - 1) * V::group >= t0; --g1) b.taken[g1 - 1] = group_by_tiles(g1 - 1);
          }
        }
        backward = alternate && !backward;
      };

      // K = cost / xi in tiles, padding rows -inf; Q = exp(K) (h = 0, c = 0); and with it the first pass.
      // The float kernel goes into Q's place (k), other kernels are kept; eight rows at a time
      // (float_kernel_tiles, kernel_tiles), with the block's noise drawn at once.
      bool finite = true;
      for (index_t blk = own.first; blk < own.second; ++blk) {
        const auto [t0, t1] = block_tiles(blk);
        const index_t i0 = t0 * tile, rows = std::min(m, t1 * tile) - i0;
        T* k = (float_form ? q : logk) + t0 * size;
        if (float_form) {
          finite = V::float_kernel_tiles(s.row(i0), s.stride, rows, n, bound, scale, k, spec.cost) && finite;
        } else if (!spec.noisy()) {
          V::kernel_tiles(s.row(i0), s.stride, rows, n, spec, cost_tile, k);
        } else {
          noise::tiles(spec, i0, rows, n, noise);
          V::kernel_tiles(s.row(i0), s.stride, rows, n, spec, cost_tile, k, noise);
          if (!out.noise.empty())
            for (index_t r = 0; r < rows; ++r)
              math::noise_output(
                  spec, n, [&](index_t j) { return noise[V::at_tile(r, j, n)]; }, out.noise.row(i0 + r));
        }
        V::fill_lanes(k + (t1 - 1 - t0) * size, n, rows_of(t1 - 1), -std::numeric_limits<T>::infinity());
        // The block's exps in one loop: its packets are independent. exp(-inf) may be a tiny double
        // (Eigen's exp), so the padding rows' Q is set to 0. Meanwhile the next block's logits are brought
        // into the caches, where the next kernel finds them: the exps' work hides their reads from beyond L2
        // (1.07-1.18x a solve at 24576 x 16, 24576 and 65536 x 128).
        lanes::Ahead next;
        if (blk + 1 < own.second) {
          const index_t a0 = t1 * tile;
          next = lanes::Ahead(s.row(a0), std::min(m, block_tiles(blk + 1).second * tile) - a0, n, s.stride, sizeof(T));
        }
        V::exp_row(k, q + t0 * size, (t1 - t0) * size, next);
        if (t1 == tiles) V::fill_lanes(q + (tiles - 1) * size, n, last_rows, T(0));
        std::fill(row_top + t0 * tile, row_top + t1 * tile, T(0));
        const lanes::FlushSubnormals flush;  // for the pass alone: the kernel and exp keep their subnormals
        pass(flush, blk, -1);                // the next block is not written yet
      }
      if (check && !finite) {
        SSR_OMP(atomic write)
        non_finite = true;
      }
      SSR_OMP(barrier)
      if (non_finite) return;  // every thread, after the barrier: the caller names the value

      // Tile tl of K: the held one, or the float kernel built again in `into` (a tile), padding rows -inf.
      const auto kernel_tile = [&](index_t tl, T* into) -> const T* {
        if (kernel_held) return logk + tl * size;
        V::float_kernel_tiles(s.row(tl * tile), s.stride, rows_of(tl), n, bound, scale, into, spec.cost);
        V::fill_lanes(into, n, rows_of(tl), -std::numeric_limits<T>::infinity());
        return into;
      };

      // Row i in the log domain: a = K_i + g into t_buf, e = exp(a - max a) into e_buf; returns the sum
      // of e over the real columns. Its tile of K is built once for all its rows that need it (by_columns
      // holds no other tile by then: the final rows come after every absorption).
      index_t tile_in_columns = -1;
      const T* row_tile = nullptr;
      auto log_row = [&](index_t i) -> T {
        if (i / tile != tile_in_columns) {
          tile_in_columns = i / tile;
          row_tile = kernel_tile(tile_in_columns, by_columns);
        }
        V::gather_row(row_tile, i % tile, n, np, nullptr, -std::numeric_limits<T>::infinity(), t_buf);
        At<Row> a(t_buf, 1, np), e(e_buf, 1, np);
        a += At<const Row>(gt, 1, np);
        e = (a - a.maxCoeff()).exp();
        return e.head(n).sum();
      };

      for (;;) {
        // The calling thread (master) alone adds the sums and talks to other ranks, so MPI needs no more
        // than MPI_THREAD_FUNNELED; the barrier after it is the one single would have had.
        SSR_OMP(master) {
          ++iterations;
          pass::add_blocks(partial, blocks, n, colsum);
          if (comm) detail::sum_over_ranks(*comm, HostStream{}, colsum, n, b.limbs);
          double error_sum = 0;
          for (index_t j = 0; j < n; ++j) error_sum += math::column_error(colsum[j], target);
          err = math::marginal_error(error_sum, rows_total);
          done = math::stop(err, iterations, spec.sinkhorn);
          if (!done) {
            // The next pass is the last where the iterations run out, and likely the last where the error,
            // falling geometrically by the slower of its last two ratios, would fall below tol. Before two
            // ratios are known, the first error squared stands in for the missing: near a uniform kernel both
            // the first error and the ratio come from the kernel's spread (measured ratios 0.06 to 0.3 times
            // err_1^2: the softmax cost's solves, which converge in two or three iterations, and the linear
            // cost's, whose err_1 near 1 keeps the first two passes out).
            const double ratio = iterations == 1   ? err * err
                                 : iterations == 2 ? std::max(err / errs[1], errs[1] * errs[1])
                                                   : std::max(err / errs[1], errs[1] / errs[0]);
            speculate = by_tiles && (iterations + 1 >= spec.sinkhorn.max_iters || err * ratio < spec.sinkhorn.tol);
            // No pass takes a group across two threads' blocks: its zero stays.
            if (speculate) std::fill(b.taken, b.taken + groups, std::uint8_t{0});
            absorb = update_columns(b, m, n, target, comm, [&] {  // every tile of K, once
              if (kernel_held) return;
              for (index_t tl = 0; tl < tiles; ++tl) kernel_tile(tl, logk + tl * size);
              kernel_held = true;
            });
          }
          errs[0] = errs[1];
          errs[1] = err;
        }
        SSR_OMP(barrier)
        if (done) break;
        if (absorb) {  // Q = exp(K + h - c) with c the row's maximum, by tiles
          SSR_OMP(for schedule(static))
          for (index_t tl = 0; tl < tiles; ++tl) {
            const T* ktile = kernel_tile(tl, by_columns);  // by_columns, rewritten in place below
            using Column = typename V::Column;
            Column top = Column::Constant(-std::numeric_limits<T>::infinity());
            for (index_t j = 0; j < n; ++j) top = top.max(At<const Column>(ktile + j * tile) + ht[j]);
            for (index_t j = 0; j < n; ++j)
              At<Column>(by_columns + j * tile) = (At<const Column>(ktile + j * tile) + ht[j]) - top;
            V::exp_row(by_columns, q + tl * size, size);
            V::fill_lanes(q + tl * size, n, rows_of(tl), T(0));
            At<Column>(row_top + tl * tile) = top;
          }
        }
        pass_own();
        SSR_OMP(barrier)
      }

      // The plan of the last pass, t / r, from Q and v without exp: its top-k, weights and, when asked,
      // the plan itself. Where a chosen expert's Q has underflowed below tiny, the values near it have
      // lost precision and could tie, so that row is redone in the log domain, where the ranking is exact.
      const auto exact = [&](index_t i) {
        const std::int32_t* idx = out.experts.row(i);
        bool all = true;
        for (int r = 0; r < spec.k; ++r) all = all && q[V::at_tile(i, idx[r], n)] >= tiny;
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
        V::gather_row(q, i, n, np, v, T(0), t_buf);  // t = Q_i * v, the pass's products
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
      // A group of tiles at a time: top-k of t = Q * v and plan weights of the whole group at once
      // (group_by_tiles), or kept from the last pass where it took them, then its rows whose chosen Q is below
      // tiny through final_row; the groups it cannot take go row by row through final_row.
      const std::pair<index_t, index_t> final_groups = detail::own_range(groups);  // walked as the next pass would
      for (index_t step = 0; step < final_groups.second - final_groups.first; ++step) {
        const index_t grp = backward ? final_groups.second - 1 - step : final_groups.first + step;
        const index_t i0 = grp * V::group_rows, rows = std::min(V::group_rows, m - i0);
        if (!spec.noisy() && !out.noise.empty())  // no noise: zeros
          for (index_t i = i0; i < i0 + rows; ++i)
            math::noise_output(
                spec, n, [](index_t) { return 0.0; }, out.noise.row(i));
        const MatrixView<std::int32_t> experts(out.experts.row(i0), rows, spec.k, out.experts.stride);
        const MatrixView<T> weights(out.weights.row(i0), rows, spec.k, out.weights.stride);
        if (by_tiles && ((speculate && b.taken[grp]) || group_by_tiles(grp))) {
          if (!plan_weights && spec.select.score == Score::softmax)
            V::softmax_score_weights(s.row(i0), s.stride, rows, spec.k, experts, weights);
          else if (!plan_weights)
            for (index_t i = i0; i < i0 + rows; ++i) score_weights(i);
          // Then the rows left to final_row, after the group's score weights: final_row changes their experts.
          if (b.below[grp] != 0)
            for (index_t r = 0; r < rows; ++r)
              if (b.below[grp] >> r & 1U) final_row(i0 + r);
        } else {
          for (index_t i = i0; i < i0 + rows; ++i) final_row(i);
        }
      }
    });
    if (non_finite) return false;
    info.set(SolveStats{iterations, math::converged(err, spec.sinkhorn) ? 1 : 0, err});
    return true;
  }

 private:
  // Tiles of noise a thread holds: a block's, or every row's where there are fewer.
  static index_t noise_tiles(index_t m, index_t n) {
    return (std::min(m, CpuTuning::rows_per_block(n)) + V::tile - 1) / V::tile;
  }

  // The next g (math::next_column_potential, or the log-domain update where math::takes_log_update, after
  // hold_kernel() has made b.logk hold K); then gt and v follow. Returns true when h absorbed g, so Q must
  // be recomputed.
  template <class HoldKernel>
  static bool update_columns(const Buffers& b, index_t m, index_t n, const math::ColumnTarget& target,
                             const Communicator<HostStream>* comm, const HoldKernel& hold_kernel) {
    bool any_log = false;
    for (index_t j = 0; j < n; ++j) {
      b.log_update[j] = math::takes_log_update<T>(b.colsum[j], comm != nullptr) ? 1 : 0;
      any_log = any_log || b.log_update[j];
      if (!b.log_update[j]) b.g[j] = math::next_column_potential<T>(b.g[j], b.colsum[j], target);
    }
    if (any_log) {
      hold_kernel();
      log_domain_columns(b, m, n, target, comm);
    }
    bool absorb = false;
    for (index_t j = 0; j < n; ++j) {
      b.gt[j] = static_cast<T>(b.g[j]);
      absorb = absorb || math::absorbs(b.gt[j], b.ht[j]);
    }
    if (absorb) std::copy(b.gt, b.gt + n, b.ht);
    for (index_t j = 0; j < n; ++j) b.v[j] = math::scaling(b.gt[j], b.ht[j]);
    Simd<T>::spread(b.v, n, b.vt);
    return absorb;
  }

  // The log-domain update of the flagged columns, g_j from logsumexp_i(K_ij + f_i): over this call's rows,
  // or over every rank's (the maxima, then the sums below them, reduced exactly). Every rank flags the same
  // columns, as their sums are the same bits.
  static void log_domain_columns(const Buffers& b, index_t m, index_t n, const math::ColumnTarget& target,
                                 const Communicator<HostStream>* comm) {
    const auto entry = [&](index_t i, index_t j) {  // K_ij + f_i
      return static_cast<double>(b.logk[Simd<T>::at_tile(i, j, n)]) - static_cast<double>(b.row_top[i]) -
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
