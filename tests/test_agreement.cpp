// The backend under test against the CPU backend, on a grid of shapes (built into the Thrust and CUDA
// test programs).
//
// Stated tolerance: softmax top-k runs the same scalar mathematics on every backend (ssr/math/, in double,
// in the same order of operations), except that the CPU backend takes the exp of plain softmax top-k's
// weights (k <= 8) for a tile of rows at once with its vector exp (cpu/simd.hpp, within 3 units in the
// last place of T). On the host (Thrust's OMP system) the experts, noise and load are identical bits. On
// the GPU, elementary functions the definitions take from the platform (sigmoid's exp, log-domain sums)
// come from CUDA's libdevice, whose results may differ from the host's libm in the last bit of a double:
// the experts and load are identical (no near-ties in these logits). The noise is math::normal_pair's on
// every backend (the same formula's bits by construction); the test still allows it 4 units in the last
// place, as it has not run on a GPU since. The weights agree within 4 units in the last place
// on every backend (4.8e-7 absolute for float values up to 1, 9e-16 for double). For Sinkhorn the costs and noise are
// those same values (the CPU's float kernel of the softmax cost without noise within (n + 8) 2^-24 / xi of them), but
// the CPU and the CUDA backend's fused solve iterate in scaled form in T (the CPU with a vectorised exp) while the
// Thrust algorithms iterate in the log domain in double, each adding the column sums in its own order; the potentials
// agree to rounding, so on these random logits the experts are identical and the weights and plans agree within 2e-6
// (float) and 1e-10 (double) absolute. A single token is the exception: its plan must be uniform, an exact tie between
// all experts that rounding may break either way, so for m = 1 the Sinkhorn comparison checks the plan only.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "support.hpp"

using ssr::Context;
using ssr::Cost;
using ssr::index_t;

namespace {

// Largest difference between two backends' values, relative to max(1, |value|).
template <class T>
double largest_difference(const std::vector<T>& a, const std::vector<T>& b) {
  double worst = 0;
  for (std::size_t e = 0; e < a.size(); ++e)
    worst = std::max(worst, std::abs(static_cast<double>(a[e]) - static_cast<double>(b[e])) /
                                std::max(1.0, std::abs(static_cast<double>(a[e]))));
  return worst;
}

// How far the same double computation may land from the CPU's: 0 on the host, 4 ulps of T on the GPU.
template <class T>
double libm_tolerance() {
#ifdef SSR_TEST_CUDA
  return 4 * static_cast<double>(std::numeric_limits<T>::epsilon());
#else
  return 0;
#endif
}

// How far softmax top-k's weights may land from the CPU's: 4 ulps of T on every backend.
template <class T>
double weights_tolerance() {
  return 4 * static_cast<double>(std::numeric_limits<T>::epsilon());
}

template <class T, class Policy>
test::Routed<T> route_cpu(const Policy& policy, const std::vector<T>& s, index_t m, index_t n, const Context& ctx) {
  test::Routed<T> out(m, n, policy.resolve(ctx).k);
  ssr::Router<Policy, ssr::CpuBackend<T>> router(policy);
  out.info = router.route({s.data(), m, n}, ctx, out.outputs());
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE("the backend routes as the CPU backend", "[agreement]", float, double) {
  const double tol = std::is_same<TestType, float>::value ? 2e-6 : 1e-10;
  for (index_t m : {1, 7, 1000, 5003}) {
    for (index_t n : {2, 8, 16, 100}) {
      for (Cost cost : {Cost::linear, Cost::softmax}) {
        for (double alpha : {0.0, 0.3}) {
          const auto s = test::random_logits<TestType>(m, n, 2.0, static_cast<unsigned>(m * 131 + n), 3.0);
          const Context ctx = Context::train(5, 1, 9);
          INFO(test::backend_name << ": m " << m << " n " << n << " cost " << ssr::to_string(cost) << " alpha "
                                  << alpha);

          for (int k : {1, 2, 10}) {
            if (k > n) continue;
            const ssr::NoisyCost<ssr::SoftmaxTopK> soft(ssr::SoftmaxTopK(k, cost), alpha, 1.0);
            const auto a = route_cpu(soft, s, m, n, ctx), b = test::route(soft, s, m, n, ctx);
            REQUIRE(a.experts == b.experts);
            REQUIRE(largest_difference(a.weights, b.weights) <= weights_tolerance<TestType>());
            REQUIRE(largest_difference(a.noise, b.noise) <= libm_tolerance<TestType>());
            REQUIRE(a.load == b.load);
          }

          for (auto weights : {ssr::Weights::plan, ssr::Weights::scores}) {
            const ssr::NoisyCost<ssr::SinkhornTopK> sink(
                ssr::SinkhornTopK(std::min<int>(2, static_cast<int>(n)), cost, {0.5, 1e-6, 100}, weights), alpha, 1.0);
            const auto c = route_cpu(sink, s, m, n, ctx), d = test::route(sink, s, m, n, ctx);
            REQUIRE(largest_difference(c.noise, d.noise) <= libm_tolerance<TestType>());
            for (std::size_t e = 0; e < c.plan.size(); ++e) REQUIRE(std::abs(c.plan[e] - d.plan[e]) <= tol);
            if (m == 1) continue;
            REQUIRE(c.experts == d.experts);
            REQUIRE(c.load == d.load);
            REQUIRE(c.info.converged == d.info.converged);
            REQUIRE(std::abs(c.info.iterations - d.info.iterations) <= 1);
            for (std::size_t e = 0; e < c.weights.size(); ++e) REQUIRE(std::abs(c.weights[e] - d.weights[e]) <= tol);
          }
        }
      }
    }
  }
}

TEST_CASE("wide rows route as on the CPU backend", "[agreement]") {
  // n beyond the CUDA backend's fused Sinkhorn (608) and shared-memory load count (8192): its Thrust paths.
  for (const auto& shape : {std::pair<index_t, index_t>{300, 800}, {60, 9000}}) {
    const index_t m = shape.first, n = shape.second;
    const auto s = test::random_logits<float>(m, n, 2.0, 17, 3.0);
    const Context ctx = Context::train(1, 0, 3);
    INFO(test::backend_name << ": m " << m << " n " << n);
    const ssr::NoisyCost<ssr::SoftmaxTopK> soft(ssr::SoftmaxTopK(2), 0.3, 1.0);
    const auto a = route_cpu(soft, s, m, n, ctx), b = test::route(soft, s, m, n, ctx);
    REQUIRE(a.experts == b.experts);
    REQUIRE(a.load == b.load);
    if (n > 1000) continue;
    const ssr::SinkhornTopK sink(2, Cost::linear, {0.5, 1e-6, 100});
    const auto c = route_cpu(sink, s, m, n, ctx), d = test::route(sink, s, m, n, ctx);
    REQUIRE(c.experts == d.experts);
    REQUIRE(c.load == d.load);
    REQUIRE(largest_difference(c.weights, d.weights) <= 2e-6);
    REQUIRE(std::abs(c.info.iterations - d.info.iterations) <= 1);
  }
}

TEMPLATE_TEST_CASE("selections by scores, bias and groups route as on the CPU backend", "[agreement][selection]", float,
                   double) {
  for (index_t m : {1, 1000, 5003}) {
    for (index_t n : {8, 64, 256}) {
      const auto s = test::random_logits<TestType>(m, n, 2.0, static_cast<unsigned>(m * 7 + n), 1.0);
      const auto b = test::random_logits<float>(1, n, 0.05, static_cast<unsigned>(n));
      for (ssr::Score score : {ssr::Score::softmax, ssr::Score::sigmoid}) {
        for (int groups : {1, 4, 8}) {
          const int kept = groups == 1 ? 1 : groups / 2, k = std::min<int>(8, kept * static_cast<int>(n) / groups);
          INFO(test::backend_name << ": m " << m << " n " << n << " score " << ssr::to_string(score) << " groups "
                                  << groups << " k " << k);
          const ssr::SoftmaxTopK policy(k, Cost::linear, {score, groups, kept});
          for (const Context& ctx : {Context::eval(), Context::eval().with_bias({b.data(), n})}) {
            const auto c = route_cpu(policy, s, m, n, ctx), d = test::route(policy, s, m, n, ctx);
            REQUIRE(c.experts == d.experts);
            REQUIRE(largest_difference(c.weights, d.weights) <= weights_tolerance<TestType>());
            REQUIRE(c.load == d.load);
          }
        }
      }
    }
  }
}
