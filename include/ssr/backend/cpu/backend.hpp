// CpuBackend<T>: routing on the host, over OpenMP threads where the build has them. Rows go a tile at a
// time in vectors (tiles.hpp, lanes.hpp) through the definitions of math/, on the widest instruction set
// the processor runs (isa.hpp); the Sinkhorn column sums are added per fixed block of rows and then in
// block order, so any thread count gives the same bits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ssr/backend/cpu/load.hpp"
#include "ssr/backend/cpu/sinkhorn.hpp"
#include "ssr/backend/cpu/softmax.hpp"
#include "ssr/backend/cpu/tuning.hpp"
#include "ssr/call.hpp"
#include "ssr/context.hpp"
#include "ssr/detail/aligned.hpp"
#include "ssr/detail/parallel.hpp"
#include "ssr/detail/workspace.hpp"
#include "ssr/error.hpp"
#include "ssr/math/backward.hpp"
#include "ssr/math/sinkhorn.hpp"
#include "ssr/spec.hpp"
#include "ssr/validate.hpp"
#include "ssr/view.hpp"

SSR_LANES_BEGIN
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
  // The threads a call over `elements` matrix elements uses: one below `least` (CpuTuning).
  int threads_for(index_t elements, index_t least = CpuTuning::parallel_min_elements) const {
    return elements < least ? 1 : threads();
  }

  // Bytes of workspace a call of this spec and shape uses (for CallOptions::workspace).
  std::size_t workspace_bytes(const RouteSpec& spec, index_t m, index_t n) const {
    detail::validate_sizes(m, n);  // a layout divides by n
    detail::Carve c;
    layout(c, spec, m, n);
    return c.bytes();
  }
  // Bytes of the backend's own workspace: it only grows, so same-shaped calls allocate once.
  std::size_t held_workspace_bytes() const { return own_.capacity(); }

  // Grows the backend's own workspace to what a call of this spec and shape needs, unless options bring
  // one: the Router does so among a distributed call's agreed checks.
  void reserve_workspace(const RouteSpec& spec, index_t m, index_t n, const options_type& options) {
    (void)detail::carve_workspace(options.workspace, workspace_bytes(spec, m, n), own_workspace());
  }

  // Runs a resolved spec; the Router checked the arguments (and their values, unless told not to).
  RouteInfo route(const RouteSpec& spec, const Context& ctx, ConstMatrixView<T> s, const RouteOutputs<T>& out,
                  const options_type& options) {
    const index_t m = s.rows, n = s.cols;
    RouteInfo info = initial_info(spec);
    // A rank without rows still takes part in a distributed solve's reductions.
    const bool solve = spec.path == Path::sinkhorn && math::problem_rows(spec, m) > 0;
    if (m == 0 && !solve) {
      std::fill(out.load.data, out.load.data + out.load.size, 0);
      return info;
    }
    detail::Carve c = detail::carve_workspace(options.workspace, workspace_bytes(spec, m, n), own_workspace());
    const Layout b = layout(c, spec, m, n);
#if !defined(__CUDA_ARCH__)  // nvcc's device pass compiles no host code, and its device code has no lanes
    if (solve) {
      cpu::Sinkhorn<T>::solve(b.sinkhorn, spec, ctx, s, out, info,
                              threads_for(m * n, CpuTuning::sinkhorn_parallel_min_elements), options.communicator);
    } else {
      route_softmax(cpu::Softmax<T>{spec, ctx, s, out}, b);
    }
#endif
    if (!out.load.empty()) cpu::count_load(out.experts, out.load, b.counts, threads_for(m * n));
    return info;
  }

  // Throws ssr::Error naming the first non-finite logit in row-major order: blocks of rows scanned in
  // lanes (all_finite), and a block that holds one value by value.
  void check_finite(ConstMatrixView<T> s, const options_type& /*options*/) const {
    constexpr index_t block = 64;
    const index_t m = s.rows, n = s.cols, blocks = (m + block - 1) / block;
    index_t first = std::numeric_limits<index_t>::max();
    detail::parallel(threads_for(m * n, CpuTuning::check_parallel_min_elements), [&] {
      index_t mine = std::numeric_limits<index_t>::max();
      SSR_OMP(for schedule(static) nowait)
      for (index_t b = 0; b < blocks; ++b) {
        const index_t i1 = std::min(m, (b + 1) * block);
        if (mine != std::numeric_limits<index_t>::max() || all_finite(s, b * block, i1)) continue;
        for (index_t e = b * block * n; e < i1 * n && mine == std::numeric_limits<index_t>::max(); ++e)
          if (!math::is_finite(s(e / n, e % n))) mine = e;
      }
      SSR_OMP(critical(ssr_check_finite))
      first = std::min(first, mine);
    });
    if (first != std::numeric_limits<index_t>::max())
      detail::fail_non_finite_logit(first / n, first % n, s(first / n, first % n));
  }

  // dL/dS from dL/dw (ssr/math/backward.hpp); the Router validated the shapes (logits: when read).
  void backward(const RouteInfo& info, const BackwardArgs<T>& a, const options_type& options) {
    const index_t m = a.grad_logits.rows, n = a.grad_logits.cols;
    const int k = static_cast<int>(a.experts.cols);
    if (options.check_finite) check_backward(a.experts, a.weights, a.grad_weights, n);
    const bool pass = info.weights == Weights::scores;
    detail::parallel_for(threads_for(m * n), m, [&](index_t i) {
      T* out = a.grad_logits.row(i);
      std::fill(out, out + n, T(0));
      if (!pass) return;
      const std::int32_t* e = a.experts.row(i);
      if (!math::experts_in_range(e, k, n)) {
        std::fill(out, out + n, std::numeric_limits<T>::quiet_NaN());
        return;
      }
      const T *w = a.weights.row(i), *g = a.grad_weights.row(i);
      const T* s = a.logits.empty() ? nullptr : a.logits.row(i);
      math::backward_row(
          info.score, k, [w](int r) { return w[r]; }, [g](int r) { return g[r]; }, [s, e](int r) { return s[e[r]]; },
          [out, e](int r, double d) { math::write_slot(out[e[r]], d); });
    });
  }

  // Host calls are complete when they return.
  void wait(RouteInfo& /*info*/, const options_type& /*options*/) {}

 private:
  struct Layout {
    cpu::SinkhornBuffers<T> sinkhorn;
    T* logits;              // softmax path: a tile per thread
    double *noise, *costs;  // softmax path: a tile of doubles each, per thread
    std::int32_t* counts;   // count_load's tallies, n * load_ways per thread
  };

  Layout layout(detail::Carve& c, const RouteSpec& spec, index_t m, index_t n) const {
    const int nt = std::max(threads_for(m * n), threads_for(m * n, CpuTuning::sinkhorn_parallel_min_elements));
    const auto tile = static_cast<std::size_t>(n * CpuTuning::tile * nt);
    Layout l{};
    if (spec.path == Path::sinkhorn) {
      l.sinkhorn = cpu::Sinkhorn<T>::layout(c, m, n, nt);
    } else {
      l.logits = c.take<T>(tile);
      l.noise = c.take<double>(tile);
      l.costs = c.take<double>(tile);
    }
    l.counts = c.take<std::int32_t>(static_cast<std::size_t>(n * cpu::load_ways * nt));
    return l;
  }

  // The softmax path: by tiles where it can, else row by row (cpu::Softmax).
  void route_softmax(const cpu::Softmax<T>& softmax, const Layout& b) const {
    const ConstMatrixView<T> s = softmax.s;
    const index_t n = s.cols;
    if (!softmax.by_tiles()) {
      detail::parallel_for(threads_for(s.rows * n), s.rows, [&](index_t i) { softmax.row_outputs(i); });
      return;
    }
    detail::parallel(threads_for(s.rows * n), [&] {
      const index_t scratch = n * CpuTuning::tile * detail::thread_id();
      const auto [t0, t1] = detail::own_range(CpuTuning::tiles(s.rows));
      softmax.tiles(t0, t1, b.logits + scratch, b.noise + scratch, b.costs + scratch);
    });
  }

  // Whether every value of rows [i0, i1) is finite: x - x is +0 exactly where x is finite, so the bits of
  // every x - x OR-ed together are 0; a vector of lanes at a time.
  static bool all_finite(ConstMatrixView<T> s, index_t i0, index_t i1) {
#if defined(__CUDA_ARCH__)  // as in route
    return s.empty() && i0 == i1;
#else
    return cpu::with_isa([&](auto /*isa*/) SSR_INLINE_LAMBDA {
      using V = cpu::Lanes<T>;
      using M = cpu::MaskOf<V>;
      const index_t n = s.cols;
      M seen{}, bits;
      V v, d;
      const auto scan = [&](const T* x, index_t count) SSR_INLINE_LAMBDA {
        index_t j = 0;
        for (; j + cpu::lanes <= count; j += cpu::lanes) {
          cpu::read(x + j, v);
          d = v - v;  // NOLINT(misc-redundant-expression): the test itself
          std::memcpy(&bits, &d, sizeof bits);
          seen |= bits;
        }
        for (; j < count; ++j) seen[0] |= math::is_finite(x[j]) ? 0 : 1;
      };
      if (s.stride == n) {  // the rows are one run of values
        scan(s.row(i0), (i1 - i0) * n);
      } else {
        for (index_t i = i0; i < i1; ++i) scan(s.row(i), n);
      }
      return !cpu::any(seen);
    });
#endif
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

  auto own_workspace() {
    return [this](std::size_t needed) { return own_.reserve(needed); };
  }

  int threads_ = 0;
  detail::AlignedBuffer<unsigned char> own_;
};

}  // namespace ssr
SSR_LANES_END
