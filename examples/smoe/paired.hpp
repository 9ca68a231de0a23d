// Paired comparisons over seeds. Every router of the demo trains with the same seeds, data order and
// initialisation, so the difference of two routers' results seed by seed removes the spread that the seed
// gives both; its mean and a 95% confidence interval by the paired t test say whether the data separate them.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <vector>

namespace smoe {

// The 97.5% quantile of Student's t with df degrees of freedom: exact to four places from a table up to
// 30, then the Cornish-Fisher expansion around the normal quantile (within 1e-4 from there on).
inline double t_quantile_975(int df) {
  static constexpr double table[] = {12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
                                     2.2010,  2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
                                     2.0796,  2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423};
  if (df < 1) throw std::invalid_argument("t_quantile_975: df must be at least 1");
  if (df <= 30) return table[df - 1];
  const double z = 1.959963984540054, v = df;
  return z + (z * z * z + z) / (4 * v) + (5 * std::pow(z, 5) + 16 * z * z * z + 3 * z) / (96 * v * v);
}

// The mean of a[s] - b[s] over the n seeds and its 95% interval [low, high]; with one seed the interval
// is unknown (NaN).
struct PairedDifference {
  double mean = 0, low = 0, high = 0;
  std::size_t seeds = 0;

  bool known() const { return seeds >= 2; }
  // The interval lies on one side of zero: the seeds separate the two.
  bool excludes_zero() const { return known() && (low > 0 || high < 0); }
};

inline PairedDifference paired_difference(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size() || a.empty()) throw std::invalid_argument("paired_difference: one value per seed in each");
  const std::size_t n = a.size();
  PairedDifference d;
  d.seeds = n;
  for (std::size_t s = 0; s < n; ++s) d.mean += (a[s] - b[s]) / static_cast<double>(n);
  if (n < 2) {
    d.low = d.high = std::numeric_limits<double>::quiet_NaN();
    return d;
  }
  double var = 0;
  for (std::size_t s = 0; s < n; ++s) var += (a[s] - b[s] - d.mean) * (a[s] - b[s] - d.mean);
  const double half =
      t_quantile_975(static_cast<int>(n - 1)) * std::sqrt(var / static_cast<double>(n - 1) / static_cast<double>(n));
  d.low = d.mean - half;
  d.high = d.mean + half;
  return d;
}

}  // namespace smoe
