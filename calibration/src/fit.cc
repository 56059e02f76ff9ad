// Calibrate(): checks the samples, runs one fitter per model (fit_internal.h)
// and makes sure the planner accepts what was fitted; and the fit report.
#include "moeplan/calibration/fit.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string_view>

#include "fit_internal.h"
#include "moeplan/base/format.h"
#include "moeplan/base/status.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/proto/convert.h"

namespace moeplan::calibration {
namespace {

using internal::Bad;

absl::Status CheckOptions(const CalibrateOptions& options) {
  MOEPLAN_RETURN_IF_ERROR(internal::CheckName(options.name));
  if (!(options.tolerance >= 0.0) || !std::isfinite(options.tolerance)) {
    return Bad("tolerance", Cat("must be finite and >= 0 (got ", options.tolerance, ")"));
  }
  if (options.version < 1) return Bad("version", "must be >= 1 (got 0)");
  if (!(options.gpu_memory_gib >= 0.0) || !std::isfinite(options.gpu_memory_gib)) {
    return Bad("gpu_memory_gib", Cat("must be finite and >= 0 (got ", options.gpu_memory_gib, ")"));
  }
  return absl::OkStatus();
}

void SetHeader(const v1::ProfileRun& run, const CalibrateOptions& options,
               v1::ClusterProfile* prof) {
  prof->set_schema_version(1);
  prof->set_name(options.name);
  prof->set_version(options.version);
  prof->set_source(v1::PROFILE_SOURCE_MEASURED);
  prof->set_comment(internal::RunComment(run, options.comment));
  prof->set_nodes(run.nodes());
  prof->set_gpus_per_node(run.ranks_per_node());
  if (options.gpu_memory_gib > 0.0) prof->set_gpu_memory_gib(options.gpu_memory_gib);
  v1::Provenance* where = prof->mutable_provenance();
  if (run.hosts().empty() && !run.host().empty()) {
    where->add_hosts(run.host());
  } else {
    *where->mutable_hosts() = run.hosts();
  }
  where->set_backend(run.backend());
  where->set_dtype(run.dtype());
  where->set_versions(run.versions());
  where->set_measured_at(run.timestamp());
  where->set_machine(run.machine());
  where->set_ranks(run.ranks());
}

}  // namespace

absl::StatusOr<Calibration> Calibrate(const std::vector<v1::ProfileSample>& samples,
                                      const CalibrateOptions& options) {
  MOEPLAN_RETURN_IF_ERROR(CheckOptions(options));
  MOEPLAN_RETURN_IF_ERROR(internal::CheckSamples(samples));
  Calibration out;
  SetHeader(samples.front().run(), options, &out.profile);
  MOEPLAN_RETURN_IF_ERROR(internal::FitCollectives(samples, options, &out));
  MOEPLAN_RETURN_IF_ERROR(internal::FitGemm(samples, &out));
  MOEPLAN_ASSIGN_OR_RETURN(const internal::MemoryFits memory,
                           internal::FitMemory(samples, options.tolerance, &out));
  // The planner must accept what was fitted; the comparisons run on its model.
  MOEPLAN_ASSIGN_OR_RETURN(planner::ClusterProfile converted, proto::ProfileFromProto(out.profile));
  MOEPLAN_ASSIGN_OR_RETURN(const planner::CostModel cost,
                           planner::CostModel::Create(std::move(converted)));
  internal::CompareKernels(samples, cost, memory, options, &out);
  MOEPLAN_RETURN_IF_ERROR(internal::CompareSaa(samples, cost, options.tolerance, &out));
  return out;
}

std::string RenderFitReport(const Calibration& c) {
  const v1::ClusterProfile& p = c.profile;
  std::string out;
  auto line = [&out](std::string_view s) {
    out += s.substr(0, s.find_last_not_of(' ') + 1);  // padded last column: no trailing blanks
    out += '\n';
  };
  line(fmt::format("profile {}: {} node(s) x {} GPU(s)", p.name(), p.nodes(), p.gpus_per_node()));
  auto link = [](const v1::AlphaBeta& ab) {
    return fmt::format("{:.3g} us + {:.4g} GB/s", ab.alpha_us(), 1e-3 / ab.beta_us_per_byte());
  };
  line(fmt::format("links: intra {}, inter {}", link(p.links().intra()), link(p.links().inter())));
  line(fmt::format("gemm: peak {:.4g} TFLOP/s, launch {:.3g} us, grid {}x{}x{}",
                   p.gemm().peak_tflops(), p.gemm().launch_overhead_us(), p.gemm().m_size(),
                   p.gemm().n_size(), p.gemm().k_size()));
  line(fmt::format("memory: {:.4g} GB/s, launch {:.3g} us", p.memory().bandwidth_gbytes_per_s(),
                   p.memory().launch_overhead_us()));
  auto act = [](const v1::MemoryModel& m) {
    return m.bandwidth_gbytes_per_s() > 0.0
               ? fmt::format("{:.4g} GB/s, launch {:.3g} us", m.bandwidth_gbytes_per_s(),
                             m.launch_overhead_us())
               : std::string("the memory model");
  };
  line(fmt::format("activation: forward {}; backward {}", act(p.activation().forward()),
                   act(p.activation().backward())));
  line("");

  size_t what_w = 4;
  for (const FitQuality& q : c.fits) what_w = std::max(what_w, q.what.size());
  line(fmt::format("{:<{}}  {:>9}  {:>10}  {:>9}  {:>6}  {:>9}  {:<24}  {:<24}", "what", what_w,
                   "alpha us", "beta us/B", "GB/s", "R²", "max err %", "sampled range",
                   "holds range"));
  for (const FitQuality& q : c.fits) {
    const LineFit& f = q.fit;
    // The GEMM row's sizes are flops; rows that are not one line have beta 0.
    auto size = [&q](int64_t v) {
      return q.what == "gemm" ? FormatFlops(double(v)) : FormatBytes(double(v));
    };
    const std::string beta =
        f.beta_us_per_byte > 0.0 ? fmt::format("{:.4g}", f.beta_us_per_byte) : "-";
    const std::string gbs =
        f.beta_us_per_byte > 0.0 ? fmt::format("{:.4g}", 1e-3 / f.beta_us_per_byte) : "-";
    const std::string alpha = f.alpha_us > 0.0 || f.beta_us_per_byte > 0.0 || q.what == "gemm"
                                  ? fmt::format("{:.3f}", f.alpha_us)
                                  : "-";
    const std::string sampled = Cat(size(f.min_bytes), " .. ", size(f.max_bytes));
    const std::string holds = f.holds_to_bytes == 0
                                  ? "none"
                                  : Cat(size(f.holds_from_bytes), " .. ", size(f.holds_to_bytes));
    line(fmt::format("{:<{}}  {:>9}  {:>10}  {:>9}  {:>6.3f}  {:>9.1f}  {:<24}  {:<24}", q.what,
                     what_w, alpha, beta, gbs, f.r_squared, f.max_rel_err * 100.0, sampled, holds));
  }
  std::vector<std::string_view> warnings;
  for (const FitQuality& q : c.fits)
    warnings.insert(warnings.end(), q.warnings.begin(), q.warnings.end());
  warnings.insert(warnings.end(), c.warnings.begin(), c.warnings.end());
  line("");
  if (warnings.empty()) {
    line("warnings: none");
  } else {
    line("warnings:");
    for (std::string_view w : warnings) line(Cat("  - ", w));
  }
  return out;
}

}  // namespace moeplan::calibration
