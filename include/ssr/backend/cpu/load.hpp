// The load of a routing call on the CPU: how many of its chosen entries name each expert, counted per
// thread and added in a fixed order, so that any team of threads gives the same integers.
#pragma once

#include <algorithm>
#include <cstdint>

#include "ssr/detail/parallel.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace cpu {

// Each thread counts its rows' entries in turn into this many tallies: adds to one expert seldom wait on
// each other.
constexpr index_t load_ways = 4;

// load[j] from experts; counts holds n * load_ways tallies per thread.
inline void count_load(ConstMatrixView<std::int32_t> experts, VectorView<std::int32_t> load, std::int32_t* counts,
                       int threads) {
  const index_t n = load.size, k = experts.cols;
  std::fill(counts, counts + n * load_ways * threads, 0);
  detail::parallel(threads, [&] {
    std::int32_t* tally = counts + n * load_ways * detail::thread_id();
    const auto count = [&](const std::int32_t* e, index_t entries) {
      index_t a = 0;
      for (; a + load_ways <= entries; a += load_ways)
        for (index_t w = 0; w < load_ways; ++w) ++tally[w * n + e[a + w]];
      for (; a < entries; ++a) ++tally[e[a]];
    };
    const auto [i0, i1] = detail::own_range(experts.rows);
    if (experts.stride == k) {  // the rows are one run of entries
      if (i1 > i0) count(experts.row(i0), (i1 - i0) * k);
    } else {
      for (index_t i = i0; i < i1; ++i) count(experts.row(i), k);
    }
  });
  for (index_t j = 0; j < n; ++j) {
    std::int32_t sum = 0;
    for (index_t t = 0; t < load_ways * threads; ++t) sum += counts[t * n + j];
    load[j] = sum;
  }
}

}  // namespace cpu
}  // namespace ssr
