// ssr::Error and the argument checks every entry point runs before it writes anything.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ssr {

// Thrown for every invalid argument; the message names the argument and its value.
class Error : public std::invalid_argument {
 public:
  explicit Error(const std::string& what) : std::invalid_argument("ssr: " + what) {}
};

namespace detail {

template <class V>
std::string describe(const char* name, const V& value) {
  std::ostringstream os;
  os.precision(9);
  os << name << " = " << value;
  return os.str();
}

// Throws "ssr: invalid NAME = VALUE: REQUIREMENT" unless ok.
template <class V>
void require(bool ok, const char* name, const V& value, const std::string& requirement) {
  if (!ok) throw Error("invalid " + describe(name, value) + ": " + requirement);
}

}  // namespace detail
}  // namespace ssr
