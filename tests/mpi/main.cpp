// The distributed tests' runner: every rank runs the same Catch2 session; the program fails when any
// rank's tests fail. Tests make every collective call on every rank before they check anything, so a
// failed check never leaves a rank waiting for another (and ctest's timeout ends what would).
#include <mpi.h>

#include "../catch_session.hpp"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  const int failed = ssr_test::run_catch_session(argc, argv);
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any != 0 ? 1 : 0;
}
