// Non-owning views over caller memory: a routing call reads and writes through these, never copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "ssr/detail/hd.hpp"

namespace ssr {

using index_t = std::ptrdiff_t;

// A rows x cols row-major matrix with a row stride (in elements) of at least cols.
template <class T>
struct MatrixView {
  T* data = nullptr;
  index_t rows = 0;
  index_t cols = 0;
  index_t stride = 0;

  constexpr MatrixView() = default;
  constexpr MatrixView(T* d, index_t r, index_t c) : data(d), rows(r), cols(c), stride(c) {}
  constexpr MatrixView(T* d, index_t r, index_t c, index_t s) : data(d), rows(r), cols(c), stride(s) {}
  // A view of mutable data converts to a view of const data.
  template <class U, class = std::enable_if_t<std::is_same<const U, T>::value && !std::is_same<U, T>::value>>
  constexpr MatrixView(const MatrixView<U>& o)  // NOLINT(google-explicit-constructor): as T* to const T*
      : data(o.data), rows(o.rows), cols(o.cols), stride(o.stride) {}

  SSR_HD constexpr bool empty() const { return data == nullptr; }
  SSR_HD constexpr T* row(index_t i) const { return data + i * stride; }
  SSR_HD constexpr T& operator()(index_t i, index_t j) const { return data[i * stride + j]; }
};

template <class T>
using ConstMatrixView = MatrixView<const T>;

// A contiguous vector of size elements.
template <class T>
struct VectorView {
  T* data = nullptr;
  index_t size = 0;

  constexpr VectorView() = default;
  constexpr VectorView(T* d, index_t n) : data(d), size(n) {}
  template <class U, class = std::enable_if_t<std::is_same<const U, T>::value && !std::is_same<U, T>::value>>
  constexpr VectorView(const VectorView<U>& o)  // NOLINT(google-explicit-constructor): as T* to const T*
      : data(o.data), size(o.size) {}
  SSR_HD constexpr bool empty() const { return data == nullptr; }
  SSR_HD constexpr T& operator[](index_t i) const { return data[i]; }
};

}  // namespace ssr
