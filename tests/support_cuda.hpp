// The property tests on the GPU: host buffers mirrored in device memory (see support.hpp).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <ssr/view.hpp>

namespace test {

inline void cuda_ok(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string("test: ") + what + ": " + cudaGetErrorString(status));
}

// A copy of a host view in device memory, with the same shape and stride. Views a call would reject (a
// stride below the columns) are not copied: the device view keeps their shape over a placeholder, so the
// call rejects them alike without reading it.
template <class V>
class Mirror {
  using Plain = std::remove_const_t<V>;

 public:
  explicit Mirror(ssr::MatrixView<V> h) : host_(h) { copy_in(); }
  explicit Mirror(ssr::VectorView<V> h) : host_(h.data, 1, h.size) { copy_in(); }
  Mirror(const Mirror&) = delete;
  Mirror& operator=(const Mirror&) = delete;
  ~Mirror() { cudaFree(device_); }

  ssr::MatrixView<V> view() const {
    return host_.data ? ssr::MatrixView<V>(device_, host_.rows, host_.cols, host_.stride) : host_;
  }
  ssr::VectorView<V> vector() const { return {view().data, host_.cols}; }
  void download() const {
    if constexpr (!std::is_const<V>::value)
      if (count_ > 0) cuda_ok(cudaMemcpy(host_.data, device_, count_ * sizeof(Plain), cudaMemcpyDeviceToHost), "download");
  }

 private:
  void copy_in() {
    if (!host_.data) return;
    const bool valid = host_.rows > 0 && host_.cols > 0 && host_.stride >= host_.cols;
    count_ = valid ? static_cast<std::size_t>((host_.rows - 1) * host_.stride + host_.cols) : 0;
    void* p = nullptr;
    cuda_ok(cudaMalloc(&p, std::max<std::size_t>(count_, 1) * sizeof(Plain)), "cudaMalloc");
    device_ = static_cast<Plain*>(p);
    if (count_ > 0) cuda_ok(cudaMemcpy(device_, host_.data, count_ * sizeof(Plain), cudaMemcpyHostToDevice), "upload");
  }

  ssr::MatrixView<V> host_;
  Plain* device_ = nullptr;
  std::size_t count_ = 0;
};

// Bytes of device memory, e.g. a caller workspace; read() copies them to the host.
class Bytes {
 public:
  Bytes(std::size_t size, unsigned char fill) : size_(size) {
    cuda_ok(cudaMalloc(&data_, std::max<std::size_t>(size, 1)), "cudaMalloc");
    cuda_ok(cudaMemset(data_, fill, size), "cudaMemset");
  }
  Bytes(const Bytes&) = delete;
  Bytes& operator=(const Bytes&) = delete;
  ~Bytes() { cudaFree(data_); }
  void* data() { return data_; }
  std::vector<unsigned char> read() const {
    std::vector<unsigned char> host(size_);
    cuda_ok(cudaMemcpy(host.data(), data_, size_, cudaMemcpyDeviceToHost), "read");
    return host;
  }

 private:
  void* data_ = nullptr;
  std::size_t size_;
};

}  // namespace test
