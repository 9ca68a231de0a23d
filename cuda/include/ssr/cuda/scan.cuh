// The CUDA backend's input checks: a kernel finds the first invalid element (the smallest index, by an
// atomic minimum, so the answer does not depend on scheduling) and one 8-byte read-back reports it. The
// read-back waits for the stream: this is the one host synchronisation of a checked call, and
// CallOptions::check_finite = false leaves it out.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ssr/cuda/check.cuh"
#include "ssr/cuda/tuning.cuh"
#include "ssr/detail/scalar.hpp"
#include "ssr/math/backward.hpp"
#include "ssr/math/numeric.hpp"
#include "ssr/validate.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace cuda {

constexpr unsigned long long no_index = ~0ull;

namespace detail {

template <class In>
__global__ void first_non_finite_kernel(ConstMatrixView<In> s, unsigned long long* first) {
  const index_t total = s.rows * s.cols;
  for (index_t e = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<index_t>(gridDim.x) * blockDim.x)
    if (!math::is_finite(ssr::detail::to_double(s(e / s.cols, e % s.cols))))
      atomicMin(first, static_cast<unsigned long long>(e));
}

template <class T>
__global__ void first_bad_assignment_kernel(ConstMatrixView<std::int32_t> experts, ConstMatrixView<T> weights,
                                            ConstMatrixView<T> grad_weights, index_t n, unsigned long long* first) {
  const index_t total = experts.rows * experts.cols;
  for (index_t a = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; a < total;
       a += static_cast<index_t>(gridDim.x) * blockDim.x) {
    const index_t i = a / experts.cols, r = a % experts.cols;
    if (!math::valid_assignment(experts(i, r), n, weights(i, r), grad_weights(i, r)))
      atomicMin(first, static_cast<unsigned long long>(a));
  }
}

inline unsigned scan_blocks(index_t total) {
  const index_t wanted = (total + CudaTuning::scan_threads - 1) / CudaTuning::scan_threads;
  return static_cast<unsigned>(wanted < 4096 ? (wanted < 1 ? 1 : wanted) : 4096);
}

// Reads the scan's result: waits for the stream.
inline unsigned long long read_index(const unsigned long long* first, cudaStream_t stream) {
  unsigned long long host = no_index;
  check(cudaMemcpyAsync(&host, first, sizeof host, cudaMemcpyDeviceToHost, stream), "read check result");
  check(cudaStreamSynchronize(stream), "check");
  return host;
}

template <class V>
V read(const V* p, cudaStream_t stream) {
  V v{};
  check(cudaMemcpyAsync(&v, p, sizeof(V), cudaMemcpyDeviceToHost, stream), "read value");
  check(cudaStreamSynchronize(stream), "read value");
  return v;
}

}  // namespace detail

// Throws ssr::Error naming the first non-finite logit in row-major order. flag: 8 bytes of device memory.
template <class In>
void check_finite(ConstMatrixView<In> s, unsigned long long* flag, cudaStream_t stream) {
  if (s.rows == 0) return;
  check(cudaMemsetAsync(flag, 0xff, sizeof *flag, stream), "cudaMemsetAsync (check)");
  detail::first_non_finite_kernel<<<detail::scan_blocks(s.rows * s.cols), CudaTuning::scan_threads, 0, stream>>>(s,
                                                                                                                 flag);
  check(cudaGetLastError(), "check_finite launch");
  const unsigned long long first = detail::read_index(flag, stream);
  if (first == no_index) return;
  const auto e = static_cast<index_t>(first);
  const In value = detail::read(&s(e / s.cols, e % s.cols), stream);
  ssr::detail::fail_non_finite_logit(e / s.cols, e % s.cols, ssr::detail::to_double(value));
}

// Throws ssr::Error at the first assignment backward cannot use (math::valid_assignment).
template <class T>
void check_backward(ConstMatrixView<std::int32_t> experts, ConstMatrixView<T> weights, ConstMatrixView<T> grad_weights,
                    index_t n, unsigned long long* flag, cudaStream_t stream) {
  check(cudaMemsetAsync(flag, 0xff, sizeof *flag, stream), "cudaMemsetAsync (check)");
  detail::first_bad_assignment_kernel<<<detail::scan_blocks(experts.rows * experts.cols), CudaTuning::scan_threads, 0,
                                        stream>>>(experts, weights, grad_weights, n, flag);
  check(cudaGetLastError(), "check_backward launch");
  const unsigned long long first = detail::read_index(flag, stream);
  if (first == no_index) return;
  const index_t i = static_cast<index_t>(first) / experts.cols, r = static_cast<index_t>(first) % experts.cols;
  ssr::detail::fail_bad_assignment(i, r, detail::read(&experts(i, r), stream), n, detail::read(&weights(i, r), stream),
                                   detail::read(&grad_weights(i, r), stream));
}

}  // namespace cuda
}  // namespace ssr
