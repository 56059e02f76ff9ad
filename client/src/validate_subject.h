// What `moeplan validate` validates (validate_cmd.cc runs either kind the same
// way): a grid of layer configs (--layers; validate_layers.cc) or of whole
// models (--models; validate_models.cc). Each kind says how its configs are
// named and written, how moeplan-exec runs one, how its report reads, and how
// the planner predicts it.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/calibration/validation.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/op_graph.h"

namespace moeplan::client {

// One config's outcome: what was measured and predicted, or why it was not.
struct ConfigRun {
  std::optional<calibration::ValidationInput> input;
  std::string skipped;  // without input: the report's line for the config
};

// A moeplan-exec report, read.
struct Measured {
  // The measured side (and, for models, the plans that ran as the predicted
  // side: Predict checks its own plans against them).
  calibration::ValidationInput input;
  int hosts = 0;  // the host count it ran on
};

class ValidationSubject {
 public:
  virtual ~ValidationSubject() = default;
  virtual size_t size() const = 0;
  virtual std::string grid_name() const = 0;
  // The Markdown noun of a config ("layer config", "model").
  virtual std::string_view noun() const = 0;
  // "grid[3] B=4 L=256 ..." / "models[1] mixtral-tiny L=4 ...".
  virtual std::string Name(size_t i) const = 0;
  // Config i as the JSON file moeplan-exec reads.
  virtual absl::StatusOr<std::string> ConfigJson(size_t i) const = 0;
  // moeplan-exec's flags that run config i from `config_file` with every
  // candidate; i = kAnyConfig: the flags of every config, for the report.
  static constexpr size_t kAnyConfig = static_cast<size_t>(-1);
  virtual std::string ExecArgs(size_t i, std::string_view config_file) const = 0;
  // moeplan-exec's JSON report of config i. FailedPrecondition when it ran
  // another config than config i.
  virtual absl::StatusOr<Measured> Parse(size_t i, const std::string& json) const = 0;
  // `in` with the planner's prediction on `profile` (whose cost model is
  // `cost`), or the line that says why the config cannot be predicted. With
  // `replay`, also each measured candidate's replay on the plan that ran
  // (in.replays; requests/replay.h).
  virtual absl::StatusOr<ConfigRun> Predict(calibration::ValidationInput in,
                                            const calibration::LoadedProfile& profile,
                                            const planner::CostModel& cost, bool replay) const = 0;
  // The parallel layout of a config (--holdout splits within each).
  virtual std::string Layout(const calibration::ValidationInput& in) const = 0;
};

// "moeplan validate:   s1 1.2/1.3 ms ... (measured/predicted)" on stderr, one
// entry per candidate both measured and predicted; with replays,
// "s1 1.2/1.3/1.25 ms (measured/predicted/replayed)".
struct CandidateTimes {
  std::string name;
  double measured_us = 0.0, predicted_us = 0.0;
};
void PrintTimes(const std::vector<CandidateTimes>& times, const calibration::ValidationInput& in);

// Reads a moeplan.v1.LayerGrid / moeplan.v1.ModelGrid file; InvalidArgument
// prefixed with `path` when it is malformed.
absl::StatusOr<std::unique_ptr<ValidationSubject>> LayerSubject(const std::string& path);
absl::StatusOr<std::unique_ptr<ValidationSubject>> ModelSubject(const std::string& path);

// validate --replay: the machine drift of `r`'s candidate's run, its median
// speed probe against the profile's reference `reference_gflops`
// (Provenance.probe_gflops), and the prediction on `graph` with every compute
// op's cost scaled by reference / run (requests::ScaledComputeMakespan), into
// `r`. Nothing is set when the run or the profile has no probe.
absl::Status AddDrift(const calibration::ValidationInput& in, double reference_gflops,
                      const planner::OpGraph& graph,
                      calibration::ValidationInput::CandidateReplay* r);

}  // namespace moeplan::client
