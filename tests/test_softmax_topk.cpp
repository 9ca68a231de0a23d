// Softmax top-k: the chosen experts, their order and ties, and the weights.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "support.hpp"

using ssr::Context;
using ssr::index_t;
using ssr::SoftmaxTopK;

TEST_CASE("softmax top-k picks the k largest logits, ties to the lower index", "[softmax]") {
  const index_t m = 2000, n = 12;
  const int k = GENERATE(1, 2, 5, 12);
  // Small integers: many ties.
  std::mt19937 gen(1);
  std::uniform_int_distribution<int> d(0, 4);
  std::vector<float> s(m * n);
  for (auto& v : s) v = static_cast<float>(d(gen));
  const auto r = test::route(SoftmaxTopK(k), s, m, n, Context::train(3));
  for (index_t i = 0; i < m; ++i) {
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return s[i * n + a] > s[i * n + b]; });
    for (int t = 0; t < k; ++t) REQUIRE(r.expert(i, t) == order[t]);
  }
}

TEST_CASE("softmax top-k weights are the softmax over the chosen experts", "[softmax]") {
  const index_t m = 500, n = 16, k = 3;
  const auto s = test::random_logits<double>(m, n, 3.0, 8);
  const auto r = test::route(SoftmaxTopK(k), s, m, n, Context::train(0));
  for (index_t i = 0; i < m; ++i) {
    double z = 0;
    for (int t = 0; t < k; ++t) z += std::exp(s[i * n + r.expert(i, t)]);
    for (int t = 0; t < k; ++t) REQUIRE(r.weight(i, t) == Approx(std::exp(s[i * n + r.expert(i, t)]) / z).epsilon(1e-13));
  }
  std::int64_t total = 0;
  for (auto l : r.load) total += l;
  CHECK(total == m * k);
}

TEST_CASE("without noise the cost transform does not change softmax top-k", "[softmax]") {
  const index_t m = 500, n = 16;
  const auto s = test::random_logits<float>(m, n, 2.0, 8);
  const auto a = test::route(SoftmaxTopK(2, ssr::Cost::linear), s, m, n, Context::train(0));
  const auto b = test::route(SoftmaxTopK(2, ssr::Cost::softmax), s, m, n, Context::train(0));
  CHECK(a.experts == b.experts);
  CHECK(a.weights == b.weights);
}

TEMPLATE_TEST_CASE("softmax top-k weights stay finite for extreme logits", "[softmax][numerics]", float, double) {
  const TestType big = std::numeric_limits<TestType>::max();
  const index_t m = 3, n = 3;
  std::vector<TestType> s = {big, -big, 0, -big, -big, -big, big, big, big};
  const auto r = test::route(SoftmaxTopK(2), s, m, n, Context::train(0));
  for (auto w : r.weights) REQUIRE(std::isfinite(w));
  CHECK(r.weight(0, 0) == 1);
  CHECK(r.weight(1, 0) == Approx(0.5));
  CHECK(r.expert(2, 0) == 0);
  CHECK(r.expert(2, 1) == 1);
}

TEST_CASE("the load counts each expert among the chosen, however skewed", "[softmax]") {
  const index_t n = GENERATE(3, 16, 17, 300);  // up to 16 tallied eight entries at once with AVX-512
  const index_t m = GENERATE(1, 7, 1001, 24577);  // the last: a team's threads count their own groups
  const int k = GENERATE(1, 2, 3);
  // Skewed: logits 20 apart from one expert to the next, so every token chooses the same k experts.
  const bool skewed = GENERATE(false, true);
  const auto s = test::random_logits<float>(m, n, 1.0, 5, skewed ? 20.0 * static_cast<double>(n) : 0.0);
  const auto r = test::route(SoftmaxTopK(k), s, m, n, Context::train(0));
  std::vector<std::int32_t> counted(static_cast<std::size_t>(n), 0);
  for (const auto e : r.experts) ++counted[static_cast<std::size_t>(e)];
  REQUIRE(r.load == counted);
  if (skewed)
    for (int t = 0; t < k; ++t) CHECK(r.load[static_cast<std::size_t>(t)] == m);
}

TEST_CASE("zero tokens route to nothing", "[softmax]") {
  test::Router<SoftmaxTopK, float> router(SoftmaxTopK(2));
  std::vector<std::int32_t> load(4, 7);
  const auto info = router.route({nullptr, 0, 4}, Context::train(0), {{nullptr, 0, 2}, {nullptr, 0, 2}, {load.data(), 4}});
  CHECK(info.path == ssr::Path::softmax);
  CHECK(load == std::vector<std::int32_t>(4, 0));
}
