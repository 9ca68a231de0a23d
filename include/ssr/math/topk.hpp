// Top-k of one token's row: experts by descending value, ties to the lower index.
#pragma once

#include <cstdint>

#include "ssr/detail/hd.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace math {

// The order of experts: a larger value first; among equal values the lower index first.
template <class V>
SSR_HD bool ranks_before(V a, index_t ia, V b, index_t ib) {
  return a > b || (a == b && ia < ib);
}

// idx[0, k) = the first k of the n experts in that order, value(j) being expert j's value. Insertion in
// index order, where a later index moves ahead only when strictly greater.
template <class Value>
SSR_HD void topk(index_t n, int k, std::int32_t* idx, const Value& value) {
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

}  // namespace math
}  // namespace ssr
