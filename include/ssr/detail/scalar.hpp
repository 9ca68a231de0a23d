// Reading an element of any logits type as a double. Host types convert with static_cast; the CUDA
// component adds __half and __nv_bfloat16 (ssr/cuda/scalar.cuh), so one kernel reads every type.
#pragma once

#include "ssr/detail/hd.hpp"

namespace ssr {
namespace detail {

template <class V>
struct Scalar {
  SSR_HD static double to_double(V v) { return static_cast<double>(v); }
};

template <class V>
SSR_HD double to_double(V v) {
  return Scalar<V>::to_double(v);
}

}  // namespace detail
}  // namespace ssr
