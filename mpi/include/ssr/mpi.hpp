// MpiCommunicator: the ranks of an MPI communicator sharing one routing problem, for the host backends
// (CpuBackend, ThrustBackend on a host system). Target ssr::mpi. Every rank makes the same routing calls
// in the same order; ssr's collectives run on the given communicator, from the thread that routes (so
// MPI_THREAD_FUNNELED suffices), and must not interleave with other threads' collectives on it.
#pragma once

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <cstdint>

#include "ssr/call.hpp"
#include "ssr/communicator.hpp"
#include "ssr/error.hpp"

namespace ssr {

class MpiCommunicator final : public Communicator<HostStream> {
 public:
  // The ranks of comm (not duplicated: the caller keeps it alive and owns it).
  explicit MpiCommunicator(MPI_Comm comm = MPI_COMM_WORLD) : comm_(comm) {
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MPI_Comm comm() const { return comm_; }

  void sum(std::int64_t* data, std::size_t count, HostStream /*stream*/) const override {
    check(MPI_Allreduce(MPI_IN_PLACE, data, to_int(count), MPI_INT64_T, MPI_SUM, comm_), "MPI_Allreduce (sum)");
  }
  void max(double* data, std::size_t count, HostStream /*stream*/) const override {
    check(MPI_Allreduce(MPI_IN_PLACE, data, to_int(count), MPI_DOUBLE, MPI_MAX, comm_), "MPI_Allreduce (max)");
  }
  void sum_on_host(std::int64_t* data, std::size_t count, HostStream stream) const override {
    sum(data, count, stream);
  }

 private:
  static void check(int status, const char* what) {
    if (status != MPI_SUCCESS) throw RuntimeError(detail::concat("MPI error ", status, " in ", what));
  }
  static int to_int(std::size_t count) {
    detail::require(count <= static_cast<std::size_t>(INT_MAX), "count", count, "must fit in an MPI count");
    return static_cast<int>(count);
  }

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace ssr
