// One sparse Mixture-of-Experts layer on Eigen: a linear gate S = X W_g^T, n two-layer GELU experts
// (d -> h -> d), and routing through any ssr::Router. Forward, and a backward that gives the gradients of
// the gate (and of the noise gate of noisy gating), of every expert's weights and biases, and of the input.
#pragma once

#include <ssr/eigen.hpp>
#include <ssr/random.hpp>
#include <ssr/router.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gelu.hpp"
#include "tensor.hpp"

namespace smoe {

struct LayerOptions {
  double load_balancing = 0;  // weight of the Switch load-balancing loss; 0: off
  double z_loss = 0;          // weight of the ST-MoE router z-loss; 0: off
  // Weight of DeepSeek-V3's sequence-wise balance loss over sequences of seq_len consecutive tokens; 0: off.
  double sequence_balance = 0;
  Index seq_len = 1;
  // Trainable noisy gating (Shazeer et al. 2017): in training the router sees
  // H = X W_g^T + eps * softplus(X W_noise^T), eps ~ N(0, 1) drawn from (seed, layer, step).
  bool noisy_gating = false;
  // Auxiliary-loss-free balancing (DeepSeek-V3): a per-expert selection bias, moved by this rate toward
  // balance after every training step (update_bias); 0: no bias.
  double bias_rate = 0;
  // Expert capacity factor F (Switch, GShard): each expert takes at most ceil(F k m / n) of a call's m
  // tokens, in token order; the rest skip it (the residual carries them). 0: no limit.
  double capacity = 0;
};

// Route afresh, or replay the experts and weights of the previous forward on new inputs. Replay is the
// function whose gradient backward computes when the router's weights pass no gradient (plan weights).
enum class Routing { route, replay };

// One forward call: the router's context (mode, step, layer, seed), and whether gate noise is drawn.
struct Pass {
  ssr::Context ctx = ssr::Context::eval();
  bool gate_noise = false;
  Routing routing = Routing::route;
  bool capacity = true;  // apply the layer's capacity factor (false: evaluate without dropping)
};

// What forward keeps for backward, and the scratch backward reuses.
template <class T>
struct LayerCache {
  Mat<T> x;                 // m x d input
  Mat<T> logits;            // m x n: what the router saw (S, or H with gate noise)
  Mat<T> noise_pre, noise;  // m x n: X W_noise^T and eps, when gate noise was drawn
  bool gate_noise = false;
  IndexMat experts;         // m x k
  Mat<T> weights;           // m x k
  ssr::RouteInfo info;
  std::vector<std::int32_t> load;                      // n: assignments per expert
  std::vector<std::int32_t> offsets, token_ids, slots;  // the assignments grouped by expert
  Index dropped = 0;                                   // assignments over capacity
  double output_norm = 0;                              // mean over tokens of |Y_i|, the block's output norm
  double load_balancing = 0, z_loss = 0, sequence_balance = 0;  // auxiliary losses, unweighted
  Mat<T> load_balancing_grad, z_loss_grad, sequence_balance_grad;  // m x n, their gradients in the logits
  Mat<T> xg, pre, act, y;   // per assignment, grouped by expert: input, pre-activation, activation, output
  double routing_seconds = 0;  // gate products, router, grouping, auxiliary losses: forward and backward
  Mat<T> grad_weights, grad_logits, grad_y, grad_xg;  // backward scratch
};

template <class T>
struct LayerParams {
  Mat<T> gate;                     // n x d
  Mat<T> noise_gate;               // n x d with noisy gating, else empty
  std::vector<Mat<T>> w1, b1;      // per expert: h x d, 1 x h
  std::vector<Mat<T>> w2, b2;      // per expert: d x h, 1 x d
};

template <class T>
class SmoeLayer {
 public:
  // Gaussian gate and expert weights, zero biases; the noise gate starts at zero, as in Shazeer et al.
  SmoeLayer(Index dim, Index hidden, Index experts, LayerOptions options, Rng& rng)
      : dim_(dim), hidden_(hidden), experts_(experts), options_(options) {
    params_.gate = random_normal<T>(experts, dim, 1.0 / std::sqrt(static_cast<double>(dim)), rng);
    if (options_.noisy_gating) params_.noise_gate = Mat<T>::Zero(experts, dim);
    for (Index j = 0; j < experts; ++j) {
      params_.w1.push_back(random_normal<T>(hidden, dim, 1.0 / std::sqrt(static_cast<double>(dim)), rng));
      params_.b1.push_back(Mat<T>::Zero(1, hidden));
      params_.w2.push_back(random_normal<T>(dim, hidden, 0.5 / std::sqrt(static_cast<double>(hidden)), rng));
      params_.b2.push_back(Mat<T>::Zero(1, dim));
    }
    grads_ = params_;
    zero_grad();
    if (options_.bias_rate > 0) bias_.assign(static_cast<std::size_t>(experts), 0.0f);
  }

  Index dim() const { return dim_; }
  Index hidden() const { return hidden_; }
  Index experts() const { return experts_; }
  const LayerOptions& options() const { return options_; }
  const LayerParams<T>& params() const { return params_; }

  // Every trainable tensor with its gradient, names prefixed.
  std::vector<Tensor<T>> tensors(const std::string& prefix) {
    std::vector<Tensor<T>> out{{prefix + "gate", &params_.gate, &grads_.gate}};
    if (options_.noisy_gating) out.push_back({prefix + "noise_gate", &params_.noise_gate, &grads_.noise_gate});
    for (Index j = 0; j < experts_; ++j) {
      const std::string e = prefix + "expert" + std::to_string(j) + ".";
      const auto u = static_cast<std::size_t>(j);
      out.push_back({e + "w1", &params_.w1[u], &grads_.w1[u]});
      out.push_back({e + "b1", &params_.b1[u], &grads_.b1[u]});
      out.push_back({e + "w2", &params_.w2[u], &grads_.w2[u]});
      out.push_back({e + "b2", &params_.b2[u], &grads_.b2[u]});
    }
    return out;
  }

  void zero_grad() {
    for (Tensor<T>& t : tensors("")) t.grad->setZero();
  }

  // The weighted auxiliary loss of the forward that filled c.
  double aux_loss(const LayerCache<T>& c) const {
    return options_.load_balancing * c.load_balancing + options_.z_loss * c.z_loss +
           options_.sequence_balance * c.sequence_balance;
  }

  // The expert bias's step toward balance from the loads of c (nothing without bias_rate).
  void update_bias(const LayerCache<T>& c) {
    if (bias_.empty()) return;
    const auto n = static_cast<ssr::index_t>(bias_.size());
    ssr::update_expert_bias(ssr::VectorView<const std::int32_t>(c.load.data(), n), options_.bias_rate,
                            ssr::VectorView<float>(bias_.data(), n));
  }

  // Y_i = sum_r w_ir FFN_{e_ir}(x_i) for the m x d input x; c keeps what backward needs.
  template <class Router>
  Mat<T> forward(Router& router, const Mat<T>& x, const Pass& pass, LayerCache<T>& c) const {
    static_assert(std::is_same<typename Router::value_type, T>::value,
                  "smoe::SmoeLayer<T>: the router's backend must compute in T");
    const auto start = Clock::now();
    c.x = x;
    c.logits.noalias() = x * params_.gate.transpose();
    c.gate_noise = pass.gate_noise && options_.noisy_gating;
    if (c.gate_noise) add_gate_noise(pass.ctx, c);
    if (pass.routing == Routing::route) route(router, pass, c);
    aux_losses(router.resolve(pass.ctx).select.score, c);
    c.routing_seconds = seconds_since(start);
    run_experts(c);
    Mat<T> out = Mat<T>::Zero(x.rows(), dim_);
    for (Index e = 0; e < assignments(c); ++e) {
      const std::int32_t t = c.token_ids[static_cast<std::size_t>(e)], s = c.slots[static_cast<std::size_t>(e)];
      out.row(t) += c.weights(t, s) * c.y.row(e);
    }
    c.output_norm = x.rows() > 0 ? static_cast<double>(out.rowwise().norm().mean()) : 0.0;
    return out;
  }

  // Adds this forward's parameter gradients to the layer's, and writes dL/dx into grad_x, for
  // grad_out = dL/dY. The router maps dL/dw to dL/dS; the auxiliary losses add their own dL/dS.
  template <class Router>
  void backward(Router& router, LayerCache<T>& c, const Mat<T>& grad_out, Mat<T>& grad_x) {
    const Index m = c.x.rows(), k = c.experts.cols(), total = assignments(c);
    c.grad_weights.setZero(m, k);
    c.grad_y.resize(total, dim_);
    for (Index e = 0; e < total; ++e) {
      const std::int32_t t = c.token_ids[static_cast<std::size_t>(e)], s = c.slots[static_cast<std::size_t>(e)];
      c.grad_weights(t, s) = grad_out.row(t).dot(c.y.row(e));
      c.grad_y.row(e) = c.weights(t, s) * grad_out.row(t);
    }
    backward_experts(c);
    grad_x.setZero(m, dim_);
    for (Index e = 0; e < total; ++e) grad_x.row(c.token_ids[static_cast<std::size_t>(e)]) += c.grad_xg.row(e);

    const auto start = Clock::now();
    c.grad_logits.resize(m, experts_);
    ssr::BackwardArgs<T> args;
    args.logits = ssr::view(std::as_const(c.logits));
    args.experts = ssr::view(std::as_const(c.experts));
    args.weights = ssr::view(std::as_const(c.weights));
    args.grad_weights = ssr::view(std::as_const(c.grad_weights));
    args.grad_logits = ssr::view(c.grad_logits);
    router.backward(c.info, args);
    if (options_.load_balancing > 0) c.grad_logits += static_cast<T>(options_.load_balancing) * c.load_balancing_grad;
    if (options_.z_loss > 0) c.grad_logits += static_cast<T>(options_.z_loss) * c.z_loss_grad;
    if (options_.sequence_balance > 0)
      c.grad_logits += static_cast<T>(options_.sequence_balance) * c.sequence_balance_grad;
    grads_.gate.noalias() += c.grad_logits.transpose() * c.x;
    grad_x.noalias() += c.grad_logits * params_.gate;
    if (c.gate_noise) {  // dH/dZ = eps * sigmoid(Z), Z = X W_noise^T
      const Mat<T> grad_pre =
          c.grad_logits.cwiseProduct(c.noise).cwiseProduct(c.noise_pre.unaryExpr([](T z) { return sigmoid(z); }));
      grads_.noise_gate.noalias() += grad_pre.transpose() * c.x;
      grad_x.noalias() += grad_pre * params_.noise_gate;
    }
    c.routing_seconds += seconds_since(start);
  }

 private:
  using Clock = std::chrono::steady_clock;
  // Gate noise has its own Philox key, apart from the streams of noisy routers.
  static constexpr std::uint32_t gate_noise_key = 0x9e3779b9u;

  static double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
  }
  static T softplus(T z) { return z > 0 ? z + std::log1p(std::exp(-z)) : std::log1p(std::exp(z)); }
  static T sigmoid(T z) { return T(1) / (T(1) + std::exp(-z)); }
  static Index assignments(const LayerCache<T>& c) { return c.offsets.empty() ? 0 : c.offsets.back(); }
  // Below about 16M multiply-adds per product, starting threads costs more than it saves.
  bool worth_threads(Index total) const { return total * dim_ * hidden_ >= (Index{1} << 24); }

  void add_gate_noise(const ssr::Context& ctx, LayerCache<T>& c) const {
    const Index m = c.x.rows(), n = experts_;
    c.noise_pre.noalias() = c.x * params_.noise_gate.transpose();
    c.noise.resize(m, n);
    for (Index i = 0; i < m; ++i)
      for (Index j = 0; j < n; ++j)
        c.noise(i, j) = static_cast<T>(ssr::random::normal(ctx.seed ^ gate_noise_key, ctx.layer, ctx.step,
                                                           static_cast<std::uint64_t>(i * n + j)));
    c.logits += c.noise.cwiseProduct(c.noise_pre.unaryExpr([](T z) { return softplus(z); }));
  }

  template <class Router>
  void route(Router& router, const Pass& pass, LayerCache<T>& c) const {
    const Index m = c.x.rows(), n = experts_, k = router.resolve(pass.ctx).k;
    c.experts.resize(m, k);
    c.weights.resize(m, k);
    c.load.assign(static_cast<std::size_t>(n), 0);
    const ssr::Context ctx = bias_.empty() ? pass.ctx : pass.ctx.with_bias({bias_.data(), n});
    c.info = router.route(ssr::view(std::as_const(c.logits)), ctx,
                          {ssr::view(c.experts), ssr::view(c.weights), {c.load.data(), n}});
    c.offsets.resize(static_cast<std::size_t>(n + 1));
    c.token_ids.resize(static_cast<std::size_t>(m * k));
    c.slots.resize(static_cast<std::size_t>(m * k));
    const Index capacity =
        options_.capacity > 0 && pass.capacity && m > 0 ? ssr::expert_capacity(options_.capacity, m, k, n) : -1;
    c.dropped = ssr::group_by_expert(ssr::view(std::as_const(c.experts)), n, {c.offsets.data(), n + 1},
                                     {c.token_ids.data(), m * k}, {c.slots.data(), m * k}, capacity);
  }

  void aux_losses(ssr::Score score, LayerCache<T>& c) const {
    const Index m = c.x.rows(), n = experts_;
    c.load_balancing = c.z_loss = c.sequence_balance = 0;
    if (options_.load_balancing > 0) {
      c.load_balancing_grad.resize(m, n);
      c.load_balancing = ssr::load_balancing_loss(ssr::view(std::as_const(c.logits)), ssr::view(std::as_const(c.experts)),
                                                  ssr::view(c.load_balancing_grad), score);
    }
    if (options_.sequence_balance > 0) {  // the last sequence may be shorter: it is left out of the loss
      const Index seq = std::max<Index>(1, options_.seq_len), full = m / seq * seq;
      c.sequence_balance_grad.setZero(m, n);
      if (full > 0)
        c.sequence_balance = ssr::sequence_balance_loss(
            ssr::ConstMatrixView<T>(c.logits.data(), full, n), ssr::ConstMatrixView<std::int32_t>(c.experts.data(), full, c.experts.cols()),
            seq, 1.0, ssr::MatrixView<T>(c.sequence_balance_grad.data(), full, n), score);
    }
    if (options_.z_loss > 0) {
      c.z_loss_grad.resize(m, n);
      c.z_loss = ssr::z_loss(ssr::view(std::as_const(c.logits)), ssr::view(c.z_loss_grad));
    }
  }

  void run_experts(LayerCache<T>& c) const {
    const Index total = assignments(c);
    c.xg.resize(total, dim_);
    for (Index e = 0; e < total; ++e) c.xg.row(e) = c.x.row(c.token_ids[static_cast<std::size_t>(e)]);
    c.pre.resize(total, hidden_);
    c.act.resize(total, hidden_);
    c.y.resize(total, dim_);
    const bool parallel = worth_threads(total);
    SMOE_PARALLEL_FOR_EXPERTS(parallel)
    for (Index j = 0; j < experts_; ++j) {
      const auto u = static_cast<std::size_t>(j);
      const Index begin = c.offsets[u], count = c.offsets[u + 1] - begin;
      auto pre = c.pre.middleRows(begin, count);
      pre.noalias() = c.xg.middleRows(begin, count) * params_.w1[u].transpose();
      pre.rowwise() += params_.b1[u].row(0);
      c.act.middleRows(begin, count) = pre.unaryExpr([](T v) { return gelu(v); });
      auto y = c.y.middleRows(begin, count);
      y.noalias() = c.act.middleRows(begin, count) * params_.w2[u].transpose();
      y.rowwise() += params_.b2[u].row(0);
    }
  }

  void backward_experts(LayerCache<T>& c) {
    c.grad_xg.resize(assignments(c), dim_);
    const bool parallel = worth_threads(assignments(c));
    SMOE_PARALLEL_FOR_EXPERTS(parallel)
    for (Index j = 0; j < experts_; ++j) {
      const auto u = static_cast<std::size_t>(j);
      const Index begin = c.offsets[u], count = c.offsets[u + 1] - begin;
      const auto grad_y = c.grad_y.middleRows(begin, count);
      grads_.w2[u].noalias() += grad_y.transpose() * c.act.middleRows(begin, count);
      grads_.b2[u] += grad_y.colwise().sum();
      const Mat<T> grad_pre =
          (grad_y * params_.w2[u]).cwiseProduct(c.pre.middleRows(begin, count).unaryExpr([](T v) { return gelu_grad(v); }));
      grads_.w1[u].noalias() += grad_pre.transpose() * c.xg.middleRows(begin, count);
      grads_.b1[u] += grad_pre.colwise().sum();
      c.grad_xg.middleRows(begin, count).noalias() = grad_pre * params_.w1[u];
    }
  }

  Index dim_, hidden_, experts_;
  LayerOptions options_;
  LayerParams<T> params_, grads_;
  std::vector<float> bias_;  // the expert bias with bias_rate > 0
};

}  // namespace smoe
