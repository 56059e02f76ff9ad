// Fitting a measured cluster profile (docs/cost-model.md) from moeplan-profile samples:
// alpha-beta per (collective, group shape) and per link level, the GEMM
// efficiency table, and the memory-bound kernel model. Pure: no I/O except
// ReadSamples.
#pragma once

#include <cstdint>
#include <optional>
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
// beta > 0 enforced (refit through the origin when alpha comes out negative;
// timings that do not grow with n get beta = 1e-12 us/B, which Calibrate
// warns about).
struct LineFit {
  double alpha_us = 0.0;
  double beta_us_per_byte = 0.0;
  double r_squared = 0.0;    // of t, unweighted
  double max_rel_err = 0.0;  // max |fit - t| / t over the points
  int points = 0;
  int64_t min_bytes = 0, max_bytes = 0;  // range of n fitted
  // The widest run (most points; on a tie the larger sizes) of consecutive
  // sizes (sorted) whose relative error is <= the tolerance the fit was made
  // with: where the line holds. Both 0 when no point is within tolerance.
  int64_t holds_from_bytes = 0, holds_to_bytes = 0;
};
// `n` and `t` have equal length >= 2, all finite and > 0, with distinct n, and
// tolerance >= 0. InvalidArgument otherwise, naming the entry ("t[3]: ...").
absl::StatusOr<LineFit> FitLine(const std::vector<double>& n, const std::vector<double>& t,
                                double tolerance);

struct CalibrateOptions {
  std::string name;         // the profile's name: [a-z0-9._-]+
  std::string comment;      // appended to the generated comment
  uint32_t version = 1;     // >= 1; bumped on every re-calibration of a name
  double tolerance = 0.10;  // relative error under which a fit "holds"
  double min_r_squared = 0.95;
  double gpu_memory_gib = 0;  // 0: unknown, left unset
  // Several rounds: a point whose rounds' medians differ by more than this
  // (max / min - 1) is listed as disagreeing.
  double repeat_tolerance = 0.20;
  // Samples of one rank (a single GPU or CPU slot measures no link): the links,
  // collective fits and in-context terms, and the node layout, are taken from
  // this profile; only GEMM and memory are fitted. The samples then may hold no
  // collective or SAA point.
  std::optional<v1::ClusterProfile> comm_from;
};

// What one fit is and how well it holds. Rows, in order: one per fitted
// (collective, shape) ("allgather 4 ranks / 1 node"; the pair SendRecv rows
// end in "(intra link)" / "(inter link)"), "gemm", "memory", "memory kernel
// <name>" (the shared line on that kernel's samples), "saa a2a 4x2 / gather
// 2x1" (the planner's SAA composition against the fused measurement).
// "gemm" and "memory" rows compare planner::CostModel with the samples.
struct FitQuality {
  std::string what;
  // Rows that are not one line have beta 0: "gemm" (alpha is the launch
  // overhead; sizes are flops, 2mnk) and "saa" (alpha 0).
  LineFit fit;
  std::vector<std::string> warnings;  // empty: the fit holds over the sampled range
};

// Samples of several rounds (moeplan-profile --rounds): how much one fit moves
// when it is made from one round's samples instead of all of them (rows that
// are one line: collectives, links, memory kernels; not gemm or saa). The spread
// is the largest |round's prediction / all rounds' prediction - 1| at the
// smallest and the largest size the row sampled, in percent.
struct FitSpread {
  std::string what;  // a FitQuality row
  int rounds = 0;    // rounds whose own fit had this row
  double alpha_min_us = 0.0, alpha_max_us = 0.0;
  double beta_min = 0.0, beta_max = 0.0;  // us per byte
  double spread_small_pct = 0.0, spread_large_pct = 0.0;
};
// A point whose rounds disagree: max / min of its rounds' medians beyond
// CalibrateOptions::repeat_tolerance.
struct PointSpread {
  std::string point;              // PointLabel
  std::vector<double> median_us;  // per round, in round order
  double spread_pct = 0.0;        // 100 * (max / min - 1)
};

struct Calibration {
  v1::ClusterProfile profile;  // source: PROFILE_SOURCE_MEASURED, valid for the planner
  std::vector<FitQuality> fits;
  // Filled when the samples come from more than one round: the profile is fitted
  // on each point's median round, `spreads` and `disagreeing` say how repeatable
  // it is. `points` counts the points measured in every round.
  int rounds = 1;
  int points = 0;
  double repeat_tolerance = 0.0;  // CalibrateOptions::repeat_tolerance
  std::vector<FitSpread> spreads;
  std::vector<PointSpread> disagreeing;  // worst first
  // About the samples as a whole: groups skipped (one size only), a link level
  // copied from the other, GEMM grid cells filled, a missing launch probe.
  std::vector<std::string> warnings;
};

// Fits a profile from the samples of one run (one backend / dtype / node layout;
// mixing runs is InvalidArgument naming the differing field). Samples with
// wrong_elements > 0 are InvalidArgument: a wrong collective is not timed.
// Also InvalidArgument: no samples, a bad options.name ("name: ..."), no
// SendRecv sweep on {2 ranks, 1 node} (unless one rank per node) or on {2, 2}
// (unless one node: then inter copies intra, with a warning), no
// GEMM besides the 1x1x1 probe, fewer than 2 memory-kernel sizes. Groups of
// one size are skipped with a warning; dual SAA samples are not compared.
// With options.comm_from, samples holding a collective or SAA point are
// InvalidArgument ("comm_from: ..."), and the fit report warns which profile
// the communication terms came from.
// Samples of several rounds (ProfileSample.round): each point enters the fit
// once, as its median round, and every round is also fitted alone for the
// spreads; a round that cannot be fitted alone is a warning.
absl::StatusOr<Calibration> Calibrate(const std::vector<v1::ProfileSample>& samples,
                                      const CalibrateOptions& options);

// Human-readable fit report: one row per fit (what, alpha, beta, R^2, max rel
// err, sampled range, range where it holds), then the warnings.
std::string RenderFitReport(const Calibration& c);

}  // namespace moeplan::calibration
