// OpenMP when the build has it, plain serial code otherwise: the pragmas vanish and results stay the same,
// because work is split into blocks whose boundaries never depend on the thread count.
#pragma once

#ifdef _OPENMP
#include <omp.h>
#define SSR_OMP(directive) _Pragma(SSR_OMP_STRINGIFY(omp directive))
#define SSR_OMP_STRINGIFY(x) #x
#else
#define SSR_OMP(directive)
#endif

namespace ssr {
namespace detail {

inline int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

inline int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

}  // namespace detail
}  // namespace ssr
