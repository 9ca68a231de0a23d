// The CUDA backend's own memory. Its workspace: device memory that grows the first time a shape needs
// more and is reused after, so a warmed-up call allocates nothing. It belongs to the device it was
// allocated on (a call on another device frees it and allocates there), and it grows outside stream capture
// only: memory allocated in a capture would belong to the graph. It serves one call at a time: calls on
// different streams at once bring their own workspaces. And the pinned memory its read-backs go through.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>
#include <utility>

#include "ssr/cuda/check.cuh"
#include "ssr/cuda/device.cuh"
#include "ssr/error.hpp"

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
  ~DeviceBuffer() { release(); }

  // Room for `bytes` bytes on the current device for a call on stream (of that device). Growing frees the
  // old block with cudaFree, which waits for the work of every stream: the last call's stream may be gone.
  void* reserve(std::size_t bytes, cudaStream_t stream) {
    int device = 0;
    check(cudaGetDevice(&device), "cudaGetDevice (workspace)");
    if (bytes == 0 || (device == device_ && bytes <= bytes_)) return data_;
    if (capturing(stream))
      throw RuntimeError(detail::concat(
          "ssr::CudaBackend: the call needs ", bytes, " bytes of workspace on device ", device,
          " and its stream is being captured, where no memory may be allocated: make one call of this shape on the "
          "device before capturing, or pass a workspace (CallOptions::using_workspace)"));
    release();
    check(cudaMalloc(&data_, bytes), "cudaMalloc (workspace)");
    bytes_ = bytes;
    device_ = device;
    return data_;
  }
  std::size_t bytes() const { return bytes_; }

 private:
  // Frees the block on the device it belongs to.
  void release() noexcept {
    if (data_ == nullptr) return;
    try {
      const ScopedDevice on(device_);
      if (cudaFree(data_) != cudaSuccess) (void)cudaGetLastError();  // not the next call's error to report
    } catch (const CudaError&) {  // the device cannot be made current: the block goes with the context
      (void)cudaGetLastError();
    }
    data_ = nullptr;
    bytes_ = 0;
  }

  void swap(DeviceBuffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    std::swap(device_, o.device_);
  }

  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  int device_ = -1;  // where data_ was allocated
};

// The calling thread's pinned host block that read-backs go through: allocated on its first use (or
// reserved ahead, CudaBackend::reserve_workspace) and freed when the thread ends, so that backends made
// for one call (as the PyTorch operator's) allocate none.
constexpr std::size_t read_back_bytes = 256;
inline void* pinned_read_back_block() {
  struct Block {
    void* data = nullptr;
    ~Block() {
      if (data != nullptr) cudaFreeHost(data);
    }
  };
  thread_local Block block;
  if (block.data == nullptr) check(cudaMallocHost(&block.data, read_back_bytes), "cudaMallocHost (read-back)");
  return block.data;
}

// Copies *device on stream into pinned host memory, waits for the stream, and returns the value: a copy
// into pinned memory is a direct transfer, where pageable memory is staged through a driver buffer.
template <class V>
V read_back(const V* device, cudaStream_t stream) {
  static_assert(sizeof(V) <= read_back_bytes, "read_back: a value larger than the pinned block");
  void* block = pinned_read_back_block();
  check(cudaMemcpyAsync(block, device, sizeof(V), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync (read-back)");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (read-back)");
  V value;
  std::memcpy(&value, block, sizeof(V));
  return value;
}

}  // namespace cuda
}  // namespace ssr
