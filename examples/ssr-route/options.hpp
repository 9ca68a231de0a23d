// ssr-route's options: parsed from the command line, with the library's defaults (ssr::RouterConfig).
#pragma once

#include <ssr/router.hpp>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>

namespace ssr_route {

inline constexpr const char* usage =
    "usage: ssr-route --logits L.npy --out DIR [--policy softmax|sinkhorn|ssr|selective] [--cost linear|softmax]\n"
    "                 [--k K] [--xi X] [--tol T] [--max-iters N] [--weights plan|scores] [--p P]\n"
    "                 [--noise-alpha A] [--noise-sigma S] [--seed N] [--step N] [--layer N] [--mode train|eval]\n"
    "                 [--score softmax|sigmoid] [--expert-bias B.npy] [--n-groups G --topk-groups T]\n"
    "                 [--threads N] [--backend cpu|thrust-omp|cuda] [--distributed none|mpi]\n"
    "                 [--grad-weights G.npy] [--dump-noise] [--dump-plan]\n";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  std::string logits, out, grad_weights, expert_bias;
  std::string backend = "cpu";
  std::string distributed = "none";  // mpi: one problem over the ranks of mpirun (distributed.hpp)
  ssr::RouterConfig router;  // the router by name, with the library's defaults
  ssr::Context ctx = ssr::Context::train(0);
  int threads = 0;
  bool dump_noise = false, dump_plan = false;
};

inline double to_double(const std::string& opt, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || errno == ERANGE) throw UsageError(opt + " expects a number, got '" + v + "'");
  return d;
}

inline unsigned long long to_unsigned(const std::string& opt, const std::string& v, unsigned long long max) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long u = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || v[0] == '-' || *end != '\0' || errno == ERANGE || u > max)
    throw UsageError(opt + " expects an integer in [0, " + std::to_string(max) + "], got '" + v + "'");
  return u;
}

inline int to_int(const std::string& opt, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  const long l = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE || l < -2147483647L || l > 2147483647L)
    throw UsageError(opt + " expects an integer, got '" + v + "'");
  return static_cast<int>(l);
}

template <class E>
E choose(const std::string& opt, const std::string& v, const std::map<std::string, E>& choices) {
  const auto it = choices.find(v);
  if (it != choices.end()) return it->second;
  std::string names;
  for (const auto& c : choices) names += (names.empty() ? "" : "|") + c.first;
  throw UsageError(opt + " expects " + names + ", got '" + v + "'");
}

inline Options parse(int argc, char** argv) {
  Options o;
  int groups_given = 0;  // bit 0: --n-groups, bit 1: --topk-groups
  const std::map<std::string, std::function<void(const std::string&)>> valued = {
      {"--logits", [&](const std::string& v) { o.logits = v; }},
      {"--out", [&](const std::string& v) { o.out = v; }},
      {"--policy", [&](const std::string& v) { o.router.router = choose<std::string>("--policy", v, {{"softmax", "softmax"}, {"sinkhorn", "sinkhorn"}, {"ssr", "ssr"}, {"selective", "ssr"}}); }},
      {"--cost", [&](const std::string& v) { o.router.cost = choose<ssr::Cost>("--cost", v, {{"linear", ssr::Cost::linear}, {"softmax", ssr::Cost::softmax}}); }},
      {"--k", [&](const std::string& v) { o.router.k = to_int("--k", v); }},
      {"--xi", [&](const std::string& v) { o.router.sinkhorn.xi = to_double("--xi", v); }},
      {"--tol", [&](const std::string& v) { o.router.sinkhorn.tol = to_double("--tol", v); }},
      {"--max-iters", [&](const std::string& v) { o.router.sinkhorn.max_iters = to_int("--max-iters", v); }},
      {"--weights", [&](const std::string& v) { o.router.weights = choose<ssr::Weights>("--weights", v, {{"plan", ssr::Weights::plan}, {"scores", ssr::Weights::scores}}); }},
      {"--p", [&](const std::string& v) { o.router.p = to_double("--p", v); }},
      {"--noise-alpha", [&](const std::string& v) { o.router.noise_alpha = to_double("--noise-alpha", v); }},
      {"--noise-sigma", [&](const std::string& v) { o.router.noise_sigma = to_double("--noise-sigma", v); }},
      {"--seed", [&](const std::string& v) { o.ctx.seed = static_cast<std::uint32_t>(to_unsigned("--seed", v, 0xffffffffull)); }},
      {"--step", [&](const std::string& v) { o.ctx.step = to_unsigned("--step", v, ~0ull); }},
      {"--layer", [&](const std::string& v) { o.ctx.layer = static_cast<std::uint32_t>(to_unsigned("--layer", v, 0xffffffffull)); }},
      {"--mode", [&](const std::string& v) { o.ctx.mode = choose<ssr::Mode>("--mode", v, {{"train", ssr::Mode::train}, {"eval", ssr::Mode::eval}}); }},
      {"--threads", [&](const std::string& v) { o.threads = to_int("--threads", v); }},
      {"--backend", [&](const std::string& v) { o.backend = choose<std::string>("--backend", v, {{"cpu", "cpu"}, {"thrust-omp", "thrust-omp"}, {"cuda", "cuda"}}); }},
      {"--distributed", [&](const std::string& v) { o.distributed = choose<std::string>("--distributed", v, {{"none", "none"}, {"mpi", "mpi"}}); }},
      {"--grad-weights", [&](const std::string& v) { o.grad_weights = v; }},
      {"--score", [&](const std::string& v) { o.router.select.score = choose<ssr::Score>("--score", v, {{"softmax", ssr::Score::softmax}, {"sigmoid", ssr::Score::sigmoid}}); }},
      {"--expert-bias", [&](const std::string& v) { o.expert_bias = v; }},
      {"--n-groups", [&](const std::string& v) { o.router.select.n_groups = to_int("--n-groups", v); groups_given |= 1; }},
      {"--topk-groups", [&](const std::string& v) { o.router.select.topk_groups = to_int("--topk-groups", v); groups_given |= 2; }},
  };
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--dump-noise") {
      o.dump_noise = true;
    } else if (arg == "--dump-plan") {
      o.dump_plan = true;
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(usage, stdout);
      std::exit(0);
    } else if (const auto it = valued.find(arg); it != valued.end()) {
      if (a + 1 >= argc) throw UsageError(arg + " needs a value");
      it->second(argv[++a]);
    } else {
      throw UsageError("unknown option '" + arg + "'");
    }
  }
  if (o.logits.empty()) throw UsageError("--logits is required");
  if (o.out.empty()) throw UsageError("--out is required");
  if (groups_given == 1 || groups_given == 2) throw UsageError("--n-groups and --topk-groups go together");
  return o;
}

// Whether the command line asks for a distributed run (before parsing it: MPI starts first).
inline bool wants_mpi(int argc, char** argv) {
  for (int a = 1; a + 1 < argc; ++a)
    if (std::string(argv[a]) == "--distributed" && std::string(argv[a + 1]) == "mpi") return true;
  return false;
}

}  // namespace ssr_route
