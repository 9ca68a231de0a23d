// CudaBackend<T>: the Thrust backend on the CUDA system plus fused kernels for the hot paths:
// softmax top-k in one kernel (k <= fused_max_k), and the Sinkhorn iterations in one cooperative kernel
// that decides convergence on the device (n up to 736, see sinkhorn_fits). Views hold device pointers; work runs on the backend's stream, and a
// routing call returns once its results are in place.
#pragma once

#include <cuda_runtime.h>
#include <thrust/device_vector.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/system/cuda/execution_policy.h>

#include <string>

#include "ssr/backend/thrust.hpp"
#include "ssr/cuda/check.cuh"
#include "ssr/cuda/load.cuh"
#include "ssr/cuda/sinkhorn.cuh"
#include "ssr/cuda/softmax_topk.cuh"
#include "ssr/error.hpp"

namespace ssr {

template <class T>
class CudaBackend : public ThrustBackend<T> {
 public:
  using value_type = T;

  CudaBackend() = default;
  explicit CudaBackend(cudaStream_t stream) : stream_(stream) {}
  cudaStream_t stream() const { return stream_; }

  RouteInfo route(const RouteSpec& spec, ConstMatrixView<T> s, const RouteOutputs<T>& out) {
    namespace k = detail::thrust_kernels;
    const index_t m = s.rows, n = s.cols;
    const bool fused_softmax = spec.path == Path::softmax && spec.k <= cuda::fused_max_k;
    const bool fused_sinkhorn = spec.path == Path::sinkhorn && cuda::sinkhorn_fits(n);
    if (m == 0 || !(fused_softmax || fused_sinkhorn)) {
      RouteOutputs<T> rest = out;
      rest.load = {};
      const RouteInfo info = ThrustBackend<T>::route(spec, s, rest);
      if (!out.load.empty()) count_load(out.experts, out.load);
      cuda::check(cudaStreamSynchronize(stream_), "route");
      return info;
    }

    RouteInfo info = initial_info(spec);
    const auto policy = thrust::cuda::par.on(stream_);
    const thrust::counting_iterator<index_t> zero(0);
    if (fused_softmax) {
      cuda::softmax_topk<T, T>(s, spec, out.experts, out.weights, out.noise, stream_);
      cuda::check(cudaGetLastError(), "softmax_topk");
    } else {
      const auto ws = cuda::SinkhornWorkspace::of(m, n);
      grow(logk_, m * n);
      grow(f_, ws.f);
      grow(g_, ws.g);
      grow(partial_, ws.partial);
      grow(colerr_, ws.colerr);
      if (state_.size() == 0) state_.resize(1);
      T* logk = thrust::raw_pointer_cast(logk_.data());
      double* g = thrust::raw_pointer_cast(g_.data());
      thrust::for_each(policy, zero, zero + m, k::KernelRow<T>{spec, s, logk, out.noise});
      const cuda::SinkhornState st = cuda::sinkhorn_iterate<T>(
          logk, thrust::raw_pointer_cast(f_.data()), g, thrust::raw_pointer_cast(partial_.data()),
          thrust::raw_pointer_cast(colerr_.data()),
          thrust::raw_pointer_cast(state_.data()), m, n, spec.sinkhorn, stream_);
      cuda::check(cudaGetLastError(), "sinkhorn");
      info.iterations = st.iterations;
      info.marginal_error = st.err;
      info.converged = st.err < spec.sinkhorn.tol;
      thrust::for_each(policy, zero, zero + m, k::PlanRow<T>{spec, s, logk, g, out.experts, out.weights, out.plan});
    }
    if (!out.load.empty()) count_load(out.experts, out.load);
    cuda::check(cudaStreamSynchronize(stream_), "route");
    return info;
  }

 private:
  void count_load(ConstMatrixView<std::int32_t> experts, VectorView<std::int32_t> load) {
    if (load.size <= cuda::count_max_experts) {
      cuda::count_load(experts, load, stream_);
    } else {
      const thrust::counting_iterator<index_t> zero(0);
      thrust::for_each(thrust::cuda::par.on(stream_), zero, zero + load.size,
                       detail::thrust_kernels::Count<T>{experts, load.data});
    }
    cuda::check(cudaGetLastError(), "count_load");
  }

  template <class V>
  static void grow(thrust::device_vector<V>& v, index_t size) {
    if (static_cast<index_t>(v.size()) < size) v.resize(static_cast<std::size_t>(size));
  }

  cudaStream_t stream_ = nullptr;
  thrust::device_vector<T> logk_;
  thrust::device_vector<double> f_, g_, partial_, colerr_;
  thrust::device_vector<cuda::SinkhornState> state_;
};

}  // namespace ssr
