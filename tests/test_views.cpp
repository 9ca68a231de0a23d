// Eigen adaptors: routing an Eigen matrix, map or ref equals routing the raw buffer.
#include <catch2/catch.hpp>

#include <ssr/eigen.hpp>

#include "support.hpp"

using ssr::Context;
using RowMatrixf = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowMatrixi = Eigen::Matrix<std::int32_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

TEST_CASE("Eigen matrices, maps and refs route in place", "[views]") {
  const ssr::index_t m = 50, n = 8, k = 2;
  auto raw = test::random_logits<float>(m, n, 1.0, 12);
  const auto expected = test::route(ssr::SinkhornTopK(k), raw, m, n, Context::train(0));

  ssr::Router<ssr::SinkhornTopK> router{ssr::SinkhornTopK(k)};
  Eigen::Map<RowMatrixf> logits(raw.data(), m, n);
  RowMatrixi experts(m, k);
  RowMatrixf weights(m, k);
  Eigen::VectorXi load(n);
  router.route(ssr::view(logits), Context::train(0), {ssr::view(experts), ssr::view(weights), ssr::vector_view(load)});
  CHECK(std::vector<std::int32_t>(experts.data(), experts.data() + m * k) == expected.experts);
  CHECK(std::vector<float>(weights.data(), weights.data() + m * k) == expected.weights);
  CHECK(std::vector<std::int32_t>(load.data(), load.data() + n) == expected.load);

  // A block of a larger matrix, through Eigen::Ref with an outer stride.
  RowMatrixf big = RowMatrixf::Constant(m + 3, n + 5, 99.0f);
  big.block(2, 1, m, n) = logits;
  Eigen::Ref<const RowMatrixf, 0, Eigen::OuterStride<>> ref = big.block(2, 1, m, n);
  router.route(ssr::view(ref), Context::train(0), {ssr::view(experts), ssr::view(weights), ssr::vector_view(load)});
  CHECK(std::vector<std::int32_t>(experts.data(), experts.data() + m * k) == expected.experts);
  CHECK(std::vector<float>(weights.data(), weights.data() + m * k) == expected.weights);
}
