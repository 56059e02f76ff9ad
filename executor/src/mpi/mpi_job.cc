// The MPI job around a program: ranks, hosts, agreeing on errors, aborting.
#include "moeplan/executor/mpi_job.h"

#include <mpi.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "moeplan/base/strings.h"

namespace moeplan::executor {
namespace {

bool MpiUp() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

// This host's ranks as a communicator (MPI_COMM_TYPE_SHARED, world order);
// the caller frees it.
MPI_Comm HostComm() {
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  return local;
}

}  // namespace

int WorldRank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int WorldSize() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

int RanksOnThisHost() {
  MPI_Comm local = HostComm();
  int n = 1;
  MPI_Comm_size(local, &n);
  MPI_Comm_free(&local);
  return n;
}

int HostCount() {
  MPI_Comm local = HostComm();
  int local_rank = 0, leaders = 0;
  MPI_Comm_rank(local, &local_rank);
  MPI_Comm_free(&local);
  const int leader = local_rank == 0 ? 1 : 0;
  MPI_Allreduce(&leader, &leaders, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  return leaders;
}

HostLayout DiscoverHosts() {
  HostLayout d;
  MPI_Comm local = HostComm();
  MPI_Comm_rank(local, &d.local_rank);
  MPI_Comm_size(local, &d.ranks_on_host);
  // Each host's lowest rank leads it; the leaders, in world order, number the hosts.
  MPI_Comm leaders;
  MPI_Comm_split(MPI_COMM_WORLD, d.local_rank == 0 ? 0 : MPI_UNDEFINED, WorldRank(), &leaders);
  int hosts = 0;
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  if (leaders != MPI_COMM_NULL) {
    MPI_Comm_rank(leaders, &d.host);
    MPI_Comm_size(leaders, &hosts);
    int len = 0;
    MPI_Get_processor_name(name, &len);
    std::vector<char> all(static_cast<size_t>(hosts) * MPI_MAX_PROCESSOR_NAME);
    MPI_Gather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
               0, leaders);
    if (d.host == 0) {
      for (int i = 0; i < hosts; ++i)
        d.host_names.emplace_back(&all[static_cast<size_t>(i) * MPI_MAX_PROCESSOR_NAME]);
    }
    MPI_Comm_free(&leaders);
  }
  MPI_Bcast(&d.host, 1, MPI_INT, 0, local);
  MPI_Comm_free(&local);
  MPI_Allreduce(MPI_IN_PLACE, &hosts, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  d.hosts = hosts;
  int lo = d.ranks_on_host, hi = d.ranks_on_host;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  d.min_ranks_per_host = lo;
  d.max_ranks_per_host = hi;
  return d;
}

int FirstFailingRank(const absl::Status& local) {
  int bad = local.ok() ? INT_MAX : WorldRank(), first = INT_MAX;
  MPI_Allreduce(&bad, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return first == INT_MAX ? -1 : first;
}

absl::Status AgreeOnStatus(const absl::Status& local, std::string_view program) {
  const int first = FirstFailingRank(local);
  if (first < 0) return absl::OkStatus();
  if (!program.empty() && WorldRank() == first) {
    std::fprintf(stderr, "%s: %s%s\n", std::string(program).c_str(),
                 first == 0 ? "" : Cat("rank ", first, ": ").c_str(),
                 std::string(View(local.message())).c_str());
  }
  if (!local.ok()) return local;
  return absl::AbortedError(Cat("rank ", first, " failed (its error is printed there)"));
}

void PrintRankError(std::string_view program, const absl::Status& s) {
  std::fprintf(stderr, "%s: rank %d: %s\n", std::string(program).c_str(), MpiUp() ? WorldRank() : 0,
               std::string(View(s.message())).c_str());
  std::fflush(stderr);
}

void AbortJob(int code) {
  if (MpiUp()) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

void AbortJob(std::string_view program, const absl::Status& s, int code) {
  PrintRankError(program, s);
  AbortJob(code);
}

}  // namespace moeplan::executor
