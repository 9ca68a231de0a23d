// Summary statistics of a per-expert load vector: how far routing is from balanced.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ssr/error.hpp"
#include "ssr/view.hpp"

namespace ssr {

struct LoadStats {
  std::int64_t total = 0;         // assignments counted
  double max_over_mean = 0;       // 1 when balanced; n when one expert takes everything (0 when total = 0)
  double cv = 0;                  // coefficient of variation: population std / mean (0 when total = 0)
  double entropy = 0;             // of the load distribution, in nats
  double normalized_entropy = 0;  // entropy / log n: 1 when balanced (1 when n = 1)
  index_t empty_experts = 0;      // experts that received nothing
};

inline LoadStats load_stats(VectorView<const std::int32_t> load) {
  detail::require(load.size >= 1, "load.size", load.size, "must be at least 1");
  LoadStats st;
  std::int64_t top = 0;
  for (index_t j = 0; j < load.size; ++j) {
    detail::require(load[j] >= 0, detail::Indexed{"load", j}, load[j], "must be >= 0");
    st.total += load[j];
    top = std::max<std::int64_t>(top, load[j]);
    st.empty_experts += load[j] == 0;
  }
  const auto n = static_cast<double>(load.size);
  st.normalized_entropy = load.size == 1 ? 1.0 : 0.0;
  if (st.total == 0) return st;
  const double mean = static_cast<double>(st.total) / n;
  double var = 0;
  for (index_t j = 0; j < load.size; ++j) {
    const double d = load[j] - mean;
    var += d * d;
    const double q = load[j] / static_cast<double>(st.total);
    if (q > 0) st.entropy -= q * std::log(q);
  }
  st.max_over_mean = static_cast<double>(top) / mean;
  st.cv = std::sqrt(var / n) / mean;
  if (load.size > 1) st.normalized_entropy = st.entropy / std::log(n);
  return st;
}

}  // namespace ssr
