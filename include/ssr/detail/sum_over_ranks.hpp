// Exact sums over ranks of host arrays: the column sums of a distributed solve (every rank reads back the
// same bits).
#pragma once

#include <cstdint>

#include "ssr/communicator.hpp"
#include "ssr/math/exact_sum.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace detail {

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
