// Top-k of one row: indices by descending value, ties to the lower index.
#pragma once

#include <cstdint>

#include "ssr/view.hpp"

namespace ssr {
namespace detail {

// Insertion into a sorted list of k: a later index moves ahead only when strictly greater,
// so among equal values the lower index comes first.
template <class V>
inline void topk_row(const V* x, index_t n, int k, std::int32_t* idx) {
  int count = 0;
  for (index_t j = 0; j < n; ++j) {
    const V v = x[j];
    if (count == k && !(v > x[idx[k - 1]])) continue;
    int pos = count < k ? count++ : k - 1;
    while (pos > 0 && v > x[idx[pos - 1]]) {
      idx[pos] = idx[pos - 1];
      --pos;
    }
    idx[pos] = static_cast<std::int32_t>(j);
  }
}

}  // namespace detail
}  // namespace ssr
