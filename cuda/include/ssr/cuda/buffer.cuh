// The CUDA backend's own workspace: device memory that grows in stream order (cudaMallocAsync on the
// call's stream) the first time a shape needs more, and is reused after, so a warmed-up call allocates
// nothing. It serves one call at a time: calls on different streams at once bring their own workspaces.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "ssr/cuda/check.cuh"

namespace ssr {
namespace cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { swap(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    DeviceBuffer(std::move(o)).swap(*this);
    return *this;
  }
  ~DeviceBuffer() {
    if (data_) cudaFree(data_);  // waits for the device: the last call's stream may be gone by now
  }

  // Room for `bytes` bytes for a call on stream: a smaller old block is freed after the work of the
  // previous call (on its stream), the new one allocated in the call's stream order.
  void* reserve(std::size_t bytes, cudaStream_t stream) {
    if (bytes > bytes_) {
      if (data_) check(cudaFreeAsync(data_, stream_), "cudaFreeAsync (workspace)");
      data_ = nullptr;
      bytes_ = 0;
      check(cudaMallocAsync(&data_, bytes, stream), "cudaMallocAsync (workspace)");
      bytes_ = bytes;
    }
    stream_ = stream;
    return data_;
  }
  std::size_t bytes() const { return bytes_; }

 private:
  void swap(DeviceBuffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    std::swap(stream_, o.stream_);
  }

  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;  // of the last call, which the memory's release follows
};

}  // namespace cuda
}  // namespace ssr
