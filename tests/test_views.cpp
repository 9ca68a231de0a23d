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

// Hidden (8.6 GB of logits; run with ssr_tests "[large]"): a call over more than 2^31 elements indexes in
// 64 bits. Rows far apart get the experts and weights of the same row routed alone.
TEST_CASE("a softmax route over more than 2^31 logits", "[.][large]") {
  const ssr::index_t n = 16, m = (ssr::index_t{1} << 27) + 3, k = 2;  // m * n = 2^31 + 48
  std::vector<float> s(static_cast<std::size_t>(m * n));
  for (std::size_t e = 0; e < s.size(); ++e) s[e] = static_cast<float>((e * 2654435761U) % 1000) / 100.0f;
  std::vector<std::int32_t> experts(static_cast<std::size_t>(m * k)), load(static_cast<std::size_t>(n));
  std::vector<float> weights(static_cast<std::size_t>(m * k));
  ssr::Router<ssr::SoftmaxTopK> router(ssr::SoftmaxTopK(static_cast<int>(k)));
  router.route({s.data(), m, n}, ssr::Context::eval(), {{experts.data(), m, k}, {weights.data(), m, k}, {load.data(), n}});
  std::int64_t total = 0;
  for (const auto c : load) total += c;
  CHECK(total == m * k);
  for (const ssr::index_t i : {ssr::index_t{0}, ssr::index_t{1} << 26, m - 1}) {
    std::int32_t e[2];
    float w[2];
    router.route({s.data() + i * n, 1, n}, ssr::Context::eval(), {{e, 1, k}, {w, 1, k}});
    INFO("row " << i);
    CHECK(experts[static_cast<std::size_t>(i * k)] == e[0]);
    CHECK(experts[static_cast<std::size_t>(i * k + 1)] == e[1]);
    CHECK(weights[static_cast<std::size_t>(i * k)] == w[0]);
  }
}
