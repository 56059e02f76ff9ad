// Refits from reported in-job measurements (refit.h).
#include "moeplan/calibration/refit.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/calibration/report_bounds.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/planner/planner.h"
#include "moeplan/proto/convert.h"
#include "moeplan/requests/answer.h"
#include "validation_internal.h"

namespace moeplan::calibration {
namespace {

namespace p = ::moeplan::planner;

// Measured op timelines carry durations only: each op from 0 to its duration
// (ops are matched by name and only their durations are compared).
template <typename Plan>
void SetOps(const v1::ReportMeasurementRequest& r, Plan* plan) {
  for (const v1::MeasuredOp& m : r.ops()) {
    v1::OpTiming* op = plan->add_ops();
    op->set_name(m.name());
    op->set_start_us(0.0);
    op->set_end_us(m.duration_us());
  }
}

// Empties a repeated field and frees its elements (clear_*() keeps them
// allocated for reuse, which a refit holding thousands of runs cannot afford).
template <typename T>
void Release(google::protobuf::RepeatedPtrField<T>* field) {
  google::protobuf::RepeatedPtrField<T>().Swap(field);
}

absl::Status Under(std::string_view prefix, const absl::Status& s) {
  return absl::Status(s.code(), Cat(prefix, View(s.message())));
}

// Plans every reported run on the profile, one at a time, and hands each to
// `fn` whole (its full predicted timeline) before the next is planned.
template <typename Fn>
absl::Status ForEachPrediction(const std::vector<const v1::ReportMeasurementRequest*>& reports,
                               const std::vector<std::string>& names,
                               const v1::ClusterProfile& message, Fn&& fn) {
  MOEPLAN_ASSIGN_OR_RETURN(const p::ClusterProfile profile, proto::ProfileFromProto(message));
  MOEPLAN_ASSIGN_OR_RETURN(const p::CostModel cost, p::CostModel::Create(profile));
  for (size_t i = 0; i < reports.size(); ++i) {
    MOEPLAN_ASSIGN_OR_RETURN(ValidationInput in, ReportedRun(*reports[i], profile, cost, names[i]));
    MOEPLAN_RETURN_IF_ERROR(fn(std::move(in)));
  }
  return absl::OkStatus();
}

// The reported runs' total-time error on one profile, layers and models apart
// (one summary holds one kind).
struct Errors {
  std::vector<ValidationInput> layers, models;
};

absl::StatusOr<Errors> Predict(const std::vector<const v1::ReportMeasurementRequest*>& reports,
                               const std::vector<std::string>& names,
                               const v1::ClusterProfile& message) {
  Errors out;
  MOEPLAN_RETURN_IF_ERROR(ForEachPrediction(reports, names, message, [&](ValidationInput in) {
    // The error rows read totals only.
    for (v1::CandidatePlan& c : in.measured) Release(c.mutable_ops());
    for (v1::CandidatePlan& c : in.predicted) Release(c.mutable_ops());
    for (v1::VariantPlan& v : in.measured_variants) Release(v.mutable_ops());
    for (v1::VariantPlan& v : in.predicted_variants) Release(v.mutable_ops());
    (in.IsModel() ? out.models : out.layers).push_back(std::move(in));
    return absl::OkStatus();
  }));
  return out;
}

// The profile with `ops` as its corrections, each offset raised by `gap`.
v1::ClusterProfile WithOps(const v1::ClusterProfile& base, const std::vector<v1::OpContext>& ops,
                           double gap) {
  v1::ClusterProfile out = base;
  v1::ContextModel* ctx = out.mutable_context();
  ctx->clear_ops();
  for (v1::OpContext c : ops) {
    c.set_offset_us(c.offset_us() + gap);
    *ctx->add_ops() = std::move(c);
  }
  return out;
}

// The time a run spends between its ops (dispatch, a thread waking up, a
// peer not there yet), which op durations do not see: one offset for every
// corrected op, fitted on the runs' totals given the per-op fits. A run's
// total grows by the offset once per corrected op on its critical path, so
// gap = argmin sum(((measured - predicted - gap * n) / measured)^2), gap >= 0,
// refined a few times as the critical path moves.
absl::StatusOr<double> FitGap(const std::vector<const v1::ReportMeasurementRequest*>& reports,
                              const std::vector<std::string>& names, const v1::ClusterProfile& base,
                              const std::vector<v1::OpContext>& ops) {
  std::set<std::pair<std::string, std::string>> corrected;
  for (const v1::OpContext& c : ops) corrected.insert({c.op(), c.resource()});
  double gap = 0.0;
  for (int round = 0; round < 3; ++round) {
    double num = 0.0, den = 0.0;
    MOEPLAN_RETURN_IF_ERROR(ForEachPrediction(
        reports, names, WithOps(base, ops, gap), [&](const ValidationInput& in) -> absl::Status {
          MOEPLAN_ASSIGN_OR_RETURN(const std::vector<internal::Timeline> m,
                                   internal::TimelinesOf(in, true));
          MOEPLAN_ASSIGN_OR_RETURN(const std::vector<internal::Timeline> p,
                                   internal::TimelinesOf(in, false));
          const internal::Timeline* pred = internal::Find(p, m.front().candidate);
          if (pred == nullptr || !(m.front().total_us > 0.0)) return absl::OkStatus();
          double n = 0.0;
          for (const v1::OpTiming& op : *pred->ops) {
            if (op.critical() &&
                corrected.count({std::string(OpBaseName(op.name())), op.resource()})) {
              n += 1.0;
            }
          }
          const double w = 1.0 / (m.front().total_us * m.front().total_us);
          num += w * n * (m.front().total_us - pred->total_us);
          den += w * n * n;
          return absl::OkStatus();
        }));
    if (!(den > 0.0)) break;
    const double step = num / den;
    if (gap + step <= 0.0) {
      gap = 0.0;
      break;
    }
    gap += step;
  }
  return gap;
}

std::string ErrorRow(std::string_view runs, std::string_view version,
                     const std::vector<ValidationInput>& inputs, const v1::ClusterProfile& p) {
  if (inputs.empty()) return "";
  absl::StatusOr<v1::ValidationSummary> s = Summarize(inputs, p.name(), 0, p.nodes());
  if (!s.ok())
    return fmt::format("| {} | {} | – | {} |\n", runs, version, View(s.status().message()));
  return fmt::format("| {} | {} | {} | {:.1f} | {:.1f} | {:.1f} | {:+.1f} |\n", runs, version,
                     s->points(), s->mape_pct(), s->p90_pct(), s->max_pct(), s->mean_signed_pct());
}

}  // namespace

absl::StatusOr<ValidationInput> ReportedRun(const v1::ReportMeasurementRequest& r,
                                            const p::ClusterProfile& profile,
                                            const p::CostModel& cost, std::string name) {
  ValidationInput in;
  in.name = std::move(name);
  if (r.has_model_plan()) {
    absl::StatusOr<p::ModelConfig> model = proto::ModelFromProto(r.model_plan().model());
    if (!model.ok()) return Under("model_plan.model.", model.status());
    v1::PlanModelRequest request = r.model_plan();
    request.set_include_timeline(true);
    p::ModelPlanner planner(cost);
    v1::PlanModelResponse planned;
    if (absl::Status s = requests::AnswerPlanModel(*model, request, planner, profile, &planned);
        !s.ok()) {
      return Under("model_plan.", s);
    }
    const auto it = std::find_if(planned.variants().begin(), planned.variants().end(),
                                 [&](const v1::VariantPlan& v) { return v.name() == r.variant(); });
    if (it == planned.variants().end()) {
      return absl::InvalidArgumentError(
          Cat("variant: '", r.variant(), "' is not a variant the request plans"));
    }
    v1::VariantPlan measured;
    measured.set_name(r.variant());
    measured.set_iteration_us(r.total_us());
    SetOps(r, &measured);
    in.model = r.model_plan().model();
    in.measured_variants.push_back(std::move(measured));
    in.predicted_variants.push_back(*it);
    return in;
  }
  absl::StatusOr<p::LayerConfig> layer = proto::LayerFromProto(r.plan().layer());
  if (!layer.ok()) return Under("plan.layer.", layer.status());
  v1::PlanLayerRequest request = r.plan();
  request.clear_schedules();
  request.add_schedules(r.schedule());
  request.set_include_timeline(true);
  p::LayerPlanner planner(cost);
  v1::PlanLayerResponse planned;
  if (absl::Status s = requests::AnswerPlanLayer(*layer, request, planner, profile, &planned);
      !s.ok()) {
    return Under("plan.", s);
  }
  v1::CandidatePlan measured;
  measured.set_schedule(r.schedule());
  measured.set_total_us(r.total_us());
  SetOps(r, &measured);
  in.layer = r.plan().layer();
  in.measured.push_back(std::move(measured));
  in.predicted.push_back(planned.candidates(0));
  return in;
}

namespace {

// The reported runs that plan on the profile, their measured against their
// predicted op durations gathered for the fit, each with its report and its
// name; the others are skipped with their reason.
struct Reported {
  OpContextSamples samples;
  std::vector<const v1::ReportMeasurementRequest*> used;
  std::vector<std::string> names;
  int layers = 0, models = 0;
};

// The planner's resource of every predicted op of a reported run, by name.
std::map<std::string, std::string> PredictedResources(const ValidationInput& in) {
  std::map<std::string, std::string> out;
  auto add = [&](const auto& ops) {
    for (const v1::OpTiming& op : ops) {
      out.emplace(op.name(), op.resource());
      out.emplace(std::string(OpBaseName(op.name())), op.resource());
    }
  };
  for (const v1::CandidatePlan& c : in.predicted) add(c.ops());
  for (const v1::VariantPlan& v : in.predicted_variants) add(v.ops());
  return out;
}

// The run as a validation input when it plans and its times are within the
// physical bounds (report_bounds.h; the server checks them when a report
// arrives, but a log may hold reports stored before it did).
absl::StatusOr<ValidationInput> UsableRun(const v1::ReportMeasurementRequest& r,
                                          const p::ClusterProfile& profile,
                                          const p::CostModel& cost, double min_op_us,
                                          std::string name) {
  if (!std::isfinite(r.total_us()) || !(r.total_us() > 0.0)) {
    return absl::InvalidArgumentError(
        Cat("total_us: must be finite and > 0 (got ", r.total_us(), ")"));
  }
  MOEPLAN_ASSIGN_OR_RETURN(ValidationInput in, ReportedRun(r, profile, cost, std::move(name)));
  MOEPLAN_RETURN_IF_ERROR(CheckReportedTimes(r, min_op_us, PredictedResources(in)));
  return in;
}

// Runs are planned one at a time and only their op durations kept: a refit's
// memory is its reports, not their plans (a whole model's timeline holds
// thousands of ops). Each report's ops are released once gathered; what is
// planned again later (the time between ops, the error rows) reads each
// report's plan and total.
absl::StatusOr<Reported> ReportedRuns(std::vector<v1::ReportMeasurementRequest>& reports,
                                      const p::ClusterProfile& profile, const p::CostModel& cost,
                                      double min_op_us, std::vector<std::string>* skipped) {
  Reported out;
  for (size_t i = 0; i < reports.size(); ++i) {
    v1::ReportMeasurementRequest& r = reports[i];
    const std::string name =
        r.has_model_plan()
            ? fmt::format("report[{}] {} {}", i, r.model_plan().model().name(), r.variant())
            : fmt::format("report[{}] {} {}", i, r.plan().layer().name(),
                          proto::ScheduleLabel(r.schedule()));
    absl::StatusOr<ValidationInput> in = UsableRun(r, profile, cost, min_op_us, name);
    Release(r.mutable_ops());
    if (!in.ok()) {
      skipped->push_back(Cat("report ", i, ": ", View(in.status().message())));
      continue;
    }
    (in->IsModel() ? out.models : out.layers) += 1;
    MOEPLAN_RETURN_IF_ERROR(out.samples.Add(*in));
    out.used.push_back(&r);
    out.names.push_back(name);
  }
  return out;
}

// The refit's report (markdown): what was fitted on, the reported runs' error
// with the old version and the new, the time between ops and the corrections.
std::string RenderRefit(const v1::ClusterProfile& profile, const RefitResult& out,
                        const Reported& runs, std::string_view source, const Errors& before,
                        const Errors& after) {
  std::string md;
  auto o = std::back_inserter(md);
  fmt::format_to(o, "# Refit of {}: version {} -> {}\n\n", profile.name(), profile.version(),
                 out.profile.version());
  fmt::format_to(o,
                 "In-context op corrections fitted on {} reported runs ({} layer schedules, {} "
                 "model variants) from {}; the profile's own fits are unchanged.{}\n\n",
                 out.used, runs.layers, runs.models, source,
                 out.skipped.empty() ? ""
                                     : fmt::format(" {} reported runs did not plan and were left "
                                                   "out (first: {}).",
                                                   out.skipped.size(), out.skipped[0]));
  md +=
      "Total-time error of the reported runs (in-sample: the runs fitted on) with the old "
      "version and the new:\n\n| runs | version | n | MAPE % | p90 % | max % | mean signed % "
      "|\n|---|---|---:|---:|---:|---:|---:|\n";
  const std::string v_old = Cat("v", profile.version());
  const std::string v_new = Cat("v", out.profile.version());
  md += ErrorRow("layers", v_old, before.layers, profile);
  md += ErrorRow("layers", v_new, after.layers, out.profile);
  md += ErrorRow("models", v_old, before.models, profile);
  md += ErrorRow("models", v_new, after.models, out.profile);
  fmt::format_to(o,
                 "\nBetween ops: the runs' totals hold {:.1f} µs per corrected op on the critical "
                 "path that op durations do not (dispatch, wake-ups, waiting for a peer); it is "
                 "added to every correction's offset.\n",
                 out.gap_us);
  md +=
      "\nCorrections (offsets with the time between ops; scale ± is the half-width of its "
      "bootstrap 95 % interval):\n\n";
  md += RenderOpContexts(out.ops);
  return md;
}

// How many times each op (by base name) was reported.
std::map<std::string, int> ReportedOps(const std::vector<v1::ReportMeasurementRequest>& reports) {
  std::map<std::string, int> reported;
  for (const v1::ReportMeasurementRequest& r : reports) {
    for (const v1::MeasuredOp& op : r.ops()) ++reported[std::string(OpBaseName(op.name()))];
  }
  return reported;
}

// Why no op could be corrected, op by op and truthfully: how many times each
// was reported (`reported`, ReportedOps), how many of those were dropped with
// their reports (or had no positive time), how many were left, and what the
// fit of those said.
absl::Status NothingFitted(const v1::ClusterProfile& profile, size_t reports,
                           std::map<std::string, int> reported, const RefitResult& out,
                           const std::vector<OpContextRejection>& rejected) {
  std::map<std::string, int> kept;  // instances that reached the fit, over resources
  std::vector<const OpContextRejection*> order;
  for (const OpContextRejection& r : rejected) {
    kept[r.op] += r.instances;
    order.push_back(&r);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](const auto* a, const auto* b) { return reported[a->op] > reported[b->op]; });
  std::string why;
  for (size_t i = 0; i < order.size() && i < 3; ++i) {
    const OpContextRejection& r = *order[i];
    const int n = reported[r.op];
    const int elsewhere = kept[r.op] - r.instances;  // the same op on other resources
    why += fmt::format(
        "{}op {} ({}) was reported {} times; {} were dropped, leaving {}{}: {}", i == 0 ? "" : "; ",
        r.op, r.resource, n, std::max(0, n - kept[r.op]), r.instances,
        elsewhere > 0 ? fmt::format(" (and {} on other resources)", elsewhere) : "", r.why);
  }
  if (order.size() > 3) why += fmt::format("; and {} more", order.size() - 3);
  const bool too_few =
      std::any_of(rejected.begin(), rejected.end(),
                  [](const OpContextRejection& r) { return r.why.starts_with("fewer"); });
  return absl::FailedPreconditionError(fmt::format(
      "refit of {}: no op could be corrected from the {} reported runs ({} usable): {}{}; {}",
      profile.name(), reports, reports - out.skipped.size(), why,
      out.skipped.empty() ? ""
                          : fmt::format(" (dropped with {} skipped reports, first: {})",
                                        out.skipped.size(), out.skipped[0]),
      too_few ? "report more runs"
              : "the runs and the profile's own model disagree beyond any correction: check the "
                "reports, or re-measure the profile"));
}

}  // namespace

absl::StatusOr<RefitResult> RefitFromReports(const v1::ClusterProfile& profile,
                                             std::vector<v1::ReportMeasurementRequest> reports,
                                             const OpContextOptions& options,
                                             std::string_view source) {
  RefitResult out;
  // The profile's own model, without corrections: what the new ones correct.
  v1::ClusterProfile base = profile;
  base.mutable_context()->clear_ops();
  base.mutable_context()->clear_ops_fitted_on();
  MOEPLAN_ASSIGN_OR_RETURN(const p::ClusterProfile base_profile, proto::ProfileFromProto(base));
  MOEPLAN_ASSIGN_OR_RETURN(const p::CostModel base_cost, p::CostModel::Create(base_profile));
  // How many times each op was reported (for NothingFitted): counted before
  // the reports' ops are released.
  std::map<std::string, int> reported = ReportedOps(reports);
  MOEPLAN_ASSIGN_OR_RETURN(
      const Reported runs,
      ReportedRuns(reports, base_profile, base_cost, MinOpUs(base), &out.skipped));
  if (runs.samples.inputs() == 0) {
    return absl::FailedPreconditionError(
        Cat("refit of ", profile.name(), ": none of the ", reports.size(),
            " reported runs plans on it within the bounds on measured times",
            out.skipped.empty() ? "" : Cat(" (first: ", out.skipped[0], ")")));
  }
  std::vector<OpContextRejection> rejected;
  MOEPLAN_ASSIGN_OR_RETURN(out.ops, runs.samples.Fit(options, &rejected));
  if (out.ops.empty()) {
    return NothingFitted(profile, reports.size(), std::move(reported), out, rejected);
  }
  out.used = runs.samples.inputs();
  MOEPLAN_ASSIGN_OR_RETURN(out.gap_us, FitGap(runs.used, runs.names, base, out.ops));
  for (v1::OpContext& c : out.ops) c.set_offset_us(c.offset_us() + out.gap_us);
  out.profile = WithOps(profile, out.ops, 0.0);
  out.profile.set_version(profile.version() + 1);
  v1::ContextModel* ctx = out.profile.mutable_context();
  ctx->set_ops_fitted_on(fmt::format(
      "{}: {} reported runs ({} layer schedules, {} model variants); offsets include {:.1f} us "
      "between ops",
      source, out.used, runs.layers, runs.models, out.gap_us));

  MOEPLAN_ASSIGN_OR_RETURN(const Errors before, Predict(runs.used, runs.names, profile));
  MOEPLAN_ASSIGN_OR_RETURN(const Errors after, Predict(runs.used, runs.names, out.profile));
  out.report = RenderRefit(profile, out, runs, source, before, after);
  return out;
}

}  // namespace moeplan::calibration
