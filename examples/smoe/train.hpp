// Training and evaluation of the byte-level model with one router: Adam steps on random batches (and the
// expert-bias update), the per-step record (loss, expert load, dropped tokens, Sinkhorn calls, time), and
// validation with and without balancing, with and without capacity, on clean and attacked text.
#pragma once

#include <ssr/router.hpp>

#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "adam.hpp"
#include "byte_lm.hpp"
#include "corpus.hpp"

namespace smoe {

struct TrainOptions {
  int steps = 600;
  Index batch = 256;           // tokens per step, routed together
  std::uint64_t seed = 0;      // model initialisation, batches, and every routing draw
  AdamOptions adam;
  Index seq_len = 1;           // batches of sequences of this many consecutive predictions (1: positions)
  Index eval_tokens = 16384;   // validation predictions
  int eval_every = 0;          // validate every this many steps as well as at the end (0: at the end only)
  double attack = 0;           // also validate on the validation text with this fraction of bytes randomised
  std::uint64_t attack_seed = 1;
};

struct StepRecord {
  int step = 0;
  double train_bits = 0;      // cross-entropy of the batch, bits per byte
  double aux_loss = 0;        // the layers' weighted auxiliary losses
  double max_over_mean = 0;   // expert load of the batch, mean over layers
  double cv = 0;              // coefficient of variation of the load, mean over layers
  int empty_experts = 0;      // summed over layers
  double dropped = 0;         // share of the assignments over capacity, mean over layers
  int sinkhorn_layers = 0;    // layers whose router took the Sinkhorn path
  double seconds = 0;         // forward, backward and Adam
  double routing_seconds = 0; // of which gate, router and auxiliary losses
  double valid_bits = std::numeric_limits<double>::quiet_NaN();  // when validated at this step
};

// Validation: bits per byte, and the expert load over the whole validation set (mean over layers;
// empty experts summed over layers).
struct Evaluation {
  double bits_per_byte = 0;
  double max_over_mean = 0;
  double cv = 0;
  int empty_experts = 0;
  double dropped = 0;                // share of the assignments over capacity, mean over layers
  std::vector<double> output_norm;   // per layer: mean over tokens of the SMoE block's output norm
};

struct RunResult {
  std::vector<StepRecord> history;
  Evaluation eval_softmax;      // inference as deployed: the router's evaluation path, with capacity
  Evaluation eval_no_capacity;  // the same without dropping any token
  Evaluation eval_attacked;     // as deployed, on the attacked validation text (TrainOptions::attack > 0)
  Evaluation eval_sinkhorn;     // inference routed by Sinkhorn (balanced), same parameters
  double seconds_per_step = 0, routing_seconds_per_step = 0;
  double train_max_over_mean = 0;  // mean over steps
  double train_dropped = 0;        // mean over steps
  int sinkhorn_calls = 0;          // (layer, step) calls that took the Sinkhorn path
};

// The router that balances at inference: Sinkhorn top-k with plan weights (xi = 0.5), run with a training
// context (SinkhornTopK routes as softmax top-k in evaluation mode) but without any parameter update.
inline ssr::SinkhornTopK balanced_inference_policy(int k) {
  return ssr::SinkhornTopK(k, ssr::Cost::linear, {0.5, 1e-4, 100}, ssr::Weights::plan);
}

template <class T, class Router>
Evaluation evaluate(ByteLM<T>& model, Router& router, const std::vector<Batch>& batches, const ssr::Context& ctx,
                    bool capacity = true) {
  const auto n = static_cast<std::size_t>(model.options().experts);
  const auto layers = static_cast<std::size_t>(model.layers());
  std::vector<std::vector<std::int32_t>> load(layers, std::vector<std::int32_t>(n, 0));
  double nats = 0;
  Index tokens = 0, assignments = 0, dropped = 0;
  Evaluation e;
  e.output_norm.assign(layers, 0.0);
  Pass pass;
  pass.ctx = ctx;
  pass.capacity = capacity;
  for (const Batch& b : batches) {
    model.forward(router, b, pass);
    nats += model.cross_entropy() * static_cast<double>(b.size());
    tokens += b.size();
    for (int l = 0; l < model.layers(); ++l) {
      const LayerCache<T>& c = model.cache(l);
      for (std::size_t j = 0; j < n; ++j) load[static_cast<std::size_t>(l)][j] += c.load[j];
      assignments += c.experts.size();
      dropped += c.dropped;
      e.output_norm[static_cast<std::size_t>(l)] += c.output_norm * static_cast<double>(b.size());
    }
  }
  for (double& norm : e.output_norm) norm /= static_cast<double>(tokens);
  e.dropped = assignments > 0 ? static_cast<double>(dropped) / static_cast<double>(assignments) : 0.0;
  e.bits_per_byte = nats / static_cast<double>(tokens) / std::log(2.0);
  for (const auto& per_layer : load) {
    const ssr::LoadStats st = ssr::load_stats({per_layer.data(), static_cast<ssr::index_t>(n)});
    e.max_over_mean += st.max_over_mean / static_cast<double>(load.size());
    e.cv += st.cv / static_cast<double>(load.size());
    e.empty_experts += static_cast<int>(st.empty_experts);
  }
  return e;
}

// Trains a fresh model (model_options, its layer options included) with the router of policy, and
// validates it. on_step sees every step's record as it is made.
template <class T = float, class Policy>
RunResult train(const Policy& policy, const ModelOptions& model_options, const Corpus& corpus,
                const TrainOptions& options, const std::function<void(const StepRecord&)>& on_step = {}) {
  using Clock = std::chrono::steady_clock;
  ModelOptions sized = model_options;
  sized.layer.seq_len = options.seq_len;  // the sequences of the sequence-wise loss are the batch's
  ByteLM<T> model(sized, options.seed);
  ssr::Router<Policy, ssr::CpuBackend<T>> router(policy);
  Adam<T> adam(model.tensors(), options.adam);
  Rng data(options.seed ^ 0xd1b54a32d192ed03ull);
  const auto valid =
      sequential_batches(corpus.valid, options.batch, model_options.context, options.eval_tokens, options.seq_len);
  const auto attacked =
      options.attack > 0
          ? sequential_batches(attack(corpus.valid, options.attack, options.attack_seed), options.batch,
                               model_options.context, options.eval_tokens, options.seq_len)
          : std::vector<Batch>{};
  const auto seed = static_cast<std::uint32_t>(options.seed);

  RunResult result;
  for (int step = 0; step < options.steps; ++step) {
    const Batch batch = sample_batch(corpus.train, options.batch, model_options.context, data, options.seq_len);
    const auto start = Clock::now();
    Pass pass;
    pass.ctx = ssr::Context::train(static_cast<std::uint64_t>(step), 0, seed);
    pass.gate_noise = true;
    model.zero_grad();
    model.forward(router, batch, pass);
    model.backward(router);
    adam.step();
    for (int l = 0; l < model.layers(); ++l) model.layer(l).update_bias(model.cache(l));

    StepRecord r;
    r.step = step;
    r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    r.train_bits = model.cross_entropy() / std::log(2.0);
    r.aux_loss = model.aux_loss();
    for (int l = 0; l < model.layers(); ++l) {
      const LayerCache<T>& c = model.cache(l);
      const ssr::LoadStats st = ssr::load_stats({c.load.data(), static_cast<ssr::index_t>(c.load.size())});
      r.max_over_mean += st.max_over_mean / model.layers();
      r.cv += st.cv / model.layers();
      r.empty_experts += static_cast<int>(st.empty_experts);
      r.dropped += static_cast<double>(c.dropped) / static_cast<double>(c.experts.size()) / model.layers();
      r.sinkhorn_layers += c.info.path == ssr::Path::sinkhorn;
      r.routing_seconds += c.routing_seconds;
    }
    if (options.eval_every > 0 && (step + 1) % options.eval_every == 0 && step + 1 < options.steps)
      r.valid_bits = evaluate(model, router, valid, ssr::Context::eval()).bits_per_byte;
    if (step + 1 == options.steps) {
      result.eval_softmax = evaluate(model, router, valid, ssr::Context::eval());
      result.eval_no_capacity = evaluate(model, router, valid, ssr::Context::eval(), false);
      if (!attacked.empty()) result.eval_attacked = evaluate(model, router, attacked, ssr::Context::eval());
      ssr::Router<ssr::SinkhornTopK, ssr::CpuBackend<T>> balanced(balanced_inference_policy(router.resolve({}).k));
      result.eval_sinkhorn = evaluate(model, balanced, valid, ssr::Context::train(0, 0, seed));
      r.valid_bits = result.eval_softmax.bits_per_byte;
    }
    result.seconds_per_step += r.seconds / options.steps;
    result.routing_seconds_per_step += r.routing_seconds / options.steps;
    result.train_max_over_mean += r.max_over_mean / options.steps;
    result.train_dropped += r.dropped / options.steps;
    result.sinkhorn_calls += r.sinkhorn_layers;
    result.history.push_back(r);
    if (on_step) on_step(r);
  }
  return result;
}

}  // namespace smoe
