#include "moeplan/requests/replay.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/planner/planner.h"
#include "moeplan/planner/simulator.h"
#include "moeplan/proto/convert.h"

namespace moeplan::requests {

namespace p = ::moeplan::planner;

std::vector<MeasuredOpTime> MeasuredTimes(
    const google::protobuf::RepeatedPtrField<v1::OpTiming>& ops) {
  std::vector<MeasuredOpTime> out;
  out.reserve(static_cast<size_t>(ops.size()));
  for (const v1::OpTiming& op : ops) {
    out.push_back({op.name(), op.end_us() - op.start_us(), op.start_us(), true});
  }
  return out;
}

std::vector<MeasuredOpTime> MeasuredTimes(
    const google::protobuf::RepeatedPtrField<v1::MeasuredOp>& ops) {
  std::vector<MeasuredOpTime> out;
  out.reserve(static_cast<size_t>(ops.size()));
  for (const v1::MeasuredOp& op : ops) {
    out.push_back({op.name(), op.duration_us(), op.start_us(), op.has_start()});
  }
  return out;
}

namespace {

absl::Status CheckMeasured(std::span<const MeasuredOpTime> measured, double total_us,
                           absl::flat_hash_map<std::string_view, int>* index) {
  if (!std::isfinite(total_us) || !(total_us > 0.0)) {
    return absl::InvalidArgumentError(
        Cat("measured total: must be finite and > 0 (got ", total_us, ")"));
  }
  for (size_t i = 0; i < measured.size(); ++i) {
    const MeasuredOpTime& m = measured[i];
    if (!std::isfinite(m.duration_us) || m.duration_us < 0.0) {
      return absl::InvalidArgumentError(Cat("measured op '", m.name,
                                            "': duration must be finite and >= 0 (got ",
                                            m.duration_us, ")"));
    }
    if (m.has_start && (!std::isfinite(m.start_us) || m.start_us < 0.0)) {
      return absl::InvalidArgumentError(
          Cat("measured op '", m.name, "': start must be finite and >= 0 (got ", m.start_us, ")"));
    }
    if (!index->emplace(m.name, static_cast<int>(i)).second) {
      return absl::InvalidArgumentError(Cat("measured op '", m.name, "': named twice"));
    }
  }
  return absl::OkStatus();
}

// Per op of the plan, the measured start minus the latest measured end among
// the ops it waits for in the plan (its dependencies, and the op issued
// before it on each resource it holds, per device: the simulator's rule).
// Ops without a measured start are skipped (NaN).
std::vector<double> UnexplainedWaits(const p::OpGraph& g, std::span<const MeasuredOpTime> measured,
                                     const std::vector<int>& which) {
  std::vector<double> gap(static_cast<size_t>(g.size()), std::nan(""));
  std::vector<p::OpId> last_on;
  const auto end_of = [&](p::OpId u, double* latest) {
    const int m = which[static_cast<size_t>(u)];
    if (m < 0 || !measured[static_cast<size_t>(m)].has_start) return;
    const MeasuredOpTime& t = measured[static_cast<size_t>(m)];
    *latest = std::max(*latest, t.start_us + t.duration_us);
  };
  for (p::OpId v = 0; v < g.size(); ++v) {
    const p::Op& op = g.op(v);
    const size_t base = static_cast<size_t>(op.device) * p::kNumResources;
    if (base + p::kNumResources > last_on.size()) last_on.resize(base + p::kNumResources, p::kNoOp);
    double latest = 0.0;
    for (const p::OpId u : g.deps(v)) end_of(u, &latest);
    for (int r = 0; r < p::kNumResources; ++r) {
      if (!(op.resources & (1u << r))) continue;
      p::OpId& last = last_on[base + static_cast<size_t>(r)];
      if (last != p::kNoOp) end_of(last, &latest);
      last = v;
    }
    const int m = which[static_cast<size_t>(v)];
    if (m >= 0 && measured[static_cast<size_t>(m)].has_start) {
      gap[static_cast<size_t>(v)] = measured[static_cast<size_t>(m)].start_us - latest;
    }
  }
  return gap;
}

}  // namespace

absl::StatusOr<v1::Replay> ReplayOnGraph(const p::OpGraph& plan,
                                         std::span<const MeasuredOpTime> measured,
                                         double measured_total_us) {
  absl::flat_hash_map<std::string_view, int> index;
  MOEPLAN_RETURN_IF_ERROR(CheckMeasured(measured, measured_total_us, &index));
  p::OpGraph g = plan;
  std::vector<int> which(static_cast<size_t>(g.size()), -1);
  std::vector<std::string> names(static_cast<size_t>(g.size()));
  int matched = 0;
  for (p::OpId v = 0; v < g.size(); ++v) {
    names[static_cast<size_t>(v)] = g.op(v).Name();
    const auto it = index.find(names[static_cast<size_t>(v)]);
    if (it == index.end()) continue;
    which[static_cast<size_t>(v)] = it->second;
    g.SetCost(v, measured[static_cast<size_t>(it->second)].duration_us);
    ++matched;
  }
  p::Simulator simulator;
  p::SimResult sim;
  MOEPLAN_RETURN_IF_ERROR(simulator.Schedule(g, &sim, 0, /*bindings=*/false));

  v1::Replay out;
  out.set_measured_us(measured_total_us);
  out.set_replayed_us(sim.makespan_us);
  out.set_composition_error_pct(100.0 * (sim.makespan_us - measured_total_us) / measured_total_us);
  out.set_ops(g.size());
  out.set_unmeasured_ops(g.size() - matched);
  out.set_unplanned_ops(static_cast<int>(measured.size()) - matched);

  const std::vector<double> gap = UnexplainedWaits(g, measured, which);
  std::vector<p::OpId> order;
  double waited = 0.0, early = 0.0;
  for (p::OpId v = 0; v < g.size(); ++v) {
    const double x = gap[static_cast<size_t>(v)];
    if (std::isnan(x)) continue;
    (x > 0.0 ? waited : early) += std::abs(x);
    order.push_back(v);
  }
  out.set_waited_us(waited);
  out.set_early_us(early);
  const size_t keep = std::min(order.size(), static_cast<size_t>(kReplayWaits));
  // Largest |wait| first; issue order among equals.
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(),
                    [&](p::OpId a, p::OpId b) {
                      const double x = std::abs(gap[static_cast<size_t>(a)]);
                      const double y = std::abs(gap[static_cast<size_t>(b)]);
                      return x != y ? x > y : a < b;
                    });
  for (size_t i = 0; i < keep; ++i) {
    const p::OpId v = order[i];
    v1::OpWait* w = out.add_waits();
    w->set_op(names[static_cast<size_t>(v)]);
    w->set_measured_start_us(measured[static_cast<size_t>(which[static_cast<size_t>(v)])].start_us);
    w->set_replayed_start_us(sim.times[static_cast<size_t>(v)].start_us);
    w->set_unexplained_wait_us(gap[static_cast<size_t>(v)]);
  }
  return out;
}

absl::StatusOr<double> ScaledComputeMakespan(const p::OpGraph& plan, double compute_scale) {
  if (!std::isfinite(compute_scale) || !(compute_scale > 0.0)) {
    return absl::InvalidArgumentError(
        Cat("compute_scale: must be finite and > 0 (got ", compute_scale, ")"));
  }
  p::OpGraph g = plan;
  for (p::OpId v = 0; v < g.size(); ++v) {
    if (g.op(v).kind == p::OpKind::kCompute) g.SetCost(v, g.op(v).cost_us * compute_scale);
  }
  p::Simulator simulator;
  p::SimResult sim;
  MOEPLAN_RETURN_IF_ERROR(simulator.Schedule(g, &sim, 0, /*bindings=*/false));
  return sim.makespan_us;
}

namespace {

// The plan of what ran: its graph and predicted makespan.
struct RanPlan {
  p::LayerPlan layer;
  p::ModelPlan model;
  const p::OpGraph* graph = nullptr;
  double predicted_us = 0.0;
};

absl::Status PlanLayerRun(const p::LayerConfig& layer, p::Schedule schedule,
                          const p::CostModel& cost, RanPlan* out) {
  p::LayerPlanner planner(cost);
  const p::Schedule one[] = {schedule};
  MOEPLAN_RETURN_IF_ERROR(planner.Plan(layer, one, &out->layer));
  const p::Candidate* c = out->layer.Find(schedule);
  if (c == nullptr) return absl::InternalError("the plan lacks the schedule it was asked for");
  out->graph = &c->graph();
  out->predicted_us = c->total_us();
  return absl::OkStatus();
}

absl::Status PlanModelRun(const p::ModelConfig& model, const v1::PlanModelRequest& request,
                          std::string_view variant, const p::CostModel& cost, RanPlan* out) {
  if (request.has_search() || request.has_layout()) {
    return absl::InvalidArgumentError(
        "model_plan: a replay plans the variants plan of model.parallel (no search or layout)");
  }
  p::Variant v;
  if (!p::ParseVariant(variant, &v)) {
    return absl::InvalidArgumentError(Cat("variant: '", variant, "' is not a variant"));
  }
  MOEPLAN_ASSIGN_OR_RETURN(p::ModelPlanOptions options,
                           proto::ModelOptionsFromProto(request.options()));
  p::ModelPlanner planner(cost);
  MOEPLAN_RETURN_IF_ERROR(planner.Plan(model, options, &out->model));
  const p::VariantPlan* plan = out->model.Find(v);
  if (plan == nullptr) {
    return absl::InvalidArgumentError(
        Cat("variant: '", variant, "' is not a variant the request plans"));
  }
  out->graph = &plan->graph;
  out->predicted_us = plan->iteration_us();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::Replay> ReplayLayerRun(const p::LayerConfig& layer, p::Schedule schedule,
                                          std::span<const MeasuredOpTime> measured,
                                          double measured_total_us, const p::CostModel& cost) {
  RanPlan ran;
  MOEPLAN_RETURN_IF_ERROR(PlanLayerRun(layer, schedule, cost, &ran));
  return ReplayOnGraph(*ran.graph, measured, measured_total_us);
}

absl::Status ReplayReport(const v1::ReportMeasurementRequest& report, const p::CostModel& cost,
                          v1::ReportMeasurementResponse* out) {
  RanPlan ran;
  if (report.has_model_plan()) {
    absl::StatusOr<p::ModelConfig> model = proto::ModelFromProto(report.model_plan().model());
    if (!model.ok()) {
      return absl::InvalidArgumentError(Cat("model_plan.model.", View(model.status().message())));
    }
    MOEPLAN_RETURN_IF_ERROR(
        PlanModelRun(*model, report.model_plan(), report.variant(), cost, &ran));
  } else {
    absl::StatusOr<p::LayerConfig> layer = proto::LayerFromProto(report.plan().layer());
    if (!layer.ok()) {
      return absl::InvalidArgumentError(Cat("plan.layer.", View(layer.status().message())));
    }
    MOEPLAN_ASSIGN_OR_RETURN(const p::Schedule schedule,
                             proto::ScheduleFromProto(report.schedule()));
    MOEPLAN_RETURN_IF_ERROR(PlanLayerRun(*layer, schedule, cost, &ran));
  }
  return ReplayReport(report, *ran.graph, ran.predicted_us, out);
}

absl::Status ReplayReport(const v1::ReportMeasurementRequest& report, const p::OpGraph& plan,
                          double predicted_us, v1::ReportMeasurementResponse* out) {
  const std::vector<MeasuredOpTime> measured = MeasuredTimes(report.ops());
  MOEPLAN_ASSIGN_OR_RETURN(*out->mutable_replay(),
                           ReplayOnGraph(plan, measured, report.total_us()));
  out->set_predicted_us(predicted_us);
  // A run of nothing but empty ops replays to 0: no cost error to speak of.
  if (const double replayed = out->replay().replayed_us(); replayed > 0.0) {
    out->set_cost_error_pct(100.0 * (predicted_us - replayed) / replayed);
  }
  return absl::OkStatus();
}

}  // namespace moeplan::requests
