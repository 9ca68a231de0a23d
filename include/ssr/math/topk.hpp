// Top-k of one token's row: experts by descending value, ties to the lower index, NaN as -inf. The rule
// is one insertion step, written once for a scalar and for a vector of lanes (the CPU's tiles: a row a
// lane).
#pragma once

#include <cstdint>
#include <limits>

#include "ssr/detail/hd.hpp"
#include "ssr/math/lanes.hpp"
#include "ssr/view.hpp"

SSR_LANES_BEGIN
namespace ssr {
namespace math {

// The order of experts: a larger value first; among equal values the lower index first.
template <class V>
SSR_HD bool ranks_before(V a, index_t ia, V b, index_t ib) {
  return a > b || (a == b && ia < ib);
}

// Expert j, of value v, into a list of the best `count` of the experts before it (count <= k), kept by
// descending value: while the list has fewer than k entries v takes the next place, else the last place
// where v is strictly greater than the last entry; then it moves ahead of every entry it is strictly greater
// than. Experts come in index order, so a later index passes an earlier one only when strictly greater. A
// NaN ranks as -inf: it never enters a full list, and where it takes a free place it enters as -inf.
// `list` holds the entries, with masks of type List::Mask (lane by lane) and comparisons in pieces of
// List::piece bytes: less(p, v, m) sets m = entry p's value < v; all(m) sets every lane of m;
// move(p, up, here, v, j) sets entry p (p > 0) to entry p - 1 where `up`, else to (v, j) where `here`;
// put(here, v, j) sets entry 0 to (v, j) where `here`; any(m) tells whether any lane holds.
template <class List, class V, class I>
SSR_HD SSR_INLINE void topk_insert(List& list, int k, int count, const V& value, const I& j) {
  int p = count < k ? count : k - 1;  // the place v takes, if it enters
  V v = value;
  typename List::Mask here, up;
  if (count < k) {
    nan_to<List::piece>(v, V{} - std::numeric_limits<lane_t<V>>::infinity());
    list.all(here);
  } else {
    list.less(p, v, here);
  }
  if (!list.any(here)) return;
  for (; p > 0; --p) {
    list.less(p - 1, v, up);
    up = up & here;
    list.move(p, up, here, v, j);
    here = up;
  }
  list.put(here, v, j);
}

// The list topk keeps: the chosen experts' indices, their values looked up.
template <class Value>
struct IndexList {
  std::int32_t* idx;
  const Value& value_of;
  using Mask = bool;
  static constexpr int piece = piece_bytes;
  SSR_HD void less(int p, double v, bool& m) const {
    auto entry = static_cast<double>(value_of(idx[p]));
    nan_to(entry, -std::numeric_limits<double>::infinity());  // as it entered
    m = entry < v;
  }
  SSR_HD static void all(bool& m) { m = true; }
  SSR_HD void move(int p, bool up, bool here, double /*v*/, std::int32_t j) const {
    if (up) {
      idx[p] = idx[p - 1];
    } else if (here) {
      idx[p] = j;
    }
  }
  SSR_HD void put(bool here, double /*v*/, std::int32_t j) const {
    if (here) idx[0] = j;
  }
  SSR_HD static bool any(bool here) { return here; }
};

// idx[0, k) = the first k of the n experts in that order, value(j) being expert j's value.
template <class Value>
// NOLINTNEXTLINE(readability-non-const-parameter): idx is written through the list
SSR_HD void topk(index_t n, int k, std::int32_t* idx, const Value& value) {
  IndexList<Value> list{idx, value};
  for (index_t j = 0; j < n; ++j) {
    const int count = j < k ? static_cast<int>(j) : k;
    topk_insert(list, k, count, static_cast<double>(value(j)), static_cast<std::int32_t>(j));
  }
}

}  // namespace math
}  // namespace ssr
SSR_LANES_END
