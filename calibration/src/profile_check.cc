// Stale-profile detection (profile_check.h).
#include "moeplan/calibration/profile_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fit_internal.h"
#include "moeplan/base/format.h"
#include "moeplan/base/stats.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/proto/convert.h"

namespace moeplan::calibration {
namespace {

struct Point {
  std::string label;
  double ratio = 1.0;       // measured / predicted
  double spread_pct = 0.0;  // its rounds' disagreement at calibration
};

absl::Status CheckInputs(const v1::ClusterProfile& profile,
                         const std::vector<v1::ProfileSample>& samples, double threshold_pct) {
  if (samples.empty()) return absl::InvalidArgumentError("profile-check: no samples to compare");
  if (!(threshold_pct > 0.0) || !std::isfinite(threshold_pct)) {
    return absl::InvalidArgumentError(
        Cat("--threshold-pct: must be finite and > 0 (got ", threshold_pct, ")"));
  }
  const v1::ProfileRun& run = samples.front().run();
  if (run.nodes() != profile.nodes() || run.ranks_per_node() != profile.gpus_per_node()) {
    return absl::FailedPreconditionError(fmt::format(
        "profile-check ran on {} node(s) x {} ranks, profile {} describes {} x {}: run it where "
        "the profile is meant to plan (e.g. inside scripts/testbed/testbed.sh with the same "
        "--nodes)",
        run.nodes(), run.ranks_per_node(), profile.name(), profile.nodes(),
        profile.gpus_per_node()));
  }
  return absl::OkStatus();
}

// The isolated model: the check times ops alone, as the sweep did.
absl::StatusOr<planner::CostModel> IsolatedModel(const v1::ClusterProfile& profile) {
  v1::ClusterProfile alone = profile;
  alone.clear_context();
  MOEPLAN_ASSIGN_OR_RETURN(planner::ClusterProfile converted, proto::ProfileFromProto(alone));
  return planner::CostModel::Create(std::move(converted));
}

// One point the check measured: its first sample and the medians of its
// rounds (moeplan-profile --check --rounds), in the samples' order.
struct Measured {
  const v1::ProfileSample* sample;
  std::string label;
  std::vector<double> medians;
};

// A sample the check can judge with: a finite, positive median and no wrong
// elements (the profiler's correctness check; calibrate refuses them too).
bool Valid(const v1::ProfileSample& s) {
  return s.median_us() > 0.0 && std::isfinite(s.median_us()) && s.wrong_elements() == 0;
}

std::vector<Measured> GroupRounds(const std::vector<v1::ProfileSample>& samples) {
  std::map<std::string, size_t> index;  // point label -> its entry
  std::vector<Measured> points;
  for (const v1::ProfileSample& s : samples) {
    if (!Valid(s)) continue;
    std::string label = internal::PointLabel(s);
    const auto [it, first] = index.try_emplace(label, points.size());
    if (first) points.push_back({&s, std::move(label), {}});
    points[it->second].medians.push_back(s.median_us());
  }
  return points;
}

// What the profile's model predicts for one sample, the term it belongs to
// and the point's name in the table.
struct Prediction {
  std::string term, label;
  double us = 0.0;
};

// nullopt: a sample the check does not compare (SAA: composed of the others).
absl::StatusOr<std::optional<Prediction>> Predict(const planner::CostModel& cost,
                                                  const v1::ProfileSample& s) {
  Prediction out;
  switch (s.op_case()) {
    case v1::ProfileSample::kGemm: {
      const v1::GemmSample& g = s.gemm();
      out.term = "gemm";
      out.label = fmt::format("gemm {}x{}x{}", g.m(), g.n(), g.k());
      out.us = cost.GemmUs(g.m(), g.n(), g.k());
      return out;
    }
    case v1::ProfileSample::kMemory: {
      const v1::MemorySample& m = s.memory();
      const bool act = m.kernel() == "gelu" || m.kernel() == "gelu_bwd";
      out.term = act ? "activation" : "memory";
      out.label = fmt::format("{} {}", m.kernel(), FormatBytes(double(m.bytes())));
      out.us = internal::MemoryKernelUs(cost, m.kernel(), double(m.bytes()));
      return out;
    }
    case v1::ProfileSample::kCollective: {
      const v1::CollectiveSample& c = s.collective();
      MOEPLAN_ASSIGN_OR_RETURN(planner::Collective coll,
                               proto::CollectiveFromProto(c.collective(), "collective"));
      const planner::GroupShape shape{c.shape().ranks(), c.shape().nodes()};
      const bool pair = coll == planner::Collective::kSendRecv && shape.ranks == 2;
      out.term = pair ? (shape.nodes == 1 ? "intra link" : "inter link")
                      : Cat(proto::CollectiveLabel(c.collective()), " ",
                            internal::ShapeName(shape.ranks, shape.nodes));
      out.label =
          Cat(proto::CollectiveLabel(c.collective()), " ",
              internal::ShapeName(shape.ranks, shape.nodes), " ", FormatBytes(double(c.bytes())));
      out.us = cost.CollectiveUs(coll, shape, double(c.bytes()));
      return out;
    }
    default:
      return std::nullopt;
  }
}

// Every compared point's ratio, by term (ordered: a stable table), against
// the sweep's own measurement where the profile kept it (drift is then
// measured against measured, free of the fitted lines' own error), else
// against the model. Adds a note saying which.
absl::StatusOr<std::map<std::string, std::vector<Point>>> CompareTerms(
    const v1::ClusterProfile& profile, const planner::CostModel& cost,
    const std::vector<v1::ProfileSample>& samples, std::vector<std::string>* notes) {
  std::map<std::string, const v1::ReferencePoint*> reference;
  for (const v1::ReferencePoint& r : profile.provenance().reference()) {
    if (r.median_us() > 0.0) reference[r.point()] = &r;
  }
  int against_reference = 0, compared = 0;
  std::map<std::string, std::vector<Point>> terms;
  for (const Measured& point : GroupRounds(samples)) {
    const double measured = Median(point.medians);
    MOEPLAN_ASSIGN_OR_RETURN(std::optional<Prediction> predicted, Predict(cost, *point.sample));
    if (!predicted) continue;
    double spread = 0.0;
    if (auto it = reference.find(point.label); it != reference.end()) {
      predicted->us = it->second->median_us();
      spread = it->second->spread_pct();
      ++against_reference;
    }
    if (!(predicted->us > 0.0)) continue;
    ++compared;
    terms[predicted->term].push_back({predicted->label, measured / predicted->us, spread});
  }
  if (compared < kMinCheckPoints) {
    int wrong = 0;
    for (const v1::ProfileSample& s : samples) wrong += s.wrong_elements() != 0 ? 1 : 0;
    int valid = 0;
    for (const v1::ProfileSample& s : samples) valid += Valid(s) ? 1 : 0;
    return absl::InvalidArgumentError(fmt::format(
        "samples: profile-check needs at least {} valid points to judge a profile (got {} valid "
        "of {} samples, {} compared; {} with wrong elements, {} without a finite median > 0)",
        kMinCheckPoints, valid, samples.size(), compared, wrong,
        samples.size() - static_cast<size_t>(valid) - static_cast<size_t>(wrong)));
  }
  if (against_reference == compared) {
    notes->push_back(
        Cat("compared with the profile's own measurements at all ", compared, " points"));
  } else {
    notes->push_back(Cat("compared with the profile's own measurements at ", against_reference,
                         " of ", compared,
                         " points, the rest with its fitted model (whose own error then counts "
                         "as drift: re-calibrate to record the measurements)"));
  }
  return terms;
}

DriftRow SummariseTerm(const std::string& term, const std::vector<Point>& pts,
                       double threshold_pct) {
  DriftRow row;
  row.term = term;
  row.points = static_cast<int>(pts.size());
  std::vector<double> ratios, spreads;
  for (const Point& p : pts) {
    ratios.push_back(p.ratio);
    spreads.push_back(p.spread_pct);
  }
  row.drift_pct = (Median(ratios) - 1.0) * 100.0;
  row.noise_pct = Median(std::move(spreads));
  row.band_pct = std::max(threshold_pct, row.noise_pct);
  const auto worst = std::max_element(pts.begin(), pts.end(), [](const Point& a, const Point& b) {
    return std::abs(a.ratio - 1.0) < std::abs(b.ratio - 1.0);
  });
  row.worst_pct = (worst->ratio - 1.0) * 100.0;
  row.worst_point = worst->label;
  row.stale = std::abs(row.drift_pct) > row.band_pct;
  return row;
}

// Where and when the profile was measured, against this run.
void AddProvenanceNotes(const v1::ClusterProfile& profile, const v1::ProfileRun& run,
                        std::vector<std::string>* notes) {
  const v1::Provenance& was = profile.provenance();
  if (profile.source() == v1::PROFILE_SOURCE_SPEC) {
    notes->push_back("the profile is derived from specifications, not measured here");
  } else if (!profile.has_provenance()) {
    notes->push_back("the profile records no provenance (where and when it was measured)");
  } else {
    if (!was.machine().empty() && !run.machine().empty() && was.machine() != run.machine()) {
      notes->push_back(
          fmt::format("other machine: the profile was measured on \"{}\", this is \"{}\"",
                      was.machine(), run.machine()));
    }
    if (!was.backend().empty() && was.backend() != run.backend()) {
      notes->push_back(fmt::format("other backend: the profile was measured with {}, this with {}",
                                   was.backend(), run.backend()));
    }
    notes->push_back(Cat("profile ", ProvenanceLine(profile)));
  }
  notes->push_back(Cat("checked now on ", run.host(), " at ", run.timestamp()));
}

// The speed probe's median over the check's GEMM points against the
// profile's reference (Provenance.probe_gflops): how much faster the machine
// computes now, which the GEMM drift then includes.
void AddProbeNote(const v1::ClusterProfile& profile, const std::vector<v1::ProfileSample>& samples,
                  std::vector<std::string>* notes) {
  const double was = profile.provenance().probe_gflops();
  const double now = internal::ReferenceProbe(samples);
  if (!(was > 0.0) || !(now > 0.0)) return;
  const double pct = 100.0 * (now / was - 1.0);
  notes->push_back(fmt::format(
      "speed probe: {:.3g} GFLOP/s now against {:.3g} when profiled: the machine computes "
      "{:.1f} % {} (the GEMM drift above includes it; docs/calibration.md \"Machine drift\")",
      now, was, std::abs(pct), pct >= 0.0 ? "faster" : "slower"));
}

}  // namespace

absl::StatusOr<ProfileCheckResult> CheckProfile(const v1::ClusterProfile& profile,
                                                const std::vector<v1::ProfileSample>& samples,
                                                double threshold_pct) {
  MOEPLAN_RETURN_IF_ERROR(CheckInputs(profile, samples, threshold_pct));
  MOEPLAN_ASSIGN_OR_RETURN(const planner::CostModel cost, IsolatedModel(profile));
  ProfileCheckResult r;
  MOEPLAN_ASSIGN_OR_RETURN(const auto terms, CompareTerms(profile, cost, samples, &r.notes));
  for (const auto& [term, pts] : terms) {
    r.rows.push_back(SummariseTerm(term, pts, threshold_pct));
    r.stale = r.stale || r.rows.back().stale;
  }
  AddProvenanceNotes(profile, samples.front().run(), &r.notes);
  AddProbeNote(profile, samples, &r.notes);
  return r;
}

std::string RenderProfileCheck(const v1::ClusterProfile& profile, const ProfileCheckResult& r,
                               double threshold_pct) {
  std::string out =
      fmt::format("profile-check {} (version {}): drift = measured now / the profile - 1\n",
                  profile.name(), profile.version());
  size_t w = 4;
  for (const DriftRow& row : r.rows) w = std::max(w, row.term.size());
  out += fmt::format("{:<{}}  {:>6}  {:>8}  {:>7}  {:>8}  {}\n", "term", w, "points", "drift %",
                     "noise %", "worst %", "worst point");
  for (const DriftRow& row : r.rows) {
    out += fmt::format("{:<{}}  {:>6}  {:>+8.1f}  {:>7.1f}  {:>+8.1f}  {}{}\n", row.term, w,
                       row.points, row.drift_pct, row.noise_pct, row.worst_pct, row.worst_point,
                       row.stale ? "  STALE" : "");
  }
  for (const std::string& n : r.notes) out += Cat("note: ", n, "\n");
  int stale = 0;
  for (const DriftRow& row : r.rows) stale += row.stale ? 1 : 0;
  out += r.stale ? fmt::format(
                       "verdict: STALE: {} of {} terms drifted more than {:g} % (or their "
                       "noise %) from the profile; re-measure it (moeplan-profile, moeplan "
                       "calibrate)\n",
                       stale, r.rows.size(), threshold_pct)
                 : fmt::format(
                       "verdict: fresh: every term within {:g} % (or its noise %) of the "
                       "profile\n",
                       threshold_pct);
  return out;
}

}  // namespace moeplan::calibration
