// In-context op corrections fitted on measured layers (context_fit.h).
#include "moeplan/calibration/context_fit.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <utility>

#include "fit_internal.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/calibration/report_bounds.h"
#include "validation_internal.h"

namespace moeplan::calibration {
namespace {

using internal::Obs;

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The scale through the origin minimising sum(((s x - t) / t)^2).
double ScaleOnly(const std::vector<Obs>& pts) {
  double sxx = 0.0, sx = 0.0;
  for (const Obs& p : pts) {
    const double r = p.n / p.t;
    sxx += r * r;
    sx += r;
  }
  return sxx > 0.0 ? sx / sxx : 1.0;
}

struct Line {
  double offset = 0.0, scale = 1.0;
};

Line FitOne(const std::vector<Obs>& pts, bool line, double tolerance) {
  if (!line) return {0.0, ScaleOnly(pts)};
  const LineFit f = internal::FitPoints(pts, tolerance);
  // A flat fit (no growth with the model's cost) is no correction of it.
  if (!(f.beta_us_per_byte > internal::kTinyBeta)) return {0.0, ScaleOnly(pts)};
  return {f.alpha_us, f.beta_us_per_byte};
}

bool UseLine(const std::vector<Obs>& pts, const OpContextOptions& o) {
  std::vector<double> xs;
  for (const Obs& p : pts) xs.push_back(p.n);
  std::sort(xs.begin(), xs.end());
  xs.erase(std::unique(xs.begin(), xs.end()), xs.end());
  return static_cast<int>(xs.size()) >= o.line_min_distinct && xs.back() >= o.min_span * xs.front();
}

// The scale refitted on resamples of the instances (the same model choice):
// the half-width of its central 95 % in % of the scale.
double ScaleCiPct(const std::vector<Obs>& pts, bool line, double scale, const OpContextOptions& o,
                  std::mt19937_64& rng) {
  std::vector<double> scales;
  std::vector<Obs> re(pts.size());
  std::uniform_int_distribution<size_t> pick(0, pts.size() - 1);
  for (int b = 0; b < o.bootstrap; ++b) {
    for (Obs& r : re) r = pts[pick(rng)];
    // A line needs two distinct predicted durations; a resample without
    // them says nothing about the line's scale.
    if (line && internal::DistinctSizes(re) < 2) continue;
    scales.push_back(FitOne(re, line, o.tolerance).scale);
  }
  if (scales.empty()) scales.push_back(scale);
  std::sort(scales.begin(), scales.end());
  const auto at = [&](double q) {
    return scales[static_cast<size_t>(std::lround(q * static_cast<double>(scales.size() - 1)))];
  };
  return (at(0.975) - at(0.025)) / 2.0 / scale * 100.0;
}

}  // namespace

std::string_view OpBaseName(std::string_view name) {
  // A pipeline program's "s<stage>.", "c<chunk>." and "mb<i>.", then a
  // model's "b<block>." and "moe." in front (op_graph.cc's Op::Name).
  for (std::string_view prefix : {"s", "c", "mb", "b"}) {
    if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) continue;
    const size_t dot = name.find('.');
    if (dot != std::string_view::npos && dot > prefix.size() &&
        AllDigits(name.substr(prefix.size(), dot - prefix.size()))) {
      name.remove_prefix(dot + 1);
    }
  }
  if (name.substr(0, 4) == "moe.") name.remove_prefix(4);
  // Steps and parts at the end, innermost last.
  for (;;) {
    const size_t dot = name.rfind('.');
    if (dot == std::string_view::npos) return name;
    std::string_view tail = name.substr(dot + 1);
    if (!tail.empty() && tail[0] == 'p') tail.remove_prefix(1);
    if (!AllDigits(tail)) return name;
    name = name.substr(0, dot);
  }
}

absl::StatusOr<std::vector<v1::OpContext>> FitOpContexts(
    const std::vector<ValidationInput>& inputs, const OpContextOptions& o,
    std::vector<OpContextRejection>* rejected) {
  OpContextSamples samples;
  for (const ValidationInput& in : inputs) MOEPLAN_RETURN_IF_ERROR(samples.Add(in));
  return samples.Fit(o, rejected);
}

absl::Status OpContextSamples::Add(const ValidationInput& in) {
  MOEPLAN_ASSIGN_OR_RETURN(const std::vector<internal::Timeline> measured,
                           internal::TimelinesOf(in, true));
  MOEPLAN_ASSIGN_OR_RETURN(const std::vector<internal::Timeline> predicted,
                           internal::TimelinesOf(in, false));
  for (const internal::Timeline& m : measured) {
    const internal::Timeline* pred = internal::Find(predicted, m.candidate);
    if (pred == nullptr) continue;
    std::map<std::string_view, const v1::OpTiming*> by_name;
    for (const v1::OpTiming& op : *pred->ops) by_name.emplace(op.name(), &op);
    for (const v1::OpTiming& op : *m.ops) {
      const auto it = by_name.find(op.name());
      if (it == by_name.end()) continue;
      const double x = it->second->end_us() - it->second->start_us();
      const double t = op.end_us() - op.start_us();
      if (!(x > 0.0) || !(t > 0.0) || !std::isfinite(x) || !std::isfinite(t)) continue;
      groups_[{std::string(OpBaseName(op.name())), it->second->resource()}].push_back({x, t});
    }
  }
  ++inputs_;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::OpContext>> OpContextSamples::Fit(
    const OpContextOptions& o, std::vector<OpContextRejection>* rejected) const {
  if (inputs_ == 0)
    return absl::InvalidArgumentError("op contexts: no measured configs to fit on");
  if (o.min_samples < 2 || o.line_min_distinct < 2 || !(o.min_span >= 1.0) || o.bootstrap < 0) {
    return absl::InvalidArgumentError(
        "op contexts: min_samples and line_min_distinct must be >= 2, min_span >= 1, "
        "bootstrap >= 0");
  }
  std::vector<v1::OpContext> out;
  std::mt19937_64 rng(o.seed);
  for (const auto& [key, points] : groups_) {
    std::vector<Obs> pts;
    pts.reserve(points.size());
    for (const Point& p : points) pts.push_back({p.predicted_us, p.measured_us, 0.0});
    const int n = static_cast<int>(pts.size());
    if (n < o.min_samples) {
      if (rejected != nullptr) {
        rejected->push_back({key.first, key.second, n,
                             fmt::format("fewer than the {} a fit needs", o.min_samples)});
      }
      continue;
    }
    const bool line = UseLine(pts, o);
    const Line fit = FitOne(pts, line, o.tolerance);
    // Bounded from both sides (report_bounds.h): a correction that makes an
    // op 100 times faster or slower than the profile's own model is not one.
    if (!(fit.scale >= kMinContextScale && fit.scale <= kMaxContextScale) || !(fit.offset >= 0.0)) {
      if (rejected != nullptr) {
        rejected->push_back(
            {key.first, key.second, n,
             fmt::format("its fit (scale {:g}, offset {:g} us) is out of bounds: the scale must "
                         "lie in [{:g}, {:g}] and the offset be >= 0",
                         fit.scale, fit.offset, kMinContextScale, kMaxContextScale)});
      }
      continue;
    }
    v1::OpContext c;
    c.set_op(key.first);
    c.set_resource(key.second);
    c.set_offset_us(fit.offset);
    c.set_scale(fit.scale);
    c.set_samples(static_cast<int>(pts.size()));
    std::vector<Obs> obs = pts;
    for (Obs& p : obs) p.pred = fit.offset + fit.scale * p.n;
    LineFit q;
    internal::FillQuality(obs, o.tolerance, &q);
    c.set_r_squared(q.r_squared);
    c.set_max_error_pct(q.max_rel_err * 100.0);
    if (o.bootstrap > 0) c.set_scale_ci_pct(ScaleCiPct(pts, line, fit.scale, o, rng));
    out.push_back(std::move(c));
  }
  return out;
}

std::string RenderOpContexts(const std::vector<v1::OpContext>& ops) {
  std::string md =
      "| op | resource | instances | offset µs | scale | scale 95 % ± | R² | max error % |\n"
      "|---|---|---:|---:|---:|---:|---:|---:|\n";
  for (const v1::OpContext& c : ops) {
    md += fmt::format("| {} | {} | {} | {:.1f} | {:.3f} | {:.1f} % | {:.3f} | {:.1f} |\n", c.op(),
                      c.resource(), c.samples(), c.offset_us(), c.scale(), c.scale_ci_pct(),
                      c.r_squared(), c.max_error_pct());
  }
  return md;
}

}  // namespace moeplan::calibration
