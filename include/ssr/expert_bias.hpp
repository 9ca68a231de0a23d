// Auxiliary-loss-free balancing (DeepSeek-V3): after each step every expert's selection bias moves by a
// fixed rate toward balance, b_j += rate * sign(mean load - load_j), the loads summed over the ranks that
// share the experts (and over the micro-batches of the step, by the caller). The bias reaches routing
// through Context::expert_bias.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "ssr/call.hpp"
#include "ssr/communicator.hpp"
#include "ssr/detail/hd.hpp"
#include "ssr/error.hpp"
#include "ssr/validate.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace math {

// sign(mean load - load_j) of expert j among n whose loads sum to total, in exact integer arithmetic:
// +1 below the mean, -1 above, 0 at it.
SSR_HD inline int bias_direction(std::int64_t total, std::int64_t n, std::int64_t load_j) {
  const std::int64_t d = total - n * load_j;  // n * (mean - load_j)
  return (d > 0) - (d < 0);
}

}  // namespace math

// Moves host biases one step toward balance from this step's host loads (each expert's assignments, e.g.
// RouteOutputs::load, summed over micro-batches). With ranks, their loads are summed first, so every
// rank makes the same update; all ranks call it together, and agree on its checks first (ssr::agree).
template <class Count>
void update_expert_bias(VectorView<const Count> load, double rate, VectorView<float> bias,
                        const Communicator<HostStream>* ranks = nullptr) {
  const index_t n = load.size;
  const auto checks = [&] {
    detail::require(n >= 1, "load.size", n, "must be at least 1");
    detail::require_size(load, "load", n);
    detail::require_size(bias, "bias", n);
    detail::require(std::isfinite(rate) && rate >= 0, "rate", rate, "must be finite and >= 0");
    for (index_t j = 0; j < n; ++j) detail::require(load[j] >= 0, detail::Indexed{"load", j}, load[j], "must be >= 0");
  };
  if (ranks) {
    agree(*ranks, HostStream{}, 0, checks, {static_cast<std::uint64_t>(n), "numbers of experts"});
  } else {
    checks();
  }
  std::vector<std::int64_t> counts(static_cast<std::size_t>(n));  // once the ranks agree on n
  for (index_t j = 0; j < n; ++j) counts[static_cast<std::size_t>(j)] = static_cast<std::int64_t>(load[j]);
  if (ranks) ranks->sum_on_host(counts.data(), counts.size(), HostStream{});
  std::int64_t total = 0;
  for (const std::int64_t c : counts) total += c;
  for (index_t j = 0; j < n; ++j)
    bias[j] = static_cast<float>(static_cast<double>(bias[j]) +
                                 rate * math::bias_direction(total, n, counts[static_cast<std::size_t>(j)]));
}

}  // namespace ssr
