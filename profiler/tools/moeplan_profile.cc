// moeplan-profile: measures a cluster for `moeplan calibrate` (docs/architecture.md,
// docs/cost-model.md), under mpirun / srun with one rank per GPU or CPU slot:
//   mpirun -np P moeplan-profile --out samples.jsonl [--quick] [--backend mpi|nccl] ...
// Discovers the node layout (ranks sharing a host), times every collective on
// every group shape the planner uses (all sibling groups at once), SAA and its
// dual, a GEMM grid and the memory-bound kernels, and writes one
// moeplan.v1.ProfileSample per line. Rank 0 shows progress on stderr.
//
// The file is written as samples are measured, to OUT.partial, and renamed to
// OUT when the sweep completes, so an interrupted run keeps what it measured and
// never leaves a truncated OUT.
#include <mpi.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fmt/format.h"
#include "moeplan/base/flags.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/base/watchdog.h"
#include "moeplan/executor/backends.h"
#include "moeplan/executor/mpi_job.h"
#include "moeplan/profiler/profiler.h"
#include "moeplan/profiler/sweep.h"
#include "moeplan/proto/json.h"

namespace moeplan::profiler {
namespace {

namespace ex = executor;

struct Args {
  std::string out;
  bool quick = false;
  std::string backend = "mpi";
  std::string dtype = "auto";
  // Sizes in bytes; the flags take units through CLI11 (1KiB, 16MiB, 2GiB).
  int64_t min_bytes = int64_t{1} << 10;
  int64_t max_bytes = int64_t{256} << 20;
  int size_step = 2;
  int iters = 20;
  int warmup = 3;
  double budget_s = 2.0;
  std::vector<std::string> parts = {"collectives", "alltoallv", "saa", "gemm", "memory"};
  std::vector<double> alltoallv_loads = {2.0, 4.0};
  std::vector<int64_t> gemm_sizes;
  double gemm_max_gflop = 0.0;  // 0: the backend's default
  std::vector<int64_t> memory_tokens;
  double watchdog_s = 600.0;     // a rank whose sample does not finish for this long exits (0: off)
  int64_t max_point_memory = 0;  // 0: auto
  double context_ms = 20.0;      // 0: isolated collectives only
  bool check = false;            // the few points of moeplan profile-check
  int rounds = 1;                // sweeps of every point, each in its own shuffled order
  std::string mpi_wait = "spin";  // how ranks wait for collectives (mpi backend)
};

// The order round `round` visits `n` points in: the sweep's order for a single
// round; with several, a permutation drawn from the round (a pure function, so
// every rank visits the same point at the same time), so a slow drift of the
// machine does not land on one kind of point.
std::vector<size_t> RoundOrder(size_t n, int round, int rounds) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  if (rounds <= 1) return order;
  uint64_t x = 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(round + 1);
  for (size_t i = n; i > 1; --i) {
    x ^= x >> 12;  // xorshift64*
    x ^= x << 25;
    x ^= x >> 27;
    const uint64_t r = x * 0x2545f4914f6cdd1dULL;
    std::swap(order[i - 1], order[static_cast<size_t>(r % i)]);
  }
  return order;
}

constexpr std::string_view kProgram = "moeplan-profile";

int Rank() { return ex::WorldRank(); }

// Every rank learns whether any rank failed; the lowest failing rank explains.
bool AllOk(const absl::Status& local) { return ex::AgreeOnStatus(local, kProgram).ok(); }

[[noreturn]] void Abort(const absl::Status& s, const std::string& partial) {
  ex::PrintRankError(kProgram, s);
  if (Rank() == 0 && !partial.empty()) {
    std::fprintf(stderr, "moeplan-profile: the samples measured so far are in %s\n",
                 partial.c_str());
  }
  std::fflush(stderr);
  ex::AbortJob(1);
}

// The node layout: ranks sharing a host form a node, numbered by their lowest
// rank (executor::DiscoverHosts). Every node must hold the same number of
// ranks (the planner's cluster is nodes x G).
struct Discovered {
  NodeLayout layout;
  int node = 0, local = 0;
  std::vector<std::string> hosts;  // rank 0 only
};

absl::StatusOr<Discovered> Discover() {
  ex::HostLayout h = ex::DiscoverHosts();
  if (h.min_ranks_per_host != h.max_ranks_per_host) {
    return absl::InvalidArgumentError(
        Cat("uneven nodes: between ", h.min_ranks_per_host, " and ", h.max_ranks_per_host,
            " ranks per host; launch the same number of ranks on every node"));
  }
  Discovered d;
  d.node = h.host;
  d.local = h.local_rank;
  d.hosts = std::move(h.host_names);
  d.layout.nodes = h.hosts;
  d.layout.ranks_per_node = h.min_ranks_per_host;
  return d;
}

std::string Timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// A one-line progress bar on a terminal; elsewhere (logs, CI) a line per 10 %.
class Progress {
 public:
  explicit Progress(size_t total) : total_(total), tty_(isatty(2) != 0), start_(Clock::now()) {}
  void Update(size_t done, const std::string& label) {
    const double frac = total_ == 0 ? 1.0 : static_cast<double>(done) / static_cast<double>(total_);
    const double secs = std::chrono::duration<double>(Clock::now() - start_).count();
    if (tty_) {
      constexpr int kWidth = 30;
      const int fill = static_cast<int>(frac * kWidth);
      std::fprintf(stderr, "\r[%s%s] %3.0f%% %zu/%zu %6.0fs %-48.48s",
                   std::string(static_cast<size_t>(fill), '#').c_str(),
                   std::string(static_cast<size_t>(kWidth - fill), '.').c_str(), 100 * frac, done,
                   total_, secs, label.c_str());
      if (done == total_) std::fputc('\n', stderr);
    } else if (static_cast<int>(frac * 10) > last_decile_ || done == total_) {
      last_decile_ = static_cast<int>(frac * 10);
      std::fprintf(stderr, "moeplan-profile: %3.0f%% (%zu/%zu points, %.0f s) %s\n", 100 * frac,
                   done, total_, secs, label.c_str());
    }
    std::fflush(stderr);
  }

 private:
  using Clock = std::chrono::steady_clock;
  size_t total_;
  bool tty_;
  Clock::time_point start_;
  int last_decile_ = 0;
};

int64_t PhysicalMemory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? int64_t{pages} * page : int64_t{0};
}

absl::Status MakeOptions(const Args& a, const NodeLayout& layout, bool gpu, SweepOptions* o,
                         MeasureOptions* m) {
  if (a.check) {
    // moeplan profile-check: a few points, briefly (PlanCheckSweep).
    m->iters = 7;
    m->warmup = 2;
    m->point_budget_s = 0.5;
    m->min_iters = 3;
    o->context_us = 0.0;
    return absl::OkStatus();
  }
  if (a.quick) {
    // CI's round trip: a few sizes, few repetitions, a small GEMM grid.
    o->min_bytes = 4 << 10;
    o->max_bytes = 1 << 20;
    o->size_step = 4;
    o->gemm_sizes = {16, 128, 512};
    o->memory_tokens = {256, 2048};
    m->iters = 5;
    m->warmup = 1;
    m->point_budget_s = 0.25;
  } else {
    o->min_bytes = a.min_bytes;
    o->max_bytes = a.max_bytes;
    o->size_step = a.size_step;
    m->iters = a.iters;
    m->warmup = a.warmup;
    m->point_budget_s = a.budget_s;
    if (gpu) {
      o->gemm_sizes = {16, 64, 256, 1024, 4096, 16384};
      // Past the GPU's L2 (tens of MiB): a layer's order buffers are larger.
      o->memory_tokens = {1024, 4096, 16384, 65536, 131072};
    }
  }
  if (!a.gemm_sizes.empty()) o->gemm_sizes = a.gemm_sizes;
  if (!a.memory_tokens.empty()) o->memory_tokens = a.memory_tokens;
  // A CPU does a few GFLOP/s: cap the grid so a run takes minutes, not hours.
  o->gemm_max_flop = a.gemm_max_gflop > 0 ? a.gemm_max_gflop * 1e9 : (gpu ? 1e15 : 4e9);
  o->context_us = a.context_ms * 1e3;
  if (a.budget_s <= 0) return absl::InvalidArgumentError("--budget: must be > 0 seconds");
  if (a.max_point_memory == 0) {
    // Half of the host's memory shared by its ranks (GPUs: device allocation
    // fails first and says so).
    const int64_t phys = PhysicalMemory();
    o->max_point_bytes = phys > 0 ? phys / 2 / layout.ranks_per_node : o->max_point_bytes;
  } else {
    o->max_point_bytes = a.max_point_memory;
  }
  bool coll = false, uneven = false, saa = false, gemm = false, mem = false;
  for (const std::string& p : a.parts) {
    if (p == "collectives") {
      coll = true;
    } else if (p == "alltoallv") {
      uneven = true;
    } else if (p == "saa") {
      saa = true;
    } else if (p == "gemm") {
      gemm = true;
    } else if (p == "memory") {
      mem = true;
    } else {
      return absl::InvalidArgumentError(
          Cat("--only: unknown part '", p, "' (collectives, alltoallv, saa, gemm, memory)"));
    }
  }
  if (!coll) o->collectives.clear();
  o->alltoallv_loads = uneven ? a.alltoallv_loads : std::vector<double>{};
  o->saa = saa;
  if (!gemm) o->gemm_sizes.clear();
  if (!mem) o->memory_tokens.clear();
  return absl::OkStatus();
}

// The sweep to measure and how to measure each point: the flags' options
// (MakeOptions), the kernels' dtype, and the points.
absl::StatusOr<Sweep> MakeSweep(const Args& a, const NodeLayout& layout, bool gpu,
                                MeasureOptions* measure_options) {
  SweepOptions sweep_options;
  absl::Status st = MakeOptions(a, layout, gpu, &sweep_options, measure_options);
  if (st.ok()) {
    if (a.dtype == "auto") {
      measure_options->kernel_dtype = gpu ? ex::DType::kBF16 : ex::DType::kF32;
    } else if (!ex::ParseDType(a.dtype, &measure_options->kernel_dtype)) {
      st =
          absl::InvalidArgumentError(Cat("--dtype: must be auto, f32 or bf16 (got ", a.dtype, ")"));
    }
  }
  return !st.ok()  ? absl::StatusOr<Sweep>(st)
         : a.check ? absl::StatusOr<Sweep>(PlanCheckSweep(layout))
                   : PlanSweep(layout, sweep_options);
}

// What every sample records of the run (rank 0).
v1::ProfileRun RunRecord(const Args& a, const Discovered& found, const MeasureOptions& m,
                         const ex::Device& device) {
  const NodeLayout& layout = found.layout;
  v1::ProfileRun run;
  run.set_host(found.hosts.empty() ? "" : found.hosts[0]);
  for (const std::string& h : found.hosts) run.add_hosts(h);
  run.set_backend(a.backend);
  run.set_dtype(std::string(ex::DTypeName(m.kernel_dtype)));
  run.set_versions(a.backend == "mpi" ? ex::MpiVersion()
                                      : Cat(ex::MpiVersion(), "; ", ex::CudaVersions()));
  run.set_timestamp(Timestamp());
  run.set_ranks(layout.ranks());
  run.set_nodes(layout.nodes);
  run.set_ranks_per_node(layout.ranks_per_node);
  run.set_moeplan_version(MOEPLAN_VERSION);
  run.set_machine(ex::MachineDescription(device));
  if (a.backend == "mpi") run.set_mpi_wait(a.mpi_wait);
  return run;
}

// Measures every point, round by round, rank 0 appending each sample to
// `out` (`partial` names it); a failure aborts the job. The samples written.
size_t MeasureSweep(const Args& a, const Sweep& sweep, Profiler& profiler,
                    const v1::ProfileRun& run, std::FILE* out, const std::string& partial) {
  const size_t total = sweep.points.size() * static_cast<size_t>(a.rounds);
  Progress progress(total);
  size_t done = 0;
  for (int round = 0; round < a.rounds; ++round) {
    for (size_t index : RoundOrder(sweep.points.size(), round, a.rounds)) {
      const Point& p = sweep.points[index];
      if (Rank() == 0) {
        progress.Update(done, a.rounds > 1
                                  ? Cat("round ", round + 1, "/", a.rounds, ": ", p.Label())
                                  : p.Label());
      }
      absl::StatusOr<v1::ProfileSample> sample = profiler.Measure(p);
      if (!sample.ok())
        Abort(absl::Status(sample.status().code(),
                           Cat(p.Label(), ": ", View(sample.status().message()))),
              partial);
      ++done;
      if (Rank() != 0) continue;
      *sample->mutable_run() = run;
      sample->set_round(round);
      absl::StatusOr<std::string> line =
          proto::ToJson(*sample, {.pretty = false, .always_print_primitive_fields = true});
      if (!line.ok()) Abort(line.status(), partial);
      if (std::fprintf(out, "%s\n", line->c_str()) < 0 || std::fflush(out) != 0) {
        Abort(absl::DataLossError(Cat(partial, ": write failed: ", std::strerror(errno))), partial);
      }
      if (sample->wrong_elements() > 0) {
        std::fprintf(stderr,
                     "\nmoeplan-profile: %s: %lld wrong elements: the collective is broken on this "
                     "cluster\n",
                     p.Label().c_str(), static_cast<long long>(sample->wrong_elements()));
      }
    }
  }
  if (Rank() == 0) progress.Update(done, "done");
  return done;
}

int Run(const Args& a) {
  absl::StatusOr<Discovered> found = Discover();
  if (!AllOk(found.status())) return 1;
  const NodeLayout layout = found->layout;

  absl::StatusOr<ex::Backend> backend =
      ex::MakeBackend(a.backend, *ex::ParseMpiWait(a.mpi_wait));  // the flag admits both
  if (!AllOk(backend.status())) return 1;
  MeasureOptions measure_options;
  absl::StatusOr<Sweep> sweep = MakeSweep(a, layout, backend->device->is_gpu(), &measure_options);
  if (!AllOk(sweep.status())) return 1;
  if (sweep->points.empty()) {
    if (Rank() == 0) std::fprintf(stderr, "moeplan-profile: nothing to measure (see --only)\n");
    return 1;
  }

  // Node-major ranks, whatever order the launcher used (the planner's ranks
  // fill node 0 first).
  absl::StatusOr<std::unique_ptr<ex::Communicator>> world =
      backend->world->Split(0, found->node * layout.ranks_per_node + found->local);
  if (!AllOk(world.status())) return 1;
  absl::StatusOr<std::unique_ptr<Profiler>> profiler =
      Profiler::Create(&*backend, world->get(), layout, measure_options);
  if (!AllOk(profiler.status())) return 1;

  v1::ProfileRun run;
  const std::string partial = a.out + ".partial";
  std::FILE* out = nullptr;
  absl::Status open_status;
  if (Rank() == 0) {
    run = RunRecord(a, *found, measure_options, *backend->device);
    out = std::fopen(partial.c_str(), "w");
    if (out == nullptr)
      open_status =
          absl::PermissionDeniedError(Cat(partial, ": cannot write: ", std::strerror(errno)));
  }
  if (!AllOk(open_status)) return 1;
  if (Rank() == 0) {
    std::fprintf(
        stderr,
        "moeplan-profile: %d ranks on %d node(s) x %d, backend %s, %zu points (%zu left out)\n",
        layout.ranks(), layout.nodes, layout.ranks_per_node, a.backend.c_str(),
        sweep->points.size(), sweep->skipped.size());
    for (const std::string& s : sweep->skipped)
      std::fprintf(stderr, "moeplan-profile: left out %s\n", s.c_str());
  }

  const size_t done = MeasureSweep(a, *sweep, **profiler, run, out, partial);
  if (Rank() == 0) {
    if (std::fclose(out) != 0 || std::rename(partial.c_str(), a.out.c_str()) != 0) {
      std::fprintf(stderr, "moeplan-profile: %s: %s (samples kept in %s)\n", a.out.c_str(),
                   std::strerror(errno), partial.c_str());
      return 1;
    }
    std::fprintf(stderr,
                 "moeplan-profile: wrote %zu samples to %s; next: moeplan calibrate --samples %s "
                 "--out PROFILE.json\n",
                 done, a.out.c_str(), a.out.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace moeplan::profiler

namespace moeplan::profiler {
namespace {

// What is measured: the output, the backend, the sizes, the repetitions and
// the parts.
void AddSweepFlags(CLI::App& app, Args* args) {
  Args& a = *args;
  app.add_option("--out", a.out, "samples file to write (JSON Lines)")
      ->required()
      ->check(flags::NonEmpty());
  app.add_flag("--quick", a.quick,
               "a short sweep for CI: 4 KiB..1 MiB by 4x, 5 repetitions, 3^3 GEMM grid "
               "(ignores the size and repetition flags)");
  app.add_option("--backend", a.backend, "mpi (CPU, host buffers) or nccl (GPU)")
      ->check(flags::NonEmpty())
      ->capture_default_str();
  flags::AddMpiWait(app, &a.mpi_wait);
  app.add_option("--dtype", a.dtype,
                 "element type of the GEMM and memory kernels: auto (mpi: f32, nccl: bf16), f32, "
                 "bf16; collectives always move f32")
      ->check(flags::NonEmpty())
      ->capture_default_str();
  // Sizes: CLI11's AsSizeValue (KiB/MiB/GiB, and KB/MB/GB as powers of 1024).
  const CLI::AsSizeValue size_units(/*kb_is_1000=*/false);
  app.add_option("--min-bytes", a.min_bytes, "smallest message (n of profile.proto), e.g. 1KiB")
      ->transform(size_units)
      ->check(flags::IntInRange(1, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--max-bytes", a.max_bytes, "largest message, e.g. 256MiB")
      ->transform(size_units)
      ->check(flags::IntInRange(1, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--size-step", a.size_step, "multiply the message size by this")
      ->check(flags::IntInRange(2, 1024))
      ->capture_default_str();
  app.add_option("--iters", a.iters, "timed repetitions per point, at most")
      ->check(flags::IntInRange(1, 1000000))
      ->capture_default_str();
  app.add_option("--warmup", a.warmup, "untimed repetitions per point (>= 1; the first is checked)")
      ->check(flags::IntInRange(1, 1000000))
      ->capture_default_str();
  app.add_option("--budget", a.budget_s,
                 "seconds of timed repetitions per point: slow points run fewer repetitions (>= 3)")
      ->check(flags::FiniteAbove(0.0, 3600.0))
      ->capture_default_str();
  app.add_option("--only", a.parts,
                 "parts to measure: collectives, alltoallv (uneven AlltoAll), saa, gemm, memory")
      ->delimiter(',')
      ->check(flags::NonEmpty())
      ->capture_default_str();
  app.add_option("--alltoallv-loads", a.alltoallv_loads,
                 "uneven AlltoAll: the heaviest rank's received bytes over the mean, each > 1 "
                 "(a group of r ranks measures the loads <= r)")
      ->delimiter(',')
      ->check(flags::FiniteAbove(1.0, 1e6))
      ->capture_default_str();
  app.add_option("--gemm-sizes", a.gemm_sizes,
                 "GEMM grid axis (m, n and k), e.g. 16,64,256,1024,4096")
      ->delimiter(',')
      ->check(flags::IntInRange(1, 1 << 20));
  app.add_option("--gemm-max-gflop", a.gemm_max_gflop,
                 "skip GEMMs above this many GFLOP (default: 4 on CPUs, none on GPUs)")
      ->check(flags::FiniteInRange(0.0, 1e9));
  app.add_option("--memory-tokens", a.memory_tokens,
                 "tokens per memory-bound kernel point, of 1024 f32 values each (default: "
                 "256,1024,4096,16384 on CPUs; 1024,4096,16384,65536,131072 on GPUs, past their "
                 "L2 cache)")
      ->delimiter(',')
      ->check(flags::IntInRange(1, 1 << 30));
  app.add_option(
         "--max-point-memory", a.max_point_memory,
         "per-rank buffer memory one point may take; larger points are left out (auto: half the "
         "host's memory over its ranks), e.g. 2GiB; 0: auto")
      ->transform(size_units)
      ->check(flags::IntInRange(0, INT64_MAX));
}

// --check, in context, rounds and the watchdog.
void AddModeFlags(CLI::App& app, Args* args) {
  Args& a = *args;
  app.add_flag("--check", a.check,
               "measure only the few points moeplan profile-check compares with a profile "
               "(GEMMs, memory kernels, each link level, an AlltoAll per group shape; well under "
               "a minute; ignores the size, repetition and --only flags)");
  app.add_option("--context-ms", a.context_ms,
                 "also measure every collective and SAA point in context: after this many ms of "
                 "compute on every rank, timed as moeplan-exec times an op (0: isolated only)")
      ->check(flags::FiniteInRange(0.0, 60000.0))
      ->capture_default_str();
  app.add_option("--rounds", a.rounds,
                 "measure every point this many times, each round in its own shuffled order, so "
                 "slow drifts of the machine spread over all kinds of points; calibrate fits the "
                 "median round and reports how far the fits move from round to round")
      ->check(flags::IntInRange(1, 100))
      ->capture_default_str();
  app.add_option("--watchdog-s", a.watchdog_s,
                 "a rank stuck this long in one sample (a peer died or stalled) prints the sample "
                 "and exits 3, and mpirun stops the job (0: off)")
      ->check(flags::FiniteInRange(0.0, 86400.0))
      ->capture_default_str();
}

void AddFlags(CLI::App& app, Args* a) {
  AddSweepFlags(app, a);
  AddModeFlags(app, a);
}

}  // namespace
}  // namespace moeplan::profiler

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  moeplan::profiler::Args a;
  CLI::App app{
      "Measures this cluster for moeplan calibrate: every collective on every group shape the "
      "planner uses (all sibling groups at once), SAA, a GEMM grid and the memory-bound kernels, "
      "on the executor's own primitives. Launch with mpirun/srun, one rank per GPU or CPU slot. "
      "Writes JSON Lines (moeplan.v1.ProfileSample)."};
  moeplan::profiler::AddFlags(app, &a);
  app.set_version_flag("--version", "moeplan-profile " MOEPLAN_VERSION);
  // One line naming the program, as moeplan and moeplan-server print: what
  // moeplan validate / profile-check quote as the reason a run failed.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return fmt::format("moeplan-profile: error: {} (see --help)\n", e.what());
  });
  int rc = 0;
  try {
    app.parse(argc, argv);
    moeplan::Watchdog::Start("moeplan-profile", moeplan::executor::WorldRank(),
                             std::chrono::milliseconds(static_cast<int64_t>(a.watchdog_s * 1000)));
    rc = moeplan::profiler::Run(a);
    moeplan::Watchdog::Stop();
  } catch (const CLI::ParseError& e) {
    rc = moeplan::executor::WorldRank() == 0 ? app.exit(e) : e.get_exit_code();
  }
  MPI_Finalize();
  return rc;
}
