// CUDA runtime errors as ssr::Error, naming the call that failed.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "ssr/error.hpp"

namespace ssr {
namespace cuda {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(status));
}

}  // namespace cuda
}  // namespace ssr
