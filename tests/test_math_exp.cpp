// math::exp, the double exp every backend's costs take: within 1 ulp of the exact value (long double's exp
// as the reference), exact where exp is, and the limits of double's range.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "ssr/math/exp.hpp"
#include "ulps.hpp"

TEST_CASE("math::exp is within 1 ulp of exp over double's range", "[exp]") {
  static_assert(std::numeric_limits<long double>::digits >= 64, "long double as the reference");
  std::mt19937_64 gen(11);
  double worst = 0;
  const auto check = [&](double x) {
    const double e = ssr::math::exp(x);
    const double error = test::ulps(e, std::exp(static_cast<long double>(x)));
    worst = std::max(worst, error);
    INFO("x " << x << " exp " << e);
    REQUIRE(error <= 1.0);
  };
  for (const auto& range : {std::pair<double, double>{-0.35, 0.35}, {-40, 0}, {-708, 709}, {-745, -708}}) {
    std::uniform_real_distribution<double> u(range.first, range.second);
    for (int i = 0; i < 200000; ++i) check(u(gen));
  }
  for (int k = -1074; k <= 1023; ++k) check(k * 0.6931471805599453);  // near the reduction's edges
  WARN("largest error " << worst << " ulp");
}

TEST_CASE("math::exp is exact at 0 and gives the limits of the range", "[exp]") {
  const double inf = std::numeric_limits<double>::infinity();
  CHECK(ssr::math::exp(0.0) == 1.0);
  CHECK(ssr::math::exp(-0.0) == 1.0);
  CHECK(ssr::math::exp(-inf) == 0.0);
  CHECK(ssr::math::exp(-746.0) == 0.0);
  CHECK(ssr::math::exp(-1e300) == 0.0);
  CHECK(ssr::math::exp(inf) == inf);
  CHECK(ssr::math::exp(709.8) == inf);
  CHECK(ssr::math::exp(1e300) == inf);
  CHECK(std::isfinite(ssr::math::exp(709.78)));
  CHECK(std::isnan(ssr::math::exp(std::numeric_limits<double>::quiet_NaN())));
  // The subnormals: rounded once, within one of their steps of the exact value.
  for (double x = -744.5; x < -708.4; x += 0.25) {
    const double e = ssr::math::exp(x);
    INFO("x " << x);
    CHECK(std::fabs(static_cast<long double>(e) - std::exp(static_cast<long double>(x))) <=
          static_cast<long double>(std::numeric_limits<double>::denorm_min()));
  }
  CHECK(ssr::math::exp(-745.0) == std::numeric_limits<double>::denorm_min());
}

TEST_CASE("math::exp gives its formula's bits whichever fused multiply-add computes it", "[exp]") {
  // math::exp may take a copy compiled for the processor's FMA instruction; exp_of here computes each
  // fused step through std::fma as this build compiles it (a call to libm in a build for the x86-64 baseline).
  std::mt19937_64 gen(12);
  std::uniform_real_distribution<double> u(-750, 720);
  for (int i = 0; i < 100000; ++i) {
    const double x = u(gen);
    double formula = 0;
    ssr::math::exp_of<double, std::uint64_t>(x, formula, ssr::math::Fused{});
    const double e = ssr::math::exp(x);
    INFO("x " << x);
    REQUIRE(std::memcmp(&e, &formula, sizeof e) == 0);
  }
}
