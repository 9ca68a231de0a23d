// ThrustBackend<T>: routing on Thrust's device system. Views hold pointers into that system's memory.
// Built for the OMP or CPP system it runs on the CPU with g++ alone (how CI runs it); on the GPU use
// CudaBackend, which runs these same algorithms on the caller's stream beside its fused kernels.
//
// Each row (token) is one work item, running the scalar mathematics of ssr/math/ (rows.hpp); the Sinkhorn
// solve is the scaled form of math/sinkhorn_scaled.hpp with its sums in the same order, so the results are
// the CPU backend's bits and do not depend on how the system schedules work.
#pragma once

#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "ssr/backend/thrust/algorithms.hpp"
#include "ssr/call.hpp"
#include "ssr/detail/workspace.hpp"
#include "ssr/math/sinkhorn.hpp"
#include "ssr/spec.hpp"
#include "ssr/validate.hpp"
#include "ssr/view.hpp"

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#define SSR_THRUST_SYSTEM_NAMESPACE thrust_cuda
#elif THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_OMP
#define SSR_THRUST_SYSTEM_NAMESPACE thrust_omp
#elif THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_TBB
#define SSR_THRUST_SYSTEM_NAMESPACE thrust_tbb
#else
#define SSR_THRUST_SYSTEM_NAMESPACE thrust_cpp
#endif

namespace ssr {

// The backend's members and code depend on the Thrust device system a translation unit is compiled for,
// so each system gets its own (inline) namespace: one program may link a TU built for Thrust's OMP system
// with one built by nvcc for CUDA without the two ThrustBackend<T> colliding at link time.
inline namespace SSR_THRUST_SYSTEM_NAMESPACE {

template <class T>
class ThrustBackend {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                "ssr::ThrustBackend<T>: T must be float or double");

 public:
  using value_type = T;
  using stream_type = HostStream;
  using options_type = CallOptions<HostStream>;
  template <class L>
  static constexpr bool reads_logits = std::is_same<L, T>::value;

  // Bytes of workspace (memory of the device system) a call of this spec and shape uses.
  std::size_t workspace_bytes(const RouteSpec& spec, index_t m, index_t n) const {
    detail::validate_sizes(m, n);  // a layout divides by n
    detail::Carve c;
    layout(c, spec, m, n);
    return c.bytes();
  }
  // Bytes of the backend's own workspace: it only grows, so same-shaped calls allocate once.
  std::size_t held_workspace_bytes() const { return own_.size(); }

  // Grows the backend's own workspace to what a call of this spec and shape needs, unless options bring
  // one: the Router does so among a distributed call's agreed checks.
  void reserve_workspace(const RouteSpec& spec, index_t m, index_t n, const options_type& options) {
    (void)detail::carve_workspace(options.workspace, workspace_bytes(spec, m, n), own_workspace());
  }

  // Throws ssr::Error naming the first non-finite logit in row-major order.
  void check_finite(ConstMatrixView<T> s, const options_type& /*options*/) const {
    namespace alg = thrust_algorithms;
    const index_t first = alg::first_non_finite(thrust::device, s);
    if (first != std::numeric_limits<index_t>::max())
      detail::fail_non_finite_logit(first / s.cols, first % s.cols,
                                    alg::read_value(&s(first / s.cols, first % s.cols)));
  }

  // Runs a resolved spec; the Router checked the arguments (and their values, unless told not to).
  RouteInfo route(const RouteSpec& spec, const Context& ctx, ConstMatrixView<T> s, const RouteOutputs<T>& out,
                  const options_type& options) {
    namespace alg = thrust_algorithms;
    const index_t m = s.rows, n = s.cols, rows = math::problem_rows(spec, m);
    RouteInfo info = initial_info(spec);
    detail::Carve c = detail::carve_workspace(options.workspace, workspace_bytes(spec, m, n), own_workspace());
    const Layout b = layout(c, spec, m, n);
    if (m > 0 && spec.path == Path::softmax) {
      alg::softmax_topk(thrust::device, spec, ctx, s, out);
    } else if (spec.path == Path::sinkhorn && rows > 0) {  // a rank without rows still joins the reductions
      alg::sinkhorn_kernel(thrust::device, spec, ctx, s, b.sinkhorn.logk, out.noise);
      const auto read = [](const thrust_kernels::SolveState* state) { return alg::read_value(state); };
      info.set(alg::sinkhorn_iterate(thrust::device, b.sinkhorn, m, rows, n, spec.sinkhorn, options.communicator,
                                     HostStream{}, /*decide_every=*/1, read));
      alg::solved_rows(thrust::device, spec, s, b.sinkhorn, out);
    }
    if (!out.load.empty()) alg::count_load(thrust::device, out.experts, out.load, b.load_counts);
    return info;
  }

  void backward(const RouteInfo& info, const BackwardArgs<T>& a, const options_type& options) {
    namespace alg = thrust_algorithms;
    if (options.check_finite) {
      const index_t n = a.grad_logits.cols, k = a.experts.cols;
      const index_t first = alg::first_bad_assignment(thrust::device, a.experts, a.weights, a.grad_weights, n);
      if (first != std::numeric_limits<index_t>::max()) {
        const index_t i = first / k, r = first % k;
        detail::fail_bad_assignment(i, r, alg::read_value(&a.experts(i, r)), n, alg::read_value(&a.weights(i, r)),
                                    alg::read_value(&a.grad_weights(i, r)));
      }
    }
    alg::backward(thrust::device, info, a);
  }

  // Calls are complete when they return.
  void wait(RouteInfo& /*info*/, const options_type& /*options*/) {}

 private:
  struct Layout {
    std::int32_t* load_counts;
    thrust_algorithms::SinkhornBuffers<T> sinkhorn;
  };

  static Layout layout(detail::Carve& c, const RouteSpec& spec, index_t m, index_t n) {
    Layout l{};
    l.load_counts = thrust_algorithms::load_layout(c, m, n);
    if (spec.path == Path::sinkhorn) l.sinkhorn = thrust_algorithms::sinkhorn_layout<T>(c, m, n);
    return l;
  }

  // The backend's own workspace, grown to what a call needs.
  auto own_workspace() {
    return [this](std::size_t needed) -> void* {
      if (own_.size() < needed) own_.resize(needed);
      return thrust::raw_pointer_cast(own_.data());
    };
  }

  thrust::device_vector<unsigned char> own_;
};

}  // namespace SSR_THRUST_SYSTEM_NAMESPACE
}  // namespace ssr
