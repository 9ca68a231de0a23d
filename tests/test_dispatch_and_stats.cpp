// Grouping assignments by expert (with capacity) and load statistics.
#include <catch2/catch.hpp>

#include <cmath>

#include "support.hpp"

using ssr::index_t;

TEST_CASE("group_by_expert lists every assignment under its expert, in token order", "[dispatch]") {
  const index_t m = 1000, n = 16, k = 2;
  const auto s = test::random_logits<float>(m, n, 1.0, 3, 2.0);
  const auto r = test::route(ssr::SoftmaxTopK(k), s, m, n, ssr::Context::train(0));
  std::vector<std::int32_t> offsets(n + 1), tokens(m * k), slots(m * k);
  const index_t dropped = ssr::group_by_expert({r.experts.data(), m, k}, n, {offsets.data(), n + 1}, {tokens.data(), m * k},
                                               {slots.data(), m * k});
  CHECK(dropped == 0);
  CHECK(offsets[0] == 0);
  CHECK(offsets[n] == m * k);
  for (index_t j = 0; j < n; ++j) {
    REQUIRE(offsets[j + 1] - offsets[j] == r.load[j]);
    for (index_t e = offsets[j]; e < offsets[j + 1]; ++e) {
      REQUIRE(r.expert(tokens[e], slots[e]) == j);
      if (e > offsets[j]) REQUIRE(tokens[e] > tokens[e - 1]);
    }
  }
}

TEST_CASE("a capacity keeps each expert's first tokens and drops the rest", "[dispatch]") {
  // Tokens 0..5, k = 1: experts 0 0 0 1 0 2.
  std::vector<std::int32_t> experts = {0, 0, 0, 1, 0, 2}, offsets(4), tokens(6, -1);
  const index_t cap = ssr::expert_capacity(1.0, 6, 1, 3);
  CHECK(cap == 2);
  const index_t dropped = ssr::group_by_expert({experts.data(), 6, 1}, 3, {offsets.data(), 4}, {tokens.data(), 6}, {}, cap);
  CHECK(dropped == 2);
  CHECK(offsets == std::vector<std::int32_t>{0, 2, 3, 4});
  CHECK(std::vector<std::int32_t>(tokens.begin(), tokens.begin() + 4) == std::vector<std::int32_t>{0, 1, 3, 5});
  CHECK_THROWS_WITH(ssr::expert_capacity(0.0, 6, 1, 3), Catch::Matchers::Contains("capacity_factor = 0"));
  experts[2] = 3;
  CHECK_THROWS_WITH(ssr::group_by_expert({experts.data(), 6, 1}, 3, {offsets.data(), 4}, {tokens.data(), 6}),
                    Catch::Matchers::Contains("experts(2, 0) = 3"));
}

TEST_CASE("load statistics", "[stats]") {
  std::vector<std::int32_t> balanced = {5, 5, 5, 5}, skewed = {20, 0, 0, 0}, some = {1, 2, 3, 0};
  const auto a = ssr::load_stats({balanced.data(), 4});
  CHECK(a.max_over_mean == 1.0);
  CHECK(a.cv == 0.0);
  CHECK(a.normalized_entropy == Approx(1.0));
  CHECK(a.empty_experts == 0);
  const auto b = ssr::load_stats({skewed.data(), 4});
  CHECK(b.max_over_mean == 4.0);
  CHECK(b.cv == Approx(std::sqrt(3.0)));
  CHECK(b.entropy == 0.0);
  CHECK(b.empty_experts == 3);
  const auto c = ssr::load_stats({some.data(), 4});
  CHECK(c.total == 6);
  CHECK(c.max_over_mean == Approx(2.0));
  CHECK(c.entropy == Approx(-(1 / 6.0 * std::log(1 / 6.0) + 2 / 6.0 * std::log(2 / 6.0) + 3 / 6.0 * std::log(3 / 6.0))));
  std::vector<std::int32_t> none = {0, 0};
  CHECK(ssr::load_stats({none.data(), 2}).empty_experts == 2);
  std::vector<std::int32_t> bad = {1, -1};
  CHECK_THROWS_WITH(ssr::load_stats({bad.data(), 2}), Catch::Matchers::Contains("load[1] = -1"));
}
