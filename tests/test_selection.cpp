// The selection rules of today's engines on every backend: sigmoid scores, the expert bias (selection
// only), group-limited top-k, their tie rules, gradients and errors, against a reference written here
// from the definitions of docs/routers.md.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "support.hpp"

using ssr::Context;
using ssr::index_t;
using ssr::Score;
using ssr::Selection;
using ssr::SoftmaxTopK;

namespace {

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

// s(S_i): the row softmax or the element-wise sigmoid.
std::vector<double> scores(const double* s, index_t n, Score score) {
  std::vector<double> out(n);
  if (score == Score::sigmoid) {
    for (index_t j = 0; j < n; ++j) out[j] = sigmoid(s[j]);
    return out;
  }
  const double top = *std::max_element(s, s + n);
  double sum = 0;
  for (index_t j = 0; j < n; ++j) sum += std::exp(s[j] - top);
  for (index_t j = 0; j < n; ++j) out[j] = std::exp(s[j] - top) / sum;
  return out;
}

// Indices by descending value, ties to the lower index.
std::vector<int> order_by(const std::vector<double>& v) {
  std::vector<int> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return v[a] > v[b]; });
  return order;
}

// The reference experts of one row: values s + b, the best topk_groups groups by the sum of their two
// highest values, then the k best experts of those groups.
std::vector<int> reference_experts(const double* s, index_t n, int k, const Selection& sel, const float* bias) {
  std::vector<double> v = scores(s, n, sel.score);
  for (index_t j = 0; j < n; ++j) v[j] += bias ? bias[j] : 0.0;
  const index_t size = n / sel.n_groups;
  std::vector<double> group(sel.n_groups);
  for (int g = 0; g < sel.n_groups; ++g) {
    std::vector<double> members(v.begin() + g * size, v.begin() + (g + 1) * size);
    std::sort(members.rbegin(), members.rend());
    group[g] = size == 1 ? members[0] : members[0] + members[1];
  }
  const auto best_groups = order_by(group);
  std::vector<bool> kept(sel.n_groups, false);
  for (int t = 0; t < sel.topk_groups; ++t) kept[best_groups[t]] = true;
  std::vector<double> masked = v;
  for (index_t j = 0; j < n; ++j)
    if (!kept[j / size]) masked[j] = -INFINITY;
  auto order = order_by(masked);
  order.resize(k);
  return order;
}

// Routes logits (double) under policy with an optional bias and checks experts against the reference and
// weights against s over the chosen experts divided by their sum, from the unbiased scores.
template <class Policy>
void check_selection(const Policy& policy, const Selection& sel, const std::vector<double>& s, index_t m, index_t n,
                     int k, const std::vector<float>& bias, const Context& ctx) {
  const Context c = bias.empty() ? ctx : ctx.with_bias({bias.data(), n});
  const auto r = test::route(policy, s, m, n, c);
  for (index_t i = 0; i < m; ++i) {
    const auto want = reference_experts(&s[i * n], n, k, sel, bias.empty() ? nullptr : bias.data());
    for (int t = 0; t < k; ++t) REQUIRE(r.expert(i, t) == want[t]);
    const auto sc = scores(&s[i * n], n, sel.score);
    double z = 0;
    for (int t = 0; t < k; ++t) z += sc[want[t]];
    for (int t = 0; t < k; ++t) REQUIRE(r.weight(i, t) == Approx(sc[want[t]] / z).epsilon(1e-12));
  }
  std::vector<std::int32_t> load(n, 0);
  for (auto e : r.experts) ++load[e];
  CHECK(load == r.load);
}

std::vector<float> random_bias(index_t n, double scale, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0, static_cast<float>(scale));
  std::vector<float> b(n);
  for (auto& x : b) x = d(gen);
  return b;
}

}  // namespace

TEST_CASE("sigmoid scores: top-k of the logits, weights sigmoid over the chosen experts", "[selection]") {
  const index_t m = 300, n = 16;
  const int k = GENERATE(1, 2, 4);
  const Selection sel{Score::sigmoid, 1, 1};
  const auto s = test::random_logits<double>(m, n, 3.0, 5);
  check_selection(SoftmaxTopK(k, ssr::Cost::linear, sel), sel, s, m, n, k, {}, Context::train(0));
  check_selection(SoftmaxTopK(k, ssr::Cost::linear, sel), sel, s, m, n, k, {}, Context::eval());
}

TEST_CASE("the expert bias changes the selection, not the weights", "[selection]") {
  const index_t m = 300, n = 16;
  const int k = 2;
  const Score score = GENERATE(Score::softmax, Score::sigmoid);
  const Selection sel{score, 1, 1};
  const auto s = test::random_logits<double>(m, n, 2.0, 6);
  // Scores lie in [0, 1]: a bias of this size moves the choice of most rows.
  const auto bias = random_bias(n, 0.3, 7);
  check_selection(SoftmaxTopK(k, ssr::Cost::linear, sel), sel, s, m, n, k, bias, Context::train(1));
  const auto plain = test::route(SoftmaxTopK(k, ssr::Cost::linear, sel), s, m, n, Context::train(1));
  const auto biased =
      test::route(SoftmaxTopK(k, ssr::Cost::linear, sel), s, m, n, Context::train(1).with_bias({bias.data(), n}));
  CHECK(plain.experts != biased.experts);
}

TEST_CASE("a bias that favours an expert sends it every token", "[selection]") {
  const index_t m = 200, n = 8;
  const auto s = test::random_logits<double>(m, n, 1.0, 8);
  std::vector<float> bias(n, 0.0f);
  bias[5] = 2;  // above any difference of scores in [0, 1]
  const auto r = test::route(SoftmaxTopK(2, ssr::Cost::linear, {Score::sigmoid, 1, 1}), s, m, n,
                             Context::train(0).with_bias({bias.data(), n}));
  CHECK(r.load[5] == m);
}

TEST_CASE("biased selection: equal values go to the lower index", "[selection]") {
  // Equal logits: sigmoid scores are all 0.5, and the bias decides, with exact ties.
  const index_t m = 2, n = 6;
  const std::vector<double> s(m * n, 0.0);
  const std::vector<float> bias = {0.25f, 1, 0.5f, 1, 1, 0};
  const auto r = test::route(SoftmaxTopK(3, ssr::Cost::linear, {Score::sigmoid, 1, 1}), s, m, n,
                             Context::eval().with_bias({bias.data(), n}));
  for (index_t i = 0; i < m; ++i) {
    CHECK(r.expert(i, 0) == 1);
    CHECK(r.expert(i, 1) == 3);
    CHECK(r.expert(i, 2) == 4);
    for (int t = 0; t < 3; ++t) CHECK(r.weight(i, t) == Approx(1.0 / 3));
  }
}

TEST_CASE("group-limited top-k keeps the experts of the best groups", "[selection]") {
  const index_t m = 400, n = 16;
  const Score score = GENERATE(Score::softmax, Score::sigmoid);
  const bool with_bias = GENERATE(false, true);
  const auto s = test::random_logits<double>(m, n, 2.0, 9);
  const auto bias = with_bias ? random_bias(n, 0.2, 10) : std::vector<float>{};
  for (const auto& [groups, kept, k] : std::vector<std::tuple<int, int, int>>{
           {4, 2, 3}, {4, 1, 4}, {8, 3, 2}, {16, 5, 5}, {2, 1, 8}, {4, 4, 6}}) {
    const Selection sel{score, groups, kept};
    check_selection(SoftmaxTopK(k, ssr::Cost::linear, sel), sel, s, m, n, k, bias, Context::train(2));
  }
}

TEST_CASE("group-limited top-k: tied groups and tied experts go to the lower index", "[selection]") {
  // Small integer logits and sigmoid scores: many exact ties between experts and between groups.
  const index_t m = 2000, n = 12;
  std::mt19937 gen(11);
  std::uniform_int_distribution<int> d(0, 2);
  std::vector<double> s(m * n);
  for (auto& v : s) v = d(gen);
  const std::vector<float> bias = {0, 0.5f, 0, 0, 0.5f, 0, 0, 0, 0, 0.5f, 0, 0};
  for (const auto& [groups, kept, k] : std::vector<std::tuple<int, int, int>>{{4, 2, 2}, {6, 2, 3}, {3, 1, 4}}) {
    const Selection sel{Score::sigmoid, groups, kept};
    check_selection(SoftmaxTopK(k, ssr::Cost::linear, sel), sel, s, m, n, k, {}, Context::eval());
    check_selection(SoftmaxTopK(k, ssr::Cost::linear, sel), sel, s, m, n, k, bias, Context::eval());
  }
}

TEST_CASE("float logits select as the definitions say", "[selection]") {
  const index_t m = 300, n = 16, k = 2;
  const auto sf = test::random_logits<float>(m, n, 2.0, 12);
  const std::vector<double> sd(sf.begin(), sf.end());
  const Selection sel{Score::sigmoid, 4, 2};
  const auto bias = random_bias(n, 0.2, 13);
  const auto r = test::route(SoftmaxTopK(k, ssr::Cost::linear, sel), sf, m, n, Context::eval().with_bias({bias.data(), n}));
  for (index_t i = 0; i < m; ++i) {
    const auto want = reference_experts(&sd[i * n], n, k, sel, bias.data());
    for (int t = 0; t < k; ++t) REQUIRE(r.expert(i, t) == want[t]);
  }
}

TEST_CASE("the Sinkhorn path selects by the plan: no bias, score weights from the score function", "[selection]") {
  const index_t m = 200, n = 8, k = 2;
  const auto s = test::random_logits<double>(m, n, 1.0, 14);
  const auto bias = random_bias(n, 0.5, 15);
  const ssr::SinkhornTopK policy(k, ssr::Cost::linear, {0.5, 1e-9, 500}, ssr::Weights::scores, {Score::sigmoid, 1, 1});
  const auto plain = test::route(policy, s, m, n, Context::train(0));
  const auto biased = test::route(policy, s, m, n, Context::train(0).with_bias({bias.data(), n}));
  CHECK(plain.experts == biased.experts);
  CHECK(plain.weights == biased.weights);
  for (index_t i = 0; i < m; ++i) {
    const double a = sigmoid(s[i * n + plain.expert(i, 0)]), b = sigmoid(s[i * n + plain.expert(i, 1)]);
    REQUIRE(plain.weight(i, 0) == Approx(a / (a + b)).epsilon(1e-12));
  }
  // In evaluation it routes as the softmax path, bias included.
  const Selection sel{Score::sigmoid, 1, 1};
  check_selection(policy, sel, s, m, n, k, bias, Context::eval());
}

TEST_CASE("SSR with sigmoid scores and a bias: the bias on its common path only", "[selection]") {
  const index_t m = 100, n = 8, k = 2;
  const Selection sel{Score::sigmoid, 1, 1};
  const auto s = test::random_logits<double>(m, n, 1.0, 16);
  const auto bias = random_bias(n, 0.3, 17);
  const auto policy = ssr::make_ssr(k, ssr::Cost::linear, 0.5, {}, 0, 1, ssr::Weights::plan, sel);
  int paths[2] = {0, 0};  // softmax, Sinkhorn
  for (std::uint64_t step = 0; step < 6; ++step) {
    const Context ctx = Context::train(step);
    const bool softmax = policy.resolve(ctx).path == ssr::Path::softmax;
    ++paths[softmax ? 0 : 1];
    if (softmax)
      check_selection(policy, sel, s, m, n, k, bias, ctx);
    else
      CHECK(test::route(policy, s, m, n, ctx.with_bias({bias.data(), n})).experts ==
            test::route(policy, s, m, n, ctx).experts);
  }
  REQUIRE(paths[0] > 0);  // the steps took both paths
  REQUIRE(paths[1] > 0);
}

TEMPLATE_TEST_CASE("sigmoid weights stay finite for extreme logits", "[selection][numerics]", float, double) {
  const TestType big = std::numeric_limits<TestType>::max();
  const index_t m = 2, n = 4;
  const std::vector<TestType> s = {-big, -big, -big, -big, big, -big, 0, big};
  const auto r = test::route(SoftmaxTopK(2, ssr::Cost::linear, {Score::sigmoid, 2, 1}), s, m, n, Context::eval());
  for (auto w : r.weights) REQUIRE(std::isfinite(w));
  CHECK(r.weight(0, 0) == Approx(0.5));
  // Group {2, 3} scores 0.5 + 1 against 1 + 0 for group {0, 1}.
  CHECK(r.expert(1, 0) == 3);
  CHECK(r.expert(1, 1) == 2);
  CHECK(r.weight(1, 0) == Approx(2.0 / 3));
}

TEST_CASE("sigmoid score weights: backward matches finite differences", "[selection][backward]") {
  const std::vector<float> bias = {0.1f, -0.2f, 0.3f, 0, 0, 0.2f, -0.1f, 0};
  test::check_weights_gradient(SoftmaxTopK(2, ssr::Cost::linear, {Score::sigmoid, 1, 1}), Context::train(0));
  test::check_weights_gradient(SoftmaxTopK(2, ssr::Cost::linear, {Score::sigmoid, 4, 2}), Context::train(0).with_bias({bias.data(), 8}));
  test::check_weights_gradient(SoftmaxTopK(2, ssr::Cost::linear, {Score::softmax, 4, 2}), Context::train(0).with_bias({bias.data(), 8}));
  test::check_weights_gradient(
      ssr::SinkhornTopK(2, ssr::Cost::linear, {0.5, 1e-10, 1000}, ssr::Weights::scores, {Score::sigmoid, 1, 1}),
      Context::train(0));
}

TEST_CASE("selection errors name the argument", "[selection][errors]") {
  const index_t m = 4, n = 12;
  const auto s = test::random_logits<float>(m, n, 1.0, 1);
  test::Routed<float> out(m, n, 2);
  const auto call = [&](const SoftmaxTopK& p, const Context& ctx) {
    test::Router<SoftmaxTopK, float> router(p);
    router.route({s.data(), m, n}, ctx, out.outputs());
  };
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(call(SoftmaxTopK(2, ssr::Cost::linear, {Score::softmax, 5, 2}), Context::eval()),
                    Contains("n_groups = 5") && Contains("must divide the number of experts n = 12"));
  CHECK_THROWS_WITH(SoftmaxTopK(2, ssr::Cost::linear, {Score::softmax, 4, 5}).validate(),
                    Contains("topk_groups = 5") && Contains("must be in [1, n_groups = 4]"));
  CHECK_THROWS_WITH(SoftmaxTopK(2, ssr::Cost::linear, {Score::softmax, 65, 1}).validate(),
                    Contains("n_groups = 65") && Contains("must be in [1, 64]"));
  CHECK_THROWS_WITH(call(SoftmaxTopK(4, ssr::Cost::linear, {Score::softmax, 6, 1}), Context::eval()),
                    Contains("k = 4") && Contains("must be at most topk_groups * n / n_groups = 2"));
  const std::vector<float> short_bias(n - 1, 0.0f);
  CHECK_THROWS_WITH(call(SoftmaxTopK(2), Context::eval().with_bias({short_bias.data(), n - 1})),
                    Contains("expert_bias has size 11, expected 12"));
  const std::vector<float> bias(n, 0.0f);
  using Noisy = ssr::NoisyCost<SoftmaxTopK>;
  test::Router<Noisy, float> noisy(Noisy(SoftmaxTopK(2), 0.5));
  CHECK_THROWS_WITH(noisy.route({s.data(), m, n}, Context::train(0).with_bias({bias.data(), n}), out.outputs()),
                    Contains("expert_bias") && Contains("cost noise"));
  CHECK_THROWS_WITH(
      ssr::NoisyCost<SoftmaxTopK>(SoftmaxTopK(2, ssr::Cost::linear, {Score::sigmoid, 1, 1}), 0.5).validate(),
      Contains("alpha = 0.5") && Contains("score = sigmoid"));
  CHECK_THROWS_WITH(
      ssr::SinkhornTopK(2, ssr::Cost::linear, {}, ssr::Weights::plan, {Score::softmax, 4, 2}).validate(),
      Contains("topk_groups = 2") && Contains("Sinkhorn path"));
  CHECK_THROWS_WITH(ssr::make_ssr(2, ssr::Cost::linear, 0.01, {}, 0, 1, ssr::Weights::plan, {Score::softmax, 4, 2})
                        .validate(),
                    Contains("Sinkhorn path"));
  CHECK_NOTHROW(
      ssr::make_ssr(2, ssr::Cost::linear, 0.0, {}, 0, 1, ssr::Weights::plan, {Score::softmax, 4, 2}).validate());
  // The gradient of sigmoid score weights reads the logits.
  test::Router<SoftmaxTopK, float> router(SoftmaxTopK(2, ssr::Cost::linear, {Score::sigmoid, 1, 1}));
  const auto info = router.route({s.data(), m, n}, Context::eval(), out.outputs());
  std::vector<float> g(m * 2, 1.0f), grad(m * n);
  CHECK_THROWS_WITH(
      router.backward(
          info, {{}, {out.experts.data(), m, 2}, {out.weights.data(), m, 2}, {g.data(), m, 2}, {grad.data(), m, n}}),
      Contains("needs the call's logits"));
}
