// ssr::Error and the argument checks every entry point runs before it writes anything. A check builds
// its message only when it fails, so checks cost nothing on the hot path (no strings, no allocation).
#pragma once

#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>

namespace ssr {

// Thrown for every invalid argument; the message names the argument and its value.
class Error : public std::invalid_argument {
 public:
  explicit Error(const std::string& what) : std::invalid_argument("ssr: " + what) {}
};

// Thrown when the machine fails a valid call: memory that cannot be allocated, a CUDA runtime, MPI or NCCL
// error. Nothing about the arguments; the call may succeed later (e.g. with memory freed).
class RuntimeError : public std::runtime_error {
 public:
  explicit RuntimeError(const std::string& what) : std::runtime_error("ssr: " + what) {}
};

namespace detail {

// An element's name in a message: name[i] of a vector, name(i, j) of a matrix.
struct Indexed {
  const char* name;
  std::ptrdiff_t i;
  std::ptrdiff_t j = -1;
};

inline std::ostream& operator<<(std::ostream& os, const Indexed& e) {
  if (e.j < 0) return os << e.name << '[' << e.i << ']';
  return os << e.name << '(' << e.i << ", " << e.j << ')';
}

// The parts streamed one after the other, numbers with 9 significant digits.
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  os.precision(9);
  (os << ... << parts);
  return os.str();
}

template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  throw Error(concat(parts...));
}

// Throws "ssr: invalid NAME = VALUE: REQUIREMENT..." unless ok.
template <class Name, class V, class... Requirement>
void require(bool ok, const Name& name, const V& value, const Requirement&... requirement) {
  if (!ok) fail("invalid ", name, " = ", value, ": ", requirement...);
}

}  // namespace detail
}  // namespace ssr
