// Validation of predictions against measurements (`moeplan validate`): the
// statistics, the Markdown report and the scatter plot's gnuplot input. Pure:
// the caller runs moeplan-exec, the planner and gnuplot.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "moeplan/v1/plan.pb.h"
#include "moeplan/v1/validation.pb.h"

namespace moeplan::calibration {

// One layer config: what moeplan-exec measured and what the planner predicted,
// for the same schedules (matched by schedule; ops matched by name).
struct ValidationInput {
  std::string name;
  v1::LayerConfig layer;
  std::vector<v1::CandidatePlan> measured;
  std::vector<v1::CandidatePlan> predicted;
};

// Total and per-op errors, selection accuracy and regret. InvalidArgument when
// there are no inputs, a config has no schedule both measured and predicted,
// lists a schedule twice on one side, or a paired measured total is not finite
// and > 0 (or the predicted one not finite).
absl::StatusOr<v1::ValidationSummary> Summarize(const std::vector<ValidationInput>& inputs,
                                                const std::string& profile, int ranks, int hosts);

struct ReportContext {
  std::string command;    // how the measurements were taken (shown verbatim)
  std::string plot_file;  // the PNG's file name, relative to the report; empty: none
  std::string profile_comment;
};
// The Markdown report: summary, per-schedule and per-op error tables, the worst
// configs, selection misses, every config.
std::string RenderMarkdown(const v1::ValidationSummary& s, const ReportContext& ctx);

// The scatter plot (predicted vs measured total, log-log, one point style per
// schedule, the y = x line and +-10 % bands): the data file's contents and a
// gnuplot script that reads `data_file` and writes `png_file`.
std::string PlotData(const v1::ValidationSummary& s);
std::string GnuplotScript(const v1::ValidationSummary& s, const std::string& data_file,
                          const std::string& png_file);

}  // namespace moeplan::calibration
