// Lines through timings: the weighted least-squares line, piecewise lines for
// sweeps with several regimes, and how well a model reproduces its points.
#include <fmt/format.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <tuple>

#include "fit_internal.h"
#include "moeplan/base/format.h"

namespace moeplan::calibration {
namespace internal {

int64_t ToInt64(double v) {
  constexpr double kMax = 9.2e18;
  return static_cast<int64_t>(std::clamp(v, -kMax, kMax));
}

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

void LineWarnings(const FitQuality& q, const CalibrateOptions& o, std::string_view small,
                  std::string_view large, std::vector<std::string>* out) {
  const LineFit& f = q.fit;
  if (f.max_rel_err > o.tolerance) {
    std::string w = Cat(q.what, ": the line is off by up to ", FormatPercent(f.max_rel_err),
                        HoldsRange(f, o.tolerance));
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

std::string HoldsRange(const LineFit& f, double tolerance) {
  if (f.holds_to_bytes == 0)
    return Cat(" (within ", FormatPercent(tolerance), " at no measured size)");
  return Cat(" (holds from ", FormatBytes(static_cast<double>(f.holds_from_bytes)), " to ",
             FormatBytes(static_cast<double>(f.holds_to_bytes)), ")");
}

void SetAlphaBeta(const LineFit& f, v1::AlphaBeta* out) {
  out->set_alpha_us(f.alpha_us);
  out->set_beta_us_per_byte(f.beta_us_per_byte);
}

}  // namespace internal

using internal::Bad;
using internal::FitPoints;
using internal::Obs;

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

}  // namespace moeplan::calibration
