// The CUDA backend's tuning: launch shapes as constants (none changes a result's bits), and the properties
// of each device that the launches need, queried once per device and kept.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <mutex>

#include "ssr/cuda/check.cuh"
#include "ssr/view.hpp"

namespace ssr {

struct CudaTuning {
  // Fused softmax top-k: threads per block, the largest k it handles (larger k: the Thrust path).
  static constexpr int softmax_threads = 256;
  static constexpr int fused_max_k = 8;
  // Cooperative Sinkhorn solve: threads per block; and a switch that makes every solve take one launch a
  // step instead (sinkhorn.cuh: the fallback where the grid cannot be resident), for tests.
  static constexpr int sinkhorn_threads = 256;
  static inline bool force_sinkhorn_steps = false;
  // The fallback reads the solve's decision after every this many iterations (outside stream capture), so
  // that a converged solve stops queueing launches; in a capture it queues max_iters, those after the
  // decision doing nothing.
  static constexpr int steps_decide_every = 8;
  // Load counts in shared memory up to this many experts (more: the Thrust path); launch shape.
  static constexpr index_t count_max_experts = 8192;
  static constexpr int count_threads = 256;
  static constexpr int count_max_blocks = 1024;
  // Finiteness scans.
  static constexpr int scan_threads = 256;

  // Lanes per token (a power of two dividing a warp): about four columns per lane up to n = 64, so a warp
  // works on several tokens at once.
  static constexpr int lanes(index_t n) { return n <= 16 ? 4 : n <= 64 ? 16 : 32; }

  // What launches need to know of a device.
  int device = 0;
  int multiprocessors = 0;

  // The tuning of the current device, queried on its first use and kept.
  static const CudaTuning& current() {
    int device = 0;
    cuda::check(cudaGetDevice(&device), "cudaGetDevice");
    return of(device);
  }

  static const CudaTuning& of(int device) {
    static CudaTuning devices[max_devices];
    static std::once_flag once[max_devices];
    if (device < 0 || device >= max_devices) cuda::check(cudaErrorInvalidDevice, "CudaTuning::of");
    std::call_once(once[device], [device] {
      devices[device].device = device;
      cuda::check(cudaDeviceGetAttribute(&devices[device].multiprocessors, cudaDevAttrMultiProcessorCount, device),
                  "multiprocessor count");
    });
    return devices[device];
  }

  // Blocks of `kernel` with `threads` threads and `shared` bytes that one multiprocessor of this device
  // holds at once, queried once per (kernel, shared) and kept.
  int resident_blocks(const void* kernel, int threads, std::size_t shared) const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int e = 0; e < entries_; ++e)
      if (cache_[e].kernel == kernel && cache_[e].shared == shared) return cache_[e].blocks;
    int blocks = 0;
    cuda::check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, shared), "occupancy");
    if (entries_ < cache_size) cache_[entries_++] = {kernel, shared, blocks};
    return blocks;
  }

 private:
  static constexpr int max_devices = 64;
  static constexpr int cache_size = 64;
  struct Entry {
    const void* kernel;
    std::size_t shared;
    int blocks;
  };
  mutable std::mutex mutex_;
  mutable Entry cache_[cache_size] = {};
  mutable int entries_ = 0;
};

}  // namespace ssr
