// The CPU backend's tuning constants, in one place: the vector width rows are padded to, the blocking of
// the column sums (a function of the shape only, so results do not depend on the thread count), and when
// a call is worth a team of threads.
#pragma once

#include <algorithm>

#include "ssr/view.hpp"

namespace ssr {

// Tuning constants of the CPU backend.
struct CpuTuning {
  // Rows are padded to a multiple of this many elements (one AVX register of floats, one cache line of
  // doubles), so vector operations run on whole packets, independent of where the caller's data lies.
  // A wider pad would double the work of the common n = 8.
  static constexpr index_t pad = 8;
  // A block of rows, whose column sums are added in block order, holds about this many padded elements.
  static constexpr index_t block_elements = 4096;
  static constexpr index_t min_rows = 8;
  // Calls over fewer elements run on one thread: a team costs more than it saves below about 50 us of
  // work, and where its threads sleep while they wait (OMP_WAIT_POLICY=PASSIVE) each region or barrier
  // costs tens of microseconds to wake them (a 4096 x 16 solve took 2x longer on two threads than on one
  // that way). Softmax top-k and the backward: ~1 ns an element. A Sinkhorn solve: ~0.3 ns an element a
  // pass, and two barriers an iteration. The finiteness check: ~0.05 ns an element.
  static constexpr index_t parallel_min_elements = 65536;
  static constexpr index_t sinkhorn_parallel_min_elements = 131072;
  static constexpr index_t check_parallel_min_elements = index_t{1} << 20;
  // The Sinkhorn passes walk a thread's blocks forward and backward in turn where its share of Q is at most
  // this many bytes (a few times a core's L2), so that a pass starts on what the last one read last, still
  // in the caches: 1.2x faster an iteration at 24576 x 16 floats on a core with a 1 MiB L2. Beyond, from
  // memory, walking backward loses the hardware prefetchers (0.9x at 10^6 x 16), and each pass walks forward.
  static constexpr index_t alternate_max_bytes = index_t{4} << 20;

  static constexpr index_t padded(index_t n) { return (n + pad - 1) / pad * pad; }
  // Whole tiles of min_rows rows (the CPU Sinkhorn keeps its matrices in tiles of 8 rows).
  static constexpr index_t rows_per_block(index_t n) {
    return std::max(min_rows, block_elements / padded(n) / min_rows * min_rows);
  }
  static constexpr index_t blocks(index_t m, index_t n) { return (m + rows_per_block(n) - 1) / rows_per_block(n); }
};

}  // namespace ssr
