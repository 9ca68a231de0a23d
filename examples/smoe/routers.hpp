// The routers of the paper's Table 1 and of today's engines by name: each is an ssr policy and the layer
// options it trains with.
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
  double bias_rate = 1e-3;   // the expert-bias update rate u of the "+bias" routers (DeepSeek-V3's)
  double capacity = 0;       // expert capacity factor of every router's layers; 0: none
  double xi = 0;             // the Sinkhorn routers' xi; 0: each one's own (S-BASE 1, SSR-L 0.5, SSR-S 0.1)
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
      {"softmax+seq", "softmax top-k + sequence-wise balance loss (0.01, DeepSeek-V3)"},
      {"sigmoid+bias", "sigmoid scores + auxiliary-loss-free expert bias (DeepSeek-V3)"},
      {"grouped+bias", "sigmoid + bias, group-limited top-k: 4 groups of 2 experts, best 2 kept"},
      {"ssr-l-sigmoid", "SSR-L with sigmoid scores on its softmax path"},
  };
  return names;
}

// Calls f(policy, layer_options) with the named router's policy (the library's routers by name,
// ssr::make_policy) and the layer options it trains with.
template <class F>
void with_router(const std::string& name, const RouterSettings& s, F&& f) {
  LayerOptions plain;
  plain.capacity = s.capacity;
  LayerOptions lb = plain, z = plain, noisy = plain, seq = plain, bias = plain;
  lb.load_balancing = 0.01;
  z.z_loss = 0.001;
  noisy.noisy_gating = true;
  seq.sequence_balance = 0.01;
  bias.bias_rate = s.bias_rate;
  ssr::RouterConfig c;
  c.k = s.k;
  c.p = s.p;
  c.router = "softmax";
  if (name == "softmax") return f(ssr::make_policy(c), plain);
  if (name == "softmax+lb") return f(ssr::make_policy(c), lb);
  if (name == "softmax+z") return f(ssr::make_policy(c), z);
  if (name == "noisy-gating") return f(ssr::make_policy(c), noisy);
  if (name == "softmax+seq") return f(ssr::make_policy(c), seq);
  c.select.score = ssr::Score::sigmoid;
  if (name == "sigmoid+bias") return f(ssr::make_policy(c), bias);
  if (name == "grouped+bias") {
    c.select.n_groups = 4;
    c.select.topk_groups = 2;
    return f(ssr::make_policy(c), bias);
  }
  if (name == "ssr-l-sigmoid") {
    c.router = "ssr";
    if (s.xi > 0) c.sinkhorn.xi = s.xi;
    return f(ssr::make_policy(c), plain);
  }
  c.select = {};
  if (name == "sinkhorn") {  // S-BASE: Sinkhorn every step, score weights
    c.router = "sinkhorn";
    c.sinkhorn.xi = s.xi > 0 ? s.xi : 1.0;
    c.weights = ssr::Weights::scores;
    return f(ssr::make_policy(c), plain);
  }
  const bool linear = name.rfind("ssr-l", 0) == 0;
  if (!linear && name.rfind("ssr-s", 0) != 0) throw std::invalid_argument("unknown router '" + name + "'");
  const std::string suffix = name.substr(5);
  if (!suffix.empty() && suffix != "-noise") throw std::invalid_argument("unknown router '" + name + "'");
  c.router = "ssr";
  c.cost = linear ? ssr::Cost::linear : ssr::Cost::softmax;
  c.sinkhorn.xi = s.xi > 0 ? s.xi : linear ? 0.5 : 0.1;  // softmax costs lie in [0, 1]
  c.noise_alpha = suffix.empty() ? 0.0 : s.noise_alpha;
  return f(ssr::make_policy(c), plain);
}

}  // namespace smoe
