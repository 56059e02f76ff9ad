// Fitting a measured cluster profile (DESIGN §3) from moeplan-profile samples:
// alpha-beta per (collective, group shape) and per link level, the GEMM
// efficiency table, and the memory-bound kernel model. Pure: no I/O except
// ReadSamples.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "moeplan/v1/profile.pb.h"
#include "moeplan/v1/samples.pb.h"

namespace moeplan::calibration {

// Reads a JSON Lines file of moeplan.v1.ProfileSample (blank lines skipped).
// Errors name the path and the 1-based line: "s.jsonl:12: collective.bytes: ...".
absl::StatusOr<std::vector<v1::ProfileSample>> ReadSamples(const std::string& path);
// The same from text already in memory; `source` names it in errors.
absl::StatusOr<std::vector<v1::ProfileSample>> ParseSamples(std::string_view text,
                                                            std::string_view source);

// t(n) = alpha + beta * n fitted by least squares weighted for relative error
// (each point's residual divided by its measured time), with alpha >= 0 and
// beta > 0 enforced (refit through the origin when alpha comes out negative).
struct LineFit {
  double alpha_us = 0.0;
  double beta_us_per_byte = 0.0;
  double r_squared = 0.0;    // of t, unweighted
  double max_rel_err = 0.0;  // max |fit - t| / t over the points
  int points = 0;
  int64_t min_bytes = 0, max_bytes = 0;  // range of n fitted
  // The widest run of consecutive sizes (sorted) whose relative error is
  // <= the tolerance the fit was made with: where the line holds.
  int64_t holds_from_bytes = 0, holds_to_bytes = 0;
};
// `n` and `t` have equal length >= 2 with distinct n. InvalidArgument otherwise.
absl::StatusOr<LineFit> FitLine(const std::vector<double>& n, const std::vector<double>& t,
                                double tolerance);

struct CalibrateOptions {
  std::string name;         // the profile's name: [a-z0-9._-]+
  std::string comment;      // appended to the generated comment
  double tolerance = 0.10;  // relative error under which a fit "holds"
  double min_r_squared = 0.95;
  double gpu_memory_gib = 0;  // 0: unknown, left unset
};

// What one fit is and how well it holds.
struct FitQuality {
  std::string what;  // "allgather 4 ranks / 1 node", "link intra", "gemm", "memory"
  LineFit fit;
  std::vector<std::string> warnings;  // empty: the fit holds over the sampled range
};

struct Calibration {
  v1::ClusterProfile profile;  // source: PROFILE_SOURCE_MEASURED, valid for the planner
  std::vector<FitQuality> fits;
  std::vector<std::string> warnings;  // about the samples as a whole
};

// Fits a profile from the samples of one run (one backend / dtype / node layout;
// mixing runs is InvalidArgument naming the differing field). Samples with
// wrong_elements > 0 are InvalidArgument: a wrong collective is not timed.
absl::StatusOr<Calibration> Calibrate(const std::vector<v1::ProfileSample>& samples,
                                      const CalibrateOptions& options);

// Human-readable fit report: one row per fit (what, alpha, beta, R^2, max rel
// err, sampled range, range where it holds), then the warnings.
std::string RenderFitReport(const Calibration& c);

}  // namespace moeplan::calibration
