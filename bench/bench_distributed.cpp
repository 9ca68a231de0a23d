// What global balance costs per Sinkhorn iteration, run under mpirun -np R (bench/distributed.sh runs
// R = 1, 2, 4): each rank routes its own shard of m rows (weak scaling: the problem has R m rows), and
// the time of one iteration is the slope (t(21) - t(1)) / 20 of fixed-iteration solves, beside the same
// shard solved alone (no communicator) and the all-reduce it adds (4 n int64 per iteration). Every rank
// runs every benchmark the same fixed number of times (collectives must match); rank 0 reports.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <ssr/mpi.hpp>
#include <ssr/router.hpp>

#include <cstdint>
#include <vector>

namespace {

// Rank 0 reports; the other ranks run the same benchmarks silently.
class Quiet : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context& /*context*/) override { return true; }
  void ReportRuns(const std::vector<Run>& /*runs*/) override {}
};

const ssr::MpiCommunicator& world() {
  static const ssr::MpiCommunicator ranks(MPI_COMM_WORLD);
  return ranks;
}

// N(0, 1) - 4 j / n, as the other benchmarks; a different shard on every rank.
std::vector<float> logits(ssr::index_t m, ssr::index_t n, std::uint64_t first_row) {
  std::vector<float> s(static_cast<std::size_t>(m * n));
  for (ssr::index_t e = 0; e < m * n; ++e)
    s[static_cast<std::size_t>(e)] = static_cast<float>(
        ssr::random::normal(1, 0, 0, first_row * static_cast<std::uint64_t>(n) + static_cast<std::uint64_t>(e)) -
        4.0 * static_cast<double>(e % n) / static_cast<double>(n));
  return s;
}

// Arguments: rows per rank, n, iterations, distributed (1) or alone (0).
void BM_Solve(benchmark::State& state) {
  const ssr::index_t m = state.range(0), n = state.range(1), k = 2;
  const int iterations = static_cast<int>(state.range(2));
  const bool distributed = state.range(3) != 0;
  const auto first = static_cast<std::uint64_t>(m * world().rank());
  const auto s = logits(m, n, first);
  std::vector<std::int32_t> experts(static_cast<std::size_t>(m * k));
  std::vector<float> weights(experts.size());
  ssr::Router<ssr::SinkhornTopK, ssr::CpuBackend<float>> router(
      ssr::SinkhornTopK(2, ssr::Cost::linear, {0.5, 1e-300, iterations}), ssr::CpuBackend<float>(1));
  ssr::CallOptions<ssr::HostStream> options;
  if (distributed) options.across(world());
  const auto route = [&] {
    router.route({s.data(), m, n}, ssr::Context::train(0).at_row(first), {{experts.data(), m, k}, {weights.data(), m, k}},
                 options);
  };
  route();  // untimed, on every rank: the workspace's allocation and first touch
  for (auto _ : state) {
    route();
    benchmark::DoNotOptimize(weights.data());
  }
  state.counters["ranks"] = world().size();
}

// The reduction one distributed iteration adds: an all-reduce of 4 n int64.
void BM_ColumnReduction(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  std::vector<std::int64_t> limbs(4 * n, 1);
  for (auto _ : state) world().sum(limbs.data(), limbs.size(), ssr::HostStream{});
  state.counters["ranks"] = world().size();
}

void shapes(benchmark::internal::Benchmark* b) {
  for (long m : {4096, 24576})
    for (long n : {16, 256})
      for (long iterations : {1, 21})
        for (long distributed : {0, 1}) b->Args({m, n, iterations, distributed});
}

}  // namespace

BENCHMARK(BM_Solve)->Apply(shapes)->Iterations(30)->Repetitions(5)->ReportAggregatesOnly(true)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ColumnReduction)->Arg(16)->Arg(256)->Iterations(2000)->Repetitions(5)->ReportAggregatesOnly(true)
    ->Unit(benchmark::kMicrosecond);

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  benchmark::Initialize(&argc, argv);
  if (world().rank() == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    Quiet quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
  benchmark::Shutdown();
  MPI_Finalize();
  return 0;
}
