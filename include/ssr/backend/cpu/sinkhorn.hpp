// The CPU Sinkhorn solve: the scaled form of math/sinkhorn_scaled.hpp over tiles of rows (tiles.hpp), K and
// Q held by tiles, each thread its own blocks of the column sums in every step. One team of threads runs
// the solve in four steps: setup (each block's costs, K, Q and first pass), then per iteration update (the
// calling thread: the column sums, the error, the stopping decision and the next potentials) and, unless
// it stopped, absorb (where h took g) and pass; then finish (the top-k, weights and plan of the last pass).
// With a communicator, the column sums (and a log-domain column's maximum and sum) are reduced over the
// ranks that share the problem, exactly (detail::sum_over_ranks), so every rank takes the same steps.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <limits>

#include "ssr/backend/cpu/isa.hpp"
#include "ssr/backend/cpu/noise.hpp"
#include "ssr/backend/cpu/pass.hpp"
#include "ssr/backend/cpu/sinkhorn_finish.hpp"
#include "ssr/call.hpp"
#include "ssr/communicator.hpp"
#include "ssr/context.hpp"
#include "ssr/detail/parallel.hpp"
#include "ssr/detail/sum_over_ranks.hpp"
#include "ssr/detail/workspace.hpp"
#include "ssr/math/noise.hpp"
#include "ssr/math/sinkhorn.hpp"
#include "ssr/spec.hpp"

SSR_LANES_BEGIN
namespace ssr {
namespace cpu {

template <class T>
class Sinkhorn {
 public:
  // Lays out the buffers of an m x n solve on nt threads.
  static SinkhornBuffers<T> layout(ssr::detail::Carve& c, index_t m, index_t n, int nt) {
    const auto cells = static_cast<std::size_t>(CpuTuning::tiles(m) * tile * n), rows = cells / n;
    const auto cols = static_cast<std::size_t>(n), scratch = static_cast<std::size_t>(n * tile * nt);
    SinkhornBuffers<T> b{};
    b.k = c.take<T>(cells);
    b.q = c.take<T>(cells);
    b.top = c.take<T>(rows);
    b.row_sum = c.take<T>(rows);
    b.part = c.take<T>(static_cast<std::size_t>(math::sum_blocks(m, n)) * cols);
    b.gt = c.take<T>(cols);
    b.h = c.take<T>(cols);
    b.v = c.take<T>(cols);
    b.g = c.take<double>(cols);
    b.colsum = c.take<double>(cols);
    b.logits = c.take<T>(scratch);
    b.costs = c.take<double>(scratch);
    b.noise = c.take<double>(scratch);
    b.limbs = c.take<std::int64_t>(static_cast<std::size_t>(math::exact_limbs) * cols);
    b.log_update = c.take<std::int32_t>(cols);
    b.column_max = c.take<double>(cols);
    b.column_sum = c.take<double>(cols);
    return b;
  }

  // comm: the ranks sharing the problem (spec.total_rows rows in all), or null.
  static void solve(const SinkhornBuffers<T>& b, const RouteSpec& spec, const Context& ctx, ConstMatrixView<T> s,
                    const RouteOutputs<T>& out, RouteInfo& info, int nt, const Communicator<HostStream>* comm) {
    State x{b, spec, ctx, s, out, comm};
    x.target = math::column_target(x.rows, x.n);
    std::fill(b.g, b.g + x.n, 0.0);
    std::fill(b.gt, b.gt + x.n, T(0));
    std::fill(b.h, b.h + x.n, T(0));
    std::fill(b.v, b.v + x.n, T(1));
    ssr::detail::parallel(nt, [&] {
      setup(x);
      for (;;) {
        SSR_OMP(barrier)
        // The calling thread alone adds the sums and talks to other ranks (MPI_THREAD_FUNNELED suffices);
        // the barrier after it is the one `single` would have had.
        SSR_OMP(master)
        try {
          update(x);
        } catch (...) {  // a communicator's error: it stops every thread, and the solve rethrows it
          x.failure = std::current_exception();
          x.done = true;
        }
        SSR_OMP(barrier)
        if (x.done) break;
        if (x.absorb) absorb(x);
        pass(x);
      }
      if (!x.failure) finish(x);
    });
    if (x.failure) std::rethrow_exception(x.failure);
    info.set(SolveStats{x.iterations, math::converged(x.err, spec.sinkhorn) ? 1 : 0, x.err});
  }

 private:
  struct State {
    const SinkhornBuffers<T>& b;
    const RouteSpec& spec;
    const Context& ctx;  // the noise's stream
    ConstMatrixView<T> s;
    const RouteOutputs<T>& out;
    const Communicator<HostStream>* comm = nullptr;
    index_t m = s.rows, n = s.cols, rows = math::problem_rows(spec, s.rows), tiles = CpuTuning::tiles(s.rows);
    index_t block_tiles = math::sum_block_rows(s.cols) / tile, blocks = math::sum_blocks(s.rows, s.cols);
    math::ColumnTarget target{};
    bool done = false, absorb = false;
    int iterations = 0;
    double err = 0;
    std::exception_ptr failure{};  // nothing may be thrown out of a parallel region
  };

  // The calling thread's blocks, and the tiles [t0, t1) of block blk.
  static std::pair<index_t, index_t> own_blocks(const State& x) { return ssr::detail::own_range(x.blocks); }
  static std::pair<index_t, index_t> block_tiles(const State& x, index_t blk) {
    return {blk * x.block_tiles, std::min(x.tiles, (blk + 1) * x.block_tiles)};
  }
  static index_t rows_of(const State& x, index_t tl) { return std::min(tile, x.m - tl * tile); }

  static void pass_one(const State& x, index_t blk) {
    const index_t t0 = block_tiles(x, blk).first, t1 = block_tiles(x, blk).second;
    const FlushSubnormals flush;
    with_isa([&](auto isa) SSR_INLINE_LAMBDA {
      pass_block<T, decltype(isa)>(x.b.q + t0 * x.n * tile, x.b.v, x.n, t1 - t0, x.b.row_sum + t0 * tile,
                                   x.b.part + blk * x.n);
    });
  }

  // Each block's costs (with its noise, written out where asked), K, Q (h = 0) and first pass.
  static void setup(const State& x) {
    const auto& b = x.b;
    const index_t n = x.n, scratch = n * tile * ssr::detail::thread_id();
    T* logits = b.logits + scratch;
    double *costs = b.costs + scratch, *noise = b.noise + scratch;
    const double inv_xi = math::inverse_xi(x.spec.sinkhorn.xi);
    const auto [first, last] = own_blocks(x);
    for (index_t blk = first; blk < last; ++blk) {
      const index_t t0 = block_tiles(x, blk).first, t1 = block_tiles(x, blk).second;
      with_isa([&](auto isa) SSR_INLINE_LAMBDA {
        using Ops = decltype(isa);
        for (index_t tl = t0; tl < t1; ++tl) {
          const index_t i0 = tl * tile, rows = rows_of(x, tl);
          load_tile(x.s.row(i0), x.s.stride, rows, n, logits);
          if (x.spec.noisy()) noise_tile<Ops>(x.spec, x.ctx, i0, rows, n, noise);
          if (!x.out.noise.empty())
            write_noise_tile(x.spec, noise, n, rows, MatrixView<T>(x.out.noise.row(i0), rows, n, x.out.noise.stride));
          Lanes<T> c;
          kernel_tile<T, Ops>(x.spec, logits, n, x.spec.noisy() ? noise : nullptr, inv_xi, b.h, costs,
                              b.k + tl * n * tile, c);
          scaled_from<T, Ops>(b.k + tl * n * tile, b.h, n, rows, c, b.q + tl * n * tile, b.top + i0);
        }
      });
      pass_one(x, blk);
    }
  }

  // The column sums in block order, the error and the decision; then, unless it stops, the next g (the
  // log-domain update where math::takes_log_update), gt and v, and whether h absorbs g.
  static void update(State& x) {
    const auto& b = x.b;
    const index_t n = x.n;
    ++x.iterations;
    std::fill(b.colsum, b.colsum + n, 0.0);
    for (index_t blk = 0; blk < x.blocks; ++blk)
      for (index_t j = 0; j < n; ++j) b.colsum[j] += static_cast<double>(b.part[blk * n + j]);
    if (x.comm) ssr::detail::sum_over_ranks(*x.comm, HostStream{}, b.colsum, n, b.limbs);
    double error_sum = 0;
    for (index_t j = 0; j < n; ++j) error_sum += math::column_error(b.colsum[j], x.target);
    x.err = math::marginal_error(error_sum, x.rows);
    x.done = math::stop(x.err, x.iterations, x.spec.sinkhorn);
    if (x.done) return;
    bool any_log = false;
    for (index_t j = 0; j < n; ++j) {
      b.log_update[j] = math::takes_log_update<T>(b.colsum[j], x.comm != nullptr) ? 1 : 0;
      any_log = any_log || b.log_update[j] != 0;
      if (b.log_update[j] == 0) b.g[j] = math::next_column_potential<T>(b.g[j], b.colsum[j], x.target);
    }
    if (any_log) log_domain_columns(x);
    x.absorb = false;
    for (index_t j = 0; j < n; ++j) {
      b.gt[j] = static_cast<T>(b.g[j]);
      x.absorb = x.absorb || math::absorbs(b.gt[j], b.h[j]);
    }
    if (x.absorb) std::copy(b.gt, b.gt + n, b.h);
    for (index_t j = 0; j < n; ++j) b.v[j] = math::scaling(b.gt[j], b.h[j]);
  }

  // The log-domain update of the flagged columns, g_j from logsumexp_i(K_ij + f_i): over this call's rows,
  // or over every rank's (the maxima, then the sums below them, reduced exactly). Every rank flags the same
  // columns, as their sums are the same bits.
  static void log_domain_columns(const State& x) {
    const auto& b = x.b;
    const index_t m = x.m, n = x.n;
    const auto entry = [&](index_t j) {
      return [&b, j, n](index_t i) {
        return static_cast<double>(b.k[(i / tile * n + j) * tile + i % tile]) +
               math::row_potential(b.top[i], b.row_sum[i]);
      };
    };
    if (!x.comm) {
      for (index_t j = 0; j < n; ++j)
        if (b.log_update[j]) b.g[j] = math::recovered_column_potential<T>(m, entry(j), x.target);
      return;
    }
    for (index_t j = 0; j < n; ++j)
      b.column_max[j] = b.log_update[j] ? math::log_column_max(m, entry(j)) : -std::numeric_limits<double>::infinity();
    x.comm->max(b.column_max, static_cast<std::size_t>(n), HostStream{});
    for (index_t j = 0; j < n; ++j)
      b.column_sum[j] = b.log_update[j] ? math::log_column_sum(m, entry(j), b.column_max[j]) : 0.0;
    ssr::detail::sum_over_ranks(*x.comm, HostStream{}, b.column_sum, n, b.limbs);
    for (index_t j = 0; j < n; ++j)
      if (b.log_update[j]) b.g[j] = math::column_potential_from_halves<T>(b.column_max[j], b.column_sum[j], x.target);
  }

  // Q and c again from K and the new h, for the calling thread's blocks.
  static void absorb(const State& x) {
    const auto& b = x.b;
    const auto [first, last] = own_blocks(x);
    for (index_t blk = first; blk < last; ++blk) {
      const index_t t0 = block_tiles(x, blk).first, t1 = block_tiles(x, blk).second;
      with_isa([&](auto isa) SSR_INLINE_LAMBDA {
        for (index_t tl = t0; tl < t1; ++tl)
          scaled_tile<T, decltype(isa)>(b.k + tl * x.n * tile, b.h, x.n, rows_of(x, tl), b.q + tl * x.n * tile,
                                        b.top + tl * tile);
      });
    }
  }

  static void pass(const State& x) {
    const auto [first, last] = own_blocks(x);
    for (index_t blk = first; blk < last; ++blk) pass_one(x, blk);
  }

  // The outputs of the calling thread's tiles from the last pass (sinkhorn_finish.hpp).
  static void finish(const State& x) {
    const auto [first, last] = own_blocks(x);
    if (first >= last) return;
    Finish<T>{x.b, x.spec, x.s, x.out}.tiles(block_tiles(x, first).first, block_tiles(x, last - 1).second);
  }
};

}  // namespace cpu
}  // namespace ssr
SSR_LANES_END
