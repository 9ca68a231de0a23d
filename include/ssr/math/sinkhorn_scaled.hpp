// The Sinkhorn sweep as every backend runs it: stabilised scaling with absorption into log-domain
// potentials (math/sinkhorn.hpp), in T, with every sum in one order, so that the CPU's tiles of eight rows
// and the Thrust backend's rows give the same bits.
//
// The solver keeps Q_ij = exp(K_ij + h_j - c_i) for an absorbed copy h of g and c_i = max_j (K_ij + h_j),
// and the scaling v_j = exp(g_j - h_j), so an iteration needs no exp: for each row, r_i = sum_j Q_ij v_j,
// the row's plan is Q_ij v_j / r_i (row sum 1, f_i = -(c_i + log r_i)), and those plan rows go straight
// into the column sums, which give both the error and the next g. Q <= 1 with a 1 in every row, and v stays
// within exp(+-absorb_bound): when some |g_j - h_j| grows past it, h absorbs g and Q is recomputed (one
// exp pass), so r never overflows or underflows.
//
// The order of the sums: r_i adds Q_ij v_j (fused) in four sums, of the columns j = 0, 1, 2, 3 (mod 4), then
// (0 + 2) + (1 + 3). A column's sum over the rows of a block (sum_block_rows(n) rows, from row 0) interleaves
// its rows over sum_lanes lanes: lane l adds Q_ij (1 / r_i) (fused) over the block's rows i = l (mod 8) in
// order; the lanes fold in halves (fold_lanes), and the fold times v_j is the block's share in T. The
// column's plan sum adds its blocks' shares in double, in block order. Rows past the last add nothing.
#pragma once

#include <cmath>
#include <limits>

#include "ssr/detail/hd.hpp"
#include "ssr/math/exp.hpp"
#include "ssr/math/lanes.hpp"
#include "ssr/math/log.hpp"
#include "ssr/view.hpp"

SSR_LANES_BEGIN
namespace ssr {
namespace math {

// The lanes a column's block sum interleaves its rows over.
constexpr index_t sum_lanes = 8;

// Rows a block of the column sums: about 4096 elements (n rounded up to 8), a whole number of lanes.
SSR_HD constexpr index_t sum_block_rows(index_t n) {
  const index_t rows = 4096 / ((n + 7) / 8 * 8) / sum_lanes * sum_lanes;
  return rows > sum_lanes ? rows : sum_lanes;
}
SSR_HD constexpr index_t sum_blocks(index_t m, index_t n) { return (m + sum_block_rows(n) - 1) / sum_block_rows(n); }

// v_j = exp(g_j - h_j), for g and h in T (math::exp, rounded to T).
template <class T>
SSR_HD T scaling(T g, T h) {
  return static_cast<T>(math::exp(static_cast<double>(g) - static_cast<double>(h)));
}

// h absorbs g once some |g_j - h_j| exceeds this, in T: v then stays within exp(+-bound), and Q's row
// sums, which hold a 1, far from T's underflow and overflow.
template <class T>
SSR_HD constexpr double absorb_bound() {
  return sizeof(T) <= sizeof(float) ? 30.0 : 300.0;
}

// Whether h must absorb g, for column potentials g and h both held in T.
template <class T>
SSR_HD bool absorbs(T g, T h) {
  return std::fabs(static_cast<double>(g) - static_cast<double>(h)) > absorb_bound<T>();
}

// c_i = max_j (K_ij + h_j) in T, over j in order (std::max's), for V a T or a vector of T (rows in lanes):
// k(j, x) and h(j, x) set x to K's column j and to h_j.
template <int Piece = piece_bytes, class V, class K, class H>
SSR_HD SSR_INLINE void row_shift_of(index_t n, const K& k, const H& h, V& c) {
  c = V{} - static_cast<lane_t<V>>(std::numeric_limits<double>::infinity());
  for (index_t j = 0; j < n; ++j) {
    V x, y;
    k(j, x);
    h(j, y);
    raise_to<Piece>(c, V(x + y));
  }
}

// r_i = sum_j Q_ij v_j in the order above: q(j, x) and v(j, x) set x to Q's column j and to v_j; fma as
// exp_of takes it.
template <class V, class Q, class Vs, class Fma>
SSR_HD SSR_INLINE void row_sum_of(index_t n, const Q& q, const Vs& v, const Fma& fma, V& r) {
  V acc[4] = {V{}, V{}, V{}, V{}}, x, y;
  const auto add = [&](index_t j, V& sum) SSR_INLINE_LAMBDA {
    q(j, x);
    v(j, y);
    fma(sum, x, y, sum);
  };
  index_t j = 0;
  for (; j + 4 <= n; j += 4)  // each sum by name, so that a vector's stay in registers
    for (index_t a = 0; a < 4; ++a) add(j + a, acc[a]);
  if (j < n) add(j, acc[0]);
  if (j + 1 < n) add(j + 1, acc[1]);
  if (j + 2 < n) add(j + 2, acc[2]);
  r = (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

// inv = 1 / r_i, r_i held at least T's least normal number (a row past the last has r = 0 and adds nothing).
template <class T, int Piece = piece_bytes, class V>
SSR_HD SSR_INLINE void inverse_row_sum_of(const V& r, V& inv) {
  V held = r;
  raise_to<Piece>(held, V{} + std::numeric_limits<T>::min());
  inv = (V{} + T(1)) / held;
}

template <class T>
SSR_HD T inverse_row_sum(T r) {
  T inv;
  inverse_row_sum_of<T>(r, inv);
  return inv;
}

// out = a column's lanes folded in halves: lane l + lane l + 4, then + 2, then + 1; for T a vector, each
// lane's column (the lanes of eight columns transposed) at once.
template <class T>
SSR_HD SSR_INLINE void fold_lanes_of(const T (&lane)[sum_lanes], T& out) {
  T a[sum_lanes];
  for (index_t l = 0; l < sum_lanes; ++l) a[l] = lane[l];
  for (index_t half = sum_lanes / 2; half >= 1; half /= 2)
    for (index_t l = 0; l < half; ++l) a[l] = a[l] + a[l + half];
  out = a[0];
}
template <class T>
SSR_HD SSR_INLINE T fold_lanes(const T (&lane)[sum_lanes]) {
  T out;
  fold_lanes_of(lane, out);
  return out;
}

// f_i = -(c_i + log r_i), the row potential of the scaled form's row (the log-domain column update reads it).
template <class T>
SSR_HD double row_potential(T c, T r) {
  return -(static_cast<double>(c) + math::log(static_cast<double>(r)));
}

}  // namespace math
}  // namespace ssr
SSR_LANES_END
