// SoftmaxTopK: the vanilla router. T_i = topk(C~_i, k), w_ij = softmax(S_i) restricted to T_i.
#pragma once

#include <cmath>

#include "ssr/context.hpp"
#include "ssr/error.hpp"
#include "ssr/spec.hpp"

namespace ssr {

struct SoftmaxTopK {
  int k = 2;
  Cost cost = Cost::linear;  // only changes the result under noise: top-k of S and of softmax(S) agree

  constexpr SoftmaxTopK() = default;
  constexpr explicit SoftmaxTopK(int k_, Cost cost_ = Cost::linear) : k(k_), cost(cost_) {}

  void validate() const { detail::require(k >= 1, "k", k, "must be at least 1"); }

  RouteSpec resolve(const Context& ctx) const {
    RouteSpec s;
    s.path = Path::softmax;
    s.k = k;
    s.cost = cost;
    s.weights = Weights::scores;
    s.seed = ctx.seed;
    s.layer = ctx.layer;
    s.step = ctx.step;
    s.first_row = ctx.first_row;
    return s;
  }
};

}  // namespace ssr
