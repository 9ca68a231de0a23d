// xtensor interop: containers and contiguous views route in place, without copies.
#include <catch2/catch.hpp>

#include <ssr/xtensor.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xstrided_view.hpp>
#include <xtensor/xtensor.hpp>
#include <xtensor/xview.hpp>

#include "support.hpp"

using ssr::Context;
using ssr::index_t;

TEST_CASE("xtensor containers and row-range views route in place", "[xtensor]") {
  const index_t m = 60, n = 8, k = 2;
  const auto raw = test::random_logits<float>(m, n, 1.0, 4, 2.0);
  xt::xtensor<float, 2> logits({std::size_t(m), std::size_t(n)});
  std::copy(raw.begin(), raw.end(), logits.begin());
  const auto expected = test::route(ssr::SinkhornTopK(k), raw, m, n, Context::train(0));

  ssr::Router<ssr::SinkhornTopK> router{ssr::SinkhornTopK(k)};
  xt::xtensor<std::int32_t, 2> experts({std::size_t(m), std::size_t(k)});
  xt::xarray<float> weights = xt::zeros<float>({std::size_t(m), std::size_t(k)});
  auto load = xt::xtensor<std::int32_t, 1>::from_shape({std::size_t(n)});
  const auto lv = ssr::view(logits);
  CHECK(lv.data == logits.data());  // no copy
  router.route(lv, Context::train(0), {ssr::view(experts), ssr::view(weights), ssr::vector_view(load)});
  CHECK(std::vector<std::int32_t>(experts.begin(), experts.end()) == expected.experts);
  CHECK(std::vector<float>(weights.begin(), weights.end()) == expected.weights);
  CHECK(std::vector<std::int32_t>(load.begin(), load.end()) == expected.load);

  // Rows 10..49 of a wider matrix, through xt::view and xt::strided_view: no copy, same routes as a copy.
  xt::xtensor<float, 2> wide = xt::zeros<float>({std::size_t(m), std::size_t(n + 4)});
  xt::view(wide, xt::all(), xt::range(0, n)) = logits;
  auto rows = xt::view(wide, xt::range(10, 50), xt::range(0, n));
  const auto rv = ssr::view(rows);
  CHECK(rv.data == wide.data() + 10 * (n + 4));
  CHECK(rv.stride == n + 4);
  const std::vector<float> sub(raw.begin() + 10 * n, raw.begin() + 50 * n);
  const auto expected_rows = test::route(ssr::SoftmaxTopK(k), sub, 40, n, Context::train(0));
  test::Routed<float> got(40, n, k);
  ssr::Router<ssr::SoftmaxTopK> soft{ssr::SoftmaxTopK(k)};
  soft.route(rv, Context::train(0), got.outputs());
  CHECK(got.experts == expected_rows.experts);
  CHECK(got.weights == expected_rows.weights);
  auto strided = xt::strided_view(wide, {xt::range(10, 50), xt::range(0, n)});
  CHECK(ssr::view(strided).data == rv.data);
}

TEST_CASE("column-major and non-2-d xtensor expressions are rejected", "[xtensor][errors]") {
  xt::xarray<float, xt::layout_type::column_major> cm = xt::zeros<float>({4, 3});
  CHECK_THROWS_WITH(ssr::view(cm), Catch::Matchers::Contains("row-major"));
  auto flat = xt::xtensor<float, 1>::from_shape({5});
  CHECK_THROWS_WITH(ssr::view(flat), Catch::Matchers::Contains("1 dimensions, expected 2"));
  xt::xtensor<float, 2> m({6, 4});
  auto every_other = xt::view(m, xt::all(), xt::range(0, 4, 2));
  CHECK_THROWS_WITH(ssr::view(every_other), Catch::Matchers::Contains("unit inner stride"));
}
