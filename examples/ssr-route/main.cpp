// ssr-route: routes a logits matrix (.npy, float32 or float64) with any of the library's routers and
// writes the experts, weights and, when asked, gradients, noise and plan as .npy files, with a JSON
// summary on stdout. Bad input: exit status 2, one line on stderr, and nothing written. With
// --distributed mpi, under mpirun, the ranks share the rows and balance one plan (distributed.hpp).
#include <ssr/router.hpp>
#ifdef SSR_ROUTE_WITH_THRUST
#include <ssr/backend/thrust.hpp>
#endif
#ifdef SSR_ROUTE_WITH_CUDA
#include "route_cuda.hpp"
#endif
#ifdef SSR_ROUTE_WITH_MPI
#include "distributed.hpp"
#endif

#include <cstdio>
#include <exception>
#include <new>
#include <string>

#include "job.hpp"
#include "npy.hpp"
#include "options.hpp"

namespace {

using namespace ssr_route;

template <class T>
ssr::CpuBackend<T> cpu_backend(const Options& o) {
  return ssr::CpuBackend<T>(o.threads);
}
#ifdef SSR_ROUTE_WITH_THRUST
template <class T>
ssr::ThrustBackend<T> thrust_backend(const Options& o) {
  ssr::detail::require(o.threads >= 0, "threads", o.threads, "must be >= 0 (0: all available)");
  if (o.threads > 0) omp_set_num_threads(o.threads);  // Thrust's OMP system uses OpenMP's default team
  return {};
}
#endif

// The tool routes once per process, so a team of threads costs its creation and, while its threads spin
// after the call, part of the core that writes the outputs: with --threads 0 (all), logits below about 2M
// elements run on one thread (a whole run at 24576 x 16: 13.4 ms on two threads, 10.3 ms on one).
constexpr ssr::index_t parallel_min_elements = ssr::index_t{1} << 21;

template <class T>
Options with_threads_for(Options o, const Job<T>& job) {
  if (o.threads == 0 && job.in().rows * job.in().cols < parallel_min_elements) o.threads = 1;
  return o;
}

// Routes the whole job in this process, and maps dL/dw to dL/dS when asked.
template <class T, class Backend>
void route_here(const Options& o, Backend (*make_backend)(const Options&), Job<T>& job) {
  ssr::Router<ssr::SSRPolicy, Backend> router(job.policy, make_backend(with_threads_for(o, job)));
  job.info = router.route(job.in(), job.context(o), job.outputs());
  if (job.grad_s.size() > 0)
    router.backward(job.info, {job.in(), job.outputs().experts, job.outputs().weights, job.grad_in(), job.grad_out()});
}

template <class T, class Backend>
int run(const Options& o, Backend (*make_backend)(const Options&)) {
  Job<T> job(o);
  route_here(o, make_backend, job);
  job.write(o, 0);
  return 0;
}

#ifdef SSR_ROUTE_WITH_CUDA
template <class T>
int run_cuda(const Options& o) {
  if (o.threads != 0) throw UsageError("--threads applies to the cpu and thrust-omp backends, not to cuda");
  Job<T> job(o);
  job.info = route_cuda<T>(job.policy, job.context(o), job.in(), job.outputs(), job.grad_in(), job.grad_out());
  job.write(o, 0);
  return 0;
}
#endif

// Whether the logits file holds float64 (else float32; any malformed file is an error).
bool is_f64(const Options& o) { return read_npy_header(o.logits).itemsize == 8; }

int run_here(const Options& o) {
  if (o.distributed != "none")
    throw UsageError("--distributed mpi: this ssr-route was built without MPI (SSR_ENABLE_MPI=OFF)");
  const bool f64 = is_f64(o);
  if (o.backend == "thrust-omp") {
#ifdef SSR_ROUTE_WITH_THRUST
    return f64 ? run<double>(o, thrust_backend<double>) : run<float>(o, thrust_backend<float>);
#else
    throw UsageError(
        "--backend thrust-omp: this ssr-route was built without the Thrust backend (SSR_ENABLE_THRUST=OFF)");
#endif
  }
  if (o.backend == "cuda") {
#ifdef SSR_ROUTE_WITH_CUDA
    return f64 ? run_cuda<double>(o) : run_cuda<float>(o);
#else
    throw UsageError("--backend cuda: this ssr-route was built without the CUDA backend (SSR_ENABLE_CUDA=OFF)");
#endif
  }
  return f64 ? run<double>(o, cpu_backend<double>) : run<float>(o, cpu_backend<float>);
}

#ifdef SSR_ROUTE_WITH_MPI
int run_over_mpi(int argc, char** argv) {
  MpiSession mpi(&argc, &argv);
  Options o;
  bool f64 = false;
  std::string error;
  try {
    o = parse(argc, argv);
    f64 = is_f64(o);
    if (o.backend == "cuda") throw UsageError("--distributed mpi routes on the cpu or thrust-omp backend, not on cuda");
#ifndef SSR_ROUTE_WITH_THRUST
    if (o.backend == "thrust-omp")
      throw UsageError(
          "--backend thrust-omp: this ssr-route was built without the Thrust backend (SSR_ENABLE_THRUST=OFF)");
#endif
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!mpi.all_ok(error)) return 2;
#ifdef SSR_ROUTE_WITH_THRUST
  if (o.backend == "thrust-omp")
    return f64 ? run_distributed<double>(o, mpi, thrust_backend<double>)
               : run_distributed<float>(o, mpi, thrust_backend<float>);
#endif
  return f64 ? run_distributed<double>(o, mpi, cpu_backend<double>)
             : run_distributed<float>(o, mpi, cpu_backend<float>);
}
#endif

}  // namespace

int main(int argc, char** argv) {
#ifdef SSR_ROUTE_WITH_MPI
  if (wants_mpi(argc, argv)) return run_over_mpi(argc, argv);
#endif
  try {
    return run_here(parse(argc, argv));
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "ssr-route: out of memory\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ssr-route: %s\n", e.what());
  }
  return 2;
}
