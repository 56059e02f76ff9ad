// Replays of measured runs (docs/calibration.md "Replay"): a run's measured
// op durations put on the op graph of the plan that ran, composed by the
// simulator exactly as it composes predictions. The replay's makespan against
// the measured total is the composition's error (which ops overlap, wait and
// contend); the prediction against the replay is the costs' error.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/op_graph.h"
#include "moeplan/planner/types.h"
#include "moeplan/v1/model.pb.h"
#include "moeplan/v1/plan.pb.h"
#include "moeplan/v1/service.pb.h"
#include "moeplan/v1/validation.pb.h"

namespace moeplan::requests {

// One measured op: its name as the plan names it, its duration and, where the
// run recorded it, its start (microseconds from the iteration's start).
struct MeasuredOpTime {
  std::string_view name;
  double duration_us = 0.0;
  double start_us = 0.0;
  bool has_start = false;
};

// From a measured timeline (moeplan-exec's CandidatePlan / VariantPlan ops:
// end - start, with the start) or a reported run (ReportMeasurementRequest).
// The views point into `ops`.
std::vector<MeasuredOpTime> MeasuredTimes(
    const google::protobuf::RepeatedPtrField<v1::OpTiming>& ops);
std::vector<MeasuredOpTime> MeasuredTimes(
    const google::protobuf::RepeatedPtrField<v1::MeasuredOp>& ops);

// At most this many ops are listed in Replay.waits.
inline constexpr int kReplayWaits = 5;

// Replays `measured` on `plan`: every op of the plan that was measured costs
// its measured duration, the others keep their predicted cost
// (Replay.unmeasured_ops); measured ops the plan lacks are counted
// (unplanned_ops) and left out. InvalidArgument when measured_total_us is not
// finite and > 0, an op's duration or start is not finite and >= 0, or an op
// is named twice.
absl::StatusOr<v1::Replay> ReplayOnGraph(const planner::OpGraph& plan,
                                         std::span<const MeasuredOpTime> measured,
                                         double measured_total_us);

// The makespan of `plan` with every compute op's cost multiplied by
// `compute_scale` (communication keeps its cost): the prediction for a
// machine that computes 1 / compute_scale times as fast as the profiled one.
// InvalidArgument unless compute_scale is finite and > 0.
absl::StatusOr<double> ScaledComputeMakespan(const planner::OpGraph& plan, double compute_scale);

// The plan that ran, planned again on `cost`, then replayed.
// A layer's schedule:
absl::StatusOr<v1::Replay> ReplayLayerRun(const planner::LayerConfig& layer,
                                          planner::Schedule schedule,
                                          std::span<const MeasuredOpTime> measured,
                                          double measured_total_us, const planner::CostModel& cost);

// A reported run (ReportMeasurementRequest: a layer's schedule or a model's
// variant) replayed on its plan on `cost`, with the prediction on `cost`:
// response fields replay, predicted_us and cost_error_pct.
absl::Status ReplayReport(const v1::ReportMeasurementRequest& report,
                          const planner::CostModel& cost, v1::ReportMeasurementResponse* out);
// The same on the plan of the run already made (the server's, which planned
// it to check the report): `plan` its op graph, `predicted_us` its makespan.
absl::Status ReplayReport(const v1::ReportMeasurementRequest& report, const planner::OpGraph& plan,
                          double predicted_us, v1::ReportMeasurementResponse* out);

}  // namespace moeplan::requests
