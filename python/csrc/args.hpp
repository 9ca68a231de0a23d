// The operators' arguments as the library's types: the named router (ssr::make_policy), the context,
// and the checks every kernel makes, written once for the CPU and CUDA kernels.
#pragma once

#include <ATen/ATen.h>
#include <ssr/named.hpp>
#include <ssr/spec.hpp>
#include <torch/library.h>

#include <cstdint>
#include <string>

namespace ssr_torch {

// The router arguments of ssr::route, as the library's named router.
struct RouteArgs {
  std::string policy;
  int64_t k;
  std::string cost;
  double xi, tol;
  int64_t max_iters;
  std::string weights;
  double p, noise_alpha, noise_sigma;
  int64_t seed, step, layer;
  bool training;
  int64_t first_row;
  std::string score;
  int64_t n_groups, topk_groups;
  c10::optional<at::Tensor> expert_bias;

  ssr::SSRPolicy policy_value() const {
    TORCH_CHECK(max_iters >= 1 && max_iters <= INT32_MAX, "ssr.route: invalid max_iters = ", max_iters,
                ": must be in [1, 2^31)");
    TORCH_CHECK(k >= 1 && k <= INT32_MAX, "ssr.route: invalid k = ", k, ": must be in [1, 2^31)");
    ssr::RouterConfig config;
    config.router = policy;
    config.k = static_cast<int>(k);
    config.cost = ssr::parse_cost(cost);
    config.sinkhorn = {xi, tol, static_cast<int>(max_iters)};
    config.weights = ssr::parse_weights(weights);
    config.p = p;
    config.noise_alpha = noise_alpha;
    config.noise_sigma = noise_sigma;
    TORCH_CHECK(n_groups >= 1 && n_groups <= INT32_MAX, "ssr.route: invalid n_groups = ", n_groups, ": must be in [1, 2^31)");
    TORCH_CHECK(topk_groups >= 1 && topk_groups <= INT32_MAX, "ssr.route: invalid topk_groups = ", topk_groups,
                ": must be in [1, 2^31)");
    config.select = {ssr::parse_score(score), static_cast<int>(n_groups), static_cast<int>(topk_groups)};
    return ssr::make_policy(config);
  }

  // The context of the call, which decides its path: the same on every rank.
  ssr::Context context() const {
    TORCH_CHECK(seed >= 0 && seed <= 0xffffffffLL, "ssr.route: invalid seed = ", seed, ": must be in [0, 2^32)");
    TORCH_CHECK(layer >= 0 && layer <= 0xffffffffLL, "ssr.route: invalid layer = ", layer, ": must be in [0, 2^32)");
    TORCH_CHECK(step >= 0, "ssr.route: invalid step = ", step, ": must be >= 0");
    return training ? ssr::Context::train(static_cast<std::uint64_t>(step), static_cast<std::uint32_t>(layer),
                                          static_cast<std::uint32_t>(seed))
                    : ssr::Context::eval();
  }

  // ctx with this rank's first row and expert bias, which may differ between ranks (checked among the
  // checks the ranks agree on).
  ssr::Context placed(const ssr::Context& ctx) const {
    TORCH_CHECK(first_row >= 0, "ssr.route: invalid first_row = ", first_row, ": must be >= 0");
    ssr::Context c = ctx.at_row(static_cast<std::uint64_t>(first_row));
    // The pointer only: check_expert_bias, among the call's agreed checks, says whether it is usable.
    if (expert_bias.has_value())
      c = c.with_bias({static_cast<const float*>(expert_bias->const_data_ptr()), expert_bias->numel()});
    return c;
  }

  // The expert bias a kernel reads: float32, one contiguous entry per expert, on the logits' device.
  void check_expert_bias(const at::Tensor& logits) const {
    if (!expert_bias.has_value()) return;
    const at::Tensor& b = *expert_bias;
    TORCH_CHECK(b.scalar_type() == at::kFloat, "ssr.route: expert_bias must be float32, got ", b.scalar_type());
    TORCH_CHECK(b.dim() == 1 && b.is_contiguous(), "ssr.route: expert_bias must be a contiguous 1-d tensor");
    TORCH_CHECK(b.device() == logits.device(), "ssr.route: expert_bias is on ", b.device(), ", the logits on ",
                logits.device());
    // Its values on the CPU, as the logits are checked there (on a GPU the check would wait for it).
    if (b.device().is_cpu()) TORCH_CHECK(at::isfinite(b).all().item<bool>(), "ssr.route: expert_bias must be finite");
  }
};

// The call's step: the value of step_tensor where given (one int64 on the CPU, which torch.compile traces
// as an input rather than a constant it would recompile for), else step.
inline int64_t step_of(int64_t step, const c10::optional<at::Tensor>& step_tensor) {
  if (!step_tensor.has_value()) return step;
  const at::Tensor& t = *step_tensor;
  TORCH_CHECK(t.numel() == 1 && t.scalar_type() == at::kLong && t.device().is_cpu(),
              "ssr.route: step_tensor must hold one int64 value on the CPU, got ", t.numel(), " ", t.scalar_type(),
              " values on ", t.device());
  return t.item<int64_t>();
}

// route_backward's tensors against its experts (m x k int32, on the weights' device): weights and grad_weights
// m x k, the logits where given m x n, so that no kernel reads outside a tensor.
inline void check_backward_args(const at::Tensor& grad_weights, const at::Tensor& experts, const at::Tensor& weights,
                                int64_t n, const c10::optional<at::Tensor>& logits) {
  TORCH_CHECK(experts.dim() == 2 && experts.scalar_type() == at::kInt,
              "ssr.route_backward: experts must be m x k int32, got ", experts.sizes(), " ", experts.scalar_type());
  TORCH_CHECK(weights.sizes() == experts.sizes(), "ssr.route_backward: weights must be m x k as the experts ",
              experts.sizes(), ", got ", weights.sizes());
  TORCH_CHECK(grad_weights.sizes() == experts.sizes(), "ssr.route_backward: grad_weights must be m x k as the experts ",
              experts.sizes(), ", got ", grad_weights.sizes());
  TORCH_CHECK(n >= 1, "ssr.route_backward: invalid n = ", n, ": must be at least 1");
  if (logits.has_value())
    TORCH_CHECK(logits->dim() == 2 && logits->size(0) == experts.size(0) && logits->size(1) == n,
                "ssr.route_backward: logits must be m x n = ", experts.size(0), " x ", n, ", got ", logits->sizes());
  const bool alike = experts.device() == weights.device() && grad_weights.device() == weights.device() &&
                     (!logits.has_value() || logits->device() == weights.device());
  TORCH_CHECK(alike, "ssr.route_backward: every tensor must be on the weights' device, ", weights.device());
}

// experts (int32 or int64) within [0, n): a kernel that reads by them stays inside its tensors.
inline void check_experts_in_range(const at::Tensor& experts, int64_t n, const char* op) {
  if (experts.numel() == 0) return;
  const auto [low, high] = experts.aminmax();
  TORCH_CHECK(low.item<int64_t>() >= 0 && high.item<int64_t>() < n, op, ": experts must lie in [0, ", n, "), got ",
              low.item<int64_t>(), " to ", high.item<int64_t>());
}

// The info tensor: [took the Sinkhorn path, weights pass gradient, iterations, marginal error].
constexpr int64_t info_size = 4;

}  // namespace ssr_torch
