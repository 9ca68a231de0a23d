// SinkhornTopK: balance tokens over experts by entropic optimal transport, route by the plan.
// In evaluation it routes as SoftmaxTopK: balancing is a training-time device.
#pragma once

#include <cmath>

#include "ssr/context.hpp"
#include "ssr/error.hpp"
#include "ssr/policy/softmax_topk.hpp"
#include "ssr/spec.hpp"

namespace ssr {

namespace detail {
inline void validate(const SinkhornParams& p) {
  require(std::isfinite(p.xi) && p.xi > 0, "xi", p.xi, "must be finite and > 0");
  require(std::isfinite(p.tol) && p.tol > 0, "tol", p.tol, "must be finite and > 0");
  require(p.max_iters >= 1, "max_iters", p.max_iters, "must be at least 1");
}
}  // namespace detail

struct SinkhornTopK {
  int k = 2;
  Cost cost = Cost::linear;
  SinkhornParams params{};
  Weights weights = Weights::plan;

  SinkhornTopK() = default;
  explicit SinkhornTopK(int k_, Cost cost_ = Cost::linear, SinkhornParams params_ = {},
                        Weights weights_ = Weights::plan)
      : k(k_), cost(cost_), params(params_), weights(weights_) {}

  void validate() const {
    detail::require(k >= 1, "k", k, "must be at least 1");
    detail::validate(params);
  }

  RouteSpec resolve(const Context& ctx) const {
    RouteSpec s = SoftmaxTopK(k, cost).resolve(ctx);
    if (ctx.mode == Mode::train) {
      s.path = Path::sinkhorn;
      s.sinkhorn = params;
      s.weights = weights;
    }
    return s;
  }
};

}  // namespace ssr
