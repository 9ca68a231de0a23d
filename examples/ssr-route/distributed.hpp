// ssr-route --distributed mpi: under mpirun, rank r routes rows [floor(r m / R), floor((r + 1) m / R)) of
// the same file, the Sinkhorn plan balanced over every rank (ssr::MpiCommunicator), and rank 0 gathers the
// outputs and writes the same files and JSON as a single-process run (with "ranks": R). Each phase that
// can fail on one rank (reading, routing, writing) ends with the ranks agreeing on its outcome, so a
// failure anywhere ends every rank with exit status 2 and rank 0 prints one line.
#pragma once

#include <mpi.h>
#include <ssr/mpi.hpp>
#include <ssr/router.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "job.hpp"
#include "options.hpp"

namespace ssr_route {

class MpiSession {
 public:
  MpiSession(int* argc, char*** argv) {
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  ~MpiSession() { MPI_Finalize(); }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // True when no rank has an error; otherwise rank 0 prints the most telling one (a rank's own error
  // rather than another's report of it) on one line.
  bool all_ok(const std::string& error) const {
    int failed = error.empty() ? 0 : 1;
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (failed == 0) return true;
    constexpr int width = 1024;
    std::vector<char> mine(width, '\0'), all(rank_ == 0 ? static_cast<std::size_t>(width) * size_ : 0);
    std::strncpy(mine.data(), error.c_str(), width - 1);
    MPI_Gather(mine.data(), width, MPI_CHAR, all.data(), width, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (rank_ == 0) {
      std::string pick;
      for (int r = 0; r < size_; ++r) {
        const std::string message(all.data() + static_cast<std::size_t>(r) * width);
        const bool report = message.find("the call failed on") != std::string::npos;
        if (!message.empty() && (pick.empty() || !report)) pick = message;
        if (!message.empty() && !report) break;
      }
      std::fprintf(stderr, "ssr-route: %s\n", pick.c_str());
    }
    return false;
  }

 private:
  int rank_ = 0, size_ = 1;
};

// This rank's rows of a job and what routing them gives.
template <class T>
struct Shard {
  ssr::index_t begin = 0, rows = 0;
  std::vector<std::int32_t> experts, load;
  std::vector<T> weights, noise, plan, grad;
};

// Routes this rank's rows of the job's logits with Backend, the plan balanced over every rank, and maps
// dL/dw to dL/dS for them when asked. The route's errors reach every rank (ssr::Router agrees on them);
// backward communicates nothing.
template <class T, class Backend>
Shard<T> route_shard(const Options& o, Backend backend, Job<T>& job) {
  const ssr::MpiCommunicator world(MPI_COMM_WORLD);
  const ssr::index_t m = job.m, n = job.n, k = job.k, ranks = world.size(), rank = world.rank();
  if (m > std::numeric_limits<int>::max())  // every rank reads the same m: all of them stop here
    throw std::invalid_argument("--distributed mpi gathers at most 2^31 - 1 rows, the file has " + std::to_string(m));
  Shard<T> s;
  s.begin = m * rank / ranks;
  s.rows = m * (rank + 1) / ranks - s.begin;
  const auto size = [](ssr::index_t r, ssr::index_t c) { return static_cast<std::size_t>(r * c); };
  s.experts.resize(size(s.rows, k));
  s.load.resize(static_cast<std::size_t>(n));
  s.weights.resize(size(s.rows, k));
  s.noise.resize(job.noise.size() > 0 ? size(s.rows, n) : 0);
  s.plan.resize(job.plan.size() > 0 ? size(s.rows, n) : 0);
  s.grad.resize(job.grad_s.size() > 0 ? size(s.rows, n) : 0);
  ssr::RouteOutputs<T> out{{s.experts.data(), s.rows, k}, {s.weights.data(), s.rows, k}, {s.load.data(), n}};
  if (!s.noise.empty()) out.noise = {s.noise.data(), s.rows, n};
  if (!s.plan.empty()) out.plan = {s.plan.data(), s.rows, n};
  ssr::Router<ssr::SSRPolicy, Backend> router(job.policy, std::move(backend));
  const ssr::ConstMatrixView<T> logits(job.in().data + s.begin * n, s.rows, n);
  job.info = router.route(logits, job.context(o).at_row(static_cast<std::uint64_t>(s.begin)), out,
                          ssr::CallOptions<ssr::HostStream>{}.across(world));
  if (!s.grad.empty())
    router.backward(
        job.info,
        {logits, out.experts, out.weights, {job.grad_w.data() + s.begin * k, s.rows, k}, {s.grad.data(), s.rows, n}});
  return s;
}

// Rank 0 gathers every rank's rows into the job, in rank order; the loads add up.
template <class T>
void gather(const Shard<T>& s, Job<T>& job, int ranks) {
  const ssr::index_t m = job.m, n = job.n, k = job.k;
  std::vector<int> counts(static_cast<std::size_t>(ranks)), offsets(static_cast<std::size_t>(ranks));
  // Whole rows as one datatype: MPI's counts and offsets are ints, which hold m rows (route_shard checks)
  // where they need not hold m * n elements.
  const auto rows_gather = [&](const auto* mine, auto* all, ssr::index_t width, MPI_Datatype type) {
    MPI_Datatype row = MPI_DATATYPE_NULL;
    MPI_Type_contiguous(static_cast<int>(width), type, &row);
    MPI_Type_commit(&row);
    for (int r = 0; r < ranks; ++r) {
      counts[r] = static_cast<int>(m * (r + 1) / ranks - m * r / ranks);
      offsets[r] = static_cast<int>(m * r / ranks);
    }
    MPI_Gatherv(mine, static_cast<int>(s.rows), row, all, counts.data(), offsets.data(), row, 0, MPI_COMM_WORLD);
    MPI_Type_free(&row);
  };
  const MPI_Datatype real = std::is_same<T, double>::value ? MPI_DOUBLE : MPI_FLOAT;
  rows_gather(s.experts.data(), job.experts.data(), k, MPI_INT32_T);
  rows_gather(s.weights.data(), job.weights.data(), k, real);
  if (job.noise.size() > 0) rows_gather(s.noise.data(), job.noise.data(), n, real);
  if (job.plan.size() > 0) rows_gather(s.plan.data(), job.plan.data(), n, real);
  if (job.grad_s.size() > 0) rows_gather(s.grad.data(), job.grad_s.data(), n, real);
  MPI_Reduce(s.load.data(), job.load.data(), static_cast<int>(n), MPI_INT32_T, MPI_SUM, 0, MPI_COMM_WORLD);
}

// The whole distributed run of one dtype: read, route, write, each phase agreed on by every rank.
template <class T, class Backend>
int run_distributed(const Options& o, const MpiSession& mpi, Backend (*make_backend)(const Options&)) {
  std::unique_ptr<Job<T>> job;
  std::string error;
  const auto attempt = [&error](const auto& phase) {
    try {
      phase();
    } catch (const std::exception& e) {
      error = e.what();
    }
  };
  attempt([&] { job = std::make_unique<Job<T>>(o); });
  if (!mpi.all_ok(error)) return 2;
  Shard<T> shard;
  attempt([&] { shard = route_shard<T>(o, make_backend(o), *job); });
  if (!mpi.all_ok(error)) return 2;
  gather(shard, *job, mpi.size());
  if (mpi.rank() == 0) attempt([&] { job->write(o, mpi.size()); });
  return mpi.all_ok(error) ? 0 : 2;
}

}  // namespace ssr_route
