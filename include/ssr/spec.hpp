// What one routing call computes, once a policy has resolved its choices for a context (RouteSpec), what
// it writes (RouteOutputs) and what it reports (RouteInfo). Policies produce specs; backends execute a
// spec with the call's Context (its random stream coordinates, rows and expert bias), which the spec does
// not repeat.
#pragma once

#include <cstdint>

#include "ssr/detail/hd.hpp"
#include "ssr/view.hpp"

namespace ssr {

// Cost transform c(S): linear C = S (SSR-L) or row softmax C_i = softmax(S_i) (SSR-S).
enum class Cost { linear, softmax };

// Which top-k ran: plain softmax top-k or Sinkhorn top-k.
enum class Path { softmax, sinkhorn };

// Where the Sinkhorn path takes its weights from: the transport plan (SSR) or the scores (S-BASE).
enum class Weights { plan, scores };

// The score function s(S): softmax over the row (today's routers) or an element-wise sigmoid
// (DeepSeek-V3). Score weights are s over the chosen experts divided by their sum.
enum class Score { softmax, sigmoid };

inline const char* to_string(Cost c) { return c == Cost::linear ? "linear" : "softmax"; }
inline const char* to_string(Path p) { return p == Path::softmax ? "softmax" : "sinkhorn"; }
inline const char* to_string(Weights w) { return w == Weights::plan ? "plan" : "scores"; }
inline const char* to_string(Score s) { return s == Score::softmax ? "softmax" : "sigmoid"; }

// How the softmax path selects experts. The default (softmax scores, one group) is top-k of the logits;
// otherwise by the biased scores s(S) + b, among the experts of the best topk_groups of n_groups equal
// consecutive groups. The bias itself comes with each call (Context::expert_bias).
struct Selection {
  Score score = Score::softmax;
  int n_groups = 1;     // experts in this many equal consecutive groups (1: no groups)
  int topk_groups = 1;  // keep the experts of this many best groups (= n_groups: every group)

  SSR_HD bool grouped() const { return topk_groups < n_groups; }
};

struct SinkhornParams {
  double xi = 0.5;      // entropic regularisation
  double tol = 1e-4;    // stop when the normalised L1 column error is below this
  int max_iters = 100;  // or after this many iterations
};

struct RouteSpec {
  Path path = Path::softmax;
  int k = 2;
  Cost cost = Cost::linear;
  double noise_alpha = 0;  // 0: no noise; else C~ = c(S) + alpha * eps, eps ~ N(0, sigma^2)
  double noise_sigma = 1;
  SinkhornParams sinkhorn;
  Weights weights = Weights::scores;  // the softmax path always uses scores
  Selection select{};                 // the score function everywhere; groups and bias: softmax path
  // Rows of the whole problem, over every rank that shares it: the plan's columns sum to total_rows / n.
  // 0: this call's rows (one process). Set by the Router once the ranks have agreed on it.
  std::int64_t total_rows = 0;

  SSR_HD bool noisy() const { return noise_alpha > 0; }
  // Selection by top-k of the logits (or of the noisy cost): softmax scores, no groups and, with the
  // call's expert bias (null: none), no bias.
  SSR_HD bool plain_selection(const float* bias) const {
    return bias == nullptr && select.score == Score::softmax && !select.grouped();
  }
};

// A Sinkhorn solve's statistics as a backend writes them, in its own memory (device memory on a GPU).
struct SolveStats {
  std::int32_t iterations = 0;
  std::int32_t converged = 1;
  double marginal_error = 0;
};

// What a routing call reports besides its outputs.
struct RouteInfo {
  Path path = Path::softmax;
  Weights weights = Weights::scores;  // plan weights pass no gradient to the logits
  Score score = Score::softmax;       // the score function of score weights (backward of sigmoid needs S)
  int iterations = 0;                 // Sinkhorn iterations (0 on the softmax path)
  double marginal_error = 0;          // final normalised L1 column error (0 on the softmax path)
  bool converged = true;              // marginal_error < tol within max_iters
  // Set when a GPU call returned before its solve statistics reached the host: they are being written
  // here (device memory, in the call's workspace), and Router::wait fills in the three fields above.
  // Valid until the next call that uses the same workspace (or the workspace is freed): wait before.
  const SolveStats* pending = nullptr;

  bool complete() const { return pending == nullptr; }
  void set(const SolveStats& s) {
    iterations = s.iterations;
    marginal_error = s.marginal_error;
    converged = s.converged != 0;
    pending = nullptr;
  }
};

// The info of a call before anything is solved: its path, and whether its weights pass gradient.
inline RouteInfo initial_info(const RouteSpec& spec) {
  RouteInfo info;
  info.path = spec.path;
  info.weights = spec.path == Path::sinkhorn ? spec.weights : Weights::scores;
  info.score = spec.select.score;
  return info;
}

// Caller-owned outputs of a routing call over m tokens, n experts, top-k.
template <class T>
struct RouteOutputs {
  MatrixView<std::int32_t> experts;    // m x k, per token by descending score; required
  MatrixView<T> weights;               // m x k, each row sums to 1; required
  VectorView<std::int32_t> load = {};  // n: tokens sent to each expert; optional
  MatrixView<T> plan = {};             // m x n transport plan, written when the Sinkhorn path runs; optional
  MatrixView<T> noise = {};            // m x n, the alpha * eps that was added (zeros if none); optional
};

// The views of a backward call over a routing call's m tokens, n experts, top-k: what the call read and
// wrote, the gradient of the loss with respect to its weights, and where dL/dS goes.
template <class T>
struct BackwardArgs {
  ConstMatrixView<T> logits = {};         // m x n, the call's; read for sigmoid score weights only (else empty)
  ConstMatrixView<std::int32_t> experts;  // m x k, the call's
  ConstMatrixView<T> weights;             // m x k, the call's
  ConstMatrixView<T> grad_weights;        // m x k: dL/dw
  MatrixView<T> grad_logits;              // m x n, written: dL/dS
};

}  // namespace ssr
