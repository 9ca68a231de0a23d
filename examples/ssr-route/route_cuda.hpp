// ssr-route's way onto the GPU, behind a host-only interface: main.cpp stays plain C++ and only this
// interface's one CUDA translation unit (route_cuda.cu) needs nvcc.
#pragma once

#include <ssr/router.hpp>

namespace ssr_route {

// Routes host logits on the GPU with CudaBackend<T>: copies them to the device, routes, runs backward
// when grad_weights is given (writing grad_logits), and copies every requested output back to the host
// views in out. Throws ssr::Error when no CUDA device is usable.
template <class T>
ssr::RouteInfo route_cuda(const ssr::SSRPolicy& policy, const ssr::Context& ctx, ssr::ConstMatrixView<T> logits,
                          const ssr::RouteOutputs<T>& out, ssr::ConstMatrixView<T> grad_weights,
                          ssr::MatrixView<T> grad_logits);

}  // namespace ssr_route
