// SelectivePolicy<Rare, Common>: in training each call takes Rare with probability p, else Common;
// in evaluation always Common. The coin is the Philox draw of (seed, layer, step): one per call.
#pragma once

#include <cmath>

#include "ssr/context.hpp"
#include "ssr/error.hpp"
#include "ssr/random.hpp"
#include "ssr/spec.hpp"

namespace ssr {

template <class Rare, class Common>
struct SelectivePolicy {
  Rare rare{};
  Common common{};
  double p = 1e-3;

  SelectivePolicy() = default;
  SelectivePolicy(Rare rare_, Common common_, double p_) : rare(rare_), common(common_), p(p_) {}

  // The rare policy is checked only when it can run (p > 0).
  void validate() const {
    if (p > 0) rare.validate();
    common.validate();
    detail::require(p >= 0 && p <= 1, "p", p, "must be in [0, 1]");
    const int kr = rare.resolve(Context{}).k, kc = common.resolve(Context{}).k;
    detail::require(kr == kc, "k", kr, "of the rare policy must equal k = ", kc, " of the common one");
  }

  // True when this call takes the rare path.
  bool rare_path(const Context& ctx) const {
    return ctx.mode == Mode::train && random::coin(ctx.seed, ctx.layer, ctx.step) < p;
  }

  RouteSpec resolve(const Context& ctx) const { return rare_path(ctx) ? rare.resolve(ctx) : common.resolve(ctx); }
};

}  // namespace ssr
