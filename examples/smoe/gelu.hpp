// GELU in its tanh form (GPT-2's), and its derivative: smooth, so finite differences check it exactly.
#pragma once

#include <cmath>

namespace smoe {

namespace detail {
constexpr double gelu_a = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double gelu_b = 0.044715;
}  // namespace detail

template <class T>
T gelu(T x) {
  const T u = static_cast<T>(detail::gelu_a) * (x + static_cast<T>(detail::gelu_b) * x * x * x);
  return T(0.5) * x * (T(1) + std::tanh(u));
}

template <class T>
T gelu_grad(T x) {
  const T a = static_cast<T>(detail::gelu_a), b = static_cast<T>(detail::gelu_b);
  const T t = std::tanh(a * (x + b * x * x * x));
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * a * (T(1) + T(3) * b * x * x);
}

}  // namespace smoe
