// Views of Eigen matrices: route an Eigen::Map, Eigen::Ref or Matrix in place, without copies.
// Routing reads rows, so the Eigen object must be row-major with unit inner stride.
#pragma once

#include <Eigen/Core>

#include <type_traits>

#include "ssr/error.hpp"
#include "ssr/view.hpp"

namespace ssr {

namespace detail {
template <class Derived>
constexpr void check_row_major() {
  static_assert(Derived::IsRowMajor || Derived::ColsAtCompileTime == 1,
                "ssr::view: the Eigen object must be row-major (Eigen::RowMajor); a column-major matrix "
                "would be routed by its columns");
  static_assert(Derived::InnerStrideAtCompileTime == 1 || Derived::InnerStrideAtCompileTime == Eigen::Dynamic,
                "ssr::view: the Eigen object must have unit inner stride");
}
}  // namespace detail

// A mutable view of a row-major Eigen matrix, map or ref.
template <class Derived>
auto view(Eigen::PlainObjectBase<Derived>& m) {
  detail::check_row_major<Derived>();
  using T = typename Derived::Scalar;
  return MatrixView<T>(m.data(), m.rows(), m.cols(), m.outerStride());
}

template <class Derived>
auto view(const Eigen::PlainObjectBase<Derived>& m) {
  detail::check_row_major<Derived>();
  using T = typename Derived::Scalar;
  return MatrixView<const T>(m.data(), m.rows(), m.cols(), m.outerStride());
}

template <class Derived, int Options, class Stride>
auto view(const Eigen::Map<Derived, Options, Stride>& m) {
  using Map = Eigen::Map<Derived, Options, Stride>;
  detail::check_row_major<Map>();
  using T = std::remove_pointer_t<decltype(m.data())>;
  if (m.innerStride() != 1) throw Error("view: the Eigen map must have unit inner stride");
  return MatrixView<T>(m.data(), m.rows(), m.cols(), m.outerStride());
}

template <class Derived, int Options, class Stride>
auto view(const Eigen::Ref<Derived, Options, Stride>& m) {
  using Ref = Eigen::Ref<Derived, Options, Stride>;
  detail::check_row_major<Ref>();
  using T = std::remove_pointer_t<decltype(m.data())>;
  if (m.innerStride() != 1) throw Error("view: the Eigen ref must have unit inner stride");
  return MatrixView<T>(m.data(), m.rows(), m.cols(), m.outerStride());
}

// A view of a contiguous Eigen vector, e.g. the per-expert load as Eigen::VectorXi.
template <class Derived>
auto vector_view(Eigen::PlainObjectBase<Derived>& v) {
  static_assert(Derived::IsVectorAtCompileTime, "ssr::vector_view: the Eigen object must be a vector");
  return VectorView<typename Derived::Scalar>(v.data(), v.size());
}

}  // namespace ssr
