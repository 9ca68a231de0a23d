// What the property tests share: the backend under test, a Router that takes host buffers on every
// backend (on the GPU it mirrors them in device memory), owned outputs of one call, and random logits.
// The same test sources build against the CPU backend (ssr_tests), the Thrust backend on Thrust's OMP
// system (ssr_thrust_tests, SSR_TEST_THRUST) and the CUDA backend (ssr_cuda_tests, SSR_TEST_CUDA).
#pragma once

#include <ssr/backend/cpu.hpp>
#include <ssr/router.hpp>
#ifdef SSR_TEST_THRUST
#include <omp.h>
#include <ssr/backend/thrust.hpp>
#endif
#ifdef SSR_TEST_CUDA
#include <ssr/cuda/backend.cuh>

#include "support_cuda.hpp"
#endif

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace test {

// The backend the property tests run on.
#if defined(SSR_TEST_CUDA)
template <class T>
using Backend = ssr::CudaBackend<T>;
template <class T>
Backend<T> make_backend(int) {  // one GPU: no thread count
  return {};
}
constexpr const char* backend_name = "cuda";
#elif defined(SSR_TEST_THRUST)
template <class T>
using Backend = ssr::ThrustBackend<T>;
template <class T>
Backend<T> make_backend(int threads) {
  if (threads > 0) omp_set_num_threads(threads);  // Thrust's OMP system uses OpenMP's default team
  return {};
}
constexpr const char* backend_name = "thrust-omp";
#else
template <class T>
using Backend = ssr::CpuBackend<T>;
template <class T>
Backend<T> make_backend(int threads) {
  return Backend<T>(threads);
}
constexpr const char* backend_name = "cpu";
#endif

// Whether AddressSanitizer instruments this program (GCC's macro, Clang's feature test): the longest
// sweeps then take a sample of their points.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool sanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool sanitized = true;
#else
constexpr bool sanitized = false;
#endif
#else
constexpr bool sanitized = false;
#endif

// Views of host memory as the backend under test reads them: the views themselves on host backends.
#if !defined(SSR_TEST_CUDA)
template <class V>
struct Mirror {
  ssr::MatrixView<V> host;
  explicit Mirror(ssr::MatrixView<V> h) : host(h) {}
  explicit Mirror(ssr::VectorView<V> h) : host(h.data, 1, h.size) {}
  ssr::MatrixView<V> view() const { return host; }
  ssr::VectorView<V> vector() const { return {host.data, host.cols}; }
  void download() const {}
};
#endif

// Bytes of the backend's memory, e.g. a caller workspace; read() copies them to the host.
#if !defined(SSR_TEST_CUDA)
class Bytes {
 public:
  Bytes(std::size_t size, unsigned char fill) : bytes_(size, fill) {}
  void* data() { return bytes_.data(); }
  std::vector<unsigned char> read() const { return bytes_; }

 private:
  std::vector<unsigned char> bytes_;
};
#endif

// Runs f when the scope ends, also by an exception.
template <class F>
struct OnExit {
  F f;
  ~OnExit() { f(); }
};
template <class F>
OnExit(F) -> OnExit<F>;

// ssr::Router<Policy, Backend<T>> taking host buffers: on the GPU, each call copies its inputs and
// outputs to device memory, waits for its results and copies the outputs back (also when it throws, so a
// test sees exactly what the call wrote).
template <class Policy, class T>
class Router {
 public:
  using Inner = ssr::Router<Policy, Backend<T>>;
  using options_type = typename Inner::options_type;

  explicit Router(Policy policy = {}, int threads = 0) : inner_(policy, make_backend<T>(threads)) {}

  Inner& inner() { return inner_; }
  Backend<T>& backend() { return inner_.backend(); }
  ssr::RouteSpec resolve(const ssr::Context& ctx) const { return inner_.resolve(ctx); }

  ssr::RouteInfo route(ssr::ConstMatrixView<T> logits, const ssr::Context& ctx, const ssr::RouteOutputs<T>& out,
                       options_type options = {}) {
    const Mirror<const T> s(logits);
    const Mirror<const float> bias(ctx.expert_bias);
    const Mirror<std::int32_t> experts(out.experts), load(out.load);
    const Mirror<T> weights(out.weights), plan(out.plan), noise(out.noise);
    const OnExit back{[&] {
      experts.download();
      load.download();
      weights.download();
      plan.download();
      noise.download();
    }};
    options.wait = true;
    return inner_.route(s.view(), ctx.with_bias(bias.vector()), {experts.view(), weights.view(), load.vector(), plan.view(), noise.view()}, options);
  }

  void backward(const ssr::RouteInfo& info, const ssr::BackwardArgs<T>& a, options_type options = {}) {
    const Mirror<const std::int32_t> e(a.experts);
    const Mirror<const T> s(a.logits), w(a.weights), g(a.grad_weights);
    const Mirror<T> grad(a.grad_logits);
    const OnExit back{[&] { grad.download(); }};
    inner_.backward(info, {s.view(), e.view(), w.view(), g.view(), grad.view()}, options);
  }

 private:
  Inner inner_;
};

template <class T>
std::vector<T> random_logits(ssr::index_t m, ssr::index_t n, double scale, unsigned seed, double skew = 0) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal;
  std::vector<T> s(static_cast<std::size_t>(m * n));
  for (ssr::index_t i = 0; i < m; ++i)
    for (ssr::index_t j = 0; j < n; ++j)
      s[static_cast<std::size_t>(i * n + j)] =
          static_cast<T>(scale * (normal(gen) - skew * static_cast<double>(j) / static_cast<double>(n)));
  return s;
}

// The outputs of one call, owned.
template <class T>
struct Routed {
  ssr::index_t m = 0, n = 0, k = 0;
  std::vector<std::int32_t> experts, load;
  std::vector<T> weights, plan, noise;
  ssr::RouteInfo info;

  Routed(ssr::index_t m_, ssr::index_t n_, ssr::index_t k_)
      : m(m_), n(n_), k(k_), experts(static_cast<std::size_t>(m * k)), load(static_cast<std::size_t>(n)),
        weights(static_cast<std::size_t>(m * k)), plan(static_cast<std::size_t>(m * n), T(-1)),
        noise(static_cast<std::size_t>(m * n), T(-1)) {}

  ssr::RouteOutputs<T> outputs() {
    return {{experts.data(), m, k}, {weights.data(), m, k}, {load.data(), n}, {plan.data(), m, n}, {noise.data(), m, n}};
  }
  T plan_at(ssr::index_t i, ssr::index_t j) const { return plan[static_cast<std::size_t>(i * n + j)]; }
  std::int32_t expert(ssr::index_t i, ssr::index_t r) const { return experts[static_cast<std::size_t>(i * k + r)]; }
  T weight(ssr::index_t i, ssr::index_t r) const { return weights[static_cast<std::size_t>(i * k + r)]; }
};

// Two calls gave the same bits in every output and statistic.
template <class T>
void require_identical(const Routed<T>& a, const Routed<T>& b) {
  REQUIRE(a.experts == b.experts);
  REQUIRE(std::memcmp(a.weights.data(), b.weights.data(), a.weights.size() * sizeof(T)) == 0);
  REQUIRE(std::memcmp(a.plan.data(), b.plan.data(), a.plan.size() * sizeof(T)) == 0);
  REQUIRE(std::memcmp(a.noise.data(), b.noise.data(), a.noise.size() * sizeof(T)) == 0);
  REQUIRE(a.load == b.load);
  REQUIRE(a.info.iterations == b.info.iterations);
  REQUIRE(a.info.marginal_error == b.info.marginal_error);
}

template <class T, class Policy>
Routed<T> route(const Policy& policy, const std::vector<T>& s, ssr::index_t m, ssr::index_t n, const ssr::Context& ctx,
                int threads = 0) {
  Router<Policy, T> router(policy, threads);
  Routed<T> out(m, n, router.resolve(ctx).k);
  out.info = router.route({s.data(), m, n}, ctx, out.outputs());
  return out;
}

// Requires grad[e] to match the central difference of loss() at every entry e of values (step 1e-6).
template <class Loss>
void require_central_differences(std::vector<double>& values, const std::vector<double>& grad, const Loss& loss,
                                 double margin) {
  const double h = 1e-6;
  for (std::size_t e = 0; e < values.size(); ++e) {
    const double keep = values[e];
    values[e] = keep + h;
    const double up = loss();
    values[e] = keep - h;
    const double down = loss();
    values[e] = keep;
    REQUIRE(grad[e] == Approx((up - down) / (2 * h)).margin(margin));
  }
}

// L(S) = sum_ir G_ir w_ir(S) for a fixed G: the dL/dS of backward (given the logits) against central
// differences at every element, for m random tokens over 8 experts, k = 2.
template <class Policy>
void check_weights_gradient(const Policy& policy, const ssr::Context& ctx, ssr::index_t m = 40) {
  const ssr::index_t n = 8, k = 2;
  auto s = random_logits<double>(m, n, 1.0, 31, 2.0);
  const auto g = random_logits<double>(m, k, 1.0, 32);
  Router<Policy, double> router(policy);
  Routed<double> r(m, n, k);
  const auto info = router.route({s.data(), m, n}, ctx, r.outputs());
  std::vector<double> grad(static_cast<std::size_t>(m * n));
  router.backward(
      info,
      {{s.data(), m, n}, {r.experts.data(), m, k}, {r.weights.data(), m, k}, {g.data(), m, k}, {grad.data(), m, n}});
  require_central_differences(s, grad, [&] {
    Routed<double> q(m, n, k);
    router.route({s.data(), m, n}, ctx, q.outputs());
    REQUIRE(q.experts == r.experts);  // the step is small enough not to change the selection
    double l = 0;
    for (std::size_t e = 0; e < g.size(); ++e) l += g[e] * q.weights[e];
    return l;
  }, 1e-7);
}

}  // namespace test
