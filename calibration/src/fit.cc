#include "moeplan/calibration/fit.h"

#include <fmt/format.h>

#include <Eigen/Dense>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <map>
#include <optional>
#include <string_view>
#include <tuple>
#include <utility>

#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/op_graph.h"
#include "moeplan/planner/schedules.h"
#include "moeplan/planner/simulator.h"
#include "moeplan/planner/strings.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"

namespace moeplan::calibration {
namespace {

// The beta given to a fit whose timings do not grow with size (flat or noisy
// sweeps): the profile needs beta > 0, and 1e-12 us/B (1e9 GB/s) makes the
// line a constant for every size the planner will ask about.
constexpr double kTinyBeta = 1e-12;
// GEMM efficiencies are clamped into [kMinEfficiency, 1]: the profile needs
// them > 0, and a shape 10^4 times slower than the best is a measurement error.
constexpr double kMinEfficiency = 1e-4;
// A GEMM not measurably slower than the empty launch carries no rate
// information; its compute time is floored at this fraction of its measured
// time so that one noisy small shape cannot set an absurd peak.
constexpr double kMinBusyFraction = 0.01;

// One measured point and what a model predicts for it.
struct Obs {
  double n = 0.0;  // bytes (flops for the GEMM row)
  double t = 0.0;  // measured, us
  double pred = 0.0;
};

// Sizes are reported as int64 (the GEMM row's are flops, which can exceed it
// for absurd shapes): saturate instead of overflowing.
int64_t ToInt64(double v) {
  constexpr double kMax = 9.2e18;
  return static_cast<int64_t>(std::clamp(v, -kMax, kMax));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 == 1 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// How well `pred` matches `t`: R^2 (unweighted), max relative error and the
// widest run of consecutive points (sorted by n) within `tolerance`. Fills
// every LineFit field except alpha and beta.
void FillQuality(std::vector<Obs> obs, double tolerance, LineFit* fit) {
  std::sort(obs.begin(), obs.end(),
            [](const Obs& a, const Obs& b) { return std::tie(a.n, a.t) < std::tie(b.n, b.t); });
  fit->points = static_cast<int>(obs.size());
  fit->min_bytes = obs.empty() ? 0 : ToInt64(obs.front().n);
  fit->max_bytes = obs.empty() ? 0 : ToInt64(obs.back().n);
  double mean = 0.0;
  for (const Obs& o : obs) mean += o.t;
  mean /= std::max<size_t>(obs.size(), 1);
  double ss_res = 0.0, ss_tot = 0.0;
  fit->max_rel_err = 0.0;
  fit->holds_from_bytes = fit->holds_to_bytes = 0;
  // Runs are compared by point count; on a tie the later run wins, because
  // the large sizes carry the volume a plan is made of.
  size_t best_begin = 0, best_len = 0, run_begin = 0;
  for (size_t i = 0; i < obs.size(); ++i) {
    const Obs& o = obs[i];
    ss_res += (o.pred - o.t) * (o.pred - o.t);
    ss_tot += (o.t - mean) * (o.t - mean);
    const double rel = std::abs(o.pred - o.t) / o.t;
    fit->max_rel_err = std::max(fit->max_rel_err, rel);
    if (!(rel <= tolerance)) {
      run_begin = i + 1;
      continue;
    }
    if (i + 1 - run_begin >= best_len) {
      best_begin = run_begin;
      best_len = i + 1 - run_begin;
    }
  }
  if (best_len > 0) {
    fit->holds_from_bytes = ToInt64(obs[best_begin].n);
    fit->holds_to_bytes = ToInt64(obs[best_begin + best_len - 1].n);
  }
  // Constant timings leave nothing for a line to explain: call that a perfect
  // R^2 and let the max relative error speak.
  fit->r_squared = ss_tot > 0.0 ? 1.0 - ss_res / ss_tot : 1.0;
}

// The weighted least-squares line through `pts` (n > 0, t > 0, at least two
// distinct n; duplicates allowed): minimises sum(((alpha + beta n) - t) / t)^2,
// so a 1 KiB message counts as much as a 1 GiB one.
LineFit FitPoints(const std::vector<Obs>& pts, double tolerance) {
  const auto rows = static_cast<Eigen::Index>(pts.size());
  // n spans 1e3..1e10 while the intercept column is ~1/t: scale n to <= 1 so
  // the QR sees comparable columns.
  double scale = 0.0;
  for (const Obs& p : pts) scale = std::max(scale, p.n);
  Eigen::MatrixXd a(rows, 2);
  const Eigen::VectorXd b = Eigen::VectorXd::Ones(rows);
  for (Eigen::Index i = 0; i < rows; ++i) {
    const Obs& p = pts[static_cast<size_t>(i)];
    a(i, 0) = 1.0 / p.t;
    a(i, 1) = p.n / scale / p.t;
  }
  const Eigen::Vector2d x = a.colPivHouseholderQr().solve(b);
  double alpha = x(0), beta = x(1) / scale;
  if (alpha < 0.0) {
    // A negative start-up time is unphysical (usually small sizes measured
    // faster than the large-size slope predicts): fit through the origin.
    double sxx = 0.0, sx = 0.0;
    for (const Obs& p : pts) {
      const double xi = p.n / p.t;
      sxx += xi * xi;
      sx += xi;
    }
    alpha = 0.0;
    beta = sx / sxx;
  }
  if (!(beta > 0.0)) {
    // Time does not grow with size: a constant with a token slope, alpha
    // refitted for that slope (weighted mean of t - beta n).
    beta = kTinyBeta;
    double num = 0.0, den = 0.0;
    for (const Obs& p : pts) {
      num += (p.t - beta * p.n) / (p.t * p.t);
      den += 1.0 / (p.t * p.t);
    }
    alpha = std::max(0.0, num / den);
  }
  std::vector<Obs> obs = pts;
  for (Obs& o : obs) o.pred = alpha + beta * o.n;
  LineFit fit;
  FillQuality(std::move(obs), tolerance, &fit);
  fit.alpha_us = alpha;
  fit.beta_us_per_byte = beta;
  return fit;
}

// A piecewise line over `pts` (distinct sizes): each piece grows from its
// first point while its own weighted line stays within `tolerance` of every
// point in it; at least 3 points per piece where there are (2 points always
// fit exactly), at most kMaxPieces (the last takes the rest). Returns
// (from_bytes, line) per piece; the first starts at 0.
constexpr int kMaxPieces = 4;
std::vector<std::pair<double, LineFit>> FitPieces(std::vector<Obs> pts, double tolerance) {
  std::sort(pts.begin(), pts.end(), [](const Obs& a, const Obs& b) { return a.n < b.n; });
  const size_t n = pts.size();
  auto fit = [&](size_t i, size_t j) {
    return FitPoints(std::vector<Obs>(pts.begin() + static_cast<std::ptrdiff_t>(i),
                                      pts.begin() + static_cast<std::ptrdiff_t>(j) + 1),
                     tolerance);
  };
  std::vector<std::pair<double, LineFit>> out;
  for (size_t i = 0; i < n;) {
    size_t j = std::min(i + 2, n - 1);
    if (static_cast<int>(out.size()) + 1 == kMaxPieces) {
      j = n - 1;
    } else {
      while (j + 1 < n && fit(i, j + 1).max_rel_err <= tolerance) ++j;
      if (n - 1 - j < 2) j = n - 1;  // a lone last point joins this piece
    }
    out.emplace_back(i == 0 ? 0.0 : pts[i].n, fit(i, j));
    i = j + 1;
  }
  return out;
}

int DistinctSizes(std::vector<Obs> pts) {
  std::sort(pts.begin(), pts.end(), [](const Obs& a, const Obs& b) { return a.n < b.n; });
  int distinct = 0;
  for (size_t i = 0; i < pts.size(); ++i) distinct += (i == 0 || pts[i].n != pts[i - 1].n);
  return distinct;
}

// ---- Names for people -----------------------------------------------------

std::string Bytes(double b) {
  static constexpr std::string_view kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::abs(b) >= 1024.0 && u < 4) {
    b /= 1024.0;
    ++u;
  }
  return fmt::format("{:.4g} {}", b, kUnits[u]);
}

std::string Flops(double f) {
  static constexpr std::string_view kUnits[] = {"flop", "kflop", "Mflop", "Gflop", "Tflop"};
  int u = 0;
  while (std::abs(f) >= 1000.0 && u < 4) {
    f /= 1000.0;
    ++u;
  }
  return fmt::format("{:.4g} {}", f, kUnits[u]);
}

std::string Percent(double rel) {
  return rel >= 0.1 ? fmt::format("{:.0f} %", rel * 100.0) : fmt::format("{:.1f} %", rel * 100.0);
}

std::string ShapeName(int ranks, int nodes) {
  return Cat(ranks, ranks == 1 ? " rank / " : " ranks / ", nodes, nodes == 1 ? " node" : " nodes");
}

std::string_view CollectiveName(v1::Collective c) {
  switch (c) {
    case v1::COLLECTIVE_ALL_REDUCE:
      return planner::CollectiveName(planner::Collective::kAllReduce);
    case v1::COLLECTIVE_ALL_GATHER:
      return planner::CollectiveName(planner::Collective::kAllGather);
    case v1::COLLECTIVE_REDUCE_SCATTER:
      return planner::CollectiveName(planner::Collective::kReduceScatter);
    case v1::COLLECTIVE_ALL_TO_ALL:
      return planner::CollectiveName(planner::Collective::kAllToAll);
    case v1::COLLECTIVE_SEND_RECV:
      return planner::CollectiveName(planner::Collective::kSendRecv);
    default:
      return "unspecified collective";
  }
}

// "samples[3] (allgather 4 ranks / 1 node, 65536 bytes)": which sample, in
// terms the profiler's output can be searched for.
std::string SampleName(size_t i, const v1::ProfileSample& s) {
  std::string what;
  switch (s.op_case()) {
    case v1::ProfileSample::kCollective: {
      const v1::CollectiveSample& c = s.collective();
      what = Cat(CollectiveName(c.collective()), " ",
                 ShapeName(c.shape().ranks(), c.shape().nodes()), ", ", c.bytes(), " bytes");
      break;
    }
    case v1::ProfileSample::kSaa: {
      const v1::SaaSample& a = s.saa();
      what =
          Cat(a.dual() ? "saa dual" : "saa", " a2a ", a.a2a().ranks(), "x", a.a2a().nodes(),
              " / gather ", a.gather().ranks(), "x", a.gather().nodes(), ", ", a.bytes(), " bytes");
      break;
    }
    case v1::ProfileSample::kGemm:
      what = Cat("gemm ", s.gemm().m(), "x", s.gemm().n(), "x", s.gemm().k());
      break;
    case v1::ProfileSample::kMemory:
      what = Cat("memory ", s.memory().kernel(), ", ", s.memory().bytes(), " bytes");
      break;
    default:
      what = "no op";
  }
  return Cat("samples[", i, "] (", what, ")");
}

absl::Status Bad(std::string_view field, std::string_view rule) {
  return absl::InvalidArgumentError(Cat(field, ": ", rule));
}

absl::Status CheckName(std::string_view name) {
  if (name.empty()) return Bad("name", "must not be empty (it names the profile and its file)");
  for (char ch : name) {
    const bool ok =
        (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
    if (!ok) return Bad("name", Cat("must match [a-z0-9._-]+ (got \"", name, "\")"));
  }
  return absl::OkStatus();
}

// Every sample must come from the same run: one layout, one backend, one
// element type; a fit across runs would mix incomparable times.
absl::Status CheckSameRun(const std::vector<v1::ProfileSample>& samples) {
  const v1::ProfileRun& r0 = samples.front().run();
  for (size_t i = 1; i < samples.size(); ++i) {
    const v1::ProfileRun& r = samples[i].run();
    auto differ = [&](std::string_view field, const auto& a, const auto& b) {
      return Bad(Cat("run.", field), Cat("samples mix runs: '", a, "' in samples[0] but '", b,
                                         "' in samples[", i, "]; calibrate one run at a time"));
    };
    if (r.backend() != r0.backend()) return differ("backend", r0.backend(), r.backend());
    if (r.dtype() != r0.dtype()) return differ("dtype", r0.dtype(), r.dtype());
    if (r.ranks() != r0.ranks()) return differ("ranks", r0.ranks(), r.ranks());
    if (r.nodes() != r0.nodes()) return differ("nodes", r0.nodes(), r.nodes());
    if (r.ranks_per_node() != r0.ranks_per_node()) {
      return differ("ranks_per_node", r0.ranks_per_node(), r.ranks_per_node());
    }
  }
  if (r0.nodes() < 1) return Bad("run.nodes", Cat("must be >= 1 (got ", r0.nodes(), ")"));
  if (r0.ranks_per_node() < 1) {
    return Bad("run.ranks_per_node", Cat("must be >= 1 (got ", r0.ranks_per_node(), ")"));
  }
  if (int64_t{r0.nodes()} * r0.ranks_per_node() != r0.ranks()) {
    return Bad("run.ranks", Cat("must be nodes * ranks_per_node (got ", r0.ranks(), ", ",
                                r0.nodes(), " * ", r0.ranks_per_node(), ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckShape(std::string_view who, std::string_view field, const v1::GroupShape& s,
                        int min_ranks) {
  if (s.ranks() < min_ranks || s.nodes() < 1 || s.ranks() % s.nodes() != 0) {
    return Bad(Cat(who, ".", field), Cat("needs ranks >= ", min_ranks,
                                         " spread evenly over nodes >= 1 (got ranks=", s.ranks(),
                                         ", nodes=", s.nodes(), ")"));
  }
  return absl::OkStatus();
}

// Per-sample rules: a time the fits can divide by, sizes a profile can hold,
// and correct results.
absl::Status CheckSample(size_t i, const v1::ProfileSample& s) {
  const std::string who = SampleName(i, s);
  if (s.op_case() == v1::ProfileSample::OP_NOT_SET) {
    return Bad(who, "has no op (collective, saa, gemm or memory)");
  }
  if (s.wrong_elements() > 0) {
    return Bad(Cat(who, ".wrong_elements"),
               Cat("must be 0 (got ", s.wrong_elements(),
                   "): the op returned wrong results, so its time is not a measurement"));
  }
  if (!(s.median_us() > 0.0) || !std::isfinite(s.median_us())) {
    return Bad(Cat(who, ".median_us"), Cat("must be finite and > 0 (got ", s.median_us(), ")"));
  }
  switch (s.op_case()) {
    case v1::ProfileSample::kCollective: {
      const v1::CollectiveSample& c = s.collective();
      if (c.collective() == v1::COLLECTIVE_UNSPECIFIED) {
        return Bad(Cat(who, ".collective.collective"), "must be set");
      }
      if (absl::Status st = CheckShape(who, "collective.shape", c.shape(), 2); !st.ok()) return st;
      if (c.bytes() <= 0) return Bad(Cat(who, ".collective.bytes"), "must be > 0");
      break;
    }
    case v1::ProfileSample::kSaa: {
      const v1::SaaSample& a = s.saa();
      if (absl::Status st = CheckShape(who, "saa.a2a", a.a2a(), 1); !st.ok()) return st;
      if (absl::Status st = CheckShape(who, "saa.gather", a.gather(), 1); !st.ok()) return st;
      if (a.a2a_ranks_per_node() < 1)
        return Bad(Cat(who, ".saa.a2a_ranks_per_node"), "must be >= 1");
      if (a.bytes() <= 0) return Bad(Cat(who, ".saa.bytes"), "must be > 0");
      break;
    }
    case v1::ProfileSample::kGemm: {
      const v1::GemmSample& g = s.gemm();
      // The profile stores the grid axes as int32.
      constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
      const std::pair<std::string_view, int64_t> dims[] = {
          {"m", g.m()}, {"n", g.n()}, {"k", g.k()}};
      for (const auto& [field, v] : dims) {
        if (v < 1 || v > kMax) {
          return Bad(Cat(who, ".gemm.", field), Cat("must be in [1, ", kMax, "] (got ", v, ")"));
        }
      }
      break;
    }
    case v1::ProfileSample::kMemory:
      if (s.memory().bytes() <= 0) return Bad(Cat(who, ".memory.bytes"), "must be > 0");
      break;
    default:
      break;
  }
  return absl::OkStatus();
}

// Warnings for a fitted line that does not hold, phrased for the person who
// has to decide whether to trust it. `small` / `large` name the ends of the
// sweep ("small messages").
void LineWarnings(const FitQuality& q, const CalibrateOptions& o, std::string_view small,
                  std::string_view large, std::vector<std::string>* out) {
  const LineFit& f = q.fit;
  if (f.max_rel_err > o.tolerance) {
    std::string w = Cat(q.what, ": the line is off by up to ", Percent(f.max_rel_err));
    if (f.holds_to_bytes == 0) {
      w += Cat(" (within ", Percent(o.tolerance), " at no measured size)");
    } else {
      w += Cat(" (holds from ", Bytes(f.holds_from_bytes), " to ", Bytes(f.holds_to_bytes), ")");
    }
    if (f.holds_to_bytes != 0 && f.holds_from_bytes > f.min_bytes &&
        f.holds_to_bytes == f.max_bytes) {
      w += Cat("; ", small, " are latency-bound differently");
    } else if (f.holds_to_bytes != 0 && f.holds_from_bytes == f.min_bytes &&
               f.holds_to_bytes < f.max_bytes) {
      w += Cat("; ", large, " leave the line (a protocol or bandwidth change)");
    } else {
      w += "; the times are not linear in the size (several regimes, or a noisy run)";
    }
    out->push_back(std::move(w));
  }
  if (f.r_squared < o.min_r_squared) {
    out->push_back(Cat(q.what, ": R² is ", fmt::format("{:.3f}", f.r_squared), " (below ",
                       o.min_r_squared, "): the line explains the times poorly"));
  }
  if (f.beta_us_per_byte == kTinyBeta) {
    out->push_back(Cat(
        q.what, ": the time does not grow with the size (flat timings); beta set to ", kTinyBeta,
        " us/B, so the fit is the constant ", fmt::format("{:.3g}", f.alpha_us), " us"));
  }
}

using GroupKey = std::tuple<int, int, int>;  // collective, ranks, nodes

void SetAlphaBeta(const LineFit& f, v1::AlphaBeta* out) {
  out->set_alpha_us(f.alpha_us);
  out->set_beta_us_per_byte(f.beta_us_per_byte);
}

std::string RunComment(const v1::ProfileRun& r, std::string_view extra) {
  std::vector<std::string> hosts(r.hosts().begin(), r.hosts().end());
  if (hosts.empty() && !r.host().empty()) hosts.push_back(r.host());
  std::string c = "Measured by moeplan-profile";
  for (size_t i = 0; i < hosts.size(); ++i) c += Cat(i == 0 ? " on " : ", ", hosts[i]);
  c += Cat(" (", r.nodes(), " x ", r.ranks_per_node(), " ranks");
  for (const std::string& part : {r.backend(), r.dtype(), r.versions()}) {
    if (!part.empty()) c += Cat("; ", part);
  }
  if (!r.moeplan_version().empty()) c += Cat("; moeplan ", r.moeplan_version());
  c += ")";
  if (!r.timestamp().empty()) c += Cat(" at ", r.timestamp());
  c += ".";
  if (!extra.empty()) c += Cat(" ", extra);
  return c;
}

}  // namespace

absl::StatusOr<std::vector<v1::ProfileSample>> ParseSamples(std::string_view text,
                                                            std::string_view source) {
  std::vector<v1::ProfileSample> out;
  int line_no = 0;
  while (!text.empty()) {
    const size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    v1::ProfileSample s;
    if (absl::Status st = proto::ParseJson(line, &s); !st.ok()) {
      return absl::InvalidArgumentError(Cat(source, ":", line_no, ": ", View(st.message())));
    }
    out.push_back(std::move(s));
  }
  return out;
}

absl::StatusOr<std::vector<v1::ProfileSample>> ReadSamples(const std::string& path) {
  absl::StatusOr<std::string> text = proto::ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseSamples(*text, path);
}

absl::StatusOr<LineFit> FitLine(const std::vector<double>& n, const std::vector<double>& t,
                                double tolerance) {
  if (n.size() != t.size()) {
    return Bad("FitLine", Cat("n and t differ in length (", n.size(), " and ", t.size(), ")"));
  }
  if (n.size() < 2) return Bad("FitLine", Cat("needs at least 2 points (got ", n.size(), ")"));
  if (!(tolerance >= 0.0) || !std::isfinite(tolerance)) {
    return Bad("tolerance", Cat("must be finite and >= 0 (got ", tolerance, ")"));
  }
  std::vector<Obs> pts(n.size());
  for (size_t i = 0; i < n.size(); ++i) {
    if (!(n[i] > 0.0) || !std::isfinite(n[i])) {
      return Bad(Cat("n[", i, "]"), Cat("must be finite and > 0 (got ", n[i], ")"));
    }
    if (!(t[i] > 0.0) || !std::isfinite(t[i])) {
      return Bad(Cat("t[", i, "]"), Cat("must be finite and > 0 (got ", t[i], ")"));
    }
    pts[i] = {n[i], t[i], 0.0};
  }
  std::sort(pts.begin(), pts.end(), [](const Obs& a, const Obs& b) { return a.n < b.n; });
  for (size_t i = 1; i < pts.size(); ++i) {
    if (pts[i].n == pts[i - 1].n) {
      return Bad("n", Cat("sizes must be distinct (", pts[i].n, " appears twice)"));
    }
  }
  return FitPoints(pts, tolerance);
}

absl::StatusOr<Calibration> Calibrate(const std::vector<v1::ProfileSample>& samples,
                                      const CalibrateOptions& options) {
  if (absl::Status s = CheckName(options.name); !s.ok()) return s;
  if (!(options.tolerance >= 0.0) || !std::isfinite(options.tolerance)) {
    return Bad("tolerance", Cat("must be finite and >= 0 (got ", options.tolerance, ")"));
  }
  if (options.version < 1) return Bad("version", "must be >= 1 (got 0)");
  if (!(options.gpu_memory_gib >= 0.0) || !std::isfinite(options.gpu_memory_gib)) {
    return Bad("gpu_memory_gib", Cat("must be finite and >= 0 (got ", options.gpu_memory_gib, ")"));
  }
  if (samples.empty()) return Bad("samples", "none given (run moeplan-profile to measure some)");
  if (absl::Status s = CheckSameRun(samples); !s.ok()) return s;
  for (size_t i = 0; i < samples.size(); ++i) {
    if (absl::Status s = CheckSample(i, samples[i]); !s.ok()) return s;
  }
  const v1::ProfileRun& run = samples.front().run();
  const double tol = options.tolerance;

  Calibration out;
  v1::ClusterProfile& prof = out.profile;
  prof.set_schema_version(1);
  prof.set_name(options.name);
  prof.set_version(options.version);
  prof.set_source(v1::PROFILE_SOURCE_MEASURED);
  prof.set_comment(RunComment(run, options.comment));
  prof.set_nodes(run.nodes());
  prof.set_gpus_per_node(run.ranks_per_node());
  if (options.gpu_memory_gib > 0.0) prof.set_gpu_memory_gib(options.gpu_memory_gib);

  // ---- Collectives: one line per (collective, shape). ----
  std::map<GroupKey, std::vector<Obs>> groups;  // ordered: a stable profile and report
  for (const v1::ProfileSample& s : samples) {
    if (s.op_case() != v1::ProfileSample::kCollective) continue;
    const v1::CollectiveSample& c = s.collective();
    groups[{c.collective(), c.shape().ranks(), c.shape().nodes()}].push_back(
        {static_cast<double>(c.bytes()), s.median_us(), 0.0});
  }
  std::optional<LineFit> intra, inter;
  for (const auto& [key, pts] : groups) {
    const auto [coll, ranks, nodes] = key;
    const bool send_recv = coll == v1::COLLECTIVE_SEND_RECV && ranks == 2;
    const bool is_intra = send_recv && nodes == 1, is_inter = send_recv && nodes == 2;
    std::string what =
        Cat(CollectiveName(static_cast<v1::Collective>(coll)), " ", ShapeName(ranks, nodes));
    if (DistinctSizes(pts) < 2) {
      out.warnings.push_back(Cat(what, ": only one size measured (", Bytes(pts.front().n),
                                 "), not fitted; the planner derives it from the link costs"));
      continue;
    }
    if (is_intra) what += " (intra link)";
    if (is_inter) what += " (inter link)";
    const LineFit line = FitPoints(pts, tol);
    // Regimes (protocol or algorithm switches, caches) a single line cannot
    // follow: a piecewise line when it is closer. The row then reports the
    // pieces' quality; `cost` keeps the single line.
    std::vector<std::pair<double, LineFit>> pieces;
    FitQuality q{what, line, {}};
    if (line.max_rel_err > tol && DistinctSizes(pts) >= 4) {
      pieces = FitPieces(pts, tol);
      std::vector<Obs> obs = pts;
      for (Obs& o : obs) {
        size_t k = pieces.size() - 1;
        while (k > 0 && o.n < pieces[k].first) --k;
        o.pred = pieces[k].second.alpha_us + pieces[k].second.beta_us_per_byte * o.n;
      }
      LineFit pw = line;
      FillQuality(std::move(obs), tol, &pw);
      if (pieces.size() > 1 && pw.max_rel_err < line.max_rel_err) {
        q.fit = pw;
        q.what += Cat(" (", pieces.size(), " pieces)");
      } else {
        pieces.clear();
      }
    }
    LineWarnings(q, options, "small messages", "large messages", &q.warnings);
    v1::CollectiveFit* f = prof.add_collectives();
    f->set_collective(static_cast<v1::Collective>(coll));
    f->mutable_shape()->set_ranks(ranks);
    f->mutable_shape()->set_nodes(nodes);
    SetAlphaBeta(line, f->mutable_cost());
    for (const auto& [from, piece] : pieces) {
      v1::FitPiece* fp = f->add_pieces();
      fp->set_from_bytes(ToInt64(from));
      SetAlphaBeta(piece, fp->mutable_cost());
    }
    f->set_r_squared(q.fit.r_squared);
    f->set_min_bytes(q.fit.min_bytes);
    f->set_max_bytes(q.fit.max_bytes);
    out.fits.push_back(std::move(q));
    if (is_intra) intra = out.fits.back().fit;
    if (is_inter) inter = out.fits.back().fit;
  }

  // ---- Link costs: the pair SendRecv on each level. ----
  // A level the run has no pair on (one node; one rank per node) copies the
  // other level, with a warning: plans crossing it will be optimistic or
  // pessimistic, but they can be made.
  if (!intra && !inter) {
    return Bad("samples",
               "no SendRecv sweep on 2 ranks / 1 node (at least 2 sizes): the planner needs the "
               "intra-node link cost (alpha, beta)");
  }
  if (!intra) {
    if (run.ranks_per_node() >= 2) {
      return Bad("samples",
                 "no SendRecv sweep on 2 ranks / 1 node (at least 2 sizes): the planner needs the "
                 "intra-node link cost (alpha, beta)");
    }
    intra = inter;
    out.warnings.push_back(
        "intra link not measured (one rank per node): links.intra copies links.inter");
  }
  if (!inter) {
    if (run.nodes() >= 2) {
      return Bad("samples",
                 "no SendRecv sweep on 2 ranks / 2 nodes (at least 2 sizes): the planner needs "
                 "the inter-node link cost (alpha, beta)");
    }
    inter = intra;
    out.warnings.push_back(
        "inter link not measured (single-node run): links.inter copies links.intra, so plans "
        "that span nodes will look far too cheap");
  }
  SetAlphaBeta(*intra, prof.mutable_links()->mutable_intra());
  SetAlphaBeta(*inter, prof.mutable_links()->mutable_inter());

  // ---- GEMM: launch overhead, peak and the efficiency grid. ----
  std::vector<double> probes;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::vector<double>> shapes;
  for (const v1::ProfileSample& s : samples) {
    if (s.op_case() != v1::ProfileSample::kGemm) continue;
    const v1::GemmSample& g = s.gemm();
    if (g.m() == 1 && g.n() == 1 && g.k() == 1) {
      probes.push_back(s.median_us());
    } else {
      shapes[{g.m(), g.n(), g.k()}].push_back(s.median_us());
    }
  }
  if (shapes.empty()) {
    return Bad("samples",
               "no GEMM samples besides the 1x1x1 launch probe: the planner needs peak_tflops");
  }
  v1::GemmModel* gm = prof.mutable_gemm();
  double overhead = 0.0;
  if (!probes.empty()) {
    overhead = Median(probes);
  } else {
    double fastest = std::numeric_limits<double>::infinity();
    for (const auto& [mnk, ts] : shapes) fastest = std::min(fastest, Median(ts));
    overhead = 0.5 * fastest;
    out.warnings.push_back(
        Cat("gemm: no 1x1x1 launch probe; launch overhead taken as half the "
            "fastest GEMM (",
            fmt::format("{:.3g}", overhead), " us)"));
  }
  gm->set_launch_overhead_us(overhead);
  std::vector<int64_t> axes[3];
  for (const auto& [mnk, ts] : shapes) {
    axes[0].push_back(std::get<0>(mnk));
    axes[1].push_back(std::get<1>(mnk));
    axes[2].push_back(std::get<2>(mnk));
  }
  for (std::vector<int64_t>& a : axes) {
    std::sort(a.begin(), a.end());
    a.erase(std::unique(a.begin(), a.end()), a.end());
  }
  const size_t nm = axes[0].size(), nn = axes[1].size(), nk = axes[2].size();
  auto index_of = [](const std::vector<int64_t>& axis, int64_t v) {
    return static_cast<size_t>(std::lower_bound(axis.begin(), axis.end(), v) - axis.begin());
  };
  // rate in flop/us per grid cell; < 0: not sampled.
  std::vector<double> rate(nm * nn * nk, -1.0);
  double peak = 0.0;
  for (const auto& [mnk, ts] : shapes) {
    const auto [m, n, k] = mnk;
    // Several samples of one shape are its transpose variants (NN, NT, TN):
    // the executor runs each about equally often (forward, input gradient,
    // weight gradient) and the planner's GEMM has no transpose, so their mean.
    double t = 0.0;
    for (double x : ts) t += x / static_cast<double>(ts.size());
    const double flops = 2.0 * double(m) * double(n) * double(k);
    const double r = flops / std::max(t - overhead, kMinBusyFraction * t);
    rate[(index_of(axes[0], m) * nn + index_of(axes[1], n)) * nk + index_of(axes[2], k)] = r;
    peak = std::max(peak, r);
  }
  gm->set_peak_tflops(peak / 1e6);  // flop/us -> TFLOP/s
  for (size_t a = 0; a < 3; ++a) {
    for (int64_t v : axes[a]) {
      auto* field = a == 0 ? gm->mutable_m() : a == 1 ? gm->mutable_n() : gm->mutable_k();
      field->Add(static_cast<int32_t>(v));
    }
  }
  // Unsampled cells (the profiler skips shapes above its flop cap) take the
  // efficiency of the nearest sampled shape in log2(m, n, k); on a tie the
  // larger shape, since the missing ones are the large ones.
  int filled = 0;
  for (size_t im = 0; im < nm; ++im) {
    for (size_t in = 0; in < nn; ++in) {
      for (size_t ik = 0; ik < nk; ++ik) {
        const size_t cell = (im * nn + in) * nk + ik;
        double eff = 0.0;
        if (rate[cell] >= 0.0) {
          eff = rate[cell] / peak;
        } else {
          ++filled;
          const double lx[3] = {std::log2(double(axes[0][im])), std::log2(double(axes[1][in])),
                                std::log2(double(axes[2][ik]))};
          double best_d = std::numeric_limits<double>::infinity(), best_flops = -1.0;
          for (const auto& [mnk, ts] : shapes) {
            const auto [m, n, k] = mnk;
            const double dm = std::log2(double(m)) - lx[0], dn = std::log2(double(n)) - lx[1],
                         dk = std::log2(double(k)) - lx[2];
            const double d = dm * dm + dn * dn + dk * dk;
            const double flops = double(m) * double(n) * double(k);
            if (d < best_d || (d == best_d && flops > best_flops)) {
              best_d = d;
              best_flops = flops;
              eff = rate[(index_of(axes[0], m) * nn + index_of(axes[1], n)) * nk +
                         index_of(axes[2], k)] /
                    peak;
            }
          }
        }
        gm->add_efficiency(std::clamp(eff, kMinEfficiency, 1.0));
      }
    }
  }
  if (filled > 0) {
    out.warnings.push_back(Cat("gemm: ", filled, " of ", nm * nn * nk,
                               " grid points were not measured (above the profiler's flop cap?); "
                               "filled with the efficiency of the nearest measured shape"));
  }

  // ---- Memory-bound kernels: one shared line. ----
  // Fitted on the data-movement kernels (copy, order, i-order): routing's
  // softmax and top-k are compute-bound on CPUs and would drag the shared line
  // (and its launch overhead, charged to every memory-bound op) far off; its
  // own row below says how well the line covers it. Routing counts only when
  // nothing else was measured.
  // The expert activation (gelu, gelu_bwd) gets lines of its own: on CPUs it
  // is bound by tanh, not by memory, and it is a large part of the expert's time.
  std::vector<Obs> mem, all_mem;
  std::map<std::string, std::vector<Obs>> kernels;
  std::array<std::vector<Obs>, 2> act;  // forward, backward
  for (const v1::ProfileSample& s : samples) {
    if (s.op_case() != v1::ProfileSample::kMemory) continue;
    const Obs o{static_cast<double>(s.memory().bytes()), s.median_us(), 0.0};
    kernels[s.memory().kernel()].push_back(o);
    if (s.memory().kernel() == "gelu" || s.memory().kernel() == "gelu_bwd") {
      act[s.memory().kernel() == "gelu" ? 0 : 1].push_back(o);
      continue;
    }
    all_mem.push_back(o);
    if (s.memory().kernel() != "route") mem.push_back(o);
  }
  if (DistinctSizes(mem) < 2) mem = all_mem;
  if (DistinctSizes(mem) < 2) {
    return Bad("samples",
               "memory-kernel samples need at least 2 distinct sizes: the planner needs the "
               "memory bandwidth and launch overhead");
  }
  const LineFit mem_line = FitPoints(mem, tol);
  prof.mutable_memory()->set_launch_overhead_us(mem_line.alpha_us);
  prof.mutable_memory()->set_bandwidth_gbytes_per_s(1e-3 / mem_line.beta_us_per_byte);
  std::array<LineFit, 2> act_line{mem_line, mem_line};
  for (int i = 0; i < 2; ++i) {
    const char* name = i == 0 ? "gelu" : "gelu_bwd";
    if (act[i].empty()) continue;
    if (DistinctSizes(act[i]) < 2) {
      out.warnings.push_back(Cat("memory kernel ", name,
                                 ": fewer than 2 distinct sizes; the "
                                 "activation keeps the memory model"));
      continue;
    }
    act_line[i] = FitPoints(act[i], tol);
    v1::MemoryModel* m = i == 0 ? prof.mutable_activation()->mutable_forward()
                                : prof.mutable_activation()->mutable_backward();
    m->set_launch_overhead_us(act_line[i].alpha_us);
    m->set_bandwidth_gbytes_per_s(1e-3 / act_line[i].beta_us_per_byte);
  }

  // ---- The planner must accept what was fitted. ----
  absl::StatusOr<planner::ClusterProfile> converted = proto::ProfileFromProto(prof);
  if (!converted.ok()) return converted.status();
  absl::StatusOr<planner::CostModel> cost = planner::CostModel::Create(*std::move(converted));
  if (!cost.ok()) return cost.status();

  // ---- How well the planner's model reproduces the kernel samples. ----
  {
    std::vector<Obs> obs;
    const v1::ProfileSample* worst = nullptr;
    double worst_err = -1.0, worst_pred = 0.0;
    for (const v1::ProfileSample& s : samples) {
      if (s.op_case() != v1::ProfileSample::kGemm) continue;
      const v1::GemmSample& g = s.gemm();
      const double pred = cost->GemmUs(g.m(), g.n(), g.k());
      obs.push_back({2.0 * double(g.m()) * double(g.n()) * double(g.k()), s.median_us(), pred});
      const double err = std::abs(pred - s.median_us()) / s.median_us();
      if (err > worst_err) {
        worst_err = err;
        worst = &s;
        worst_pred = pred;
      }
    }
    FitQuality q{"gemm", {}, {}};
    FillQuality(std::move(obs), tol, &q.fit);
    q.fit.alpha_us = overhead;  // not a line: beta stays 0
    if (q.fit.max_rel_err > tol) {
      q.warnings.push_back(Cat("gemm: the efficiency table is off by up to ",
                               Percent(q.fit.max_rel_err), ", worst at ", worst->gemm().m(), "x",
                               worst->gemm().n(), "x", worst->gemm().k(), " (measured ",
                               fmt::format("{:.4g}", worst->median_us()), " us, predicted ",
                               fmt::format("{:.4g}", worst_pred), " us)"));
    }
    out.fits.push_back(std::move(q));
  }
  // line: -1 the memory model, 0/1 the activation forward/backward.
  auto memory_quality = [&](std::string what, const std::vector<Obs>& pts, int line) {
    std::vector<Obs> obs = pts;
    for (Obs& o : obs) o.pred = line < 0 ? cost->MemoryBoundUs(o.n) : cost->ActivationUs(o.n, line);
    FitQuality q{std::move(what), {}, {}};
    FillQuality(std::move(obs), tol, &q.fit);
    const LineFit& l = line < 0 ? mem_line : act_line[static_cast<size_t>(line)];
    q.fit.alpha_us = l.alpha_us;
    q.fit.beta_us_per_byte = l.beta_us_per_byte;
    LineWarnings(q, options, "small buffers", "large buffers", &q.warnings);
    out.fits.push_back(std::move(q));
  };
  memory_quality("memory", mem, -1);
  for (const auto& [name, pts] : kernels) {
    memory_quality(Cat("memory kernel ", name), pts,
                   name == "gelu"       ? 0
                   : name == "gelu_bwd" ? 1
                                        : -1);
  }

  // ---- SAA: the planner composes it; compare with the fused measurement. ----
  // Dual (ReduceScatter + AlltoAll) samples have no public builder to compare
  // with: they stay measured only.
  using SaaKey = std::tuple<int, int, int, int, int>;  // a2a r, n, gather r, n, a2a ranks/node
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
    planner::AppendSaa(*cost, a2a, a.a2a_ranks_per_node(), gather, bytes, bytes / a2a.ranks,
                       planner::Phase::kForward, planner::kNoOp, &graph);
    if (absl::Status st = simulator.Run(graph, &sim); !st.ok()) return st;
    saa[{a2a.ranks, a2a.nodes, gather.ranks, gather.nodes, a.a2a_ranks_per_node()}].push_back(
        {bytes, s.median_us(), sim.makespan_us});
  }
  for (const auto& [key, obs] : saa) {
    const auto [ar, an, gr, gn, rpn] = key;
    FitQuality q{Cat("saa a2a ", ar, "x", an, " / gather ", gr, "x", gn), {}, {}};
    FillQuality(obs, tol, &q.fit);
    if (q.fit.max_rel_err > tol) {
      std::string w = Cat(q.what, ": the planner's SAA composition is off by up to ",
                          Percent(q.fit.max_rel_err), " against the fused measurement");
      w += q.fit.holds_to_bytes == 0 ? Cat(" (within ", Percent(tol), " at no measured size)")
                                     : Cat(" (holds from ", Bytes(q.fit.holds_from_bytes), " to ",
                                           Bytes(q.fit.holds_to_bytes), ")");
      q.warnings.push_back(std::move(w));
    }
    out.fits.push_back(std::move(q));
  }
  return out;
}

std::string RenderFitReport(const Calibration& c) {
  const v1::ClusterProfile& p = c.profile;
  std::string out;
  auto line = [&out](std::string_view s) {
    out += s.substr(0, s.find_last_not_of(' ') + 1);  // padded last column: no trailing blanks
    out += '\n';
  };
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
  line("");

  size_t what_w = 4;
  for (const FitQuality& q : c.fits) what_w = std::max(what_w, q.what.size());
  line(fmt::format("{:<{}}  {:>9}  {:>10}  {:>9}  {:>6}  {:>9}  {:<24}  {:<24}", "what", what_w,
                   "alpha us", "beta us/B", "GB/s", "R²", "max err %", "sampled range",
                   "holds range"));
  for (const FitQuality& q : c.fits) {
    const LineFit& f = q.fit;
    // The GEMM row's sizes are flops; rows that are not one line have beta 0.
    auto size = [&q](int64_t v) { return q.what == "gemm" ? Flops(double(v)) : Bytes(double(v)); };
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
  return out;
}

}  // namespace moeplan::calibration
