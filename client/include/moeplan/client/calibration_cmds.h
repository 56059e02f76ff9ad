// `moeplan calibrate` and `moeplan validate` (DESIGN §1): fitting a measured
// profile from moeplan-profile samples, and measuring prediction error by
// running moeplan-exec (under a launcher, mpirun by default) on a grid of
// layer configs.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace moeplan::client {

struct CalibrateArgs {
  std::string samples;  // JSON Lines of moeplan.v1.ProfileSample
  std::string out;      // the profile to write (atomically)
  std::string name;     // default: the stem of `out`
  std::string comment;
  double tolerance_pct = 10.0;  // a fit "holds" where its error is below this
  uint32_t version = 1;         // the profile's version: bump it on every re-calibration
};
// Prints the fit report to stdout and writes the profile.
absl::Status CalibrateCmd(const CalibrateArgs& a);

struct ValidateArgs {
  std::string profile;  // built-in name or file
  std::string layers;   // moeplan.v1.LayerGrid
  int ranks = 0;        // 0: the profile's nodes x gpus_per_node
  // Shell text run before moeplan-exec; {ranks} is replaced.
  std::string launcher = "mpirun -np {ranks}";
  std::string exec;  // moeplan-exec; empty: next to this binary, else PATH
  int iters = 5;
  int warmup = 2;
  std::string out_dir = "validation";
  bool json = false;
};
// Runs every config (every schedule the layout allows), predicts them, and
// writes OUT_DIR/report.md, plot.png (gnuplot), plot.dat, plot.gp, and the
// configs, moeplan-exec reports and logs it ran; prints a summary (or the
// moeplan.v1.ValidationSummary as JSON).
absl::Status ValidateCmd(const ValidateArgs& a);

}  // namespace moeplan::client
