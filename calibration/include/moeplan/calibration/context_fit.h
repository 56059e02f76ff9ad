// In-context op corrections (profile.proto's OpContext, docs/cost-model.md "In
// context"): how much longer (or shorter) each op of the schedules takes inside
// running layers than the profile's own model of it says, fitted on measured
// layers (`moeplan validate --holdout`). Pure.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "moeplan/calibration/validation.h"
#include "moeplan/v1/profile.pb.h"

namespace moeplan::calibration {

struct OpContextOptions {
  // Instances an (op, resource) needs before it gets a correction.
  int min_samples = 3;
  // A line (offset + scale x) needs this many distinct predicted durations
  // spanning at least `min_span` (max / min); otherwise the fit is a scale
  // alone (offset 0), which extrapolates more safely.
  int line_min_distinct = 4;
  double min_span = 2.0;
  int bootstrap = 200;  // resamples for the scale's confidence interval
  uint64_t seed = 1;
  double tolerance = 0.10;  // for the fit quality's "holds" range
};

// The planner's base name of an op, the key of its in-context correction: a
// pipeline program's stage, chunk and micro-batch ("s1.c0.mb2."), a
// model's block ("b3.") and MoE scope ("moe.") and trailing numeric steps
// (".3") and partition parts (".p1") removed; other dots and digits stay.
// "b3.moe.fwd.saa_dispatch.alltoall.2.p1" -> "fwd.saa_dispatch.alltoall".
std::string_view OpBaseName(std::string_view name);

// An (op base name, resource) FitOpContexts did not correct, and why: too
// few instances, or a fit outside the bounds of report_bounds.h.
struct OpContextRejection {
  std::string op, resource;
  int instances = 0;  // instances it had to fit on
  std::string why;    // "fewer than the 3 a fit needs", "its fit (scale ...) is out of bounds: ..."
};

// For every (op base name, resource) that appears in both the measured and
// the predicted timelines of `inputs` (ops matched by full name within one
// candidate of one config, layers and models alike), fits measured = offset + scale * predicted by
// least squares on relative residuals (offset >= 0, scale within [kMinContextScale,
// kMaxContextScale] of report_bounds.h; a fit outside them is no correction). `predicted` must
// come from the profile the corrections will be added to, without op corrections of its own.
// Ordered by op name, then resource; the groups left uncorrected go to `rejected` (when not
// null) with their reason. InvalidArgument when `inputs` is empty or an option is out of range.
absl::StatusOr<std::vector<v1::OpContext>> FitOpContexts(
    const std::vector<ValidationInput>& inputs, const OpContextOptions& options,
    std::vector<OpContextRejection>* rejected = nullptr);

// What FitOpContexts fits on, gathered input by input: each matched op's
// predicted and measured duration (16 bytes) under its (op base name,
// resource), so that a caller with many runs (a refit) need not hold them all.
class OpContextSamples {
 public:
  // The ops of `in` matched as FitOpContexts matches them; ops without a
  // positive, finite duration on both sides are left out.
  absl::Status Add(const ValidationInput& in);
  int inputs() const { return inputs_; }
  // FitOpContexts on every input added. InvalidArgument when none was, or an
  // option is out of range.
  absl::StatusOr<std::vector<v1::OpContext>> Fit(const OpContextOptions& options,
                                                 std::vector<OpContextRejection>* rejected) const;

 private:
  struct Point {
    double predicted_us, measured_us;
  };
  std::map<std::pair<std::string, std::string>, std::vector<Point>> groups_;
  int inputs_ = 0;
};

// The Markdown table of fitted corrections (op, resource, instances, offset,
// scale with its 95 % interval, R², max error).
std::string RenderOpContexts(const std::vector<v1::OpContext>& ops);

}  // namespace moeplan::calibration
