// One ssr-route run's data: the logits (mapped where the file holds them as they lie, else read) and dL/dw
// from their files, the outputs routing fills, and writing them (as one set, see Output) with the JSON
// summary.
#pragma once

#include <ssr/load_stats.hpp>
#include <ssr/router.hpp>

#include <xtensor/xtensor.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "npy.hpp"
#include "options.hpp"
#include "output.hpp"

namespace ssr_route {

template <class T>
struct Job {
  ssr::index_t m = 0, n = 0, k = 0;
  ssr::SSRPolicy policy;
  MappedMatrix<T> mapped;    // the logits file, where it holds T as it lies; else
  xt::xtensor<T, 2> logits;  // the logits read from it
  xt::xtensor<T, 2> grad_w, weights, noise, plan, grad_s;
  xt::xtensor<std::int32_t, 2> experts;
  std::vector<std::int32_t> load;
  std::vector<float> expert_bias;  // --expert-bias: n finite floats (empty: none)
  ssr::RouteInfo info;

  // Reads the files and allocates the outputs; throws UsageError or ssr::Error for bad input.
  explicit Job(const Options& o) : policy(ssr::make_policy(o.router)) {
    check_output_dir(o.out);  // before the work, not after it
    mapped = MappedMatrix<T>::map(o.logits, "--logits");
    if (!mapped.empty()) {
      m = mapped.rows();
      n = mapped.cols();
    } else {
      logits = load_matrix<T>(o.logits, "--logits");
      m = static_cast<ssr::index_t>(logits.shape()[0]);
      n = static_cast<ssr::index_t>(logits.shape()[1]);
    }
    k = o.router.k;
    if (!o.grad_weights.empty()) {
      grad_w = load_matrix<T>(o.grad_weights, "--grad-weights");
      if (grad_w.shape()[0] != static_cast<std::size_t>(m) || grad_w.shape()[1] != static_cast<std::size_t>(k))
        throw UsageError("--grad-weights has shape " + std::to_string(grad_w.shape()[0]) + "x" +
                         std::to_string(grad_w.shape()[1]) + ", expected " + std::to_string(m) + "x" + std::to_string(k));
    }
    if (!o.expert_bias.empty()) {
      expert_bias = load_vector<float>(o.expert_bias, "--expert-bias");
      if (expert_bias.size() != static_cast<std::size_t>(n))
        throw UsageError("--expert-bias has " + std::to_string(expert_bias.size()) + " entries, expected one per expert (" +
                         std::to_string(n) + ")");
      for (std::size_t j = 0; j < expert_bias.size(); ++j)
        if (!std::isfinite(expert_bias[j]))
          throw UsageError("--expert-bias[" + std::to_string(j) + "] = " + std::to_string(expert_bias[j]) + ": must be finite");
    }
    experts.resize(dims(m, k));
    weights.resize(dims(m, k));
    noise.resize(dims(o.dump_noise ? m : 0, n));
    plan.resize(dims(o.dump_plan ? m : 0, n));
    grad_s.resize(dims(o.grad_weights.empty() ? 0 : m, n));
    load.assign(static_cast<std::size_t>(n), 0);
  }

  ssr::ConstMatrixView<T> in() const { return {mapped.empty() ? logits.data() : mapped.data(), m, n}; }
  // The command line's context with the expert bias (host memory).
  ssr::Context context(const Options& o) const {
    return expert_bias.empty() ? o.ctx : o.ctx.with_bias({expert_bias.data(), n});
  }
  ssr::RouteOutputs<T> outputs() {
    ssr::RouteOutputs<T> out{{experts.data(), m, k}, {weights.data(), m, k}, {load.data(), n}};
    if (noise.size() > 0) out.noise = {noise.data(), m, n};
    if (plan.size() > 0) out.plan = {plan.data(), m, n};
    return out;
  }
  ssr::ConstMatrixView<T> grad_in() const {
    return grad_s.size() > 0 ? ssr::ConstMatrixView<T>{grad_w.data(), m, k} : ssr::ConstMatrixView<T>{};
  }
  ssr::MatrixView<T> grad_out() { return grad_s.size() > 0 ? ssr::MatrixView<T>{grad_s.data(), m, n} : ssr::MatrixView<T>{}; }

  // Writes the outputs and prints the JSON summary; a distributed run (ranks: its MPI ranks, 0 for one
  // process) adds "ranks".
  void write(const Options& o, int ranks) const {
    Output files(o.out);
    files.add("experts.npy", experts);
    files.add("weights.npy", weights);
    if (grad_s.size() > 0) files.add("grad_logits.npy", grad_s);
    if (o.dump_noise) files.add("noise.npy", noise);
    if (o.dump_plan && info.path == ssr::Path::sinkhorn) files.add("plan.npy", plan);
    files.commit();

    const ssr::LoadStats st = ssr::load_stats({load.data(), n});
    std::string json = "{\"path\": \"" + std::string(ssr::to_string(info.path)) +
                       "\", \"iterations\": " + std::to_string(info.iterations) + ", \"marginal_error\": " +
                       (info.path == ssr::Path::sinkhorn ? json_number(info.marginal_error) : std::string("null")) +
                       ", \"converged\": " + (info.converged ? "true" : "false") + ", \"load\": [";
    for (ssr::index_t j = 0; j < n; ++j) json += (j ? ", " : "") + std::to_string(load[static_cast<std::size_t>(j)]);
    json += "], \"max_over_mean\": " + json_number(st.max_over_mean) + ", \"cv\": " + json_number(st.cv) +
            ", \"empty_experts\": " + std::to_string(st.empty_experts);
    if (ranks > 0) json += ", \"ranks\": " + std::to_string(ranks);
    std::printf("%s}\n", json.c_str());
  }

 private:
  static std::array<std::size_t, 2> dims(ssr::index_t r, ssr::index_t c) {
    return {static_cast<std::size_t>(r), static_cast<std::size_t>(c)};
  }
};

}  // namespace ssr_route
