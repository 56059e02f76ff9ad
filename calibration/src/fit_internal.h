// The pieces of Calibrate() (fit.h), one fitter per model behind the driver in
// fit.cc. Private to the calibration library.
//
//   fit_lines.cc        weighted least-squares lines, piecewise lines, fit quality
//   samples.cc          reading and checking samples, names for them
//   fit_collectives.cc  alpha-beta per (collective, group shape), the link levels,
//                       and the SAA cross-check
//   fit_kernels.cc      GEMM efficiency grid, memory and activation lines, and how
//                       well the planner's kernel model reproduces the samples
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/calibration/fit.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/v1/profile.pb.h"
#include "moeplan/v1/samples.pb.h"

namespace moeplan::calibration::internal {

// The beta given to a fit whose timings do not grow with size (flat or noisy
// sweeps): the profile needs beta > 0, and 1e-12 us/B (1e9 GB/s) makes the
// line a constant for every size the planner will ask about.
inline constexpr double kTinyBeta = 1e-12;

// One measured point and what a model predicts for it.
// An AlltoAll through the irregular path (CollectiveSample.load_ratio >= 1,
// even at 1): not part of the AlltoAll fits, they fit the profile's
// AlltoAllSkew instead (FitUneven).
inline bool Irregular(const v1::CollectiveSample& c) { return c.load_ratio() >= 1.0; }

struct Obs {
  double n = 0.0;  // bytes (flops for the GEMM row)
  double t = 0.0;  // measured, us
  double pred = 0.0;
};

inline absl::Status Bad(std::string_view field, std::string_view rule) {
  return absl::InvalidArgumentError(Cat(field, ": ", rule));
}

// ---- fit_lines.cc ----

// Sizes are reported as int64 (the GEMM row's are flops, which can exceed it
// for absurd shapes): saturate instead of overflowing.
int64_t ToInt64(double v);
// How well `pred` matches `t`: R^2 (unweighted), max relative error and the
// widest run of consecutive points (sorted by n) within `tolerance`. Fills
// every LineFit field except alpha and beta.
void FillQuality(std::vector<Obs> obs, double tolerance, LineFit* fit);
// The weighted least-squares line through `pts` (n > 0, t > 0, at least two
// distinct n; duplicates allowed): minimises sum(((alpha + beta n) - t) / t)^2.
LineFit FitPoints(const std::vector<Obs>& pts, double tolerance);
// A piecewise line over `pts` (distinct sizes): (from_bytes, line) per piece,
// the first from 0, at most kMaxPieces.
inline constexpr int kMaxPieces = 4;
std::vector<std::pair<double, LineFit>> FitPieces(std::vector<Obs> pts, double tolerance);
int DistinctSizes(std::vector<Obs> pts);
// Warnings for a fitted line that does not hold, phrased for the person who
// has to decide whether to trust it. `small` / `large` name the ends of the
// sweep ("small messages").
void LineWarnings(const FitQuality& q, const CalibrateOptions& o, std::string_view small,
                  std::string_view large, std::vector<std::string>* out);
// " (holds from 1 KiB to 4 MiB)" or " (within 10 % at no measured size)".
std::string HoldsRange(const LineFit& f, double tolerance);
void SetAlphaBeta(const LineFit& f, v1::AlphaBeta* out);

// ---- samples.cc ----

// "4 ranks / 1 node".
std::string ShapeName(int ranks, int nodes);
// The profile name rule: [a-z0-9._-]+ ("name: ...").
absl::Status CheckName(std::string_view name);
// One run (backend, dtype, layout) and every sample well-formed, named by
// index and op on error.
absl::Status CheckSamples(const std::vector<v1::ProfileSample>& samples);
// What a sample measured, without its timings: "gemm 256x256x256",
// "allgather 4 ranks / 1 node, 65536 bytes".
std::string PointLabel(const v1::ProfileSample& s);
// The generated profile comment: hosts, layout, backend, versions, time.
std::string RunComment(const v1::ProfileRun& r, std::string_view extra);

// ---- fit_collectives.cc ----

// One line (or pieces) per sampled (collective, group shape) into
// `out->profile.collectives`, and the intra / inter link costs from the pair
// SendRecv rows. InvalidArgument when a link level the run spans has no pair.
absl::Status FitCollectives(const std::vector<v1::ProfileSample>& samples,
                            const CalibrateOptions& options, Calibration* out);
// The planner's SAA composition on `cost` against every fused forward SAA
// sample: one quality row per SAA shape.
// Irregular AlltoAll samples: per group shape, the gamma of profile.proto's
// AlltoAllSkew, by least squares on the log error: an uneven sample (load L)
// is modelled as the even irregular one of its size (load 1) times
// E(n (1 + gamma (L - 1))) / E(n), E the even AlltoAll on `cost` (the profile
// fitted so far), so the irregular path's own speed cancels out; without an
// even sample of that size, as E(n (1 + gamma (L - 1))) itself. Adds the
// entries to the profile and one quality row per (shape, load), "alltoall 4
// ranks / 2 nodes heaviest 2x (gamma 0.35)".
absl::Status FitUneven(const std::vector<v1::ProfileSample>& samples,
                       const planner::CostModel& cost, double tolerance, Calibration* out);
absl::Status CompareSaa(const std::vector<v1::ProfileSample>& samples,
                        const planner::CostModel& cost, double tolerance, Calibration* out);

// ---- fit_kernels.cc ----

// Launch overhead, peak and the efficiency grid into `out->profile.gemm`.
absl::Status FitGemm(const std::vector<v1::ProfileSample>& samples, Calibration* out);

// The median speed probe over the GEMM samples (GemmSample.probe_gflops), or
// 0 unless every GEMM sample has one.
double ReferenceProbe(const std::vector<v1::ProfileSample>& samples);

// A GEMM sample's median time held to the machine speed `reference`: the
// time it would have taken had the probe after it read `reference` (time
// scales with probe / reference). Unchanged without a probe or reference.
double AtReferenceSpeed(const v1::ProfileSample& s, double reference);

// The memory-bound kernel samples and the lines fitted to them.
struct MemoryFits {
  std::vector<Obs> shared;                          // the points of the shared line
  std::map<std::string, std::vector<Obs>> kernels;  // every memory kernel's points
  LineFit shared_line;
  // Kernels with lines of their own (gelu, gelu_bwd, order, iorder, route),
  // by name; a kernel missing here (fewer than 2 sizes) uses the shared line.
  std::map<std::string, LineFit, std::less<>> own;
  const LineFit& LineOf(std::string_view kernel) const {
    const auto it = own.find(kernel);
    return it == own.end() ? shared_line : it->second;
  }
};
// The shared memory line and the kernels' own lines into `out->profile`.
absl::StatusOr<MemoryFits> FitMemory(const std::vector<v1::ProfileSample>& samples,
                                     double tolerance, Calibration* out);
// The planner's time for the profiler's memory kernel `kernel` touching
// `bytes`: its own line (activation, order, i-order, route), else the memory
// model.
double MemoryKernelUs(const planner::CostModel& cost, std::string_view kernel, double bytes);
// Quality rows of the planner's kernel model on the fitted profile: "gemm",
// "memory" and one per memory kernel.
void CompareKernels(const std::vector<v1::ProfileSample>& samples, const planner::CostModel& cost,
                    const MemoryFits& memory, const CalibrateOptions& options, Calibration* out);

}  // namespace moeplan::calibration::internal
