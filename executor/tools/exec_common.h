// moeplan-exec's command line and what its layer and model runs share: the
// ranks agreeing on errors, the memory limit, and gathering an iteration's
// op times (max over ranks) on rank 0.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "exec_report.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/executor/backends.h"
#include "moeplan/executor/interpreter.h"
#include "moeplan/executor/probe.h"
#include "moeplan/executor/runner.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/layout.h"
#include "moeplan/v1/service.pb.h"

namespace moeplan::exec {

struct Args {
  std::string layer;
  std::string model;            // a whole model instead of a layer
  std::string plan;             // a plan saved by plan-model --format json instead
  std::string layout;           // with --model: a layout spec whose pipeline program runs
  std::string variant = "all";  // with --model or --plan
  std::string schedule = "all";
  std::string backend = "mpi";
  std::string dtype = "auto";
  std::string profile = std::string(calibration::kDefaultProfileName);
  bool profile_given = false;  // --profile on the command line (--plan: else the plan's)
  int iters = 10;
  int warmup = 2;
  uint64_t seed = 1;
  double skew = 0.0;  // Zipf exponent of the gate bias; 0: none
  bool check = false;
  std::string check_against;  // --model --layout --check: the reference layout
  bool json = false;
  bool sequential = false;
  double max_memory_gib = 0.0;  // 0: what the device has free (CPU: shared by this host's ranks)
  double watchdog_s = 300.0;    // a rank with no new op for this long exits (0: off)
  std::string mpi_wait = "spin";  // mpi backend: how ranks wait for collectives
  std::string report_to;        // moeplan-server address: ReportMeasurement per schedule / variant
  std::string tls_ca, token_file;
};

// The CPUs this rank may run on (its affinity), which on a testbed node or
// under a cpuset is fewer than the machine has.
int HostCores();

// What the tool's messages begin with.
inline constexpr std::string_view kProgram = "moeplan-exec";

// --iters, --warmup and --backend.
absl::Status CheckRunFlags(const Args& a);

// The layout of a flag taking plan-model's --layout syntax (--layout,
// --check-against); errors name `flag`.
absl::StatusOr<planner::Layout> LayoutOfFlag(std::string_view flag, std::string_view spec);

// The element type of a run of a config with `bytes_per_element` read from
// `file`: --dtype, or auto (mpi: f32; nccl: the config's size). The mpi
// backend computes in f32 only.
absl::Status ResolveDType(const Args& a, int bytes_per_element, const std::string& file,
                          executor::DType* out);

// --profile and its cost model, for the prediction; an error names --profile.
struct PredictionModel {
  calibration::LoadedProfile profile;
  planner::CostModel cost;
};
absl::StatusOr<PredictionModel> LoadPredictionModel(const Args& a);

// --report-to: a measured op timeline as ReportMeasurement's op durations.
void SetMeasuredOps(const google::protobuf::RepeatedPtrField<v1::OpTiming>& ops,
                    v1::ReportMeasurementRequest* req);
// Sends `reports` (one per measured `noun`: schedule, variant) to --report-to
// against `profile` (name and version set here), for the server's refits
// (docs/service.md); says on stderr how many the server now holds.
absl::Status ReportTo(const Args& a, const v1::ClusterProfile& profile,
                      std::vector<v1::ReportMeasurementRequest> reports, std::string_view noun);

// Every rank learns whether any rank failed; the lowest failing rank prints
// (executor::AgreeOnStatus, a watchdog step).
absl::Status Agree(const absl::Status& local);

// A failure after the ranks agreed to run (inside the plan's collectives):
// other ranks may be waiting in a collective, so the job is aborted
// (executor::AbortJob: "moeplan-exec: rank R: MESSAGE", exit 1).
[[noreturn]] void Abort(const absl::Status& s);

// What one rank's buffers may take: --max-memory-gib, else the GPU's free
// memory, else the host's available memory shared by its ranks (0: no limit).
void SetMemoryLimit(const Args& a, executor::Device& device, executor::RunOptions* opt);

// One timed iteration's op times, max over ranks, and this rank's speed
// probe after it, mean over ranks (collective; MPI_Reduce to rank 0, which
// appends them to `iterations`). `scratch` is reused.
void GatherIteration(int it, const std::vector<executor::OpTime>& ops, double forward_us,
                     double total_us, double probe_gflops, std::vector<double>* scratch,
                     std::vector<IterationTimes>* iterations);

// The speed probe (executor/probe.h) on every rank at once (collective: a
// barrier first); aborts the job on a failure (the ranks are inside their
// timed loop).
double Probe(executor::SpeedProbe& probe);

// The `--json` output or the table, written to stdout; false when the JSON
// could not be made (the error is printed).
bool PrintReport(const google::protobuf::Message& report, bool json, const std::string& table);

int RunLayer(const Args& a);
int RunModel(const Args& a);

}  // namespace moeplan::exec
