// Collectives: alpha-beta per (collective, group shape), the two link levels,
// and the SAA cross-check of the planner's composition.
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <tuple>

#include "fit_internal.h"
#include "moeplan/base/format.h"
#include "moeplan/base/status.h"
#include "moeplan/planner/op_graph.h"
#include "moeplan/planner/schedules.h"
#include "moeplan/planner/simulator.h"
#include "moeplan/proto/convert.h"

namespace moeplan::calibration::internal {
namespace {

using GroupKey = std::tuple<bool, int, int, int>;  // in context, collective, ranks, nodes

// The fit of one group's points: a line, or pieces when one line does not
// hold and a piecewise line is closer (regimes: protocol or algorithm
// switches, caches). The row then reports the pieces' quality; `line` stays
// the profile's single cost.
struct GroupFit {
  LineFit line;
  std::vector<std::pair<double, LineFit>> pieces;  // empty: the line alone
  FitQuality quality;
};

GroupFit FitGroup(std::string what, const std::vector<Obs>& pts, const CalibrateOptions& options) {
  const double tol = options.tolerance;
  GroupFit g;
  g.line = FitPoints(pts, tol);
  g.quality = {std::move(what), g.line, {}};
  if (g.line.max_rel_err > tol && DistinctSizes(pts) >= 4) {
    g.pieces = FitPieces(pts, tol);
    std::vector<Obs> obs = pts;
    for (Obs& o : obs) {
      size_t k = g.pieces.size() - 1;
      while (k > 0 && o.n < g.pieces[k].first) --k;
      o.pred = g.pieces[k].second.alpha_us + g.pieces[k].second.beta_us_per_byte * o.n;
    }
    LineFit pw = g.line;
    FillQuality(std::move(obs), tol, &pw);
    if (g.pieces.size() > 1 && pw.max_rel_err < g.line.max_rel_err) {
      g.quality.fit = pw;
      g.quality.what += Cat(" (", g.pieces.size(), " pieces)");
    } else {
      g.pieces.clear();
    }
  }
  LineWarnings(g.quality, options, "small messages", "large messages", &g.quality.warnings);
  return g;
}

void AddCollectiveFit(v1::Collective coll, int ranks, int nodes, const GroupFit& g,
                      v1::CollectiveFit* f) {
  f->set_collective(coll);
  f->mutable_shape()->set_ranks(ranks);
  f->mutable_shape()->set_nodes(nodes);
  SetAlphaBeta(g.line, f->mutable_cost());
  for (const auto& [from, piece] : g.pieces) {
    v1::FitPiece* fp = f->add_pieces();
    fp->set_from_bytes(ToInt64(from));
    SetAlphaBeta(piece, fp->mutable_cost());
  }
  f->set_r_squared(g.quality.fit.r_squared);
  f->set_min_bytes(g.quality.fit.min_bytes);
  f->set_max_bytes(g.quality.fit.max_bytes);
}

// Link costs: the pair SendRecv on each level. A level the run has no pair on
// (one node; one rank per node) copies the other level, with a warning: plans
// crossing it will be optimistic or pessimistic, but they can be made.
absl::Status FitLinks(const v1::ProfileRun& run, std::optional<LineFit> intra,
                      std::optional<LineFit> inter, Calibration* out) {
  constexpr std::string_view kNoIntra =
      "no SendRecv sweep on 2 ranks / 1 node (at least 2 sizes): the planner needs the "
      "intra-node link cost (alpha, beta)";
  if (!intra && !inter) return Bad("samples", kNoIntra);
  if (!intra) {
    if (run.ranks_per_node() >= 2) return Bad("samples", kNoIntra);
    intra = inter;
    out->warnings.push_back(
        "intra link not measured (one rank per node): links.intra copies links.inter");
  }
  if (!inter) {
    if (run.nodes() >= 2) {
      return Bad("samples",
                 "no SendRecv sweep on 2 ranks / 2 nodes (at least 2 sizes): the planner needs "
                 "the inter-node link cost (alpha, beta)");
    }
    inter = intra;
    out->warnings.push_back(
        "inter link not measured (single-node run): links.inter copies links.intra, so plans "
        "that span nodes will look far too cheap");
  }
  SetAlphaBeta(*intra, out->profile.mutable_links()->mutable_intra());
  SetAlphaBeta(*inter, out->profile.mutable_links()->mutable_inter());
  return absl::OkStatus();
}

}  // namespace

absl::Status FitCollectives(const std::vector<v1::ProfileSample>& samples,
                            const CalibrateOptions& options, Calibration* out) {
  // Ordered: a stable profile and report, isolated fits first.
  std::map<GroupKey, std::vector<Obs>> groups;
  double phase_us = 0.0;
  for (const v1::ProfileSample& s : samples) {
    if (s.op_case() != v1::ProfileSample::kCollective) continue;
    const v1::CollectiveSample& c = s.collective();
    if (Irregular(c)) continue;  // FitUneven
    const bool in_context = c.context_us() > 0.0;
    if (in_context && phase_us > 0.0 && c.context_us() != phase_us) {
      return Bad("samples", Cat("in-context samples after compute phases of ", phase_us, " and ",
                                c.context_us(), " us: fit one --context-ms per profile"));
    }
    if (in_context) phase_us = c.context_us();
    groups[{in_context, c.collective(), c.shape().ranks(), c.shape().nodes()}].push_back(
        {static_cast<double>(c.bytes()), s.median_us(), 0.0});
  }
  if (phase_us > 0.0) out->profile.mutable_context()->set_compute_phase_us(phase_us);
  std::optional<LineFit> intra, inter;
  for (const auto& [key, pts] : groups) {
    const auto [in_context, coll_int, ranks, nodes] = key;
    const auto coll = static_cast<v1::Collective>(coll_int);
    const bool send_recv = !in_context && coll == v1::COLLECTIVE_SEND_RECV && ranks == 2;
    const bool is_intra = send_recv && nodes == 1, is_inter = send_recv && nodes == 2;
    std::string what = Cat(proto::CollectiveLabel(coll), " ", ShapeName(ranks, nodes),
                           in_context ? " in context" : "");
    if (DistinctSizes(pts) < 2) {
      out->warnings.push_back(Cat(what, ": only one size measured (", FormatBytes(pts.front().n),
                                  "), not fitted; the planner derives it from the link costs"));
      continue;
    }
    if (is_intra) what += " (intra link)";
    if (is_inter) what += " (inter link)";
    GroupFit g = FitGroup(std::move(what), pts, options);
    AddCollectiveFit(coll, ranks, nodes, g,
                     in_context ? out->profile.mutable_context()->add_collectives()
                                : out->profile.add_collectives());
    if (is_intra) intra = g.quality.fit;
    if (is_inter) inter = g.quality.fit;
    out->fits.push_back(std::move(g.quality));
  }
  return FitLinks(samples.front().run(), intra, inter, out);
}

// Dual (ReduceScatter + AlltoAll) samples have no public builder to compare
// with: they stay measured only.
absl::Status CompareSaa(const std::vector<v1::ProfileSample>& samples,
                        const planner::CostModel& cost, double tolerance, Calibration* out) {
  // In context, a2a ranks, nodes, gather ranks, nodes, a2a ranks per node.
  using SaaKey = std::tuple<bool, int, int, int, int, int>;
  std::map<SaaKey, std::vector<Obs>> saa;
  planner::OpGraph graph;
  planner::SimResult sim;
  planner::Simulator simulator;
  for (const v1::ProfileSample& s : samples) {
    if (s.op_case() != v1::ProfileSample::kSaa || s.saa().dual()) continue;
    const v1::SaaSample& a = s.saa();
    const planner::GroupShape a2a{a.a2a().ranks(), a.a2a().nodes()};
    const planner::GroupShape gather{a.gather().ranks(), a.gather().nodes()};
    const double bytes = static_cast<double>(a.bytes());
    graph.Clear();
    planner::AppendSaa(cost, a2a, a.a2a_ranks_per_node(), gather, bytes, bytes / a2a.ranks,
                       planner::Phase::kForward, planner::kNoOp, &graph);
    MOEPLAN_RETURN_IF_ERROR(simulator.Run(graph, &sim));
    saa[{a.context_us() > 0.0, a2a.ranks, a2a.nodes, gather.ranks, gather.nodes,
         a.a2a_ranks_per_node()}]
        .push_back({bytes, s.median_us(), sim.makespan_us});
  }
  for (const auto& [key, obs] : saa) {
    const auto [in_context, ar, an, gr, gn, rpn] = key;
    FitQuality q{
        Cat("saa a2a ", ar, "x", an, " / gather ", gr, "x", gn, in_context ? " in context" : ""),
        {},
        {}};
    FillQuality(obs, tolerance, &q.fit);
    if (q.fit.max_rel_err > tolerance) {
      q.warnings.push_back(Cat(q.what, ": the planner's SAA composition is off by up to ",
                               FormatPercent(q.fit.max_rel_err), " against the fused measurement",
                               HoldsRange(q.fit, tolerance)));
    }
    out->fits.push_back(std::move(q));
  }
  return absl::OkStatus();
}

// "0.35": gamma to two decimals.
std::string FormatGamma(double gamma) { return fmt::format("{:.2f}", gamma); }

absl::Status FitUneven(const std::vector<v1::ProfileSample>& samples,
                       const planner::CostModel& cost, double tolerance, Calibration* out) {
  struct Point {
    double bytes, load, measured_us;
    double base_us = 0.0;  // the even irregular sample of this size; 0: none
  };
  std::map<std::pair<int, int>, std::vector<Point>> shapes;  // (ranks, nodes)
  std::map<std::tuple<int, int, int64_t>, double> base;      // (ranks, nodes, bytes) -> us
  for (const v1::ProfileSample& s : samples) {
    if (s.op_case() != v1::ProfileSample::kCollective || !Irregular(s.collective())) continue;
    const v1::CollectiveSample& c = s.collective();
    if (c.load_ratio() == 1.0) {
      base[{c.shape().ranks(), c.shape().nodes(), c.bytes()}] = s.median_us();
      continue;
    }
    shapes[{c.shape().ranks(), c.shape().nodes()}].push_back(
        {static_cast<double>(c.bytes()), c.load_ratio(), s.median_us()});
  }
  for (auto& [key, pts] : shapes) {
    for (Point& p : pts) {
      const auto it = base.find({key.first, key.second, static_cast<int64_t>(p.bytes)});
      if (it != base.end()) p.base_us = it->second;
    }
  }
  for (const auto& [key, pts] : shapes) {
    const planner::GroupShape shape{key.first, key.second};
    // gamma in [0, 1] by least squares on log(model / measured), every size
    // weighing alike (a grid of 1/200 steps: the error is not smooth where the
    // even fit is piecewise).
    auto even = [&](double bytes) {
      return cost.CollectiveUs(planner::Collective::kAllToAll, shape, bytes);
    };
    auto model = [&](const Point& p, double gamma) {
      const double skewed = even(p.bytes * (1.0 + gamma * (p.load - 1.0)));
      return p.base_us > 0.0 ? p.base_us * skewed / even(p.bytes) : skewed;
    };
    double best_gamma = 1.0, best = std::numeric_limits<double>::infinity();
    for (int i = 0; i <= 200; ++i) {
      const double gamma = i / 200.0;
      double sse = 0.0;
      for (const Point& p : pts) {
        const double e = std::log(model(p, gamma) / p.measured_us);
        sse += e * e;
      }
      if (sse < best) {
        best = sse;
        best_gamma = gamma;
      }
    }
    std::map<double, std::vector<Obs>> by_load;
    double max_err = 0.0;
    for (const Point& p : pts) {
      const double pred = model(p, best_gamma);
      by_load[p.load].push_back({p.bytes, p.measured_us, pred});
      max_err = std::max(max_err, std::abs(pred / p.measured_us - 1.0));
    }
    v1::AlltoAllSkew* fit = out->profile.add_alltoall_skew();
    fit->mutable_shape()->set_ranks(shape.ranks);
    fit->mutable_shape()->set_nodes(shape.nodes);
    fit->set_gamma(best_gamma);
    fit->set_samples(static_cast<int>(pts.size()));
    fit->set_max_error_pct(100.0 * max_err);
    for (const auto& [load, obs] : by_load) {
      FitQuality q{Cat("alltoall ", ShapeName(shape.ranks, shape.nodes), " heaviest ", load,
                       "x (gamma ", FormatGamma(best_gamma), ")"),
                   {},
                   {}};
      FillQuality(obs, tolerance, &q.fit);
      if (q.fit.max_rel_err > tolerance) {
        q.warnings.push_back(Cat(q.what, ": an even AlltoAll of (1 + gamma (", load,
                                 " - 1)) times the bytes is off by up to ",
                                 FormatPercent(q.fit.max_rel_err), HoldsRange(q.fit, tolerance)));
      }
      out->fits.push_back(std::move(q));
    }
  }
  return absl::OkStatus();
}

}  // namespace moeplan::calibration::internal
