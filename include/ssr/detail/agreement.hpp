// The collective steps of a distributed call on the host: agreeing on its validity and size before the
// solve's first reduction, so that an error on one rank is an error on every rank and never a hang; and
// exact sums over ranks of host arrays.
#pragma once

#include <cstdint>
#include <exception>

#include "ssr/communicator.hpp"
#include "ssr/error.hpp"
#include "ssr/math/exact_sum.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace detail {

// Runs the call's local checks on every rank, then has the ranks add up who failed and how many rows
// each holds. Rethrows a rank's own error; a rank whose checks passed throws one naming the failed
// rank(s). Returns the rows of the whole problem.
template <class Stream, class Checks>
std::int64_t agree(const Communicator<Stream>& comm, Stream stream, index_t rows, const Checks& checks) {
  std::exception_ptr error;
  try {
    checks();
  } catch (...) {
    error = std::current_exception();
  }
  std::int64_t status[3] = {error ? 1 : 0, error ? 0 : static_cast<std::int64_t>(rows), error ? comm.rank() : 0};
  comm.sum_on_host(status, 3, stream);
  if (error) std::rethrow_exception(error);
  if (status[0] == 1) fail("the call failed on rank ", status[2], " of ", comm.size(), " (see its error)");
  if (status[0] > 1) fail("the call failed on ", status[0], " of ", comm.size(), " ranks (see their errors)");
  return status[1];
}

// values[0, n) becomes the exact sum over ranks (math::to_exact, math::from_exact); values >= 0, host
// memory, limbs scratch of math::exact_limbs * n.
template <class Stream>
void sum_over_ranks(const Communicator<Stream>& comm, Stream stream, double* values, index_t n, std::int64_t* limbs) {
  for (index_t j = 0; j < n; ++j) math::to_exact(values[j], limbs + math::exact_limbs * j);
  comm.sum(limbs, static_cast<std::size_t>(math::exact_limbs * n), stream);
  for (index_t j = 0; j < n; ++j) values[j] = math::from_exact(limbs + math::exact_limbs * j);
}

}  // namespace detail
}  // namespace ssr
