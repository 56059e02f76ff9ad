// Calibrate(): checks the samples, runs one fitter per model (fit_internal.h)
// and makes sure the planner accepts what was fitted; and the fit report.
#include "moeplan/calibration/fit.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "fit_internal.h"
#include "moeplan/base/format.h"
#include "moeplan/base/status.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/proto/convert.h"

namespace moeplan::calibration {
namespace {

using internal::Bad;

absl::Status CheckOptions(const CalibrateOptions& options) {
  MOEPLAN_RETURN_IF_ERROR(internal::CheckName(options.name));
  if (!(options.tolerance >= 0.0) || !std::isfinite(options.tolerance)) {
    return Bad("tolerance", Cat("must be finite and >= 0 (got ", options.tolerance, ")"));
  }
  if (options.version < 1) return Bad("version", "must be >= 1 (got 0)");
  if (!(options.repeat_tolerance >= 0.0) || !std::isfinite(options.repeat_tolerance)) {
    return Bad("repeat_tolerance",
               Cat("must be finite and >= 0 (got ", options.repeat_tolerance, ")"));
  }
  if (!(options.gpu_memory_gib >= 0.0) || !std::isfinite(options.gpu_memory_gib)) {
    return Bad("gpu_memory_gib", Cat("must be finite and >= 0 (got ", options.gpu_memory_gib, ")"));
  }
  return absl::OkStatus();
}

void SetHeader(const v1::ProfileRun& run, const CalibrateOptions& options,
               v1::ClusterProfile* prof) {
  prof->set_schema_version(1);
  prof->set_name(options.name);
  prof->set_version(options.version);
  prof->set_source(v1::PROFILE_SOURCE_MEASURED);
  prof->set_comment(internal::RunComment(run, options.comment));
  prof->set_nodes(run.nodes());
  prof->set_gpus_per_node(run.ranks_per_node());
  if (options.gpu_memory_gib > 0.0) prof->set_gpu_memory_gib(options.gpu_memory_gib);
  v1::Provenance* where = prof->mutable_provenance();
  if (run.hosts().empty() && !run.host().empty()) {
    where->add_hosts(run.host());
  } else {
    *where->mutable_hosts() = run.hosts();
  }
  where->set_backend(run.backend());
  where->set_dtype(run.dtype());
  where->set_versions(run.versions());
  where->set_measured_at(run.timestamp());
  where->set_machine(run.machine());
  where->set_mpi_wait(run.mpi_wait());
  where->set_ranks(run.ranks());
}

// CalibrateOptions::comm_from: everything the samples of one rank cannot measure.
absl::Status CheckCommFrom(const std::vector<v1::ProfileSample>& samples,
                           const v1::ClusterProfile& from) {
  for (const v1::ProfileSample& s : samples) {
    if (s.has_collective() || s.has_saa()) {
      return Bad("comm_from", Cat("the samples measured communication (", internal::PointLabel(s),
                                  "): fit it from them, or leave out the profile to take it from"));
    }
  }
  if (from.nodes() < 1 || from.gpus_per_node() < 1 || !from.has_links()) {
    return Bad("comm_from", Cat("profile '", from.name(), "' has no node layout or links"));
  }
  return absl::OkStatus();
}

void CopyCommunication(const v1::ClusterProfile& from, Calibration* out) {
  v1::ClusterProfile& p = out->profile;
  p.set_nodes(from.nodes());
  p.set_gpus_per_node(from.gpus_per_node());
  if (p.gpu_memory_gib() <= 0.0) p.set_gpu_memory_gib(from.gpu_memory_gib());
  *p.mutable_links() = from.links();
  *p.mutable_collectives() = from.collectives();
  *p.mutable_alltoall_skew() = from.alltoall_skew();
  if (from.has_context()) *p.mutable_context() = from.context();
  const std::string what = Cat("profile '", from.name(), "' v", from.version());
  p.set_comment(Cat(p.comment(), " Links, collectives and in-context costs from ", what, "."));
  out->warnings.push_back(Cat("links, collectives and in-context costs are ", what,
                              "'s, not measured here; the ", from.nodes(), " x ",
                              from.gpus_per_node(), " node layout too"));
}

// The measured points profile-check re-measures (Provenance.reference).
void SetReference(const std::vector<v1::ProfileSample>& samples, v1::Provenance* where) {
  for (const v1::ProfileSample& s : samples) {
    bool keep = false;
    switch (s.op_case()) {
      case v1::ProfileSample::kGemm:
        keep = !s.gemm().trans_a() && !s.gemm().trans_b();
        break;
      case v1::ProfileSample::kMemory:
        keep = true;
        break;
      case v1::ProfileSample::kCollective: {
        // profile-check times collectives alone: in-context samples are not
        // its reference.
        const v1::CollectiveSample& c = s.collective();
        keep = c.context_us() <= 0.0 && !internal::Irregular(c) &&
               (c.collective() == v1::COLLECTIVE_ALL_TO_ALL ||
                (c.collective() == v1::COLLECTIVE_SEND_RECV && c.shape().ranks() == 2));
        break;
      }
      default:
        break;
    }
    if (!keep || !(s.median_us() > 0.0)) continue;
    v1::ReferencePoint* r = where->add_reference();
    r->set_point(internal::PointLabel(s));
    r->set_median_us(s.median_us());
  }
}

// One round's (or every point's median round's) fit. A round fitted only for
// the spreads keeps no reference points (Reference::kNone): its profile is
// dropped.
enum class Reference { kKeep, kNone };
absl::StatusOr<Calibration> CalibrateOnce(const std::vector<v1::ProfileSample>& samples,
                                          const CalibrateOptions& options,
                                          Reference reference = Reference::kKeep);

// A point's identity: the sample with its timings and round cleared.
std::string PointKey(const v1::ProfileSample& s) {
  v1::ProfileSample k = s;
  k.clear_run();
  k.clear_round();
  k.clear_iters();
  k.clear_warmup();
  k.clear_median_us();
  k.clear_min_us();
  k.clear_max_us();
  k.clear_checked();
  k.clear_wrong_elements();
  // context_us (the compute phase before an in-context sample) stays: the
  // same collective isolated and in context are two points.
  if (k.has_collective()) {
    k.mutable_collective()->clear_algbw_gbytes_per_s();
    k.mutable_collective()->clear_busbw_gbytes_per_s();
  } else if (k.has_saa()) {
    k.mutable_saa()->clear_sequential_median_us();
  } else if (k.has_gemm()) {
    k.mutable_gemm()->clear_tflops();
  } else if (k.has_memory()) {
    k.mutable_memory()->clear_gbytes_per_s();
  }
  return k.SerializeAsString();
}

double Predict(const LineFit& f, double n) { return f.alpha_us + f.beta_us_per_byte * n; }

// A fit row's name without the " (N pieces)" a piecewise fit adds: one round
// may need pieces where the others do not.
std::string_view RowKey(std::string_view what) {
  if (what.ends_with(" pieces)")) {
    if (const size_t open = what.rfind(" ("); open != std::string_view::npos) {
      return what.substr(0, open);
    }
  }
  return what;
}

// The samples by point (PointKey), and the points in the order they first
// appear, so the fit sees the sweep's order.
struct ByPoint {
  std::map<std::string, std::vector<const v1::ProfileSample*>> samples;
  std::vector<std::string> order;
};

ByPoint GroupByPoint(const std::vector<v1::ProfileSample>& samples) {
  ByPoint out;
  for (const v1::ProfileSample& s : samples) {
    std::string key = PointKey(s);
    std::vector<const v1::ProfileSample*>& v = out.samples[key];
    if (v.empty()) out.order.push_back(std::move(key));
    v.push_back(&s);
  }
  return out;
}

// Every point's median round, and how far the rounds of the points measured
// in every round disagree.
struct MedianRound {
  std::vector<v1::ProfileSample> merged;
  int points = 0;                              // points measured in every round
  std::vector<PointSpread> disagreeing;        // by more than repeat_tolerance
  std::map<std::string, double> point_spread;  // label -> spread %, points of every round
};

MedianRound MergeRounds(const ByPoint& by_point, const CalibrateOptions& options, int rounds) {
  MedianRound out;
  out.merged.reserve(by_point.order.size());
  for (const std::string& key : by_point.order) {
    std::vector<const v1::ProfileSample*> v = by_point.samples.at(key);
    std::sort(v.begin(), v.end(), [](const v1::ProfileSample* a, const v1::ProfileSample* b) {
      return a->median_us() < b->median_us();
    });
    out.merged.push_back(*v[(v.size() - 1) / 2]);
    out.merged.back().clear_round();
    if (static_cast<int>(v.size()) < rounds) continue;
    ++out.points;
    const double lo = v.front()->median_us(), hi = v.back()->median_us();
    if (lo > 0.0) out.point_spread[internal::PointLabel(*v.front())] = 100.0 * (hi / lo - 1.0);
    if (lo > 0.0 && hi / lo - 1.0 > options.repeat_tolerance) {
      PointSpread p;
      p.point = internal::PointLabel(*v.front());
      std::vector<const v1::ProfileSample*> by_round = by_point.samples.at(key);
      std::sort(by_round.begin(), by_round.end(),
                [](const v1::ProfileSample* a, const v1::ProfileSample* b) {
                  return a->round() < b->round();
                });
      for (const v1::ProfileSample* s : by_round) p.median_us.push_back(s->median_us());
      p.spread_pct = 100.0 * (hi / lo - 1.0);
      out.disagreeing.push_back(std::move(p));
    }
  }
  return out;
}

// Widens one row's spread over the rounds by one round's fit `q` of the row
// whose fit over every point's median round is `whole`.
void AddRoundFit(const FitQuality& whole, const FitQuality& q, FitSpread* spread) {
  const LineFit& w = whole.fit;
  FitSpread& s = *spread;
  if (s.rounds == 0) {
    s.what = whole.what;
    s.alpha_min_us = s.alpha_max_us = q.fit.alpha_us;
    s.beta_min = s.beta_max = q.fit.beta_us_per_byte;
  }
  ++s.rounds;
  s.alpha_min_us = std::min(s.alpha_min_us, q.fit.alpha_us);
  s.alpha_max_us = std::max(s.alpha_max_us, q.fit.alpha_us);
  s.beta_min = std::min(s.beta_min, q.fit.beta_us_per_byte);
  s.beta_max = std::max(s.beta_max, q.fit.beta_us_per_byte);
  auto off = [&](double n) {
    const double ref = Predict(w, n);
    return ref > 0.0 ? 100.0 * std::abs(Predict(q.fit, n) / ref - 1.0) : 0.0;
  };
  s.spread_small_pct = std::max(s.spread_small_pct, off(static_cast<double>(w.min_bytes)));
  s.spread_large_pct = std::max(s.spread_large_pct, off(static_cast<double>(w.max_bytes)));
}

// Fits every round alone and sets all->spreads, how far each row's line moves
// between rounds (in all->fits' order); a round that does not fit alone is a
// warning.
void FitEachRound(const std::vector<v1::ProfileSample>& samples, const CalibrateOptions& options,
                  int rounds, Calibration* all) {
  std::map<std::string, FitSpread> rows;
  for (int r = 0; r < rounds; ++r) {
    std::vector<v1::ProfileSample> one;
    for (const v1::ProfileSample& s : samples) {
      if (s.round() != r) continue;
      one.push_back(s);
      one.back().clear_round();
    }
    absl::StatusOr<Calibration> c = one.empty() ? absl::NotFoundError("no samples")
                                                : CalibrateOnce(one, options, Reference::kNone);
    if (!c.ok()) {
      all->warnings.push_back(Cat("round ", r, " could not be fitted alone (",
                                  View(c.status().message()), "): left out of the spreads"));
      continue;
    }
    for (const FitQuality& q : c->fits) {
      const auto whole = std::find_if(all->fits.begin(), all->fits.end(), [&](const FitQuality& w) {
        return RowKey(w.what) == RowKey(q.what);
      });
      // Rows that are not one line (gemm: its alpha is the launch probe; saa:
      // a cross-check) have no prediction to compare; their points' spreads
      // show among the disagreeing points.
      if (whole == all->fits.end() || !(whole->fit.beta_us_per_byte > 0.0)) continue;
      AddRoundFit(*whole, q, &rows[std::string(RowKey(q.what))]);
    }
  }
  for (const FitQuality& q : all->fits) {
    if (auto it = rows.find(std::string(RowKey(q.what))); it != rows.end()) {
      all->spreads.push_back(it->second);
    }
  }
}

// Several rounds: fit each point's median round, then every round alone, and
// compare. Points missing from a round (a budget cut it short) are fitted from
// the rounds that have them.
absl::StatusOr<Calibration> CalibrateRounds(const std::vector<v1::ProfileSample>& samples,
                                            const CalibrateOptions& options, int rounds) {
  MedianRound median = MergeRounds(GroupByPoint(samples), options, rounds);
  MOEPLAN_ASSIGN_OR_RETURN(Calibration all, CalibrateOnce(median.merged, options));
  for (v1::ReferencePoint& r : *all.profile.mutable_provenance()->mutable_reference()) {
    if (auto it = median.point_spread.find(r.point()); it != median.point_spread.end()) {
      r.set_spread_pct(it->second);
    }
  }
  all.rounds = rounds;
  all.points = median.points;
  all.repeat_tolerance = options.repeat_tolerance;
  std::sort(median.disagreeing.begin(), median.disagreeing.end(),
            [](const PointSpread& a, const PointSpread& b) { return a.spread_pct > b.spread_pct; });
  all.disagreeing = std::move(median.disagreeing);
  FitEachRound(samples, options, rounds, &all);
  return all;
}

}  // namespace

absl::StatusOr<Calibration> Calibrate(const std::vector<v1::ProfileSample>& samples,
                                      const CalibrateOptions& options) {
  MOEPLAN_RETURN_IF_ERROR(CheckOptions(options));
  MOEPLAN_RETURN_IF_ERROR(internal::CheckSamples(samples));
  if (options.comm_from) MOEPLAN_RETURN_IF_ERROR(CheckCommFrom(samples, *options.comm_from));
  int rounds = 1;
  for (const v1::ProfileSample& s : samples) {
    if (s.round() < 0) return Bad("round", Cat("must be >= 0 (got ", s.round(), ")"));
    rounds = std::max(rounds, s.round() + 1);
  }
  return rounds > 1 ? CalibrateRounds(samples, options, rounds) : CalibrateOnce(samples, options);
}

namespace {

absl::StatusOr<Calibration> CalibrateOnce(const std::vector<v1::ProfileSample>& samples,
                                          const CalibrateOptions& options, Reference reference) {
  Calibration out;
  SetHeader(samples.front().run(), options, &out.profile);
  if (reference == Reference::kKeep) SetReference(samples, out.profile.mutable_provenance());
  if (options.comm_from) {
    CopyCommunication(*options.comm_from, &out);
  } else {
    MOEPLAN_RETURN_IF_ERROR(internal::FitCollectives(samples, options, &out));
  }
  MOEPLAN_RETURN_IF_ERROR(internal::FitGemm(samples, &out));
  MOEPLAN_ASSIGN_OR_RETURN(const internal::MemoryFits memory,
                           internal::FitMemory(samples, options.tolerance, &out));
  // The planner must accept what was fitted; the comparisons run on its model.
  MOEPLAN_ASSIGN_OR_RETURN(planner::ClusterProfile converted, proto::ProfileFromProto(out.profile));
  MOEPLAN_ASSIGN_OR_RETURN(const planner::CostModel cost,
                           planner::CostModel::Create(std::move(converted)));
  internal::CompareKernels(samples, cost, memory, options, &out);
  MOEPLAN_RETURN_IF_ERROR(internal::CompareSaa(samples, cost, options.tolerance, &out));
  // Uneven AlltoAlls are timed alone: held against the isolated even fits.
  planner::ClusterProfile isolated = cost.profile();
  isolated.context = {};
  MOEPLAN_ASSIGN_OR_RETURN(const planner::CostModel alone,
                           planner::CostModel::Create(std::move(isolated)));
  MOEPLAN_RETURN_IF_ERROR(internal::FitUneven(samples, alone, options.tolerance, &out));
  return out;
}

}  // namespace

namespace {

// Appends one line of the fit report: a padded last column leaves no
// trailing blanks.
void AddLine(std::string* out, std::string_view s) {
  *out += s.substr(0, s.find_last_not_of(' ') + 1);
  *out += '\n';
}

// The fitted models, one line each.
void RenderModels(const v1::ClusterProfile& p, std::string* out) {
  auto line = [out](std::string_view s) { AddLine(out, s); };
  line(fmt::format("profile {}: {} node(s) x {} GPU(s)", p.name(), p.nodes(), p.gpus_per_node()));
  auto link = [](const v1::AlphaBeta& ab) {
    return fmt::format("{:.3g} us + {:.4g} GB/s", ab.alpha_us(), 1e-3 / ab.beta_us_per_byte());
  };
  line(fmt::format("links: intra {}, inter {}", link(p.links().intra()), link(p.links().inter())));
  line(fmt::format("gemm: peak {:.4g} TFLOP/s, launch {:.3g} us, grid {}x{}x{}",
                   p.gemm().peak_tflops(), p.gemm().launch_overhead_us(), p.gemm().m_size(),
                   p.gemm().n_size(), p.gemm().k_size()));
  line(fmt::format("memory: {:.4g} GB/s, launch {:.3g} us", p.memory().bandwidth_gbytes_per_s(),
                   p.memory().launch_overhead_us()));
  auto act = [](const v1::MemoryModel& m) {
    return m.bandwidth_gbytes_per_s() > 0.0
               ? fmt::format("{:.4g} GB/s, launch {:.3g} us", m.bandwidth_gbytes_per_s(),
                             m.launch_overhead_us())
               : std::string("the memory model");
  };
  line(fmt::format("activation: forward {}; backward {}", act(p.activation().forward()),
                   act(p.activation().backward())));
  line(fmt::format("kernels: order {}; iorder {}; route {}", act(p.kernels().order()),
                   act(p.kernels().iorder()), act(p.kernels().route())));
}

// The fit table: each row's line, how well it fits and where it holds.
void RenderFits(const Calibration& c, size_t what_w, std::string* out) {
  auto line = [out](std::string_view s) { AddLine(out, s); };
  line(fmt::format("{:<{}}  {:>9}  {:>10}  {:>9}  {:>6}  {:>9}  {:<24}  {:<24}", "what", what_w,
                   "alpha us", "beta us/B", "GB/s", "R²", "max err %", "sampled range",
                   "holds range"));
  for (const FitQuality& q : c.fits) {
    const LineFit& f = q.fit;
    // The GEMM row's sizes are flops; rows that are not one line have beta 0.
    auto size = [&q](int64_t v) {
      return q.what == "gemm" ? FormatFlops(double(v)) : FormatBytes(double(v));
    };
    const std::string beta =
        f.beta_us_per_byte > 0.0 ? fmt::format("{:.4g}", f.beta_us_per_byte) : "-";
    const std::string gbs =
        f.beta_us_per_byte > 0.0 ? fmt::format("{:.4g}", 1e-3 / f.beta_us_per_byte) : "-";
    const std::string alpha = f.alpha_us > 0.0 || f.beta_us_per_byte > 0.0 || q.what == "gemm"
                                  ? fmt::format("{:.3f}", f.alpha_us)
                                  : "-";
    const std::string sampled = Cat(size(f.min_bytes), " .. ", size(f.max_bytes));
    const std::string holds = f.holds_to_bytes == 0
                                  ? "none"
                                  : Cat(size(f.holds_from_bytes), " .. ", size(f.holds_to_bytes));
    line(fmt::format("{:<{}}  {:>9}  {:>10}  {:>9}  {:>6.3f}  {:>9.1f}  {:<24}  {:<24}", q.what,
                     what_w, alpha, beta, gbs, f.r_squared, f.max_rel_err * 100.0, sampled, holds));
  }
}

// Several rounds: each row's spread over them and the points that disagree.
void RenderRepeatability(const Calibration& c, size_t what_w, std::string* out) {
  auto line = [out](std::string_view s) { AddLine(out, s); };
  line("");
  line(
      fmt::format("repeatability over {} interleaved rounds ({} points in every round): each "
                  "row fitted on one round at a time",
                  c.rounds, c.points));
  line(fmt::format("{:<{}}  {:>6}  {:>19}  {:>21}  {:>9}  {:>9}", "what", what_w, "rounds",
                   "alpha us (min..max)", "beta us/B (min..max)", "small ±%", "large ±%"));
  for (const FitSpread& s : c.spreads) {
    line(fmt::format(
        "{:<{}}  {:>6}  {:>19}  {:>21}  {:>9.1f}  {:>9.1f}", s.what, what_w, s.rounds,
        fmt::format("{:.3g}..{:.3g}", s.alpha_min_us, s.alpha_max_us),
        s.beta_max > 0.0 ? fmt::format("{:.3g}..{:.3g}", s.beta_min, s.beta_max) : std::string("-"),
        s.spread_small_pct, s.spread_large_pct));
  }
  line(fmt::format("points whose rounds disagree by more than {:.0f}%: {} of {}",
                   100.0 * c.repeat_tolerance, c.disagreeing.size(), c.points));
  constexpr size_t kShown = 15;
  for (size_t i = 0; i < std::min(kShown, c.disagreeing.size()); ++i) {
    const PointSpread& p = c.disagreeing[i];
    std::string values;
    for (double v : p.median_us) values += fmt::format("{}{:.4g}", values.empty() ? "" : ", ", v);
    line(fmt::format("  {:+.0f}%  {}  (medians us, by round: {})", p.spread_pct, p.point, values));
  }
  if (c.disagreeing.size() > kShown) {
    line(fmt::format("  ... and {} more", c.disagreeing.size() - kShown));
  }
}

// The fits' warnings, then the calibration's.
void RenderWarnings(const Calibration& c, std::string* out) {
  auto line = [out](std::string_view s) { AddLine(out, s); };
  std::vector<std::string_view> warnings;
  for (const FitQuality& q : c.fits)
    warnings.insert(warnings.end(), q.warnings.begin(), q.warnings.end());
  warnings.insert(warnings.end(), c.warnings.begin(), c.warnings.end());
  line("");
  if (warnings.empty()) {
    line("warnings: none");
  } else {
    line("warnings:");
    for (std::string_view w : warnings) line(Cat("  - ", w));
  }
}

}  // namespace

std::string RenderFitReport(const Calibration& c) {
  std::string out;
  RenderModels(c.profile, &out);
  AddLine(&out, "");
  size_t what_w = 4;
  for (const FitQuality& q : c.fits) what_w = std::max(what_w, q.what.size());
  RenderFits(c, what_w, &out);
  if (c.rounds > 1) RenderRepeatability(c, what_w, &out);
  RenderWarnings(c, &out);
  return out;
}

}  // namespace moeplan::calibration
