// The `moeplan` commands, one file each (plan_layer_cmd.cc, sweep_cmd.cc,
// profiles_cmd.cc, calibrate_cmd.cc, validate_cmd.cc); main.cc parses the
// command line into these arguments and reports a failed command's status on
// one line. Private to the `moeplan` executable.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/client/planner_client.h"
#include "moeplan/proto/hf_config.h"
#include "moeplan/v1/model.pb.h"

namespace moeplan::client {

struct PlanLayerArgs {
  std::string layer;  // moeplan.v1.LayerConfig
  std::string cluster = std::string(calibration::kDefaultProfileName);
  std::string schedules = "all";
  std::string format = "table";  // table | json
  std::string trace;             // Chrome trace to write; empty: none
  std::string html;              // HTML report to write; empty: none
  bool no_timeline = false;
  ClientOptions server;  // address empty: plan locally
};
// Plans one layer, locally or on a moeplan-server (docs/service.md), and prints
// the ranked candidates as a table or JSON, the same bytes either way; writes
// the Chrome trace when asked. Nothing is written when anything fails.
absl::Status PlanLayerCmd(const PlanLayerArgs& a);

// What a Hugging Face config.json model file does not say (plan-model and
// import-hf): each 0 / false is the flag's absence.
struct HfFlags {
  int seq_length = 0;         // --seq-length; absent: 4096
  int micro_batch_size = 0;   // --micro-batch-size; absent: 1
  int global_batch_size = 0;  // --global-batch-size; absent: unset (micro-batch x dp)
  std::string fp8_format;     // --fp8-format: e4m3 | hybrid (empty: BF16)
  std::string fp8_recipe;     // --fp8-recipe
  bool fp8_param_gather = false;  // --fp8-param-gather
};
// Reads a model file of either kind into `model`: a moeplan.v1.ModelConfig,
// or a Hugging Face config.json (proto::LooksLikeHfConfig) imported with `hf`
// and named for its folder (the file's stem unless it is config.json), its
// keys into `fields` when given. With a native file a given `hf` flag is an
// error naming it. Errors are prefixed with `path`.
absl::Status LoadModelFile(const std::string& path, const HfFlags& hf, v1::ModelConfig* model,
                           std::vector<proto::HfField>* fields = nullptr);

struct ImportHfArgs {
  std::string config;  // a Hugging Face config.json
  HfFlags hf;
  std::string out;  // -o: the ModelConfig to write (atomically); empty: stdout
};
// Prints (or writes) the ModelConfig of a Hugging Face config.json, and on
// stderr one line per key of the file: used (what it became), ignored or
// unknown. Nothing is written when anything fails.
absl::Status ImportHfCmd(const ImportHfArgs& a);

struct PlanModelArgs {
  std::string model;  // moeplan.v1.ModelConfig, or a Hugging Face config.json
  HfFlags hf;         // with a Hugging Face config.json only
  std::string cluster = std::string(calibration::kDefaultProfileName);
  std::string variants = "all";
  std::string schedules = "all";
  std::string alltoall = "all";
  double bucket_mb = 25.0;
  int partition_max_k = 8;
  int partition_groups = 5;
  int partition_max_span = 0;
  std::string format = "table";  // table | json
  std::string trace;             // Chrome trace to write; empty: none
  std::string html;              // HTML report to write; empty: none
  bool timeline = false;         // JSON: include every op
  ClientOptions server;          // address empty: plan locally
  // Layouts (docs/layouts.md): rank every layout, or evaluate one.
  bool search = false;
  int top = 10;
  int gpus = 0;                   // 0: the profile's
  std::string families = "all";   // dpmoe,ppmoe,parm
  std::string pipelines = "all";  // gpipe,1f1b,interleaved
  std::string zero_stages = "all";
  std::string sequence_parallel = "off";  // off, on, both
  std::string a2a_overlap = "off";        // off, on, both
  std::string balanced_pipeline = "off";  // off, on, both
  std::string dispatchers = "alltoall";   // alltoall, deepep, or all
  std::string context_parallel = "1";     // degrees tried, e.g. 1,2,4
  std::string expert_tensor_parallel;     // folded grids' etp tried, e.g. 1; empty: none
  int max_microbatches = 64;
  bool exhaustive = false;
  bool overlap_param_gather = false;  // --search: on every zero 1-2 candidate
  bool tp_comm_overlap = false;       // --search: on every sequence-parallel candidate
  std::string layout;            // "dp=..,tp=..,pp=..,ep=..,esp=..[,microbatches=..,zero=..,...]"
  double gpu_memory_gib = -1.0;  // < 0: the profile's
  double optimizer_bytes = 12.0;
  double grad_bytes = 4.0;
  // The plan's time limit, locally as on a server (--max-plan-seconds there,
  // 60 s by default): a search of a huge model ends in an error, not an
  // afternoon.
  double max_plan_seconds = 60.0;
};
// Plans a whole model (docs/model.md), locally or on a moeplan-server, and
// prints the variants as a table or JSON, the same bytes either way; writes the
// Chrome trace when asked. Nothing is written when anything fails.
absl::Status PlanModelCmd(const PlanModelArgs& a);

struct SweepArgs {
  std::string grid;  // moeplan.v1.LayerGrid
  std::string cluster = std::string(calibration::kDefaultProfileName);
  std::string schedules = "all";
  std::string out;  // the CSV to write (atomically)
  bool skip_invalid = false;
};
// Plans every config of the grid, writes one CSV row per config and prints a
// summary of the choices.
absl::Status SweepCmd(const SweepArgs& a);

// `moeplan profiles list|show|get|put`: the built-in profiles, or with `server`
// (host:port) a moeplan-server's. List prints one line per profile, show (and
// get) one profile (name or file) as JSON; put stores a profile file on a
// server, so it needs `server`.
absl::Status ProfilesListCmd(const ClientOptions& server);
absl::Status ProfilesShowCmd(const std::string& name, const ClientOptions& server);
absl::Status ProfilesPutCmd(const std::string& file, const ClientOptions& server);

// `moeplan calibrate` and `moeplan validate` (docs/calibration.md): fitting a
// measured profile from moeplan-profile samples, and measuring prediction error
// by running moeplan-exec (under a launcher, mpirun by default) on a grid of
// layer configs.

struct CalibrateArgs {
  std::string samples;  // JSON Lines of moeplan.v1.ProfileSample
  std::string out;      // the profile to write (atomically)
  std::string name;     // default: the stem of `out`
  std::string comment;
  double tolerance_pct = 10.0;         // a fit "holds" where its error is below this
  uint32_t version = 1;                // the profile's version: bump it on every re-calibration
  double repeat_tolerance_pct = 20.0;  // rounds of a point further apart are listed
  std::string comm_from;               // built-in name or file: links etc. for one-rank samples
  // Instead of --samples: refit --profile on this server from the
  // measurements jobs reported to it (RefitProfile).
  ClientOptions from_server;
  std::string profile;
  // Instead: the stack calibration on a dataset of published runs
  // (docs/calibration.md "Stack calibration"), one profile per profile its
  // cases name written into out_dir.
  std::string published;
  std::string out_dir;
  bool json = false;
  bool no_holdout = false;
};
// Prints the fit report to stdout and writes the profile (--from-server: the
// server stores the new version; --out also writes it here).
absl::Status CalibrateCmd(const CalibrateArgs& a);
// calibrate --published: fits, writes the profiles and prints the report.
absl::Status CalibratePublishedCmd(const CalibrateArgs& a);

struct ProfileCheckArgs {
  std::string profile;  // built-in name or file
  int ranks = 0;        // 0: the profile's nodes x gpus_per_node
  std::string launcher = "mpirun -np {ranks}";
  std::string profiler;       // moeplan-profile; empty: next to this binary, else PATH
  std::string samples;        // compare these samples instead of measuring
  std::string out_dir;        // where check.jsonl is kept; empty: a temporary directory, removed
  double threshold_pct = 15.0;
};
// Re-measures a few points (moeplan-profile --check under the launcher),
// prints each term's drift from the profile; FailedPrecondition when stale.
absl::Status ProfileCheckCmd(const ProfileCheckArgs& a);

struct ValidateArgs {
  std::string profile;  // built-in name or file
  std::string layers;   // moeplan.v1.LayerGrid, or
  std::string models;   // moeplan.v1.ModelGrid
  int ranks = 0;        // 0: the profile's nodes x gpus_per_node
  // Shell text run before moeplan-exec; {ranks} is replaced.
  std::string launcher = "mpirun -np {ranks}";
  std::string exec;             // moeplan-exec; empty: next to this binary, else PATH
  std::string backend = "mpi";  // moeplan-exec --backend: mpi (CPU) or nccl (GPU)
  int iters = 5;
  int warmup = 2;
  double skew = 0.0;  // moeplan-exec --skew (Zipf exponent of the gate bias)
  // report.md, plot.png and the runs' files; empty: the runs' files in a
  // temporary directory, removed afterwards, and no report file.
  std::string out_dir;
  std::string html;            // HTML report to write too; empty: none
  bool out_dir_given = false;  // --out-dir on the command line (--published writes only then)
  bool json = false;
  double holdout = 0.0;  // fraction of each layout's configs held out; 0: no split
  uint64_t seed = 1;
  std::string from_runs;  // an earlier --out-dir whose exec/ reports are re-predicted
  bool replay = false;    // replay each run's measured op durations on its plan
  std::string mpi_wait;   // moeplan-exec --mpi-wait; empty: as the profile was measured, or spin
  std::string published;  // a dataset of published runs (file or directory) instead
  bool search = false;    // --published: each case's layout search too
  // --published: profile files used in place of the built-ins they name.
  std::vector<std::string> profile_overrides;
};
// Runs every config (every schedule the layout allows; every overlap variant
// of a model), predicts them, and
// writes OUT_DIR/report.md, plot.png (gnuplot), plot.dat, plot.gp, and the
// configs, moeplan-exec reports and logs it ran; prints a summary (or the
// moeplan.v1.ValidationSummary as JSON).
absl::Status ValidateCmd(const ValidateArgs& a);
// --published: every case of the dataset predicted at its layout on its own
// profile (no execution) against the published figure, in model TFLOP/s per
// GPU; a Markdown table and summary (MAPE, p90, max, bias by family and
// profile) or, with --json, moeplan.v1.PublishedReport.
absl::Status ValidatePublishedCmd(const ValidateArgs& a);

}  // namespace moeplan::client
