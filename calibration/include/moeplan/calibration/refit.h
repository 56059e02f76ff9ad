// Refits of a profile from what jobs measured (ReportMeasurement,
// docs/calibration.md "Refits"): every reported run is planned again on the
// profile, its measured op durations set against the predicted ones, and
// in-context op corrections (context_fit.h) fitted on them; the profile's own
// fits, from its profiler samples, stay as they are. Pure: moeplan-server
// stores the reports and the new version.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "moeplan/calibration/context_fit.h"
#include "moeplan/calibration/validation.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/v1/profile.pb.h"
#include "moeplan/v1/service.pb.h"
#include "moeplan/v1/validation.pb.h"

namespace moeplan::calibration {

// One reported run as a validation input named `name`: its measured op
// durations and total against the same plan predicted on `profile` (with
// whatever corrections it holds; `cost` is its cost model). A layer's
// schedule or a model's variant, as reported. InvalidArgument naming the
// report's field when it does not plan.
absl::StatusOr<ValidationInput> ReportedRun(const v1::ReportMeasurementRequest& report,
                                            const planner::ClusterProfile& profile,
                                            const planner::CostModel& cost, std::string name);

struct RefitResult {
  v1::ClusterProfile profile;      // version + 1, context.ops the new corrections
  std::vector<v1::OpContext> ops;  // offsets include gap_us
  // The time between ops per corrected op on the critical path, fitted on the
  // runs' totals (>= 0): what op durations do not see.
  double gap_us = 0.0;
  int used = 0;                      // reports fitted on
  std::vector<std::string> skipped;  // "report i: why", for reports that did not plan
  std::string report;                // Markdown: sources, error before and after, corrections
};

// Fits corrections on `reports` against `profile` without its own
// corrections (per op on the durations, then one offset for the time between
// ops on the totals), and returns `profile` with them (replacing its old ones) as
// the next version; `source` says where the reports came from (for
// context.ops_fitted_on). FailedPrecondition when no report plans or no op
// has enough instances to fit. Memory: the reports (moved in; each one's ops
// are released once gathered) and 16 bytes per matched op; runs are planned
// one at a time.
absl::StatusOr<RefitResult> RefitFromReports(const v1::ClusterProfile& profile,
                                             std::vector<v1::ReportMeasurementRequest> reports,
                                             const OpContextOptions& options,
                                             std::string_view source);

}  // namespace moeplan::calibration
