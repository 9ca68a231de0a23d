// SoftmaxTopK: the vanilla router. T_i = topk(C~_i, k), w_ij = softmax(S_i) restricted to T_i; with a
// Selection, T_i = the top-k of s(S_i) + b among the best groups and w_ij = s(S_ij) / sum over T_i.
#pragma once

#include "ssr/context.hpp"
#include "ssr/error.hpp"
#include "ssr/spec.hpp"
#include "ssr/validate.hpp"

namespace ssr {

struct SoftmaxTopK {
  int k = 2;
  Cost cost = Cost::linear;  // only changes the result under noise: top-k of S and of softmax(S) agree
  Selection select{};

  constexpr SoftmaxTopK() = default;
  constexpr explicit SoftmaxTopK(int k_, Cost cost_ = Cost::linear, Selection select_ = {})
      : k(k_), cost(cost_), select(select_) {}

  void validate() const {
    detail::require(k >= 1, "k", k, "must be at least 1");
    detail::validate(select);
  }

  RouteSpec resolve(const Context& /*ctx*/) const {
    RouteSpec s;
    s.path = Path::softmax;
    s.k = k;
    s.cost = cost;
    s.weights = Weights::scores;
    s.select = select;
    return s;
  }
};

}  // namespace ssr
