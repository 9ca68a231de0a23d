// The CPU backend's kernels: every instruction set the processor runs gives the same bits (each forced
// through cpu::use_isa; SSR_EXPECT_CPU_ISA names one a machine must have, so that a path cannot skip
// silently), the float exp's accuracy, the scope that flushes subnormals, and the aligned workspace.
#include <catch2/catch.hpp>

#include <ssr/backend/cpu.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "support.hpp"

using ssr::Context;
using ssr::Cost;
using ssr::index_t;
using ssr::cpu::Isa;

namespace {

// Runs f once on each instruction set this processor runs, then leaves the process on the widest.
template <class F>
void on_every_isa(const F& f) {
  const test::OnExit restore{[] { ssr::cpu::use_isa(ssr::cpu::runs(Isa::avx2) ? Isa::avx2 : Isa::baseline); }};
  for (const Isa isa : {Isa::baseline, Isa::avx2}) {
    if (!ssr::cpu::runs(isa)) continue;
    ssr::cpu::use_isa(isa);
    INFO("isa " << ssr::cpu::to_string(isa));
    f(isa);
  }
}

// The outputs of policy on s, on each instruction set; all must be identical.
template <class T, class Policy>
void require_same_on_every_isa(const Policy& policy, const std::vector<T>& s, index_t m, index_t n,
                               const Context& ctx) {
  std::vector<test::Routed<T>> runs;
  on_every_isa([&](Isa) { runs.push_back(test::route(policy, s, m, n, ctx)); });
  for (std::size_t r = 1; r < runs.size(); ++r) test::require_identical(runs[0], runs[r]);
}

}  // namespace

TEST_CASE("the instruction sets a machine is expected to run are there", "[simd]") {
  // .ci/run sets SSR_EXPECT_CPU_ISA=avx2 where its machine has AVX2 and FMA, so that the AVX2 path's tests
  // cannot pass by being skipped.
  const char* expected = std::getenv("SSR_EXPECT_CPU_ISA");
  if (expected == nullptr || std::string(expected).empty()) return;
  REQUIRE(std::string(expected) == "avx2");
  REQUIRE(ssr::cpu::runs(Isa::avx2));
}

TEST_CASE("a program compiled with SSR_CPU_DISPATCH=0 runs its own target's kernels alone", "[simd]") {
#if !SSR_CPU_DISPATCH
  REQUIRE_FALSE(ssr::cpu::runs(Isa::avx2));
  REQUIRE(ssr::cpu::current_isa() == Isa::baseline);
  REQUIRE_THROWS_WITH(ssr::cpu::use_isa(Isa::avx2),
                      Catch::Contains("is not one this program has kernels for and this processor runs"));
#else
  SUCCEED("this program has the AVX2 kernels");
#endif
}

TEMPLATE_TEST_CASE("every instruction set gives the same bits", "[simd]", float, double) {
  using T = TestType;
  const index_t n = GENERATE(1, 5, 8, 16, 37);
  const index_t m = 203;  // a last, partial tile
  const auto s = test::random_logits<T>(m, n, 2.0, static_cast<unsigned>(n), 3.0);
  const Context ctx = Context::train(3, 1, 7);
  INFO("n " << n);
  for (const Cost cost : {Cost::linear, Cost::softmax}) {
    for (int k : {1, 2, 5}) {
      if (k > n) continue;
      require_same_on_every_isa(ssr::SoftmaxTopK(k, cost), s, m, n, ctx);
      require_same_on_every_isa(ssr::NoisyCost<ssr::SoftmaxTopK>(ssr::SoftmaxTopK(k, cost), 0.5, 1.0), s, m, n, ctx);
      for (double xi : {0.5, 0.05})
        for (auto weights : {ssr::Weights::plan, ssr::Weights::scores})
          require_same_on_every_isa(
              ssr::NoisyCost<ssr::SinkhornTopK>(ssr::SinkhornTopK(k, cost, {xi, 1e-6, 40}, weights), 0.3, 1.0), s, m, n,
              ctx);
    }
  }
}

TEST_CASE("the float exp is within 1 ulp of the exact value wherever its result is normal", "[simd]") {
  // Every 257th float of [-87.3, 88] (the formula clamps to [-88, 88]); the vector kernels run the same
  // formula (the test above).
  std::uint32_t lo_bits, hi_bits;
  const float lo = -87.3f, hi = 88.0f;
  std::memcpy(&lo_bits, &lo, sizeof lo_bits);
  std::memcpy(&hi_bits, &hi, sizeof hi_bits);
  double worst = 0;
  const auto check = [&](float x) {
    const float y = ssr::math::exp_as<float>(x);
    const long double exact = std::exp(static_cast<long double>(x));
    const long double ulp = std::ldexp(1.0L, std::ilogb(static_cast<float>(exact)) - 23);
    worst = std::max(worst, static_cast<double>(std::fabs(static_cast<long double>(y) - exact) / ulp));
  };
  for (std::uint32_t b = 0; b <= hi_bits; b += 257) {  // positive floats up to hi
    float x;
    std::memcpy(&x, &b, sizeof x);
    check(x);
  }
  for (std::uint32_t b = 0x80000000u; b <= lo_bits; b += 257) {  // negative floats down to lo
    float x;
    std::memcpy(&x, &b, sizeof x);
    check(x);
  }
  CHECK(worst < 1.0);
  CHECK(ssr::math::exp_as<float>(-1000.0f) == 0.0f);
  CHECK(ssr::math::exp_as<float>(-std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(ssr::math::exp_as<float>(0.0f) == 1.0f);
  CHECK(ssr::math::exp_as<float>(1000.0f) == ssr::math::exp_as<float>(88.0f));
}

TEST_CASE("subnormals are flushed inside a scope only: the caller's setting comes back", "[simd]") {
  volatile float tiny = std::numeric_limits<float>::min();
  volatile float half = 0.5f;
  {
    const ssr::cpu::FlushSubnormals flush;
#if defined(__SSE2__)
    CHECK(tiny * half == 0.0f);
#endif
  }
  CHECK(tiny * half > 0.0f);
}

TEST_CASE("an aligned buffer lies on whole cache lines, and from 2 MiB on on whole 2 MiB pages, all of it usable",
          "[simd][workspace]") {
  using Buffer = ssr::detail::AlignedBuffer<float>;
  const std::size_t huge_floats = Buffer::huge_page / sizeof(float);
  Buffer buffer;
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, huge_floats - 1, huge_floats, 3 * huge_floats + 5}) {
    INFO(n << " floats");
    float* p = buffer.reserve(n);
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    CHECK(at % Buffer::alignment == 0);
#if defined(__linux__)
    if (n * sizeof(float) >= Buffer::huge_page) CHECK(at % Buffer::huge_page == 0);
#endif
    CHECK(buffer.capacity() == n);
    std::fill(p, p + n, 1.0f);  // every element is there (the sanitizers check the bounds)
    CHECK(std::accumulate(p, p + n, 0.0) == static_cast<double>(n));
  }
  CHECK(buffer.reserve(1) == buffer.data());  // it only grows
  CHECK(buffer.capacity() == 3 * huge_floats + 5);
}
