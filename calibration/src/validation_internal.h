// Shared by the parts of `moeplan validate`'s library (validation.h):
//   validation_stats.cc   Summarize and the sign test
//   validation_report.cc  the Markdown report
//   validation_plot.cc    the scatter plot's data and gnuplot script
//   context_fit.cc        in-context op corrections
// Private to the calibration library.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "moeplan/calibration/validation.h"
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

// One candidate of a config (a layer's schedule, a model's variant), either
// side, borrowed from the ValidationInput it came from.
struct Timeline {
  std::string candidate;                             // "s1", "lancet"
  v1::Schedule schedule = v1::SCHEDULE_UNSPECIFIED;  // layers
  double total_us = 0.0;
  const google::protobuf::RepeatedPtrField<v1::OpTiming>* ops = nullptr;
};
// The measured (or predicted) candidates of `in`: schedules in enum order,
// variants in the order given. InvalidArgument when one is listed twice.
absl::StatusOr<std::vector<Timeline>> TimelinesOf(const ValidationInput& in, bool measured);
// The timeline of `candidate`, or null.
const Timeline* Find(const std::vector<Timeline>& t, std::string_view candidate);

// "schedule" for layer configs, "variant" for whole models.
inline std::string_view CandidateNoun(bool models) { return models ? "variant" : "schedule"; }

// Every candidate present in any config: schedules in enum order, variants in
// the order they first appear.
std::vector<std::string> CandidatesOf(const v1::ValidationSummary& s);
// The config's point of `candidate`, or null.
const v1::ValidationPoint* PointOf(const v1::ValidationConfig& c, std::string_view candidate);
// Selection is only a question when there was a choice.
inline bool HasChoice(const v1::ValidationConfig& c) { return c.points_size() >= 2; }
bool IsTied(const v1::ValidationConfig& c, std::string_view candidate);

}  // namespace moeplan::calibration::internal
