// The per-call context: training or evaluation, and the (seed, layer, step) that key every random draw.
#pragma once

#include <cstdint>

namespace ssr {

enum class Mode { train, eval };

struct Context {
  Mode mode = Mode::eval;
  std::uint64_t step = 0;   // training step: the counter of the random streams
  std::uint32_t layer = 0;  // MoE block index: part of the key, so layers draw independent streams
  std::uint32_t seed = 0;   // run seed: the other part of the key

  static constexpr Context train(std::uint64_t step, std::uint32_t layer = 0, std::uint32_t seed = 0) {
    return Context{Mode::train, step, layer, seed};
  }
  static constexpr Context eval() { return Context{}; }
};

}  // namespace ssr
