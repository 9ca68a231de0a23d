// A consumer of the mpi component: one Sinkhorn solve over the ranks of MPI_COMM_WORLD (one rank when run
// without mpirun), every rank a shard of its own.
#include <ssr/mpi.hpp>
#include <ssr/router.hpp>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    const ssr::MpiCommunicator world(MPI_COMM_WORLD);
    const ssr::index_t m = 256, n = 8, k = 2;
    std::vector<float> logits(m * n);
    for (ssr::index_t e = 0; e < m * n; ++e) logits[e] = static_cast<float>((e * 37 + world.rank()) % 11) / 4.0f;
    std::vector<std::int32_t> experts(m * k);
    std::vector<float> weights(m * k);
    ssr::Router<ssr::SinkhornTopK> router(ssr::SinkhornTopK(2));
    const auto info = router.route({logits.data(), m, n}, ssr::Context::train(0).at_row(m * world.rank()),
                                   {{experts.data(), m, k}, {weights.data(), m, k}},
                                   ssr::CallOptions<ssr::HostStream>{}.across(world));
    status = info.converged ? 0 : 1;
    std::printf("rank %d of %d: %d iterations\n", world.rank(), world.size(), info.iterations);
  }
  MPI_Finalize();
  return status;
}
