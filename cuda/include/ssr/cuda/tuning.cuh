// The CUDA backend's tuning: launch shapes as constants, the blocking of the Sinkhorn solve as functions of
// the shape alone (so results repeat bit for bit on every GPU), and the properties of each device that
// the launches need, queried once per device and kept.
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
  // Fused Sinkhorn solve: threads per block (8 warps).
  static constexpr int sinkhorn_threads = 256;
  static constexpr int sinkhorn_warps = sinkhorn_threads / 32;
  // Load counts in shared memory up to this many experts (more: the Thrust path); launch shape.
  static constexpr index_t count_max_experts = 8192;
  static constexpr int count_threads = 256;
  static constexpr int count_max_blocks = 1024;
  // Finiteness scans.
  static constexpr int scan_threads = 256;

  // Lanes per token (a power of two dividing a warp): about four columns per lane up to n = 64, so a warp
  // works on several tokens at once.
  static constexpr int lanes(index_t n) { return n <= 16 ? 4 : n <= 64 ? 16 : 32; }

  // Sinkhorn: rows a group of lanes works on at once (sinkhorn.cuh), rows a block works on at once, and
  // rows per row block: about m / 1024, at most max(1024, slot) rows, a multiple of the slot (fewer,
  // longer row blocks than m / 2048 and 256 rows: each ends in a block-wide reduction). Four rows at once
  // at n <= 16 from 2^18 rows, where an iteration waits on its loads rather than its barriers: on an H200
  // (with three blocks per multiprocessor, sinkhorn.cuh) the iteration at 10^6 x 16 took 1/1.36 the time;
  // at 24576 x 8 and 16 four rows at once took 1.05-1.13x the time of two, so two stay there.
  static constexpr bool sinkhorn_many_rows(index_t m) { return m >= (index_t(1) << 18); }
  static constexpr int sinkhorn_rows_per_group(index_t m, index_t n) {
    return n <= 16 && sinkhorn_many_rows(m) ? 4 : n <= 256 ? 2 : 1;
  }
  static constexpr index_t sinkhorn_slot(index_t m, index_t n) {
    return sinkhorn_warps * (32 / lanes(n)) * sinkhorn_rows_per_group(m, n);
  }
  static constexpr index_t rows_per_block(index_t m, index_t n) {
    const index_t slot = sinkhorn_slot(m, n), cap = slot > 1024 ? slot : 1024;
    const index_t rounded = ((m + 1023) / 1024 + slot - 1) / slot * slot;
    return rounded < slot ? slot : rounded > cap ? cap : rounded;
  }
  static constexpr index_t row_blocks(index_t m, index_t n) {
    return (m + rows_per_block(m, n) - 1) / rows_per_block(m, n);
  }
  // The fused solve's widest rows: 32 lanes of at most 19 columns each (sinkhorn.cuh).
  static constexpr index_t sinkhorn_max_n = 32 * 19;
  // Shared memory of the solve for n experts (per-warp column sums, a reduction scratch, h and v), within
  // the default 48 KiB up to sinkhorn_max_n.
  static constexpr std::size_t sinkhorn_shared_bytes(index_t n) {
    return static_cast<std::size_t>(sinkhorn_warps * n + sinkhorn_warps + 2 * n) * sizeof(double);
  }
  static constexpr bool sinkhorn_fits(index_t n) { return n <= sinkhorn_max_n; }

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

static_assert(CudaTuning::sinkhorn_shared_bytes(CudaTuning::sinkhorn_max_n) <= 48 * 1024,
              "the fused Sinkhorn solve's shared memory fits the default limit");

}  // namespace ssr
