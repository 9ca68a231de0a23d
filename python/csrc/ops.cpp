// The operators torch.ops.ssr.route and torch.ops.ssr.route_backward: their schema, and their CPU kernels
// (the CUDA kernels are in ops_cuda.cu). The fake kernels are registered in Python (ssr_torch/_ops.py), the
// autograd kernel in C++ (autograd.cpp): each one registration for every device and torch.compile.
#include <Python.h>
#include <ATen/Parallel.h>
#include <ssr/detail/aligned.hpp>
#include <ssr/router.hpp>
#include <torch/library.h>
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>

#include "args.hpp"
#include "process_group.hpp"

// An empty Python module _C: importing it loads this library, whose static initialisers register the ops.
extern "C" PyObject* PyInit__C() {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr, nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&module);
}

namespace ssr_torch {
namespace {

using torch::Tensor;

using HostCommunicator = ProcessGroupCommunicator<ssr::HostStream>;

// The CPU kernel's workspace: one buffer per thread that only grows, so that same-shaped calls neither
// allocate nor touch fresh pages (a new buffer per call of the paper's shape costs page faults on every
// call, e.g. 50 MB at 24576 x 256), and from 2 MiB on lies on huge pages as the backend's own would
// (ssr/detail/aligned.hpp). A thread's buffer lives as long as the thread.
ssr::Workspace host_workspace(std::size_t bytes) {
  thread_local ssr::detail::AlignedBuffer<unsigned char> buffer;
  return {buffer.reserve(bytes), bytes};
}

// The call made ready to run: its logits contiguous, its outputs and workspace allocated (with a group,
// among the checks the ranks agree on, so that a failed allocation fails every rank).
template <class T>
RouteCall<HostCommunicator> prepare_on_cpu(const Tensor& logits, const ssr::SSRPolicy& policy, const ssr::Context& ctx) {
  const Tensor s = logits.contiguous();
  const int64_t m = s.size(0), n = s.size(1), k = policy.resolve(ctx).k;
  auto router = std::make_shared<ssr::Router<ssr::SSRPolicy, ssr::CpuBackend<T>>>(
      policy, ssr::CpuBackend<T>(at::get_num_threads()));
  Tensor experts = at::empty({m, k}, s.options().dtype(at::kInt));
  Tensor weights = at::empty({m, k}, s.options());
  Tensor load = at::empty({n}, s.options().dtype(at::kInt));
  Tensor info = at::empty({info_size}, s.options().dtype(at::kDouble));
  const ssr::Workspace workspace = host_workspace(router->workspace_bytes(m, n, ctx));
  return [=](const HostCommunicator* ranks) {
    auto options = ssr::CallOptions<ssr::HostStream>{}.using_workspace(workspace);
    if (ranks != nullptr) options.across(*ranks);
    const ssr::RouteInfo result = router->route(
        {s.data_ptr<T>(), m, n}, ctx,
        {{experts.data_ptr<int32_t>(), m, k}, {weights.data_ptr<T>(), m, k}, {load.data_ptr<int32_t>(), n}}, options);
    double* written = info.data_ptr<double>();  // written in place: torch::tensor of a list selects and fills each entry
    written[0] = result.path == ssr::Path::sinkhorn ? 1.0 : 0.0;
    written[1] = result.weights == ssr::Weights::scores ? 1.0 : 0.0;
    written[2] = static_cast<double>(result.iterations);
    written[3] = result.marginal_error;
    return Routed{experts, weights, load, info};
  };
}

void check_cpu_logits(const Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2, "ssr.route: logits must be 2-d (tokens x experts), got ", logits.dim(), " dimensions");
  TORCH_CHECK(logits.scalar_type() == torch::kFloat32 || logits.scalar_type() == torch::kFloat64,
              "ssr.route: logits on the CPU must be float32 or float64, got ", logits.scalar_type());
}

std::tuple<Tensor, Tensor, Tensor, Tensor> route_cpu(const Tensor& logits, std::string policy, int64_t k, std::string cost,
                                                     double xi, double tol, int64_t max_iters, std::string weights, double p,
                                                     double noise_alpha, double noise_sigma, int64_t seed, int64_t step,
                                                     int64_t layer, bool training, int64_t first_row, std::string group,
                                                     std::string score, int64_t n_groups, int64_t topk_groups,
                                                     const c10::optional<Tensor>& expert_bias,
                                                     const c10::optional<Tensor>& step_tensor) {
  const RouteArgs a{std::move(policy), k,           std::move(cost), xi,    tol,      max_iters, std::move(weights),
                    p,                 noise_alpha, noise_sigma,     seed,  step_of(step, step_tensor),
                    layer,             training,    first_row,
                    std::move(score),  n_groups,    topk_groups, expert_bias};
  return route_in_group<ssr::HostStream>(
      a, group, c10::Device(c10::kCPU), ssr::HostStream{},
      [&](const ssr::SSRPolicy& route_policy, const ssr::Context& ctx) {
        check_cpu_logits(logits);
        a.check_expert_bias(logits);
        return logits.scalar_type() == torch::kFloat64 ? prepare_on_cpu<double>(logits, route_policy, ctx)
                                                       : prepare_on_cpu<float>(logits, route_policy, ctx);
      });
}

template <class T>
void backward_on_cpu(const Tensor& g, const Tensor& e, const Tensor& w, const Tensor& s, Tensor& grad,
                     const ssr::RouteInfo& info) {
  const int64_t m = e.size(0), k = e.size(1), n = grad.size(1);
  ssr::CpuBackend<T> backend(at::get_num_threads());  // backward needs the backend and the info only
  ssr::BackwardArgs<T> args;
  if (s.defined()) args.logits = {s.data_ptr<T>(), m, n};
  args.experts = {e.data_ptr<int32_t>(), m, k};
  args.weights = {w.data_ptr<T>(), m, k};
  args.grad_weights = {g.data_ptr<T>(), m, k};
  args.grad_logits = {grad.data_ptr<T>(), m, n};
  // Unchecked, as on a GPU: a non-finite upstream gradient flows on as torch's own operators pass it (a
  // gradient scaler reads it as an overflow); the experts were checked by the caller.
  ssr::backward(backend, info, args, ssr::CallOptions<ssr::HostStream>{}.unchecked());
}

Tensor route_backward_cpu(const Tensor& grad_weights, const Tensor& experts, const Tensor& weights, int64_t n,
                          bool passes_gradient, const c10::optional<Tensor>& info, std::string score,
                          const c10::optional<Tensor>& logits) {
  check_backward_args(grad_weights, experts, weights, n, logits);
  const Tensor g = grad_weights.contiguous().to(weights.scalar_type()), e = experts.contiguous(), w = weights.contiguous();
  check_experts_in_range(e, n, "ssr.route_backward");
  // Sigmoid score weights read the logits, in the weights' type.
  const Tensor s = logits.has_value() ? logits->contiguous().to(weights.scalar_type()) : Tensor();
  ssr::RouteInfo route_info;
  // With info (the forward's), its flag says whether the weights pass gradient.
  const bool passes = passes_gradient && (!info.has_value() || info->index({1}).item<double>() != 0.0);
  route_info.weights = passes ? ssr::Weights::scores : ssr::Weights::plan;
  Tensor grad = torch::empty({e.size(0), n}, w.options());
  try {
    route_info.score = ssr::parse_score(score);
    if (w.scalar_type() == torch::kFloat64) {
      backward_on_cpu<double>(g, e, w, s, grad, route_info);
    } else {
      TORCH_CHECK(w.scalar_type() == torch::kFloat32, "ssr.route_backward: weights must be float32 or float64");
      backward_on_cpu<float>(g, e, w, s, grad, route_info);
    }
  } catch (const ssr::Error& err) {
    TORCH_CHECK(false, err.what());
  }
  return grad;
}

}  // namespace
}  // namespace ssr_torch

// New arguments go at the end with defaults, so that existing calls keep working.
TORCH_LIBRARY(ssr, m) {
  m.def(
      "route(Tensor logits, str policy='selective', int k=2, str cost='linear', float xi=0.5, float tol=1e-4, "
      "int max_iters=100, str weights='plan', float p=1e-3, float noise_alpha=0., float noise_sigma=1., int seed=0, "
      "int step=0, int layer=0, bool training=True, int first_row=0, str group='', str score='softmax', "
      "int n_groups=1, int topk_groups=1, Tensor? expert_bias=None, Tensor? step_tensor=None) "
      "-> (Tensor experts, Tensor weights, Tensor load, Tensor info)");
  m.def(
      "route_backward(Tensor grad_weights, Tensor experts, Tensor weights, int n, bool passes_gradient, "
      "Tensor? info=None, str score='softmax', Tensor? logits=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(ssr, CPU, m) {
  m.impl("route", &ssr_torch::route_cpu);
  m.impl("route_backward", &ssr_torch::route_backward_cpu);
}
