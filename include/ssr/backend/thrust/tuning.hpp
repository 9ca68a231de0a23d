// The Thrust backend's tuning constants.
#pragma once

#include "ssr/view.hpp"

namespace ssr {

struct ThrustTuning {
  // Rows per block of the load counts (a function of the shape only, so results do not depend on how the
  // device system schedules the blocks; the Sinkhorn column sums are blocked by math::sum_block_rows).
  static constexpr index_t block_rows = 256;

  static constexpr index_t blocks(index_t m) { return (m + block_rows - 1) / block_rows; }
};

}  // namespace ssr
