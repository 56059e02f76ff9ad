// SAA against its parts (docs/schedules.md), on the executor's MPI backend, under
// mpirun:  mpirun -np 8 ./build/bench/saa_bench [--benchmark_...]
// Ranks form N-rank groups (consecutive, the ESP/MP group) and W = P/N-rank
// AlltoAll groups (strided by N, the EP group), as in S2. Per message size n
// (the AlltoAll's per-rank input, n/W per peer) it times: the AlltoAll alone,
// the AllGather of its result alone, the two one after the other, and SAA
// fusing them. Each iteration's time is the max over ranks (manual time);
// every rank runs the same fixed number of iterations so collectives match.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <cstdlib>
#include <vector>

#include "moeplan/executor/backends.h"
#include "moeplan/executor/mpi_job.h"
#include "moeplan/executor/saa.h"

namespace ex = moeplan::executor;

namespace {

ex::Backend* g_backend = nullptr;
int g_group = 2;  // N, from MOEPLAN_SAA_GROUP

struct Groups {
  std::unique_ptr<ex::Communicator> group, a2a;
};
Groups& GetGroups() {
  static Groups g = [] {
    Groups out;
    const int rank = g_backend->world->rank();
    out.group = *g_backend->world->Split(rank / g_group, rank % g_group);
    out.a2a = *g_backend->world->Split(rank % g_group, rank / g_group);
    return out;
  }();
  return g;
}

// Swallows the reports of ranks other than 0.
class NullReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

enum Mode { kAlltoAll, kAllGather, kSequential, kSaa };

void Bench(benchmark::State& state, Mode mode) {
  Groups& g = GetGroups();
  const int w = g.a2a->size(), n = g.group->size();
  const int64_t bytes = state.range(0);
  const int64_t chunk = std::max<int64_t>(1, bytes / 4 / w);
  std::vector<float> send(static_cast<size_t>(chunk * w), 1.0f), recv(send.size()),
      out(static_cast<size_t>(chunk * w * n));
  ex::SaaArgs args;
  args.device = g_backend->device.get();
  args.a2a = g.a2a.get();
  args.group = g.group.get();
  args.chunk = chunk;
  args.stride = chunk * w;
  args.a2a_name = "saa.alltoall";
  args.group_name = "saa.allgather";
  for (auto _ : state) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    absl::Status s;
    switch (mode) {
      case kAlltoAll:
        s = g.a2a->AlltoAll(send.data(), recv.data(), chunk, ex::DType::kF32);
        break;
      case kAllGather:
        s = g.group->AllGather(recv.data(), out.data(), chunk * w, ex::DType::kF32);
        break;
      case kSequential:
        s = g.a2a->AlltoAll(send.data(), recv.data(), chunk, ex::DType::kF32);
        if (s.ok()) s = g.group->AllGather(recv.data(), out.data(), chunk * w, ex::DType::kF32);
        break;
      case kSaa:
        s = ex::SaaGather(args, send.data(), recv.data(), out.data());
        break;
    }
    double dt = MPI_Wtime() - t0, max_dt = 0.0;
    MPI_Allreduce(&dt, &max_dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      break;
    }
    state.SetIterationTime(max_dt);
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["W"] = w;
  state.counters["N"] = n;
}

void Sizes(benchmark::internal::Benchmark* b) {
  b->RangeMultiplier(8)
      ->Range(16 << 10, 16 << 20)
      ->UseManualTime()
      ->Iterations(20)
      ->Unit(benchmark::kMicrosecond);
}

BENCHMARK_CAPTURE(Bench, alltoall, kAlltoAll)->Apply(Sizes);
BENCHMARK_CAPTURE(Bench, allgather, kAllGather)->Apply(Sizes);
BENCHMARK_CAPTURE(Bench, alltoall_then_allgather, kSequential)->Apply(Sizes);
BENCHMARK_CAPTURE(Bench, saa, kSaa)->Apply(Sizes);

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  if (const char* n = std::getenv("MOEPLAN_SAA_GROUP")) g_group = std::atoi(n);
  const int rank = ex::WorldRank(), size = ex::WorldSize();
  if (g_group < 1 || size % g_group != 0) {
    if (rank == 0) std::fprintf(stderr, "MOEPLAN_SAA_GROUP must divide the %d ranks\n", size);
    MPI_Finalize();
    return 1;
  }
  absl::StatusOr<ex::Backend> b = ex::MakeBackend("mpi");
  if (!b.ok()) ex::AbortJob(1);  // the world's duplication is collective: end every rank
  g_backend = &*b;
  benchmark::Initialize(&argc, argv);
  // Every rank runs the benchmarks (their collectives must match); rank 0 reports.
  if (rank == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    NullReporter null;
    benchmark::RunSpecifiedBenchmarks(&null);
  }
  GetGroups().group.reset();
  GetGroups().a2a.reset();
  b->world.reset();
  MPI_Finalize();
  return 0;
}
