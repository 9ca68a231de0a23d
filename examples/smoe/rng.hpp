// The example's random generator: parameter initialisation, the generated corpus and batch sampling.
// The std distributions differ between standard libraries; these formulas do not, so a seed gives the
// same numbers everywhere.
#pragma once

#include <cmath>
#include <cstdint>

namespace smoe {

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}

  // SplitMix64.
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }

  // Uniform integer in [0, n); the modulo bias is negligible for the small n used here.
  std::uint64_t below(std::uint64_t n) { return next() % n; }

  // Standard normal (Box-Muller; the second value of the pair is dropped to keep no state).
  double normal() {
    const double u = 1.0 - uniform();  // in (0, 1]: finite log
    return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586476925 * uniform());
  }

 private:
  std::uint64_t state_;
};

}  // namespace smoe
