// CpuBackend<T>: routing on the host with Eigen, over OpenMP threads where the build has them.
// Rows are independent except in the Sinkhorn column sums, which are added per fixed block of rows and
// then in block order, so any thread count gives the same bits.
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "ssr/backend/cpu/noise.hpp"
#include "ssr/backend/cpu/simd.hpp"
#include "ssr/backend/cpu/sinkhorn.hpp"
#include "ssr/backend/cpu/tally.hpp"
#include "ssr/backend/cpu/tuning.hpp"
#include "ssr/call.hpp"
#include "ssr/detail/aligned.hpp"
#include "ssr/detail/parallel.hpp"
#include "ssr/detail/workspace.hpp"
#include "ssr/error.hpp"
#include "ssr/math/backward.hpp"
#include "ssr/math/cost.hpp"
#include "ssr/math/noise.hpp"
#include "ssr/math/select.hpp"
#include "ssr/math/sinkhorn.hpp"
#include "ssr/math/topk.hpp"
#include "ssr/math/weights.hpp"
#include "ssr/spec.hpp"
#include "ssr/validate.hpp"
#include "ssr/view.hpp"

namespace ssr {

template <class T>
class CpuBackend {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                "ssr::CpuBackend<T>: T must be float or double");

 public:
  using value_type = T;
  using stream_type = HostStream;
  using options_type = CallOptions<HostStream>;
  // The logits element types route reads: T only.
  template <class L>
  static constexpr bool reads_logits = std::is_same<L, T>::value;

  // threads = 0: as many as OpenMP offers; results never depend on it.
  CpuBackend() : CpuBackend(0) {}
  explicit CpuBackend(int threads) : threads_(threads) {
    detail::require(threads >= 0, "threads", threads, "must be >= 0 (0: all available)");
  }

  int threads() const { return threads_ > 0 ? threads_ : detail::max_threads(); }
  // The threads a call over `elements` matrix elements uses, one below `least` (CpuTuning).
  int threads_for(index_t elements, index_t least = CpuTuning::parallel_min_elements) const {
    return elements < least ? 1 : threads();
  }
  int threads_for(index_t elements, Path path) const {
    return threads_for(elements, path == Path::sinkhorn ? CpuTuning::sinkhorn_parallel_min_elements
                                                        : CpuTuning::parallel_min_elements);
  }

  // Bytes of workspace a call of this spec and shape uses (for CallOptions::workspace).
  std::size_t workspace_bytes(const RouteSpec& spec, index_t m, index_t n) const {
    detail::Carve c;
    layout(c, spec, m, n);
    return c.bytes();
  }
  // Bytes of the backend's own workspace: it only grows, so same-shaped calls allocate once.
  std::size_t held_workspace_bytes() const { return own_.capacity(); }

  // Runs a resolved spec; the Router checked the arguments (and their values, unless told not to).
  RouteInfo route(const RouteSpec& spec, ConstMatrixView<T> s, const RouteOutputs<T>& out,
                  const options_type& options) {
    const index_t m = s.rows, n = s.cols;
    RouteInfo info = initial_info(spec);
    // A rank without rows still takes part in a distributed solve's reductions.
    const bool solve = spec.path == Path::sinkhorn && math::problem_rows(spec, m) > 0;
    Layout buffers{};
    if (m > 0 || solve) {
      detail::Carve c = detail::carve_workspace(options.workspace, workspace_bytes(spec, m, n),
                                                [this](std::size_t needed) { return own_.reserve(needed); });
      buffers = layout(c, spec, m, n);
      if (solve) {
        if (!cpu::Sinkhorn<T>::solve(buffers.sinkhorn, spec, s, out, info, threads_for(m * n, Path::sinkhorn),
                                     options.communicator, checks_while_routing(spec, options)))
          check_finite(s, options);  // a non-finite logit was read: throws, naming the first
      } else if (!route_softmax(spec, s, out, buffers, checks_while_routing(spec, options))) {
        check_finite(s, options);
      }
    }
    if (!out.load.empty()) count_load(out.experts, out.load, buffers.counts, threads_for(m * n, spec.path));
    return info;
  }

  // Whether route looks for non-finite logits as it reads them, where the Router would otherwise scan them
  // first (ssr/router.hpp): a solve whose setup reads each logit once (Sinkhorn::checks_logits), on this
  // process's rows alone (with a communicator, every rank checks before the collective solve starts); and
  // the plain softmax top-k by tiles, which checks each group's rows as it copies them, before it writes
  // any output (route_softmax).
  bool checks_while_routing(const RouteSpec& spec, const options_type& options) const {
    if (!options.check_finite) return false;
    if (spec.path == Path::sinkhorn) return !options.communicator && cpu::Sinkhorn<T>::checks_logits(spec);
    return softmax_by_tiles(spec);
  }

  // Throws ssr::Error naming the first non-finite logit in row-major order.
  void check_finite(ConstMatrixView<T> s, const options_type& /*options*/) const {
    index_t first = std::numeric_limits<index_t>::max();
    const index_t m = s.rows, n = s.cols, rows = std::max<index_t>(1, CpuTuning::block_elements / n);
    const index_t blocks = (m + rows - 1) / rows;
    detail::parallel(threads_for(m * n, CpuTuning::check_parallel_min_elements), [&] {
      index_t mine = std::numeric_limits<index_t>::max();
      SSR_OMP(for schedule(static) nowait)
      for (index_t blk = 0; blk < blocks; ++blk) {
        const index_t i0 = blk * rows, i1 = std::min(m, i0 + rows);
        if (s.stride == n && cpu::Simd<T>::all_finite(s.row(i0), (i1 - i0) * n)) continue;  // the block at once
        for (index_t i = i0; i < i1 && mine == std::numeric_limits<index_t>::max(); ++i) {
          const T* row = s.row(i);
          if (cpu::Simd<T>::all_finite(row, n)) continue;
          for (index_t j = 0; j < n; ++j) {
            if (!math::is_finite(row[j])) {
              mine = std::min(mine, i * n + j);
              break;
            }
          }
        }
      }
      SSR_OMP(critical(ssr_check_finite))
      first = std::min(first, mine);
    });
    if (first != std::numeric_limits<index_t>::max())
      detail::fail_non_finite_logit(first / n, first % n, s(first / n, first % n));
  }

  // dL/dS from dL/dw (ssr/math/backward.hpp); the Router validated the shapes (logits: when read).
  void backward(const RouteInfo& info, ConstMatrixView<T> logits, ConstMatrixView<std::int32_t> experts,
                ConstMatrixView<T> weights, ConstMatrixView<T> grad_weights, MatrixView<T> grad_logits,
                const options_type& options) {
    const index_t m = grad_logits.rows, n = grad_logits.cols;
    const int k = static_cast<int>(experts.cols);
    if (options.check_finite) check_backward(experts, weights, grad_weights, n);
    const bool pass = info.weights == Weights::scores;
    detail::parallel_for(threads_for(m * n), m, [&](index_t i) {
      T* out = grad_logits.row(i);
      std::fill(out, out + n, T(0));
      if (!pass) return;
      const std::int32_t* e = experts.row(i);
      const T *w = weights.row(i), *g = grad_weights.row(i);
      const T* s = logits.empty() ? nullptr : logits.row(i);
      math::backward_row(
          info.score, k, [w](int r) { return w[r]; }, [g](int r) { return g[r]; }, [s, e](int r) { return s[e[r]]; },
          [out, e](int r, double d) { out[e[r]] = static_cast<T>(d); });
    });
  }

  // Host calls are complete when they return.
  void wait(RouteInfo& /*info*/, const options_type& /*options*/) {}

 private:
  struct Layout {
    double* xbuf;          // softmax path: a group's noise and costs in tiles per thread (a row's values without noise)
    T* rows;               // softmax path: a group of tiles of rows by columns per thread
    T* lists;              // softmax by tiles: each group's top-k lists (Simd::topk_of_tiles), kept for its outputs
    std::uint8_t* listed;  // softmax by tiles: per group, whether its lists were taken
    typename cpu::Sinkhorn<T>::Buffers sinkhorn;
    std::int32_t* counts;  // count_load's counters, per thread
  };

  // count_load's counters an expert.
  static constexpr index_t load_copies = 8;

  Layout layout(detail::Carve& c, const RouteSpec& spec, index_t m, index_t n) const {
    const int nt = threads_for(m * n, spec.path);
    Layout l{};
    if (spec.path == Path::sinkhorn) {
      l.sinkhorn = cpu::Sinkhorn<T>::layout(c, m, n, nt);
    } else {
      l.xbuf = c.take<double>(static_cast<std::size_t>(2 * cpu::Simd<T>::group_rows * n * nt));
      l.rows = c.take<T>(static_cast<std::size_t>(cpu::Simd<T>::group_rows * CpuTuning::padded(n) * nt));
      if (softmax_by_tiles(spec)) {
        const auto groups = static_cast<std::size_t>((m + cpu::Simd<T>::group_rows - 1) / cpu::Simd<T>::group_rows);
        l.lists = c.take<T>(groups * static_cast<std::size_t>(lists_size(spec.k)));
        l.listed = c.take<std::uint8_t>(groups);
      }
    }
    l.counts = c.take<std::int32_t>(static_cast<std::size_t>(load_copies * n * nt));
    return l;
  }

  // Throws ssr::Error at the first assignment whose expert is outside [0, n) or whose weight or gradient
  // is not finite.
  void check_backward(ConstMatrixView<std::int32_t> experts, ConstMatrixView<T> weights,
                      ConstMatrixView<T> grad_weights, index_t n) const {
    for (index_t i = 0; i < experts.rows; ++i)
      for (index_t r = 0; r < experts.cols; ++r)
        if (!math::valid_assignment(experts(i, r), n, weights(i, r), grad_weights(i, r)))
          detail::fail_bad_assignment(i, r, experts(i, r), n, weights(i, r), grad_weights(i, r));
  }

  // The plain softmax top-k, the common call, goes by groups of tiles (Simd::topk_of_tiles).
  static bool softmax_by_tiles(const RouteSpec& spec) {
    return spec.path != Path::sinkhorn && !spec.noisy() && spec.plain_selection() && spec.k <= cpu::Simd<T>::tile_k;
  }
  // A group's top-k lists: k values and k experts a row.
  static index_t lists_size(int k) { return 2 * index_t{k} * cpu::Simd<T>::group_rows; }

  // Where check (checks_while_routing): returns false, having written nothing, where a logit is not finite;
  // else true.
  bool route_softmax(const RouteSpec& spec, ConstMatrixView<T> s, const RouteOutputs<T>& out, const Layout& buffers,
                     bool check) const {
    const index_t m = s.rows, n = s.cols;
    using V = cpu::Simd<T>;
    const int k = spec.k;
    // Row i without noise.
    const auto route_row = [&](index_t i) {
      double* x = buffers.xbuf + 2 * V::group_rows * n * detail::thread_id();
      const T* row = s.row(i);
      std::int32_t* idx = out.experts.row(i);
      const auto logit = [row](index_t j) { return static_cast<double>(row[j]); };
      if (spec.plain_selection()) {
        math::topk(n, k, idx, logit);  // top-k of S and of c(S) agree
      } else {
        // The selection values once into x (math::select_row ranks the same values).
        const math::CostShift shift = math::score_shift(n, spec.select.score, logit);
        for (index_t j = 0; j < n; ++j) x[j] = math::selection_value(spec.select.score, logit(j), shift, spec.bias, j);
        math::select_topk(n, k, spec.select, idx, [x](index_t j) { return x[j]; });
      }
      score_weights(spec, s, out, i);
      if (!out.noise.empty())
        math::noise_output(
            spec, n, [](index_t) { return 0.0; }, out.noise.row(i));
    };
    if (spec.noisy()) {
      route_noisy(spec, s, out, buffers);
      return true;
    }
    if (!softmax_by_tiles(spec)) {
      detail::parallel_for(threads_for(m * n), m, route_row);
      return true;
    }
    // Groups of tiles of rows copied by columns: first each group's rows copied (the copy tells whether they
    // were finite: the logits are read once) and its top-k lists kept, then, where every logit was finite or
    // none is checked, the experts and weights from the lists (or row by row where a group's were not taken).
    const index_t groups = (m + V::group_rows - 1) / V::group_rows;
    const int nt = threads_for(m * n);
    bool non_finite = false;
    detail::parallel(nt, [&] {
      bool finite = true;
      SSR_OMP(for schedule(static))
      for (index_t grp = 0; grp < groups; ++grp) {
        T* x = buffers.rows + V::group_rows * CpuTuning::padded(n) * detail::thread_id();  // aligned
        const index_t i0 = grp * V::group_rows, rows = std::min(V::group_rows, m - i0);
        // A last, partial tile repeats its last row.
        finite = V::load_tiles(s.row(i0), s.stride, rows, n, x) && finite;
        buffers.listed[grp] = V::topk_of_tiles(x, n, nullptr, k, rows, buffers.lists + grp * lists_size(k));
      }
      if (check && !finite) {
        SSR_OMP(atomic write)
        non_finite = true;
      }
      SSR_OMP(barrier)
      if (non_finite) return;  // every thread, after the barrier
      SSR_OMP(for schedule(static))
      for (index_t grp = 0; grp < groups; ++grp) {
        const index_t i0 = grp * V::group_rows, rows = std::min(V::group_rows, m - i0);
        const MatrixView<std::int32_t> experts(out.experts.row(i0), rows, k, out.experts.stride);
        const MatrixView<T> weights(out.weights.row(i0), rows, k, out.weights.stride);
        if (!buffers.listed[grp] || !V::outputs_of_tiles(Weights::scores, nullptr, n, nullptr, k, rows,
                                                         buffers.lists + grp * lists_size(k), experts, weights)) {
          for (index_t q = 0; q < rows; ++q) route_row(i0 + q);
          continue;
        }
        if (!out.noise.empty())
          for (index_t q = 0; q < rows; ++q)
            math::noise_output(
                spec, n, [](index_t) { return 0.0; }, out.noise.row(i0 + q));
      }
    });
    return !non_finite;
  }

  // The softmax path with noise (softmax scores without groups: NoisyCost::validate), a group of tiles of
  // rows at a time: their noise drawn at once (cpu::noise::tiles), their costs in tiles of doubles
  // (Simd::cost_of_tiles, math::cost_row's values), the top-k of those (topk_tiles_weights over the doubles,
  // the experts alone; else math::topk a row), then the group's softmax score weights at once
  // (Simd::softmax_score_weights, k <= tile_k; else math::score_weights a row).
  void route_noisy(const RouteSpec& spec, ConstMatrixView<T> s, const RouteOutputs<T>& out,
                   const Layout& buffers) const {
    using V = cpu::Simd<T>;
    const index_t m = s.rows, n = s.cols, groups = (m + V::group_rows - 1) / V::group_rows;
    const int k = spec.k;
    detail::parallel_for(threads_for(m * n), groups, [&](index_t grp) {
      const int tid = detail::thread_id();
      double* z = buffers.xbuf + 2 * V::group_rows * n * tid;
      double* cost = z + V::group_rows * n;
      T* x = buffers.rows + V::group_rows * CpuTuning::padded(n) * tid;
      const index_t i0 = grp * V::group_rows, rows = std::min(V::group_rows, m - i0);
      cpu::noise::tiles(spec, i0, rows, n, z);
      V::cost_of_tiles(s.row(i0), s.stride, rows, n, spec, z, x, cost);
      const MatrixView<std::int32_t> experts(out.experts.row(i0), rows, k, out.experts.stride);
      if (!cpu::Simd<double>::topk_tiles_weights(Weights::scores, cost, n, nullptr, k, rows, experts, {}))
        for (index_t q = 0; q < rows; ++q)
          math::topk(n, k, experts.row(q), [cost, q, n](index_t j) { return cost[V::at_tile(q, j, n)]; });
      if (spec.select.score == Score::softmax && k <= V::tile_k)
        V::softmax_score_weights(s.row(i0), s.stride, rows, k, experts,
                                 MatrixView<T>(out.weights.row(i0), rows, k, out.weights.stride));
      else
        for (index_t i = i0; i < i0 + rows; ++i) score_weights(spec, s, out, i);
      if (!out.noise.empty())
        for (index_t q = 0; q < rows; ++q)
          math::noise_output(
              spec, n, [z, q, n](index_t j) { return z[V::at_tile(q, j, n)]; }, out.noise.row(i0 + q));
    });
  }

  // Row i's weights from its chosen experts' logits (math::score_weights).
  static void score_weights(const RouteSpec& spec, ConstMatrixView<T> s, const RouteOutputs<T>& out, index_t i) {
    const T* row = s.row(i);
    const std::int32_t* idx = out.experts.row(i);
    T* w = out.weights.row(i);
    math::score_weights(
        spec.select.score, spec.k, [row, idx](int r) { return row[idx[r]]; },
        [w](int r, double value) { w[r] = static_cast<T>(value); });
  }

  // load[j]: how many chosen entries name expert j. Each of load_copies consecutive entries goes to its own
  // counter of the expert, the counters added at the end: one counter an expert made increments of the
  // same expert wait on each other's stores, and most tokens choose the same few experts (16% of a softmax
  // top-k route at 24576 x 16 went to it); for n <= 16 on a processor with AVX-512, eight entries at once
  // into the thread's cpu::tally instead. On the route's `threads`, each over the groups of rows
  // schedule(static) gave it there, whose experts it wrote and still holds in its cache (read by the
  // calling thread alone, half of them crossed from the other core: a two-thread softmax top-k at 24576 x 8
  // took as long as one thread), into counters of its own; integer sums, the same on any thread count.
  // Experts with a row stride, or fewer entries than counters (a call without rows among them, which carved
  // no counters): one counter an expert, load itself.
  static void count_load(ConstMatrixView<std::int32_t> experts, VectorView<std::int32_t> load, std::int32_t* counts,
                         int threads) {
    const index_t n = load.size, k = experts.cols, entries = experts.rows * k;
    if (experts.stride != k || entries < load_copies * n) {  // n >= 1 (validate.hpp)
      std::fill(load.data, load.data + n, 0);
      for (index_t i = 0; i < experts.rows; ++i)
        for (index_t r = 0; r < k; ++r) ++load[experts(i, r)];
      return;
    }
    constexpr index_t group_rows = cpu::Simd<T>::group_rows;
    const index_t groups = (experts.rows + group_rows - 1) / group_rows, per_thread = load_copies * n;
    const std::int32_t* e = experts.data;
    std::fill(counts, counts + per_thread * threads, 0);  // all of them: a team may have fewer threads
    const bool tallied = cpu::tally::available(n);
    detail::parallel(threads, [&] {
      std::int32_t* own = counts + per_thread * detail::thread_id();
      cpu::tally::Tally tally;
      SSR_OMP(for schedule(static))
      for (index_t grp = 0; grp < groups; ++grp) {
        const index_t end = std::min(entries, (grp + 1) * group_rows * k);
        index_t x = grp * group_rows * k;
        if (tallied) {
          cpu::tally::add(tally, e + x, end - x, n, own);
          continue;
        }
        for (; x + load_copies <= end; x += load_copies)
          for (index_t c = 0; c < load_copies; ++c) ++own[c * n + e[x + c]];
        for (; x < end; ++x) ++own[e[x]];
      }
      if (tallied) cpu::tally::finish(tally, n, own);
    });
    for (index_t j = 0; j < n; ++j) {
      std::int32_t sum = 0;
      for (index_t c = 0; c < load_copies * threads; ++c) sum += counts[c * n + j];
      load[j] = sum;
    }
  }

  int threads_ = 0;
  detail::AlignedBuffer<unsigned char> own_;
};

}  // namespace ssr
