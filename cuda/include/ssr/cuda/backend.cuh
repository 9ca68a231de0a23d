// CudaBackend<T>: routing on an NVIDIA GPU. Views hold device pointers. A fused kernel takes softmax top-k
// where it ranks the logits (k <= CudaTuning::fused_max_k), the Sinkhorn iterations run in one cooperative
// kernel where the device holds its grid (sinkhorn.cuh), and the Thrust backend's algorithms take the rest
// (selection by scores, bias or groups, the Sinkhorn kernel and outputs, a distributed solve's steps, and
// the solve one launch a step where the device cannot hold the cooperative grid). Every kernel and copy of
// a call is ordered on CallOptions::stream. A call waits for the host only where asked (the finiteness
// check reads one flag back, off with check_finite = false; Router::wait or CallOptions::wait read the
// Sinkhorn path's statistics) and where the solve cannot decide on the device alone: across ranks, and in
// the one-launch-a-step solve outside stream capture. Workspace: the caller's, or the backend's own
// (buffer.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <thrust/system/cuda/execution_policy.h>

#include <cstdint>
#include <type_traits>

#include "ssr/backend/thrust/algorithms.hpp"
#include "ssr/call.hpp"
#include "ssr/context.hpp"
#include "ssr/cuda/buffer.cuh"
#include "ssr/cuda/check.cuh"
#include "ssr/cuda/device.cuh"
#include "ssr/cuda/load.cuh"
#include "ssr/cuda/scalar.cuh"
#include "ssr/cuda/scan.cuh"
#include "ssr/cuda/sinkhorn.cuh"
#include "ssr/cuda/softmax_topk.cuh"
#include "ssr/cuda/tuning.cuh"
#include "ssr/detail/workspace.hpp"
#include "ssr/math/sinkhorn.hpp"
#include "ssr/spec.hpp"
#include "ssr/validate.hpp"
#include "ssr/view.hpp"

namespace ssr {

template <class T>
class CudaBackend {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                "ssr::CudaBackend<T>: T must be float or double");

 public:
  using value_type = T;
  using stream_type = cudaStream_t;
  using options_type = CallOptions<cudaStream_t>;
  // The logits element types route reads: T, and for T = float also __half and __nv_bfloat16 (computing in float).
  template <class L>
  static constexpr bool reads_logits = std::is_same<L, T>::value ||
                                       (std::is_same<T, float>::value &&
                                        (std::is_same<L, __half>::value || std::is_same<L, __nv_bfloat16>::value));

  // Bytes of device workspace a call of this spec and shape uses, backward's included.
  std::size_t workspace_bytes(const RouteSpec& spec, index_t m, index_t n) const {
    detail::validate_sizes(m, n);  // a layout divides by n
    detail::Carve c;
    layout(c, spec, m, n);
    return c.bytes();
  }
  // Bytes of the backend's own workspace: it only grows, so same-shaped calls allocate once.
  std::size_t held_workspace_bytes() const { return own_.bytes(); }

  // Grows the backend's own workspace to what a call of this spec and shape needs, unless options bring
  // one, and the pinned memory of its read-backs: the Router does so among a distributed call's agreed checks.
  void reserve_workspace(const RouteSpec& spec, index_t m, index_t n, const options_type& options) {
    (void)detail::carve_workspace(options.workspace, workspace_bytes(spec, m, n), own_workspace(options.stream));
    (void)cuda::pinned_read_back_block();
  }

  // Throws ssr::Error naming the first non-finite logit in row-major order: one 8-byte read-back, which
  // waits for the stream.
  template <class In>
  void check_finite(ConstMatrixView<In> s, const options_type& options) {
    detail::Carve flag_only;
    flag_only.take<unsigned long long>(1);  // the first slot of every layout
    detail::Carve c = detail::carve_workspace(options.workspace, flag_only.bytes(), own_workspace(options.stream));
    cuda::check_finite(s, c.take<unsigned long long>(1), options.stream);
  }

  // Runs a resolved spec on options.stream; the Router checked the arguments (and their values, unless
  // told not to).
  template <class In>
  RouteInfo route(const RouteSpec& spec, const Context& ctx, ConstMatrixView<In> s, const RouteOutputs<T>& out,
                  const options_type& options) {
    static_assert(reads_logits<In>, "ssr::CudaBackend<T>: logits must be T, or __half or __nv_bfloat16 for T = float");
    namespace alg = thrust_algorithms;
    const index_t m = s.rows, n = s.cols, rows = math::problem_rows(spec, m);
    const cudaStream_t stream = options.stream;
    detail::Carve c = detail::carve_workspace(options.workspace, workspace_bytes(spec, m, n), own_workspace(stream));
    const Layout b = layout(c, spec, m, n);
    RouteInfo info = initial_info(spec);
    const auto exec = thrust::cuda::par_nosync.on(stream);
    if (m > 0 && spec.path == Path::softmax) {
      if (spec.k <= CudaTuning::fused_max_k && spec.plain_selection(ctx.expert_bias.data)) {
        cuda::softmax_topk(s, spec, ctx, out.experts, out.weights, out.noise, stream);
      } else {
        alg::softmax_topk(exec, spec, ctx, s, out);
      }
    } else if (spec.path == Path::sinkhorn && rows > 0) {  // a rank without rows still joins the reductions
      alg::sinkhorn_kernel(exec, spec, ctx, s, b.sinkhorn.logk, out.noise);
      if (!options.communicator && cuda::sinkhorn_solve(b.sinkhorn, m, n, spec.sinkhorn, stream)) {
        info.pending = &b.sinkhorn.state->stats;
      } else {  // one launch a step, the decision read back now and then (docs/distributed.md for ranks)
        const auto read = [stream](const thrust_kernels::SolveState* state) { return cuda::read_back(state, stream); };
        const int decide_every = cuda::capturing(stream) ? 0 : CudaTuning::steps_decide_every;
        const SolveStats stats = alg::sinkhorn_iterate(exec, b.sinkhorn, m, rows, n, spec.sinkhorn,
                                                       options.communicator, stream, decide_every, read);
        if (options.communicator || decide_every > 0) {
          info.set(stats);
        } else {
          info.pending = &b.sinkhorn.state->stats;
        }
      }
      alg::solved_rows(exec, spec, s, b.sinkhorn, out);
    }
    if (!out.load.empty()) {
      if (n <= CudaTuning::count_max_experts) {
        cuda::count_load(out.experts, out.load, stream);
      } else {
        alg::count_load(exec, out.experts, out.load, b.load_counts);
      }
    }
    cuda::check(cudaGetLastError(), "route");
    return info;
  }

  void backward(const RouteInfo& info, const BackwardArgs<T>& a, const options_type& options) {
    const cudaStream_t stream = options.stream;
    if (options.check_finite) {
      detail::Carve flag_only;
      flag_only.take<unsigned long long>(1);
      detail::Carve c = detail::carve_workspace(options.workspace, flag_only.bytes(), own_workspace(stream));
      cuda::check_backward(a.experts, a.weights, a.grad_weights, a.grad_logits.cols, c.take<unsigned long long>(1),
                           stream);
    }
    thrust_algorithms::backward(thrust::cuda::par_nosync.on(stream), info, a);
    cuda::check(cudaGetLastError(), "backward");
  }

  // Waits for the stream and reads the solve statistics of a call that returned without them.
  void wait(RouteInfo& info, const options_type& options) { info.set(cuda::read_back(info.pending, options.stream)); }

 private:
  struct Layout {
    unsigned long long* flag;                        // the checks' result (first, so every layout has it there)
    std::int32_t* load_counts;                       // n > count_max_experts: the Thrust load count's blocks
    thrust_algorithms::SinkhornBuffers<T> sinkhorn;  // the solve's, cooperative or one launch a step
  };

  static Layout layout(detail::Carve& c, const RouteSpec& spec, index_t m, index_t n) {
    Layout l{};
    l.flag = c.take<unsigned long long>(1);
    if (n > CudaTuning::count_max_experts) l.load_counts = thrust_algorithms::load_layout(c, m, n);
    if (spec.path == Path::sinkhorn) l.sinkhorn = thrust_algorithms::sinkhorn_layout<T>(c, m, n);
    return l;
  }

  auto own_workspace(cudaStream_t stream) {
    return [this, stream](std::size_t needed) { return own_.reserve(needed, stream); };
  }

  cuda::DeviceBuffer own_;
};

}  // namespace ssr
