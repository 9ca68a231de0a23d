// Dispatch: the (token, slot) assignments of a routing grouped by expert, as engines need them to run
// each expert on a contiguous batch, with an optional capacity beyond which tokens are dropped.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ssr/error.hpp"
#include "ssr/validate.hpp"
#include "ssr/view.hpp"

namespace ssr {

// Per-expert capacity ceil(factor * m * k / n), the usual capacity-factor rule.
inline index_t expert_capacity(double factor, index_t m, index_t k, index_t n) {
  detail::require(std::isfinite(factor) && factor > 0, "capacity_factor", factor, "must be finite and > 0");
  return static_cast<index_t>(std::ceil(factor * static_cast<double>(m * k) / static_cast<double>(n)));
}

// Groups the m x k assignments by expert. Writes offsets (n + 1: expert j's entries are
// [offsets[j], offsets[j+1])), and for each entry the token id and, when slots is given, its slot r
// (experts(token, r) = j). Within an expert, tokens keep their order. With capacity >= 0 an expert keeps
// its first `capacity` tokens and drops the rest. token_ids and slots need room for m * k entries.
// Returns the number of dropped assignments. Entries past offsets[n] are left as they were.
inline index_t group_by_expert(ConstMatrixView<std::int32_t> experts, index_t n, VectorView<std::int32_t> offsets,
                               VectorView<std::int32_t> token_ids, VectorView<std::int32_t> slots = {},
                               index_t capacity = -1) {
  const index_t m = experts.rows, k = experts.cols;
  detail::require(n >= 1, "n", n, "must be at least 1");
  detail::require(m * k <= std::numeric_limits<std::int32_t>::max(), "m * k", m * k, "must fit in int32");
  detail::require(k >= 1 && k <= n, "experts.cols", k, "must be in [1, n = ", n, "]");
  if (m > 0) detail::require_shape(experts, "experts", m, k);
  detail::require_size(offsets, "offsets", n + 1);
  detail::require_size(token_ids, "token_ids", m * k);
  if (!slots.empty()) detail::require_size(slots, "slots", m * k);
  for (index_t i = 0; i < m; ++i)
    for (index_t r = 0; r < k; ++r)
      detail::require(experts(i, r) >= 0 && experts(i, r) < n, detail::Indexed{"experts", i, r}, experts(i, r),
                      "must be in [0, ", n, ")");

  // Counting sort: count, clip to capacity, prefix-sum, scatter in token order.
  std::vector<index_t> count(static_cast<std::size_t>(n), 0);
  for (index_t i = 0; i < m; ++i)
    for (index_t r = 0; r < k; ++r) ++count[static_cast<std::size_t>(experts(i, r))];
  index_t dropped = 0;
  offsets[0] = 0;
  for (index_t j = 0; j < n; ++j) {
    index_t& c = count[static_cast<std::size_t>(j)];
    if (capacity >= 0 && c > capacity) {
      dropped += c - capacity;
      c = capacity;
    }
    offsets[j + 1] = static_cast<std::int32_t>(offsets[j] + c);
    c = offsets[j];  // from here on: expert j's next free position
  }
  for (index_t i = 0; i < m; ++i) {
    for (index_t r = 0; r < k; ++r) {
      const std::int32_t j = experts(i, r);
      index_t& next = count[static_cast<std::size_t>(j)];
      if (next == offsets[j + 1]) continue;  // expert full: dropped
      token_ids[next] = static_cast<std::int32_t>(i);
      if (!slots.empty()) slots[next] = static_cast<std::int32_t>(r);
      ++next;
    }
  }
  return dropped;
}

}  // namespace ssr
