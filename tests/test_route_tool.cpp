// The ssr-route tool, driven from outside as a user would: .npy in, .npy and JSON out, exit 2 on bad input.
#include <catch2/catch.hpp>

#include <xtensor/xmath.hpp>
#include <xtensor/xnpy.hpp>
#include <xtensor/xtensor.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

#include "support.hpp"

namespace fs = std::filesystem;

namespace {

struct Run {
  int status;
  std::string out, err;
};

// Runs a shell command, its output and errors kept in dir.
Run run_command(const std::string& command, const fs::path& dir) {
  const fs::path out = dir / "stdout.txt", err = dir / "stderr.txt";
  const std::string cmd = command + " >" + out.string() + " 2>" + err.string();
  const int raw = std::system(cmd.c_str());
  auto slurp = [](const fs::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, slurp(out), slurp(err)};
}

Run run_tool(const std::string& args, const fs::path& dir) { return run_command(std::string(SSR_ROUTE_EXE) + " " + args, dir); }

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("ssr-route-test-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST_CASE("ssr-route writes what the library computes", "[tool]") {
  const auto dir = fresh_dir("ok");
  const ssr::index_t m = 300, n = 8, k = 2;
  const auto s = test::random_logits<float>(m, n, 1.0, 3, 3.0);
  xt::xtensor<float, 2> logits({std::size_t(m), std::size_t(n)});
  std::copy(s.begin(), s.end(), logits.begin());
  xt::dump_npy((dir / "logits.npy").string(), logits);
  xt::xtensor<float, 2> g({std::size_t(m), std::size_t(k)}, 0.5f);
  xt::dump_npy((dir / "g.npy").string(), g);

  const auto r = run_tool("--logits " + (dir / "logits.npy").string() + " --out " + (dir / "out").string() +
                              " --policy sinkhorn --weights scores --noise-alpha 0.1 --seed 4 --step 2 --dump-noise "
                              "--dump-plan --grad-weights " + (dir / "g.npy").string(),
                          dir);
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("\"path\": \"sinkhorn\"") != std::string::npos);
  CHECK(r.out.find("\"converged\": true") != std::string::npos);
  CHECK(r.out.find("\"empty_experts\": 0") != std::string::npos);

  const auto policy = ssr::NoisyCost<ssr::SinkhornTopK>(ssr::SinkhornTopK(2, ssr::Cost::linear, {}, ssr::Weights::scores), 0.1, 1.0);
  const auto expected = test::route(policy, s, m, n, ssr::Context::train(2, 0, 4));
  const auto experts = xt::load_npy<std::int32_t>((dir / "out" / "experts.npy").string());
  const auto weights = xt::load_npy<float>((dir / "out" / "weights.npy").string());
  const auto plan = xt::load_npy<float>((dir / "out" / "plan.npy").string());
  const auto noise = xt::load_npy<float>((dir / "out" / "noise.npy").string());
  const auto grad = xt::load_npy<float>((dir / "out" / "grad_logits.npy").string());
  CHECK(std::vector<std::int32_t>(experts.begin(), experts.end()) == expected.experts);
  CHECK(std::vector<float>(weights.begin(), weights.end()) == expected.weights);
  CHECK(std::vector<float>(plan.begin(), plan.end()) == expected.plan);
  CHECK(std::vector<float>(noise.begin(), noise.end()) == expected.noise);
  CHECK(grad.shape()[0] == std::size_t(m));
  CHECK(grad.shape()[1] == std::size_t(n));
  fs::remove_all(dir);
}

TEST_CASE("ssr-route computes float64 logits in double and defaults to the selective softmax path", "[tool]") {
  const auto dir = fresh_dir("f64");
  xt::xtensor<double, 2> logits({4, 3});
  for (std::size_t i = 0; i < 12; ++i) logits.data()[i] = static_cast<double>(i % 5) * 0.3;
  xt::dump_npy((dir / "l.npy").string(), logits);
  const auto r = run_tool("--logits " + (dir / "l.npy").string() + " --out " + (dir / "o").string() + " --mode eval", dir);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("\"path\": \"softmax\", \"iterations\": 0, \"marginal_error\": null") != std::string::npos);
  const auto w = xt::load_npy<double>((dir / "o" / "weights.npy").string());
  CHECK(w.shape()[1] == 2);
  CHECK(!fs::exists(dir / "o" / "plan.npy"));
  fs::remove_all(dir);
}

TEST_CASE("ssr-route rejects bad input with status 2, one line on stderr, and writes nothing", "[tool]") {
  const auto dir = fresh_dir("bad");
  xt::xtensor<float, 2> logits({10, 4}, 0.25f);
  xt::dump_npy((dir / "l.npy").string(), logits);
  logits(3, 2) = std::numeric_limits<float>::quiet_NaN();
  xt::dump_npy((dir / "nan.npy").string(), logits);
  xt::xtensor<int, 2> ints({10, 4}, 1);
  xt::dump_npy((dir / "int.npy").string(), ints);
  xt::xtensor<float, 1> flat({10}, 1.0f);
  xt::dump_npy((dir / "flat.npy").string(), flat);
  const std::string l = " --logits " + (dir / "l.npy").string();
  const std::string out = " --out " + (dir / "o").string();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {l + out + " --k 5", "k = 5"},
      {l + out + " --k 0", "k = 0"},
      {l + out + " --xi 0", "xi = 0"},
      {l + out + " --xi -1", "xi = -1"},
      {l + out + " --tol 0", "tol = 0"},
      {l + out + " --max-iters 0", "max_iters = 0"},
      {l + out + " --p 2", "p = 2"},
      {l + out + " --noise-alpha -1", "alpha = -1"},
      {l + out + " --noise-sigma 0", "sigma = 0"},
      {l + out + " --threads -2", "threads = -2"},
      {l + out + " --xi abc", "--xi expects a number"},
      {l + out + " --policy fancy", "--policy expects"},
      {l + out + " --seed -1", "--seed expects"},
      {l + out + " --bogus", "unknown option '--bogus'"},
      {l + out + " --backend gpu", "--backend expects cpu|cuda|thrust-omp"},
      {l, "--out is required"},
      {" --logits " + (dir / "nan.npy").string() + out, "logits(3, 2) = nan"},
      {" --logits " + (dir / "int.npy").string() + out, "expected float32 or float64"},
      {" --logits " + (dir / "flat.npy").string() + out, "expected 2"},
      {" --logits " + (dir / "missing.npy").string() + out, "cannot open"},
      {l + out + " --grad-weights " + (dir / "l.npy").string(), "--grad-weights has shape 10x4, expected 10x2"},
  };
  for (const auto& c : cases) {
    const auto r = run_tool(c.first, dir);
    INFO(c.first << "\nstderr: " << r.err);
    CHECK(r.status == 2);
    CHECK(r.err.find(c.second) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.out.empty());
    CHECK(!fs::exists(dir / "o"));
  }
  fs::remove_all(dir);
}

TEST_CASE("ssr-route --backend thrust-omp routes as the CPU backend", "[tool][thrust]") {
  const auto dir = fresh_dir("thrust");
  const ssr::index_t m = 500, n = 16;
  const auto s = test::random_logits<float>(m, n, 1.0, 8, 3.0);
  xt::xtensor<float, 2> logits({std::size_t(m), std::size_t(n)});
  std::copy(s.begin(), s.end(), logits.begin());
  xt::dump_npy((dir / "l.npy").string(), logits);
  const std::string args = "--logits " + (dir / "l.npy").string() + " --policy sinkhorn --noise-alpha 0.1 --out ";
  const auto cpu = run_tool(args + (dir / "cpu").string(), dir);
  const auto thrust = run_tool(args + (dir / "thrust").string() + " --backend thrust-omp", dir);
  REQUIRE(cpu.status == 0);
#ifdef SSR_ROUTE_HAS_THRUST
  INFO(thrust.err);
  REQUIRE(thrust.status == 0);
  const auto a = xt::load_npy<std::int32_t>((dir / "cpu" / "experts.npy").string());
  const auto b = xt::load_npy<std::int32_t>((dir / "thrust" / "experts.npy").string());
  CHECK(a == b);
#else
  CHECK(thrust.status == 2);
  CHECK(thrust.err.find("built without the Thrust backend") != std::string::npos);
#endif
  fs::remove_all(dir);
}

// With a GPU the CUDA backend must route as the CPU backend does; without one (as in CI) the tool must say
// so and write nothing. SSR_EXPECT_GPU=1 makes a missing GPU a failure.
TEST_CASE("ssr-route --backend cuda routes as the CPU backend, or says why it cannot", "[tool][cuda]") {
  const auto dir = fresh_dir("cuda");
  const ssr::index_t m = 2000, n = 16, k = 2;
  const auto s = test::random_logits<float>(m, n, 1.0, 9, 3.0);
  xt::xtensor<float, 2> logits({std::size_t(m), std::size_t(n)});
  std::copy(s.begin(), s.end(), logits.begin());
  xt::dump_npy((dir / "l.npy").string(), logits);
  xt::xtensor<float, 2> g({std::size_t(m), std::size_t(k)});
  for (std::size_t e = 0; e < g.size(); ++e) g.data()[e] = static_cast<float>(e % 7) / 7.0f - 0.4f;
  xt::dump_npy((dir / "g.npy").string(), g);
  const char* expect_gpu = std::getenv("SSR_EXPECT_GPU");
  for (const std::string policy : {"softmax --noise-alpha 0.3", "sinkhorn --weights scores --noise-alpha 0.1 --dump-plan"}) {
    const std::string args = "--logits " + (dir / "l.npy").string() + " --grad-weights " + (dir / "g.npy").string() +
                             " --seed 5 --step 3 --policy " + policy + " --out ";
    const auto cpu = run_tool(args + (dir / "cpu").string(), dir);
    const auto gpu = run_tool(args + (dir / "gpu").string() + " --backend cuda", dir);
    INFO(policy << "\nstderr: " << gpu.err);
    REQUIRE(cpu.status == 0);
#ifdef SSR_ROUTE_HAS_CUDA
    if (gpu.status == 0) {
      const auto e = [&](const char* side, const char* file) { return (dir / side / file).string(); };
      const bool same_experts = xt::load_npy<std::int32_t>(e("cpu", "experts.npy")) == xt::load_npy<std::int32_t>(e("gpu", "experts.npy"));
      CHECK(same_experts);
      for (const char* file : {"weights.npy", "grad_logits.npy", "plan.npy"}) {
        if (!fs::exists(dir / "cpu" / file)) continue;
        const bool close = xt::allclose(xt::load_npy<float>(e("cpu", file)), xt::load_npy<float>(e("gpu", file)), 0.0, 2e-6);
        INFO(file);
        CHECK(close);
      }
      const auto load = [](const std::string& json) { return json.substr(json.find("\"load\"")); };
      CHECK(load(cpu.out) == load(gpu.out));
    } else {
      CHECK_FALSE((expect_gpu && std::string(expect_gpu) == "1"));
      CHECK(gpu.status == 2);
      CHECK(gpu.err.find("no usable CUDA device") != std::string::npos);
      CHECK(!fs::exists(dir / "gpu"));
    }
#else
    (void)expect_gpu;
    CHECK(gpu.status == 2);
    CHECK(gpu.err.find("built without the CUDA backend") != std::string::npos);
#endif
  }
  fs::remove_all(dir);
}

// ssr-route --distributed mpi under mpirun: the same files and JSON as one process (plus "ranks"), the
// experts and noise identical, the weights within 1e-5 and the same iterations; bad input on every rank
// ends every rank with status 2.
TEST_CASE("ssr-route --distributed mpi routes as one process", "[tool][mpi]") {
#ifdef SSR_ROUTE_HAS_MPI
  const auto dir = fresh_dir("mpi");
  const ssr::index_t m = 1001, n = 16;
  const auto s = test::random_logits<float>(m, n, 1.0, 12, 3.0);
  xt::xtensor<float, 2> logits({std::size_t(m), std::size_t(n)});
  std::copy(s.begin(), s.end(), logits.begin());
  xt::dump_npy((dir / "l.npy").string(), logits);
  const std::string mpirun = std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ") +
                             "OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1 " + SSR_MPIEXEC +
                             " -np 3 --oversubscribe ";
  const std::string args = " --logits " + (dir / "l.npy").string() + " --policy sinkhorn --noise-alpha 0.2 --dump-noise --out ";
  const auto one = run_tool(args + (dir / "one").string(), dir);
  const auto three = run_command(mpirun + SSR_ROUTE_EXE + args + (dir / "three").string() + " --distributed mpi", dir);
  INFO(three.err);
  REQUIRE(one.status == 0);
  REQUIRE(three.status == 0);
  CHECK(three.out.find("\"ranks\": 3") != std::string::npos);
  const auto iterations = [](const std::string& json) { return json.substr(0, json.find("\"marginal_error\"")); };
  CHECK(iterations(one.out) == iterations(three.out));
  const auto file = [&](const char* side, const char* name) { return (dir / side / name).string(); };
  const bool same_experts = xt::load_npy<std::int32_t>(file("one", "experts.npy")) == xt::load_npy<std::int32_t>(file("three", "experts.npy"));
  const bool same_noise = xt::load_npy<float>(file("one", "noise.npy")) == xt::load_npy<float>(file("three", "noise.npy"));
  const bool close_weights =
      xt::allclose(xt::load_npy<float>(file("one", "weights.npy")), xt::load_npy<float>(file("three", "weights.npy")), 0.0, 1e-5);
  CHECK(same_experts);
  CHECK(same_noise);
  CHECK(close_weights);

  const auto bad = run_command(mpirun + SSR_ROUTE_EXE + " --logits " + (dir / "missing.npy").string() + " --out " +
                                   (dir / "bad").string() + " --distributed mpi",
                               dir);
  CHECK(bad.status == 2);
  CHECK(bad.err.find("ssr-route: cannot open") != std::string::npos);
  CHECK(!fs::exists(dir / "bad"));
  fs::remove_all(dir);
#else
  const auto r = run_tool("--logits x.npy --out o --distributed mpi", fs::temp_directory_path());
  CHECK(r.status == 2);
  CHECK(r.err.find("built without MPI") != std::string::npos);
#endif
}
