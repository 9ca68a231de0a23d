// __half and __nv_bfloat16 logits read as doubles (ssr/detail/scalar.hpp), with the conversion intrinsics,
// so that they work where PyTorch's builds turn the implicit conversions off.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ssr/detail/scalar.hpp"

namespace ssr {
namespace detail {

template <>
struct Scalar<__half> {
  __host__ __device__ static double to_double(__half v) { return static_cast<double>(__half2float(v)); }
};

template <>
struct Scalar<__nv_bfloat16> {
  __host__ __device__ static double to_double(__nv_bfloat16 v) { return static_cast<double>(__bfloat162float(v)); }
};

}  // namespace detail
}  // namespace ssr
