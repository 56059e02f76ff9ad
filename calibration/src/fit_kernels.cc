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

// The memory kernels that are the expert activation (profiler/README.md).
constexpr std::string_view kGelu = "gelu", kGeluBackward = "gelu_bwd";

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
    g.peak = std::max(g.peak, r);
  }
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

absl::Status FitGemm(const std::vector<v1::ProfileSample>& samples, Calibration* out) {
  std::vector<double> probes;
  std::map<Mnk, std::vector<double>> shapes;
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
  v1::GemmModel* gm = out->profile.mutable_gemm();
  double overhead = 0.0;
  if (!probes.empty()) {
    overhead = Median(std::move(probes));
  } else {
    double fastest = std::numeric_limits<double>::infinity();
    for (const auto& [mnk, ts] : shapes) fastest = std::min(fastest, Median(ts));
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

// The shared line is fitted on the data-movement kernels (copy, order,
// i-order): routing's softmax and top-k are compute-bound on CPUs and would
// drag the shared line (and its launch overhead, charged to every
// memory-bound op) far off; its own quality row says how well the line covers
// it. Routing counts only when nothing else was measured. The expert
// activation (gelu, gelu_bwd) gets lines of its own: on CPUs it is bound by
// tanh, not by memory, and it is a large part of the expert's time.
absl::StatusOr<MemoryFits> FitMemory(const std::vector<v1::ProfileSample>& samples,
                                     double tolerance, Calibration* out) {
  MemoryFits f;
  std::vector<Obs> all_mem;
  std::array<std::vector<Obs>, 2> act;  // forward, backward
  for (const v1::ProfileSample& s : samples) {
    if (s.op_case() != v1::ProfileSample::kMemory) continue;
    const std::string& kernel = s.memory().kernel();
    const Obs o{static_cast<double>(s.memory().bytes()), s.median_us(), 0.0};
    f.kernels[kernel].push_back(o);
    if (kernel == kGelu || kernel == kGeluBackward) {
      act[kernel == kGelu ? 0 : 1].push_back(o);
      continue;
    }
    all_mem.push_back(o);
    if (kernel != "route") f.shared.push_back(o);
  }
  if (DistinctSizes(f.shared) < 2) f.shared = all_mem;
  if (DistinctSizes(f.shared) < 2) {
    return Bad("samples",
               "memory-kernel samples need at least 2 distinct sizes: the planner needs the "
               "memory bandwidth and launch overhead");
  }
  v1::ClusterProfile& prof = out->profile;
  f.shared_line = FitPoints(f.shared, tolerance);
  prof.mutable_memory()->set_launch_overhead_us(f.shared_line.alpha_us);
  prof.mutable_memory()->set_bandwidth_gbytes_per_s(1e-3 / f.shared_line.beta_us_per_byte);
  f.activation = {f.shared_line, f.shared_line};
  for (size_t i = 0; i < 2; ++i) {
    const std::string_view name = i == 0 ? kGelu : kGeluBackward;
    if (act[i].empty()) continue;
    if (DistinctSizes(act[i]) < 2) {
      out->warnings.push_back(Cat("memory kernel ", name,
                                  ": fewer than 2 distinct sizes; the activation keeps the "
                                  "memory model"));
      continue;
    }
    f.activation[i] = FitPoints(act[i], tolerance);
    v1::MemoryModel* m = i == 0 ? prof.mutable_activation()->mutable_forward()
                                : prof.mutable_activation()->mutable_backward();
    m->set_launch_overhead_us(f.activation[i].alpha_us);
    m->set_bandwidth_gbytes_per_s(1e-3 / f.activation[i].beta_us_per_byte);
  }
  return f;
}

namespace {

FitQuality GemmQuality(const std::vector<v1::ProfileSample>& samples,
                       const planner::CostModel& cost, double overhead, double tolerance) {
  std::vector<Obs> obs;
  const v1::ProfileSample* worst = nullptr;
  double worst_err = -1.0, worst_pred = 0.0;
  for (const v1::ProfileSample& s : samples) {
    if (s.op_case() != v1::ProfileSample::kGemm) continue;
    const v1::GemmSample& g = s.gemm();
    const double pred = cost.GemmUs(g.m(), g.n(), g.k());
    obs.push_back({2.0 * double(g.m()) * double(g.n()) * double(g.k()), s.median_us(), pred});
    const double err = std::abs(pred - s.median_us()) / s.median_us();
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
    q.warnings.push_back(Cat("gemm: the efficiency table is off by up to ",
                             FormatPercent(q.fit.max_rel_err), ", worst at ", worst->gemm().m(),
                             "x", worst->gemm().n(), "x", worst->gemm().k(), " (measured ",
                             fmt::format("{:.4g}", worst->median_us()), " us, predicted ",
                             fmt::format("{:.4g}", worst_pred), " us)"));
  }
  return q;
}

}  // namespace

void CompareKernels(const std::vector<v1::ProfileSample>& samples, const planner::CostModel& cost,
                    const MemoryFits& memory, const CalibrateOptions& options, Calibration* out) {
  out->fits.push_back(
      GemmQuality(samples, cost, out->profile.gemm().launch_overhead_us(), options.tolerance));
  // line: -1 the memory model, 0/1 the activation forward/backward.
  auto memory_quality = [&](std::string what, const std::vector<Obs>& pts, int line) {
    std::vector<Obs> obs = pts;
    for (Obs& o : obs) o.pred = line < 0 ? cost.MemoryBoundUs(o.n) : cost.ActivationUs(o.n, line);
    FitQuality q{std::move(what), {}, {}};
    FillQuality(std::move(obs), options.tolerance, &q.fit);
    const LineFit& l = line < 0 ? memory.shared_line : memory.activation[static_cast<size_t>(line)];
    q.fit.alpha_us = l.alpha_us;
    q.fit.beta_us_per_byte = l.beta_us_per_byte;
    LineWarnings(q, options, "small buffers", "large buffers", &q.warnings);
    out->fits.push_back(std::move(q));
  };
  memory_quality("memory", memory.shared, -1);
  for (const auto& [name, pts] : memory.kernels) {
    memory_quality(Cat("memory kernel ", name), pts,
                   name == kGelu           ? 0
                   : name == kGeluBackward ? 1
                                           : -1);
  }
}

}  // namespace moeplan::calibration::internal
