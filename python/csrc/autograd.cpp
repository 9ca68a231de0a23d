// The autograd kernel of torch.ops.ssr.route, for every device: the forward calls the operator below
// autograd (the device's kernel), the backward torch.ops.ssr.route_backward. Written in C++ rather than
// registered from Python (torch.library.register_autograd), so that a call whose inputs need no gradient
// does not enter the interpreter: that took about 10 us a call, as much as the rest of a call on a few
// rows (docs/pytorch.md, Overhead of the operator). torch.compile traces it through the fake kernels of
// ssr_torch/_ops.py.
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <tuple>

namespace ssr_torch {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using RouteSignature = std::tuple<Tensor, Tensor, Tensor, Tensor>(const Tensor&, std::string, int64_t, std::string,
                                                                  double, double, int64_t, std::string, double, double,
                                                                  double, int64_t, int64_t, int64_t, bool, int64_t,
                                                                  std::string, std::string, int64_t, int64_t,
                                                                  const c10::optional<Tensor>&,
                                                                  const c10::optional<Tensor>&);

using BackwardSignature = Tensor(const Tensor&, const Tensor&, const Tensor&, int64_t, bool,
                                 const c10::optional<Tensor>&, std::string, const c10::optional<Tensor>&);

// The operators as the dispatcher holds them: their kernels' own C++ signatures (ops.cpp, ops_cuda.cu).
const c10::TypedOperatorHandle<RouteSignature>& route_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("ssr::route", "").typed<RouteSignature>();
  return op;
}
const c10::TypedOperatorHandle<BackwardSignature>& route_backward_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("ssr::route_backward", "").typed<BackwardSignature>();
  return op;
}

// Gradient flows to the logits through the weights alone (score weights; plan weights pass none, as the
// forward's info[1] says); experts, load and info are not differentiable.
class Route : public torch::autograd::Function<Route> {
 public:
  static constexpr int inputs = 22;  // the schema's arguments: backward returns a gradient (or none) for each

  static variable_list forward(AutogradContext* ctx, const Tensor& logits, std::string policy, int64_t k,
                               std::string cost, double xi, double tol, int64_t max_iters, std::string weights,
                               double p, double noise_alpha, double noise_sigma, int64_t seed, int64_t step,
                               int64_t layer, bool training, int64_t first_row, std::string group, std::string score,
                               int64_t n_groups, int64_t topk_groups, const c10::optional<Tensor>& expert_bias,
                               const c10::optional<Tensor>& step_tensor) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [experts, routing_weights, load, info] =
        route_op().call(logits, std::move(policy), k, std::move(cost), xi, tol, max_iters, std::move(weights), p,
                        noise_alpha, noise_sigma, seed, step, layer, training, first_row, std::move(group), score,
                        n_groups, topk_groups, expert_bias, step_tensor);
    // The gradient of sigmoid score weights reads the logits.
    ctx->save_for_backward({experts, routing_weights, info, score == "sigmoid" ? logits : Tensor()});
    ctx->saved_data["n"] = logits.size(1);
    ctx->saved_data["score"] = score;
    ctx->saved_data["dtype"] = logits.scalar_type();
    ctx->mark_non_differentiable({experts, load, info});
    return {experts, routing_weights, load, info};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const Tensor &experts = saved[0], &routing_weights = saved[1], &info = saved[2], &logits = saved[3];
    const Tensor grad_weights = grads[1].defined() ? grads[1] : torch::zeros_like(routing_weights);
    const Tensor grad = route_backward_op().call(grad_weights, experts, routing_weights, ctx->saved_data["n"].toInt(),
                                                 true, info, ctx->saved_data["score"].toStringRef(),
                                                 logits.defined() ? c10::optional<Tensor>(logits) : c10::nullopt);
    variable_list out(inputs);
    out[0] = grad.to(ctx->saved_data["dtype"].toScalarType());
    return out;
  }
};

std::tuple<Tensor, Tensor, Tensor, Tensor> route_autograd(const Tensor& logits, std::string policy, int64_t k,
                                                          std::string cost, double xi, double tol, int64_t max_iters,
                                                          std::string weights, double p, double noise_alpha,
                                                          double noise_sigma, int64_t seed, int64_t step, int64_t layer,
                                                          bool training, int64_t first_row, std::string group,
                                                          std::string score, int64_t n_groups, int64_t topk_groups,
                                                          const c10::optional<Tensor>& expert_bias,
                                                          const c10::optional<Tensor>& step_tensor) {
  if (!(torch::autograd::GradMode::is_enabled() && logits.requires_grad())) {
    // No gradient asked for: the kernel below autograd directly, without a graph node (Route::apply makes
    // one on every call, about 4 us on a few rows), as torch's own kernels do.
    at::AutoDispatchBelowADInplaceOrView below;
    return route_op().call(logits, std::move(policy), k, std::move(cost), xi, tol, max_iters, std::move(weights), p,
                           noise_alpha, noise_sigma, seed, step, layer, training, first_row, std::move(group),
                           std::move(score), n_groups, topk_groups, expert_bias, step_tensor);
  }
  const variable_list out =
      Route::apply(logits, std::move(policy), k, std::move(cost), xi, tol, max_iters, std::move(weights), p,
                   noise_alpha, noise_sigma, seed, step, layer, training, first_row, std::move(group), std::move(score),
                   n_groups, topk_groups, expert_bias, step_tensor);
  return {out[0], out[1], out[2], out[3]};
}

}  // namespace
}  // namespace ssr_torch

TORCH_LIBRARY_IMPL(ssr, Autograd, m) {
  m.impl("route", &ssr_torch::route_autograd);
  // The gradient is differentiable once: a second derivative (create_graph=True, then backward again)
  // raises rather than reading as zero.
  m.impl("route_backward", torch::autograd::autogradNotImplementedFallback());
}
