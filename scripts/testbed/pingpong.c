/* MPI ping-pong for checking the testbed's links (built by check.sh).
 *
 *   mpirun -np P pingpong PEER [PEER...]
 *
 * Rank 0 ping-pongs with each PEER rank in turn (the other ranks only wait)
 * and prints, per peer and message size, the median and minimum round trip
 * and the bandwidth size / (median RTT / 2). Under testbed.sh with 2 ranks
 * per node, peer 1 shares node0 (shared memory) and peer 2 sits on node1
 * (TCP over the shaped link). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  static const long sizes[] = {8, 1024, 16384, 65536, 262144, 1048576, 4194304, 16777216};
  const int nsizes = sizeof sizes / sizeof sizes[0];
  char* buf = calloc(1, (size_t)sizes[nsizes - 1]);
  double* rtt = malloc(sizeof(double) * 1000);
  char name[MPI_MAX_PROCESSOR_NAME], peer_name[MPI_MAX_PROCESSOR_NAME];
  int len;
  MPI_Get_processor_name(name, &len);
  if (rank == 0) printf("%-14s %10s %12s %12s %12s\n", "pair", "bytes", "rtt_med_us", "rtt_min_us", "MB/s");
  for (int a = 1; a < argc; a++) {
    const int peer = atoi(argv[a]);
    if (peer <= 0 || peer >= size) continue;
    if (rank == peer) MPI_Send(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
    if (rank == 0) MPI_Recv(peer_name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    for (int s = 0; s < nsizes; s++) {
      const long n = sizes[s];
      /* Enough repetitions for a stable median, capped at ~64 MB each way. */
      int iters = (int)(64L * 1048576 / n);
      if (iters > 1000) iters = 1000;
      if (iters < 5) iters = 5;
      const int warm = iters / 10 + 2;
      for (int i = -warm; i < iters; i++) {
        double t0 = MPI_Wtime();
        if (rank == 0) {
          MPI_Send(buf, (int)n, MPI_CHAR, peer, 0, MPI_COMM_WORLD);
          MPI_Recv(buf, (int)n, MPI_CHAR, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank == peer) {
          MPI_Recv(buf, (int)n, MPI_CHAR, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          MPI_Send(buf, (int)n, MPI_CHAR, 0, 0, MPI_COMM_WORLD);
        }
        if (i >= 0) rtt[i] = MPI_Wtime() - t0;
      }
      if (rank == 0) {
        qsort(rtt, (size_t)iters, sizeof(double), cmp);
        const double med = rtt[iters / 2], lo = rtt[0];
        char pair[64];
        snprintf(pair, sizeof pair, "%s-%s", name, peer_name);
        printf("%-14s %10ld %12.1f %12.1f %12.1f\n", pair, n, med * 1e6, lo * 1e6, n / (med / 2) / 1e6);
        fflush(stdout);
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  free(buf);
  free(rtt);
  MPI_Finalize();
  return 0;
}
