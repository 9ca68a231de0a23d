// NcclCommunicator: the ranks of an NCCL communicator sharing one routing problem, for CudaBackend. Target
// ssr::nccl. Reductions are ncclAllReduce on the call's stream (stream-ordered, no host wait); the one
// host exchange of a distributed call (agreeing on validity and size) stages 8 bytes a value through
// device memory and waits for the stream. Every rank makes the same routing calls in the same order.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "ssr/communicator.hpp"
#include "ssr/cuda/check.cuh"
#include "ssr/cuda/device.cuh"
#include "ssr/error.hpp"

namespace ssr {

class NcclCommunicator final : public Communicator<cudaStream_t> {
 public:
  // The ranks of comm, an initialised NCCL communicator the caller keeps alive and owns.
  explicit NcclCommunicator(ncclComm_t comm) : comm_(comm) {
    check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    check(ncclCommCount(comm_, &size_), "ncclCommCount");
    check(ncclCommCuDevice(comm_, &device_), "ncclCommCuDevice");
    const cuda::ScopedDevice on(device_);  // the staging memory on the communicator's device
    cuda::check(cudaMalloc(&staging_, staging_count * sizeof(std::int64_t)), "cudaMalloc (staging)");
  }
  ~NcclCommunicator() override {
    try {
      const cuda::ScopedDevice on(device_);
      cudaFree(staging_);
    } catch (const cuda::CudaError&) {  // the device cannot be made current: the memory goes with the context
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void sum(std::int64_t* data, std::size_t count, cudaStream_t stream) const override {
    check(ncclAllReduce(data, data, count, ncclInt64, ncclSum, comm_, stream), "ncclAllReduce (sum)");
  }
  void max(double* data, std::size_t count, cudaStream_t stream) const override {
    check(ncclAllReduce(data, data, count, ncclFloat64, ncclMax, comm_, stream), "ncclAllReduce (max)");
  }
  void sum_on_host(std::int64_t* data, std::size_t count, cudaStream_t stream) const override {
    detail::require(count <= staging_count, "count", count, "must be at most ", staging_count);
    const std::size_t bytes = count * sizeof(std::int64_t);
    cuda::check(cudaMemcpyAsync(staging_, data, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync (agreement)");
    sum(staging_, count, stream);
    cuda::check(cudaMemcpyAsync(data, staging_, bytes, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync (agreement)");
    cuda::check(cudaStreamSynchronize(stream), "agreement");
  }

 private:
  static constexpr std::size_t staging_count = 64;

  static void check(ncclResult_t status, const char* what) {
    if (status != ncclSuccess)
      throw RuntimeError(detail::concat("NCCL error in ", what, ": ", ncclGetErrorString(status)));
  }

  ncclComm_t comm_;
  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  std::int64_t* staging_ = nullptr;
};

}  // namespace ssr
