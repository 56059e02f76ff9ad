#include "moeplan/calibration/validation.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <iterator>
#include <limits>
#include <map>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "absl/status/status.h"
#include "moeplan/planner/strings.h"
#include "moeplan/proto/convert.h"

namespace moeplan::calibration {
namespace {

// Schedules measured closer than this are within run-to-run noise on a shared
// machine: the selection statistics also report the configs beyond it.
constexpr double kDecisiveMarginPct = 5.0;

// Ties for best: a schedule is slower than the measured best only if the
// one-sided sign test rejects equal speed at this level, on at least this many
// paired iterations (with fewer, even all of them slower has p >= 1/16).
constexpr double kTieAlpha = 0.05;
constexpr int kMinPairedIterations = 5;

// Lower-case like planner::ScheduleName, so reports and plan dumps agree.
std::string ScheduleLabel(v1::Schedule s) {
  absl::StatusOr<planner::Schedule> p = proto::ScheduleFromProto(s);
  return p.ok() ? std::string(planner::ScheduleName(*p)) : "unspecified";
}

double ErrorPct(double predicted, double measured) {
  return 100.0 * (predicted - measured) / measured;
}

// The p-th percentile (0 <= p <= 100) with linear interpolation between order
// statistics, numpy.percentile's default: rank p/100 * (n - 1) on the sorted
// values. 0 for no values.
double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double rank = p / 100.0 * static_cast<double>(v.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(std::floor(rank));
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (rank - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

struct ErrorStats {
  int count = 0;
  double mape = 0.0;
  double p90 = 0.0;
  double max = 0.0;
  double mean_signed = 0.0;
};

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

// ---- Markdown helpers ----

std::string Pct(double v) { return fmt::format("{:.1f}", v); }
std::string SignedPct(double v) { return fmt::format("{:+.1f}", v); }
std::string Ms(double us) { return fmt::format("{:.3f}", us / 1000.0); }

// "1 host", "2 hosts".
std::string Count(int n, std::string_view noun) {
  return fmt::format("{} {}{}", n, noun, n == 1 ? "" : "s");
}

// A table cell: '|' would end the cell and a newline the row.
std::string Cell(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '|') {
      out += "\\|";
    } else if (c == '\n' || c == '\r') {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

// A fence longer than any backtick run in `text`, so the command shows verbatim.
std::string Fence(std::string_view text) {
  std::size_t longest = 0;
  std::size_t run = 0;
  for (char c : text) {
    run = c == '`' ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  return std::string(std::max<std::size_t>(3, longest + 1), '`');
}

// Schedules present in any config, in enum order.
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

// Selection is only a question when there was a choice.
bool HasChoice(const v1::ValidationConfig& c) { return c.points_size() >= 2; }

bool IsTied(const v1::ValidationConfig& c, v1::Schedule s) {
  return std::find(c.measured_tied().begin(), c.measured_tied().end(), s) !=
         c.measured_tied().end();
}

// "s1 s2", or "–" when the config's iterations were not paired.
std::string TiedLabel(const v1::ValidationConfig& c) {
  if (c.measured_tied().empty()) return "–";
  std::string out;
  for (int s : c.measured_tied()) {
    if (!out.empty()) out += ' ';
    out += ScheduleLabel(static_cast<v1::Schedule>(s));
  }
  return out;
}

// ---- gnuplot helpers ----

// A gnuplot string expression equal to `text`. Single-quoted strings take
// everything literally (no backslash escapes, no backquote command
// substitution, which double-quoted strings would run) except that a quote is
// doubled; a line break cannot appear inside one, so it is concatenated in as
// "\n" / "\r".
std::string GnuplotString(std::string_view text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "''";
    } else if (c == '\n') {
      out += "'.\"\\n\".'";
    } else if (c == '\r') {
      out += "'.\"\\r\".'";
    } else {
      out += c;
    }
  }
  out += "'";
  return out;
}

// Text for a data-file comment or quoted column: one line, no double quote
// (gnuplot's data-file quoting has no escape).
std::string DataText(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\n' || c == '\r') {
      out += ' ';
    } else if (c == '"') {
      out += '\'';
    } else {
      out += c;
    }
  }
  return out;
}

// Tic marks for a log axis over [lo, hi]: gnuplot labels only the powers of
// ten, which leaves a range inside one decade with one label or none. 1-2-5
// steps, or every 1..9 step when that gives fewer than three; "" (gnuplot's
// own) when the range spans so many decades that powers of ten are enough.
std::string LogTics(double lo, double hi) {
  if (!(lo > 0.0) || !(hi > lo) || std::log10(hi / lo) > 3.0) return "";
  auto list = [&](std::initializer_list<int> mantissas) {
    std::vector<double> v;
    for (int e = static_cast<int>(std::floor(std::log10(lo)));
         e <= static_cast<int>(std::ceil(std::log10(hi))); ++e) {
      for (int m : mantissas) {
        const double t = m * std::pow(10.0, e);
        if (t >= lo && t <= hi) v.push_back(t);
      }
    }
    return v;
  };
  std::vector<double> tics = list({1, 2, 5});
  if (tics.size() < 3) tics = list({1, 2, 3, 4, 5, 6, 7, 8, 9});
  std::string out;
  for (double t : tics) out += fmt::format("{}{:.6g}", out.empty() ? "" : ", ", t);
  return out;
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

absl::StatusOr<v1::ValidationSummary> Summarize(const std::vector<ValidationInput>& inputs,
                                                const std::string& profile, int ranks, int hosts) {
  if (inputs.empty()) return absl::InvalidArgumentError("validation: no layer configs");
  v1::ValidationSummary s;
  s.set_profile(profile);
  s.set_ranks(ranks);
  s.set_hosts(hosts);
  s.set_configs(static_cast<int>(inputs.size()));

  std::vector<double> errors;
  double worst = -1.0;
  std::map<std::string, OpAccumulator, std::less<>> op_groups;
  int unmatched = 0;
  int choice_configs = 0;
  int hits = 0;
  double regret_sum = 0.0;
  double miss_regret_sum = 0.0;
  double max_regret = 0.0;
  int decisive = 0, decisive_hits = 0;
  int paired_configs = 0, tied_configs = 0, tied_hits = 0;

  for (const ValidationInput& in : inputs) {
    absl::StatusOr<std::map<int, const v1::CandidatePlan*>> measured =
        BySchedule(in.measured, in.name, "measured");
    if (!measured.ok()) return measured.status();
    absl::StatusOr<std::map<int, const v1::CandidatePlan*>> predicted =
        BySchedule(in.predicted, in.name, "predicted");
    if (!predicted.ok()) return predicted.status();

    v1::ValidationConfig* c = s.add_results();
    c->set_name(in.name);
    *c->mutable_layer() = in.layer;
    const v1::CandidatePlan* meas_best = nullptr;
    const v1::CandidatePlan* pred_best = nullptr;
    for (const auto& [schedule, m] : *measured) {
      auto it = predicted->find(schedule);
      if (it == predicted->end()) continue;
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
      errors.push_back(pt->error_pct());
      if (std::abs(pt->error_pct()) > worst) {
        worst = std::abs(pt->error_pct());
        s.set_worst_config(in.name);
        s.set_worst_schedule(pt->schedule());
      }
      // Strict '<': ties go to the earlier schedule on both sides alike.
      if (meas_best == nullptr || m->total_us() < meas_best->total_us()) meas_best = m;
      if (pred_best == nullptr || p->total_us() < pred_best->total_us()) pred_best = p;
      AccumulateOps(*m, *p, &op_groups, &unmatched);
    }
    if (c->points().empty()) {
      return absl::InvalidArgumentError(
          Cat("config '", in.name, "': no schedule is both measured and predicted"));
    }
    c->set_measured_best(meas_best->schedule());
    c->set_predicted_best(pred_best->schedule());
    // The price of trusting the planner: what its pick measured, against the best.
    const double regret = ErrorPct(
        measured->at(static_cast<int>(pred_best->schedule()))->total_us(), meas_best->total_us());
    c->set_regret_pct(regret);
    if (HasChoice(*c)) {
      ++choice_configs;
      regret_sum += regret;
      max_regret = std::max(max_regret, regret);
      if (c->measured_best() == c->predicted_best()) {
        ++hits;
      } else {
        miss_regret_sum += regret;
      }
      double runner_up = std::numeric_limits<double>::infinity();
      for (const v1::ValidationPoint& pt : c->points()) {
        if (pt.schedule() != c->measured_best()) runner_up = std::min(runner_up, pt.measured_us());
      }
      if (ErrorPct(runner_up, meas_best->total_us()) >= kDecisiveMarginPct) {
        ++decisive;
        decisive_hits += c->measured_best() == c->predicted_best();
      }
    }
    absl::StatusOr<std::map<int, const v1::ScheduleIterations*>> iters = PairedIterations(in);
    if (!iters.ok()) return iters.status();
    auto best_iters = iters->find(static_cast<int>(c->measured_best()));
    bool all_paired = best_iters != iters->end();
    for (const v1::ValidationPoint& pt : c->points()) {
      all_paired = all_paired && iters->count(static_cast<int>(pt.schedule())) > 0;
    }
    if (all_paired) {
      const absl::Span<const double> best = Values(*best_iters->second);
      for (const v1::ValidationPoint& pt : c->points()) {
        if (pt.schedule() == c->measured_best() ||
            SignTestP(Values(*iters->at(static_cast<int>(pt.schedule()))), best) >= kTieAlpha) {
          c->add_measured_tied(pt.schedule());
        }
      }
      if (HasChoice(*c)) {
        ++paired_configs;
        tied_configs += c->measured_tied_size() >= 2;
        tied_hits += IsTied(*c, c->predicted_best());
      }
    }
  }
  s.set_tie_alpha(kTieAlpha);
  s.set_min_paired_iterations(kMinPairedIterations);
  s.set_paired_configs(paired_configs);
  s.set_tied_configs(tied_configs);
  if (paired_configs > 0) s.set_selection_accuracy_tied_pct(100.0 * tied_hits / paired_configs);
  s.set_decisive_margin_pct(kDecisiveMarginPct);
  s.set_decisive_configs(decisive);
  if (decisive > 0) s.set_selection_accuracy_decisive_pct(100.0 * decisive_hits / decisive);

  const ErrorStats total = StatsOf(errors);
  s.set_points(total.count);
  s.set_mape_pct(total.mape);
  s.set_p90_pct(total.p90);
  s.set_max_pct(total.max);
  s.set_mean_signed_pct(total.mean_signed);

  if (choice_configs > 0) {
    s.set_selection_accuracy_pct(100.0 * hits / choice_configs);
    s.set_mean_regret_pct(regret_sum / choice_configs);
    s.set_max_regret_pct(max_regret);
    const int misses = choice_configs - hits;
    if (misses > 0) s.set_mean_regret_when_wrong_pct(miss_regret_sum / misses);
  }

  double op_total_us = 0.0;
  for (const auto& [name, g] : op_groups) op_total_us += g.measured_us;
  for (const auto& [name, g] : op_groups) {
    const ErrorStats st = StatsOf(g.errors);
    v1::OpError* e = s.add_ops();
    e->set_op(name);
    e->set_count(st.count);
    e->set_mape_pct(st.mape);
    e->set_p90_pct(st.p90);
    e->set_mean_signed_pct(st.mean_signed);
    e->set_measured_share_pct(100.0 * g.measured_us / op_total_us);
  }
  // Stable over the name-ordered map: equal shares stay alphabetical.
  std::stable_sort(s.mutable_ops()->begin(), s.mutable_ops()->end(),
                   [](const v1::OpError& a, const v1::OpError& b) {
                     return a.measured_share_pct() > b.measured_share_pct();
                   });
  s.set_unmatched_ops(unmatched);
  return s;
}

std::string RenderMarkdown(const v1::ValidationSummary& s, const ReportContext& ctx) {
  std::string md;
  auto out = std::back_inserter(md);
  const std::vector<v1::Schedule> schedules = SchedulesOf(s);

  int choice_configs = 0;
  int hits = 0;
  int tied_hits = 0;
  for (const v1::ValidationConfig& c : s.results()) {
    if (!HasChoice(c)) continue;
    ++choice_configs;
    if (c.measured_best() == c.predicted_best()) ++hits;
    if (IsTied(c, c.predicted_best())) ++tied_hits;
  }
  const int single = static_cast<int>(s.results_size()) - choice_configs;

  fmt::format_to(out, "# moeplan validation: {}\n\n", s.profile());
  fmt::format_to(out,
                 "Predicted (the planner with profile `{}`) against measured (moeplan-exec, "
                 "{} on {}) forward + backward iteration time of one MoE layer, for {} and "
                 "every schedule both measured and predicted.\n\n",
                 s.profile(), Count(s.ranks(), "rank"), Count(s.hosts(), "host"),
                 Count(s.configs(), "layer config"));
  if (!ctx.profile_comment.empty()) {
    fmt::format_to(out, "Profile: {}\n\n", ctx.profile_comment);
  }
  if (!ctx.command.empty()) {
    const std::string fence = Fence(ctx.command);
    fmt::format_to(out, "Measured with:\n\n{}\n{}\n{}\n\n", fence, ctx.command, fence);
  }

  md += "## Summary\n\n| metric | value |\n|---|---|\n";
  fmt::format_to(out, "| configs | {} |\n", s.configs());
  fmt::format_to(out, "| points (config × schedule) | {} |\n", s.points());
  fmt::format_to(out, "| MAPE | {} % |\n", Pct(s.mape_pct()));
  fmt::format_to(out, "| p90 absolute error | {} % |\n", Pct(s.p90_pct()));
  fmt::format_to(out, "| max absolute error | {} % ({}, {}) |\n", Pct(s.max_pct()),
                 Cell(s.worst_config()), ScheduleLabel(s.worst_schedule()));
  fmt::format_to(out, "| mean signed error | {} % |\n", SignedPct(s.mean_signed_pct()));
  if (choice_configs > 0) {
    fmt::format_to(out, "| selection accuracy | {} % ({} of {} configs) |\n",
                   Pct(s.selection_accuracy_pct()), hits, choice_configs);
    fmt::format_to(out, "| mean regret | {} % |\n", Pct(s.mean_regret_pct()));
    if (hits < choice_configs) {
      fmt::format_to(out, "| mean regret when wrong | {} % |\n",
                     Pct(s.mean_regret_when_wrong_pct()));
    } else {
      md += "| mean regret when wrong | – (no misses) |\n";
    }
    fmt::format_to(out, "| max regret | {} % |\n", Pct(s.max_regret_pct()));
    if (s.decisive_configs() > 0) {
      fmt::format_to(out,
                     "| selection accuracy where the measured best leads by >= {:g} % | {} % "
                     "({} configs) |\n",
                     s.decisive_margin_pct(), Pct(s.selection_accuracy_decisive_pct()),
                     s.decisive_configs());
    } else {
      fmt::format_to(out,
                     "| selection accuracy where the measured best leads by >= {:g} % | – (no "
                     "such config) |\n",
                     s.decisive_margin_pct());
    }
    if (s.paired_configs() > 0) {
      fmt::format_to(out,
                     "| selection accuracy, ties for best counted | {} % ({} of {} configs; {} "
                     "with a tie) |\n",
                     Pct(s.selection_accuracy_tied_pct()), tied_hits, s.paired_configs(),
                     s.tied_configs());
    } else {
      md += "| selection accuracy, ties for best counted | – (no paired iterations) |\n";
    }
  } else {
    md += "| selection accuracy | not measured |\n";
  }
  md +=
      "\nError = 100 × (predicted − measured) / measured; > 0 means the model over-predicts. "
      "MAPE is the mean absolute error; p90 interpolates linearly between order statistics "
      "(numpy's default). Regret = how much slower the predicted-best schedule measured than "
      "the measured-best one, in % of the latter.\n\n";
  if (choice_configs > 0) {
    fmt::format_to(out,
                   "Ties for best: with the schedules' iterations interleaved (moeplan-exec "
                   "`--schedule all`), iteration i of every schedule ran in the same round, so "
                   "they pair up. A schedule is tied with the measured best (the lowest median) "
                   "unless a one-sided exact sign test over the pairs says it is slower at level "
                   "{:g}; it needs {} or more pairs to say so. Picking a tied schedule counts as "
                   "a hit in the ties-counted accuracy; the strict accuracy counts only the "
                   "measured best.\n\n",
                   s.tie_alpha(), s.min_paired_iterations());
  }
  if (choice_configs == 0) {
    md +=
        "Selection was not measured: no config has two or more schedules both measured and "
        "predicted.\n\n";
  } else if (single > 0) {
    fmt::format_to(out,
                   "{} config{} with a single schedule both measured and predicted {} left out "
                   "of the selection statistics (no choice to make).\n\n",
                   single, single == 1 ? "" : "s", single == 1 ? "is" : "are");
  }

  if (!ctx.plot_file.empty()) {
    // CommonMark ends a bare link target at a space or an unbalanced ')';
    // the <...> form takes either.
    const bool bracket = ctx.plot_file.find_first_of(" ()") != std::string::npos;
    fmt::format_to(out, "![predicted vs measured]({}{}{})\n\n", bracket ? "<" : "", ctx.plot_file,
                   bracket ? ">" : "");
  }

  md += "## Error by schedule\n\n";
  md +=
      "| schedule | points | MAPE % | p90 % | max % | mean signed % "
      "|\n|---|---:|---:|---:|---:|---:|\n";
  for (v1::Schedule sched : schedules) {
    std::vector<double> errors;
    for (const v1::ValidationConfig& c : s.results()) {
      if (const v1::ValidationPoint* p = PointOf(c, sched)) errors.push_back(p->error_pct());
    }
    const ErrorStats st = StatsOf(errors);
    fmt::format_to(out, "| {} | {} | {} | {} | {} | {} |\n", ScheduleLabel(sched), st.count,
                   Pct(st.mape), Pct(st.p90), Pct(st.max), SignedPct(st.mean_signed));
  }
  md += "\n";

  constexpr int kTopOps = 15;
  md += "## Error by op\n\n";
  if (s.ops().empty()) {
    md += "No measured op matched a predicted op by name.\n\n";
  } else {
    md +=
        "Op durations (end − start), measured against predicted, over every config and "
        "schedule; pipeline steps (`name.N`) are pooled under their op. Share = the op's part "
        "of all measured op time. Largest share first";
    if (s.ops_size() > kTopOps) {
      fmt::format_to(out, "; the top {} of {}", kTopOps, s.ops_size());
    }
    md += ".\n\n| op | count | share % | MAPE % | p90 % | mean signed % |\n";
    md += "|---|---:|---:|---:|---:|---:|\n";
    for (int i = 0; i < std::min(kTopOps, s.ops_size()); ++i) {
      const v1::OpError& e = s.ops(i);
      fmt::format_to(out, "| {} | {} | {} | {} | {} | {} |\n", Cell(e.op()), e.count(),
                     Pct(e.measured_share_pct()), Pct(e.mape_pct()), Pct(e.p90_pct()),
                     SignedPct(e.mean_signed_pct()));
    }
    md += "\n";
  }
  if (s.unmatched_ops() > 0) {
    fmt::format_to(out,
                   "{} measured op timing{} had no predicted op of the same name and {} left "
                   "out: the executor's and the planner's op names differ.\n\n",
                   s.unmatched_ops(), s.unmatched_ops() == 1 ? "" : "s",
                   s.unmatched_ops() == 1 ? "is" : "are");
  }

  constexpr std::size_t kWorst = 5;
  std::vector<std::pair<const v1::ValidationConfig*, const v1::ValidationPoint*>> points;
  for (const v1::ValidationConfig& c : s.results()) {
    for (const v1::ValidationPoint& p : c.points()) points.emplace_back(&c, &p);
  }
  std::stable_sort(points.begin(), points.end(), [](const auto& a, const auto& b) {
    return std::abs(a.second->error_pct()) > std::abs(b.second->error_pct());
  });
  fmt::format_to(out, "## Worst points\n\n");
  md += "| config | schedule | measured ms | predicted ms | error % |\n|---|---|---:|---:|---:|\n";
  for (std::size_t i = 0; i < std::min(kWorst, points.size()); ++i) {
    const auto& [c, p] = points[i];
    fmt::format_to(out, "| {} | {} | {} | {} | {} |\n", Cell(c->name()),
                   ScheduleLabel(p->schedule()), Ms(p->measured_us()), Ms(p->predicted_us()),
                   SignedPct(p->error_pct()));
  }
  md += "\n";

  md += "## Selection misses\n\n";
  if (choice_configs == 0) {
    md += "Not measured (no config with two or more schedules).\n\n";
  } else if (hits == choice_configs) {
    md += "None: the predicted best schedule measured fastest in every config.\n\n";
  } else {
    md +=
        "| config | predicted best | measured best | regret % | tied for best |\n"
        "|---|---|---|---:|---|\n";
    for (const v1::ValidationConfig& c : s.results()) {
      if (!HasChoice(c) || c.measured_best() == c.predicted_best()) continue;
      fmt::format_to(out, "| {} | {} | {} | {} | {} |\n", Cell(c.name()),
                     ScheduleLabel(c.predicted_best()), ScheduleLabel(c.measured_best()),
                     Pct(c.regret_pct()), TiedLabel(c));
    }
    md += "\n";
  }

  md += "## All configs\n\nPer schedule: measured ms / predicted ms / error %.\n\n| config |";
  for (v1::Schedule sched : schedules) {
    const std::string name = ScheduleLabel(sched);
    fmt::format_to(out, " {0} meas ms | {0} pred ms | {0} err % |", name);
  }
  md += " measured best | predicted best | regret % | tied for best |\n|---|";
  for (std::size_t i = 0; i < schedules.size(); ++i) md += "---:|---:|---:|";
  md += "---|---|---:|---|\n";
  for (const v1::ValidationConfig& c : s.results()) {
    fmt::format_to(out, "| {} |", Cell(c.name()));
    for (v1::Schedule sched : schedules) {
      if (const v1::ValidationPoint* p = PointOf(c, sched)) {
        fmt::format_to(out, " {} | {} | {} |", Ms(p->measured_us()), Ms(p->predicted_us()),
                       SignedPct(p->error_pct()));
      } else {
        md += " – | – | – |";
      }
    }
    fmt::format_to(out, " {} | {} | {} | {} |\n", ScheduleLabel(c.measured_best()),
                   ScheduleLabel(c.predicted_best()), HasChoice(c) ? Pct(c.regret_pct()) : "–",
                   TiedLabel(c));
  }
  return md;
}

std::string PlotData(const v1::ValidationSummary& s) {
  const std::vector<v1::Schedule> schedules = SchedulesOf(s);
  std::string data;
  auto out = std::back_inserter(data);
  fmt::format_to(out,
                 "# moeplan validation, profile {}: predicted vs measured forward + backward "
                 "time\n",
                 DataText(s.profile()));
  data += "# one block per schedule (gnuplot index 0, 1, ...):";
  for (v1::Schedule sched : schedules) fmt::format_to(out, " {}", ScheduleLabel(sched));
  data += "\n# schedule measured_ms predicted_ms config_name\n";
  for (std::size_t i = 0; i < schedules.size(); ++i) {
    // Two blank lines end a block: that is what gnuplot's `index` counts.
    if (i > 0) data += "\n\n";
    for (const v1::ValidationConfig& c : s.results()) {
      const v1::ValidationPoint* p = PointOf(c, schedules[i]);
      if (p == nullptr) continue;
      fmt::format_to(out, "{} {:.6g} {:.6g} \"{}\"\n", ScheduleLabel(p->schedule()),
                     p->measured_us() / 1000.0, p->predicted_us() / 1000.0, DataText(c.name()));
    }
  }
  return data;
}

std::string GnuplotScript(const v1::ValidationSummary& s, const std::string& data_file,
                          const std::string& png_file) {
  const std::vector<v1::Schedule> schedules = SchedulesOf(s);
  // Equal x and y ranges around every point, so y = x is the diagonal.
  double lo = 0.0;
  double hi = 0.0;
  for (const v1::ValidationConfig& c : s.results()) {
    for (const v1::ValidationPoint& p : c.points()) {
      for (double us : {p.measured_us(), p.predicted_us()}) {
        if (!(us > 0.0)) continue;  // not drawable on a log axis
        const double ms = us / 1000.0;
        lo = lo == 0.0 ? ms : std::min(lo, ms);
        hi = std::max(hi, ms);
      }
    }
  }
  if (hi == 0.0) {
    lo = 0.01;
    hi = 100.0;
  } else {
    lo /= 1.25;
    hi *= 1.25;
  }

  std::string gp;
  auto out = std::back_inserter(gp);
  gp += "# moeplan validation scatter plot; run as `gnuplot <this file>`.\n";
  fmt::format_to(out, "data_file = {}\npng_file = {}\n", GnuplotString(data_file),
                 GnuplotString(png_file));
  // Debian's gnuplot-nox 5.4 has pngcairo (it links cairo/pango), but other
  // builds may only have libgd's png: pick whichever this gnuplot has.
  gp +=
      "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
      "  set terminal pngcairo size 900,700 noenhanced font 'sans,10'\n"
      "} else {\n"
      "  set terminal png size 900,700 noenhanced\n"
      "}\n"
      "set output png_file\n";
  fmt::format_to(out, "set title {}\n",
                 GnuplotString(Cat("moeplan validation (profile ", s.profile(), ", ", s.ranks(),
                                   " ranks): predicted vs measured iteration time")));
  gp +=
      "set xlabel 'measured forward + backward time (ms)'\n"
      "set ylabel 'predicted forward + backward time (ms)'\n"
      "set logscale xy\n";
  fmt::format_to(out, "set xrange [{0:.6g}:{1:.6g}]\nset yrange [{0:.6g}:{1:.6g}]\n", lo, hi);
  const std::string tics = LogTics(lo, hi);
  if (!tics.empty()) fmt::format_to(out, "set xtics ({0})\nset ytics ({0})\n", tics);
  gp +=
      "set size square\n"
      "set grid\n"
      "set key top left box opaque\n"
      "plot x with lines lc rgb 'black' title 'y = x', \\\n"
      "     1.1*x with lines dt 2 lc rgb 'gray50' title '+10 %', \\\n"
      "     0.9*x with lines dt 2 lc rgb 'gray50' title '-10 %'";
  // Filled circle, square, triangle, diamond, inverted triangle, pentagon, in
  // colours that stay apart on white (gnuplot's third default is a pale yellow).
  constexpr int kPointTypes[] = {7, 5, 9, 13, 11, 15};
  constexpr std::string_view kColours[] = {"#1f77b4", "#d62728", "#2ca02c",
                                           "#9467bd", "#ff7f0e", "#8c564b"};
  for (std::size_t i = 0; i < schedules.size(); ++i) {
    fmt::format_to(out,
                   ", \\\n     data_file index {} using 2:3 with points pt {} ps 1.3 lc rgb '{}' "
                   "title {}",
                   i, kPointTypes[i % std::size(kPointTypes)], kColours[i % std::size(kColours)],
                   GnuplotString(ScheduleLabel(schedules[i])));
  }
  // Closing the output flushes the PNG before gnuplot exits.
  gp += "\nset output\n";
  return gp;
}

}  // namespace moeplan::calibration
