// moeplan-exec's report: measured timelines (median over iterations of the max
// over ranks) as CandidatePlans, and the human-readable table.
#pragma once

#include <string>
#include <vector>

#include "moeplan/executor/runner.h"
#include "moeplan/v1/exec.pb.h"
#include "moeplan/v1/plan.pb.h"

namespace moeplan::exec {

// One iteration on rank 0 after the max over ranks: per op start and end, then
// forward end and total.
struct IterationTimes {
  std::vector<double> start_us, end_us;
  double forward_us = 0.0, total_us = 0.0;
  double probe_gflops = 0.0;  // the speed probe after it, mean over ranks
};

// Median over iterations; op names, phases and kinds from `ops` (rank 0's last
// iteration, same sequence on every iteration). Op metadata (resource, term,
// bytes) is copied from `predicted` where an op of the same name exists.
v1::CandidatePlan MeasuredCandidate(v1::Schedule schedule, const std::vector<executor::OpTime>& ops,
                                    const std::vector<IterationTimes>& iterations,
                                    const v1::CandidatePlan* predicted);

// Op names in `a` missing from `b` (for the measured/predicted cross-check).
std::vector<std::string> MissingOps(const v1::CandidatePlan& a, const v1::CandidatePlan& b);

std::string RenderTable(const v1::ExecReport& report);

}  // namespace moeplan::exec
