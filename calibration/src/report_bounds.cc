// Physical bounds on reported runs (report_bounds.h).
#include "moeplan/calibration/report_bounds.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
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

namespace {

// The pipeline stage an op runs on ("s1." of "s1.c0.mb2.fwd.gate"), empty
// outside pipelines: stages run on different ranks at the same time, each
// with a compute stream of its own.
std::string_view Stage(std::string_view name) {
  if (name.size() < 3 || name[0] != 's') return {};
  size_t i = 1;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') ++i;
  return i > 1 && i < name.size() && name[i] == '.' ? name.substr(0, i + 1) : std::string_view();
}

}  // namespace

absl::Status CheckReportedTimes(const v1::ReportMeasurementRequest& r, double min_op_us,
                                const std::map<std::string, std::string>& resources) {
  const double total = r.total_us();
  const double limit = total * (1.0 + kTotalTolerance);
  struct Stream {
    double us = 0.0;
    int ops = 0;
  };
  std::map<std::string_view, Stream> compute;  // per pipeline stage
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
      Stream& stream = compute[Stage(op.name())];
      stream.us += d;
      ++stream.ops;
    }
  }
  for (const auto& [stage, stream] : compute) {
    if (stream.us > limit) {
      return absl::InvalidArgumentError(fmt::format(
          "ops: the {} ops on the compute stream{} run one after another, so their durations "
          "cannot add up to more than total_us (+{:g} %) (got {:g} us of ops, total_us {:g})",
          stream.ops,
          stage.empty() ? ""
                        : fmt::format(" of pipeline stage {}", stage.substr(0, stage.size() - 1)),
          kTotalTolerance * 100.0, stream.us, total));
    }
  }
  return absl::OkStatus();
}

}  // namespace moeplan::calibration
