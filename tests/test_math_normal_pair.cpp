// math::normal_pair, the Box-Muller pair of the cost noise on every backend: its log, cos and sin within
// 1 ulp of the exact values (long double as the reference), exact where they are, and the same bits
// whichever fused multiply-add computes them.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>

#include "ssr/math/normal_pair.hpp"
#include "ssr/random.hpp"
#include "ulps.hpp"

namespace {

using ssr::math::Fused;
using ssr::math::SqrtDouble;

double log_of(double x) {
  double y = 0;
  ssr::math::log_of<double, std::uint64_t>(x, y, Fused{});
  return y;
}

void cos_sin_turn(double u, double& c, double& s) {
  ssr::math::cos_sin_turn_of<double, std::uint64_t>(u, c, s, Fused{});
}

// cos(2 pi u) and sin(2 pi u) in long double, from u's exact quarter-turn reduction (so that the reference
// keeps its relative precision near the zeros).
void exact_cos_sin_turn(double u, long double& c, long double& s) {
  const long double q = std::nearbyint(4.0L * u), r = static_cast<long double>(u) - q / 4;
  const long double two_pi = 6.283185307179586476925286766559005768L;
  const long double cr = std::cos(two_pi * r), sr = std::sin(two_pi * r);
  switch (static_cast<int>(q) & 3) {
    case 0:
      c = cr, s = sr;
      break;
    case 1:
      c = -sr, s = cr;
      break;
    case 2:
      c = -cr, s = -sr;
      break;
    default:
      c = sr, s = -cr;
      break;
  }
}

}  // namespace

TEST_CASE("math::log_of is within 1 ulp of log over the positive normal doubles", "[normal_pair]") {
  static_assert(std::numeric_limits<long double>::digits >= 64, "long double as the reference");
  std::mt19937_64 gen(21);
  double worst = 0;
  const auto check = [&](double x) {
    const double y = log_of(x);
    const double error = test::ulps(y, std::log(static_cast<long double>(x)));
    worst = std::max(worst, error);
    INFO("x " << x << " log " << y);
    REQUIRE(error <= 1.0);
  };
  std::uniform_int_distribution<std::uint32_t> word;
  for (int i = 0; i < 200000; ++i) check(ssr::random::uniform_open(word(gen)));  // the noise's uniforms
  for (const auto& range : {std::pair<double, double>{0.5, 2.0}, {0.999, 1.001}, {1e-10, 1}, {1, 1e10}}) {
    std::uniform_real_distribution<double> u(range.first, range.second);
    for (int i = 0; i < 100000; ++i) check(u(gen));
  }
  std::uniform_real_distribution<double> exponent(-1022, 1023);
  for (int i = 0; i < 100000; ++i) check(std::exp2(exponent(gen)));
  for (int k = -1021; k <= 1023; ++k) {  // powers of two and the reduction's edge, sqrt(2)/2 times them
    check(std::ldexp(1.0, k));
    check(std::ldexp(0.70710678118654757, k));
    check(std::ldexp(0.70710678118654746, k));
  }
  WARN("largest error " << worst << " ulp");
  CHECK(log_of(1.0) == 0.0);
  CHECK(log_of(std::numeric_limits<double>::min()) ==
        static_cast<double>(std::log(static_cast<long double>(std::numeric_limits<double>::min()))));
}

TEST_CASE("math::cos_sin_turn_of is within 1 ulp of cos and sin of 2 pi u on [0, 1]", "[normal_pair]") {
  std::mt19937_64 gen(22);
  double worst_cos = 0, worst_sin = 0;
  const auto check = [&](double u) {
    double c = 0, s = 0;
    long double ec = 0, es = 0;
    cos_sin_turn(u, c, s);
    exact_cos_sin_turn(u, ec, es);
    const double error_cos = test::ulps(c, ec), error_sin = test::ulps(s, es);
    worst_cos = std::max(worst_cos, error_cos);
    worst_sin = std::max(worst_sin, error_sin);
    INFO("u " << u << " cos " << c << " sin " << s);
    REQUIRE(error_cos <= 1.0);
    REQUIRE(error_sin <= 1.0);
  };
  std::uniform_int_distribution<std::uint32_t> word;
  for (int i = 0; i < 200000; ++i) check(ssr::random::uniform_open(word(gen)));
  std::uniform_real_distribution<double> unit(0, 1);
  for (int i = 0; i < 200000; ++i) check(unit(gen));
  for (int e = 1; e < 60; ++e)  // near the zeros and the ones, where the quarter turns meet
    for (const double quarter : {0.0, 0.25, 0.5, 0.75, 1.0})
      for (const double side : {-1.0, 1.0})
        if (quarter + side * std::ldexp(1.0, -e) >= 0 && quarter + side * std::ldexp(1.0, -e) <= 1)
          check(quarter + side * std::ldexp(1.0, -e));
  for (int i = 0; i <= 1024; ++i) check(i / 1024.0);  // the reduction's edges, r = +-1/8
  WARN("largest errors: cos " << worst_cos << " ulp, sin " << worst_sin << " ulp");
  double c = 0, s = 0;
  for (const auto& [u, ec, es] :
       {std::tuple<double, double, double>{0, 1, 0}, {0.25, 0, 1}, {0.5, -1, 0}, {0.75, 0, -1}, {1, 1, 0}}) {
    cos_sin_turn(u, c, s);
    INFO("u " << u);
    CHECK(c == ec);
    CHECK(s == es);
  }
}

TEST_CASE("math::normal_pair gives its formula's bits whichever fused multiply-add computes it", "[normal_pair]") {
  // math::normal_pair may take a copy compiled for the processor's FMA instruction; normal_pair_of here
  // computes each fused step through std::fma as this build compiles it.
  std::mt19937_64 gen(23);
  std::uniform_int_distribution<std::uint32_t> word;
  for (int i = 0; i < 100000; ++i) {
    const double u1 = ssr::random::uniform_open(word(gen)), u2 = ssr::random::uniform_open(word(gen));
    double a = 0, b = 0, fa = 0, fb = 0;
    ssr::math::normal_pair(u1, u2, a, b);
    ssr::math::normal_pair_of<double, std::uint64_t>(u1, u2, fa, fb, Fused{}, SqrtDouble{});
    INFO("u1 " << u1 << " u2 " << u2);
    REQUIRE(std::memcmp(&a, &fa, sizeof a) == 0);
    REQUIRE(std::memcmp(&b, &fb, sizeof b) == 0);
    // and the pair is the radius at the angle, within 3 ulps of the exact values' product
    long double ec = 0, es = 0;
    exact_cos_sin_turn(u2, ec, es);
    const long double radius = std::sqrt(-2.0L * std::log(static_cast<long double>(u1)));
    REQUIRE(test::ulps(a, radius * ec) <= 3.0);
    REQUIRE(test::ulps(b, radius * es) <= 3.0);
  }
}
