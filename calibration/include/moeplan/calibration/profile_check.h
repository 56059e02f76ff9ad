// Stale-profile detection (`moeplan profile-check`, docs/calibration.md "Stale
// profiles"): a handful of points re-measured now (moeplan-profile --check)
// against what a profile predicts for them, term by term. Pure: the CLI runs
// the profiler.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "moeplan/v1/profile.pb.h"
#include "moeplan/v1/samples.pb.h"

namespace moeplan::calibration {

// One term of the cost model and how far the machine has moved from it:
// drift = measured / predicted - 1 (the median over the term's points; > 0:
// the machine is slower now than the profile says).
struct DriftRow {
  std::string term;  // "gemm", "memory", "activation", "intra link", "alltoall 4 ranks / 2 nodes"
  int points = 0;
  double drift_pct = 0.0;
  double worst_pct = 0.0;   // the point farthest from the profile
  std::string worst_point;  // which one
  // The term's noise: the median over its points of how far a point's rounds
  // disagreed at calibration (ReferencePoint.spread_pct; 0 for a profile of
  // one round). The check's own rounds do not widen it: their median already
  // discounts one disturbed round, and a noisy check must not hide drift.
  double noise_pct = 0.0;
  double band_pct = 0.0;  // max(threshold, noise_pct): drift within it is not stale
  bool stale = false;     // |drift_pct| > band_pct
};

struct ProfileCheckResult {
  std::vector<DriftRow> rows;
  bool stale = false;              // any row stale
  std::vector<std::string> notes;  // other machine, other time, ...
};

// The fewest valid points (finite median > 0, no wrong elements, a kind the
// check compares) a check judges on: a GEMM's or a link's three sizes. With
// fewer, CheckProfile is InvalidArgument naming how many there were.
inline constexpr int kMinCheckPoints = 3;

// Compares `samples` (one moeplan-profile run) with the profile's isolated
// model (its in-context and op corrections aside: the check measures ops
// alone). A term is stale when its drift exceeds both the threshold and the
// term's own round-to-round noise: a machine whose points move 30 % between
// rounds an hour apart cannot tell a 25 % drift from noise. FailedPrecondition when the samples ran
// on another node layout than the profile describes; InvalidArgument for no samples, fewer than
// kMinCheckPoints valid points, or a threshold <= 0.
absl::StatusOr<ProfileCheckResult> CheckProfile(const v1::ClusterProfile& profile,
                                                const std::vector<v1::ProfileSample>& samples,
                                                double threshold_pct);

// The table (term, points, drift, worst point) and the verdict, as text.
std::string RenderProfileCheck(const v1::ClusterProfile& profile, const ProfileCheckResult& r,
                               double threshold_pct);

}  // namespace moeplan::calibration
