// Matrix types of the example (row-major, as ssr's views want), named parameter tensors, and the
// parallel loop over experts.
#pragma once

#include <Eigen/Core>

#include <cstdint>
#include <string>
#include <vector>

#include "rng.hpp"

// Experts run side by side when `condition` holds (enough work to pay for the threads); each expert's
// products run on one thread, so results do not depend on how many threads there are.
#if defined(_OPENMP)
#define SMOE_PRAGMA(x) _Pragma(#x)
#define SMOE_PARALLEL_FOR_EXPERTS(condition) SMOE_PRAGMA(omp parallel for schedule(dynamic) if(condition))
#else
#define SMOE_PARALLEL_FOR_EXPERTS(condition)
#endif

namespace smoe {

using Index = Eigen::Index;

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using IndexMat = Eigen::Matrix<std::int32_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// A trainable tensor and its gradient, as the optimiser and the gradient checks see them.
template <class T>
struct Tensor {
  std::string name;
  Mat<T>* value;
  Mat<T>* grad;
};

template <class T>
Mat<T> random_normal(Index rows, Index cols, double stddev, Rng& rng) {
  Mat<T> a(rows, cols);
  for (Index i = 0; i < a.size(); ++i) a.data()[i] = static_cast<T>(stddev * rng.normal());
  return a;
}

}  // namespace smoe
