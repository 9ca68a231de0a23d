// Top-k of one row: indices by descending value, ties to the lower index.
#pragma once

#include <cstdint>

#include "ssr/detail/hd.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace detail {

// Insertion into a sorted list of k: a later index moves ahead only when strictly greater,
// so among equal values the lower index comes first. value(j) gives the score of column j.
template <class Value>
SSR_HD inline void topk_by(index_t n, int k, std::int32_t* idx, const Value& value) {
  int count = 0;
  for (index_t j = 0; j < n; ++j) {
    const auto v = value(j);
    if (count == k && !(v > value(idx[k - 1]))) continue;
    int pos = count < k ? count++ : k - 1;
    while (pos > 0 && v > value(idx[pos - 1])) {
      idx[pos] = idx[pos - 1];
      --pos;
    }
    idx[pos] = static_cast<std::int32_t>(j);
  }
}

template <class V>
SSR_HD inline void topk_row(const V* x, index_t n, int k, std::int32_t* idx) {
  topk_by(n, k, idx, [x](index_t j) { return x[j]; });
}

}  // namespace detail
}  // namespace ssr
