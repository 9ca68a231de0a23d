// The routers of the paper's Table 1 by name: each is an ssr policy and the layer options it trains with.
#pragma once

#include <ssr/router.hpp>

#include <stdexcept>
#include <string>
#include <vector>

#include "smoe_layer.hpp"

namespace smoe {

struct RouterSettings {
  int k = 2;                 // experts per token (the paper's)
  double p = 0.05;           // SSR's Sinkhorn probability per layer and step (scaled for short runs)
  double noise_alpha = 0.05; // SSR's cost noise alpha * eps, eps ~ N(0, 1), in the "-noise" variants
};

struct RouterName {
  const char* name;
  const char* description;
};

inline const std::vector<RouterName>& router_names() {
  static const std::vector<RouterName> names = {
      {"softmax", "softmax top-k (vanilla)"},
      {"softmax+lb", "softmax top-k + load-balancing loss (0.01)"},
      {"softmax+z", "softmax top-k + z-loss (0.001)"},
      {"noisy-gating", "trainable noisy gating (Shazeer et al. 2017)"},
      {"sinkhorn", "Sinkhorn every step, score weights, xi = 1 (S-BASE)"},
      {"ssr-l", "SSR-L: linear cost, plan weights, xi = 0.5, Sinkhorn with probability p"},
      {"ssr-s", "SSR-S: softmax cost, plan weights, xi = 0.1, Sinkhorn with probability p"},
      {"ssr-l-noise", "SSR-L with cost noise alpha"},
      {"ssr-s-noise", "SSR-S with cost noise alpha"},
  };
  return names;
}

// Calls f(policy, layer_options) with the named router's policy (the library's routers by name,
// ssr::make_policy) and the layer options it trains with.
template <class F>
void with_router(const std::string& name, const RouterSettings& s, F&& f) {
  LayerOptions plain, lb, z, noisy;
  lb.load_balancing = 0.01;
  z.z_loss = 0.001;
  noisy.noisy_gating = true;
  ssr::RouterConfig c;
  c.k = s.k;
  c.p = s.p;
  c.router = "softmax";
  if (name == "softmax") return f(ssr::make_policy(c), plain);
  if (name == "softmax+lb") return f(ssr::make_policy(c), lb);
  if (name == "softmax+z") return f(ssr::make_policy(c), z);
  if (name == "noisy-gating") return f(ssr::make_policy(c), noisy);
  if (name == "sinkhorn") {  // S-BASE: Sinkhorn every step, score weights
    c.router = "sinkhorn";
    c.sinkhorn.xi = 1.0;
    c.weights = ssr::Weights::scores;
    return f(ssr::make_policy(c), plain);
  }
  const bool linear = name.rfind("ssr-l", 0) == 0;
  if (!linear && name.rfind("ssr-s", 0) != 0) throw std::invalid_argument("unknown router '" + name + "'");
  const std::string suffix = name.substr(5);
  if (!suffix.empty() && suffix != "-noise") throw std::invalid_argument("unknown router '" + name + "'");
  c.router = "ssr";
  c.cost = linear ? ssr::Cost::linear : ssr::Cost::softmax;
  c.sinkhorn.xi = linear ? 0.5 : 0.1;  // softmax costs lie in [0, 1]
  c.noise_alpha = suffix.empty() ? 0.0 : s.noise_alpha;
  return f(ssr::make_policy(c), plain);
}

}  // namespace smoe
