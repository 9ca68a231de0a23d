// Any router of the library from names and numbers, as a command line, a Python binding or a config file
// gives them. Every router is one SSRPolicy: SSR takes the Sinkhorn path with probability p in training,
// "sinkhorn" is SSR with p = 1 and "softmax" SSR with p = 0, so one Router type serves them all.
#pragma once

#include <string>

#include "ssr/error.hpp"
#include "ssr/policy/noisy_cost.hpp"
#include "ssr/policy/selective.hpp"
#include "ssr/policy/sinkhorn_topk.hpp"
#include "ssr/policy/softmax_topk.hpp"
#include "ssr/spec.hpp"

namespace ssr {

// SSR: Sinkhorn (plan weights, optional noise) with probability p in training, noisy softmax top-k otherwise.
using SSRPolicy = SelectivePolicy<NoisyCost<SinkhornTopK>, NoisyCost<SoftmaxTopK>>;

// The selection rules (score function, groups) apply to both paths as SoftmaxTopK and SinkhornTopK
// define them.
inline SSRPolicy make_ssr(int k = 2, Cost cost = Cost::linear, double p = 1e-3, SinkhornParams sinkhorn = {},
                          double noise_alpha = 0, double noise_sigma = 1, Weights weights = Weights::plan,
                          Selection select = {}) {
  return SSRPolicy(NoisyCost<SinkhornTopK>(SinkhornTopK(k, cost, sinkhorn, weights, select), noise_alpha, noise_sigma),
                   NoisyCost<SoftmaxTopK>(SoftmaxTopK(k, cost, select), noise_alpha, noise_sigma), p);
}

// A router by name with its options; the defaults are the paper's (and ssr-route's).
struct RouterConfig {
  std::string router = "ssr";  // "softmax", "sinkhorn" or "ssr" ("selective" is another name for it)
  int k = 2;
  Cost cost = Cost::linear;
  SinkhornParams sinkhorn{};
  Weights weights = Weights::plan;  // of the Sinkhorn path
  double p = 1e-3;                  // SSR's probability of the Sinkhorn path in training
  double noise_alpha = 0;           // cost noise alpha * eps, eps ~ N(0, sigma^2), in training; 0: none
  double noise_sigma = 1;
  Selection select{};  // score function and groups; the expert bias comes with each call (Context)
};

inline Cost parse_cost(const std::string& name) {
  if (name == "linear") return Cost::linear;
  if (name == "softmax") return Cost::softmax;
  detail::fail("invalid cost = ", name, ": must be linear or softmax");
}

inline Score parse_score(const std::string& name) {
  if (name == "softmax") return Score::softmax;
  if (name == "sigmoid") return Score::sigmoid;
  detail::fail("invalid score = ", name, ": must be softmax or sigmoid");
}

inline Weights parse_weights(const std::string& name) {
  if (name == "plan") return Weights::plan;
  if (name == "scores") return Weights::scores;
  detail::fail("invalid weights = ", name, ": must be plan or scores");
}

// The probability of the Sinkhorn path per training call of a named router.
inline double sinkhorn_probability(const std::string& router, double p) {
  detail::require(p >= 0 && p <= 1, "p", p, "must be in [0, 1]");
  if (router == "softmax") return 0;
  if (router == "sinkhorn") return 1;
  if (router == "ssr" || router == "selective") return p;
  detail::fail("invalid router = ", router, ": must be softmax, sinkhorn or ssr (also called selective)");
}

// The policy of a named router; throws ssr::Error naming a bad name or value.
inline SSRPolicy make_policy(const RouterConfig& c) {
  SSRPolicy policy = make_ssr(c.k, c.cost, sinkhorn_probability(c.router, c.p), c.sinkhorn, c.noise_alpha,
                              c.noise_sigma, c.weights, c.select);
  policy.validate();
  return policy;
}

}  // namespace ssr
