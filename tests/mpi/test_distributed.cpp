// One Sinkhorn problem over all MPI ranks (run under mpirun -np 1 .. 4): each rank routes its shard, rows
// [floor(r m / R), floor((r + 1) m / R)) of the same logits, and the result equals the single-process
// route of all m rows: experts identical (these logits have no near-ties), weights within 1e-5 (float)
// and 1e-10 (double), the same iterations, identical noise, the same total load. Every rank reaches the
// same potentials and statistics bit for bit, run after run; an invalid call or a failed allocation on one
// rank, or ranks that call with different numbers of experts or options, is an error on every rank; the softmax path does not
// communicate.
#include <catch2/catch.hpp>

#include <ssr/mpi.hpp>
#include <ssr/router.hpp>
#ifdef SSR_MPI_TEST_THRUST
#include <ssr/backend/thrust.hpp>
#endif

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "../support.hpp"

using Catch::Matchers::Contains;
using ssr::Context;
using ssr::index_t;
using Options = ssr::CallOptions<ssr::HostStream>;

namespace {

const ssr::MpiCommunicator& world() {
  static const ssr::MpiCommunicator ranks(MPI_COMM_WORLD);
  return ranks;
}

struct Shard {
  index_t begin, end;
  index_t rows() const { return end - begin; }
};

Shard shard_of(index_t m, int rank, int ranks) { return {m * rank / ranks, m * (rank + 1) / ranks}; }

// Routes this rank's shard of s (m x n) with backend B over the communicator (null: alone), with the plan
// asked or not.
template <class B, class Policy, class T>
test::Routed<T> route_shard(const Policy& policy, const std::vector<T>& s, index_t n, const Shard& shard, const Context& ctx,
                            const ssr::Communicator<ssr::HostStream>* ranks, bool plan = true) {
  ssr::Router<Policy, B> router(policy);
  test::Routed<T> out(shard.rows(), n, policy.resolve(ctx).k);
  Options options;
  options.communicator = ranks;
  auto outputs = out.outputs();
  if (!plan) outputs.plan = {};
  out.info = router.route({s.data() + shard.begin * n, shard.rows(), n}, ctx.at_row(static_cast<std::uint64_t>(shard.begin)),
                          outputs, options);
  return out;
}

// The same value on every rank, bit for bit.
template <class V>
bool same_on_every_rank(const V& value) {
  std::vector<unsigned char> all(sizeof(V) * static_cast<std::size_t>(world().size()));
  MPI_Allgather(&value, sizeof(V), MPI_BYTE, all.data(), sizeof(V), MPI_BYTE, MPI_COMM_WORLD);
  for (int r = 0; r < world().size(); ++r)
    if (std::memcmp(all.data() + sizeof(V) * static_cast<std::size_t>(r), &value, sizeof(V)) != 0) return false;
  return true;
}

template <class B, class T, class Policy>
void require_sharded_equals_single(const Policy& policy, index_t m, index_t n, unsigned seed) {
  const auto s = test::random_logits<T>(m, n, 2.0, seed, 3.0);
  const Context ctx = Context::train(7, 1, 3);
  const Shard mine = shard_of(m, world().rank(), world().size());
  const auto whole = route_shard<B>(policy, s, n, {0, m}, ctx, nullptr);
  const auto part = route_shard<B>(policy, s, n, mine, ctx, &world());
  // Without the plan the CPU's last pass takes the top-k as it goes (where it guesses the last): the same bits.
  const auto part_alone = route_shard<B>(policy, s, n, mine, ctx, &world(), false);
  std::vector<std::int32_t> load(part.load);
  MPI_Allreduce(MPI_IN_PLACE, load.data(), static_cast<int>(n), MPI_INT32_T, MPI_SUM, MPI_COMM_WORLD);
  const bool same_stats = same_on_every_rank(part.info.iterations) && same_on_every_rank(part.info.marginal_error);

  const double tol = std::is_same<T, float>::value ? 1e-5 : 1e-10;
  const index_t k = part.k;
  INFO("rank " << world().rank() << " of " << world().size() << ", rows [" << mine.begin << ", " << mine.end << ") of " << m);
  CHECK(same_stats);
  CHECK(part.info.path == ssr::Path::sinkhorn);
  CHECK(part.info.iterations == whole.info.iterations);
  CHECK(load == whole.load);
  bool experts = true, noise = true;
  double worst = 0;
  for (index_t i = 0; i < mine.rows(); ++i) {
    for (index_t r = 0; r < k; ++r) {
      experts = experts && part.expert(i, r) == whole.expert(mine.begin + i, r);
      worst = std::max(worst, std::abs(static_cast<double>(part.weight(i, r)) - whole.weight(mine.begin + i, r)));
    }
    for (index_t j = 0; j < n; ++j)
      noise = noise && std::memcmp(&part.noise[i * n + j], &whole.noise[(mine.begin + i) * n + j], sizeof(T)) == 0;
  }
  CHECK(experts);
  CHECK(noise);
  CHECK(worst <= tol);
  CHECK(part_alone.info.iterations == part.info.iterations);
  CHECK(part_alone.experts == part.experts);
  CHECK(std::memcmp(part_alone.weights.data(), part.weights.data(), part.weights.size() * sizeof(T)) == 0);
}

// Counts the collective calls made through it.
class Counting final : public ssr::Communicator<ssr::HostStream> {
 public:
  int rank() const override { return world().rank(); }
  int size() const override { return world().size(); }
  void sum(std::int64_t* d, std::size_t c, ssr::HostStream s) const override { ++calls; world().sum(d, c, s); }
  void max(double* d, std::size_t c, ssr::HostStream s) const override { ++calls; world().max(d, c, s); }
  void sum_on_host(std::int64_t* d, std::size_t c, ssr::HostStream s) const override { ++calls; world().sum_on_host(d, c, s); }
  mutable int calls = 0;
};

// The CPU backend whose own workspace cannot grow on the last rank (an allocation that fails there only).
class RefusingOnLastRank : public ssr::CpuBackend<float> {
 public:
  void reserve_workspace(const ssr::RouteSpec& spec, index_t m, index_t n, const options_type& options) {
    if (world().rank() == world().size() - 1) throw ssr::RuntimeError("cannot allocate the workspace (refused)");
    ssr::CpuBackend<float>::reserve_workspace(spec, m, n, options);
  }
};

}  // namespace

TEMPLATE_TEST_CASE("a sharded solve equals the single-process solve of all rows", "[mpi]", float, double) {
  for (const index_t m : {1001, 2}) {  // uneven shards; at 3 or 4 ranks, ranks without rows
    for (const ssr::Cost cost : {ssr::Cost::linear, ssr::Cost::softmax}) {
      for (const double alpha : {0.0, 0.3}) {
        const ssr::NoisyCost<ssr::SinkhornTopK> policy(ssr::SinkhornTopK(2, cost, {0.5, 1e-6, 200}), alpha, 1.0);
        require_sharded_equals_single<ssr::CpuBackend<TestType>, TestType>(policy, m, 16, static_cast<unsigned>(m));
#ifdef SSR_MPI_TEST_THRUST
        require_sharded_equals_single<ssr::ThrustBackend<TestType>, TestType>(policy, m, 16, static_cast<unsigned>(m));
#endif
      }
    }
  }
}

TEST_CASE("a column nobody favours recovers in the log domain over all ranks", "[mpi]") {
  // Expert 7 trails every token's favourite by 1e4 / xi: its column sum underflows at first.
  const index_t m = 1024, n = 8;
  auto s = test::random_logits<double>(m, n, 1.0, 3);
  for (index_t i = 0; i < m; ++i) s[i * n + n - 1] = s[i * n] - 1e4;
  const ssr::SinkhornTopK policy(2, ssr::Cost::linear, {1.0, 1e-6, 200});
  const Shard mine = shard_of(m, world().rank(), world().size());
  const auto part = route_shard<ssr::CpuBackend<double>>(policy, s, n, mine, Context::train(0), &world());
  const auto whole = route_shard<ssr::CpuBackend<double>>(policy, s, n, {0, m}, Context::train(0), nullptr);
  std::vector<std::int32_t> load(part.load);
  MPI_Allreduce(MPI_IN_PLACE, load.data(), static_cast<int>(n), MPI_INT32_T, MPI_SUM, MPI_COMM_WORLD);
  CHECK(part.info.converged);
  CHECK(load == whole.load);
  CHECK(load[n - 1] > 0);
}

TEST_CASE("every rank reaches the same potentials, run after run", "[mpi]") {
  // Every rank's shard ends with the same probe row: its plan row is the same bits on every rank exactly
  // when the column potentials are.
  const index_t n = 16, rows = 300;
  auto s = test::random_logits<float>(rows + 1, n, 2.0, static_cast<unsigned>(11 + world().rank()), 3.0);
  const auto probe = test::random_logits<float>(1, n, 2.0, 5, 0.0);
  std::copy(probe.begin(), probe.end(), s.end() - n);
  const ssr::SinkhornTopK policy(2, ssr::Cost::linear, {0.5, 1e-6, 100});
  const Shard all{0, rows + 1};
  const auto a = route_shard<ssr::CpuBackend<float>>(policy, s, n, all, Context::train(0), &world());
  const auto b = route_shard<ssr::CpuBackend<float>>(policy, s, n, all, Context::train(0), &world());
  std::vector<float> probe_plan(a.plan.end() - n, a.plan.end());
  std::array<float, 16> row{};
  std::copy(probe_plan.begin(), probe_plan.end(), row.begin());
  const bool same_row = same_on_every_rank(row);
  const bool same_error = same_on_every_rank(a.info.marginal_error);
  CHECK(same_row);
  CHECK(same_error);
  test::require_identical(a, b);
}

TEST_CASE("an invalid call on one rank is an error on every rank", "[mpi][errors]") {
  const index_t m = 400, n = 8;
  auto s = test::random_logits<float>(m, n, 1.0, 2);
  const int last = world().size() - 1;
  const Shard mine = shard_of(m, world().rank(), world().size());
  const ssr::SinkhornTopK policy(2);
  if (world().rank() == last) s[(mine.begin + 1) * n + 3] = std::numeric_limits<float>::quiet_NaN();
  const char* expected = world().rank() == last ? "= nan" : "failed on rank";
  CHECK_THROWS_WITH(route_shard<ssr::CpuBackend<float>>(policy, s, n, mine, Context::train(0), &world()), Contains(expected));

  // A wrongly shaped output on rank 0 only.
  s = test::random_logits<float>(m, n, 1.0, 2);
  ssr::Router<ssr::SinkhornTopK> router(policy);
  test::Routed<float> out(mine.rows(), n, 2);
  auto views = out.outputs();
  if (world().rank() == 0) views.weights.rows -= 1;
  CHECK_THROWS_WITH(router.route({s.data() + mine.begin * n, mine.rows(), n}, Context::train(0).at_row(mine.begin), views,
                                 Options{}.across(world())),
                    Contains(world().rank() == 0 ? "weights has shape" : "failed on rank 0"));

  // Another number of experts, or other options, on the last rank: every collective would be sized or
  // stopped differently there (with 3 ranks the sums of the experts are those of alike ranks, 7 + 8 + 9).
  if (world().size() > 1) {
    const int me = world().rank();
    const index_t mine_n = world().size() == 3 ? 7 + me : (me == last ? n - 1 : n);
    const auto t = test::random_logits<float>(m, mine_n, 1.0, 3);
    CHECK_THROWS_WITH(route_shard<ssr::CpuBackend<float>>(policy, t, mine_n, mine, Context::train(0), &world()),
                      Contains("the ranks made the call with different numbers of experts or options"));
    const ssr::SinkhornTopK other(2, ssr::Cost::linear, {0.5, 1e-4, me == last ? 50 : 100});
    CHECK_THROWS_WITH(route_shard<ssr::CpuBackend<float>>(other, s, n, mine, Context::train(0), &world()),
                      Contains("different numbers of experts or options"));
    CHECK_THROWS_WITH(route_shard<ssr::CpuBackend<float>>(policy, s, n, mine, Context::train(me == last ? 1 : 0), &world()),
                      Contains("different numbers of experts or options"));
  }

  // The backend's own workspace grows among the agreed checks: an allocation failing on one rank fails all.
  const bool last_rank = world().rank() == last;
  CHECK_THROWS_WITH(route_shard<RefusingOnLastRank>(policy, s, n, mine, Context::train(0), &world()),
                    Contains(last_rank ? "cannot allocate the workspace" : "failed on rank"));

  // And the ranks are still in step: the next call succeeds everywhere.
  CHECK(route_shard<ssr::CpuBackend<float>>(policy, s, n, mine, Context::train(0), &world()).info.converged);
}

TEST_CASE("only the Sinkhorn path communicates", "[mpi]") {
  const index_t m = 500, n = 8;
  const auto s = test::random_logits<float>(m, n, 1.0, 4);
  const Shard mine = shard_of(m, world().rank(), world().size());
  Counting counting;
  const auto soft = route_shard<ssr::CpuBackend<float>>(ssr::SoftmaxTopK(2), s, n, mine, Context::train(0), &counting);
  CHECK(counting.calls == 0);
  const auto sink = route_shard<ssr::CpuBackend<float>>(ssr::SinkhornTopK(2), s, n, mine, Context::train(0), &counting);
  CHECK(counting.calls == 1 + sink.info.iterations);  // the agreement, then one exact sum per iteration
  (void)soft;
}

TEST_CASE("the expert bias and the global-batch loss see the loads of every rank", "[mpi][bias]") {
  const index_t m = 300, n = 8;
  const int k = 2;
  const auto s = test::random_logits<double>(m, n, 1.0, 5, 3.0);
  const Shard mine = shard_of(m, world().rank(), world().size());
  const auto all = route_shard<ssr::CpuBackend<double>>(ssr::SoftmaxTopK(k), s, n, {0, m}, Context::eval(), nullptr);
  const auto part = route_shard<ssr::CpuBackend<double>>(ssr::SoftmaxTopK(k), s, n, mine, Context::eval(), nullptr);

  // Updated from this rank's loads over all ranks: the single-process update from the loads of all rows.
  std::vector<float> want(n, 0.25f), bias(n, 0.25f);
  ssr::update_expert_bias(ssr::VectorView<const std::int32_t>(all.load.data(), n), 0.01, ssr::VectorView<float>(want.data(), n));
  ssr::update_expert_bias(ssr::VectorView<const std::int32_t>(part.load.data(), n), 0.01, ssr::VectorView<float>(bias.data(), n),
                          &world());
  CHECK(bias == want);

  // The global-batch loss of each rank's rows, f from the loads of all ranks: with m / R rows per rank
  // their losses weighted by rows add up to the loss of all rows (computed alone).
  const std::vector<std::int64_t> counts(part.load.begin(), part.load.end());
  const double local = ssr::global_load_balancing_loss<double>(
      {s.data() + mine.begin * n, mine.rows(), n}, ssr::VectorView<const std::int64_t>(counts.data(), n), mine.rows(), k,
      {}, ssr::Score::softmax, &world());
  double weighted = local * static_cast<double>(mine.rows()) / static_cast<double>(m);
  MPI_Allreduce(MPI_IN_PLACE, &weighted, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  const double whole = ssr::load_balancing_loss<double>({s.data(), m, n}, {all.experts.data(), m, k});
  CHECK(weighted == Approx(whole).epsilon(1e-12));

  // A bad load on one rank is an error on every rank.
  std::vector<std::int32_t> bad(part.load.begin(), part.load.end());
  if (world().rank() == world().size() - 1) bad[2] = -1;
  CHECK_THROWS_WITH(ssr::update_expert_bias(ssr::VectorView<const std::int32_t>(bad.data(), n), 0.01,
                                            ssr::VectorView<float>(bias.data(), n), &world()),
                    Contains(world().rank() == world().size() - 1 ? "load[2] = -1" : "failed on rank"));

  // Loads of different lengths are an error on every rank, also where their lengths sum to R n (7, 8, 9).
  if (world().size() > 1) {
    const int me = world().rank(), last = world().size() - 1;
    const index_t mine_n = world().size() == 3 ? 7 + me : (me == last ? n - 1 : n);
    const std::vector<std::int32_t> loads(static_cast<std::size_t>(mine_n), 3);
    std::vector<float> biases(static_cast<std::size_t>(mine_n), 0.0f);
    CHECK_THROWS_WITH(ssr::update_expert_bias(ssr::VectorView<const std::int32_t>(loads.data(), mine_n), 0.01,
                                              ssr::VectorView<float>(biases.data(), mine_n), &world()),
                      Contains("the ranks made the call with different numbers of experts"));
    const auto logits = test::random_logits<double>(4, mine_n, 1.0, 6);
    CHECK_THROWS_WITH(ssr::global_load_balancing_loss<double>({logits.data(), 4, mine_n},
                                                              ssr::VectorView<const std::int32_t>(loads.data(), mine_n),
                                                              4, k, {}, ssr::Score::softmax, &world()),
                      Contains("the ranks made the call with different numbers of experts"));
  }
}
