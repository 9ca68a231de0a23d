// The call contract engines rely on, on every backend: a caller workspace of exactly the queried size,
// rejected when too small, the backend's own workspace reused; checks skipped per call.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "support.hpp"

using Catch::Matchers::Contains;
using ssr::Context;
using ssr::index_t;

TEST_CASE("a caller workspace of exactly the queried size, at any alignment, is all a call uses", "[workspace]") {
  // 40000 x 16: the backend's own workspace is over 2 MiB (on huge pages where the host backend runs on Linux).
  const index_t n = 16, m = GENERATE(index_t{1500}, index_t{40000});
  const auto s = test::random_logits<float>(m, n, 1.0, 3, 2.0);
  const auto policy = ssr::make_ssr(2, ssr::Cost::softmax, 0.5, {0.5, 1e-6, 100}, 0.2);
  int paths[2] = {0, 0};  // softmax, Sinkhorn: both, the coin lands either way over these steps
  for (std::uint64_t step : {0, 1, 2, 3}) {
    const Context ctx = Context::train(step, 0, 4);
    test::Router<ssr::SSRPolicy, float> own(policy), caller(policy);
    ++paths[caller.resolve(ctx).path == ssr::Path::softmax ? 0 : 1];
    const std::size_t bytes = caller.inner().workspace_bytes(m, n, ctx);
    INFO(test::backend_name << ": step " << step << " path " << ssr::to_string(caller.resolve(ctx).path) << ", " << bytes
                            << " bytes");
    CHECK(bytes <= caller.inner().workspace_bytes(m, n));
    test::Routed<float> a(m, n, 2), b(m, n, 2);
    a.info = own.route({s.data(), m, n}, ctx, a.outputs());
    constexpr std::size_t offset = 1, canary = 256;  // a misaligned start, and bytes past the end
    test::Bytes memory(offset + bytes + canary, 0xa5);
    b.info = caller.route({s.data(), m, n}, ctx, b.outputs(),
                          typename test::Router<ssr::SSRPolicy, float>::options_type{}.using_workspace(
                              {static_cast<unsigned char*>(memory.data()) + offset, bytes}));
    test::require_identical(a, b);
    CHECK(caller.backend().held_workspace_bytes() == 0);  // the backend allocated nothing of its own
    const auto after = memory.read();
    for (std::size_t e = offset + bytes; e < after.size(); ++e) REQUIRE(after[e] == 0xa5);
    CHECK(after[0] == 0xa5);
  }
  REQUIRE(paths[0] > 0);
  REQUIRE(paths[1] > 0);
}

TEST_CASE("a workspace smaller than the call needs is rejected before anything is written", "[workspace][errors]") {
  const index_t m = 100, n = 8, k = 2;
  const auto s = test::random_logits<float>(m, n, 1.0, 3);
  test::Router<ssr::SinkhornTopK, float> router(ssr::SinkhornTopK(2));
  const std::size_t bytes = router.inner().workspace_bytes(m, n, Context::train(0));
  test::Bytes memory(bytes, 0);
  test::Routed<float> out(m, n, k);
  std::fill(out.experts.begin(), out.experts.end(), -7);
  CHECK_THROWS_WITH(router.route({s.data(), m, n}, Context::train(0), out.outputs(),
                                 typename test::Router<ssr::SinkhornTopK, float>::options_type{}.using_workspace(
                                     {memory.data(), bytes - 1})),
                    Contains("workspace.bytes = " + std::to_string(bytes - 1)));
  CHECK(out.experts == std::vector<std::int32_t>(m * k, -7));
}

TEST_CASE("a workspace query checks its sizes as a call does", "[workspace][errors]") {
  test::Router<ssr::SSRPolicy, float> router(ssr::make_ssr(2, ssr::Cost::linear, 0.5));
  for (const Context& ctx : {Context::train(0), Context::eval()}) {
    CHECK_THROWS_WITH(router.inner().workspace_bytes(10, 0, ctx), Contains("logits.cols = 0"));
    CHECK_THROWS_WITH(router.inner().workspace_bytes(-1, 4, ctx), Contains("logits.rows = -1"));
    CHECK_THROWS_WITH(router.inner().workspace_bytes(index_t{1} << 60, 4, ctx), Contains("span more than 2^56 elements"));
  }
  CHECK_THROWS_WITH(router.inner().workspace_bytes(10, 0), Contains("logits.cols = 0"));
  CHECK_NOTHROW(router.inner().workspace_bytes(0, 4));
  ssr::RouteSpec spec = router.inner().resolve(Context::train(0));
  spec.path = ssr::Path::sinkhorn;  // whose layout divides by n
  CHECK_THROWS_WITH(router.backend().workspace_bytes(spec, 10, 0), Contains("logits.cols = 0"));
}

TEST_CASE("the backend's own workspace grows once and is reused", "[workspace]") {
  const index_t m = 3000, n = 16, k = 2;
  const auto s = test::random_logits<float>(m, n, 1.0, 5);
  test::Router<ssr::SinkhornTopK, float> router{ssr::SinkhornTopK(k)};
  test::Routed<float> a(m, n, k), b(m, n, k);
  a.info = router.route({s.data(), m, n}, Context::train(0), a.outputs());
  const auto bytes = router.backend().held_workspace_bytes();
  CHECK(bytes == router.inner().workspace_bytes(m, n, Context::train(0)));
  b.info = router.route({s.data(), m, n}, Context::train(0), b.outputs());
  CHECK(router.backend().held_workspace_bytes() == bytes);
  test::require_identical(a, b);
  test::Routed<float> c(m / 2, n, k);  // a smaller call fits in the same workspace
  c.info = router.route({s.data(), m / 2, n}, Context::train(0), c.outputs());
  CHECK(router.backend().held_workspace_bytes() == bytes);
}

TEST_CASE("a call that skips the finiteness check routes finite logits alike, and non-finite ones without a throw",
          "[checks]") {
  const index_t m = 400, n = 8, k = 2;
  auto s = test::random_logits<float>(m, n, 1.0, 8);
  for (const bool sinkhorn : {false, true}) {
    const auto policy = ssr::make_ssr(k, ssr::Cost::linear, sinkhorn ? 1.0 : 0.0);
    test::Router<ssr::SSRPolicy, float> router(policy);
    using Options = typename test::Router<ssr::SSRPolicy, float>::options_type;
    test::Routed<float> a(m, n, k), b(m, n, k);
    a.info = router.route({s.data(), m, n}, Context::train(0), a.outputs());
    b.info = router.route({s.data(), m, n}, Context::train(0), b.outputs(), Options{}.unchecked());
    test::require_identical(a, b);
    auto bad = s;
    bad[5 * n + 3] = std::numeric_limits<float>::quiet_NaN();
    CHECK_THROWS_WITH(router.route({bad.data(), m, n}, Context::train(0), b.outputs()), Contains("logits(5, 3) = nan"));
    ssr::RouteInfo info;
    CHECK_NOTHROW(info = router.route({bad.data(), m, n}, Context::train(0), b.outputs(), Options{}.unchecked()));
    if (sinkhorn) CHECK(info.iterations == 1);  // the NaN row makes the error NaN, which ends the solve at once
  }
}

TEST_CASE("a complete info needs no waiting", "[checks]") {
  const index_t m = 64, n = 8;
  const auto s = test::random_logits<float>(m, n, 1.0, 2);
  test::Router<ssr::SinkhornTopK, float> router(ssr::SinkhornTopK(2));
  test::Routed<float> r(m, n, 2);
  auto info = router.route({s.data(), m, n}, Context::train(0), r.outputs());  // test::Router asks to wait
  REQUIRE(info.complete());
  const auto before = info.iterations;
  router.inner().wait(info);
  CHECK(info.iterations == before);
  CHECK(info.iterations >= 1);
}
