// The ssr-route tool, driven from outside as a user would: .npy in, .npy and JSON out, exit 2 on bad input.
#include <catch2/catch.hpp>

#include <xtensor/xmath.hpp>
#include <xtensor/xnpy.hpp>
#include <xtensor/xtensor.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

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

// A .npy file written byte by byte: magic, version, header length, the header text (padded with spaces to
// a multiple of 64 and ended with a newline, as numpy writes it, unless raw), then payload.
void write_npy(const fs::path& path, const std::string& header, const std::string& payload, int major = 1,
               bool raw = false) {
  std::string text = header;
  const std::size_t lead = major == 1 ? 10 : 12;
  if (!raw) {
    while ((lead + text.size() + 1) % 64 != 0) text += ' ';
    text += '\n';
  }
  std::string file = std::string("\x93NUMPY", 6) + static_cast<char>(major) + '\0';
  for (std::size_t i = 0; i < lead - 8; ++i) file += static_cast<char>((text.size() >> (8 * i)) & 0xff);
  std::ofstream(path, std::ios::binary) << file << text << payload;
}

// The bytes of values as a .npy payload of the given width (4 or 8) and byte order.
template <class T>
std::string npy_payload(const std::vector<double>& values, bool big_endian) {
  std::string out;
  for (const double v : values) {
    const T x = static_cast<T>(v);
    char b[sizeof(T)];
    std::memcpy(b, &x, sizeof(T));
    if (big_endian) std::reverse(b, b + sizeof(T));
    out.append(b, sizeof(T));
  }
  return out;
}

// test::random_logits(m, n, 1, seed, skew) as float, written to path as a .npy file.
void write_random_logits(const fs::path& path, ssr::index_t m, ssr::index_t n, unsigned seed, double skew) {
  const auto s = test::random_logits<float>(m, n, 1.0, seed, skew);
  xt::xtensor<float, 2> logits({static_cast<std::size_t>(m), static_cast<std::size_t>(n)});
  std::copy(s.begin(), s.end(), logits.begin());
  xt::dump_npy(path.string(), logits);
}

std::string slurp_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The tool this build made, or SSR_ROUTE_EXE where the binaries were moved (cuda/run_gpu_checks.sh sets it).
std::string route_exe() {
  const char* moved = std::getenv("SSR_ROUTE_EXE");
  return moved && *moved ? moved : SSR_ROUTE_EXE;
}

Run run_tool(const std::string& args, const fs::path& dir) { return run_command(route_exe() + " " + args, dir); }

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
  // A dL/dw that varies: with score weights a constant one would give dL/dS = 0 everywhere.
  const auto g_values = test::random_logits<float>(m, k, 1.0, 5);
  xt::xtensor<float, 2> g({std::size_t(m), std::size_t(k)});
  std::copy(g_values.begin(), g_values.end(), g.begin());
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
  REQUIRE(grad.shape()[0] == std::size_t(m));
  REQUIRE(grad.shape()[1] == std::size_t(n));
  test::Router<decltype(policy), float> router(policy);
  std::vector<float> want(static_cast<std::size_t>(m * n));
  router.backward(expected.info, {{},
                                  {expected.experts.data(), m, k},
                                  {expected.weights.data(), m, k},
                                  {g_values.data(), m, k},
                                  {want.data(), m, n}});
  CHECK(std::vector<float>(grad.begin(), grad.end()) == want);
  CHECK(std::any_of(want.begin(), want.end(), [](float d) { return d != 0; }));
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

TEST_CASE("ssr-route routes with sigmoid scores, an expert bias and group-limited top-k", "[tool][selection]") {
  const auto dir = fresh_dir("selection");
  const ssr::index_t m = 200, n = 16, k = 3;
  write_random_logits(dir / "logits.npy", m, n, 5, 2.0);
  const auto s = test::random_logits<float>(m, n, 1.0, 5, 2.0);
  xt::xtensor<float, 1> bias({std::size_t(n)}, 0.0f);
  for (ssr::index_t j = 0; j < n; ++j) bias(j) = 0.05f * static_cast<float>(j % 5) - 0.1f;
  xt::dump_npy((dir / "bias.npy").string(), bias);
  xt::xtensor<float, 2> g({std::size_t(m), std::size_t(k)}, 0.5f);
  g(0, 0) = 2;
  xt::dump_npy((dir / "g.npy").string(), g);
  const auto r = run_tool("--logits " + (dir / "logits.npy").string() + " --out " + (dir / "out").string() +
                              " --policy softmax --k 3 --score sigmoid --n-groups 4 --topk-groups 2 --expert-bias " +
                              (dir / "bias.npy").string() + " --grad-weights " + (dir / "g.npy").string(),
                          dir);
  INFO(r.err);
  REQUIRE(r.status == 0);
  const ssr::SoftmaxTopK policy(3, ssr::Cost::linear, {ssr::Score::sigmoid, 4, 2});
  const std::vector<float> b(bias.begin(), bias.end());
  const ssr::Context ctx = ssr::Context::train(0).with_bias({b.data(), n});
  test::Router<ssr::SoftmaxTopK, float> router(policy);
  test::Routed<float> expected(m, n, k);
  expected.info = router.route({s.data(), m, n}, ctx, expected.outputs());
  std::vector<float> grad(m * n);
  router.backward(expected.info, {{s.data(), m, n},
                                  {expected.experts.data(), m, k},
                                  {expected.weights.data(), m, k},
                                  {g.data(), m, k},
                                  {grad.data(), m, n}});
  const auto experts = xt::load_npy<std::int32_t>((dir / "out" / "experts.npy").string());
  const auto weights = xt::load_npy<float>((dir / "out" / "weights.npy").string());
  const auto grad_out = xt::load_npy<float>((dir / "out" / "grad_logits.npy").string());
  CHECK(std::vector<std::int32_t>(experts.begin(), experts.end()) == expected.experts);
  CHECK(std::vector<float>(weights.begin(), weights.end()) == expected.weights);
  CHECK(std::vector<float>(grad_out.begin(), grad_out.end()) == grad);
  // The bias changed the selection.
  const auto plain = test::route(policy, s, m, n, ssr::Context::train(0));
  CHECK(plain.experts != expected.experts);
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
  xt::xtensor<float, 1> nan_bias({4}, 0.0f);
  nan_bias(1) = std::numeric_limits<float>::quiet_NaN();
  xt::dump_npy((dir / "nanbias.npy").string(), nan_bias);
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
      {l + out + " --score tanh", "--score expects sigmoid|softmax"},
      {l + out + " --n-groups 2", "--n-groups and --topk-groups go together"},
      {l + out + " --policy softmax --n-groups 3 --topk-groups 1", "n_groups = 3: must divide the number of experts n = 4"},
      {l + out + " --n-groups 2 --topk-groups 3", "topk_groups = 3"},
      {l + out + " --policy softmax --n-groups 4 --topk-groups 1", "k = 2: must be at most topk_groups * n / n_groups = 1"},
      {l + out + " --policy ssr --n-groups 2 --topk-groups 1", "Sinkhorn path"},
      {l + out + " --policy softmax --score sigmoid --noise-alpha 0.1", "alpha = 0.1"},
      {l + out + " --expert-bias " + (dir / "l.npy").string(), "--expert-bias '"},
      {l + out + " --expert-bias " + (dir / "flat.npy").string(), "--expert-bias has 10 entries, expected one per expert (4)"},
      {l + out + " --expert-bias " + (dir / "nanbias.npy").string(), "--expert-bias[1] = nan: must be finite"},
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

TEST_CASE("ssr-route rejects every malformed .npy file with status 2, naming the file, and writes nothing", "[tool]") {
  const auto dir = fresh_dir("npy");
  const std::string f4 = npy_payload<float>(std::vector<double>(40, 0.5), false);  // 10 x 4 float32
  const std::string ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (10, 4), }";
  struct Case {
    std::string name, header, payload, message;
    int major;
    bool raw;
  };
  const std::vector<Case> cases = {
      {"empty", "", "", "not a .npy file", 1, true},
      {"text", "", "", "not a .npy file", 1, true},
      {"version", ok, f4, "unsupported .npy version 4.0", 4, false},
      {"not_a_dict", "[10, 4]", f4, "not a .npy dict", 1, false},
      {"no_shape", "{'descr': '<f4', 'fortran_order': False}", f4, "lacks the key 'shape'", 1, false},
      {"repeated", "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (10, 4)}", f4,
       "repeats the key 'descr'", 1, false},
      {"unknown", "{'descr': '<f4', 'fortran_order': False, 'shape': (10, 4), 'extra': 1}", f4, "unknown key 'extra'",
       1, false},
      {"int_dtype", "{'descr': '<i4', 'fortran_order': False, 'shape': (10, 4)}", f4, "dtype '<i4'", 1, false},
      {"half_dtype", "{'descr': '<f2', 'fortran_order': False, 'shape': (10, 8)}", f4, "dtype '<f2'", 1, false},
      {"pipe_dtype", "{'descr': '|f4', 'fortran_order': False, 'shape': (10, 4)}", f4, "dtype '|f4'", 1, false},
      {"order", "{'descr': '<f4', 'fortran_order': 0, 'shape': (10, 4)}", f4, "neither True nor False", 1, false},
      {"negative", "{'descr': '<f4', 'fortran_order': False, 'shape': (-10, 4)}", f4, "non-negative integers", 1, false},
      {"one_d", "{'descr': '<f4', 'fortran_order': False, 'shape': (40,)}", f4, "1 dimensions; expected 2", 1, false},
      {"three_d", "{'descr': '<f4', 'fortran_order': False, 'shape': (10, 2, 2)}", f4, "3 dimensions; expected 2", 1,
       false},
      {"overflow", "{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904, 8)}", f4,
       "overflows 64-bit sizes", 1, false},
      {"huge", "{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000, 1000)}", f4, "truncated", 1, false},
      {"truncated", ok, f4.substr(0, 100), "truncated: shape (10, 4) of float32 needs 160 bytes of data, the file has 100",
       1, false},
      {"longer", ok, f4 + "0123", "longer than its shape", 1, false},
      {"no_newline", ok, f4, "does not end with a newline", 1, true},
      {"header_past_end", ok + std::string(100, ' '), "", "runs past the end of the file", 1, false},
  };
  const std::string out = " --out " + (dir / "o").string();
  for (const auto& c : cases) {
    const fs::path file = dir / (c.name + ".npy");
    write_npy(file, c.header, c.payload, c.major, c.raw);
    if (c.name == "header_past_end") fs::resize_file(file, 40);  // the header's length says more than 40 bytes
    if (c.name == "empty") fs::resize_file(file, 0);
    if (c.name == "text") std::ofstream(file) << "step,loss\n1,2.5\n";
    for (const std::string option : {"--logits", "--grad-weights"}) {
      const std::string args = option == std::string("--logits")
                                   ? " --logits " + file.string()
                                   : " --logits " + (dir / "valid.npy").string() + " --grad-weights " + file.string();
      if (option != std::string("--logits")) write_npy(dir / "valid.npy", ok, f4);
      const auto r = run_tool(args + out, dir);
      INFO(c.name << " " << option << "\nstderr: " << r.err);
      CHECK(r.status == 2);
      CHECK(r.err.find(c.message) != std::string::npos);
      CHECK(r.err.find(file.string()) != std::string::npos);
      CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
      CHECK(!fs::exists(dir / "o"));
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("ssr-route reads big-endian and Fortran-ordered .npy files as numpy does", "[tool]") {
  const auto dir = fresh_dir("npy_orders");
  const std::size_t m = 50, n = 6;
  const auto s = test::random_logits<double>(static_cast<ssr::index_t>(m), static_cast<ssr::index_t>(n), 1.0, 8, 2.0);
  std::vector<double> row_major(s.begin(), s.end()), column_major(m * n);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) column_major[j * m + i] = row_major[i * n + j];
  const std::string shape = "'shape': (50, 6)}";
  write_npy(dir / "c.npy", "{'descr': '<f8', 'fortran_order': False, " + shape, npy_payload<double>(row_major, false));
  write_npy(dir / "big.npy", "{'descr': '>f8', 'fortran_order': False, " + shape, npy_payload<double>(row_major, true));
  write_npy(dir / "fortran.npy", "{'descr': '<f8', 'fortran_order': True, " + shape, npy_payload<double>(column_major, false));
  write_npy(dir / "big_fortran.npy", "{'fortran_order': True, 'descr': '>f8', " + shape,
            npy_payload<double>(column_major, true));
  write_npy(dir / "v2.npy", "{'descr': '<f8', 'fortran_order': False, " + shape, npy_payload<double>(row_major, false), 2);
  write_npy(dir / "c32.npy", "{'descr': '<f4', 'fortran_order': False, " + shape, npy_payload<float>(row_major, false));
  write_npy(dir / "big32.npy", "{'descr': '>f4', 'fortran_order': False, " + shape, npy_payload<float>(row_major, true));
  // A header numpy would not write, its data at an odd offset: read, where "c" is mapped as it lies.
  std::string odd = "{'descr': '<f8', 'fortran_order': False, " + shape;
  if ((10 + odd.size() + 1) % 2 == 0) odd += ' ';
  odd += '\n';
  write_npy(dir / "unaligned.npy", odd, npy_payload<double>(row_major, false), 1, true);
  const auto route = [&](const std::string& name) {
    const auto r = run_tool("--logits " + (dir / (name + ".npy")).string() + " --out " + (dir / name).string() +
                                " --policy sinkhorn --dump-plan",
                            dir);
    INFO(name << ": " << r.err);
    REQUIRE(r.status == 0);
    return slurp_file(dir / name / "experts.npy") + slurp_file(dir / name / "weights.npy") + slurp_file(dir / name / "plan.npy");
  };
  const std::string expected = route("c");
  for (const std::string name : {"big", "fortran", "big_fortran", "v2", "unaligned"}) CHECK(route(name) == expected);
  CHECK(route("big32") == route("c32"));
  fs::remove_all(dir);
}

TEST_CASE("ssr-route replaces its output directory as one set: the previous outputs or the new, never a mix", "[tool]") {
  const auto dir = fresh_dir("atomic");
  write_random_logits(dir / "l.npy", 5000, 8, 9, 2.0);
  const fs::path out = dir / "o";
  const std::string first = "--logits " + (dir / "l.npy").string() + " --out " + out.string() +
                            " --policy sinkhorn --dump-plan --dump-noise --noise-alpha 0.2";
  const std::string second = "--logits " + (dir / "l.npy").string() + " --out " + out.string() + " --policy softmax";
  const auto contents = [&] {
    std::map<std::string, std::string> files;
    for (const auto& e : fs::directory_iterator(out)) files[e.path().filename().string()] = slurp_file(e.path());
    return files;
  };
  REQUIRE(run_tool(first, dir).status == 0);
  const auto previous = contents();
  CHECK(previous.size() == 4);

  SECTION("a full disk (a file size limit) is exit 2 and leaves the previous outputs") {
    const auto r = run_command("bash -c \"trap '' XFSZ; ulimit -f 8; exec " + route_exe() + " " + second + "\"", dir);
    INFO(r.err);
    CHECK(r.status == 2);
    CHECK(r.err.find("cannot write") != std::string::npos);
    CHECK(contents() == previous);
  }
  SECTION("a run killed while writing leaves the previous outputs") {
    const auto r = run_command("bash -c \"ulimit -f 8; exec " + route_exe() + " " + second + "\"", dir);
    CHECK(r.status != 0);  // SIGXFSZ
    CHECK(contents() == previous);
  }
  SECTION("a complete run replaces the whole set: no file of the previous run remains") {
    REQUIRE(run_tool(second, dir).status == 0);
    const auto now = contents();
    CHECK(now.size() == 2);
    CHECK(now.count("experts.npy") == 1);
    CHECK(now.count("plan.npy") == 0);
    CHECK(now.at("experts.npy") != previous.at("experts.npy"));
  }
  SECTION("a directory holding other files, or a file, is refused before anything is written") {
    std::ofstream(out / "notes.txt") << "mine\n";
    auto r = run_tool(second, dir);
    CHECK(r.status == 2);
    CHECK(r.err.find("holds 'notes.txt', which is not an ssr-route output") != std::string::npos);
    CHECK(slurp_file(out / "notes.txt") == "mine\n");
    fs::remove(out / "notes.txt");
    CHECK(contents() == previous);
    r = run_tool("--logits " + (dir / "l.npy").string() + " --out " + (dir / "l.npy").string(), dir);
    CHECK(r.status == 2);
    CHECK(r.err.find("is not a directory") != std::string::npos);
  }
  SECTION("an unwritable place is exit 2 with one line") {
    const auto r = run_tool("--logits " + (dir / "l.npy").string() + " --out /proc/ssr-route-test/o", dir);
    CHECK(r.status == 2);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
  fs::remove_all(dir);
}

TEST_CASE("ssr-route --backend thrust-omp routes as the CPU backend", "[tool][thrust]") {
  const auto dir = fresh_dir("thrust");
  const ssr::index_t m = 500, n = 16;
  write_random_logits(dir / "l.npy", m, n, 8, 3.0);
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
  write_random_logits(dir / "l.npy", m, n, 9, 3.0);
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
  write_random_logits(dir / "l.npy", m, n, 12, 3.0);
  const std::string mpirun = std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ") +
                             "OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1 " + SSR_MPIEXEC +
                             " -np 3 --oversubscribe ";
  const std::string args = " --logits " + (dir / "l.npy").string() + " --policy sinkhorn --noise-alpha 0.2 --dump-noise --out ";
  const auto one = run_tool(args + (dir / "one").string(), dir);
  const auto three = run_command(mpirun + route_exe() + args + (dir / "three").string() + " --distributed mpi", dir);
  INFO(three.err);
  REQUIRE(one.status == 0);
  REQUIRE(three.status == 0);
  CHECK(three.out.find("\"ranks\": 3") != std::string::npos);
  CHECK(one.out.find("\"ranks\"") == std::string::npos);
  std::string mpirun_one = mpirun;
  mpirun_one.replace(mpirun_one.find(" -np 3 "), 7, " -np 1 ");
  const auto single = run_command(mpirun_one + route_exe() + args + (dir / "single").string() + " --distributed mpi", dir);
  REQUIRE(single.status == 0);
  CHECK(single.out.find("\"ranks\": 1") != std::string::npos);
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

  const auto bad = run_command(mpirun + route_exe() + " --logits " + (dir / "missing.npy").string() + " --out " +
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
