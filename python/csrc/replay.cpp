// torch.ops.ssr.replay_weights: the score weights of given experts (recorded by an earlier call) from the
// current logits, by math::score_weights, the formula the softmax path's weights come from on every
// backend, so that a replayed call gives the recorded call's bits; its gradient is route_backward's for
// score weights. The schema, the CPU kernel and the autograd kernel (the CUDA kernel: replay_cuda.cu).
#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/library.h>
#include <torch/torch.h>
#include <ssr/backend/cpu.hpp>
#include <ssr/detail/scalar.hpp>
#include <ssr/math/weights.hpp>
#include <ssr/named.hpp>
#include <ssr/spec.hpp>

#include <cstdint>
#include <string>

#include "args.hpp"

namespace ssr_torch {
namespace {

using torch::Tensor;

template <class T, class In, class Index>
void replay_rows(const In* s, const Index* e, T* w, int64_t m, int64_t n, int64_t k, ssr::Score score) {
  at::parallel_for(0, m, 2048, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const In* row = s + i * n;
      const Index* chosen = e + i * k;
      T* out = w + i * k;
      ssr::math::score_weights(
          score, static_cast<int>(k), [&](int r) { return ssr::detail::to_double(row[chosen[r]]); },
          [out](int r, double v) { out[r] = static_cast<T>(v); });
    }
  });
}

Tensor replay_weights_cpu(const Tensor& logits, const Tensor& experts, std::string score) {
  TORCH_CHECK(logits.dim() == 2 && experts.dim() == 2 && experts.size(0) == logits.size(0),
              "ssr.replay_weights: logits (tokens x experts) and experts (tokens x k) must be 2-d with the same "
              "tokens, got ",
              logits.sizes(), " and ", experts.sizes());
  TORCH_CHECK(logits.scalar_type() == torch::kFloat32 || logits.scalar_type() == torch::kFloat64,
              "ssr.replay_weights: logits on the CPU must be float32 or float64, got ", logits.scalar_type());
  TORCH_CHECK(experts.scalar_type() == torch::kInt32 || experts.scalar_type() == torch::kInt64,
              "ssr.replay_weights: experts must be int32 or int64, got ", experts.scalar_type());
  const int64_t m = logits.size(0), n = logits.size(1), k = experts.size(1);
  TORCH_CHECK(k >= 1 && k <= n, "ssr.replay_weights: k = ", k, " experts a token, of ", n);
  const Tensor s = logits.contiguous(), e = experts.contiguous();
  check_experts_in_range(e, n, "ssr.replay_weights");
  ssr::Score route_score{};
  try {
    route_score = ssr::parse_score(score);
    // The CPU backend's scan, as a routing call's: a replayed call rejects what the recorded one would have.
    if (m > 0)
      AT_DISPATCH_FLOATING_TYPES(s.scalar_type(), "ssr.replay_weights", [&] {
        ssr::CpuBackend<scalar_t>(at::get_num_threads()).check_finite({s.data_ptr<scalar_t>(), m, n}, {});
      });
  } catch (const ssr::Error& err) {
    TORCH_CHECK(false, err.what());
  }
  Tensor w = torch::empty({m, k}, s.options());
  AT_DISPATCH_FLOATING_TYPES(s.scalar_type(), "ssr.replay_weights", [&] {
    if (e.scalar_type() == torch::kInt64) {
      replay_rows(s.data_ptr<scalar_t>(), e.data_ptr<int64_t>(), w.data_ptr<scalar_t>(), m, n, k, route_score);
    } else {
      replay_rows(s.data_ptr<scalar_t>(), e.data_ptr<int32_t>(), w.data_ptr<scalar_t>(), m, n, k, route_score);
    }
  });
  return w;
}

using ReplaySignature = Tensor(const Tensor&, const Tensor&, std::string);
using BackwardSignature = Tensor(const Tensor&, const Tensor&, const Tensor&, int64_t, bool,
                                 const c10::optional<Tensor>&, std::string, const c10::optional<Tensor>&);

// The weights pass the gradient of score weights to the logits, as the softmax path's do.
class ReplayWeights : public torch::autograd::Function<ReplayWeights> {
 public:
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& logits, const Tensor& experts,
                        std::string score) {
    static const auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("ssr::replay_weights", "").typed<ReplaySignature>();
    at::AutoDispatchBelowADInplaceOrView below;
    Tensor weights = op.call(logits, experts, score);
    ctx->save_for_backward({experts, weights, score == "sigmoid" ? logits : Tensor()});
    ctx->saved_data["n"] = logits.size(1);
    ctx->saved_data["score"] = score;
    ctx->saved_data["dtype"] = logits.scalar_type();
    return weights;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto route_backward =
        c10::Dispatcher::singleton().findSchemaOrThrow("ssr::route_backward", "").typed<BackwardSignature>();
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const Tensor &experts = saved[0], &weights = saved[1], &logits = saved[2];
    const Tensor grad_weights = grads[0].defined() ? grads[0] : torch::zeros_like(weights);
    // Clamped before narrowing, so that an int64 expert outside [0, n) stays outside it (a NaN row on a GPU).
    const int64_t n = ctx->saved_data["n"].toInt();
    const Tensor grad = route_backward.call(
        grad_weights, experts.clamp(-1, n).to(torch::kInt32), weights, n, true, c10::nullopt,
        ctx->saved_data["score"].toStringRef(), logits.defined() ? c10::optional<Tensor>(logits) : c10::nullopt);
    return {grad.to(ctx->saved_data["dtype"].toScalarType()), Tensor(), Tensor()};
  }
};

Tensor replay_weights_autograd(const Tensor& logits, const Tensor& experts, std::string score) {
  return ReplayWeights::apply(logits, experts, std::move(score));
}

}  // namespace
}  // namespace ssr_torch

TORCH_LIBRARY_FRAGMENT(ssr, m) {
  m.def("replay_weights(Tensor logits, Tensor experts, str score='softmax') -> Tensor");
}

TORCH_LIBRARY_IMPL(ssr, CPU, m) { m.impl("replay_weights", &ssr_torch::replay_weights_cpu); }

TORCH_LIBRARY_IMPL(ssr, Autograd, m) { m.impl("replay_weights", &ssr_torch::replay_weights_autograd); }
