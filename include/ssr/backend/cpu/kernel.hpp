// A tile's costs and Sinkhorn kernel on the CPU (math/cost.hpp, in lanes of doubles: a row a lane, half a
// tile at a time), and the scaled kernel Q = exp(K + h - c) of math/sinkhorn_scaled.hpp (in lanes of T).
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "ssr/backend/cpu/tiles.hpp"
#include "ssr/math/cost.hpp"
#include "ssr/math/exp.hpp"
#include "ssr/math/sinkhorn_scaled.hpp"
#include "ssr/spec.hpp"

SSR_LANES_BEGIN
namespace ssr {
namespace cpu {

// y = exp(x) by its lanes' formula (math::exp_as): the float one for floats, the double one for doubles.
template <class V, class Isa>
SSR_INLINE void exp_lanes(const V& x, V& y) {
  if constexpr (std::is_same<math::lane_t<V>, float>::value) {
    math::exp_float_of<V, MaskOf<V>>(x, y, typename Isa::Fma{}, typename Isa::Lookup{});
  } else {
    math::exp_of<V, MaskOf<V, std::uint64_t>>(x, y, typename Isa::Fma{});
  }
}

// y = half h of column j of a tile of T (rows h * half onwards), as doubles.
template <class T>
SSR_INLINE void column(const T* x, index_t j, index_t at, Half<double>& y) {
  Half<T> v;
  read(x + j * tile + at, v);
  convert(v, y);
}

// The costs of a tile's rows (math::cost_value of math::shifted_cost, the noise z added where not null):
// c[j * tile + q] for the logits x (a tile of T); by halves of the tile.
template <class T, class Isa>
SSR_INLINE void costs_tile(const RouteSpec& spec, const T* x, index_t n, const double* z, double* c) {
  using D = Half<double>;
  const auto exp = [](const D& v, D& y) SSR_INLINE_LAMBDA { exp_lanes<D, Isa>(v, y); };
  for (index_t at = 0; at < tile; at += half) {
    D top = D{} - std::numeric_limits<double>::infinity(), scale = D{} + 1.0, s, y;
    for (index_t j = 0; j < n; ++j) {
      column(x, j, at, s);
      math::raise_to<Isa::piece>(top, s);
    }
    if (spec.cost == Cost::softmax) {  // math::cost_shift's sum, in index order
      D sum{};
      for (index_t j = 0; j < n; ++j) {
        column(x, j, at, s);
        exp(s - top, y);
        sum = sum + y;
      }
      scale = 1.0 / sum;
    }
    for (index_t j = 0; j < n; ++j) {
      column(x, j, at, s);
      math::shifted_cost_of(spec.cost, s, top, scale, exp, y);
      D noise{};
      if (z) read(z + j * tile + at, noise);
      math::cost_value_of<T, Isa::piece>(y, z != nullptr, noise);
      write(c + j * tile + at, y);
    }
  }
}

// The kernel of a tile's rows from their costs c: K[j * tile + q] = math::kernel_value (math::kernel_shift
// of the row), in T; by halves of the tile.
template <class T, class Isa>
SSR_INLINE void kernel_tile(const double* c, index_t n, double inv_xi, T* k) {
  using D = Half<double>;
  for (index_t at = 0; at < tile; at += half) {
    D shift = D{} - math::cost_bound<T>(), x;
    for (index_t j = 0; j < n; ++j) {
      read(c + j * tile + at, x);
      math::raise_to<Isa::piece>(shift, x);
    }
    Half<T> out;
    for (index_t j = 0; j < n; ++j) {
      read(c + j * tile + at, x);
      math::kernel_value_of<T, Isa::piece>(x, shift, inv_xi);
      convert(x, out);
      write(k + j * tile + at, out);
    }
  }
}

// Q = exp(K + h - c) of a tile (K at k, h a column's), c_i = max_j (K_ij + h_j) into top; the rows past
// `rows` get Q = 0, so that they add nothing to the sums.
template <class T, class Isa>
SSR_INLINE void scaled_tile(const T* k, const T* h, index_t n, index_t rows, T* q, T* top) {
  using V = Lanes<T>;
  using I = MaskOf<V>;
  V c, x, e;
  math::row_shift_of<Isa::piece>(
      n, [&](index_t j, V& y) SSR_INLINE_LAMBDA { read(k + j * tile, y); },
      [&](index_t j, V& y) SSR_INLINE_LAMBDA { y = V{} + h[j]; }, c);
  I index, real;
  lane_index(index);
  math::less_of<Isa::piece>(index, I{} + static_cast<math::lane_t<I>>(rows), real);
  for (index_t j = 0; j < n; ++j) {
    read(k + j * tile, x);
    exp_lanes<V, Isa>((x + h[j]) - c, e);
    V kept{};
    math::select_into(real, e, kept);
    write(q + j * tile, kept);
  }
  write(top, c);
}

}  // namespace cpu
}  // namespace ssr
SSR_LANES_END
