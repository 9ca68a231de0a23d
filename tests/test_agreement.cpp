// The backend under test against the CPU backend, on a grid of shapes (built into the Thrust and CUDA
// test programs).
//
// Stated tolerance: softmax top-k runs the same scalar mathematics on every backend (ssr/math/), in the
// same order of operations, so experts, weights, noise and load are identical bits. For Sinkhorn the costs
// and noise are identical bits, but the CPU iterates in scaled form with a vectorised exp in T while the
// Thrust and CUDA backends iterate in the log domain in double, adding the column sums in their own
// orders; the potentials agree to rounding, so on these random logits (no near-ties) the experts are
// identical and the weights and plans agree within 2e-6 (float) and 1e-10 (double) absolute. A single
// token is the exception: its plan must be uniform, an exact tie between all experts that rounding may
// break either way, so for m = 1 the Sinkhorn comparison checks the plan only.
#include <catch2/catch.hpp>

#include <cmath>
#include <type_traits>

#include "support.hpp"

using ssr::Context;
using ssr::Cost;
using ssr::index_t;

namespace {

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
          INFO(test::backend_name << ": m " << m << " n " << n << " cost " << ssr::to_string(cost) << " alpha " << alpha);

          for (int k : {1, 2, 10}) {
            if (k > n) continue;
            const ssr::NoisyCost<ssr::SoftmaxTopK> soft(ssr::SoftmaxTopK(k, cost), alpha, 1.0);
            const auto a = route_cpu(soft, s, m, n, ctx), b = test::route(soft, s, m, n, ctx);
            REQUIRE(a.experts == b.experts);
            REQUIRE(a.weights == b.weights);
            REQUIRE(a.noise == b.noise);
            REQUIRE(a.load == b.load);
          }

          for (auto weights : {ssr::Weights::plan, ssr::Weights::scores}) {
            const ssr::NoisyCost<ssr::SinkhornTopK> sink(
                ssr::SinkhornTopK(std::min<int>(2, static_cast<int>(n)), cost, {0.5, 1e-6, 100}, weights), alpha, 1.0);
            const auto c = route_cpu(sink, s, m, n, ctx), d = test::route(sink, s, m, n, ctx);
            REQUIRE(c.noise == d.noise);
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
