// A tile's costs and Sinkhorn kernel on the CPU (math/cost.hpp, in lanes of doubles: a row a lane, half a
// tile a vector), and the scaled kernel Q = exp(K + h - c) of math/sinkhorn_scaled.hpp (in lanes of T).
#pragma once

#include <cstdint>
#include <cstring>
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

// y = half a column j of a tile of T (rows at, at + 1, ...), as doubles.
template <class T>
SSR_INLINE void column(const T* x, index_t j, index_t at, Half<double>& y) {
  doubles_at(x + j * tile + at, y);
}

// The costs of a tile's rows (math::cost_value of math::shifted_cost, the noise z added where not null):
// c[j * tile + q] for the logits x (a tile of T), and each half's kernel shift (math::kernel_shift). A row a
// lane of doubles, so half a tile a vector; column by column, both halves at once.
template <class T, class Isa>
SSR_INLINE void costs_tile(const RouteSpec& spec, const T* x, index_t n, const double* z, double* c,
                           Half<double> (&shift)[2]) {
  using D = Half<double>;
  const auto exp = [](const D& v, D& y) SSR_INLINE_LAMBDA { exp_lanes<D, Isa>(v, y); };
  D top[2], scale[2], s, y;
  for (index_t h = 0; h < 2; ++h) {
    top[h] = D{} - std::numeric_limits<double>::infinity();
    scale[h] = D{} + 1.0;
    shift[h] = D{} - math::cost_bound<T>();
  }
  for (index_t j = 0; j < n; ++j)
    for (index_t h = 0; h < 2; ++h) {
      column(x, j, h * half, s);
      math::raise_to<Isa::piece>(top[h], s);
    }
  if (spec.cost == Cost::softmax) {  // math::cost_shift's sum, in index order
    D sum[2] = {};
    for (index_t j = 0; j < n; ++j)
      for (index_t h = 0; h < 2; ++h) {
        column(x, j, h * half, s);
        exp(s - top[h], y);
        sum[h] = sum[h] + y;
      }
    for (index_t h = 0; h < 2; ++h) scale[h] = 1.0 / sum[h];
  }
  for (index_t j = 0; j < n; ++j)
    for (index_t h = 0; h < 2; ++h) {
      column(x, j, h * half, s);
      math::shifted_cost_of(spec.cost, s, top[h], scale[h], exp, y);
      D noise{};
      if (z) read(z + j * tile + h * half, noise);
      math::cost_value_of<T, Isa::piece>(y, z != nullptr, noise);
      write(c + j * tile + h * half, y);
      math::raise_to<Isa::piece>(shift[h], y);
    }
}

// K_j (a tile's column j, in T) from f(h, x), setting x to the kernel of the half h's rows in place of
// their values, and c_i = max_j (K_ij + h_j) (math::row_shift_of's, lane by lane) into top.
template <class T, class Isa, class Kernel>
SSR_INLINE void kernel_columns(index_t n, const T* h, const Kernel& f, T* k, Lanes<T>& top) {
  using V = Lanes<T>;
  Half<double> x;
  Half<T> part[2];
  V kernel;
  top = V{} - std::numeric_limits<T>::infinity();
  for (index_t j = 0; j < n; ++j) {
    for (index_t half_at = 0; half_at < 2; ++half_at) {
      f(j, half_at, x);
      convert(x, part[half_at]);
    }
#if defined(__CUDACC__)  // nvcc's front end has no math::join_halves
    std::memcpy(&kernel, part, sizeof kernel);
#else
    math::join_halves(part[0], part[1], kernel, std::make_integer_sequence<int, half>{});
#endif
    write(k + j * tile, kernel);
    math::raise_to<Isa::piece>(top, V(kernel + h[j]));
  }
}

// The kernel K[j * tile + q] = math::kernel_value of a tile's rows (logits x, noise z or null), in T, and
// c_i = max_j (K_ij + h_j) into top: straight from the logits where every row's kernel is direct
// (math::direct_kernel), else from their costs (scratch c) and shifts.
template <class T, class Isa>
SSR_INLINE void kernel_tile(const RouteSpec& spec, const T* x, index_t n, const double* z, double inv_xi, const T* h,
                            double* c, T* k, Lanes<T>& top) {
  using V = Lanes<T>;
  using D = Half<double>;
  V most = V{} - std::numeric_limits<T>::infinity(), least = V{} + std::numeric_limits<T>::infinity(), v;
  for (index_t j = 0; j < n; ++j) {  // in T: the largest converts to the same double
    read(x + j * tile, v);
    math::raise_to<Isa::piece>(most, v);
    math::lower_to<Isa::piece>(least, v);
  }
  bool direct = true;
  for (index_t q = 0; q < tile && direct; ++q)
    direct = math::direct_kernel<T>(spec.cost, z != nullptr, static_cast<double>(most[q]),
                                    static_cast<double>(least[q]), inv_xi);
  if (direct) {
    D row_top[2];
    for (index_t half_at = 0; half_at < 2; ++half_at)
      doubles_at(reinterpret_cast<const T*>(&most) + half_at * half, row_top[half_at]);
    kernel_columns<T, Isa>(
        n, h,
        [&](index_t j, index_t half_at, D& y) SSR_INLINE_LAMBDA {
          column(x, j, half_at * half, y);
          y = y - row_top[half_at];
          math::kernel_value_of<T, Isa::piece>(y, D{}, inv_xi, false);
        },
        k, top);
    return;
  }
  D shift[2];
  costs_tile<T, Isa>(spec, x, n, z, c, shift);
  kernel_columns<T, Isa>(
      n, h,
      [&](index_t j, index_t half_at, D& y) SSR_INLINE_LAMBDA {
        read(c + j * tile + half_at * half, y);
        math::kernel_value_of<T, Isa::piece>(y, shift[half_at], inv_xi);
      },
      k, top);
}

// Q = exp(K + h - c) of a tile (K at k, h a column's, c = max_j (K_ij + h_j) given), c into top; the rows
// past `rows` get Q = 0, so that they add nothing to the sums.
template <class T, class Isa>
SSR_INLINE void scaled_from(const T* k, const T* h, index_t n, index_t rows, const Lanes<T>& c, T* q, T* top) {
  using V = Lanes<T>;
  using I = MaskOf<V>;
  V x, e;
  I index, real;
  lane_index(index);
  math::less_of<Isa::piece>(index, I{} + static_cast<math::lane_t<I>>(rows), real);
  for (index_t j = 0; j < n; ++j) {
    read(k + j * tile, x);
    exp_lanes<V, Isa>((x + h[j]) - c, e);
    V kept{};
    math::select_into<Isa::piece>(real, e, kept);
    write(q + j * tile, kept);
  }
  write(top, c);
}

// Q and c as scaled_from gives them, c from K and h (math::row_shift_of).
template <class T, class Isa>
SSR_INLINE void scaled_tile(const T* k, const T* h, index_t n, index_t rows, T* q, T* top) {
  using V = Lanes<T>;
  V c;
  math::row_shift_of<Isa::piece>(
      n, [&](index_t j, V& y) SSR_INLINE_LAMBDA { read(k + j * tile, y); },
      [&](index_t j, V& y) SSR_INLINE_LAMBDA { y = V{} + h[j]; }, c);
  scaled_from<T, Isa>(k, h, n, rows, c, q, top);
}

}  // namespace cpu
}  // namespace ssr
SSR_LANES_END
