// Router<Policy, Backend>: the one entry point. It validates every argument, asks the policy what this
// call computes (RouteSpec), and has the backend compute it on the caller's buffers, with the caller's
// stream, workspace and checks (CallOptions).
//
// Header weight: this header brings the policies, views, Router, losses, load statistics, expert bias and
// dispatch helpers, and the CPU backend (OpenMP) except in CUDA translation units, which include
// <ssr/backend/cpu.hpp> when they want it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "ssr/call.hpp"
#include "ssr/context.hpp"
#include "ssr/detail/digest.hpp"
#include "ssr/detail/workspace.hpp"
#include "ssr/dispatch.hpp"
#include "ssr/error.hpp"
#include "ssr/expert_bias.hpp"
#include "ssr/load_stats.hpp"
#include "ssr/losses.hpp"
#include "ssr/named.hpp"
#include "ssr/policy/noisy_cost.hpp"
#include "ssr/policy/selective.hpp"
#include "ssr/policy/sinkhorn_topk.hpp"
#include "ssr/policy/softmax_topk.hpp"
#include "ssr/policy/traits.hpp"
#include "ssr/spec.hpp"
#include "ssr/validate.hpp"
#include "ssr/view.hpp"

namespace ssr {

template <class T>
class CpuBackend;

namespace detail {
template <class B, class = void>
struct is_complete : std::false_type {};
template <class B>
struct is_complete<B, std::void_t<decltype(sizeof(B))>> : std::true_type {};

// Whether the backend looks for non-finite logits itself while this call reads them (a backend may say so
// through checks_while_routing(spec, options), throwing as check_finite would, before anything is written),
// so that the Router does not scan them first.
template <class B, class = void>
struct has_checks_while_routing : std::false_type {};
template <class B>
struct has_checks_while_routing<
    B, std::void_t<decltype(std::declval<const B&>().checks_while_routing(
           std::declval<const RouteSpec&>(), std::declval<const typename B::options_type&>()))>> : std::true_type {};
template <class B>
bool checks_while_routing(const B& backend, const RouteSpec& spec, const typename B::options_type& options) {
  if constexpr (has_checks_while_routing<B>::value) {
    return backend.checks_while_routing(spec, options);
  } else {
    return false;
  }
}

// Grows the backend's own workspace for a call now, where the backend can (reserve_workspace): a
// distributed call does so among the checks its ranks agree on, so that a failed allocation fails them all.
template <class B, class = void>
struct has_reserve_workspace : std::false_type {};
template <class B>
struct has_reserve_workspace<
    B, std::void_t<decltype(std::declval<B&>().reserve_workspace(std::declval<const RouteSpec&>(), index_t{}, index_t{},
                                                                 std::declval<const typename B::options_type&>()))>>
    : std::true_type {};
template <class B>
void reserve_workspace(B& backend, const RouteSpec& spec, index_t m, index_t n,
                       const typename B::options_type& options) {
  if constexpr (has_reserve_workspace<B>::value) backend.reserve_workspace(spec, m, n, options);
}

// What the ranks of a distributed call must hold alike: all the spec decides but its rows, the context's
// random key, and the number of experts (the length of every collective).
inline Alike distributed_call_alike(const RouteSpec& spec, const Context& ctx, index_t n) {
  Digest d;
  d.add(static_cast<int>(spec.path)).add(spec.k).add(static_cast<int>(spec.cost)).add(spec.noise_alpha);
  d.add(spec.noise_sigma).add(spec.sinkhorn.xi).add(spec.sinkhorn.tol).add(spec.sinkhorn.max_iters);
  d.add(static_cast<int>(spec.weights)).add(static_cast<int>(spec.select.score)).add(spec.select.n_groups);
  d.add(spec.select.topk_groups).add(static_cast<int>(ctx.mode)).add(ctx.step).add(std::uint64_t{ctx.layer});
  d.add(std::uint64_t{ctx.seed}).add(static_cast<std::int64_t>(n));
  return {d.value(),
          "numbers of experts or options (k, cost, noise, Sinkhorn parameters, weights, score, "
          "groups, mode, step, layer, seed)"};
}
}  // namespace detail

// dL/dw to dL/dS for the call that produced args.experts, args.weights and info from args.logits, on any
// backend: the gradient needs the backend and the RouteInfo, and the logits for sigmoid score weights only
// (may be empty otherwise). Shapes are checked here, values by the backend (unless options.check_finite
// is off).
template <class Backend, class T = typename Backend::value_type>
void backward(Backend& backend, const RouteInfo& info, const BackwardArgs<T>& args,
              const typename Backend::options_type& options = {}) {
  detail::validate_backward(info, args);
  if (args.experts.rows > 0) backend.backward(info, args, options);
}

template <class Policy, class Backend = CpuBackend<float>>
class Router {
  static_assert(is_policy<Policy>::value,
                "ssr::Router<Policy, Backend>: Policy is not a routing policy (it needs validate() and "
                "resolve(const Context&) returning RouteSpec), e.g. SoftmaxTopK or SinkhornTopK");
  static_assert(detail::is_complete<Backend>::value,
                "ssr::Router<Policy, Backend>: the backend is not defined here; include its header, e.g. "
                "<ssr/backend/cpu.hpp> (which <ssr/router.hpp> leaves out of CUDA translation units)");

 public:
  using policy_type = Policy;
  using backend_type = Backend;
  using value_type = typename Backend::value_type;
  using T = value_type;
  using options_type = typename Backend::options_type;

  // Validates the policy once: it cannot change afterwards (policy() is const).
  explicit Router(Policy policy = {}, Backend backend = {}) : policy_(std::move(policy)), backend_(std::move(backend)) {
    policy_.validate();
  }

  const Policy& policy() const { return policy_; }
  Backend& backend() { return backend_; }
  const Backend& backend() const { return backend_; }

  // The spec this router runs for ctx: the path, and for training calls the noise and the coin.
  RouteSpec resolve(const Context& ctx) const { return policy_.resolve(ctx); }

  // Workspace bytes of the call with this context over m x n logits (CallOptions::workspace), including
  // what backward needs.
  std::size_t workspace_bytes(index_t m, index_t n, const Context& ctx) const {
    return backend_.workspace_bytes(resolve(ctx), m, n);
  }
  // Workspace bytes enough for any call of this router over m x n logits, either path.
  std::size_t workspace_bytes(index_t m, index_t n) const {
    RouteSpec spec = resolve(Context::eval());
    spec.path = Path::softmax;
    const std::size_t softmax = backend_.workspace_bytes(spec, m, n);
    spec.path = Path::sinkhorn;
    const std::size_t sinkhorn = backend_.workspace_bytes(spec, m, n);
    return softmax > sinkhorn ? softmax : sinkhorn;
  }

  // Routes m tokens over n experts. Every argument is checked before anything is written. With
  // options.communicator, a Sinkhorn call balances the plan over every rank's tokens: all ranks make the
  // call together (each its own rows, ctx.first_row their global index), agree first that every rank's
  // call is valid (else each throws), and end with the same potentials and statistics.
  RouteInfo route(ConstMatrixView<T> logits, const Context& ctx, const RouteOutputs<T>& out,
                  const options_type& options = {}) {
    return route_as<T>(logits, ctx, out, options);
  }

  // The same for logits of another element type the backend reads (the CUDA backend: half and bfloat16
  // logits, computing in float).
  template <class L, std::enable_if_t<!std::is_same<std::remove_const_t<L>, T>::value, int> = 0>
  RouteInfo route(MatrixView<L> logits, const Context& ctx, const RouteOutputs<T>& out,
                  const options_type& options = {}) {
    using In = std::remove_const_t<L>;
    static_assert(Backend::template reads_logits<In>,
                  "ssr::Router::route: the backend does not read logits of this type");
    return route_as<In>(logits, ctx, out, options);
  }

  // Maps dL/dw (m x k) to dL/dS (m x n) for the call that produced args.experts, args.weights and info
  // from args.logits (read for sigmoid score weights only).
  void backward(const RouteInfo& info, const BackwardArgs<T>& args, const options_type& options = {}) {
    ssr::backward(backend_, info, args, options);
  }

  // Completes an info a GPU call returned before its solve statistics reached the host: waits for the
  // call's stream (options.stream) and reads them. Nothing to do for a complete info.
  void wait(RouteInfo& info, const options_type& options = {}) {
    if (!info.complete()) backend_.wait(info, options);
  }

 private:
  template <class In>
  RouteInfo route_as(ConstMatrixView<In> logits, const Context& ctx, const RouteOutputs<T>& out,
                     const options_type& options) {
    RouteSpec spec = policy_.resolve(ctx);
    const auto checks = [&] {
      detail::validate_route(spec, ctx.expert_bias, logits, out);
      if (!options.workspace.empty())
        detail::require_workspace(options.workspace, backend_.workspace_bytes(spec, logits.rows, logits.cols));
      if (options.check_finite && logits.rows > 0 && !detail::checks_while_routing(backend_, spec, options))
        backend_.check_finite(logits, options);
    };
    if (options.communicator && spec.path == Path::sinkhorn) {
      const auto checks_and_room = [&] {
        checks();
        detail::reserve_workspace(backend_, spec, logits.rows, logits.cols, options);
      };
      spec.total_rows = agree(*options.communicator, options.stream, logits.rows, checks_and_room,
                              detail::distributed_call_alike(spec, ctx, logits.cols));
    } else {
      checks();
    }
    RouteInfo info = backend_.route(spec, ctx, logits, out, options);
    if (options.wait) wait(info, options);
    return info;
  }

  Policy policy_;
  Backend backend_;
};

}  // namespace ssr

#if !defined(__CUDACC__)
#include "ssr/backend/cpu/backend.hpp"
#endif
