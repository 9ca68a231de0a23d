// The backend under test against the CPU backend, on a grid of shapes (built into the Thrust and CUDA
// test programs).
//
// The contract: every backend runs the same mathematics (ssr/math/) in the same order of operations, so on
// the host (Thrust's OMP and CPP systems) the experts, weights, noise, plan, load and solve statistics are
// the same bits as the CPU backend's, for a single token (whose uniform plan is an exact tie) too. On the
// GPU nvcc may fuse a product and a sum that the host keeps apart (-fmad), which moves a double or float
// value by an ulp; until a device run pins that down, the CUDA build of this test allows the values 4 ulps
// of T (the Sinkhorn potentials, which such an ulp moves further, 2e-6 and 1e-10) and the iterations one
// step, and still requires the same experts and load.
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

// How far a value may land from the CPU's: 0 on the host; on the GPU 4 ulps of T, or `solved` for values
// that come out of a Sinkhorn solve.
template <class T>
double tolerance(double solved = 4 * static_cast<double>(std::numeric_limits<T>::epsilon())) {
#ifdef SSR_TEST_CUDA
  return solved;
#else
  (void)solved;
  return 0;
#endif
}

template <class T>
double solve_tolerance() {
  return tolerance<T>(std::is_same<T, float>::value ? 2e-6 : 1e-10);
}

int iteration_tolerance() {
#ifdef SSR_TEST_CUDA
  return 1;
#else
  return 0;
#endif
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
            REQUIRE(largest_difference(a.weights, b.weights) <= tolerance<TestType>());
            REQUIRE(largest_difference(a.noise, b.noise) <= tolerance<TestType>());
            REQUIRE(a.load == b.load);
          }

          for (auto weights : {ssr::Weights::plan, ssr::Weights::scores}) {
            const ssr::NoisyCost<ssr::SinkhornTopK> sink(
                ssr::SinkhornTopK(std::min<int>(2, static_cast<int>(n)), cost, {0.5, 1e-6, 100}, weights), alpha, 1.0);
            const auto c = route_cpu(sink, s, m, n, ctx), d = test::route(sink, s, m, n, ctx);
            REQUIRE(largest_difference(c.noise, d.noise) <= tolerance<TestType>());
            REQUIRE(largest_difference(c.plan, d.plan) <= solve_tolerance<TestType>());
            REQUIRE(std::abs(c.info.iterations - d.info.iterations) <= iteration_tolerance());
            REQUIRE(std::abs(c.info.marginal_error - d.info.marginal_error) <= solve_tolerance<TestType>());
            if (m == 1 && iteration_tolerance() > 0) continue;  // rounding may break the uniform plan's tie
            REQUIRE(c.experts == d.experts);
            REQUIRE(c.load == d.load);
            REQUIRE(c.info.converged == d.info.converged);
            REQUIRE(largest_difference(c.weights, d.weights) <= solve_tolerance<TestType>());
          }
        }
      }
    }
  }
}

TEST_CASE("wide rows route as on the CPU backend", "[agreement]") {
  // n beyond the CUDA backend's fused softmax's widest lanes and its shared-memory load count (8192).
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
    REQUIRE(largest_difference(c.weights, d.weights) <= solve_tolerance<float>());
    REQUIRE(largest_difference(c.plan, d.plan) <= solve_tolerance<float>());
    REQUIRE(std::abs(c.info.iterations - d.info.iterations) <= iteration_tolerance());
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
            REQUIRE(largest_difference(c.weights, d.weights) <= tolerance<TestType>());
            REQUIRE(c.load == d.load);
          }
        }
      }
    }
  }
}
