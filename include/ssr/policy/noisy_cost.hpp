// NoisyCost<Inner>: in training, add Gaussian noise alpha * eps, eps ~ N(0, sigma^2), to the inner
// policy's cost before it selects experts. The weights keep their formula (noise is a constant).
#pragma once

#include "ssr/context.hpp"
#include "ssr/spec.hpp"
#include "ssr/validate.hpp"

namespace ssr {

template <class Inner>
struct NoisyCost {
  Inner inner{};
  double alpha = 1;
  double sigma = 1;

  NoisyCost() = default;
  explicit NoisyCost(Inner inner_, double alpha_ = 1, double sigma_ = 1)
      : inner(inner_), alpha(alpha_), sigma(sigma_) {}

  // The inner policy's options, then the noise's own and the selection it perturbs, as every call checks them.
  void validate() const {
    inner.validate();
    detail::validate_spec(resolve(Context::train(0)));
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
