// Shared by the parts of `moeplan validate`'s library (validation.h):
//   validation_stats.cc   Summarize and the sign test
//   validation_report.cc  the Markdown report
//   validation_plot.cc    the scatter plot's data and gnuplot script
// Private to the calibration library.
#pragma once

#include <string>
#include <vector>

#include "moeplan/proto/convert.h"
#include "moeplan/v1/validation.pb.h"

namespace moeplan::calibration::internal {

// Lower-case like planner::ScheduleName, so reports and plan dumps agree.
using proto::ScheduleLabel;

// Error statistics of signed percentage errors.
struct ErrorStats {
  int count = 0;
  double mape = 0.0;  // mean |error|
  double p90 = 0.0;   // of |error|, linear interpolation
  double max = 0.0;   // of |error|
  double mean_signed = 0.0;
};
ErrorStats StatsOf(const std::vector<double>& signed_pct);

// Schedules present in any config, in enum order.
std::vector<v1::Schedule> SchedulesOf(const v1::ValidationSummary& s);
// The config's point of schedule `s`, or null.
const v1::ValidationPoint* PointOf(const v1::ValidationConfig& c, v1::Schedule s);
// Selection is only a question when there was a choice.
inline bool HasChoice(const v1::ValidationConfig& c) { return c.points_size() >= 2; }
bool IsTied(const v1::ValidationConfig& c, v1::Schedule s);

}  // namespace moeplan::calibration::internal
