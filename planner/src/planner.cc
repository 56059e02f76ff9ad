#include "moeplan/planner/planner.h"

#include <algorithm>
#include <cmath>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/schedules.h"
#include "moeplan/planner/validate.h"

namespace moeplan::planner {
namespace {

// Deltas below this are rounding noise, not a reason.
constexpr double kNegligibleUs = 1e-6;

void Decide(LayerPlan* plan) {
  Decision& d = plan->decision;
  d = Decision{};
  const Candidate& best = plan->candidates.front();
  d.best = best.schedule;
  if (const Candidate* def = plan->Find(Schedule::kDefault); def && best.total_us() > 0.0) {
    d.speedup_over_default = def->total_us() / best.total_us();
  }
  if (plan->candidates.size() < 2) {
    d.summary = fmt::format("{} is the only schedule planned: {:.1f} us per iteration",
                            ScheduleName(best.schedule), best.total_us());
    return;
  }
  const Candidate& second = plan->candidates[1];
  d.has_runner_up = true;
  d.runner_up = second.schedule;
  d.margin_us = second.total_us() - best.total_us();
  d.margin_pct = second.total_us() > 0.0 ? 100.0 * d.margin_us / second.total_us() : 0.0;
  for (int t = 0; t < kNumTerms; ++t) {
    const double delta = best.sim.critical_term_us[t] - second.sim.critical_term_us[t];
    if (std::abs(delta) > kNegligibleUs) d.deciding_terms.push_back({static_cast<Term>(t), delta});
  }
  std::sort(d.deciding_terms.begin(), d.deciding_terms.end(),
            [](const TermDelta& a, const TermDelta& b) {
              return std::abs(a.delta_us) > std::abs(b.delta_us);
            });
  std::string terms;
  const size_t shown = std::min<size_t>(3, d.deciding_terms.size());
  for (size_t i = 0; i < shown; ++i) {
    terms += Cat(i ? ", " : "", TermName(d.deciding_terms[i].term), " ",
                 fmt::format("{:+.1f} us", d.deciding_terms[i].delta_us));
  }
  d.summary = fmt::format(
      "{} is fastest, {:.1f} us ({:.1f}%) ahead of {}; critical-path terms vs {}: {}",
      ScheduleName(best.schedule), d.margin_us, d.margin_pct, ScheduleName(second.schedule),
      ScheduleName(second.schedule), terms.empty() ? "identical" : terms);
  if (d.speedup_over_default > 0.0 && best.schedule != Schedule::kDefault) {
    d.summary += fmt::format("; {:.2f}x over default", d.speedup_over_default);
  }
}

}  // namespace

const Candidate* LayerPlan::Find(Schedule s) const {
  for (const Candidate& c : candidates) {
    if (c.schedule == s) return &c;
  }
  return nullptr;
}

absl::Status LayerPlanner::Plan(const LayerConfig& layer, std::span<const Schedule> schedules,
                                LayerPlan* out) {
  if (schedules.empty()) schedules = kAllSchedules;
  const ClusterShape& cluster = cost_.profile().shape;
  MOEPLAN_RETURN_IF_ERROR(ValidateLayer(layer, cluster));
  bool seen[kNumSchedules] = {};
  for (Schedule s : schedules) {
    const int i = static_cast<int>(s);
    if (i < 0 || i >= kNumSchedules)
      return absl::InvalidArgumentError("schedules: unknown schedule");
    if (seen[i]) {
      return absl::InvalidArgumentError(
          Cat("schedules: each schedule may be listed once (got ", ScheduleName(s), " twice)"));
    }
    seen[i] = true;
    MOEPLAN_RETURN_IF_ERROR(ValidateForSchedule(layer, s));
  }
  // At mp = 1 (then esp = 1 too) S1 and S2 run the default's collectives: no
  // MP group to split the tokens over, and an SAA of one ESP rank is the
  // AlltoAll. Asked for with the default, they are not ranked against it.
  static constexpr Schedule kDefaultOnly[] = {Schedule::kDefault};
  const bool collapsed = layer.parallel.mp == 1 && seen[static_cast<int>(Schedule::kDefault)] &&
                         schedules.size() > 1;
  if (collapsed) schedules = kDefaultOnly;

  LayerContext ctx;
  ctx.layer = &layer;
  ctx.cost = &cost_;
  ctx.topo = MakeTopology(layer.parallel, cluster);
  out->derived = Derive(layer);
  out->candidates.resize(schedules.size());
  for (size_t i = 0; i < schedules.size(); ++i) {
    Candidate& c = out->candidates[i];
    c.schedule = schedules[i];
    c.op_graph.Clear();
    MOEPLAN_RETURN_IF_ERROR(BuildSchedule(c.schedule, ctx, &c.op_graph));
    MOEPLAN_RETURN_IF_ERROR(simulator_.Run(c.op_graph, &c.sim));
  }
  std::stable_sort(
      out->candidates.begin(), out->candidates.end(),
      [](const Candidate& a, const Candidate& b) { return a.total_us() < b.total_us(); });
  Decide(out);
  if (collapsed) {
    out->decision.summary = fmt::format(
        "default is the only schedule at mp = 1: s1 and s2 run the same collectives there (no MP "
        "group to split the tokens over), so they are not planned apart: {:.1f} us per iteration",
        out->candidates.front().total_us());
  }
  if (const double dropped = DroppedShare(layer); dropped > 0.0) {
    out->decision.summary += fmt::format(
        "; padded at capacity_factor {:g}, token_skew {:g} drops {:.0f}% of the heaviest rank's "
        "tokens (dropless = true plans the irregular exchange instead)",
        layer.capacity_factor, layer.token_skew, 100.0 * dropped);
  }
  return absl::OkStatus();
}

absl::StatusOr<LayerPlan> PlanLayer(const LayerConfig& layer, const CostModel& cost,
                                    std::span<const Schedule> schedules) {
  LayerPlanner planner(cost);
  LayerPlan plan;
  MOEPLAN_RETURN_IF_ERROR(planner.Plan(layer, schedules, &plan));
  return plan;
}

}  // namespace moeplan::planner
