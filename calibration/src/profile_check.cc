// Stale-profile detection (profile_check.h).
#include "moeplan/calibration/profile_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

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

}  // namespace

absl::StatusOr<ProfileCheckResult> CheckProfile(const v1::ClusterProfile& profile,
                                                const std::vector<v1::ProfileSample>& samples,
                                                double threshold_pct) {
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
  // The isolated model: the check times ops alone, as the sweep did.
  v1::ClusterProfile alone = profile;
  alone.clear_context();
  MOEPLAN_ASSIGN_OR_RETURN(planner::ClusterProfile converted, proto::ProfileFromProto(alone));
  MOEPLAN_ASSIGN_OR_RETURN(const planner::CostModel cost,
                           planner::CostModel::Create(std::move(converted)));

  // The sweep's own measurements where the profile kept them: drift is then
  // measured against measured, free of the fitted lines' own error.
  std::map<std::string, const v1::ReferencePoint*> reference;
  for (const v1::ReferencePoint& r : profile.provenance().reference()) {
    if (r.median_us() > 0.0) reference[r.point()] = &r;
  }
  // Several rounds of one point (moeplan-profile --check --rounds): its median.
  using Rounds = std::map<std::string, std::vector<double>>;  // point label -> medians
  Rounds rounds;
  std::vector<std::pair<const v1::ProfileSample*, const Rounds::value_type*>> points;
  for (const v1::ProfileSample& s : samples) {
    if (!(s.median_us() > 0.0)) continue;
    const auto [it, first] = rounds.try_emplace(internal::PointLabel(s));
    if (first) points.emplace_back(&s, &*it);
    it->second.push_back(s.median_us());
  }
  int against_reference = 0, compared = 0;
  std::map<std::string, std::vector<Point>> terms;  // ordered: a stable table
  for (const auto& [point, seen] : points) {
    const v1::ProfileSample& s = *point;
    const double measured = Median(seen->second);
    std::string term, label;
    double predicted = 0.0;
    switch (s.op_case()) {
      case v1::ProfileSample::kGemm: {
        const v1::GemmSample& g = s.gemm();
        term = "gemm";
        label = fmt::format("gemm {}x{}x{}", g.m(), g.n(), g.k());
        predicted = cost.GemmUs(g.m(), g.n(), g.k());
        break;
      }
      case v1::ProfileSample::kMemory: {
        const v1::MemorySample& m = s.memory();
        const bool act = m.kernel() == "gelu" || m.kernel() == "gelu_bwd";
        term = act ? "activation" : "memory";
        label = fmt::format("{} {}", m.kernel(), FormatBytes(double(m.bytes())));
        predicted = internal::MemoryKernelUs(cost, m.kernel(), double(m.bytes()));
        break;
      }
      case v1::ProfileSample::kCollective: {
        const v1::CollectiveSample& c = s.collective();
        MOEPLAN_ASSIGN_OR_RETURN(planner::Collective coll,
                                 proto::CollectiveFromProto(c.collective(), "collective"));
        const planner::GroupShape shape{c.shape().ranks(), c.shape().nodes()};
        const bool pair = coll == planner::Collective::kSendRecv && shape.ranks == 2;
        term = pair ? (shape.nodes == 1 ? "intra link" : "inter link")
                    : Cat(proto::CollectiveLabel(c.collective()), " ",
                          internal::ShapeName(shape.ranks, shape.nodes));
        label =
            Cat(proto::CollectiveLabel(c.collective()), " ",
                internal::ShapeName(shape.ranks, shape.nodes), " ", FormatBytes(double(c.bytes())));
        predicted = cost.CollectiveUs(coll, shape, double(c.bytes()));
        break;
      }
      default:
        continue;  // SAA: composed of the above
    }
    double spread = 0.0;
    if (auto it = reference.find(seen->first); it != reference.end()) {
      predicted = it->second->median_us();
      spread = it->second->spread_pct();
      ++against_reference;
    }
    if (!(predicted > 0.0)) continue;
    ++compared;
    terms[term].push_back({label, measured / predicted, spread});
  }
  ProfileCheckResult r;
  if (against_reference == compared) {
    r.notes.push_back(
        Cat("compared with the profile's own measurements at all ", compared, " points"));
  } else {
    r.notes.push_back(Cat("compared with the profile's own measurements at ", against_reference,
                          " of ", compared,
                          " points, the rest with its fitted model (whose own error then counts "
                          "as drift: re-calibrate to record the measurements)"));
  }
  for (auto& [term, pts] : terms) {
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
    r.stale = r.stale || row.stale;
    r.rows.push_back(std::move(row));
  }
  const v1::Provenance& was = profile.provenance();
  if (profile.source() == v1::PROFILE_SOURCE_SPEC) {
    r.notes.push_back("the profile is derived from specifications, not measured here");
  } else if (!profile.has_provenance()) {
    r.notes.push_back("the profile records no provenance (where and when it was measured)");
  } else {
    if (!was.machine().empty() && !run.machine().empty() && was.machine() != run.machine()) {
      r.notes.push_back(
          fmt::format("other machine: the profile was measured on \"{}\", this is \"{}\"",
                      was.machine(), run.machine()));
    }
    if (!was.backend().empty() && was.backend() != run.backend()) {
      r.notes.push_back(fmt::format("other backend: the profile was measured with {}, this with {}",
                                    was.backend(), run.backend()));
    }
    r.notes.push_back(Cat("profile ", ProvenanceLine(profile)));
  }
  r.notes.push_back(Cat("checked now on ", run.host(), " at ", run.timestamp()));
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
