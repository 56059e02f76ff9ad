// Physical bounds on what a job can have measured (ReportMeasurement) and on
// what a refit may fit from it (docs/calibration.md "Bounds on reported
// runs"). One mechanism for the server, which refuses a report that breaks
// them, and for the refit, which skips stored reports that do (reports stored
// before the bounds existed) and keeps its corrections within them. Pure.
#pragma once

#include <map>
#include <string>

#include "absl/status/status.h"
#include "moeplan/v1/profile.pb.h"
#include "moeplan/planner/profile.h"
#include "moeplan/v1/service.pb.h"

namespace moeplan::calibration {

// An in-context correction's scale lies in [kMinContextScale,
// kMaxContextScale], the profile rule (planner/profile.h) a refit must meet.
using planner::kMaxContextScale;
using planner::kMinContextScale;

// The shortest op duration any timer can report (10 ns, a few clock ticks);
// MinOpUs never goes below it.
inline constexpr double kMinOpUs = 0.01;

// How far measured op times may exceed the run's total (timer and rounding
// slack): ops are timed inside the run, so none can take longer than it, nor
// can the ops of the compute stream (which run one after another) add up to more.
inline constexpr double kTotalTolerance = 0.10;

// The shortest duration a run on `profile` can measure for one op, in µs: no
// kernel or collective completes faster than its launch or latency term (α),
// and every op the planner builds costs at least one of them. A tenth of the
// smallest positive α the profile holds (link α, GEMM, memory, kernel and
// activation launch overheads: fits extrapolate α to zero bytes and carry
// their own error), and at least kMinOpUs.
double MinOpUs(const v1::ClusterProfile& profile);

// Checks a report's times: every ops[i].duration_us >= min_op_us and <= the
// total (+kTotalTolerance), and the ops held on the compute resource alone
// (resource "compute" in `resources`, op name -> the planner's resource; a
// name not found is looked up by its OpBaseName) sum to at most the total
// (+kTotalTolerance), per pipeline stage ("s1." in front: stages run on
// different ranks at once, each on a compute stream of its own). InvalidArgument naming the op and
// the total, as `ops[i].duration_us: ...` or `ops: ...`. `total_us` must already be finite and > 0.
absl::Status CheckReportedTimes(const v1::ReportMeasurementRequest& report, double min_op_us,
                                const std::map<std::string, std::string>& resources);

}  // namespace moeplan::calibration
