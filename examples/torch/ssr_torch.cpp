// PyTorch operators torch.ops.ssr.route and torch.ops.ssr.route_backward, with autograd: the routing
// weights carry a gradient to the logits exactly as ssr's Router::backward defines it.
#include <ssr/router.hpp>
#include <torch/library.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <tuple>

namespace {

using torch::Tensor;
using Outputs = std::tuple<Tensor, Tensor, Tensor, Tensor>;

// The named router ("softmax", "sinkhorn", or "selective"/"ssr") with its options, by the library's rule.
ssr::SSRPolicy make_policy(const std::string& policy, int64_t k, const std::string& cost, double xi, double tol,
                           int64_t max_iters, const std::string& weights, double p, double alpha, double sigma) {
  ssr::RouterConfig config;
  config.router = policy;
  config.k = static_cast<int>(k);
  config.cost = ssr::parse_cost(cost);
  config.sinkhorn = {xi, tol, static_cast<int>(max_iters)};
  config.weights = ssr::parse_weights(weights);
  config.p = p;
  config.noise_alpha = alpha;
  config.noise_sigma = sigma;
  return ssr::make_policy(config);
}

template <class T>
Outputs route_typed(const Tensor& logits, const ssr::SSRPolicy& policy, const ssr::Context& ctx) {
  const Tensor s = logits.contiguous();
  const int64_t m = s.size(0), n = s.size(1);
  const int64_t k = policy.common.inner.k;
  ssr::Router<ssr::SSRPolicy, ssr::CpuBackend<T>> router(policy);
  Tensor experts = torch::empty({m, k}, torch::kInt32), weights = torch::empty({m, k}, s.options());
  Tensor load = torch::empty({n}, torch::kInt32);
  const auto info = router.route({s.data_ptr<T>(), m, n}, ctx,
                                 {{experts.data_ptr<int32_t>(), m, k}, {weights.data_ptr<T>(), m, k}, {load.data_ptr<int32_t>(), n}});
  // info: path (0 softmax, 1 sinkhorn), weights pass gradient (1) or not (0), iterations, marginal error
  Tensor summary = torch::tensor({info.path == ssr::Path::sinkhorn ? 1.0 : 0.0, info.weights == ssr::Weights::scores ? 1.0 : 0.0,
                                  static_cast<double>(info.iterations), info.marginal_error}, torch::kFloat64);
  return {experts, weights, load, summary};
}

Outputs route_cpu(const Tensor& logits, const std::string& policy, int64_t k, const std::string& cost, double xi, double tol,
                  int64_t max_iters, const std::string& weights, double p, double noise_alpha, double noise_sigma, int64_t seed,
                  int64_t step, int64_t layer, bool training) {
  TORCH_CHECK(logits.dim() == 2, "ssr.route: logits must be 2-d (tokens x experts), got ", logits.dim(), " dimensions");
  TORCH_CHECK(logits.device().is_cpu(), "ssr.route: logits must be on the CPU");
  TORCH_CHECK(seed >= 0 && seed <= 0xffffffffLL && layer >= 0 && layer <= 0xffffffffLL && step >= 0,
              "ssr.route: seed and layer must be in [0, 2^32), step >= 0");
  const ssr::Context ctx{training ? ssr::Mode::train : ssr::Mode::eval, static_cast<std::uint64_t>(step),
                         static_cast<std::uint32_t>(layer), static_cast<std::uint32_t>(seed)};
  try {
    const auto pol = make_policy(policy, k, cost, xi, tol, max_iters, weights, p, noise_alpha, noise_sigma);
    if (logits.scalar_type() == torch::kFloat64) return route_typed<double>(logits, pol, ctx);
    TORCH_CHECK(logits.scalar_type() == torch::kFloat32, "ssr.route: logits must be float32 or float64");
    return route_typed<float>(logits, pol, ctx);
  } catch (const ssr::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

Tensor route_backward_cpu(const Tensor& grad_weights, const Tensor& experts, const Tensor& weights, int64_t n, bool passes_gradient) {
  const Tensor g = grad_weights.contiguous().to(weights.scalar_type()), e = experts.contiguous(), w = weights.contiguous();
  const int64_t m = e.size(0), k = e.size(1);
  Tensor grad = torch::empty({m, n}, w.options());
  ssr::RouteInfo info;
  info.weights = passes_gradient ? ssr::Weights::scores : ssr::Weights::plan;
  auto run = [&](auto zero) {
    using T = decltype(zero);
    ssr::CpuBackend<T> backend;  // backward needs the backend and the info only
    ssr::backward(backend, info, {e.data_ptr<int32_t>(), m, k}, {w.data_ptr<T>(), m, k}, {g.data_ptr<T>(), m, k},
                  {grad.data_ptr<T>(), m, n});
  };
  try {
    if (w.scalar_type() == torch::kFloat64) run(0.0);
    else run(0.0f);
  } catch (const ssr::Error& err) {
    TORCH_CHECK(false, err.what());
  }
  return grad;
}

class RouteFunction : public torch::autograd::Function<RouteFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const Tensor& logits, const std::string& policy,
                                                int64_t k, const std::string& cost, double xi, double tol, int64_t max_iters,
                                                const std::string& weights, double p, double noise_alpha, double noise_sigma,
                                                int64_t seed, int64_t step, int64_t layer, bool training) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("ssr::route", "").typed<decltype(route_cpu)>();
    auto [experts, w, load, summary] =
        op.call(logits, policy, k, cost, xi, tol, max_iters, weights, p, noise_alpha, noise_sigma, seed, step, layer, training);
    ctx->save_for_backward({experts, w});
    ctx->saved_data["n"] = logits.size(1);
    ctx->saved_data["passes"] = summary[1].item<double>() > 0.5;
    ctx->mark_non_differentiable({experts, load, summary});
    return {experts, w, load, summary};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor grad_w = grads[1].defined() ? grads[1] : torch::zeros_like(saved[1]);
    const Tensor grad = route_backward_cpu(grad_w, saved[0], saved[1], ctx->saved_data["n"].toInt(), ctx->saved_data["passes"].toBool());
    torch::autograd::variable_list out(15);
    out[0] = grad;
    return out;
  }
};

Outputs route_autograd(const Tensor& logits, const std::string& policy, int64_t k, const std::string& cost, double xi, double tol,
                       int64_t max_iters, const std::string& weights, double p, double noise_alpha, double noise_sigma, int64_t seed,
                       int64_t step, int64_t layer, bool training) {
  auto r = RouteFunction::apply(logits, policy, k, cost, xi, tol, max_iters, weights, p, noise_alpha, noise_sigma, seed, step, layer, training);
  return {r[0], r[1], r[2], r[3]};
}

}  // namespace

TORCH_LIBRARY(ssr, m) {
  m.def("route(Tensor logits, str policy='selective', int k=2, str cost='linear', float xi=0.5, float tol=1e-4, "
        "int max_iters=100, str weights='plan', float p=1e-3, float noise_alpha=0., float noise_sigma=1., int seed=0, "
        "int step=0, int layer=0, bool training=True) -> (Tensor experts, Tensor weights, Tensor load, Tensor info)");
  m.def("route_backward(Tensor grad_weights, Tensor experts, Tensor weights, int n, bool passes_gradient) -> Tensor");
}

TORCH_LIBRARY_IMPL(ssr, CPU, m) {
  m.impl("route", route_cpu);
  m.impl("route_backward", route_backward_cpu);
}

TORCH_LIBRARY_IMPL(ssr, Autograd, m) { m.impl("route", route_autograd); }
