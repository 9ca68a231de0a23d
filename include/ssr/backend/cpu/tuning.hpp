// The CPU backend's tuning constants, in one place: the tile of rows its vectors hold, and when a call is
// worth a team of threads. Neither changes a bit of the results.
#pragma once

#include "ssr/math/sinkhorn_scaled.hpp"
#include "ssr/view.hpp"

SSR_LANES_BEGIN
namespace ssr {

struct CpuTuning {
  // Rows a tile: a tile's column is one vector, a row a lane. It is the lanes a column's block sum
  // interleaves its rows over (math::sum_lanes), so a Sinkhorn pass adds a tile's column in one step.
  static constexpr index_t tile = math::sum_lanes;
  // Calls over fewer elements run on one thread: a team costs more than it saves below about 50 us of
  // work, and where its threads sleep while they wait (OMP_WAIT_POLICY=PASSIVE) each region or barrier
  // costs tens of microseconds to wake them. Softmax top-k and the backward: ~1 ns an element. A Sinkhorn
  // solve: ~0.3 ns an element a pass, and two barriers an iteration. The finiteness check: ~0.05 ns.
  static constexpr index_t parallel_min_elements = 65536;
  static constexpr index_t sinkhorn_parallel_min_elements = 131072;
  static constexpr index_t check_parallel_min_elements = index_t{1} << 20;

  static constexpr index_t tiles(index_t m) { return (m + tile - 1) / tile; }
};

}  // namespace ssr
SSR_LANES_END
