// `moeplan validate`'s report: the noise floor rows of the summary, and the
// replay section (composition against cost error, the ops that waited).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "moeplan/calibration/context_fit.h"
#include "validation_internal.h"

namespace moeplan::calibration::internal {
namespace {

std::string Pct(double v) { return fmt::format("{:.1f}", v); }
std::string SignedPct(double v) { return fmt::format("{:+.1f}", v); }
std::string Ms(double us) { return fmt::format("{:.3f}", us / 1000.0); }

}  // namespace

std::string NoiseCell(const v1::ValidationPoint& p) {
  if (!p.has_noise()) return "–";
  return fmt::format("{}{}", Pct(p.noise().floor_pct()), p.within_noise() ? " (within)" : "");
}

void NoiseAndReplayRows(const v1::ValidationSummary& s, std::string* md) {
  auto out = std::back_inserter(*md);
  if (s.noise_points() > 0) {
    fmt::format_to(out, "| noise floor (median over {} points) | {} % |\n", s.noise_points(),
                   Pct(s.median_noise_floor_pct()));
    fmt::format_to(out, "| points within their noise floor | {} of {} ({} within twice it) |\n",
                   s.within_noise_points(), s.noise_points(), s.within_twice_noise_points());
  } else {
    fmt::format_to(out, "| noise floor | – (fewer than {} iterations per point) |\n",
                   s.min_noise_samples());
  }
  if (s.replayed_points() == 0) return;
  fmt::format_to(out,
                 "| composition error (replay vs measured), {} points | MAPE {} %, p90 {} %, max "
                 "{} %, mean signed {} % |\n",
                 s.replayed_points(), Pct(s.composition_mape_pct()), Pct(s.composition_p90_pct()),
                 Pct(s.composition_max_pct()), SignedPct(s.composition_mean_signed_pct()));
  fmt::format_to(out,
                 "| cost error (predicted vs replay) | MAPE {} %, p90 {} %, max {} %, mean signed "
                 "{} % |\n",
                 Pct(s.cost_mape_pct()), Pct(s.cost_p90_pct()), Pct(s.cost_max_pct()),
                 SignedPct(s.cost_mean_signed_pct()));
  if (s.noise_points() > 0) {
    fmt::format_to(out, "| composition errors within the noise floor | {} |\n",
                   s.composition_within_noise_points());
  }
  if (s.drift_points() == 0) return;
  fmt::format_to(
      out, "| machine drift (run's speed probe vs the profile's), {} points | median {} % |\n",
      s.drift_points(), SignedPct(s.median_drift_pct()));
  fmt::format_to(out,
                 "| error of the prediction corrected for machine drift | MAPE {} %, p90 {} %, max "
                 "{} %, mean signed {} % |\n",
                 Pct(s.drift_corrected_mape_pct()), Pct(s.drift_corrected_p90_pct()),
                 Pct(s.drift_corrected_max_pct()), SignedPct(s.drift_corrected_mean_signed_pct()));
}

void ReplaySection(const v1::ValidationSummary& s, std::string* md) {
  if (s.replayed_points() == 0) return;
  auto out = std::back_inserter(*md);
  *md +=
      "## Replay: composition and cost\n\n"
      "Each run's measured op durations put on the op graph of the plan that ran and composed "
      "by the simulator as it composes predictions. Composition error = 100 × (replayed − "
      "measured) / measured: what the plan's dependencies and resources miss (overlap, waiting, "
      "contention). Cost error = 100 × (predicted − replayed) / replayed: what the profile's op "
      "costs miss. (1 + error) = (1 + composition) × (1 + cost). Noise floor = max(IQR, drift "
      "between the run's halves) of the measured iteration totals, in % of their median. An "
      "unexplained wait is an op's measured start minus the latest measured end among the ops "
      "the plan makes it wait for: > 0, it waited for something the plan does not have.\n\n";
  // The ops that waited longest, pooled by base name over every point's list.
  std::map<std::string, std::pair<double, int>, std::less<>> pooled;
  for (const v1::ValidationConfig& c : s.results()) {
    for (const v1::ValidationPoint& p : c.points()) {
      for (const v1::OpWait& w : p.replay().waits()) {
        auto& [us, n] = pooled[std::string(OpBaseName(w.op()))];
        us += w.unexplained_wait_us();
        ++n;
      }
    }
  }
  std::vector<std::pair<std::string, std::pair<double, int>>> rows(pooled.begin(), pooled.end());
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return std::abs(a.second.first) > std::abs(b.second.first);
  });
  if (!rows.empty()) {
    *md +=
        "Unexplained waits among each point's five largest, pooled by op base name (largest "
        "|sum| first):\n\n| op | listed | sum ms | mean ms |\n|---|---:|---:|---:|\n";
    for (size_t i = 0; i < std::min<size_t>(rows.size(), 10); ++i) {
      const auto& [op, v] = rows[i];
      fmt::format_to(out, "| {} | {} | {} | {} |\n", op, v.second, Ms(v.first),
                     Ms(v.first / v.second));
    }
    *md += "\n";
  }
  *md +=
      "| config | candidate | measured ms | replayed ms | predicted ms | error % | composition % "
      "| cost % | noise floor % | waited / early ms | longest unexplained wait |\n"
      "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
  for (const v1::ValidationConfig& c : s.results()) {
    for (const v1::ValidationPoint& p : c.points()) {
      if (!p.has_replay()) continue;
      const v1::Replay& r = p.replay();
      const std::string wait =
          r.waits().empty()
              ? std::string("–")
              : fmt::format("{} {} ms", r.waits(0).op(), Ms(r.waits(0).unexplained_wait_us()));
      fmt::format_to(out, "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} |\n",
                     Cell(c.name()), Cell(p.candidate()), Ms(p.measured_us()), Ms(r.replayed_us()),
                     Ms(p.predicted_us()), SignedPct(p.error_pct()),
                     SignedPct(r.composition_error_pct()), SignedPct(p.cost_error_pct()),
                     NoiseCell(p), Ms(r.waited_us()), Ms(r.early_us()), Cell(wait));
    }
  }
  *md += "\n";
  if (s.drift_points() == 0) return;
  *md +=
      "### Machine drift\n\n"
      "The speed probe (a fixed GEMM, executor/probe.h) ran after every timed iteration and "
      "after every GEMM sample of the profile. Drift = 100 × (the candidate's median probe / the "
      "profile's median − 1): > 0, the machine computed faster during the run than while it was "
      "profiled. Corrected = the plan simulated again with every compute op's cost times "
      "(profile probe / run probe), against the measured total: the error left once the "
      "machine's speed is taken from the run, as the replay takes the op costs.\n\n"
      "| config | candidate | drift % | predicted ms | corrected ms | measured ms | error % | "
      "corrected error % |\n|---|---|---:|---:|---:|---:|---:|---:|\n";
  for (const v1::ValidationConfig& c : s.results()) {
    for (const v1::ValidationPoint& p : c.points()) {
      if (!p.has_drift()) continue;
      fmt::format_to(out, "| {} | {} | {} | {} | {} | {} | {} | {} |\n", Cell(c.name()),
                     Cell(p.candidate()), SignedPct(p.drift_pct()), Ms(p.predicted_us()),
                     Ms(p.drift_corrected_us()), Ms(p.measured_us()), SignedPct(p.error_pct()),
                     SignedPct(p.drift_corrected_error_pct()));
    }
  }
  *md += "\n";
}

}  // namespace moeplan::calibration::internal
