// `moeplan validate`'s replays (the composition error against the measured
// total, the cost error against the prediction) and noise floors (how far
// the measured total of a candidate moves between iterations of one run).
#include <algorithm>
#include <cmath>
#include <vector>

#include "moeplan/base/stats.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/calibration/validation.h"
#include "validation_internal.h"

namespace moeplan::calibration {

absl::StatusOr<v1::MeasuredNoise> NoiseOf(absl::Span<const double> totals) {
  const int n = static_cast<int>(totals.size());
  if (n < kMinNoiseSamples) {
    return absl::InvalidArgumentError(
        Cat("noise: needs at least ", kMinNoiseSamples, " totals (got ", n, ")"));
  }
  for (double t : totals) {
    if (!std::isfinite(t) || !(t > 0.0)) {
      return absl::InvalidArgumentError(
          Cat("noise: iteration totals must be finite and > 0 (got ", t, ")"));
    }
  }
  const std::vector<double> all(totals.begin(), totals.end());
  const double median = Median(all);
  // Odd counts leave the middle total out of both halves.
  const std::vector<double> first(totals.begin(), totals.begin() + n / 2);
  const std::vector<double> second(totals.begin() + (n + 1) / 2, totals.end());
  v1::MeasuredNoise out;
  out.set_samples(n);
  out.set_iqr_pct(100.0 * (Percentile(all, 75.0) - Percentile(all, 25.0)) / median);
  out.set_halves_pct(100.0 * (Median(second) - Median(first)) / median);
  out.set_floor_pct(std::max(out.iqr_pct(), std::abs(out.halves_pct())));
  return out;
}

namespace {

// A series of the candidate's timed iterations (`probes`: the speed probes,
// else the totals), or an empty span.
absl::Span<const double> SeriesOf(const ValidationInput& in, std::string_view candidate,
                                  bool probes) {
  auto span = [probes](const auto& it) -> absl::Span<const double> {
    const auto& f = probes ? it.probe_gflops() : it.total_us();
    return {f.data(), static_cast<size_t>(f.size())};
  };
  for (const v1::ScheduleIterations& it : in.iterations) {
    if (internal::ScheduleLabel(it.schedule()) == candidate) return span(it);
  }
  for (const v1::VariantIterations& it : in.variant_iterations) {
    if (it.variant() == candidate) return span(it);
  }
  return {};
}

}  // namespace

double RunProbeGflops(const ValidationInput& in, std::string_view candidate) {
  const absl::Span<const double> probes = SeriesOf(in, candidate, /*probes=*/true);
  std::vector<double> ok;
  for (double p : probes) {
    if (!std::isfinite(p) || !(p > 0.0)) return 0.0;
    ok.push_back(p);
  }
  return ok.empty() ? 0.0 : Median(ok);
}

namespace internal {

absl::Status CheckReplays(const ValidationInput& in, const std::vector<Timeline>& measured) {
  for (size_t i = 0; i < in.replays.size(); ++i) {
    const std::string& c = in.replays[i].candidate;
    const std::string where = Cat("config '", in.name, "', ", CandidateNoun(in.IsModel()), " ", c);
    if (Find(measured, c) == nullptr)
      return absl::InvalidArgumentError(Cat(where, ": replayed, not measured"));
    for (size_t j = 0; j < i; ++j) {
      if (in.replays[j].candidate == c) {
        return absl::InvalidArgumentError(Cat(where, ": replayed twice"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status AddReplayAndNoise(const ValidationInput& in, v1::ValidationPoint* pt, ReplayTally* t) {
  for (const ValidationInput::CandidateReplay& r : in.replays) {
    if (r.candidate != pt->candidate()) continue;
    *pt->mutable_replay() = r.replay;
    const double replayed = r.replay.replayed_us();
    if (std::isfinite(replayed) && replayed > 0.0) {
      pt->set_cost_error_pct(100.0 * (pt->predicted_us() - replayed) / replayed);
      t->composition.push_back(r.replay.composition_error_pct());
      t->cost.push_back(pt->cost_error_pct());
    }
    if (r.has_drift && std::isfinite(r.drift_corrected_us) && r.drift_corrected_us > 0.0) {
      pt->set_has_drift(true);
      pt->set_drift_pct(r.drift_pct);
      pt->set_drift_corrected_us(r.drift_corrected_us);
      pt->set_drift_corrected_error_pct(100.0 * (r.drift_corrected_us - pt->measured_us()) /
                                        pt->measured_us());
      t->drift.push_back(r.drift_pct);
      t->corrected.push_back(pt->drift_corrected_error_pct());
    }
  }
  const absl::Span<const double> totals = SeriesOf(in, pt->candidate(), /*probes=*/false);
  if (static_cast<int>(totals.size()) < kMinNoiseSamples) return absl::OkStatus();
  absl::StatusOr<v1::MeasuredNoise> noise = NoiseOf(totals);
  if (!noise.ok()) {
    return absl::InvalidArgumentError(Cat("config '", in.name, "', ", CandidateNoun(in.IsModel()),
                                          " ", pt->candidate(), ": ",
                                          View(noise.status().message())));
  }
  *pt->mutable_noise() = *noise;
  const double floor = noise->floor_pct();
  pt->set_within_noise(std::abs(pt->error_pct()) <= floor);
  t->floors.push_back(floor);
  t->within += pt->within_noise();
  t->within_twice += std::abs(pt->error_pct()) <= 2.0 * floor;
  t->composition_within +=
      pt->has_replay() && std::abs(pt->replay().composition_error_pct()) <= floor;
  return absl::OkStatus();
}

void FinishReplayAndNoise(const ReplayTally& t, v1::ValidationSummary* s) {
  s->set_min_noise_samples(kMinNoiseSamples);
  const ErrorStats comp = StatsOf(t.composition);
  const ErrorStats cost = StatsOf(t.cost);
  s->set_replayed_points(comp.count);
  s->set_composition_mape_pct(comp.mape);
  s->set_composition_p90_pct(comp.p90);
  s->set_composition_max_pct(comp.max);
  s->set_composition_mean_signed_pct(comp.mean_signed);
  s->set_cost_mape_pct(cost.mape);
  s->set_cost_p90_pct(cost.p90);
  s->set_cost_max_pct(cost.max);
  s->set_cost_mean_signed_pct(cost.mean_signed);
  s->set_noise_points(static_cast<int>(t.floors.size()));
  if (!t.floors.empty()) s->set_median_noise_floor_pct(Median(t.floors));
  s->set_within_noise_points(t.within);
  s->set_within_twice_noise_points(t.within_twice);
  s->set_composition_within_noise_points(t.composition_within);
  const ErrorStats corrected = StatsOf(t.corrected);
  s->set_drift_points(corrected.count);
  if (!t.drift.empty()) s->set_median_drift_pct(Median(t.drift));
  s->set_drift_corrected_mape_pct(corrected.mape);
  s->set_drift_corrected_p90_pct(corrected.p90);
  s->set_drift_corrected_max_pct(corrected.max);
  s->set_drift_corrected_mean_signed_pct(corrected.mean_signed);
}

}  // namespace internal
}  // namespace moeplan::calibration
