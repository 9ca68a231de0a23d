// CUDA runtime errors as ssr::CudaError (an ssr::RuntimeError, not an argument error), naming the call
// that failed and keeping the runtime's code.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "ssr/error.hpp"

namespace ssr {
namespace cuda {

class CudaError : public RuntimeError {
 public:
  CudaError(cudaError_t code, const char* what)
      : RuntimeError(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(code)), code_(code) {}
  cudaError_t code() const { return code_; }

 private:
  cudaError_t code_;
};

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw CudaError(status, what);
}

}  // namespace cuda
}  // namespace ssr
