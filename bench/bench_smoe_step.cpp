// One SMoE layer's training step (forward, backward, Adam) at the paper's layer shape, d = 352, n = 16,
// k = 2, with m = 4096 tokens and experts of hidden width h = 704, for each router. The counter
// routing_share is the part spent in the gate's products, the router (route and backward), grouping and
// the auxiliary losses. After the table: each router's step time over softmax top-k's, from this run, in
// wall-clock and CPU time (medians over --benchmark_repetitions, which a busy machine needs).
#include <benchmark/benchmark.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "adam.hpp"
#include "routers.hpp"
#include "smoe_layer.hpp"

namespace {

constexpr smoe::Index tokens = 4096, dim = 352, hidden = 704, experts = 16;

void training_step(benchmark::State& state, const std::string& router_name) {
  smoe::RouterSettings settings;
  settings.p = 1e-3;  // SSR as in the paper: Sinkhorn on about one call in a thousand
  smoe::with_router(router_name, settings, [&](const auto& policy, const smoe::LayerOptions& options) {
    using Policy = std::decay_t<decltype(policy)>;
    smoe::Rng rng(1);
    smoe::SmoeLayer<float> layer(dim, hidden, experts, options, rng);
    ssr::Router<Policy> router(policy);
    smoe::Adam<float> adam(layer.tensors(""), {});
    const smoe::Mat<float> x = smoe::random_normal<float>(tokens, dim, 1.0, rng);
    const smoe::Mat<float> grad_out = smoe::random_normal<float>(tokens, dim, 1.0 / tokens, rng);
    smoe::LayerCache<float> cache;
    smoe::Mat<float> grad_x;
    smoe::Pass pass{ssr::Context::train(0), true, smoe::Routing::route};
    double routing = 0, total = 0;
    const auto step = [&] {
      layer.zero_grad();
      layer.forward(router, x, pass, cache);
      layer.backward(router, cache, grad_out, grad_x);
      adam.step();
      ++pass.ctx.step;
    };
    step();  // untimed: the buffers' allocation and first touch (the router's workspace among them)
    for (auto _ : state) {
      const auto start = std::chrono::steady_clock::now();
      step();
      total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      routing += cache.routing_seconds;
    }
    state.counters["routing_share"] = routing / total;
    state.counters["routing_ms"] = 1e3 * routing / static_cast<double>(state.iterations());
  });
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

// The console table, then each router's step time over softmax top-k's, in wall-clock and in CPU time
// (CPU time is the steadier of the two on a machine other work shares).
class OverheadReporter : public benchmark::ConsoleReporter {
 public:
  OverheadReporter() : ConsoleReporter(isatty(1) ? OO_ColorTabular : OO_Tabular) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      const bool single = r.run_type == Run::RT_Iteration, median = r.aggregate_name == "median";
      if (r.error_occurred || !(single || median)) continue;
      Times& t = times_[r.run_name.function_name];
      if (t.real.empty() && t.median_real == 0) order_.push_back(r.run_name.function_name);
      if (median) {
        t.median_real = r.GetAdjustedRealTime();
        t.median_cpu = r.GetAdjustedCPUTime();
      } else {
        t.real.push_back(r.GetAdjustedRealTime());
        t.cpu.push_back(r.GetAdjustedCPUTime());
      }
    }
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    const auto vanilla = times_.find("smoe_step/softmax");
    if (vanilla == times_.end()) return;
    const double real = vanilla->second.real_time(), cpu = vanilla->second.cpu_time();
    std::printf("\nstep time over softmax top-k's (this run; median over repetitions):\n  %-24s %8s %8s\n", "", "real", "CPU");
    for (const std::string& name : order_)
      std::printf("  %-24s %7.3fx %7.3fx\n", name.c_str(), times_[name].real_time() / real, times_[name].cpu_time() / cpu);
  }

 private:
  struct Times {
    std::vector<double> real, cpu;      // one per repetition
    double median_real = 0, median_cpu = 0;  // when only aggregates are reported
    double real_time() const { return real.empty() ? median_real : median(real); }
    double cpu_time() const { return cpu.empty() ? median_cpu : median(cpu); }
  };
  std::map<std::string, Times> times_;
  std::vector<std::string> order_;
};

}  // namespace

int main(int argc, char** argv) {
  for (const char* name : {"softmax", "softmax+lb", "softmax+z", "noisy-gating", "sinkhorn", "ssr-l"}) {
    benchmark::RegisterBenchmark((std::string("smoe_step/") + name).c_str(), training_step, std::string(name))
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->MinTime(2.0);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  OverheadReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
}
