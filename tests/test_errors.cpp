// Every invalid argument throws ssr::Error naming it, before any output is written.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>

#include "support.hpp"

using Catch::Matchers::Contains;
using ssr::Context;
using ssr::index_t;

namespace {

// Routes with outputs filled with sentinels and checks the call throws a message containing `what`
// and leaves every output untouched.
template <class Policy>
void require_rejected(const Policy& policy, const std::vector<float>& s, index_t m, index_t n, const char* what,
                      index_t stride = 0) {
  test::Routed<float> out(m, n, 2);
  std::fill(out.experts.begin(), out.experts.end(), -7);
  std::fill(out.load.begin(), out.load.end(), -7);
  std::fill(out.weights.begin(), out.weights.end(), -7.0f);
  const auto before = out.plan;
  test::Router<Policy, float> router(policy);
  REQUIRE_THROWS_WITH(router.route({s.data(), m, n, stride ? stride : n}, Context::train(0), out.outputs()), Contains(what));
  CHECK(out.experts == std::vector<std::int32_t>(m * 2, -7));
  CHECK(out.load == std::vector<std::int32_t>(n, -7));
  CHECK(out.weights == std::vector<float>(m * 2, -7.0f));
  CHECK(out.plan == before);
}

// A policy of the caller's own: any spec it is given, which only the call can check.
struct GivenSpec {
  ssr::RouteSpec spec;
  void validate() const {}
  ssr::RouteSpec resolve(const Context& /*ctx*/) const { return spec; }
};

#if !defined(SSR_TEST_CUDA)
// One rank whose agreement works but whose every other sum fails, as a collective that breaks during a
// solve: the call must throw, not end the process from inside its threads.
class FailingSums final : public ssr::Communicator<ssr::HostStream> {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void sum(std::int64_t*, std::size_t, ssr::HostStream) const override { throw ssr::RuntimeError("the sum failed"); }
  void max(double*, std::size_t, ssr::HostStream) const override { throw ssr::RuntimeError("the max failed"); }
  void sum_on_host(std::int64_t*, std::size_t, ssr::HostStream) const override {}
};
#endif

}  // namespace

TEST_CASE("a spec a policy of the caller's own resolves is checked as the built-in policies' are", "[errors]") {
  const index_t m = 10, n = 4;
  const auto s = test::random_logits<float>(m, n, 1.0, 1);
  const auto rejected = [&](auto&& change, const char* what) {
    GivenSpec policy;
    policy.spec.path = ssr::Path::sinkhorn;
    change(policy.spec);
    require_rejected(policy, s, m, n, what);
  };
  rejected([](ssr::RouteSpec& p) { p.k = 0; }, "k = 0");
  rejected([](ssr::RouteSpec& p) { p.k = -1; }, "k = -1");
  rejected([](ssr::RouteSpec& p) { p.sinkhorn.xi = 0; }, "xi = 0");
  rejected([](ssr::RouteSpec& p) { p.sinkhorn.xi = -1; }, "xi = -1");
  rejected([](ssr::RouteSpec& p) { p.sinkhorn.xi = std::nan(""); }, "xi = nan");
  rejected([](ssr::RouteSpec& p) { p.sinkhorn.tol = 0; }, "tol = 0");
  rejected([](ssr::RouteSpec& p) { p.sinkhorn.max_iters = 0; }, "max_iters = 0");
  rejected([](ssr::RouteSpec& p) { p.noise_alpha = std::nan(""); }, "alpha = nan");
  rejected([](ssr::RouteSpec& p) { p.noise_sigma = 0; }, "sigma = 0");
  rejected([](ssr::RouteSpec& p) { p.select = {ssr::Score::softmax, 2, 1}; }, "on the Sinkhorn path");
  rejected([](ssr::RouteSpec& p) { p.select = {ssr::Score::softmax, 2, 3}; }, "topk_groups = 3");
  const auto noisy_sigmoid = [](ssr::RouteSpec& p) {
    p.path = ssr::Path::softmax;
    p.noise_alpha = 1;
    p.select.score = ssr::Score::sigmoid;
  };
  rejected(noisy_sigmoid, "cost noise needs softmax scores without groups (score = sigmoid");
  GivenSpec valid;
  valid.spec.path = ssr::Path::sinkhorn;
  test::Routed<float> out(m, n, 2);
  CHECK(test::Router<GivenSpec, float>(valid).route({s.data(), m, n}, Context::train(0), out.outputs()).converged);
}

#if !defined(SSR_TEST_CUDA)  // the host backends' threads; the CUDA backend's communicators take device streams
TEST_CASE("a communicator that fails during a solve makes the call throw, on any number of threads", "[errors]") {
  const index_t m = index_t{1} << 15, n = 8;  // enough elements for the CPU backend to use two threads
  const auto s = test::random_logits<float>(m, n, 1.0, 2);
  const FailingSums failing;
  for (const int threads : {1, 2}) {
    test::Router<ssr::SinkhornTopK, float> router(ssr::SinkhornTopK(2), threads);
    test::Routed<float> out(m, n, 2);
    using Options = test::Router<ssr::SinkhornTopK, float>::options_type;
    CHECK_THROWS_AS(router.route({s.data(), m, n}, Context::train(0), out.outputs(), Options().across(failing)),
                    ssr::RuntimeError);
    CHECK(router.route({s.data(), m, n}, Context::train(0), out.outputs()).converged);  // and the next call works
  }
}
#endif

TEST_CASE("invalid policy parameters are rejected at construction, naming the value", "[errors]") {
  using ssr::SinkhornTopK;
  CHECK_THROWS_WITH((test::Router<ssr::SoftmaxTopK, float>(ssr::SoftmaxTopK(0))), Contains("k = 0"));
  CHECK_THROWS_WITH((test::Router<SinkhornTopK, float>(SinkhornTopK(2, ssr::Cost::linear, {0.0, 1e-4, 100}))), Contains("xi = 0"));
  CHECK_THROWS_WITH((test::Router<SinkhornTopK, float>(SinkhornTopK(2, ssr::Cost::linear, {-1.0, 1e-4, 100}))), Contains("xi = -1"));
  CHECK_THROWS_WITH((test::Router<SinkhornTopK, float>(SinkhornTopK(2, ssr::Cost::linear, {std::nan(""), 1e-4, 100}))), Contains("xi = nan"));
  CHECK_THROWS_WITH((test::Router<SinkhornTopK, float>(SinkhornTopK(2, ssr::Cost::linear, {0.5, 0.0, 100}))), Contains("tol = 0"));
  CHECK_THROWS_WITH((test::Router<SinkhornTopK, float>(SinkhornTopK(2, ssr::Cost::linear, {0.5, 1e-4, 0}))), Contains("max_iters = 0"));
  CHECK_THROWS_WITH((test::Router<ssr::SSRPolicy, float>(ssr::make_ssr(2, ssr::Cost::linear, 1.5))), Contains("p = 1.5"));
  CHECK_THROWS_WITH((test::Router<ssr::SSRPolicy, float>(ssr::make_ssr(2, ssr::Cost::linear, -0.1))), Contains("p = -0.1"));
  CHECK_THROWS_WITH((test::Router<ssr::SSRPolicy, float>(ssr::make_ssr(2, ssr::Cost::linear, 0.1, {}, -1.0))), Contains("alpha = -1"));
  CHECK_THROWS_WITH((test::Router<ssr::SSRPolicy, float>(ssr::make_ssr(2, ssr::Cost::linear, 0.1, {}, 1.0, 0.0))), Contains("sigma = 0"));
  using NoisySoftmax = ssr::NoisyCost<ssr::SoftmaxTopK>;
  const NoisySoftmax noisy_sigmoid(ssr::SoftmaxTopK(2, ssr::Cost::linear, {ssr::Score::sigmoid, 1, 1}), 0.5);
  CHECK_THROWS_WITH((test::Router<NoisySoftmax, float>(noisy_sigmoid)), Contains("alpha = 0.5") && Contains("score = sigmoid"));
  const NoisySoftmax noisy_groups(ssr::SoftmaxTopK(2, ssr::Cost::linear, {ssr::Score::softmax, 4, 2}), 0.5);
  CHECK_THROWS_WITH((test::Router<NoisySoftmax, float>(noisy_groups)), Contains("n_groups = 4, topk_groups = 2"));
  CHECK_NOTHROW(test::Router<NoisySoftmax, float>(NoisySoftmax(ssr::SoftmaxTopK(2, ssr::Cost::linear, {ssr::Score::sigmoid, 1, 1}), 0.0)));
  CHECK_THROWS_WITH(ssr::CpuBackend<float>(-1), Contains("threads = -1"));
  using Mixed = ssr::SelectivePolicy<SinkhornTopK, ssr::SoftmaxTopK>;
  CHECK_THROWS_WITH((test::Router<Mixed, float>(Mixed(SinkhornTopK(3), ssr::SoftmaxTopK(2), 0.1))), Contains("k = 3"));
  CHECK_THROWS_AS((test::Router<ssr::SoftmaxTopK, float>(ssr::SoftmaxTopK(-3))), ssr::Error);
}

TEST_CASE("invalid calls are rejected before anything is written", "[errors]") {
  const index_t m = 10, n = 4;
  auto s = test::random_logits<float>(m, n, 1.0, 1);
  require_rejected(ssr::SoftmaxTopK(5), s, m, n, "k = 5");  // k > n
  require_rejected(ssr::SinkhornTopK(2), s, m, n, "logits.stride = 3", 3);
  s[2 * n + 3] = std::numeric_limits<float>::quiet_NaN();
  require_rejected(ssr::SinkhornTopK(2), s, m, n, "logits(2, 3) = nan");
  s[2 * n + 3] = std::numeric_limits<float>::infinity();
  require_rejected(ssr::SoftmaxTopK(2), s, m, n, "logits(2, 3) = inf");
}

TEST_CASE("the first non-finite logit is named on every path, wherever it lies", "[errors]") {
  // Enough rows for several blocks and threads; the CPU backend's float kernel (linear cost at xi = 0.5,
  // softmax cost) checks the logits as it reads them, the other paths scan them first.
  const index_t m = 20000, n = 16;
  auto s = test::random_logits<float>(m, n, 1.0, 2);
  s[15000 * n + 5] = std::numeric_limits<float>::quiet_NaN();
  s[7000 * n + 12] = std::numeric_limits<float>::quiet_NaN();
  s[7000 * n + 9] = -std::numeric_limits<float>::infinity();
  require_rejected(ssr::SinkhornTopK(2), s, m, n, "logits(7000, 9) = -inf");
  require_rejected(ssr::SinkhornTopK(2, ssr::Cost::softmax), s, m, n, "logits(7000, 9) = -inf");
  require_rejected(ssr::SoftmaxTopK(2), s, m, n, "logits(7000, 9) = -inf");
  s[7000 * n + 9] = 0;
  s[7000 * n + 12] = 0;
  require_rejected(ssr::SinkhornTopK(2), s, m, n, "logits(15000, 5) = nan");
  require_rejected(ssr::SinkhornTopK(2, ssr::Cost::softmax, {0.3, 1e-4, 100}), s, m, n, "logits(15000, 5) = nan");
}

TEST_CASE("the softmax top-k names a lone non-finite logit at any width, stride and row", "[errors]") {
  // The CPU backend's softmax top-k checks each group of rows as it copies them by columns: in blocks of 16
  // and 8 columns and one at a time, with or without a row stride; a NaN enters no top-k list, so only the
  // copy can find it. The last rows fill a partial tile (that repeats its last row).
  for (const index_t n : {3, 8, 16, 21, 40}) {
    for (const index_t stride : {n, n + 3}) {
      const index_t m = 77;
      const auto s = test::random_logits<float>(m, stride, 1.0, 3);
      for (const index_t at : {index_t{0}, 13 * stride + n - 1, 40 * stride + n / 2, (m - 1) * stride + n - 1}) {
        for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
          CAPTURE(n, stride, at, bad);
          auto t = s;
          t[static_cast<std::size_t>(at)] = bad;
          const std::string what = "logits(" + std::to_string(at / stride) + ", " + std::to_string(at % stride) + ")";
          require_rejected(ssr::SoftmaxTopK(2), t, m, n, what.c_str(), stride);
        }
      }
      // A non-finite value in the stride's padding is no logit.
      auto t = s;
      if (stride > n) t[5 * stride + n] = std::numeric_limits<float>::quiet_NaN();
      test::Router<ssr::SoftmaxTopK, float> router(ssr::SoftmaxTopK(2));
      test::Routed<float> out(m, n, 2);
      CHECK_NOTHROW(router.route({t.data(), m, n, stride}, Context::train(0), out.outputs()));
    }
  }
}

TEST_CASE("outputs of the wrong shape are rejected", "[errors]") {
  const index_t m = 10, n = 4;
  const auto s = test::random_logits<float>(m, n, 1.0, 1);
  test::Router<ssr::SoftmaxTopK, float> router(ssr::SoftmaxTopK(2));
  test::Routed<float> out(m, n, 2);
  auto o = out.outputs();
  o.experts.cols = 3;
  CHECK_THROWS_WITH(router.route({s.data(), m, n}, Context::train(0), o), Contains("experts has shape 10x3, expected 10x2"));
  o = out.outputs();
  o.weights.rows = 9;
  CHECK_THROWS_WITH(router.route({s.data(), m, n}, Context::train(0), o), Contains("weights has shape 9x2"));
  o = out.outputs();
  o.load.size = 3;
  CHECK_THROWS_WITH(router.route({s.data(), m, n}, Context::train(0), o), Contains("load has size 3, expected 4"));
  o = out.outputs();
  o.plan.cols = 5;
  CHECK_THROWS_WITH(router.route({s.data(), m, n}, Context::train(0), o), Contains("plan has shape"));
  o = out.outputs();
  o.experts.data = nullptr;
  CHECK_THROWS_WITH(router.route({s.data(), m, n}, Context::train(0), o), Contains("experts is null"));
  CHECK_THROWS_WITH(router.route({s.data(), m, 0}, Context::train(0), out.outputs()), Contains("logits.cols = 0"));
}

TEST_CASE("backward rejects bad experts and non-finite gradients", "[errors]") {
  const index_t m = 3, n = 4, k = 2;
  test::Router<ssr::SoftmaxTopK, float> router(ssr::SoftmaxTopK(2));
  std::vector<std::int32_t> e = {0, 1, 2, 3, 1, 4};
  std::vector<float> w(m * k, 0.5f), g(m * k, 1.0f), grad(m * n, -3.0f);
  ssr::RouteInfo info;
  CHECK_THROWS_WITH(
      router.backward(info, {{}, {e.data(), m, k}, {w.data(), m, k}, {g.data(), m, k}, {grad.data(), m, n}}),
      Contains("experts(2, 1) = 4"));
  e[5] = 0;
  g[1] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH(
      router.backward(info, {{}, {e.data(), m, k}, {w.data(), m, k}, {g.data(), m, k}, {grad.data(), m, n}}),
      Contains("grad_weights(0, 1) = inf"));
  CHECK_THROWS_WITH(
      router.backward(info, {{}, {e.data(), m, k}, {w.data(), m, k}, {g.data(), m, k}, {grad.data(), 2, n}}),
      Contains("grad_logits has shape 2x4, expected 3x4"));
  CHECK(grad == std::vector<float>(m * n, -3.0f));
}

TEST_CASE("shapes whose sizes would overflow 64 bits are rejected before anything is touched or allocated", "[errors]") {
  // Views of a one-element buffer claiming 2^40 x 2^20 logits, given to the backend's Router as they are
  // (no copies to a device): only the shape is read.
  float one = 0;
  std::int32_t e = -7;
  test::Router<ssr::SoftmaxTopK, float> router(ssr::SoftmaxTopK(2));
  const index_t m = index_t{1} << 40, n = index_t{1} << 20;
  const ssr::RouteOutputs<float> out{{&e, m, 2}, {&one, m, 2}};
  REQUIRE_THROWS_WITH(router.inner().route({&one, m, n}, Context::train(0), out), Contains("than 2^56 elements"));
  CHECK(e == -7);
  REQUIRE_THROWS_WITH(router.inner().route({&one, 4, 8, index_t{1} << 62}, Context::train(0), {{&e, 4, 2}, {&one, 4, 2}}),
                      Contains("than 2^56 elements"));
  // 2^31 rows whose load is counted: an expert's int32 count could overflow.
  const index_t rows = index_t{1} << 31;
  REQUIRE_THROWS_WITH(router.inner().route({&one, rows, 8}, Context::train(0), {{&e, rows, 2}, {&one, rows, 2}, {&e, 8}}),
                      Contains("must be at most 2^31 - 1 when the call counts the load"));
  CHECK(e == -7);
}
