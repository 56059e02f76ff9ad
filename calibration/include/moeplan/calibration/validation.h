// Validation of predictions against measurements (`moeplan validate`): the
// statistics, the Markdown report and the scatter plot's gnuplot input. Pure:
// the caller runs moeplan-exec, the planner and gnuplot.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "moeplan/v1/exec.pb.h"
#include "moeplan/v1/model.pb.h"
#include "moeplan/v1/plan.pb.h"
#include "moeplan/v1/validation.pb.h"

namespace moeplan::calibration {

// One config: what moeplan-exec measured and what the planner predicted, for
// the same candidates. A layer config's candidates are its schedules
// (`measured` / `predicted`, matched by schedule); a whole model's are its
// overlap variants (`measured_variants` / `predicted_variants`, matched by
// name). A config has one kind or the other, and so have all the configs of
// one summary. Ops are matched by name.
struct ValidationInput {
  std::string name;
  v1::LayerConfig layer;             // layers
  v1::ModelConfig model;             // models (a layout's: the model as each stage ran it)
  std::optional<v1::Layout> layout;  // models run as a pipelined layout's program
  std::vector<v1::CandidatePlan> measured;
  std::vector<v1::CandidatePlan> predicted;
  std::vector<v1::VariantPlan> measured_variants;
  std::vector<v1::VariantPlan> predicted_variants;
  // Every timed iteration's measured total per candidate (ExecReport /
  // ExecModelReport .iterations) and whether entry i of every candidate was
  // taken in the same round (.interleaved): what decides ties for best.
  // Optional.
  std::vector<v1::ScheduleIterations> iterations;
  std::vector<v1::VariantIterations> variant_iterations;
  bool paired = false;
  // validate --replay: a candidate's measured op durations replayed on the
  // plan that ran (requests/replay.h), by candidate name ("s1", "lancet").
  struct CandidateReplay {
    std::string candidate;
    v1::Replay replay;
    // With speed probes in the run and in the profile: the machine drift
    // during the candidate's iterations, 100 * (run probe / profile probe -
    // 1), and the prediction with its compute corrected for it
    // (ValidationPoint.drift_*).
    bool has_drift = false;
    double drift_pct = 0.0;
    double drift_corrected_us = 0.0;
  };
  std::vector<CandidateReplay> replays;
  // How the run's ranks waited (moeplan-exec --mpi-wait; empty: not
  // reported) and rank 0's host's cores (0: not reported).
  std::string mpi_wait;
  int host_cores = 0;

  bool IsModel() const {
    return !measured_variants.empty() || !predicted_variants.empty() || !variant_iterations.empty();
  }
};

// The exact one-sided sign test on paired samples: were `a` and `b` equally
// fast, the probability of at least as many pairs with a[i] > b[i] as seen.
// Equal pairs are dropped; 1 when none is left. Sizes must match.
double SignTestP(absl::Span<const double> a, absl::Span<const double> b);

// The noise floor of one candidate's measured totals (one per timed
// iteration, in the order taken): the interquartile range and the drift
// between the two halves, in percent of the median. Needs
// kMinNoiseSamples totals, finite and > 0 (InvalidArgument otherwise).
inline constexpr int kMinNoiseSamples = 4;
absl::StatusOr<v1::MeasuredNoise> NoiseOf(absl::Span<const double> totals);

// Total and per-op errors, selection accuracy (strict, decisive, and counting
// ties) and regret; with replays, the composition and cost errors; with at
// least kMinNoiseSamples iteration totals of a candidate, its point's noise
// floor. InvalidArgument when there are no inputs, layer and model configs
// are mixed, a config has no candidate both measured and predicted, lists a
// candidate twice on one side (or replays one twice, or replays one it did
// not measure), a paired measured total is not finite and > 0 (or the
// predicted one not finite), or iterations differ in count (when paired) or
// hold a value not finite and > 0.
absl::StatusOr<v1::ValidationSummary> Summarize(const std::vector<ValidationInput>& inputs,
                                                const std::string& profile, int ranks, int hosts);

struct ReportContext {
  std::string command;  // how the measurements were taken (shown verbatim)
  // Not measured by this run: the folder of the earlier run whose moeplan-exec
  // reports were re-predicted (validate --from-runs); `command` is then empty.
  std::string from_runs;
  std::string plot_file;  // the PNG's file name, relative to the report; empty: none
  std::string profile_comment;
  std::string provenance;  // where and when the profile was measured (ProvenanceLine)
  std::string section;     // Markdown placed before the summary (e.g. the --holdout split)
};
// The Markdown report: summary, per-candidate (schedule or variant) and per-op
// error tables, the worst configs, selection misses, every config.
std::string RenderMarkdown(const v1::ValidationSummary& s, const ReportContext& ctx);

// A log-log scatter plot of predicted (y) against measured or published (x)
// figures with the y = x line and +-10 % bands, one point style per series:
// the data file's contents (a block per series: name, x, y, quoted label)
// and a gnuplot script that reads `data_file` and writes `png_file`.
struct ScatterPoint {
  double x = 0.0, y = 0.0;
  std::string label;
};
struct ScatterSeries {
  std::string name;
  std::vector<ScatterPoint> points;
};
struct Scatter {
  std::string comment;      // the data file's first line
  std::string series_noun;  // "schedule", "family", ...
  std::string x_column, y_column, label_column;
  std::string script_noun;  // the script's first line: "<noun> scatter plot"
  std::string title, x_label, y_label;
  std::vector<ScatterSeries> series;
};
std::string ScatterData(const Scatter& p);
std::string ScatterScript(const Scatter& p, const std::string& data_file,
                          const std::string& png_file);

// The validation's scatter plot (predicted vs measured total, one series per
// candidate).
Scatter ValidationScatter(const v1::ValidationSummary& s);
std::string PlotData(const v1::ValidationSummary& s);
std::string GnuplotScript(const v1::ValidationSummary& s, const std::string& data_file,
                          const std::string& png_file);

// The median speed probe over `candidate`'s timed iterations
// (ScheduleIterations / VariantIterations .probe_gflops), GFLOP/s; 0 when
// they have none (runs before the probe) or one is not finite and > 0.
double RunProbeGflops(const ValidationInput& in, std::string_view candidate);

}  // namespace moeplan::calibration
