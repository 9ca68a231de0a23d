// A 64-bit digest of a call's arguments that every rank must hold alike (ssr::agree compares it across
// ranks): a running mix of each value's bits, doubles by their bit pattern.
#pragma once

#include <cstdint>
#include <cstring>

namespace ssr {
namespace detail {

class Digest {
 public:
  Digest& add(std::uint64_t value) {
    state_ = mix(state_ ^ (value + 0x9e3779b97f4a7c15ULL));
    return *this;
  }
  Digest& add(double value) {
    std::uint64_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    return add(bits);
  }
  Digest& add(std::int64_t value) { return add(static_cast<std::uint64_t>(value)); }
  Digest& add(int value) { return add(static_cast<std::uint64_t>(static_cast<std::int64_t>(value))); }
  std::uint64_t value() const { return state_; }

 private:
  // splitmix64's finaliser: every input bit moves about half the output bits.
  static std::uint64_t mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  std::uint64_t state_ = 0;
};

}  // namespace detail
}  // namespace ssr
