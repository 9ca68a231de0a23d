// The Thrust backend's scans: per-expert load counted per block of rows then added in block order, and the
// first invalid input of a call (a non-finite logit; an assignment backward cannot use).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "ssr/backend/thrust/tuning.hpp"
#include "ssr/detail/hd.hpp"
#include "ssr/detail/scalar.hpp"
#include "ssr/math/backward.hpp"
#include "ssr/math/numeric.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace thrust_kernels {

// Block b's count of assignments per expert, into counts[b * n, (b + 1) * n).
struct BlockLoad {
  MatrixView<const std::int32_t> experts{};
  std::int32_t* counts = nullptr;
  index_t n = 0;

  SSR_HD void operator()(index_t b) const {
    std::int32_t* c = counts + b * n;
    for (index_t j = 0; j < n; ++j) c[j] = 0;
    const index_t end = std::min(experts.rows, (b + 1) * ThrustTuning::block_rows);
    for (index_t i = b * ThrustTuning::block_rows; i < end; ++i)
      for (index_t r = 0; r < experts.cols; ++r) ++c[experts(i, r)];
  }
};

// Expert j's load: its blocks' counts added.
struct LoadSum {
  const std::int32_t* counts = nullptr;
  std::int32_t* load = nullptr;
  index_t n = 0, blocks = 0;

  SSR_HD void operator()(index_t j) const {
    std::int32_t sum = 0;
    for (index_t b = 0; b < blocks; ++b) sum += counts[b * n + j];
    load[j] = sum;
  }
};

// The row-major index of row i's first non-finite logit (max index if none).
template <class In>
struct FirstNonFinite {
  ConstMatrixView<In> s{};
  SSR_HD index_t operator()(index_t i) const {
    for (index_t j = 0; j < s.cols; ++j)
      if (!math::is_finite(detail::to_double(s(i, j)))) return i * s.cols + j;
    return std::numeric_limits<index_t>::max();
  }
};

// Assignment a's index when backward cannot use it (math::valid_assignment), max index otherwise.
template <class T>
struct FirstBadAssignment {
  MatrixView<const std::int32_t> experts{};
  MatrixView<const T> weights{}, grad_weights{};
  index_t n = 0;
  SSR_HD index_t operator()(index_t a) const {
    const index_t i = a / experts.cols, r = a % experts.cols;
    return math::valid_assignment(experts(i, r), n, weights(i, r), grad_weights(i, r))
               ? std::numeric_limits<index_t>::max()
               : a;
  }
};

struct Min {
  SSR_HD index_t operator()(index_t a, index_t b) const { return a < b ? a : b; }
};

}  // namespace thrust_kernels
}  // namespace ssr
