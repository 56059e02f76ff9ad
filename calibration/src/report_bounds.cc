// Physical bounds on reported runs (report_bounds.h).
#include "moeplan/calibration/report_bounds.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>

#include "moeplan/calibration/context_fit.h"

namespace moeplan::calibration {

double MinOpUs(const v1::ClusterProfile& p) {
  double alpha = 0.0;
  auto take = [&](double a) {
    if (std::isfinite(a) && a > 0.0) alpha = alpha > 0.0 ? std::min(alpha, a) : a;
  };
  take(p.links().intra().alpha_us());
  take(p.links().inter().alpha_us());
  take(p.gemm().launch_overhead_us());
  take(p.memory().launch_overhead_us());
  for (const v1::MemoryModel* m :
       {&p.kernels().order(), &p.kernels().iorder(), &p.kernels().route(),
        &p.activation().forward(), &p.activation().backward()}) {
    take(m->launch_overhead_us());
  }
  return std::max(kMinOpUs, alpha / 10.0);
}

absl::Status CheckReportedTimes(const v1::ReportMeasurementRequest& r, double min_op_us,
                                const std::map<std::string, std::string>& resources) {
  const double total = r.total_us();
  const double limit = total * (1.0 + kTotalTolerance);
  double compute = 0.0;
  int compute_ops = 0;
  for (int i = 0; i < r.ops_size(); ++i) {
    const v1::MeasuredOp& op = r.ops(i);
    const double d = op.duration_us();
    if (!(d >= min_op_us)) {
      return absl::InvalidArgumentError(fmt::format(
          "ops[{}].duration_us: must be at least {:g} us, a tenth of the profile's shortest "
          "launch or latency term (no kernel or collective completes faster) (got {:g} for '{}')",
          i, min_op_us, d, op.name()));
    }
    if (d > limit) {
      return absl::InvalidArgumentError(fmt::format(
          "ops[{}].duration_us: an op cannot take longer than the run it is part of, total_us "
          "(+{:g} %) (got {:g} us for '{}', total_us {:g})",
          i, kTotalTolerance * 100.0, d, op.name(), total));
    }
    auto it = resources.find(op.name());
    if (it == resources.end()) it = resources.find(std::string(OpBaseName(op.name())));
    if (it != resources.end() && it->second == "compute") {
      compute += d;
      ++compute_ops;
    }
  }
  if (compute > limit) {
    return absl::InvalidArgumentError(fmt::format(
        "ops: the {} ops on the compute stream run one after another, so their durations cannot "
        "add up to more than total_us (+{:g} %) (got {:g} us of ops, total_us {:g})",
        compute_ops, kTotalTolerance * 100.0, compute, total));
  }
  return absl::OkStatus();
}

}  // namespace moeplan::calibration
