// Bit-identical results across thread counts, caller alignment and row strides (repeated calls: test_workspace).
#include <catch2/catch.hpp>

#include <cstring>
#include <utility>
#include <vector>

#include "support.hpp"

using ssr::Context;
using ssr::Cost;
using ssr::index_t;

TEMPLATE_TEST_CASE("1, 2 and 3 threads give identical bits", "[determinism]", float, double) {
  // Large enough that every path takes a team (CpuTuning), with a last, partial tile of rows. At n = 100 one
  // thread walks the Sinkhorn passes forward only, two or three walk their shares forward and backward in
  // turn (CpuTuning::alternate_max_bytes), and at n = 8 and 16 all do.
  const index_t m = 20011, n = GENERATE(8, 16, 100);
  const auto s = test::random_logits<TestType>(m, n, 2.0, 77, 3.0);
  const auto ssr_policy = ssr::make_ssr(2, Cost::softmax, 1.0, {0.1, 1e-6, 60}, 0.2, 1.0);
  const auto one = test::route(ssr_policy, s, m, n, Context::train(9, 1, 5), 1);
  REQUIRE(one.info.path == ssr::Path::sinkhorn);
  test::require_identical(one, test::route(ssr_policy, s, m, n, Context::train(9, 1, 5), 2));
  test::require_identical(one, test::route(ssr_policy, s, m, n, Context::train(9, 1, 5), 3));
  const ssr::SoftmaxTopK plain(2);
  test::require_identical(test::route(plain, s, m, n, Context::train(9), 1), test::route(plain, s, m, n, Context::train(9), 3));
  const ssr::NoisyCost<ssr::SoftmaxTopK> noisy(ssr::SoftmaxTopK(2), 1.0, 1.0);
  test::require_identical(test::route(noisy, s, m, n, Context::train(9), 1), test::route(noisy, s, m, n, Context::train(9), 3));
}

namespace {

// Routes on `threads` threads and maps a varying dL/dw back: the outputs and dL/dS.
template <class T, class Policy>
std::pair<test::Routed<T>, std::vector<T>> route_and_backward(const Policy& policy, const std::vector<T>& s, index_t m,
                                                              index_t n, const Context& ctx, int threads) {
  test::Router<Policy, T> router(policy, threads);
  test::Routed<T> r(m, n, router.resolve(ctx).k);
  r.info = router.route({s.data(), m, n}, ctx, r.outputs());
  const auto g = test::random_logits<T>(m, r.k, 1.0, 99);
  std::vector<T> grad(static_cast<std::size_t>(m * n));
  router.backward(r.info, {{s.data(), m, n},
                           {r.experts.data(), m, r.k},
                           {r.weights.data(), m, r.k},
                           {g.data(), m, r.k},
                           {grad.data(), m, n}});
  return {std::move(r), std::move(grad)};
}

template <class T, class Policy>
void require_same_on_threads(const Policy& policy, const std::vector<T>& s, index_t m, index_t n, const Context& ctx) {
  const auto one = route_and_backward(policy, s, m, n, ctx, 1);
  for (int threads : {2, 3}) {
    INFO("threads " << threads);
    const auto more = route_and_backward(policy, s, m, n, ctx, threads);
    test::require_identical(one.first, more.first);
    REQUIRE(std::memcmp(one.second.data(), more.second.data(), one.second.size() * sizeof(T)) == 0);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("every rule gives the same outputs and dL/dS bits on 1, 2 and 3 threads", "[determinism]", float,
                   double) {
  using T = TestType;
  const index_t m = 20011, n = GENERATE(16, 64);
  const auto s = test::random_logits<T>(m, n, 2.0, 78, 3.0);
  const auto bias = test::random_logits<float>(1, n, 0.1, 79);
  const Context ctx = Context::train(4, 2, 6);
  INFO("n " << n);
  SECTION("Sinkhorn, linear cost, score weights, k = 3") {
    require_same_on_threads(ssr::SinkhornTopK(3, Cost::linear, {0.5, 1e-6, 50}, ssr::Weights::scores), s, m, n, ctx);
  }
  SECTION("Sinkhorn, linear cost, plan weights, k = 5, small xi") {
    require_same_on_threads(ssr::SinkhornTopK(5, Cost::linear, {0.05, 1e-6, 50}), s, m, n, ctx);
  }
  SECTION("noisy Sinkhorn, softmax cost, score weights, sigmoid scores") {
    require_same_on_threads(ssr::NoisyCost<ssr::SinkhornTopK>(
                                ssr::SinkhornTopK(4, Cost::softmax, {0.5, 1e-6, 50}, ssr::Weights::scores,
                                                  {ssr::Score::sigmoid, 1, 1}),
                                0.3, 1.0),
                            s, m, n, ctx);
  }
  SECTION("softmax top-k, k = 3 and 9") {
    require_same_on_threads(ssr::SoftmaxTopK(3), s, m, n, ctx);
    require_same_on_threads(ssr::SoftmaxTopK(9), s, m, n, ctx);
  }
  SECTION("sigmoid scores, groups and an expert bias") {
    require_same_on_threads(ssr::SoftmaxTopK(4, Cost::linear, {ssr::Score::sigmoid, 4, 2}), s, m, n,
                            ctx.with_bias({bias.data(), n}));
  }
  SECTION("noisy softmax top-k, softmax cost") {
    require_same_on_threads(ssr::NoisyCost<ssr::SoftmaxTopK>(ssr::SoftmaxTopK(3, Cost::softmax), 0.5, 1.0), s, m, n,
                            ctx);
  }
}

TEST_CASE("results do not depend on the alignment or row stride of the caller's buffers", "[determinism]") {
  const index_t m = 777, n = 16, stride = 21;
  const auto s = test::random_logits<float>(m, n, 1.0, 5);
  std::vector<float> strided(m * stride + 1, 1e30f);
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) strided[1 + i * stride + j] = s[i * n + j];  // off by one float: misaligned
  const auto policy = ssr::make_ssr(2, Cost::linear, 1.0, {}, 0.1, 1.0);
  const auto a = test::route(policy, s, m, n, Context::train(1));
  test::Router<ssr::SSRPolicy, float> router(policy);
  test::Routed<float> b(m, n, 2);
  b.info = router.route({strided.data() + 1, m, n, stride}, Context::train(1), b.outputs());
  test::require_identical(a, b);
}
