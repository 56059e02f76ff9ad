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
#include "moeplan/calibration/context_fit.h"
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

absl::StatusOr<std::vector<Timeline>> TimelinesOf(const ValidationInput& in, bool measured) {
  std::vector<Timeline> out;
  const std::string_view side = measured ? "measured" : "predicted";
  auto add = [&](Timeline t) -> absl::Status {
    if (Find(out, t.candidate) != nullptr) {
      return absl::InvalidArgumentError(Cat("config '", in.name, "': ", CandidateNoun(in.IsModel()),
                                            " ", t.candidate, " ", side, " twice"));
    }
    out.push_back(std::move(t));
    return absl::OkStatus();
  };
  if (in.IsModel()) {
    if (!in.measured.empty() || !in.predicted.empty() || !in.iterations.empty()) {
      return absl::InvalidArgumentError(
          Cat("config '", in.name, "': has both schedules (a layer) and variants (a model)"));
    }
    for (const v1::VariantPlan& v : measured ? in.measured_variants : in.predicted_variants) {
      MOEPLAN_RETURN_IF_ERROR(
          add({v.name(), v1::SCHEDULE_UNSPECIFIED, v.iteration_us(), &v.ops()}));
    }
    return out;
  }
  for (const v1::CandidatePlan& p : measured ? in.measured : in.predicted) {
    MOEPLAN_RETURN_IF_ERROR(
        add({std::string(ScheduleLabel(p.schedule())), p.schedule(), p.total_us(), &p.ops()}));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Timeline& a, const Timeline& b) { return a.schedule < b.schedule; });
  return out;
}

const Timeline* Find(const std::vector<Timeline>& t, std::string_view candidate) {
  for (const Timeline& x : t) {
    if (x.candidate == candidate) return &x;
  }
  return nullptr;
}

std::vector<std::string> CandidatesOf(const v1::ValidationSummary& s) {
  std::vector<std::pair<v1::Schedule, std::string>> seen;
  for (const v1::ValidationConfig& c : s.results()) {
    for (const v1::ValidationPoint& p : c.points()) {
      if (std::none_of(seen.begin(), seen.end(),
                       [&](const auto& x) { return x.second == p.candidate(); })) {
        seen.emplace_back(p.schedule(), p.candidate());
      }
    }
  }
  // Variants (schedule unspecified) keep their first-seen order.
  std::stable_sort(seen.begin(), seen.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  out.reserve(seen.size());
  for (auto& [schedule, name] : seen) out.push_back(std::move(name));
  return out;
}

const v1::ValidationPoint* PointOf(const v1::ValidationConfig& c, std::string_view candidate) {
  for (const v1::ValidationPoint& p : c.points()) {
    if (p.candidate() == candidate) return &p;
  }
  return nullptr;
}

bool IsTied(const v1::ValidationConfig& c, std::string_view candidate) {
  return std::find(c.measured_tied_candidates().begin(), c.measured_tied_candidates().end(),
                   candidate) != c.measured_tied_candidates().end();
}

}  // namespace internal

using internal::CandidateNoun;
using internal::ErrorStats;
using internal::Find;
using internal::HasChoice;
using internal::IsTied;
using internal::PointOf;
using internal::ScheduleLabel;
using internal::StatsOf;
using internal::Timeline;
using internal::TimelinesOf;

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

// One candidate's per-iteration totals.
struct Samples {
  std::string candidate;
  absl::Span<const double> totals;
};

template <typename Iterations>
absl::Span<const double> Values(const Iterations& it) {
  return {it.total_us().data(), static_cast<std::size_t>(it.total_us_size())};
}

// The config's paired per-iteration totals by candidate, checked; empty when
// they are not paired or too few to test.
absl::StatusOr<std::vector<Samples>> PairedIterations(const ValidationInput& in) {
  std::vector<Samples> all;
  for (const v1::ScheduleIterations& it : in.iterations) {
    all.push_back({std::string(ScheduleLabel(it.schedule())), Values(it)});
  }
  for (const v1::VariantIterations& it : in.variant_iterations) {
    all.push_back({it.variant(), Values(it)});
  }
  std::vector<Samples> out;
  if (!in.paired) return out;
  const std::string_view noun = CandidateNoun(in.IsModel());
  int n = -1;
  for (const Samples& it : all) {
    const std::string where = Cat("config '", in.name, "', ", noun, " ", it.candidate);
    for (const Samples& o : out) {
      if (o.candidate == it.candidate) {
        return absl::InvalidArgumentError(Cat(where, ": iterations listed twice"));
      }
    }
    const int size = static_cast<int>(it.totals.size());
    if (n >= 0 && size != n) {
      return absl::InvalidArgumentError(
          Cat(where, ": ", size, " paired iterations where another ", noun, " has ", n));
    }
    n = size;
    for (double t : it.totals) {
      if (!(t > 0.0) || !std::isfinite(t)) {
        return absl::InvalidArgumentError(
            Cat(where, ": iteration totals must be finite and > 0 (got ", t, ")"));
      }
    }
    out.push_back(it);
  }
  if (n < kMinPairedIterations) out.clear();
  return out;
}

const Samples* FindSamples(const std::vector<Samples>& s, std::string_view candidate) {
  for (const Samples& x : s) {
    if (x.candidate == candidate) return &x;
  }
  return nullptr;
}

struct OpAccumulator {
  std::vector<double> errors;
  double measured_us = 0.0;
};

// Matches ops by name between the two timelines of one config and candidate.
void AccumulateOps(const Timeline& measured, const Timeline& predicted,
                   std::map<std::string, OpAccumulator, std::less<>>* groups, int* unmatched) {
  std::unordered_map<std::string_view, const v1::OpTiming*> by_name;
  for (const v1::OpTiming& op : *predicted.ops) by_name.emplace(op.name(), &op);
  for (const v1::OpTiming& m : *measured.ops) {
    const double meas = m.end_us() - m.start_us();
    // Ops the executor did not time (or timed as empty) carry no error to speak of.
    if (!(meas > 0.0)) continue;
    auto it = by_name.find(m.name());
    if (it == by_name.end()) {
      ++*unmatched;
      continue;
    }
    const double pred = it->second->end_us() - it->second->start_us();
    const std::string_view group = OpBaseName(m.name());
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
  internal::ReplayTally replay;
};

// The candidate's schedule, for the layer-only Schedule fields.
v1::Schedule ScheduleOf(const std::vector<Timeline>& t, std::string_view candidate) {
  const Timeline* x = Find(t, candidate);
  return x != nullptr ? x->schedule : v1::SCHEDULE_UNSPECIFIED;
}

// One point per candidate both measured and predicted, with the measured and
// predicted best of the config.
absl::Status AddPoints(const ValidationInput& in, const std::vector<Timeline>& measured,
                       const std::vector<Timeline>& predicted, v1::ValidationConfig* c, Tally* t,
                       v1::ValidationSummary* s) {
  const Timeline* meas_best = nullptr;
  const Timeline* pred_best = nullptr;
  const std::string_view noun = CandidateNoun(in.IsModel());
  const std::string_view field = in.IsModel() ? "iteration_us" : "total_us";
  for (const Timeline& m : measured) {
    const Timeline* p = Find(predicted, m.candidate);
    if (p == nullptr) continue;
    const std::string where = Cat("config '", in.name, "', ", noun, " ", m.candidate);
    if (!(m.total_us > 0.0) || !std::isfinite(m.total_us)) {
      return absl::InvalidArgumentError(
          Cat(where, ": measured ", field, " must be finite and > 0 (got ", m.total_us, ")"));
    }
    if (!std::isfinite(p->total_us)) {
      return absl::InvalidArgumentError(
          Cat(where, ": predicted ", field, " must be finite (got ", p->total_us, ")"));
    }
    v1::ValidationPoint* pt = c->add_points();
    pt->set_candidate(m.candidate);
    pt->set_schedule(m.schedule);
    pt->set_measured_us(m.total_us);
    pt->set_predicted_us(p->total_us);
    pt->set_error_pct(ErrorPct(p->total_us, m.total_us));
    MOEPLAN_RETURN_IF_ERROR(internal::AddReplayAndNoise(in, pt, &t->replay));
    t->errors.push_back(pt->error_pct());
    if (std::abs(pt->error_pct()) > t->worst) {
      t->worst = std::abs(pt->error_pct());
      s->set_worst_config(in.name);
      s->set_worst_schedule(pt->schedule());
      s->set_worst_candidate(pt->candidate());
    }
    // Strict '<': ties go to the earlier candidate on both sides alike.
    if (meas_best == nullptr || m.total_us < meas_best->total_us) meas_best = &m;
    if (pred_best == nullptr || p->total_us < pred_best->total_us) pred_best = p;
    AccumulateOps(m, *p, &t->op_groups, &t->unmatched);
  }
  if (c->points().empty()) {
    return absl::InvalidArgumentError(
        Cat("config '", in.name, "': no ", noun, " is both measured and predicted"));
  }
  c->set_measured_best_candidate(meas_best->candidate);
  c->set_predicted_best_candidate(pred_best->candidate);
  c->set_measured_best(meas_best->schedule);
  c->set_predicted_best(pred_best->schedule);
  return absl::OkStatus();
}

// Regret, and whether the pick was right (strictly, and where the measured
// best leads by the decisive margin).
void ScoreSelection(v1::ValidationConfig* c, Tally* t) {
  const double best_us = PointOf(*c, c->measured_best_candidate())->measured_us();
  // The price of trusting the planner: what its pick measured, against the best.
  const double regret =
      ErrorPct(PointOf(*c, c->predicted_best_candidate())->measured_us(), best_us);
  c->set_regret_pct(regret);
  if (!HasChoice(*c)) return;
  const bool hit = c->measured_best_candidate() == c->predicted_best_candidate();
  ++t->choice_configs;
  t->regret_sum += regret;
  t->max_regret = std::max(t->max_regret, regret);
  if (hit) {
    ++t->hits;
  } else {
    t->miss_regret_sum += regret;
  }
  double runner_up = std::numeric_limits<double>::infinity();
  for (const v1::ValidationPoint& pt : c->points()) {
    if (pt.candidate() != c->measured_best_candidate()) {
      runner_up = std::min(runner_up, pt.measured_us());
    }
  }
  if (ErrorPct(runner_up, best_us) >= kDecisiveMarginPct) {
    ++t->decisive;
    t->decisive_hits += hit;
  }
}

// The candidates tied with the measured best, when every point's iterations
// are paired.
absl::Status MarkTies(const ValidationInput& in, const std::vector<Timeline>& measured,
                      v1::ValidationConfig* c, Tally* t) {
  MOEPLAN_ASSIGN_OR_RETURN(const std::vector<Samples> iters, PairedIterations(in));
  const Samples* best = FindSamples(iters, c->measured_best_candidate());
  bool all_paired = best != nullptr;
  for (const v1::ValidationPoint& pt : c->points()) {
    all_paired = all_paired && FindSamples(iters, pt.candidate()) != nullptr;
  }
  if (!all_paired) return absl::OkStatus();
  for (const v1::ValidationPoint& pt : c->points()) {
    if (pt.candidate() == c->measured_best_candidate() ||
        SignTestP(FindSamples(iters, pt.candidate())->totals, best->totals) >= kTieAlpha) {
      c->add_measured_tied_candidates(pt.candidate());
      if (!in.IsModel()) c->add_measured_tied(ScheduleOf(measured, pt.candidate()));
    }
  }
  if (HasChoice(*c)) {
    ++t->paired_configs;
    t->tied_configs += c->measured_tied_candidates_size() >= 2;
    t->tied_hits += IsTied(*c, c->predicted_best_candidate());
  }
  return absl::OkStatus();
}

// The summary's totals from the tally.
void Finish(const Tally& t, v1::ValidationSummary* s) {
  internal::FinishReplayAndNoise(t.replay, s);
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
  if (inputs.empty()) return absl::InvalidArgumentError("validation: no configs");
  const bool models = inputs.front().IsModel();
  v1::ValidationSummary s;
  s.set_profile(profile);
  s.set_ranks(ranks);
  s.set_hosts(hosts);
  s.set_configs(static_cast<int>(inputs.size()));
  s.set_models(models);
  s.set_mpi_wait(inputs.front().mpi_wait);
  s.set_host_cores(inputs.front().host_cores);
  Tally t;
  for (const ValidationInput& in : inputs) {
    if (in.IsModel() != models) {
      return absl::InvalidArgumentError(
          Cat("config '", in.name,
              "': layer configs and whole models cannot be mixed in one "
              "validation"));
    }
    MOEPLAN_ASSIGN_OR_RETURN(const std::vector<Timeline> measured, TimelinesOf(in, true));
    MOEPLAN_ASSIGN_OR_RETURN(const std::vector<Timeline> predicted, TimelinesOf(in, false));
    MOEPLAN_RETURN_IF_ERROR(internal::CheckReplays(in, measured));
    v1::ValidationConfig* c = s.add_results();
    c->set_name(in.name);
    if (models) {
      *c->mutable_model() = in.model;
    } else {
      *c->mutable_layer() = in.layer;
    }
    MOEPLAN_RETURN_IF_ERROR(AddPoints(in, measured, predicted, c, &t, &s));
    ScoreSelection(c, &t);
    MOEPLAN_RETURN_IF_ERROR(MarkTies(in, measured, c, &t));
  }
  Finish(t, &s);
  return s;
}

}  // namespace moeplan::calibration
