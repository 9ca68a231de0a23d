// Many ranks, one problem: what a Sinkhorn solve needs from the processes that share it (data- and
// expert-parallel ranks each routing their own tokens to the same experts). Adapters: ssr/mpi.hpp
// (ssr::mpi), ssr/nccl.cuh (ssr::nccl); the PyTorch package adapts a torch.distributed process group.
//
// Only integer sums and floating-point maxima cross ranks: both are exact whatever order a library adds
// in, so every rank reaches the same bits and the same decisions (ssr/math/exact_sum.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ssr {

template <class Stream>
class Communicator {
 public:
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  Communicator(Communicator&&) = delete;
  Communicator& operator=(Communicator&&) = delete;
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // data[0, count) becomes the element-wise sum over ranks: memory of the backend the call runs on
  // (device memory for a GPU backend), ordered on stream.
  virtual void sum(std::int64_t* data, std::size_t count, Stream stream) const = 0;
  // data[0, count) becomes the element-wise maximum over ranks; the same memory and order.
  virtual void max(double* data, std::size_t count, Stream stream) const = 0;
  // sum() of host memory, returning once the result is there: a call's agreement before its solve.
  virtual void sum_on_host(std::int64_t* data, std::size_t count, Stream stream) const = 0;
};

}  // namespace ssr
