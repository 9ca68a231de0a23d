// ssr-route: routes a logits matrix (.npy, float32 or float64) with any of the library's routers and
// writes the experts, weights and, when asked, gradients, noise and plan as .npy files, with a JSON
// summary on stdout. Bad input: exit status 2, one line on stderr, and nothing written.
#include <ssr/load_stats.hpp>
#include <ssr/router.hpp>
#ifdef SSR_ROUTE_WITH_THRUST
#include <ssr/backend/thrust.hpp>
#endif
#ifdef SSR_ROUTE_WITH_CUDA
#include "route_cuda.hpp"
#endif

#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xnpy.hpp>
#include <xtensor/xtensor.hpp>

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

constexpr const char* usage =
    "usage: ssr-route --logits L.npy --out DIR [--policy softmax|sinkhorn|ssr|selective] [--cost linear|softmax]\n"
    "                 [--k K] [--xi X] [--tol T] [--max-iters N] [--weights plan|scores] [--p P]\n"
    "                 [--noise-alpha A] [--noise-sigma S] [--seed N] [--step N] [--layer N] [--mode train|eval]\n"
    "                 [--threads N] [--backend cpu|thrust-omp|cuda] [--grad-weights G.npy] [--dump-noise] [--dump-plan]\n";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  std::string logits, out, grad_weights;
  std::string backend = "cpu";
  ssr::RouterConfig router;  // the router by name, with the library's defaults
  ssr::Context ctx = ssr::Context::train(0);
  int threads = 0;
  bool dump_noise = false, dump_plan = false;
};

double to_double(const std::string& opt, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || errno == ERANGE) throw UsageError(opt + " expects a number, got '" + v + "'");
  return d;
}

unsigned long long to_unsigned(const std::string& opt, const std::string& v, unsigned long long max) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long u = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || v[0] == '-' || *end != '\0' || errno == ERANGE || u > max)
    throw UsageError(opt + " expects an integer in [0, " + std::to_string(max) + "], got '" + v + "'");
  return u;
}

int to_int(const std::string& opt, const std::string& v) {
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

Options parse(int argc, char** argv) {
  Options o;
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
      {"--grad-weights", [&](const std::string& v) { o.grad_weights = v; }},
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
  return o;
}

// The dtype ('<f4', '<f8', ...) in a .npy header.
std::string npy_dtype(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot open '" + path + "'");
  char magic[8] = {};
  in.read(magic, 8);
  if (!in || std::string(magic, 6) != "\x93NUMPY") throw UsageError("'" + path + "' is not a .npy file");
  std::size_t len = 0;
  unsigned char b[4] = {};
  const int width = magic[6] == 1 ? 2 : 4;
  in.read(reinterpret_cast<char*>(b), width);
  for (int i = width - 1; i >= 0; --i) len = len * 256 + b[i];
  std::string header(len, '\0');
  in.read(&header[0], static_cast<std::streamsize>(len));
  const auto key = header.find("'descr'");
  const auto q1 = header.find('\'', header.find(':', key) + 1), q2 = header.find('\'', q1 + 1);
  if (!in || key == std::string::npos || q1 == std::string::npos || q2 == std::string::npos)
    throw UsageError("'" + path + "' has an unreadable .npy header");
  return header.substr(q1 + 1, q2 - q1 - 1);
}

// A 2-d .npy file as a row-major T matrix, whatever its floating-point dtype.
template <class T>
xt::xtensor<T, 2> load_matrix(const std::string& path, const char* what) {
  const std::string dtype = npy_dtype(path);
  xt::xarray<T> a;
  if (dtype == "<f4" || dtype == "|f4") {
    a = xt::load_npy<float>(path);
  } else if (dtype == "<f8" || dtype == "|f8") {
    a = xt::load_npy<double>(path);
  } else {
    throw UsageError(std::string(what) + " '" + path + "' has dtype " + dtype + "; expected float32 or float64");
  }
  if (a.dimension() != 2)
    throw UsageError(std::string(what) + " '" + path + "' has " + std::to_string(a.dimension()) + " dimensions; expected 2");
  return a;
}

std::string json_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// Files are written under temporary names and renamed once all are complete.
class Output {
 public:
  explicit Output(fs::path dir) : dir_(std::move(dir)) {}
  ~Output() {
    for (const auto& f : pending_) fs::remove(f.first);
  }
  template <class E>
  void add(const std::string& name, const E& array) {
    fs::create_directories(dir_);
    const fs::path tmp = dir_ / ("." + name + ".tmp" + std::to_string(::getpid()));
    xt::dump_npy(tmp.string(), array);
    pending_.push_back({tmp, dir_ / name});
  }
  void commit() {
    for (const auto& f : pending_) fs::rename(f.first, f.second);
    pending_.clear();
  }

 private:
  fs::path dir_;
  std::vector<std::pair<fs::path, fs::path>> pending_;
};

template <class T>
ssr::CpuBackend<T> make_backend(const Options& o, ssr::CpuBackend<T>*) {
  return ssr::CpuBackend<T>(o.threads);
}
#ifdef SSR_ROUTE_WITH_THRUST
template <class T>
ssr::ThrustBackend<T> make_backend(const Options& o, ssr::ThrustBackend<T>*) {
  ssr::detail::require(o.threads >= 0, "threads", o.threads, "must be >= 0 (0: all available)");
  if (o.threads > 0) omp_set_num_threads(o.threads);  // Thrust's OMP system uses OpenMP's default team
  return {};
}
#endif

// Routes on a host backend, and maps grad_w to grad_s when grad_w is given.
template <class T, class Backend>
ssr::RouteInfo route_on(const Options& o, const ssr::SSRPolicy& policy, ssr::ConstMatrixView<T> logits,
                        const ssr::RouteOutputs<T>& out, ssr::ConstMatrixView<T> grad_w, ssr::MatrixView<T> grad_s) {
  ssr::Router<ssr::SSRPolicy, Backend> router(policy, make_backend(o, static_cast<Backend*>(nullptr)));
  const ssr::RouteInfo info = router.route(logits, o.ctx, out);
  if (!grad_w.empty()) router.backward(info, out.experts, out.weights, grad_w, grad_s);
  return info;
}

#ifdef SSR_ROUTE_WITH_CUDA
template <class T>
ssr::RouteInfo route_on_cuda(const Options& o, const ssr::SSRPolicy& policy, ssr::ConstMatrixView<T> logits,
                             const ssr::RouteOutputs<T>& out, ssr::ConstMatrixView<T> grad_w, ssr::MatrixView<T> grad_s) {
  if (o.threads != 0) throw UsageError("--threads applies to the cpu and thrust-omp backends, not to cuda");
  return ssr_route::route_cuda<T>(policy, o.ctx, logits, out, grad_w, grad_s);
}
#endif

template <class T>
using RouteFn = ssr::RouteInfo (*)(const Options&, const ssr::SSRPolicy&, ssr::ConstMatrixView<T>, const ssr::RouteOutputs<T>&,
                                   ssr::ConstMatrixView<T>, ssr::MatrixView<T>);

template <class T>
int run(const Options& o, RouteFn<T> route) {
  const xt::xtensor<T, 2> logits = load_matrix<T>(o.logits, "--logits");
  const auto m = static_cast<ssr::index_t>(logits.shape()[0]), n = static_cast<ssr::index_t>(logits.shape()[1]);
  const ssr::SSRPolicy policy = ssr::make_policy(o.router);
  const auto k = static_cast<ssr::index_t>(o.router.k);

  const auto dims = [](ssr::index_t r, ssr::index_t c) {
    return std::array<std::size_t, 2>{static_cast<std::size_t>(r), static_cast<std::size_t>(c)};
  };
  xt::xtensor<T, 2> grad_w;
  if (!o.grad_weights.empty()) {
    grad_w = load_matrix<T>(o.grad_weights, "--grad-weights");
    if (grad_w.shape()[0] != static_cast<std::size_t>(m) || grad_w.shape()[1] != static_cast<std::size_t>(k))
      throw UsageError("--grad-weights has shape " + std::to_string(grad_w.shape()[0]) + "x" +
                       std::to_string(grad_w.shape()[1]) + ", expected " + std::to_string(m) + "x" + std::to_string(k));
  }
  xt::xtensor<std::int32_t, 2> experts(dims(m, k));
  xt::xtensor<T, 2> weights(dims(m, k)), noise(dims(o.dump_noise ? m : 0, n)), plan(dims(o.dump_plan ? m : 0, n));
  std::vector<std::int32_t> load(static_cast<std::size_t>(n));
  ssr::RouteOutputs<T> out{{experts.data(), m, k}, {weights.data(), m, k}, {load.data(), n}};
  if (o.dump_noise) out.noise = {noise.data(), m, n};
  if (o.dump_plan) out.plan = {plan.data(), m, n};
  xt::xtensor<T, 2> grad_s(dims(o.grad_weights.empty() ? 0 : m, n));
  const ssr::RouteInfo info =
      route(o, policy, {logits.data(), m, n}, out, o.grad_weights.empty() ? ssr::ConstMatrixView<T>{} : ssr::ConstMatrixView<T>{grad_w.data(), m, k},
            o.grad_weights.empty() ? ssr::MatrixView<T>{} : ssr::MatrixView<T>{grad_s.data(), m, n});

  Output files(o.out);
  files.add("experts.npy", experts);
  files.add("weights.npy", weights);
  if (!o.grad_weights.empty()) files.add("grad_logits.npy", grad_s);
  if (o.dump_noise) files.add("noise.npy", noise);
  if (o.dump_plan && info.path == ssr::Path::sinkhorn) files.add("plan.npy", plan);
  files.commit();

  const ssr::LoadStats st = ssr::load_stats({load.data(), n});
  std::string json = "{\"path\": \"" + std::string(ssr::to_string(info.path)) + "\", \"iterations\": " +
                     std::to_string(info.iterations) + ", \"marginal_error\": " +
                     (info.path == ssr::Path::sinkhorn ? json_number(info.marginal_error) : std::string("null")) +
                     ", \"converged\": " + (info.converged ? "true" : "false") + ", \"load\": [";
  for (ssr::index_t j = 0; j < n; ++j) json += (j ? ", " : "") + std::to_string(load[static_cast<std::size_t>(j)]);
  json += "], \"max_over_mean\": " + json_number(st.max_over_mean) + ", \"cv\": " + json_number(st.cv) +
          ", \"empty_experts\": " + std::to_string(st.empty_experts) + "}";
  std::printf("%s\n", json.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    const std::string dtype = npy_dtype(o.logits);
    const bool f64 = dtype == "<f8" || dtype == "|f8";
    if (!f64 && dtype != "<f4" && dtype != "|f4")
      throw UsageError("--logits '" + o.logits + "' has dtype " + dtype + "; expected float32 or float64");
    if (o.backend == "thrust-omp") {
#ifdef SSR_ROUTE_WITH_THRUST
      return f64 ? run<double>(o, route_on<double, ssr::ThrustBackend<double>>) : run<float>(o, route_on<float, ssr::ThrustBackend<float>>);
#else
      throw UsageError("--backend thrust-omp: this ssr-route was built without the Thrust backend (SSR_ENABLE_THRUST=OFF)");
#endif
    }
    if (o.backend == "cuda") {
#ifdef SSR_ROUTE_WITH_CUDA
      return f64 ? run<double>(o, route_on_cuda<double>) : run<float>(o, route_on_cuda<float>);
#else
      throw UsageError("--backend cuda: this ssr-route was built without the CUDA backend (SSR_ENABLE_CUDA=OFF)");
#endif
    }
    return f64 ? run<double>(o, route_on<double, ssr::CpuBackend<double>>) : run<float>(o, route_on<float, ssr::CpuBackend<float>>);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "ssr-route: %s\n", e.what());
  } catch (const ssr::Error& e) {
    std::fprintf(stderr, "ssr-route: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ssr-route: %s\n", e.what());
  }
  return 2;
}
