// Distances in units in the last place, for the tests of the library's own elementary functions.
#pragma once

#include <cmath>
#include <limits>

namespace test {

// |a - exact| in units of the last place of the double nearest exact (the least subnormal below the
// normals).
inline double ulps(double a, long double exact) {
  const double nearest = static_cast<double>(exact);
  const double ulp = std::nextafter(std::fabs(nearest), std::numeric_limits<double>::infinity()) - std::fabs(nearest);
  return static_cast<double>(std::fabs(static_cast<long double>(a) - exact) / ulp);
}

}  // namespace test
