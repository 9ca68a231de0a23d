// The argument checks of a routing call and of its backward, run on the host before anything is written,
// and the error a backend raises when its scan finds a non-finite value.
#pragma once

#include <cmath>
#include <cstdint>

#include "ssr/error.hpp"
#include "ssr/math/numeric.hpp"
#include "ssr/math/select.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace detail {

// Checks a view has the expected shape and a valid stride; name is the argument's name in the message.
// The most elements a view may span: 2^56, so that a call's sizes in bytes, workspace included, fit in 63 bits.
constexpr index_t max_view_elements = index_t{1} << 56;

template <class T>
void require_shape(const MatrixView<T>& v, const char* name, index_t rows, index_t cols) {
  if (v.data == nullptr) fail(name, " is null");
  if (v.rows != rows || v.cols != cols) fail(name, " has shape ", v.rows, "x", v.cols, ", expected ", rows, "x", cols);
  if (v.stride < v.cols) fail("invalid ", name, ".stride = ", v.stride, ": must be at least its column count ", v.cols);
  // Every size a call derives from a shape (elements, bytes, workspace of a few doubles per element)
  // stays within 64 bits: larger views are rejected here, before anything is allocated. A view of no
  // columns may have stride 0 and spans nothing.
  if (v.stride > 0 && v.rows > max_view_elements / v.stride)
    fail(name, " of ", v.rows, "x", v.cols, " (stride ", v.stride, ") spans more than 2^56 elements");
}

// The sizes of a call's m x n logits, also what a workspace query takes: at least one expert, and no more
// elements than a view may span.
inline void validate_sizes(index_t m, index_t n) {
  require(n >= 1, "logits.cols", n, "must be at least 1 (the number of experts)");
  require(m >= 0, "logits.rows", m, "must be >= 0");
  if (m > max_view_elements / n) fail("logits of ", m, "x", n, " span more than 2^56 elements");
}

template <class T>
void require_size(const VectorView<T>& v, const char* name, index_t size) {
  if (v.data == nullptr) fail(name, " is null");
  if (v.size != size) fail(name, " has size ", v.size, ", expected ", size);
}

// The counts of a selection; what depends on the number of experts is checked per call.
inline void validate(const Selection& s) {
  require(s.n_groups >= 1 && s.n_groups <= math::max_groups, "n_groups", s.n_groups, "must be in [1, ",
          math::max_groups, "]");
  require(s.topk_groups >= 1 && s.topk_groups <= s.n_groups, "topk_groups", s.topk_groups,
          "must be in [1, n_groups = ", s.n_groups, "]");
}

inline void validate(const SinkhornParams& p) {
  require(std::isfinite(p.xi) && p.xi > 0, "xi", p.xi, "must be finite and > 0");
  require(std::isfinite(p.tol) && p.tol > 0, "tol", p.tol, "must be finite and > 0");
  require(p.max_iters >= 1, "max_iters", p.max_iters, "must be at least 1");
}

// What every spec must hold, whichever policy resolved it: the built-in policies validate these once, but
// a policy of the caller's own is only known by the specs it resolves.
inline void validate_spec(const RouteSpec& spec) {
  require(spec.k >= 1, "k", spec.k, "must be at least 1");
  validate(spec.select);
  require(std::isfinite(spec.noise_alpha) && spec.noise_alpha >= 0, "alpha", spec.noise_alpha,
          "must be finite and >= 0");
  require(std::isfinite(spec.noise_sigma) && spec.noise_sigma > 0, "sigma", spec.noise_sigma, "must be finite and > 0");
  if (spec.path == Path::sinkhorn) {
    validate(spec.sinkhorn);
    require(!spec.select.grouped(), "topk_groups", spec.select.topk_groups,
            "must equal n_groups = ", spec.select.n_groups, " on the Sinkhorn path");
  } else if (spec.noisy() && !spec.plain_selection(nullptr)) {
    // The noise perturbs the cost the softmax path ranks; a selection by sigmoid scores or groups ranks
    // no cost (with an expert bias, checked per call: validate_selection).
    fail("invalid alpha = ", spec.noise_alpha,
         ": cost noise needs softmax scores without groups (score = ", to_string(spec.select.score),
         ", n_groups = ", spec.select.n_groups, ", topk_groups = ", spec.select.topk_groups, ")");
  }
}

// What a selection needs of the n experts of a call and its expert bias (the context's, size checked).
inline void validate_selection(const RouteSpec& spec, index_t n, VectorView<const float> bias) {
  const Selection& sel = spec.select;
  if (!bias.empty()) require_size(bias, "expert_bias", n);
  if (sel.n_groups > 1) {
    require(n % sel.n_groups == 0, "n_groups", sel.n_groups, "must divide the number of experts n = ", n);
    const index_t reachable = sel.topk_groups * (n / sel.n_groups);
    require(spec.k <= reachable, "k", spec.k, "must be at most topk_groups * n / n_groups = ", reachable);
  }
  if (spec.path == Path::softmax && spec.noisy() && !bias.empty())
    fail("invalid expert_bias: cost noise (alpha = ", spec.noise_alpha,
         ") perturbs the ranking of the logits, an expert bias that of the scores; use one of them");
}

// The shapes of a call routing m x n logits with spec.k experts per token into out, with the context's
// expert bias.
template <class L, class T>
void validate_route(const RouteSpec& spec, VectorView<const float> bias, ConstMatrixView<L> logits,
                    const RouteOutputs<T>& out) {
  const index_t m = logits.rows, n = logits.cols;
  const int k = spec.k;
  validate_spec(spec);
  validate_sizes(m, n);
  require(k <= n, "k", k, "must be at most the number of experts n = ", n);
  validate_selection(spec, n, bias);
  if (m > 0) {
    require_shape(logits, "logits", m, n);
    require_shape(out.experts, "experts", m, k);
    require_shape(out.weights, "weights", m, k);
    if (!out.plan.empty()) require_shape(out.plan, "plan", m, n);
    if (!out.noise.empty()) require_shape(out.noise, "noise", m, n);
  }
  if (!out.load.empty()) {
    require_size(out.load, "load", n);
    // An expert takes each token at most once: int32 counts hold any load of up to 2^31 - 1 tokens.
    require(m <= INT32_MAX, "logits.rows", m, "must be at most 2^31 - 1 when the call counts the load");
  }
}

// True when the backward of this call's weights reads the logits: sigmoid score weights.
inline bool backward_reads_logits(const RouteInfo& info) {
  return info.weights == Weights::scores && info.score == Score::sigmoid;
}

// The shapes of a backward call: experts, weights and grad_weights m x k, grad_logits (and the logits,
// when the gradient reads them) m x n.
template <class T>
void validate_backward(const RouteInfo& info, const BackwardArgs<T>& a) {
  const index_t m = a.experts.rows, n = a.grad_logits.cols, k = a.experts.cols;
  require(n >= 1, "grad_logits.cols", n, "must be at least 1 (the number of experts)");
  require(k >= 1 && k <= n, "experts.cols", k, "must be in [1, n = ", n, "]");
  if (m == 0) return;
  require_shape(a.experts, "experts", m, k);
  require_shape(a.weights, "weights", m, k);
  require_shape(a.grad_weights, "grad_weights", m, k);
  require_shape(a.grad_logits, "grad_logits", m, n);
  if (backward_reads_logits(info)) {
    if (a.logits.empty())
      fail("the gradient of sigmoid score weights needs the call's logits: set BackwardArgs::logits");
    require_shape(a.logits, "logits", m, n);
  }
}

// The error for a non-finite logit found at (i, j).
template <class V>
[[noreturn]] void fail_non_finite_logit(index_t i, index_t j, V value) {
  fail("invalid ", Indexed{"logits", i, j}, " = ", value, ": logits must be finite");
}

// The error for the first invalid assignment (i, r) a backward scan found: its expert, weight or gradient.
template <class V>
[[noreturn]] void fail_bad_assignment(index_t i, index_t r, std::int32_t expert, index_t n, V weight, V grad) {
  require(expert >= 0 && expert < n, Indexed{"experts", i, r}, expert, "must be in [0, ", n, ")");
  require(math::is_finite(weight), Indexed{"weights", i, r}, weight, "must be finite");
  fail("invalid ", Indexed{"grad_weights", i, r}, " = ", grad, ": must be finite");
}

}  // namespace detail
}  // namespace ssr
