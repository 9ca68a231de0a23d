// The CPU backend's one SIMD layer: a tile's column (CpuTuning::tile rows, one value a row) is one vector,
// Lanes<T>: eight floats or eight doubles, as GCC's and Clang's vector extensions, which the compiler maps
// onto the target's registers (one AVX2 register of floats, two of doubles; SSE2's two and four). The
// mathematics of math/ runs on these lanes as on scalars; the instructions that the vector extensions do
// not express (a fused multiply-add, a square root, a 32-bit product, a table lookup) come with the
// instruction set (isa.hpp). Vectors go through references: none is returned by value (math/lanes.hpp).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ssr/backend/cpu/tuning.hpp"
#include "ssr/detail/hd.hpp"
#include "ssr/math/lanes.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#if !defined(__GNUC__)
#error "ssr's CPU backend is written over GCC's and Clang's vector extensions: build it with GCC or Clang"
#endif

SSR_LANES_BEGIN
namespace ssr {
namespace cpu {

constexpr int lanes = static_cast<int>(CpuTuning::tile);
static_assert(lanes == 8, "the lane types below hold eight values");

// Half a tile's rows, four values: the CPU's work in double (costs, kernel, weights, noise) goes by halves
// of tiles, so that a vector of doubles is an AVX2 register (eight doubles would live in memory).
constexpr int half = lanes / 2;

// Count values of T as one vector (written out a type at a time: nvcc's front end drops a vector size
// that depends on a template argument).
template <class T, int Count>
struct VectorOf;
#define SSR_CPU_VECTORS(T)                                                                     \
  template <>                                                                                  \
  struct VectorOf<T, lanes> {                                                                  \
    typedef T type __attribute__((vector_size(lanes * sizeof(T)))); /* NOLINT: an attribute */ \
  };                                                                                           \
  template <>                                                                                  \
  struct VectorOf<T, half> {                                                                   \
    typedef T type __attribute__((vector_size(half * sizeof(T)))); /* NOLINT: an attribute */  \
  };
SSR_CPU_VECTORS(float)
SSR_CPU_VECTORS(double)
SSR_CPU_VECTORS(std::int32_t)
SSR_CPU_VECTORS(std::int64_t)
SSR_CPU_VECTORS(std::uint64_t)
#undef SSR_CPU_VECTORS
template <class T>
using Lanes = typename VectorOf<T, lanes>::type;
template <class T>
using Half = typename VectorOf<T, half>::type;

// The lanes of a vector type, and the integer vector of its comparisons' masks.
template <class V>
constexpr int count_of = static_cast<int>(sizeof(V) / sizeof(math::lane_t<V>));
template <class V, class I = std::conditional_t<sizeof(math::lane_t<V>) == 4, std::int32_t, std::int64_t>>
using MaskOf = std::conditional_t<count_of<V> == lanes, Lanes<I>, Half<I>>;

// v = the values at p, and the values at p = v (as many as v has lanes; any alignment).
template <class T, class V>
SSR_INLINE void read(const T* p, V& v) {
  static_assert(std::is_same<math::lane_t<V>, T>::value, "a vector of T");
  std::memcpy(&v, p, sizeof v);
}
template <class T, class V>
SSR_INLINE void write(T* p, const V& v) {
  static_assert(std::is_same<math::lane_t<V>, T>::value, "a vector of T");
  std::memcpy(p, &v, sizeof v);
}

// y = each lane of v converted as static_cast converts a value.
template <class V, class W>
SSR_INLINE void convert(const V& v, W& y) {
  y = __builtin_convertvector(v, W);
}

// y = the values at p (as many as y has lanes: a tile's or half a tile's), as doubles.
template <class L, class D>
SSR_INLINE void doubles_at(const L* p, D& y) {
  std::conditional_t<count_of<D> == lanes, Lanes<L>, Half<L>> v;
  read(p, v);
  convert(v, y);
}

// v = 0, 1, 2, ...: the rows of a tile (or a half), for masks of its real rows.
template <class V>
SSR_INLINE void lane_index(V& v) {
  for (int l = 0; l < count_of<V>; ++l) v[l] = static_cast<math::lane_t<V>>(l);
}

// Whether any lane of a comparison's result holds (every bit set in a true lane, none in a false one).
template <class M>
SSR_INLINE bool any(const M& m) {
#if !defined(__CUDACC__)
  if constexpr (sizeof(M) > 16) {  // OR the halves together in registers, down to 16 bytes
    using H = math::HalfOf<M>;
    H lo, hi;
    math::split_halves(m, lo, hi, std::make_integer_sequence<int, count_of<M> / 2>{});
    return any(H(lo | hi));
  }
#endif
  std::uint64_t words[sizeof(M) / 8];
  std::memcpy(words, &m, sizeof words);
  std::uint64_t all = 0;
  for (const std::uint64_t w : words) all |= w;
  return all != 0;
}

// Transposes 8 x 8 values in place, row r in v[r] becoming column r: the vectors of eight rows' eight
// columns become eight columns' vectors of the rows, in three rounds of exchanges between vectors.
template <class V>
SSR_INLINE void transpose(V (&v)[lanes]) {
  V t[lanes];
  for (int p = 0; p < 4; ++p) {
    t[2 * p] = __builtin_shufflevector(v[2 * p], v[2 * p + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[2 * p + 1] = __builtin_shufflevector(v[2 * p], v[2 * p + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int p = 0; p < 2; ++p) {
    for (int o = 0; o < 2; ++o) {
      const V &a = t[4 * p + o], &b = t[4 * p + o + 2];
      v[4 * p + 2 * o] = __builtin_shufflevector(a, b, 0, 1, 8, 9, 4, 5, 12, 13);
      v[4 * p + 2 * o + 1] = __builtin_shufflevector(a, b, 2, 3, 10, 11, 6, 7, 14, 15);
    }
  }
  for (int l = 0; l < 4; ++l) {
    t[l] = __builtin_shufflevector(v[l], v[l + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    t[l + 4] = __builtin_shufflevector(v[l], v[l + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
  for (int l = 0; l < lanes; ++l) v[l] = t[l];
}

// While it lives, the calling thread's x86 floating-point unit flushes subnormal results to zero and reads
// subnormal inputs as zero (MXCSR's FTZ and DAZ); the caller's setting comes back after. An operation on a
// subnormal takes a microcode assist of about a hundred cycles: a Sinkhorn pass at small xi, whose small
// Q_ij v_j are subnormal, took three times as long. A flushed value is below half an ulp of any row sum and
// of any column sum the solver keeps (a smaller one takes the log-domain update). Elsewhere it does nothing.
class FlushSubnormals {
 public:
#if defined(__SSE2__)
  FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
  ~FlushSubnormals() { _mm_setcsr(saved_ | (_mm_getcsr() & 0x3fu)); }  // keep the exceptions raised meanwhile
#else
  FlushSubnormals() = default;
  ~FlushSubnormals() = default;
#endif
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;
  FlushSubnormals(FlushSubnormals&&) = delete;
  FlushSubnormals& operator=(FlushSubnormals&&) = delete;

#if defined(__SSE2__)
 private:
  unsigned saved_;
#endif
};

}  // namespace cpu
}  // namespace ssr
SSR_LANES_END
