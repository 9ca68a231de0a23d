// Router<Policy, Backend>: the one entry point. It validates every argument, asks the policy what this
// call computes (RouteSpec), and has the backend compute it on the caller's buffers.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "ssr/backend/cpu.hpp"
#include "ssr/context.hpp"
#include "ssr/dispatch.hpp"
#include "ssr/load_stats.hpp"
#include "ssr/losses.hpp"
#include "ssr/error.hpp"
#include "ssr/policy/noisy_cost.hpp"
#include "ssr/policy/selective.hpp"
#include "ssr/policy/sinkhorn_topk.hpp"
#include "ssr/policy/softmax_topk.hpp"
#include "ssr/policy/traits.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {

template <class Policy, class Backend = CpuBackend<float>>
class Router {
  static_assert(is_policy<Policy>::value,
                "ssr::Router<Policy, Backend>: Policy is not a routing policy (it needs validate() and "
                "resolve(const Context&) returning RouteSpec), e.g. SoftmaxTopK or SinkhornTopK");

 public:
  using policy_type = Policy;
  using backend_type = Backend;
  using value_type = typename Backend::value_type;
  using T = value_type;

  // Validates the policy once: it cannot change afterwards (policy() is const).
  explicit Router(Policy policy = {}, Backend backend = {}) : policy_(std::move(policy)), backend_(std::move(backend)) {
    policy_.validate();
  }

  const Policy& policy() const { return policy_; }
  Backend& backend() { return backend_; }
  const Backend& backend() const { return backend_; }

  // The spec this router runs for ctx: the path, and for training calls the noise and the coin.
  RouteSpec resolve(const Context& ctx) const { return policy_.resolve(ctx); }

  // Routes m tokens over n experts. Every argument is checked before anything is written.
  RouteInfo route(ConstMatrixView<T> logits, const Context& ctx, const RouteOutputs<T>& out) {
    const RouteSpec spec = policy_.resolve(ctx);
    const index_t m = logits.rows, n = logits.cols;
    detail::require(n >= 1, "logits.cols", n, "must be at least 1 (the number of experts)");
    detail::require(m >= 0, "logits.rows", m, "must be >= 0");
    detail::require(spec.k <= n, "k", spec.k, "must be at most the number of experts n = " + std::to_string(n));
    if (m > 0) {
      detail::require_shape(logits, "logits", m, n);
      detail::require_shape(out.experts, "experts", m, spec.k);
      detail::require_shape(out.weights, "weights", m, spec.k);
      if (!out.plan.empty()) detail::require_shape(out.plan, "plan", m, n);
      if (!out.noise.empty()) detail::require_shape(out.noise, "noise", m, n);
    }
    if (!out.load.empty()) detail::require_size(out.load, "load", n);
    if (m > 0) backend_.check_finite(logits);
    return backend_.route(spec, logits, out);
  }

  // Maps dL/dw (m x k) to dL/dS (m x n) for the call that produced experts, weights and info.
  void backward(const RouteInfo& info, ConstMatrixView<std::int32_t> experts, ConstMatrixView<T> weights,
                ConstMatrixView<T> grad_weights, MatrixView<T> grad_logits) const {
    const index_t m = experts.rows, n = grad_logits.cols, k = experts.cols;
    detail::require(n >= 1, "grad_logits.cols", n, "must be at least 1 (the number of experts)");
    detail::require(k >= 1 && k <= n, "experts.cols", k, "must be in [1, n = " + std::to_string(n) + "]");
    if (m == 0) return;
    detail::require_shape(experts, "experts", m, k);
    detail::require_shape(weights, "weights", m, k);
    detail::require_shape(grad_weights, "grad_weights", m, k);
    detail::require_shape(grad_logits, "grad_logits", m, n);
    backend_.check_backward(experts, weights, grad_weights, n);
    backend_.backward(info, experts, weights, grad_weights, grad_logits);
  }

 private:
  Policy policy_;
  Backend backend_;
};

// The routers of the paper, ready made.
// SSR: Sinkhorn (plan weights, optional noise) with probability p in training, noisy softmax top-k otherwise.
using SSRPolicy = SelectivePolicy<NoisyCost<SinkhornTopK>, NoisyCost<SoftmaxTopK>>;

inline SSRPolicy make_ssr(int k = 2, Cost cost = Cost::linear, double p = 1e-3, SinkhornParams sinkhorn = {},
                          double noise_alpha = 0, double noise_sigma = 1) {
  return SSRPolicy(NoisyCost<SinkhornTopK>(SinkhornTopK(k, cost, sinkhorn, Weights::plan), noise_alpha, noise_sigma),
                   NoisyCost<SoftmaxTopK>(SoftmaxTopK(k, cost), noise_alpha, noise_sigma), p);
}

}  // namespace ssr
