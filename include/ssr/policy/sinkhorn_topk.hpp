// SinkhornTopK: balance tokens over experts by entropic optimal transport, route by the plan.
// In evaluation it routes as SoftmaxTopK: balancing is a training-time device. Its selection's score
// function gives the score weights (Weights::scores); the plan selects, so the expert bias is not used
// in training, and group-limited top-k, a rule of score-based selection, is rejected.
#pragma once

#include "ssr/context.hpp"
#include "ssr/error.hpp"
#include "ssr/policy/softmax_topk.hpp"
#include "ssr/spec.hpp"

namespace ssr {

struct SinkhornTopK {
  int k = 2;
  Cost cost = Cost::linear;
  SinkhornParams params{};
  Weights weights = Weights::plan;
  Selection select{};

  SinkhornTopK() = default;
  explicit SinkhornTopK(int k_, Cost cost_ = Cost::linear, SinkhornParams params_ = {},
                        Weights weights_ = Weights::plan, Selection select_ = {})
      : k(k_), cost(cost_), params(params_), weights(weights_), select(select_) {}

  void validate() const {
    SoftmaxTopK(k, cost, select).validate();
    detail::validate(params);
    detail::require(!select.grouped(), "topk_groups", select.topk_groups, "must equal n_groups = ", select.n_groups,
                    " on the Sinkhorn path: the plan selects over all experts (group-limited top-k is a rule "
                    "of the softmax router)");
  }

  RouteSpec resolve(const Context& ctx) const {
    RouteSpec s = SoftmaxTopK(k, cost, select).resolve(ctx);
    if (ctx.mode == Mode::train) {
      s.path = Path::sinkhorn;
      s.sinkhorn = params;
      s.weights = weights;  // the plan selects: the context's expert bias is not read
    }
    return s;
  }
};

}  // namespace ssr
