// Adam (Kingma and Ba 2015) with bias correction, over the model's named tensors.
#pragma once

#include <cmath>
#include <vector>

#include "tensor.hpp"

namespace smoe {

struct AdamOptions {
  double lr = 3e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

template <class T>
class Adam {
 public:
  Adam(std::vector<Tensor<T>> tensors, AdamOptions options) : tensors_(std::move(tensors)), options_(options) {
    for (const Tensor<T>& t : tensors_) {
      first_.push_back(Mat<T>::Zero(t.value->rows(), t.value->cols()));
      second_.push_back(Mat<T>::Zero(t.value->rows(), t.value->cols()));
    }
  }

  // One update from the tensors' current gradients.
  void step() {
    ++steps_;
    const double c1 = 1 - std::pow(options_.beta1, steps_), c2 = 1 - std::pow(options_.beta2, steps_);
    const T b1 = static_cast<T>(options_.beta1), b2 = static_cast<T>(options_.beta2);
    const T step_size = static_cast<T>(options_.lr / c1), root_c2 = static_cast<T>(std::sqrt(c2));
    const T eps = static_cast<T>(options_.eps);
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      const auto g = tensors_[i].grad->array();
      auto m = first_[i].array();
      auto v = second_[i].array();
      m = b1 * m + (T(1) - b1) * g;
      v = b2 * v + (T(1) - b2) * g.square();
      tensors_[i].value->array() -= step_size * m / (v.sqrt() / root_c2 + eps);
    }
  }

 private:
  std::vector<Tensor<T>> tensors_;
  AdamOptions options_;
  std::vector<Mat<T>> first_, second_;
  int steps_ = 0;
};

}  // namespace smoe
