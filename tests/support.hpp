// Helpers shared by the tests: owned buffers for one routing call, and random logits.
#pragma once

#include <ssr/router.hpp>
#ifdef SSR_TEST_THRUST
#include <omp.h>
#include <ssr/backend/thrust.hpp>
#endif

#include <cstdint>
#include <random>
#include <vector>

namespace test {

// The backend the property tests run on: the CPU backend, or the Thrust backend (on Thrust's OMP
// system) in the executable built with SSR_TEST_THRUST.
#ifdef SSR_TEST_THRUST
template <class T>
using Backend = ssr::ThrustBackend<T>;
template <class T>
Backend<T> make_backend(int threads) {
  if (threads > 0) omp_set_num_threads(threads);  // Thrust's OMP system uses OpenMP's default team
  return {};
}
#else
template <class T>
using Backend = ssr::CpuBackend<T>;
template <class T>
Backend<T> make_backend(int threads) {
  return Backend<T>(threads);
}
#endif

template <class T>
std::vector<T> random_logits(ssr::index_t m, ssr::index_t n, double scale, unsigned seed, double skew = 0) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal;
  std::vector<T> s(static_cast<std::size_t>(m * n));
  for (ssr::index_t i = 0; i < m; ++i)
    for (ssr::index_t j = 0; j < n; ++j)
      s[static_cast<std::size_t>(i * n + j)] = static_cast<T>(scale * (normal(gen) - skew * static_cast<double>(j) / static_cast<double>(n)));
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

template <class T, class Policy>
Routed<T> route(const Policy& policy, const std::vector<T>& s, ssr::index_t m, ssr::index_t n, const ssr::Context& ctx,
                int threads = 0) {
  ssr::Router<Policy, Backend<T>> router(policy, make_backend<T>(threads));
  Routed<T> out(m, n, router.resolve(ctx).k);
  out.info = router.route({s.data(), m, n}, ctx, out.outputs());
  return out;
}

}  // namespace test
