// ssr-dp-step: data-parallel training steps of an MoE gate with the Sinkhorn plan balanced over every
// rank (global) or over each rank's tokens alone (local), under mpirun. Every rank draws its own batch,
// skewed towards its own experts (as a data-parallel shard of a topic or a language is), while over all
// ranks every expert is equally in demand. A step: logits S = X W^T, Sinkhorn top-k (score weights, S-BASE),
// the loss -mean_i w_i,home (the weight of each token's own expert), backward through the router, the
// gate's gradient averaged over ranks (MPI_Allreduce), an SGD update. Local balance must spread each
// rank's tokens evenly over all experts, sending most of them away from home; global balance keeps the
// experts as evenly loaded over all tokens and lets each rank's tokens stay home.
//
// mpirun -np 4 ssr-dp-step [--steps N] [--tokens M] [--experts N] [--skew S]
#include <Eigen/Core>
#include <mpi.h>
#include <ssr/eigen.hpp>
#include <ssr/mpi.hpp>
#include <ssr/router.hpp>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <utility>
#include <random>
#include <string>
#include <vector>

namespace {

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct Settings {
  int steps = 40, tokens = 1024, experts = 8, dim = 16;
  double skew = 0.8, lr = 2.0;
};

// One rank's batch: tokens near their home expert's centre; a share `skew` of them at home among the
// rank's own experts, the rest anywhere.
struct Batch {
  Mat x;
  std::vector<int> home;
};

Batch draw(const Settings& s, const Mat& centres, int rank, int ranks, int step) {
  std::mt19937 gen(static_cast<unsigned>(1000 * step + rank));
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::normal_distribution<float> noise(0.0f, 0.5f);
  const int own = std::max(1, s.experts / ranks), first = (rank * s.experts / ranks) % s.experts;
  Batch b{Mat(s.tokens, s.dim), std::vector<int>(static_cast<std::size_t>(s.tokens))};
  for (int i = 0; i < s.tokens; ++i) {
    const int home = u(gen) < s.skew ? first + static_cast<int>(u(gen) * own) % own : static_cast<int>(u(gen) * s.experts);
    b.home[static_cast<std::size_t>(i)] = home;
    for (int d = 0; d < s.dim; ++d) b.x(i, d) = centres(home, d) + noise(gen);
  }
  return b;
}

struct StepResult {
  double loss = 0, home_share = 0, max_over_mean = 0;
};

// One training step of gate w on this rank's batch; ranks: null balances this rank's tokens alone.
StepResult step(const Settings& s, Mat& w, const Batch& b, const ssr::MpiCommunicator& world,
                const ssr::Communicator<ssr::HostStream>* ranks) {
  const ssr::index_t m = s.tokens, n = s.experts, k = 1;
  Mat logits = b.x * w.transpose();
  Mat weights(m, k), grad_w(m, k), grad_logits(m, n);
  Eigen::Matrix<std::int32_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> experts(m, k);
  std::vector<std::int32_t> load(static_cast<std::size_t>(n));
  ssr::Router<ssr::SinkhornTopK> router(ssr::SinkhornTopK(1, ssr::Cost::linear, {0.5, 1e-4, 100}, ssr::Weights::scores),
                                       ssr::CpuBackend<float>(1));
  ssr::CallOptions<ssr::HostStream> options;
  options.communicator = ranks;
  const auto info = router.route(ssr::view(logits), ssr::Context::train(0).at_row(static_cast<std::uint64_t>(m * world.rank())),
                                 {ssr::view(experts), ssr::view(weights), {load.data(), n}}, options);
  // loss = -mean_i w_i,home: only tokens routed home carry weight on their home expert.
  StepResult r;
  grad_w.setZero();
  for (ssr::index_t i = 0; i < m; ++i) {
    if (experts(i, 0) != b.home[static_cast<std::size_t>(i)]) continue;
    r.loss -= weights(i, 0);
    r.home_share += 1;
    grad_w(i, 0) = -1.0f / static_cast<float>(m);
  }
  ssr::BackwardArgs<float> args;  // softmax score weights: the gradient does not read the logits
  args.experts = ssr::view(std::as_const(experts));
  args.weights = ssr::view(std::as_const(weights));
  args.grad_weights = ssr::view(std::as_const(grad_w));
  args.grad_logits = ssr::view(grad_logits);
  router.backward(info, args);
  // A softmax over the chosen expert alone has no gradient (k = 1): add the cross-entropy towards home,
  // which is what moves the gate; the router's gradient is the score weights' part.
  Mat probs = logits;
  for (ssr::index_t i = 0; i < m; ++i) {
    const float top = probs.row(i).maxCoeff();
    probs.row(i) = (probs.row(i).array() - top).exp();
    probs.row(i) /= probs.row(i).sum();
    probs(i, b.home[static_cast<std::size_t>(i)]) -= 1.0f;
  }
  grad_logits += probs / static_cast<float>(m);
  Mat grad_gate = grad_logits.transpose() * b.x;
  MPI_Allreduce(MPI_IN_PLACE, grad_gate.data(), static_cast<int>(grad_gate.size()), MPI_FLOAT, MPI_SUM, world.comm());
  w -= static_cast<float>(s.lr / world.size()) * grad_gate;

  // Totals over ranks: loss and home share per token, the busiest expert's load over the mean.
  double sums[2] = {r.loss, r.home_share};
  MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_DOUBLE, MPI_SUM, world.comm());
  MPI_Allreduce(MPI_IN_PLACE, load.data(), static_cast<int>(n), MPI_INT32_T, MPI_SUM, world.comm());
  const double total = static_cast<double>(m) * world.size();
  r.loss = sums[0] / total;
  r.home_share = sums[1] / total;
  r.max_over_mean = ssr::load_stats({load.data(), n}).max_over_mean;
  return r;
}

Settings parse(int argc, char** argv) {
  Settings s;
  for (int a = 1; a + 1 < argc; a += 2) {
    const std::string opt = argv[a];
    const double v = std::atof(argv[a + 1]);
    if (opt == "--steps") s.steps = static_cast<int>(v);
    else if (opt == "--tokens") s.tokens = static_cast<int>(v);
    else if (opt == "--experts") s.experts = static_cast<int>(v);
    else if (opt == "--skew") s.skew = v;
    else throw std::invalid_argument("unknown option " + opt);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  try {
    const Settings s = parse(argc, argv);
    const ssr::MpiCommunicator world(MPI_COMM_WORLD);
    std::mt19937 gen(7);  // the same centres and initial gate on every rank
    std::normal_distribution<float> normal;
    Mat centres(s.experts, s.dim), gate(s.experts, s.dim);
    for (Eigen::Index e = 0; e < centres.size(); ++e) centres.data()[e] = normal(gen);
    for (Eigen::Index e = 0; e < gate.size(); ++e) gate.data()[e] = 0.01f * normal(gen);
    Mat local_gate = gate, global_gate = gate;
    if (world.rank() == 0)
      std::printf("%d ranks x %d tokens, %d experts, skew %.2f: each column local | global balance\n"
                  "%5s %16s %16s %16s\n", world.size(), s.tokens, s.experts, s.skew, "step", "loss", "tokens home",
                  "max/mean load");
    StepResult local, global;
    for (int t = 0; t < s.steps; ++t) {
      const Batch b = draw(s, centres, world.rank(), world.size(), t);
      local = step(s, local_gate, b, world, nullptr);
      global = step(s, global_gate, b, world, &world);
      if (world.rank() == 0 && (t % 10 == 0 || t + 1 == s.steps))
        std::printf("%5d %7.3f | %6.3f %7.3f | %6.3f %7.3f | %6.3f\n", t, local.loss, global.loss, local.home_share,
                    global.home_share, local.max_over_mean, global.max_over_mean);
    }
    if (world.rank() == 0)
      std::printf("last step: tokens home %.3f (local) vs %.3f (global); max/mean load %.3f vs %.3f\n",
                  local.home_share, global.home_share, local.max_over_mean, global.max_over_mean);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ssr-dp-step: %s\n", e.what());
    status = 2;
  }
  MPI_Finalize();
  return status;
}
