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

#include <algorithm>
#include <utility>

#include "ssr/view.hpp"

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

inline int team_size() {
#ifdef _OPENMP
  return omp_get_num_threads();
#else
  return 1;
#endif
}

// The calling thread's share [begin, end) of [0, count), as schedule(static) splits it: contiguous ranges,
// the first count % team_size() threads one longer. For loops that walk their share in either direction.
inline std::pair<index_t, index_t> own_range(index_t count) {
  const index_t threads = team_size(), tid = thread_id();
  const index_t base = count / threads, extra = count % threads;
  const index_t begin = tid * base + std::min(tid, extra);
  return {begin, begin + base + (tid < extra ? 1 : 0)};
}

// Runs body() on a team of `threads` threads, or on the calling thread alone when threads is 1: OpenMP
// runtimes allocate a team for every one-thread region, and a warmed-up call allocates nothing. The body
// shares its work with orphaned worksharing directives (SSR_OMP(for ...), SSR_OMP(single)).
template <class Body>
void parallel(int threads, const Body& body) {
#ifdef _OPENMP
  if (threads > 1) {
    SSR_OMP(parallel num_threads(threads))
    body();
    return;
  }
#endif
  (void)threads;
  body();
}

// f(i) for i in [0, count), split statically over `threads` threads.
template <class F>
void parallel_for(int threads, index_t count, const F& f) {
  parallel(threads, [&] {
    SSR_OMP(for schedule(static))
    for (index_t i = 0; i < count; ++i) f(i);
  });
}

}  // namespace detail
}  // namespace ssr
