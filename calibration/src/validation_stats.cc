// `moeplan validate`'s statistics: total-time and per-op errors, selection
// accuracy, regret and ties for best.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <map>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "absl/status/status.h"
#include "moeplan/base/stats.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/calibration/validation.h"
#include "validation_internal.h"

namespace moeplan::calibration {
namespace internal {

ErrorStats StatsOf(const std::vector<double>& signed_pct) {
  ErrorStats st;
  st.count = static_cast<int>(signed_pct.size());
  if (signed_pct.empty()) return st;
  std::vector<double> abs_pct;
  abs_pct.reserve(signed_pct.size());
  double sum_abs = 0.0;
  double sum_signed = 0.0;
  for (double e : signed_pct) {
    abs_pct.push_back(std::abs(e));
    sum_abs += std::abs(e);
    sum_signed += e;
    st.max = std::max(st.max, std::abs(e));
  }
  st.mape = sum_abs / st.count;
  st.mean_signed = sum_signed / st.count;
  st.p90 = Percentile(std::move(abs_pct), 90.0);
  return st;
}

std::vector<v1::Schedule> SchedulesOf(const v1::ValidationSummary& s) {
  std::vector<v1::Schedule> out;
  for (const v1::ValidationConfig& c : s.results()) {
    for (const v1::ValidationPoint& p : c.points()) {
      if (std::find(out.begin(), out.end(), p.schedule()) == out.end()) {
        out.push_back(p.schedule());
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

const v1::ValidationPoint* PointOf(const v1::ValidationConfig& c, v1::Schedule s) {
  for (const v1::ValidationPoint& p : c.points()) {
    if (p.schedule() == s) return &p;
  }
  return nullptr;
}

bool IsTied(const v1::ValidationConfig& c, v1::Schedule s) {
  return std::find(c.measured_tied().begin(), c.measured_tied().end(), s) !=
         c.measured_tied().end();
}

}  // namespace internal

using internal::ErrorStats;
using internal::HasChoice;
using internal::IsTied;
using internal::ScheduleLabel;
using internal::StatsOf;

namespace {

// Schedules measured closer than this are within run-to-run noise on a shared
// machine: the selection statistics also report the configs beyond it.
constexpr double kDecisiveMarginPct = 5.0;

// Ties for best: a schedule is slower than the measured best only if the
// one-sided sign test rejects equal speed at this level, on at least this many
// paired iterations (with fewer, even all of them slower has p >= 1/16).
constexpr double kTieAlpha = 0.05;
constexpr int kMinPairedIterations = 5;

double ErrorPct(double predicted, double measured) {
  return 100.0 * (predicted - measured) / measured;
}

// "fwd.saa_dispatch.alltoall.3" -> "fwd.saa_dispatch.alltoall": the planner
// names pipeline steps base + "." + step (op_graph.cc), and a step on its own
// is too short and too numerous to be worth a row, so steps aggregate.
std::string_view StripStep(std::string_view name) {
  const std::size_t dot = name.rfind('.');
  if (dot == std::string_view::npos || dot + 1 == name.size()) return name;
  for (std::size_t i = dot + 1; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return name;
  }
  return name.substr(0, dot);
}

// Candidates keyed by schedule (ordered, so points come out in schedule
// order); a schedule twice on one side is ambiguous, so it is rejected.
absl::StatusOr<std::map<int, const v1::CandidatePlan*>> BySchedule(
    const std::vector<v1::CandidatePlan>& plans, std::string_view config, std::string_view side) {
  std::map<int, const v1::CandidatePlan*> out;
  for (const v1::CandidatePlan& p : plans) {
    if (!out.emplace(static_cast<int>(p.schedule()), &p).second) {
      return absl::InvalidArgumentError(Cat("config '", config, "': schedule ",
                                            ScheduleLabel(p.schedule()), " ", side, " twice"));
    }
  }
  return out;
}

// The config's paired per-iteration totals by schedule, checked; empty when
// they are not paired or too few to test.
absl::StatusOr<std::map<int, const v1::ScheduleIterations*>> PairedIterations(
    const ValidationInput& in) {
  std::map<int, const v1::ScheduleIterations*> out;
  if (!in.paired) return out;
  int n = -1;
  for (const v1::ScheduleIterations& it : in.iterations) {
    const std::string where =
        Cat("config '", in.name, "', schedule ", ScheduleLabel(it.schedule()));
    if (!out.emplace(static_cast<int>(it.schedule()), &it).second) {
      return absl::InvalidArgumentError(Cat(where, ": iterations listed twice"));
    }
    if (n >= 0 && it.total_us_size() != n) {
      return absl::InvalidArgumentError(Cat(where, ": ", it.total_us_size(),
                                            " paired iterations where another schedule has ", n));
    }
    n = it.total_us_size();
    for (double t : it.total_us()) {
      if (!(t > 0.0) || !std::isfinite(t)) {
        return absl::InvalidArgumentError(
            Cat(where, ": iteration totals must be finite and > 0 (got ", t, ")"));
      }
    }
  }
  if (n < kMinPairedIterations) out.clear();
  return out;
}

absl::Span<const double> Values(const v1::ScheduleIterations& it) {
  return {it.total_us().data(), static_cast<std::size_t>(it.total_us_size())};
}

struct OpAccumulator {
  std::vector<double> errors;
  double measured_us = 0.0;
};

// Matches ops by name between the two timelines of one config and schedule.
void AccumulateOps(const v1::CandidatePlan& measured, const v1::CandidatePlan& predicted,
                   std::map<std::string, OpAccumulator, std::less<>>* groups, int* unmatched) {
  std::unordered_map<std::string_view, const v1::OpTiming*> by_name;
  for (const v1::OpTiming& op : predicted.ops()) by_name.emplace(op.name(), &op);
  for (const v1::OpTiming& m : measured.ops()) {
    const double meas = m.end_us() - m.start_us();
    // Ops the executor did not time (or timed as empty) carry no error to speak of.
    if (!(meas > 0.0)) continue;
    auto it = by_name.find(m.name());
    if (it == by_name.end()) {
      ++*unmatched;
      continue;
    }
    const double pred = it->second->end_us() - it->second->start_us();
    const std::string_view group = StripStep(m.name());
    auto g = groups->find(group);
    if (g == groups->end()) g = groups->emplace(std::string(group), OpAccumulator{}).first;
    g->second.errors.push_back(ErrorPct(pred, meas));
    g->second.measured_us += meas;
  }
}

}  // namespace

double SignTestP(absl::Span<const double> a, absl::Span<const double> b) {
  int n = 0, k = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (a[i] == b[i]) continue;
    ++n;
    k += a[i] > b[i];
  }
  // P(X >= k), X ~ Binomial(n, 1/2), summed in log space (no overflow at large n).
  double p = 0.0;
  for (int j = k; j <= n; ++j) {
    p += std::exp(std::lgamma(n + 1.0) - std::lgamma(j + 1.0) - std::lgamma(n - j + 1.0) -
                  n * std::log(2.0));
  }
  return std::min(1.0, p);
}

namespace {

// Running totals over the configs of one summary.
struct Tally {
  std::vector<double> errors;  // every point's signed error, %
  double worst = -1.0;         // largest |error| so far
  std::map<std::string, OpAccumulator, std::less<>> op_groups;
  int unmatched = 0;
  int choice_configs = 0, hits = 0;
  double regret_sum = 0.0, miss_regret_sum = 0.0, max_regret = 0.0;
  int decisive = 0, decisive_hits = 0;
  int paired_configs = 0, tied_configs = 0, tied_hits = 0;
};

using PlansBySchedule = std::map<int, const v1::CandidatePlan*>;

// One point per schedule both measured and predicted, with the measured and
// predicted best of the config.
absl::Status AddPoints(const ValidationInput& in, const PlansBySchedule& measured,
                       const PlansBySchedule& predicted, v1::ValidationConfig* c, Tally* t,
                       v1::ValidationSummary* s) {
  const v1::CandidatePlan* meas_best = nullptr;
  const v1::CandidatePlan* pred_best = nullptr;
  for (const auto& [schedule, m] : measured) {
    auto it = predicted.find(schedule);
    if (it == predicted.end()) continue;
    const v1::CandidatePlan* p = it->second;
    const std::string where =
        Cat("config '", in.name, "', schedule ", ScheduleLabel(m->schedule()));
    if (!(m->total_us() > 0.0) || !std::isfinite(m->total_us())) {
      return absl::InvalidArgumentError(
          Cat(where, ": measured total_us must be finite and > 0 (got ", m->total_us(), ")"));
    }
    if (!std::isfinite(p->total_us())) {
      return absl::InvalidArgumentError(
          Cat(where, ": predicted total_us must be finite (got ", p->total_us(), ")"));
    }
    v1::ValidationPoint* pt = c->add_points();
    pt->set_schedule(m->schedule());
    pt->set_measured_us(m->total_us());
    pt->set_predicted_us(p->total_us());
    pt->set_error_pct(ErrorPct(p->total_us(), m->total_us()));
    t->errors.push_back(pt->error_pct());
    if (std::abs(pt->error_pct()) > t->worst) {
      t->worst = std::abs(pt->error_pct());
      s->set_worst_config(in.name);
      s->set_worst_schedule(pt->schedule());
    }
    // Strict '<': ties go to the earlier schedule on both sides alike.
    if (meas_best == nullptr || m->total_us() < meas_best->total_us()) meas_best = m;
    if (pred_best == nullptr || p->total_us() < pred_best->total_us()) pred_best = p;
    AccumulateOps(*m, *p, &t->op_groups, &t->unmatched);
  }
  if (c->points().empty()) {
    return absl::InvalidArgumentError(
        Cat("config '", in.name, "': no schedule is both measured and predicted"));
  }
  c->set_measured_best(meas_best->schedule());
  c->set_predicted_best(pred_best->schedule());
  return absl::OkStatus();
}

// Regret, and whether the pick was right (strictly, and where the measured
// best leads by the decisive margin).
void ScoreSelection(const PlansBySchedule& measured, v1::ValidationConfig* c, Tally* t) {
  const double best_us = measured.at(static_cast<int>(c->measured_best()))->total_us();
  // The price of trusting the planner: what its pick measured, against the best.
  const double regret =
      ErrorPct(measured.at(static_cast<int>(c->predicted_best()))->total_us(), best_us);
  c->set_regret_pct(regret);
  if (!HasChoice(*c)) return;
  ++t->choice_configs;
  t->regret_sum += regret;
  t->max_regret = std::max(t->max_regret, regret);
  if (c->measured_best() == c->predicted_best()) {
    ++t->hits;
  } else {
    t->miss_regret_sum += regret;
  }
  double runner_up = std::numeric_limits<double>::infinity();
  for (const v1::ValidationPoint& pt : c->points()) {
    if (pt.schedule() != c->measured_best()) runner_up = std::min(runner_up, pt.measured_us());
  }
  if (ErrorPct(runner_up, best_us) >= kDecisiveMarginPct) {
    ++t->decisive;
    t->decisive_hits += c->measured_best() == c->predicted_best();
  }
}

// The schedules tied with the measured best, when every point's iterations
// are paired.
absl::Status MarkTies(const ValidationInput& in, v1::ValidationConfig* c, Tally* t) {
  MOEPLAN_ASSIGN_OR_RETURN(const auto iters, PairedIterations(in));
  auto best_iters = iters.find(static_cast<int>(c->measured_best()));
  bool all_paired = best_iters != iters.end();
  for (const v1::ValidationPoint& pt : c->points()) {
    all_paired = all_paired && iters.count(static_cast<int>(pt.schedule())) > 0;
  }
  if (!all_paired) return absl::OkStatus();
  const absl::Span<const double> best = Values(*best_iters->second);
  for (const v1::ValidationPoint& pt : c->points()) {
    if (pt.schedule() == c->measured_best() ||
        SignTestP(Values(*iters.at(static_cast<int>(pt.schedule()))), best) >= kTieAlpha) {
      c->add_measured_tied(pt.schedule());
    }
  }
  if (HasChoice(*c)) {
    ++t->paired_configs;
    t->tied_configs += c->measured_tied_size() >= 2;
    t->tied_hits += IsTied(*c, c->predicted_best());
  }
  return absl::OkStatus();
}

// The summary's totals from the tally.
void Finish(const Tally& t, v1::ValidationSummary* s) {
  s->set_tie_alpha(kTieAlpha);
  s->set_min_paired_iterations(kMinPairedIterations);
  s->set_paired_configs(t.paired_configs);
  s->set_tied_configs(t.tied_configs);
  if (t.paired_configs > 0) {
    s->set_selection_accuracy_tied_pct(100.0 * t.tied_hits / t.paired_configs);
  }
  s->set_decisive_margin_pct(kDecisiveMarginPct);
  s->set_decisive_configs(t.decisive);
  if (t.decisive > 0) {
    s->set_selection_accuracy_decisive_pct(100.0 * t.decisive_hits / t.decisive);
  }

  const ErrorStats total = StatsOf(t.errors);
  s->set_points(total.count);
  s->set_mape_pct(total.mape);
  s->set_p90_pct(total.p90);
  s->set_max_pct(total.max);
  s->set_mean_signed_pct(total.mean_signed);

  if (t.choice_configs > 0) {
    s->set_selection_accuracy_pct(100.0 * t.hits / t.choice_configs);
    s->set_mean_regret_pct(t.regret_sum / t.choice_configs);
    s->set_max_regret_pct(t.max_regret);
    const int misses = t.choice_configs - t.hits;
    if (misses > 0) s->set_mean_regret_when_wrong_pct(t.miss_regret_sum / misses);
  }

  double op_total_us = 0.0;
  for (const auto& [name, g] : t.op_groups) op_total_us += g.measured_us;
  for (const auto& [name, g] : t.op_groups) {
    const ErrorStats st = StatsOf(g.errors);
    v1::OpError* e = s->add_ops();
    e->set_op(name);
    e->set_count(st.count);
    e->set_mape_pct(st.mape);
    e->set_p90_pct(st.p90);
    e->set_mean_signed_pct(st.mean_signed);
    e->set_measured_share_pct(100.0 * g.measured_us / op_total_us);
  }
  // Stable over the name-ordered map: equal shares stay alphabetical.
  std::stable_sort(s->mutable_ops()->begin(), s->mutable_ops()->end(),
                   [](const v1::OpError& a, const v1::OpError& b) {
                     return a.measured_share_pct() > b.measured_share_pct();
                   });
  s->set_unmatched_ops(t.unmatched);
}

}  // namespace

absl::StatusOr<v1::ValidationSummary> Summarize(const std::vector<ValidationInput>& inputs,
                                                const std::string& profile, int ranks, int hosts) {
  if (inputs.empty()) return absl::InvalidArgumentError("validation: no layer configs");
  v1::ValidationSummary s;
  s.set_profile(profile);
  s.set_ranks(ranks);
  s.set_hosts(hosts);
  s.set_configs(static_cast<int>(inputs.size()));
  Tally t;
  for (const ValidationInput& in : inputs) {
    MOEPLAN_ASSIGN_OR_RETURN(const PlansBySchedule measured,
                             BySchedule(in.measured, in.name, "measured"));
    MOEPLAN_ASSIGN_OR_RETURN(const PlansBySchedule predicted,
                             BySchedule(in.predicted, in.name, "predicted"));
    v1::ValidationConfig* c = s.add_results();
    c->set_name(in.name);
    *c->mutable_layer() = in.layer;
    MOEPLAN_RETURN_IF_ERROR(AddPoints(in, measured, predicted, c, &t, &s));
    ScoreSelection(measured, c, &t);
    MOEPLAN_RETURN_IF_ERROR(MarkTies(in, c, &t));
  }
  Finish(t, &s);
  return s;
}

}  // namespace moeplan::calibration
