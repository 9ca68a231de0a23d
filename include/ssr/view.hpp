// Non-owning views over caller memory: a routing call reads and writes through these, never copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "ssr/error.hpp"

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
  constexpr MatrixView(const MatrixView<U>& o) : data(o.data), rows(o.rows), cols(o.cols), stride(o.stride) {}

  constexpr bool empty() const { return data == nullptr; }
  constexpr T* row(index_t i) const { return data + i * stride; }
  constexpr T& operator()(index_t i, index_t j) const { return data[i * stride + j]; }
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
  constexpr VectorView(const VectorView<U>& o) : data(o.data), size(o.size) {}
  constexpr bool empty() const { return data == nullptr; }
  constexpr T& operator[](index_t i) const { return data[i]; }
};

namespace detail {

// Checks a view has the expected shape and a valid stride; name is the argument's name in the message.
template <class T>
void require_shape(const MatrixView<T>& v, const char* name, index_t rows, index_t cols) {
  if (v.data == nullptr) throw Error(std::string(name) + " is null");
  if (v.rows != rows || v.cols != cols) {
    std::ostringstream os;
    os << name << " has shape " << v.rows << "x" << v.cols << ", expected " << rows << "x" << cols;
    throw Error(os.str());
  }
  require(v.stride >= v.cols, (std::string(name) + ".stride").c_str(), v.stride,
          "must be at least its column count " + std::to_string(v.cols));
}

template <class T>
void require_size(const VectorView<T>& v, const char* name, index_t size) {
  if (v.data == nullptr) throw Error(std::string(name) + " is null");
  if (v.size != size) {
    throw Error(std::string(name) + " has size " + std::to_string(v.size) + ", expected " +
                std::to_string(size));
  }
}

}  // namespace detail
}  // namespace ssr
