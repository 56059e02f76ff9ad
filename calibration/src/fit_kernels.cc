// Kernels: the GEMM efficiency grid, the memory-bound line and the activation
// lines, and how well the planner's kernel model reproduces the samples.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>

#include "fit_internal.h"
#include "moeplan/base/format.h"
#include "moeplan/base/stats.h"

namespace moeplan::calibration::internal {
namespace {

// GEMM efficiencies are clamped into [kMinEfficiency, 1]: the profile needs
// them > 0, and a shape 10^4 times slower than the best is a measurement error.
constexpr double kMinEfficiency = 1e-4;
// A GEMM not measurably slower than the empty launch carries no rate
// information; its compute time is floored at this fraction of its measured
// time so that one noisy small shape cannot set an absurd peak.
constexpr double kMinBusyFraction = 0.01;
// The peak is the fastest rate among shapes that spend at least this share of
// their measured time computing: a shape that barely outlasts the launch
// overhead has a rate that is mostly noise (a GPU hides part of the launch
// behind the kernel, so t - overhead can be far below the kernel's time), and
// one such rate, taken as the peak, would rescale every efficiency and let the
// planner's interpolation between cells run faster than any GEMM measured.
constexpr double kPeakBusyFraction = 0.5;

// The memory kernels that are the expert activation (profiler/README.md).
constexpr std::string_view kGelu = "gelu", kGeluBackward = "gelu_bwd";
// The layer's data-movement and routing kernels, and plain streaming.
constexpr std::string_view kOrder = "order", kIOrder = "iorder", kRoute = "route", kCopy = "copy";

using Mnk = std::tuple<int64_t, int64_t, int64_t>;

// The sampled GEMM shapes on their sorted axes, with the rate (flop/us) of
// every grid cell; < 0 where the shape was not sampled.
struct GemmGrid {
  std::vector<int64_t> axes[3];
  std::vector<double> rate;
  double peak = 0.0;

  size_t Cell(int64_t m, int64_t n, int64_t k) const {
    auto index_of = [](const std::vector<int64_t>& axis, int64_t v) {
      return static_cast<size_t>(std::lower_bound(axis.begin(), axis.end(), v) - axis.begin());
    };
    return (index_of(axes[0], m) * axes[1].size() + index_of(axes[1], n)) * axes[2].size() +
           index_of(axes[2], k);
  }
};

GemmGrid RatesOf(const std::map<Mnk, std::vector<double>>& shapes, double overhead) {
  GemmGrid g;
  for (const auto& [mnk, ts] : shapes) {
    g.axes[0].push_back(std::get<0>(mnk));
    g.axes[1].push_back(std::get<1>(mnk));
    g.axes[2].push_back(std::get<2>(mnk));
  }
  for (std::vector<int64_t>& a : g.axes) {
    std::sort(a.begin(), a.end());
    a.erase(std::unique(a.begin(), a.end()), a.end());
  }
  g.rate.assign(g.axes[0].size() * g.axes[1].size() * g.axes[2].size(), -1.0);
  double any_peak = 0.0;
  for (const auto& [mnk, ts] : shapes) {
    const auto [m, n, k] = mnk;
    // Several samples of one shape are its transpose variants (NN, NT, TN):
    // the executor runs each about equally often (forward, input gradient,
    // weight gradient) and the planner's GEMM has no transpose, so their mean.
    double t = 0.0;
    for (double x : ts) t += x / static_cast<double>(ts.size());
    const double flops = 2.0 * double(m) * double(n) * double(k);
    const double r = flops / std::max(t - overhead, kMinBusyFraction * t);
    g.rate[g.Cell(m, n, k)] = r;
    any_peak = std::max(any_peak, r);
    if (t - overhead >= kPeakBusyFraction * t) g.peak = std::max(g.peak, r);
  }
  if (g.peak <= 0.0) g.peak = any_peak;  // only launch-bound shapes: nothing better
  return g;
}

// The efficiency of an unsampled cell (the profiler skips shapes above its
// flop cap): that of the nearest sampled shape in log2(m, n, k); on a tie the
// larger shape, since the missing ones are the large ones.
double NearestEfficiency(const GemmGrid& g, const std::map<Mnk, std::vector<double>>& shapes,
                         int64_t cm, int64_t cn, int64_t ck) {
  const double lx[3] = {std::log2(double(cm)), std::log2(double(cn)), std::log2(double(ck))};
  double best_d = std::numeric_limits<double>::infinity(), best_flops = -1.0, eff = 0.0;
  for (const auto& [mnk, ts] : shapes) {
    const auto [m, n, k] = mnk;
    const double dm = std::log2(double(m)) - lx[0], dn = std::log2(double(n)) - lx[1],
                 dk = std::log2(double(k)) - lx[2];
    const double d = dm * dm + dn * dn + dk * dk;
    const double flops = double(m) * double(n) * double(k);
    if (d < best_d || (d == best_d && flops > best_flops)) {
      best_d = d;
      best_flops = flops;
      eff = g.rate[g.Cell(m, n, k)] / g.peak;
    }
  }
  return eff;
}

}  // namespace

double ReferenceProbe(const std::vector<v1::ProfileSample>& samples) {
  std::vector<double> probes;
  for (const v1::ProfileSample& s : samples) {
    if (s.op_case() != v1::ProfileSample::kGemm) continue;
    const double p = s.gemm().probe_gflops();
    if (!(p > 0.0) || !std::isfinite(p)) return 0.0;
    probes.push_back(p);
  }
  return probes.empty() ? 0.0 : Median(std::move(probes));
}

double AtReferenceSpeed(const v1::ProfileSample& s, double reference) {
  const double p = s.has_gemm() ? s.gemm().probe_gflops() : 0.0;
  return reference > 0.0 && p > 0.0 ? s.median_us() * p / reference : s.median_us();
}

absl::Status FitGemm(const std::vector<v1::ProfileSample>& samples, Calibration* out) {
  std::vector<double> probes;
  std::map<Mnk, std::vector<double>> shapes;
  // Every sample held to the sweep's median machine speed, so that the
  // machine drifting during the sweep does not land in the grid.
  const double reference = ReferenceProbe(samples);
  if (reference > 0.0) out->profile.mutable_provenance()->set_probe_gflops(reference);
  for (const v1::ProfileSample& s : samples) {
    if (s.op_case() != v1::ProfileSample::kGemm) continue;
    const v1::GemmSample& g = s.gemm();
    if (g.m() == 1 && g.n() == 1 && g.k() == 1) {
      probes.push_back(s.median_us());
    } else {
      shapes[{g.m(), g.n(), g.k()}].push_back(AtReferenceSpeed(s, reference));
    }
  }
  if (shapes.empty()) {
    return Bad("samples",
               "no GEMM samples besides the 1x1x1 launch probe: the planner needs peak_tflops");
  }
  v1::GemmModel* gm = out->profile.mutable_gemm();
  // The fastest GEMM bounds the launch overhead (or stands in for a missing probe).
  double fastest = std::numeric_limits<double>::infinity();
  Mnk at{};
  for (const auto& [mnk, ts] : shapes) {
    if (const double t = Median(ts); t < fastest) {
      fastest = t;
      at = mnk;
    }
  }
  double overhead = 0.0;
  if (!probes.empty()) {
    overhead = Median(std::move(probes));
    // A launch costs no more than the fastest whole GEMM: a probe slower than
    // that took another path (a GEMV kernel, a heuristic lookup) and would
    // charge its extra to every GEMM.
    if (fastest < overhead) {
      out->warnings.push_back(Cat("gemm: the 1x1x1 launch probe (", fmt::format("{:.3g}", overhead),
                                  " us) took longer than the ", std::get<0>(at), "x",
                                  std::get<1>(at), "x", std::get<2>(at), " GEMM (",
                                  fmt::format("{:.3g}", fastest),
                                  " us): the launch overhead is taken as the latter"));
      overhead = fastest;
    }
  } else {
    overhead = 0.5 * fastest;
    out->warnings.push_back(
        Cat("gemm: no 1x1x1 launch probe; launch overhead taken as half the fastest GEMM (",
            fmt::format("{:.3g}", overhead), " us)"));
  }
  gm->set_launch_overhead_us(overhead);
  const GemmGrid grid = RatesOf(shapes, overhead);
  gm->set_peak_tflops(grid.peak / 1e6);  // flop/us -> TFLOP/s
  for (size_t a = 0; a < 3; ++a) {
    auto* field = a == 0 ? gm->mutable_m() : a == 1 ? gm->mutable_n() : gm->mutable_k();
    for (int64_t v : grid.axes[a]) field->Add(static_cast<int32_t>(v));
  }
  int filled = 0;
  for (int64_t m : grid.axes[0]) {
    for (int64_t n : grid.axes[1]) {
      for (int64_t k : grid.axes[2]) {
        const double rate = grid.rate[grid.Cell(m, n, k)];
        double eff = rate / grid.peak;
        if (rate < 0.0) {
          ++filled;
          eff = NearestEfficiency(grid, shapes, m, n, k);
        }
        gm->add_efficiency(std::clamp(eff, kMinEfficiency, 1.0));
      }
    }
  }
  if (filled > 0) {
    out->warnings.push_back(Cat("gemm: ", filled, " of ", grid.rate.size(),
                                " grid points were not measured (above the profiler's flop cap?); "
                                "filled with the efficiency of the nearest measured shape"));
  }
  return absl::OkStatus();
}

// The shared line (plain streaming: splits, element-wise ops, the optimizer)
// is fitted on the copy kernel; without copy samples, on every kernel but
// routing, and without those on routing. The layer's own kernels get lines of
// their own: the scatter (order) and gather (iorder) move rows by index and
// run well below streaming speed on GPUs; routing's softmax and top-k are
// latency-bound on GPUs and compute-bound on CPUs; the expert activation
// (gelu, gelu_bwd) is bound by tanh on CPUs.
absl::StatusOr<MemoryFits> FitMemory(const std::vector<v1::ProfileSample>& samples,
                                     double tolerance, Calibration* out) {
  MemoryFits f;
  for (const v1::ProfileSample& s : samples) {
    if (s.op_case() != v1::ProfileSample::kMemory) continue;
    f.kernels[s.memory().kernel()].push_back(
        {static_cast<double>(s.memory().bytes()), s.median_us(), 0.0});
  }
  auto gather = [&f](auto keep) {
    std::vector<Obs> pts;
    for (const auto& [kernel, obs] : f.kernels) {
      if (keep(std::string_view(kernel))) pts.insert(pts.end(), obs.begin(), obs.end());
    }
    return pts;
  };
  f.shared = gather([](std::string_view k) { return k == kCopy; });
  if (DistinctSizes(f.shared) < 2) {
    f.shared =
        gather([](std::string_view k) { return k != kRoute && k != kGelu && k != kGeluBackward; });
  }
  if (DistinctSizes(f.shared) < 2) {
    f.shared = gather([](std::string_view k) { return k != kGelu && k != kGeluBackward; });
  }
  if (DistinctSizes(f.shared) < 2) {
    return Bad("samples",
               "memory-kernel samples need at least 2 distinct sizes: the planner needs the "
               "memory bandwidth and launch overhead");
  }
  v1::ClusterProfile& prof = out->profile;
  f.shared_line = FitPoints(f.shared, tolerance);
  prof.mutable_memory()->set_launch_overhead_us(f.shared_line.alpha_us);
  prof.mutable_memory()->set_bandwidth_gbytes_per_s(1e-3 / f.shared_line.beta_us_per_byte);
  const std::pair<std::string_view, v1::MemoryModel*> own[] = {
      {kGelu, prof.mutable_activation()->mutable_forward()},
      {kGeluBackward, prof.mutable_activation()->mutable_backward()},
      {kOrder, prof.mutable_kernels()->mutable_order()},
      {kIOrder, prof.mutable_kernels()->mutable_iorder()},
      {kRoute, prof.mutable_kernels()->mutable_route()}};
  for (const auto& [name, model] : own) {
    const auto it = f.kernels.find(std::string(name));
    if (it == f.kernels.end()) continue;
    if (DistinctSizes(it->second) < 2) {
      out->warnings.push_back(
          Cat("memory kernel ", name, ": fewer than 2 distinct sizes; it keeps the memory model"));
      continue;
    }
    const LineFit line = FitPoints(it->second, tolerance);
    f.own.emplace(name, line);
    model->set_launch_overhead_us(line.alpha_us);
    model->set_bandwidth_gbytes_per_s(1e-3 / line.beta_us_per_byte);
  }
  // Leave out what was not fitted (an unset line is the memory model).
  auto fitted = [](const v1::MemoryModel& m) { return m.bandwidth_gbytes_per_s() > 0.0; };
  if (!fitted(prof.activation().forward()) && !fitted(prof.activation().backward())) {
    prof.clear_activation();
  }
  if (!fitted(prof.kernels().order()) && !fitted(prof.kernels().iorder()) &&
      !fitted(prof.kernels().route())) {
    prof.clear_kernels();
  }
  return f;
}

namespace {

FitQuality GemmQuality(const std::vector<v1::ProfileSample>& samples,
                       const planner::CostModel& cost, double overhead, double tolerance) {
  std::vector<Obs> obs;
  const v1::ProfileSample* worst = nullptr;
  double worst_err = -1.0, worst_pred = 0.0;
  const double reference = ReferenceProbe(samples);
  for (const v1::ProfileSample& s : samples) {
    if (s.op_case() != v1::ProfileSample::kGemm) continue;
    const v1::GemmSample& g = s.gemm();
    const double pred = cost.GemmUs(g.m(), g.n(), g.k());
    const double t = AtReferenceSpeed(s, reference);
    obs.push_back({2.0 * double(g.m()) * double(g.n()) * double(g.k()), t, pred});
    const double err = std::abs(pred - t) / t;
    if (err > worst_err) {
      worst_err = err;
      worst = &s;
      worst_pred = pred;
    }
  }
  FitQuality q{"gemm", {}, {}};
  FillQuality(std::move(obs), tolerance, &q.fit);
  q.fit.alpha_us = overhead;  // not a line: beta stays 0
  if (q.fit.max_rel_err > tolerance) {
    q.warnings.push_back(
        Cat("gemm: the efficiency table is off by up to ", FormatPercent(q.fit.max_rel_err),
            ", worst at ", worst->gemm().m(), "x", worst->gemm().n(), "x", worst->gemm().k(),
            " (measured ", fmt::format("{:.4g}", AtReferenceSpeed(*worst, reference)),
            " us at the reference speed, predicted ", fmt::format("{:.4g}", worst_pred), " us)"));
  }
  return q;
}

}  // namespace

double MemoryKernelUs(const planner::CostModel& cost, std::string_view kernel, double bytes) {
  if (kernel == kGelu || kernel == kGeluBackward) return cost.ActivationUs(bytes, kernel != kGelu);
  if (kernel == kOrder || kernel == kIOrder) return cost.OrderUs(bytes, kernel == kIOrder);
  if (kernel == kRoute) return cost.RouteUs(bytes);
  return cost.MemoryBoundUs(bytes);
}

void CompareKernels(const std::vector<v1::ProfileSample>& samples, const planner::CostModel& cost,
                    const MemoryFits& memory, const CalibrateOptions& options, Calibration* out) {
  out->fits.push_back(
      GemmQuality(samples, cost, out->profile.gemm().launch_overhead_us(), options.tolerance));
  auto memory_quality = [&](std::string what, const std::vector<Obs>& pts, std::string_view kernel,
                            const LineFit& l) {
    std::vector<Obs> obs = pts;
    for (Obs& o : obs) o.pred = MemoryKernelUs(cost, kernel, o.n);
    FitQuality q{std::move(what), {}, {}};
    FillQuality(std::move(obs), options.tolerance, &q.fit);
    q.fit.alpha_us = l.alpha_us;
    q.fit.beta_us_per_byte = l.beta_us_per_byte;
    LineWarnings(q, options, "small buffers", "large buffers", &q.warnings);
    out->fits.push_back(std::move(q));
  };
  memory_quality("memory", memory.shared, kCopy, memory.shared_line);
  for (const auto& [name, pts] : memory.kernels) {
    memory_quality(Cat("memory kernel ", name), pts, name, memory.LineOf(name));
  }
}

}  // namespace moeplan::calibration::internal
