// The device and stream state calls depend on: ScopedDevice makes a device current for a scope (for memory
// allocated or freed on the device it belongs to), and capturing() says whether a stream is being captured
// into a CUDA graph (where nothing may allocate or wait for the host).
#pragma once

#include <cuda_runtime.h>

#include "ssr/cuda/check.cuh"

namespace ssr {
namespace cuda {

class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (device != previous_) {
      check(cudaSetDevice(device), "cudaSetDevice");
      changed_ = true;
    }
  }
  ~ScopedDevice() {
    if (changed_) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

inline bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace cuda
}  // namespace ssr
