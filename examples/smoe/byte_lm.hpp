// A byte-level language model built from SMoE layers: the sum of position-wise embeddings of the previous
// C bytes, L residual SMoE blocks x <- x + SMoE_l(x), a linear read-out to 256 logits, and cross-entropy.
// With momentum the blocks are Momentum SMoE's (Teo et al. 2024), a heavy-ball residual:
// p_l = -SMoE_l(x_l) + mu p_{l-1}, x_{l+1} = x_l - gamma p_l (mu = 0, gamma = 1: the plain residual).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "smoe_layer.hpp"
#include "tensor.hpp"

namespace smoe {

struct ModelOptions {
  int context = 4;     // previous bytes each prediction sees
  Index dim = 64;      // d
  Index hidden = 128;  // h, each expert's hidden width
  Index experts = 8;   // n
  int layers = 2;      // L
  double momentum = 0;   // mu of Momentum SMoE
  double step_size = 1;  // gamma of Momentum SMoE
  LayerOptions layer;
};

// m predictions: the previous C bytes of each (most recent first) and the byte that follows.
struct Batch {
  IndexMat context;                   // m x C
  std::vector<std::int32_t> targets;  // m
  Index size() const { return context.rows(); }
};

template <class T>
class ByteLM {
 public:
  static constexpr Index vocabulary = 256;

  ByteLM(const ModelOptions& options, std::uint64_t seed) : options_(options) {
    Rng rng(seed);
    const double d = static_cast<double>(options.dim);
    embedding_ = random_normal<T>(options.context * vocabulary, options.dim, 1.0 / std::sqrt(options.context), rng);
    for (int l = 0; l < options.layers; ++l)
      layers_.emplace_back(options.dim, options.hidden, options.experts, options.layer, rng);
    out_weight_ = random_normal<T>(vocabulary, options.dim, 1.0 / std::sqrt(d), rng);
    out_bias_ = Mat<T>::Zero(1, vocabulary);
    caches_.resize(static_cast<std::size_t>(options.layers));
    grad_embedding_ = Mat<T>::Zero(embedding_.rows(), embedding_.cols());
    grad_out_weight_ = Mat<T>::Zero(out_weight_.rows(), out_weight_.cols());
    grad_out_bias_ = Mat<T>::Zero(1, vocabulary);
  }

  const ModelOptions& options() const { return options_; }
  int layers() const { return options_.layers; }
  const LayerCache<T>& cache(int layer) const { return caches_[static_cast<std::size_t>(layer)]; }
  SmoeLayer<T>& layer(int l) { return layers_[static_cast<std::size_t>(l)]; }

  // Every trainable tensor with its gradient: embedding, each layer's, the read-out.
  std::vector<Tensor<T>> tensors() {
    std::vector<Tensor<T>> out{{"embedding", &embedding_, &grad_embedding_}};
    for (std::size_t l = 0; l < layers_.size(); ++l)
      for (Tensor<T>& t : layers_[l].tensors("layer" + std::to_string(l) + ".")) out.push_back(t);
    out.push_back({"out_weight", &out_weight_, &grad_out_weight_});
    out.push_back({"out_bias", &out_bias_, &grad_out_bias_});
    return out;
  }

  void zero_grad() {
    for (Tensor<T>& t : tensors()) t.grad->setZero();
  }

  // The training loss of the batch: mean cross-entropy (nats) plus the layers' weighted auxiliary losses.
  // Layer l routes with pass.ctx and layer = l, so every layer draws its own random streams. backward()
  // reads the batch again: it must outlive that call.
  template <class Router>
  double forward(Router& router, const Batch& batch, const Pass& pass) {
    const Index m = batch.size();
    Mat<T> x = Mat<T>::Zero(m, options_.dim);
    for (Index i = 0; i < m; ++i)
      for (int c = 0; c < options_.context; ++c) x.row(i) += embedding_.row(embedding_row(c, batch.context(i, c)));
    aux_ = 0;
    Mat<T> p = Mat<T>::Zero(m, options_.dim);
    const auto mu = static_cast<T>(options_.momentum), gamma = static_cast<T>(options_.step_size);
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      Pass layer_pass = pass;
      layer_pass.ctx.layer = static_cast<std::uint32_t>(l);
      p = mu * p - layers_[l].forward(router, x, layer_pass, caches_[l]);
      x -= gamma * p;
      aux_ += layers_[l].aux_loss(caches_[l]);
    }
    top_ = x;
    probs_.noalias() = x * out_weight_.transpose();
    probs_.rowwise() += out_bias_.row(0);
    double total = 0;
    for (Index i = 0; i < m; ++i) {  // softmax in place; cross-entropy from the log-sum-exp
      auto row = probs_.row(i);
      const T top = row.maxCoeff();
      const T target = row(batch.targets[static_cast<std::size_t>(i)]);
      row = (row.array() - top).exp();
      const T sum = row.sum();
      row /= sum;
      total += static_cast<double>(top) + std::log(static_cast<double>(sum)) - static_cast<double>(target);
    }
    batch_ = &batch;
    cross_entropy_ = total / static_cast<double>(m);
    return cross_entropy_ + aux_;
  }

  double cross_entropy() const { return cross_entropy_; }  // of the last forward, nats per byte
  double aux_loss() const { return aux_; }                  // of the last forward

  // Adds the gradients of the last forward's loss to the model's (zero_grad() first for a fresh step).
  template <class Router>
  void backward(Router& router) {
    const Batch& batch = *batch_;
    const Index m = batch.size();
    Mat<T> grad_logits = probs_;
    for (Index i = 0; i < m; ++i) grad_logits(i, batch.targets[static_cast<std::size_t>(i)]) -= T(1);
    grad_logits /= static_cast<T>(m);
    grad_out_weight_.noalias() += grad_logits.transpose() * top_;
    grad_out_bias_ += grad_logits.colwise().sum();
    Mat<T> grad_x = grad_logits * out_weight_, grad_branch;
    // dL/dp_l = -gamma dL/dx_{l+1} + mu dL/dp_{l+1}, and SMoE_l's output gets -dL/dp_l.
    Mat<T> grad_p = Mat<T>::Zero(m, options_.dim);
    const auto mu = static_cast<T>(options_.momentum), gamma = static_cast<T>(options_.step_size);
    for (std::size_t l = layers_.size(); l-- > 0;) {
      grad_p = mu * grad_p - gamma * grad_x;
      layers_[l].backward(router, caches_[l], -grad_p, grad_branch);
      grad_x += grad_branch;
    }
    for (Index i = 0; i < m; ++i)
      for (int c = 0; c < options_.context; ++c) grad_embedding_.row(embedding_row(c, batch.context(i, c))) += grad_x.row(i);
  }

 private:
  static Index embedding_row(int position, std::int32_t byte) { return position * vocabulary + byte; }

  ModelOptions options_;
  Mat<T> embedding_, out_weight_, out_bias_;
  Mat<T> grad_embedding_, grad_out_weight_, grad_out_bias_;
  std::vector<SmoeLayer<T>> layers_;
  std::vector<LayerCache<T>> caches_;
  Mat<T> top_, probs_;  // last forward: input of the read-out, softmax of its logits
  const Batch* batch_ = nullptr;
  double cross_entropy_ = 0, aux_ = 0;
};

}  // namespace smoe
