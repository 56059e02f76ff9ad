// `moeplan validate`'s Markdown report, section by section.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <iterator>
#include <utility>

#include "moeplan/calibration/validation.h"
#include "validation_internal.h"

namespace moeplan::calibration {
namespace {

using internal::CandidateNoun;
using internal::Cell;
using internal::ErrorStats;
using internal::HasChoice;
using internal::IsTied;
using internal::PointOf;
using internal::StatsOf;

std::string Pct(double v) { return fmt::format("{:.1f}", v); }
std::string SignedPct(double v) { return fmt::format("{:+.1f}", v); }
std::string Ms(double us) { return fmt::format("{:.3f}", us / 1000.0); }

// "1 host", "2 hosts".
std::string Count(int n, std::string_view noun) {
  return fmt::format("{} {}{}", n, noun, n == 1 ? "" : "s");
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

// "s1 s2", or "–" when the config's iterations were not paired.
std::string TiedLabel(const v1::ValidationConfig& c) {
  if (c.measured_tied_candidates().empty()) return "–";
  std::string out;
  for (const std::string& s : c.measured_tied_candidates()) {
    if (!out.empty()) out += ' ';
    out += s;
  }
  return out;
}

// True when the predicted best is the measured best.
bool Hit(const v1::ValidationConfig& c) {
  return c.measured_best_candidate() == c.predicted_best_candidate();
}

// The selection counts the report states, recounted from the configs.
struct Selection {
  int choice_configs = 0;  // configs with two or more candidates
  int hits = 0;            // predicted best = measured best
  int tied_hits = 0;       // predicted best tied for best
  int single = 0;          // configs with one candidate: no choice
};

Selection SelectionOf(const v1::ValidationSummary& s) {
  Selection sel;
  for (const v1::ValidationConfig& c : s.results()) {
    if (!HasChoice(c)) continue;
    ++sel.choice_configs;
    if (Hit(c)) ++sel.hits;
    if (IsTied(c, c.predicted_best_candidate())) ++sel.tied_hits;
  }
  sel.single = static_cast<int>(s.results_size()) - sel.choice_configs;
  return sel;
}

// How the ranks waited and whether they outnumbered the cores, when the runs
// said ("" when they did not).
std::string RunLine(const v1::ValidationSummary& s) {
  std::string line;
  if (!s.mpi_wait().empty()) {
    line = fmt::format("Ranks waited for their collectives with `--mpi-wait {}`.", s.mpi_wait());
  }
  if (s.host_cores() > 0 && s.hosts() > 0) {
    const int per_host = (s.ranks() + s.hosts() - 1) / s.hosts();
    line += fmt::format("{}{} per host on {}{}.", line.empty() ? "" : " ", Count(per_host, "rank"),
                        Count(s.host_cores(), "core"),
                        per_host > s.host_cores()
                            ? ": **ranks outnumber cores**, so ranks share cores and every "
                              "time includes waiting for one"
                            : "");
  }
  return line.empty() ? line : line + "\n\n";
}

// Title, what was compared, the profile and the command.
void Header(const v1::ValidationSummary& s, const ReportContext& ctx, std::string* md_out) {
  std::string& md = *md_out;
  auto out = std::back_inserter(md);
  fmt::format_to(out, "# moeplan validation: {}\n\n", s.profile());
  if (s.models()) {
    fmt::format_to(out,
                   "Predicted (the planner with profile `{}`) against measured (moeplan-exec "
                   "--model, {} on {}) training iteration time (forward, backward, gradient "
                   "synchronisation and optimizer) of whole models, for {} and every overlap "
                   "variant both measured and predicted.\n\n",
                   s.profile(), Count(s.ranks(), "rank"), Count(s.hosts(), "host"),
                   Count(s.configs(), "model"));
  } else {
    fmt::format_to(out,
                   "Predicted (the planner with profile `{}`) against measured (moeplan-exec, "
                   "{} on {}) forward + backward iteration time of one MoE layer, for {} and "
                   "every schedule both measured and predicted.\n\n",
                   s.profile(), Count(s.ranks(), "rank"), Count(s.hosts(), "host"),
                   Count(s.configs(), "layer config"));
  }
  md += RunLine(s);
  if (!ctx.profile_comment.empty()) {
    fmt::format_to(out, "Profile: {}\n\n", ctx.profile_comment);
  }
  if (!ctx.provenance.empty()) fmt::format_to(out, "Profile provenance: {}\n\n", ctx.provenance);
  if (!ctx.from_runs.empty()) {
    fmt::format_to(
        out,
        "Measured earlier: these are the moeplan-exec reports in `{}/exec`, re-predicted "
        "(each report records its backend, element type and iterations).\n\n",
        ctx.from_runs);
  } else if (!ctx.command.empty()) {
    const std::string fence = Fence(ctx.command);
    fmt::format_to(out, "Measured with:\n\n{}\n{}\n{}\n\n", fence, ctx.command, fence);
  }
  md += ctx.section;
}

// The summary table: errors, selection accuracy (strict, decisive, ties counted), regret.
void SummaryTable(const v1::ValidationSummary& s, const Selection& sel, std::string* md_out) {
  std::string& md = *md_out;
  auto out = std::back_inserter(md);
  md += "## Summary\n\n| metric | value |\n|---|---|\n";
  fmt::format_to(out, "| configs | {} |\n", s.configs());
  fmt::format_to(out, "| points (config × {}) | {} |\n", CandidateNoun(s.models()), s.points());
  fmt::format_to(out, "| MAPE | {} % |\n", Pct(s.mape_pct()));
  fmt::format_to(out, "| p90 absolute error | {} % |\n", Pct(s.p90_pct()));
  fmt::format_to(out, "| max absolute error | {} % ({}, {}) |\n", Pct(s.max_pct()),
                 Cell(s.worst_config()), s.worst_candidate());
  fmt::format_to(out, "| mean signed error | {} % |\n", SignedPct(s.mean_signed_pct()));
  if (sel.choice_configs > 0) {
    fmt::format_to(out, "| selection accuracy | {} % ({} of {} configs) |\n",
                   Pct(s.selection_accuracy_pct()), sel.hits, sel.choice_configs);
    fmt::format_to(out, "| mean regret | {} % |\n", Pct(s.mean_regret_pct()));
    if (sel.hits < sel.choice_configs) {
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
                     Pct(s.selection_accuracy_tied_pct()), sel.tied_hits, s.paired_configs(),
                     s.tied_configs());
    } else {
      md += "| selection accuracy, ties for best counted | – (no paired iterations) |\n";
    }
  } else {
    md += "| selection accuracy | not measured |\n";
  }
  internal::NoiseAndReplayRows(s, &md);
}

// How the numbers are defined, configs left out of selection, the plot.
void Notes(const v1::ValidationSummary& s, const ReportContext& ctx, const Selection& sel,
           std::string* md_out) {
  std::string& md = *md_out;
  auto out = std::back_inserter(md);
  const std::string_view noun = CandidateNoun(s.models());
  fmt::format_to(out,
                 "\nError = 100 × (predicted − measured) / measured; > 0 means the model "
                 "over-predicts. MAPE is the mean absolute error; p90 interpolates linearly "
                 "between order statistics (numpy's default). Regret = how much slower the "
                 "predicted-best {0} measured than the measured-best one, in % of the "
                 "latter.\n\n",
                 noun);
  if (sel.choice_configs > 0) {
    fmt::format_to(out,
                   "Ties for best: with the {0}s' iterations interleaved (moeplan-exec "
                   "`--{0} all`), iteration i of every {0} ran in the same round, so "
                   "they pair up. A {0} is tied with the measured best (the lowest median) "
                   "unless a one-sided exact sign test over the pairs says it is slower at level "
                   "{1:g}; it needs {2} or more pairs to say so. Picking a tied {0} counts as "
                   "a hit in the ties-counted accuracy; the strict accuracy counts only the "
                   "measured best.\n\n",
                   noun, s.tie_alpha(), s.min_paired_iterations());
  }
  if (sel.choice_configs == 0) {
    fmt::format_to(out,
                   "Selection was not measured: no config has two or more {}s both measured and "
                   "predicted.\n\n",
                   noun);
  } else if (sel.single > 0) {
    fmt::format_to(out,
                   "{} config{} with a single {} both measured and predicted {} left out "
                   "of the selection statistics (no choice to make).\n\n",
                   sel.single, sel.single == 1 ? "" : "s", noun, sel.single == 1 ? "is" : "are");
  }

  if (!ctx.plot_file.empty()) {
    // CommonMark ends a bare link target at a space or an unbalanced ')';
    // the <...> form takes either.
    const bool bracket = ctx.plot_file.find_first_of(" ()") != std::string::npos;
    fmt::format_to(out, "![predicted vs measured]({}{}{})\n\n", bracket ? "<" : "", ctx.plot_file,
                   bracket ? ">" : "");
  }
}

void ErrorByCandidate(const v1::ValidationSummary& s, const std::vector<std::string>& candidates,
                      std::string* md_out) {
  std::string& md = *md_out;
  auto out = std::back_inserter(md);
  const std::string_view noun = CandidateNoun(s.models());
  fmt::format_to(out,
                 "## Error by {0}\n\n| {0} | points | MAPE % | p90 % | max % | mean signed % "
                 "|\n|---|---:|---:|---:|---:|---:|\n",
                 noun);
  for (const std::string& cand : candidates) {
    std::vector<double> errors;
    for (const v1::ValidationConfig& c : s.results()) {
      if (const v1::ValidationPoint* p = PointOf(c, cand)) errors.push_back(p->error_pct());
    }
    const ErrorStats st = StatsOf(errors);
    fmt::format_to(out, "| {} | {} | {} | {} | {} | {} |\n", Cell(cand), st.count, Pct(st.mape),
                   Pct(st.p90), Pct(st.max), SignedPct(st.mean_signed));
  }
  md += "\n";
}

void ErrorByOp(const v1::ValidationSummary& s, std::string* md_out) {
  std::string& md = *md_out;
  auto out = std::back_inserter(md);
  constexpr int kTopOps = 15;
  md += "## Error by op\n\n";
  if (s.ops().empty()) {
    md += "No measured op matched a predicted op by name.\n\n";
  } else {
    md +=
        "Op durations (end − start), measured against predicted, over every config and "
        "candidate; pooled under the planner's base name (pipeline steps `name.N`, partition "
        "parts `name.pN`, a model's blocks `bN.` and MoE scope `moe.`, and a pipeline program's "
        "stage, chunk and micro-batch `sS.cC.mbI.` removed). Share = the "
        "op's part of all measured op time. Largest share first";
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
}

void WorstPoints(const v1::ValidationSummary& s, std::string* md_out) {
  std::string& md = *md_out;
  auto out = std::back_inserter(md);
  constexpr std::size_t kWorst = 5;
  std::vector<std::pair<const v1::ValidationConfig*, const v1::ValidationPoint*>> points;
  for (const v1::ValidationConfig& c : s.results()) {
    for (const v1::ValidationPoint& p : c.points()) points.emplace_back(&c, &p);
  }
  std::stable_sort(points.begin(), points.end(), [](const auto& a, const auto& b) {
    return std::abs(a.second->error_pct()) > std::abs(b.second->error_pct());
  });
  fmt::format_to(out, "## Worst points\n\n");
  fmt::format_to(out,
                 "| config | {} | measured ms | predicted ms | error % | noise floor % |\n"
                 "|---|---|---:|---:|---:|---:|\n",
                 CandidateNoun(s.models()));
  for (std::size_t i = 0; i < std::min(kWorst, points.size()); ++i) {
    const auto& [c, p] = points[i];
    fmt::format_to(out, "| {} | {} | {} | {} | {} | {} |\n", Cell(c->name()), Cell(p->candidate()),
                   Ms(p->measured_us()), Ms(p->predicted_us()), SignedPct(p->error_pct()),
                   internal::NoiseCell(*p));
  }
  md += "\n";
}

void Misses(const v1::ValidationSummary& s, const Selection& sel, std::string* md_out) {
  std::string& md = *md_out;
  auto out = std::back_inserter(md);
  const std::string_view noun = CandidateNoun(s.models());
  md += "## Selection misses\n\n";
  if (sel.choice_configs == 0) {
    fmt::format_to(out, "Not measured (no config with two or more {}s).\n\n", noun);
  } else if (sel.hits == sel.choice_configs) {
    fmt::format_to(out, "None: the predicted best {} measured fastest in every config.\n\n", noun);
  } else {
    md +=
        "| config | predicted best | measured best | regret % | tied for best |\n"
        "|---|---|---|---:|---|\n";
    for (const v1::ValidationConfig& c : s.results()) {
      if (!HasChoice(c) || Hit(c)) continue;
      fmt::format_to(out, "| {} | {} | {} | {} | {} |\n", Cell(c.name()),
                     Cell(c.predicted_best_candidate()), Cell(c.measured_best_candidate()),
                     Pct(c.regret_pct()), TiedLabel(c));
    }
    md += "\n";
  }
}

void AllConfigs(const v1::ValidationSummary& s, const std::vector<std::string>& candidates,
                std::string* md_out) {
  std::string& md = *md_out;
  auto out = std::back_inserter(md);
  fmt::format_to(out,
                 "## All configs\n\nPer {}: measured ms / predicted ms / error %.\n\n| config |",
                 CandidateNoun(s.models()));
  for (const std::string& cand : candidates) {
    fmt::format_to(out, " {0} meas ms | {0} pred ms | {0} err % |", Cell(cand));
  }
  md += " measured best | predicted best | regret % | tied for best |\n|---|";
  for (std::size_t i = 0; i < candidates.size(); ++i) md += "---:|---:|---:|";
  md += "---|---|---:|---|\n";
  for (const v1::ValidationConfig& c : s.results()) {
    fmt::format_to(out, "| {} |", Cell(c.name()));
    for (const std::string& cand : candidates) {
      if (const v1::ValidationPoint* p = PointOf(c, cand)) {
        fmt::format_to(out, " {} | {} | {} |", Ms(p->measured_us()), Ms(p->predicted_us()),
                       SignedPct(p->error_pct()));
      } else {
        md += " – | – | – |";
      }
    }
    fmt::format_to(out, " {} | {} | {} | {} |\n", Cell(c.measured_best_candidate()),
                   Cell(c.predicted_best_candidate()), HasChoice(c) ? Pct(c.regret_pct()) : "–",
                   TiedLabel(c));
  }
}

}  // namespace

namespace internal {

// '|' would end the cell and a newline the row.
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

}  // namespace internal

std::string RenderMarkdown(const v1::ValidationSummary& s, const ReportContext& ctx) {
  const std::vector<std::string> candidates = internal::CandidatesOf(s);
  const Selection sel = SelectionOf(s);
  std::string md;
  Header(s, ctx, &md);
  SummaryTable(s, sel, &md);
  Notes(s, ctx, sel, &md);
  ErrorByCandidate(s, candidates, &md);
  ErrorByOp(s, &md);
  internal::ReplaySection(s, &md);
  WorstPoints(s, &md);
  Misses(s, sel, &md);
  AllConfigs(s, candidates, &md);
  return md;
}

}  // namespace moeplan::calibration
