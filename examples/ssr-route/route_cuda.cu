// The GPU path of ssr-route: host buffers in and out, CudaBackend<T> in between.
#include "route_cuda.hpp"

#include <ssr/cuda/backend.cuh>

#include <thrust/device_vector.h>

#include <string>

namespace ssr_route {
namespace {

template <class V>
V* ptr(thrust::device_vector<V>& v) {
  return thrust::raw_pointer_cast(v.data());
}

// Host view <-> dense device buffer, honouring the host view's row stride.
template <class V>
thrust::device_vector<V> to_device(ssr::ConstMatrixView<V> host) {
  thrust::device_vector<V> d(static_cast<std::size_t>(host.rows * host.cols));
  if (!d.empty())
    ssr::cuda::check(cudaMemcpy2D(ptr(d), host.cols * sizeof(V), host.data, host.stride * sizeof(V), host.cols * sizeof(V),
                                  host.rows, cudaMemcpyHostToDevice),
                     "copy to device");
  return d;
}

template <class V>
void to_host(const thrust::device_vector<V>& d, ssr::MatrixView<V> host) {
  if (host.empty() || host.rows == 0) return;
  ssr::cuda::check(cudaMemcpy2D(host.data, host.stride * sizeof(V), thrust::raw_pointer_cast(d.data()), host.cols * sizeof(V),
                                host.cols * sizeof(V), host.rows, cudaMemcpyDeviceToHost),
                   "copy to host");
}

template <class V>
thrust::device_vector<V> like(const ssr::MatrixView<V>& host) {
  return thrust::device_vector<V>(host.empty() ? 0 : static_cast<std::size_t>(host.rows * host.cols));
}

template <class V>
ssr::MatrixView<V> view_of(thrust::device_vector<V>& d, const ssr::MatrixView<V>& host) {
  return host.empty() ? ssr::MatrixView<V>{} : ssr::MatrixView<V>{ptr(d), host.rows, host.cols};
}

}  // namespace

template <class T>
ssr::RouteInfo route_cuda(const ssr::SSRPolicy& policy, const ssr::Context& ctx, ssr::ConstMatrixView<T> logits,
                          const ssr::RouteOutputs<T>& out, ssr::ConstMatrixView<T> grad_weights,
                          ssr::MatrixView<T> grad_logits) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0)
    throw ssr::Error(std::string("--backend cuda: no usable CUDA device (") +
                     (status != cudaSuccess ? cudaGetErrorString(status) : "none found") + ")");
  thrust::device_vector<T> s = to_device(logits), weights = like(out.weights), plan = like(out.plan), noise = like(out.noise);
  thrust::device_vector<std::int32_t> experts = like(out.experts),
                                      load(out.load.empty() ? 0 : static_cast<std::size_t>(out.load.size));
  ssr::RouteOutputs<T> d_out{view_of(experts, out.experts), view_of(weights, out.weights)};
  if (!out.load.empty()) d_out.load = {ptr(load), out.load.size};
  d_out.plan = view_of(plan, out.plan);
  d_out.noise = view_of(noise, out.noise);

  const ssr::ConstMatrixView<float> host_bias(ctx.expert_bias.data, ctx.expert_bias.empty() ? 0 : 1, ctx.expert_bias.size);
  thrust::device_vector<float> bias = to_device(host_bias);
  const ssr::Context d_ctx = ctx.with_bias(ctx.expert_bias.empty() ? ssr::VectorView<const float>{}
                                                                   : ssr::VectorView<const float>{ptr(bias), ctx.expert_bias.size});

  ssr::Router<ssr::SSRPolicy, ssr::CudaBackend<T>> router(policy);
  const auto wait = ssr::CallOptions<cudaStream_t>{}.waiting();  // the info is printed: wait for it
  const ssr::RouteInfo info = router.route({ptr(s), logits.rows, logits.cols}, d_ctx, d_out, wait);
  to_host(experts, out.experts);
  to_host(weights, out.weights);
  to_host(noise, out.noise);
  if (info.path == ssr::Path::sinkhorn) to_host(plan, out.plan);
  if (!out.load.empty()) thrust::copy(load.begin(), load.end(), out.load.data);
  if (!grad_weights.empty()) {
    thrust::device_vector<T> g = to_device(grad_weights), grad = like(grad_logits);
    ssr::BackwardArgs<T> args;
    args.logits = {ptr(s), logits.rows, logits.cols};
    args.experts = d_out.experts;
    args.weights = d_out.weights;
    args.grad_weights = {ptr(g), grad_weights.rows, grad_weights.cols};
    args.grad_logits = view_of(grad, grad_logits);
    router.backward(info, args);
    to_host(grad, grad_logits);
  }
  return info;
}

template ssr::RouteInfo route_cuda<float>(const ssr::SSRPolicy&, const ssr::Context&, ssr::ConstMatrixView<float>,
                                          const ssr::RouteOutputs<float>&, ssr::ConstMatrixView<float>, ssr::MatrixView<float>);
template ssr::RouteInfo route_cuda<double>(const ssr::SSRPolicy&, const ssr::Context&, ssr::ConstMatrixView<double>,
                                           const ssr::RouteOutputs<double>&, ssr::ConstMatrixView<double>, ssr::MatrixView<double>);

}  // namespace ssr_route
