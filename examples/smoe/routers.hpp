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

// Calls f(policy, layer_options) with the named router's policy type and options.
template <class F>
void with_router(const std::string& name, const RouterSettings& s, F&& f) {
  const ssr::SinkhornParams linear_xi{0.5, 1e-4, 100}, softmax_xi{0.1, 1e-4, 100};  // softmax costs lie in [0, 1]
  LayerOptions plain, lb, z, noisy;
  lb.load_balancing = 0.01;
  z.z_loss = 0.001;
  noisy.noisy_gating = true;
  if (name == "softmax") return f(ssr::SoftmaxTopK(s.k), plain);
  if (name == "softmax+lb") return f(ssr::SoftmaxTopK(s.k), lb);
  if (name == "softmax+z") return f(ssr::SoftmaxTopK(s.k), z);
  if (name == "noisy-gating") return f(ssr::SoftmaxTopK(s.k), noisy);
  if (name == "sinkhorn")
    return f(ssr::SinkhornTopK(s.k, ssr::Cost::linear, {1.0, 1e-4, 100}, ssr::Weights::scores), plain);
  if (name == "ssr-l") return f(ssr::make_ssr(s.k, ssr::Cost::linear, s.p, linear_xi), plain);
  if (name == "ssr-s") return f(ssr::make_ssr(s.k, ssr::Cost::softmax, s.p, softmax_xi), plain);
  if (name == "ssr-l-noise") return f(ssr::make_ssr(s.k, ssr::Cost::linear, s.p, linear_xi, s.noise_alpha), plain);
  if (name == "ssr-s-noise") return f(ssr::make_ssr(s.k, ssr::Cost::softmax, s.p, softmax_xi, s.noise_alpha), plain);
  throw std::invalid_argument("unknown router '" + name + "'");
}

}  // namespace smoe
