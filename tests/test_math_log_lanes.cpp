// The log-domain column update's logsumexp in lanes (math/sinkhorn.hpp), the order every backend keeps:
// accurate against long double, independent of the entries' shift, and finite where lanes have no rows.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ssr/math/sinkhorn.hpp"
#include "ulps.hpp"

namespace math = ssr::math;
using ssr::index_t;

namespace {

// logsumexp of the column from recovered_column_potential: log(m/n) - potential, with a target of m/n = 1.
double lanes_lse(const std::vector<double>& column) {
  const math::ColumnTarget unit{1.0, 0.0};
  const double g = math::recovered_column_potential<double>(static_cast<index_t>(column.size()),
                                                            [&](index_t i) { return column[i]; }, unit);
  return -g;
}

long double exact_lse(const std::vector<double>& column) {
  long double top = -std::numeric_limits<long double>::infinity(), sum = 0;
  for (const double x : column) top = std::max(top, static_cast<long double>(x));
  for (const double x : column) sum += std::exp(static_cast<long double>(x) - top);
  return top + std::log(sum);
}

}  // namespace

TEST_CASE("the lanes' logsumexp is within a few ulps of long double's, for every count of rows", "[sinkhorn][math]") {
  std::mt19937_64 gen(5);
  for (const index_t m : {1, 2, 7, 255, 256, 257, 511, 1000, 9001, 70000}) {
    for (const double spread : {0.1, 10.0, 700.0}) {
      std::normal_distribution<double> normal(-300.0, spread);
      std::vector<double> column(static_cast<std::size_t>(m));
      for (auto& x : column) x = normal(gen);
      const double lse = lanes_lse(column);
      INFO("m " << m << " spread " << spread << " lse " << lse);
      REQUIRE(test::ulps(lse, exact_lse(column)) <= 8.0);
    }
  }
}

TEST_CASE("a lane without rows, or whose entries are all -inf, adds nothing", "[sinkhorn][math]") {
  const auto none = math::log_lane(3, [](index_t) { return -std::numeric_limits<double>::infinity(); }, 1);
  REQUIRE(none.top == -std::numeric_limits<double>::infinity());
  REQUIRE(none.sum == 0.0);
  const auto empty = math::log_lane(3, [](index_t) { return 1.0; }, 5);  // lane 5 of 3 rows
  REQUIRE(empty.sum == 0.0);
  const auto merged = math::merge_log_lanes(none, math::LogLane{2.0, 1.5});
  REQUIRE(merged.top == 2.0);
  REQUIRE(merged.sum == 1.5);
  // One row of -inf among finite ones, and one finite row among -inf ones.
  std::vector<double> column(600, -std::numeric_limits<double>::infinity());
  column[437] = -50.0;
  REQUIRE(lanes_lse(column) == -50.0);
  column.assign(600, 3.0);
  column[0] = -std::numeric_limits<double>::infinity();
  REQUIRE(std::isfinite(lanes_lse(column)));
  REQUIRE(test::ulps(lanes_lse(column), exact_lse(column)) <= 8.0);
}

TEST_CASE("the lanes keep their order: each lane's rows in row order, merged pairwise", "[sinkhorn][math]") {
  // The lanes computed one by one, as a GPU's threads do, then merged as the host does, give its bits.
  std::mt19937_64 gen(9);
  std::normal_distribution<double> normal(0.0, 30.0);
  const index_t m = 3001;
  std::vector<double> column(static_cast<std::size_t>(m));
  for (auto& x : column) x = normal(gen);
  const auto entry = [&](index_t i) { return column[i]; };
  std::vector<math::LogLane> lanes(static_cast<std::size_t>(math::log_lanes));
  for (index_t l = math::log_lanes - 1; l >= 0; --l) lanes[l] = math::log_lane(m, entry, l);  // any order
  for (index_t l = 0; l < math::log_lanes; ++l) {
    double top = -std::numeric_limits<double>::infinity(), sum = 0;
    for (index_t i = l; i < m; i += math::log_lanes) top = std::max(top, column[i]);
    for (index_t i = l; i < m; i += math::log_lanes) sum += math::exp(column[i] - top);
    REQUIRE(lanes[l].top == top);
    REQUIRE(lanes[l].sum == sum);
  }
  const double lse = math::log_lanes_lse(lanes.data());
  REQUIRE(lse == lanes_lse(column));
  REQUIRE(test::ulps(lse, exact_lse(column)) <= 8.0);
}
