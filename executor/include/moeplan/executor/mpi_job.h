// The MPI job around a program: which rank this is, the hosts of the job, the
// ranks agreeing on an error, and ending the whole job. One copy for
// moeplan-exec, moeplan-profile, the PyTorch extension and saa_bench.
//
// Every function here works on MPI_COMM_WORLD and needs MPI initialised (and
// not finalised); AbortJob alone also works without it. "Collective" means every
// rank of the job must call the function, in the same order relative to the
// other collectives, or the job hangs. Errors inside MPI itself are not
// returned: MPI_COMM_WORLD's default handler (MPI_ERRORS_ARE_FATAL) ends the
// job with MPI's own message.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace moeplan::executor {

// This process's rank in MPI_COMM_WORLD (0..WorldSize()-1), and the number of
// ranks of the job. Local: no communication.
int WorldRank();
int WorldSize();

// The ranks of this job on this host (MPI_COMM_TYPE_SHARED), this one
// included; >= 1. Collective.
int RanksOnThisHost();

// The hosts of the job: how many hosts hold at least one rank. Collective.
int HostCount();

// Where the job's ranks sit, host by host. Ranks sharing a host
// (MPI_COMM_TYPE_SHARED) form a host; hosts are numbered 0.. in the order of
// their lowest rank, so rank 0 is on host 0.
struct HostLayout {
  int hosts = 0;          // hosts of the job
  int host = 0;           // this rank's host
  int local_rank = 0;     // this rank's index among its host's ranks (world order)
  int ranks_on_host = 0;  // ranks on this rank's host
  // The fewest and the most ranks any host holds (equal on an even job).
  int min_ranks_per_host = 0;
  int max_ranks_per_host = 0;
  // Rank 0 only (empty elsewhere): each host's MPI_Get_processor_name, by host.
  std::vector<std::string> host_names;
};
// Collective; the same on every rank but local_rank, ranks_on_host, host and
// host_names.
HostLayout DiscoverHosts();

// The lowest rank whose `local` is not OK, or -1 when every rank's is OK, on
// every rank. Collective (one MPI_Allreduce, MPI_MIN).
int FirstFailingRank(const absl::Status& local);

// Every rank learns whether any rank failed. Collective (one MPI_Allreduce).
// Returns OK when every rank's `local` is OK. Otherwise it fails on every rank,
// and all name the first (lowest) failing rank N: a rank that failed gets its
// own `local` back; every other rank gets Aborted "rank N failed (its error is
// printed there)". With `program` non-empty, rank N prints its error once, on
// stderr: "PROGRAM: MESSAGE" on rank 0, "PROGRAM: rank N: MESSAGE" elsewhere;
// with it empty, nothing is printed (the caller reports the error it gets).
absl::Status AgreeOnStatus(const absl::Status& local, std::string_view program = {});

// "PROGRAM: rank R: MESSAGE" on stderr, R this rank, and stderr flushed: a
// rank's error when the ranks cannot agree on it first.
void PrintRankError(std::string_view program, const absl::Status& s);

// Ends every rank of the job with exit code `code` (MPI_Abort), for a failure
// after the ranks agreed to run, when other ranks may be waiting in a
// collective this one will never join. Without MPI up it ends this process
// alone (std::_Exit). Does not return.
[[noreturn]] void AbortJob(int code);
// PrintRankError(program, s), then AbortJob(code).
[[noreturn]] void AbortJob(std::string_view program, const absl::Status& s, int code = 1);

}  // namespace moeplan::executor
