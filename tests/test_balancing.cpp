// Balancing outside the router: the balancing losses for both score functions (Switch/GShard, global
// batch, per sequence) and their gradients, and the expert-bias update.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "support.hpp"

using ssr::Context;
using ssr::index_t;
using ssr::Score;

TEST_CASE("balancing losses: gradients match finite differences for both score functions", "[losses]") {
  const index_t m = 24, n = 6, k = 2, seq = 8;
  const Score score = GENERATE(Score::softmax, Score::sigmoid);
  auto s = test::random_logits<double>(m, n, 1.5, 51, 2.0);
  const auto r = test::route(ssr::SoftmaxTopK(k, ssr::Cost::linear, {score, 1, 1}), s, m, n, Context::eval());
  const ssr::ConstMatrixView<std::int32_t> experts(r.experts.data(), m, k);
  const ssr::ConstMatrixView<double> logits(s.data(), m, n);
  // Counts of a batch of which these tokens are a part.
  const std::vector<std::int64_t> counts = {30, 10, 25, 5, 12, 18};
  const std::int64_t tokens = 50;

  std::vector<double> grad(m * n);
  ssr::load_balancing_loss(logits, experts, ssr::MatrixView<double>(grad.data(), m, n), score);
  test::require_central_differences(s, grad, [&] { return ssr::load_balancing_loss(logits, experts, {}, score); }, 1e-8);

  ssr::global_load_balancing_loss(logits, ssr::VectorView<const std::int64_t>(counts.data(), n), tokens, k,
                                  ssr::MatrixView<double>(grad.data(), m, n), score);
  test::require_central_differences(s, grad, [&] {
    return ssr::global_load_balancing_loss(logits, ssr::VectorView<const std::int64_t>(counts.data(), n), tokens, k,
                                           {}, score);
  }, 1e-8);

  ssr::sequence_balance_loss(logits, experts, seq, 0.3, ssr::MatrixView<double>(grad.data(), m, n), score);
  test::require_central_differences(s, grad, [&] { return ssr::sequence_balance_loss(logits, experts, seq, 0.3, {}, score); }, 1e-8);
}

TEST_CASE("balancing losses agree where their definitions meet", "[losses]") {
  const index_t m = 24, n = 6, k = 2, seq = 6;
  const Score score = GENERATE(Score::softmax, Score::sigmoid);
  const auto s = test::random_logits<double>(m, n, 1.5, 52, 2.0);
  const auto r = test::route(ssr::SoftmaxTopK(k), s, m, n, Context::eval());
  const ssr::ConstMatrixView<std::int32_t> experts(r.experts.data(), m, k);
  const ssr::ConstMatrixView<double> logits(s.data(), m, n);
  const double lb = ssr::load_balancing_loss(logits, experts, {}, score);
  // The global-batch loss over this batch alone is the batch loss.
  std::vector<std::int64_t> counts(r.load.begin(), r.load.end());
  CHECK(ssr::global_load_balancing_loss(logits, ssr::VectorView<const std::int64_t>(counts.data(), n), m, k, {},
                                        score) == Approx(lb).epsilon(1e-14));
  // One sequence: alpha times the batch loss; several: the mean of each sequence's.
  CHECK(ssr::sequence_balance_loss(logits, experts, m, 0.5, {}, score) == Approx(0.5 * lb).epsilon(1e-14));
  double mean = 0;
  for (index_t q = 0; q < m / seq; ++q)
    mean += ssr::sequence_balance_loss(ssr::ConstMatrixView<double>(s.data() + q * seq * n, seq, n),
                                       ssr::ConstMatrixView<std::int32_t>(r.experts.data() + q * seq * k, seq, k), seq,
                                       0.5, {}, score);
  CHECK(ssr::sequence_balance_loss(logits, experts, seq, 0.5, {}, score) == Approx(mean / (m / seq)).epsilon(1e-14));
  // Sigmoid scores normalise to a distribution: uniform logits give P_j = 1/n and a loss of 1 (k = 1).
  const std::vector<double> u(4 * 2, 0.7);
  const std::vector<std::int32_t> e = {0, 1, 1, 0};
  CHECK(ssr::load_balancing_loss<double>({u.data(), 4, 2}, {e.data(), 4, 1}, {}, Score::sigmoid) == Approx(1.0));
}

TEST_CASE("balancing losses reject bad arguments", "[losses][errors]") {
  const std::vector<double> s(6 * 3, 0.0);
  const std::vector<std::int32_t> e(6, 0);
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(ssr::sequence_balance_loss<double>({s.data(), 6, 3}, {e.data(), 6, 1}, 4, 0.1),
                    Contains("seq_len = 4") && Contains("divide the rows m = 6"));
  CHECK_THROWS_WITH(ssr::sequence_balance_loss<double>({s.data(), 6, 3}, {e.data(), 6, 1}, 3, -1),
                    Contains("alpha = -1"));
  const std::vector<std::int64_t> counts = {1, -1, 0};
  CHECK_THROWS_WITH(ssr::global_load_balancing_loss<double>({s.data(), 6, 3},
                                                            ssr::VectorView<const std::int64_t>(counts.data(), 3), 6, 1),
                    Contains("counts[1] = -1"));
  const std::vector<std::int64_t> zero = {0, 0, 0};
  CHECK_THROWS_WITH(ssr::global_load_balancing_loss<double>({s.data(), 6, 3},
                                                            ssr::VectorView<const std::int64_t>(zero.data(), 3), 0, 1),
                    Contains("tokens = 0"));
  // Experts of no column: named, not divided by.
  CHECK_THROWS_WITH(ssr::load_balancing_loss<double>({s.data(), 6, 3}, {e.data(), 6, 0}), Contains("experts.cols = 0"));
  CHECK_THROWS_WITH(ssr::sequence_balance_loss<double>({s.data(), 6, 3}, {e.data(), 6, 0}, 3, 0.1),
                    Contains("experts.cols = 0"));
}

TEST_CASE("balancing losses with sigmoid scores stay finite where every sigmoid of a row underflows", "[losses]") {
  // p_j = sigmoid_j / sum_l sigmoid_l of a row of very negative logits: exp(S_j - max S) normalised.
  const std::vector<float> s = {-800, -900, -1000, -750, 0, 1, 2, 3};
  const std::vector<std::int32_t> e = {3, 2};
  std::vector<float> grad(8), seq_grad(8);
  const double lb = ssr::load_balancing_loss<float>({s.data(), 2, 4}, {e.data(), 2, 1}, {grad.data(), 2, 4}, Score::sigmoid);
  const double seq = ssr::sequence_balance_loss<float>({s.data(), 2, 4}, {e.data(), 2, 1}, 2, 0.5,
                                                       {seq_grad.data(), 2, 4}, Score::sigmoid);
  // f = (0, 0, 1/2, 1/2) x 4; P_3 is row 0's p_3 (about 1) over two rows, P_2 row 1's sigmoid share.
  double sig[4], total = 0;
  for (int j = 0; j < 4; ++j) total += (sig[j] = 1 / (1 + std::exp(-static_cast<double>(s[4 + j]))));
  const double p3 = 1 / (1 + std::exp(-50.0) + std::exp(-150.0) + std::exp(-250.0));
  CHECK(lb == Approx(4 * 0.5 * (p3 + sig[3] / total) / 2 + 4 * 0.5 * (sig[2] / total) / 2));
  CHECK(seq == Approx(0.5 * lb));
  for (int j = 0; j < 8; ++j) CHECK((std::isfinite(grad[j]) && std::isfinite(seq_grad[j])));
}

TEST_CASE("the expert bias moves toward balance by the rate, exactly at the mean it stays", "[bias]") {
  // Loads summing to 12 over 4 experts: mean 3.
  const std::vector<std::int32_t> load = {5, 3, 0, 4};
  std::vector<float> bias = {0.5f, 0.25f, 0, -1};
  ssr::update_expert_bias(ssr::VectorView<const std::int32_t>(load.data(), 4), 0.125, ssr::VectorView<float>(bias.data(), 4));
  CHECK(bias == std::vector<float>{0.375f, 0.25f, 0.125f, -1.125f});
  // A mean between integers: no expert is at it.
  const std::vector<std::int64_t> odd = {2, 2, 0};  // mean 4/3
  std::vector<float> b3(3, 0);
  ssr::update_expert_bias(ssr::VectorView<const std::int64_t>(odd.data(), 3), 1.0, ssr::VectorView<float>(b3.data(), 3));
  CHECK(b3 == std::vector<float>{-1, -1, 1});
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(ssr::update_expert_bias(ssr::VectorView<const std::int32_t>(load.data(), 4), -0.1,
                                            ssr::VectorView<float>(bias.data(), 4)),
                    Contains("rate = -0.1"));
  CHECK_THROWS_WITH(ssr::update_expert_bias(ssr::VectorView<const std::int32_t>(load.data(), 4), 0.1,
                                            ssr::VectorView<float>(bias.data(), 3)),
                    Contains("bias has size 3, expected 4"));
}

TEST_CASE("updating the bias each step balances a skewed router", "[bias]") {
  // Logits that favour the first experts; the auxiliary-loss-free update drives the busiest expert's load
  // toward the mean within a few hundred steps.
  const index_t m = 512, n = 8;
  const int k = 2;
  const auto s = test::random_logits<float>(m, n, 1.0, 53, 4.0);
  const ssr::SoftmaxTopK policy(k, ssr::Cost::linear, {Score::sigmoid, 1, 1});
  std::vector<float> bias(n, 0.0f);
  const auto busiest = [&] {
    const auto r = test::route(policy, s, m, n, Context::train(0).with_bias({bias.data(), n}));
    return std::make_pair(*std::max_element(r.load.begin(), r.load.end()), r.load);
  };
  const double mean = static_cast<double>(m * k) / n;
  CHECK(busiest().first > 2 * mean);
  for (int step = 0; step < 300; ++step) {
    const auto load = busiest().second;
    ssr::update_expert_bias(ssr::VectorView<const std::int32_t>(load.data(), n), 1e-3, ssr::VectorView<float>(bias.data(), n));
  }
  CHECK(busiest().first < 1.2 * mean);
}
