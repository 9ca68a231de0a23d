// The per-call context: training or evaluation, the (seed, layer, step) that key every random draw,
// where this call's rows lie among all the rows of a problem shared by many ranks, and the expert bias
// of this step.
#pragma once

#include <cstdint>

#include "ssr/view.hpp"

namespace ssr {

enum class Mode { train, eval };

struct Context {
  Mode mode = Mode::eval;
  std::uint64_t step = 0;   // training step: the counter of the random streams
  std::uint32_t layer = 0;  // MoE block index: part of the key, so layers draw independent streams
  std::uint32_t seed = 0;   // run seed: the other part of the key
  // The global index of this call's first row when ranks route shards of one problem (CallOptions::
  // communicator): token i's random draws are those of global row first_row + i. 0 for one process.
  std::uint64_t first_row = 0;
  // Auxiliary-loss-free balancing (DeepSeek-V3): n per-expert biases added to the scores when the softmax
  // path selects (not to the weights), in the backend's memory (device memory for a GPU backend), finite.
  // Empty: none. The engine owns and updates them between steps (ssr/expert_bias.hpp).
  VectorView<const float> expert_bias{};

  static constexpr Context train(std::uint64_t step, std::uint32_t layer = 0, std::uint32_t seed = 0) {
    return Context{Mode::train, step, layer, seed, 0, {}};
  }
  static constexpr Context eval() { return Context{}; }
  // The same context for the shard whose first row is global row `row`.
  constexpr Context at_row(std::uint64_t row) const {
    Context c = *this;
    c.first_row = row;
    return c;
  }
  // The same context with these expert biases.
  constexpr Context with_bias(VectorView<const float> bias) const {
    Context c = *this;
    c.expert_bias = bias;
    return c;
  }
};

}  // namespace ssr
