// Views of xtensor containers and strided views: route xt::xtensor, xt::xarray and contiguous views in
// place, without copies. Link ssr::xtensor. Matrices must be row-major with unit inner stride.
#pragma once

#include <xtensor/xexpression.hpp>
#include <xtensor/xutils.hpp>

#include <string>
#include <type_traits>

#include "ssr/error.hpp"
#include "ssr/view.hpp"

namespace ssr {

namespace detail {
template <class E>
constexpr bool is_xtensor_with_data() {
  using D = std::decay_t<E>;
  return xt::is_xexpression<D>::value && xt::has_data_interface<D>::value;
}
}  // namespace detail

// A MatrixView of a 2-d xtensor expression with a data interface (xtensor, xarray, adaptors, strided views).
template <class E, std::enable_if_t<detail::is_xtensor_with_data<E>(), int> = 0>
auto view(E&& e) {
  using T = std::remove_pointer_t<decltype(e.data())>;
  if (e.dimension() != 2)
    throw Error("view: the xtensor expression has " + std::to_string(e.dimension()) + " dimensions, expected 2");
  const auto rows = static_cast<index_t>(e.shape()[0]), cols = static_cast<index_t>(e.shape()[1]);
  const auto inner = static_cast<index_t>(e.strides()[1]), outer = static_cast<index_t>(e.strides()[0]);
  if (cols > 1 && inner != 1)
    throw Error("view: the xtensor expression must be row-major with unit inner stride (inner stride " +
                std::to_string(inner) + ")");
  const index_t stride = rows > 1 ? outer : cols;  // xtensor gives extent-1 dimensions stride 0
  if (stride < cols)
    throw Error("view: the xtensor expression's row stride " + std::to_string(stride) + " is below its column count");
  return MatrixView<T>(e.data() + e.data_offset(), rows, cols, stride);
}

// A VectorView of a contiguous 1-d xtensor expression, e.g. the per-expert load.
template <class E, std::enable_if_t<detail::is_xtensor_with_data<E>(), int> = 0>
auto vector_view(E&& e) {
  using T = std::remove_pointer_t<decltype(e.data())>;
  if (e.dimension() != 1)
    throw Error("vector_view: the xtensor expression has " + std::to_string(e.dimension()) + " dimensions, expected 1");
  if (e.size() > 1 && e.strides()[0] != 1) throw Error("vector_view: the xtensor expression must be contiguous");
  return VectorView<T>(e.data() + e.data_offset(), static_cast<index_t>(e.size()));
}

}  // namespace ssr
