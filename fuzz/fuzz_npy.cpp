// libFuzzer target: ssr-route's .npy reading path on arbitrary bytes. Every input either reads as a matrix
// or is rejected with a UsageError; anything else (a crash, a sanitizer report, another exception, an
// allocation the file's size does not justify) is a finding.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "../examples/ssr-route/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size), std::ios::binary);
  try {
    const auto f = ssr_route::read_matrix<float>(in, size, "input.npy", "--logits");
    in.clear();
    in.seekg(0);
    const auto d = ssr_route::read_matrix<double>(in, size, "input.npy", "--logits");
    if (f.size() != d.size()) __builtin_trap();
    // Read back what was read: the matrix needs no more bytes than the file holds.
    if (f.size() * 4 > size) __builtin_trap();
  } catch (const ssr_route::UsageError&) {
  }
  return 0;
}
