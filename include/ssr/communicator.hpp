// Many ranks, one problem: what a Sinkhorn solve needs from the processes that share it (data- and
// expert-parallel ranks each routing their own tokens to the same experts). Adapters: ssr/mpi.hpp
// (ssr::mpi), ssr/nccl.cuh (ssr::nccl); the PyTorch package adapts a torch.distributed process group.
//
// Only integer sums and floating-point maxima cross ranks: both are exact whatever order a library adds
// in, so every rank reaches the same bits and the same decisions (ssr/math/exact_sum.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>

#include "ssr/error.hpp"

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

// A value every rank of a call must hold alike (its number of experts, or a digest of its options and
// shape, detail::Digest), and what it stands for in the error when the ranks' values differ.
struct Alike {
  std::uint64_t value = 0;
  const char* what = "arguments";
};

// Runs a call's local checks on every rank of comm, then has the ranks add up who failed, how many rows
// each holds and their `alike` values, so that an error on one rank is an error on every rank and never a
// hang. Rethrows a rank's own error; a rank whose checks passed throws one naming the failed rank(s); when
// the alike values differ, every rank throws. Returns the rows of the whole problem. Router::route does this
// before a distributed solve; an engine whose own checks precede the call (e.g. of its tensors) runs them
// through agree first, so they are agreed on too.
template <class Stream, class Checks>
std::int64_t agree(const Communicator<Stream>& comm, Stream stream, std::int64_t rows, const Checks& checks,
                   Alike alike = {}) {
  std::exception_ptr error;
  try {
    checks();
  } catch (...) {
    error = std::current_exception();
  }
  // [ranks that failed, rows, the failed rank; then per byte of alike.value: its sum and its square's sum]
  constexpr std::size_t bytes = sizeof alike.value;
  std::int64_t status[3 + 2 * bytes] = {error ? 1 : 0, error ? 0 : rows, error ? comm.rank() : 0};
  for (std::size_t b = 0; b < bytes; ++b) {
    const auto byte = static_cast<std::int64_t>((alike.value >> (8 * b)) & 0xff);
    status[3 + 2 * b] = byte;
    status[4 + 2 * b] = byte * byte;
  }
  comm.sum_on_host(status, 3 + 2 * bytes, stream);
  if (error) std::rethrow_exception(error);
  if (status[0] == 1) detail::fail("the call failed on rank ", status[2], " of ", comm.size(), " (see its error)");
  if (status[0] > 1) detail::fail("the call failed on ", status[0], " of ", comm.size(), " ranks (see their errors)");
  // R values are alike when each byte's variance is 0, R sum(b^2) = (sum b)^2: exact in int64 up to 2^23 ranks.
  const std::int64_t ranks = comm.size();
  for (std::size_t b = 0; b < bytes; ++b)
    if (ranks * status[4 + 2 * b] != status[3 + 2 * b] * status[3 + 2 * b])
      detail::fail("the ranks made the call with different ", alike.what);
  return status[1];
}

}  // namespace ssr
