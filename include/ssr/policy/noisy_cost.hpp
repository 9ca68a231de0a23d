// NoisyCost<Inner>: in training, add Gaussian noise alpha * eps, eps ~ N(0, sigma^2), to the inner
// policy's cost before it selects experts. The weights keep their formula (noise is a constant).
#pragma once

#include <cmath>

#include "ssr/context.hpp"
#include "ssr/error.hpp"
#include "ssr/spec.hpp"

namespace ssr {

template <class Inner>
struct NoisyCost {
  Inner inner{};
  double alpha = 1;
  double sigma = 1;

  NoisyCost() = default;
  explicit NoisyCost(Inner inner_, double alpha_ = 1, double sigma_ = 1)
      : inner(inner_), alpha(alpha_), sigma(sigma_) {}

  void validate() const {
    inner.validate();
    detail::require(std::isfinite(alpha) && alpha >= 0, "alpha", alpha, "must be finite and >= 0");
    detail::require(std::isfinite(sigma) && sigma > 0, "sigma", sigma, "must be finite and > 0");
    // The noise perturbs the cost the softmax path ranks; a selection by sigmoid scores or groups ranks
    // no cost (with an expert bias, checked per call: detail::validate_selection).
    const RouteSpec train = resolve(Context::train(0));
    if (train.path == Path::softmax && train.noisy() && !train.plain_selection(nullptr))
      detail::fail("invalid alpha = ", alpha,
                   ": cost noise needs softmax scores without groups (score = ", to_string(train.select.score),
                   ", n_groups = ", train.select.n_groups, ", topk_groups = ", train.select.topk_groups, ")");
  }

  RouteSpec resolve(const Context& ctx) const {
    RouteSpec s = inner.resolve(ctx);
    if (ctx.mode == Mode::train) {
      s.noise_alpha = alpha;
      s.noise_sigma = sigma;
    }
    return s;
  }
};

}  // namespace ssr
