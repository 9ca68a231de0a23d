// The CUDA kernels of torch.ops.ssr.route and route_backward: the library's CudaBackend on PyTorch's current
// stream, its workspace a tensor from PyTorch's caching allocator (stream-ordered, no allocation of its
// own). Logits float32, bfloat16 and float16 (computed in float) or float64. Nothing waits for the host on
// the softmax path: the finiteness check, a read-back, is off (NaN logits rank as -inf), the info tensor is
// written on the device, and the backward multiplies by its flag instead of reading it. The Sinkhorn path
// checks its logits (raising as on the CPU) except inside a CUDA graph capture.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/library.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>

#include <ssr/cuda/backend.cuh>
#include <ssr/router.hpp>

#include "args.hpp"
#include "process_group.hpp"

namespace ssr_torch {
namespace {

using at::Tensor;
using DeviceCommunicator = ProcessGroupCommunicator<cudaStream_t>;

// info = [took Sinkhorn, weights pass gradient, iterations, marginal error], from the solve's statistics
// on the device (pending) or from the host (a complete info).
__global__ void write_info(double* info, double sinkhorn, double passes, const ssr::SolveStats* pending,
                           int iterations, double marginal_error) {
  info[0] = sinkhorn;
  info[1] = passes;
  info[2] = pending != nullptr ? pending->iterations : iterations;
  info[3] = pending != nullptr ? pending->marginal_error : marginal_error;
}

// The call made ready to run: its logits contiguous, its outputs and workspace allocated (with a group,
// among the checks the ranks agree on, so that a failed allocation fails every rank).
template <class T, class In>
RouteCall<DeviceCommunicator> prepare_on_cuda(const Tensor& logits, const ssr::SSRPolicy& policy,
                                              const ssr::Context& ctx) {
  const Tensor s = logits.contiguous();
  const int64_t m = s.size(0), n = s.size(1), k = policy.resolve(ctx).k;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(s.get_device()).stream();
  auto router = std::make_shared<ssr::Router<ssr::SSRPolicy, ssr::CudaBackend<T>>>(policy);
  const at::TensorOptions on_device = s.options();
  Tensor experts = at::empty({m, k}, on_device.dtype(at::kInt));
  Tensor weights = at::empty({m, k}, on_device.dtype(c10::CppTypeToScalarType<T>::value));
  Tensor load = at::empty({n}, on_device.dtype(at::kInt));
  Tensor info = at::empty({info_size}, on_device.dtype(at::kDouble));
  Tensor workspace = at::empty({static_cast<int64_t>(router->workspace_bytes(m, n, ctx))}, on_device.dtype(at::kByte));
  // The Sinkhorn path checks its logits as on the CPU (NaN would spoil every column); the softmax path, and
  // any call in a CUDA graph capture, where nothing may wait, do not.
  const bool unchecked = policy.resolve(ctx).path != ssr::Path::sinkhorn || ssr::cuda::capturing(stream);
  return [=](const DeviceCommunicator* ranks) {
    auto options = ssr::CallOptions<cudaStream_t>{}.on(stream).using_workspace(
        {workspace.data_ptr(), static_cast<std::size_t>(workspace.numel())});
    if (unchecked) options.unchecked();
    if (ranks != nullptr) options.across(*ranks);
    const ssr::RouteInfo result = router->route(
        ssr::MatrixView<const In>{static_cast<const In*>(s.const_data_ptr()), m, n}, ctx,
        {{experts.data_ptr<int32_t>(), m, k}, {weights.data_ptr<T>(), m, k}, {load.data_ptr<int32_t>(), n}}, options);
    // Before the workspace, which may hold the pending statistics, returns to the allocator (in stream order).
    write_info<<<1, 1, 0, stream>>>(info.data_ptr<double>(), result.path == ssr::Path::sinkhorn ? 1.0 : 0.0,
                                    result.weights == ssr::Weights::scores ? 1.0 : 0.0, result.pending,
                                    result.iterations, result.marginal_error);
    ssr::cuda::check(cudaGetLastError(), "write info");
    return Routed{experts, weights, load, info};
  };
}

void check_cuda_logits(const Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2, "ssr.route: logits must be 2-d (tokens x experts), got ", logits.dim(), " dimensions");
  const at::ScalarType type = logits.scalar_type();
  TORCH_CHECK(type == at::kFloat || type == at::kDouble || type == at::kHalf || type == at::kBFloat16,
              "ssr.route: logits on a GPU must be float32, float64, float16 or bfloat16, got ", type);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> route_cuda(const Tensor& logits, std::string policy, int64_t k, std::string cost,
                                                      double xi, double tol, int64_t max_iters, std::string weights,
                                                      double p, double noise_alpha, double noise_sigma, int64_t seed,
                                                      int64_t step, int64_t layer, bool training, int64_t first_row,
                                                      std::string group, std::string score, int64_t n_groups,
                                                      int64_t topk_groups, const c10::optional<Tensor>& expert_bias,
                                                      const c10::optional<Tensor>& step_tensor) {
  const c10::cuda::CUDAGuard device(logits.device());
  const RouteArgs a{std::move(policy), k,           std::move(cost), xi,    tol,      max_iters, std::move(weights),
                    p,                 noise_alpha, noise_sigma,     seed,  step_of(step, step_tensor),
                    layer,             training,    first_row,
                    std::move(score),  n_groups,    topk_groups, expert_bias};
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(logits.get_device()).stream();
  return route_in_group<cudaStream_t>(
      a, group, logits.device(), stream, [&](const ssr::SSRPolicy& route_policy, const ssr::Context& ctx) {
        check_cuda_logits(logits);
        a.check_expert_bias(logits);
        switch (logits.scalar_type()) {
          case at::kDouble: return prepare_on_cuda<double, double>(logits, route_policy, ctx);
          case at::kHalf: return prepare_on_cuda<float, __half>(logits, route_policy, ctx);
          case at::kBFloat16: return prepare_on_cuda<float, __nv_bfloat16>(logits, route_policy, ctx);
          default: return prepare_on_cuda<float, float>(logits, route_policy, ctx);
        }
      });
}

template <class T>
void backward_on_cuda(const Tensor& g, const Tensor& e, const Tensor& w, const Tensor& s, Tensor& grad, ssr::Score score,
                      cudaStream_t stream) {
  const int64_t m = e.size(0), k = e.size(1), n = grad.size(1);
  ssr::RouteInfo info;
  info.weights = ssr::Weights::scores;  // plan weights are zeroed by the caller, from info[1] on the device
  info.score = score;
  ssr::CudaBackend<T> backend;
  ssr::BackwardArgs<T> args;
  if (s.defined()) args.logits = {s.const_data_ptr<T>(), m, n};
  args.experts = {e.const_data_ptr<int32_t>(), m, k};
  args.weights = {w.const_data_ptr<T>(), m, k};
  args.grad_weights = {g.const_data_ptr<T>(), m, k};
  args.grad_logits = {grad.data_ptr<T>(), m, n};
  ssr::backward(backend, info, args, ssr::CallOptions<cudaStream_t>{}.on(stream).unchecked());
}

Tensor route_backward_cuda(const Tensor& grad_weights, const Tensor& experts, const Tensor& weights, int64_t n,
                           bool passes_gradient, const c10::optional<Tensor>& info, std::string score,
                           const c10::optional<Tensor>& logits) {
  check_backward_args(grad_weights, experts, weights, n, logits);
  TORCH_CHECK(weights.scalar_type() == at::kFloat || weights.scalar_type() == at::kDouble,
              "ssr.route_backward: weights must be float32 or float64");
  const c10::cuda::CUDAGuard device(weights.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(weights.get_device()).stream();
  const Tensor g = grad_weights.contiguous().to(weights.scalar_type()), e = experts.contiguous(), w = weights.contiguous();
  // Sigmoid score weights read the logits, in the weights' type.
  const Tensor s = logits.has_value() ? logits->contiguous().to(weights.scalar_type()) : Tensor();
  Tensor grad = at::empty({e.size(0), n}, w.options());
  if (!passes_gradient) return grad.zero_();
  try {
    const ssr::Score route_score = ssr::parse_score(score);
    if (w.scalar_type() == at::kDouble) {
      backward_on_cuda<double>(g, e, w, s, grad, route_score, stream);
    } else {
      backward_on_cuda<float>(g, e, w, s, grad, route_score, stream);
    }
  } catch (const ssr::Error& err) {
    TORCH_CHECK(false, err.what());
  }
  if (info.has_value()) grad.masked_fill_(info->select(0, 1) == 0, 0);  // plan weights pass no gradient
  return grad;
}

}  // namespace
}  // namespace ssr_torch

TORCH_LIBRARY_IMPL(ssr, CUDA, m) {
  m.impl("route", &ssr_torch::route_cuda);
  m.impl("route_backward", &ssr_torch::route_backward_cuda);
}
