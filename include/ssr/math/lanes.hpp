// What the mathematics needs of a value type to be written once for a scalar and for a vector of lanes
// (as xsimd writes its mathematics once over a batch): its operators (arithmetic, comparisons, and ?: lane
// by lane: scalars, on the host and the device, and GCC's and Clang's vectors, the CPU backend's lanes), a
// fused multiply-add functor, and the few helpers below. A formula takes and gives vectors through
// references, never by value (see raise_to).
#pragma once

#include <cmath>
#include <type_traits>
#include <utility>

#include "ssr/detail/hd.hpp"

SSR_LANES_BEGIN
namespace ssr {
namespace math {

// The type of one lane of V: V itself for a scalar.
template <class V, bool = std::is_arithmetic<V>::value>
struct LaneOf {
  using type = V;
};
template <class V>
struct LaneOf<V, false> {
  using type = std::decay_t<decltype(std::declval<V&>()[0])>;
};
template <class V>
using lane_t = typename LaneOf<V>::type;

// The default width of the pieces below: 16 bytes, a register on every vector target (SSE2, NEON).
constexpr int piece_bytes = 16;

#if !defined(__CUDACC__)  // nvcc's front end drops a vector size that depends on a template argument
template <class L, int Bytes>
struct PieceOf {
  typedef L type __attribute__((vector_size(Bytes)));  // NOLINT(modernize-use-using): an attribute
};
template <class V>
using HalfOf = typename PieceOf<lane_t<V>, static_cast<int>(sizeof(V)) / 2>::type;

// lo, hi = the halves of v, and v = lo joined to hi, in registers (shuffles, no memory).
template <class V, int... I>
SSR_INLINE void split_halves(const V& v, HalfOf<V>& lo, HalfOf<V>& hi, std::integer_sequence<int, I...> /*half*/) {
  lo = __builtin_shufflevector(v, v, I...);
  hi = __builtin_shufflevector(v, v, (I + static_cast<int>(sizeof...(I)))...);
}
template <class V, int... I>
SSR_INLINE void join_halves(const HalfOf<V>& lo, const HalfOf<V>& hi, V& v, std::integer_sequence<int, I...> /*half*/) {
  v = __builtin_shufflevector(lo, hi, I..., (I + static_cast<int>(sizeof...(I)))...);
}
#endif

// f(out, a, b) for scalars; for GNU vectors wider than Piece bytes (a register of the target), on their
// halves in turn until they fit. GCC 12 compiles a comparison or a ?: of vectors wider than the target's
// registers one lane at a time in scalar code (their arithmetic it splits into registers), so the formulas
// compare and select through this. A, B and Out have as many lanes (values, or their comparisons' masks).
template <int Piece, class Out, class A, class B, class F>
SSR_HD SSR_INLINE void by_pieces(Out& out, const A& a, const B& b, const F& f) {
#if !defined(__CUDACC__)
  if constexpr (!std::is_arithmetic<A>::value && (sizeof(A) > Piece)) {
    using Half = std::make_integer_sequence<int, static_cast<int>(sizeof(A) / sizeof(lane_t<A>)) / 2>;
    HalfOf<A> a0, a1;
    HalfOf<B> b0, b1;
    HalfOf<Out> o0, o1;
    split_halves(a, a0, a1, Half{});
    split_halves(b, b0, b1, Half{});
    by_pieces<Piece>(o0, a0, b0, f);
    by_pieces<Piece>(o1, a1, b1, f);
    join_halves(o0, o1, out, Half{});
    return;
  }
#endif
  f(out, a, b);
}

// m = a < b, lane by lane (a scalar's bool, or a vector's integer mask).
template <int Piece = piece_bytes, class V, class M>
SSR_HD SSR_INLINE void less_of(const V& a, const V& b, M& m) {
  by_pieces<Piece>(m, a, b, [](auto& o, const auto& x, const auto& y) SSR_INLINE_LAMBDA { o = x < y; });
}

// out = m ? a : out, lane by lane, for a mask m of a's width (all bits set in a true lane, none in a false
// one); for vectors by pieces, as a blend of registers.
template <int Piece = piece_bytes, class V, class M>
SSR_HD SSR_INLINE void select_into(const M& m, const V& a, V& out) {
#if !defined(__CUDACC__)
  if constexpr (!std::is_arithmetic<V>::value && (sizeof(V) > Piece)) {
    using Half = std::make_integer_sequence<int, static_cast<int>(sizeof(V) / sizeof(lane_t<V>)) / 2>;
    HalfOf<M> m0, m1;
    HalfOf<V> a0, a1, o0, o1;
    split_halves(m, m0, m1, Half{});
    split_halves(a, a0, a1, Half{});
    split_halves(out, o0, o1, Half{});
    select_into<Piece>(m0, a0, o0);
    select_into<Piece>(m1, a1, o1);
    join_halves(o0, o1, out, Half{});
    return;
  }
#endif
  out = m ? a : out;
}

// v = std::max(v, lo), lane by lane (a NaN v stays NaN). In place: a vector returned by value from a function
// compiled without its registers draws GCC's ABI warning (-Wpsabi), so no function here returns one.
template <int Piece = piece_bytes, class V>
SSR_HD SSR_INLINE void raise_to(V& v, const V& lo) {
  by_pieces<Piece>(v, v, lo, [](auto& o, const auto& x, const auto& y) SSR_INLINE_LAMBDA { o = x < y ? y : x; });
}

// v = std::min(v, hi), lane by lane (a NaN v stays NaN).
template <int Piece = piece_bytes, class V>
SSR_HD SSR_INLINE void lower_to(V& v, const V& hi) {
  by_pieces<Piece>(v, v, hi, [](auto& o, const auto& x, const auto& y) SSR_INLINE_LAMBDA { o = y < x ? y : x; });
}

// v = lo where v is NaN, lane by lane.
template <int Piece = piece_bytes, class V>
SSR_HD SSR_INLINE void nan_to(V& v, const V& lo) {
  by_pieces<Piece>(v, v, lo, [](auto& o, const auto& x, const auto& y) SSR_INLINE_LAMBDA {
    o = x == x ? x : y;  // NOLINT(misc-redundant-expression): false for a NaN
  });
}

// v = std::min(std::max(v, lo), hi), lane by lane.
template <int Piece = piece_bytes, class V>
SSR_HD SSR_INLINE void clamp_in(V& v, const V& lo, const V& hi) {
  raise_to<Piece>(v, lo);
  lower_to<Piece>(v, hi);
}

// y = a * b + c rounded once, for scalars: std::fma, exact on every host and device.
struct Fused {
  static constexpr int piece = piece_bytes;
  SSR_HD void operator()(double& y, double a, double b, double c) const { y = std::fma(a, b, c); }
  SSR_HD void operator()(float& y, float a, float b, float c) const { y = std::fma(a, b, c); }
};

}  // namespace math
}  // namespace ssr
SSR_LANES_END
