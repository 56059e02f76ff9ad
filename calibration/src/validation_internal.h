// Shared by the parts of `moeplan validate`'s library (validation.h):
//   validation_stats.cc   Summarize and the sign test
//   validation_report.cc  the Markdown report
//   validation_plot.cc    the scatter plot's data and gnuplot script
//   validation_replay.cc  replays and noise floors of the points
//   validation_report_replay.cc  their parts of the report
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

// Replays and noise floors over one summary's points (validation_replay.cc).
struct ReplayTally {
  std::vector<double> composition, cost;  // signed %, replayed points
  std::vector<double> floors;             // noise floors, %, points with one
  int within = 0, within_twice = 0, composition_within = 0;
  std::vector<double> drift, corrected;  // signed %, points with a drift
};
// InvalidArgument when `in` replays a candidate twice or one not in
// `measured`.
absl::Status CheckReplays(const ValidationInput& in, const std::vector<Timeline>& measured);
// Sets the point's replay and cost error (when `in` replayed its candidate),
// its noise floor (when its candidate has kMinNoiseSamples iteration totals)
// and within_noise, from the point's error_pct.
absl::Status AddReplayAndNoise(const ValidationInput& in, v1::ValidationPoint* pt, ReplayTally* t);
void FinishReplayAndNoise(const ReplayTally& t, v1::ValidationSummary* s);

// The report's parts of them (validation_report_replay.cc): the summary
// table's rows, the point's noise cell ("4.2 (within)", "–"), and the
// replay section (nothing without replays).
void NoiseAndReplayRows(const v1::ValidationSummary& s, std::string* md);
std::string NoiseCell(const v1::ValidationPoint& p);
void ReplaySection(const v1::ValidationSummary& s, std::string* md);
// A Markdown table cell: '|' escaped, newlines as spaces.
std::string Cell(std::string_view text);

}  // namespace moeplan::calibration::internal
