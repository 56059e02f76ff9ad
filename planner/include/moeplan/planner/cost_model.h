// The cost model of docs/cost-model.md: alpha-beta collectives (fitted per group shape,
// or derived from link-level costs with ring/pairwise formulas), GEMMs with an
// interpolated efficiency table, and memory-bound kernels. Pure functions of a
// validated profile; thread-compatible (const methods are safe to share).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "moeplan/planner/profile.h"

namespace moeplan::planner {

class CostModel {
 public:
  // Validates the profile (ValidateProfile) and precomputes lookup tables.
  static absl::StatusOr<CostModel> Create(ClusterProfile profile);

  const ClusterProfile& profile() const { return profile_; }

  // Time of collective `c` on a group of shape `shape` with per-rank size `bytes`
  // in the convention of profile.proto. A fit for (c, shape) is used when the
  // profile has one (its piece for `bytes` when piecewise); otherwise the
  // link-level fallback:
  //   AllReduce 2(s-1)(a + n/s b); AllGather, ReduceScatter (s-1)(a + n b);
  //   AlltoAll (s-1)(a + n/s b); SendRecv a + n b,
  // with (a, b) of the slowest link the group crosses. Groups of one rank cost 0
  // (SendRecv: the shape is the pair's, ranks == 2).
  double CollectiveUs(Collective c, GroupShape shape, double bytes) const;
  bool HasFit(Collective c, GroupShape shape) const;
  // The bytes an even AlltoAll on `shape` would move to cost what an uneven
  // one of per-rank size `bytes` costs when its heaviest rank receives `skew`
  // times the mean: bytes (1 + gamma (skew - 1)), gamma the profile's for the
  // shape (profile.alltoall_skew), else 1 (bound by the heaviest receiver).
  double SkewedAllToAllBytes(GroupShape shape, double bytes, double skew) const;
  // The link-level costs of the slowest link a group of this shape crosses.
  const AlphaBeta& LinkFor(GroupShape shape) const {
    return shape.SpansNodes() ? profile_.inter : profile_.intra;
  }

  // The dense GEMM peak (TFLOP/s) at elements of `bytes_per_element` bytes, the
  // denominator of MFU: gemm.fp8_peak_tflops for 1-byte elements where the
  // profile sets it, gemm.peak_tflops otherwise.
  double PeakTflops(int bytes_per_element) const;
  // A copy whose GEMMs (GemmUs, BatchedGemmUs) run at PeakTflops(bytes_per_element)
  // times the same efficiency grid; everything else is unchanged. On a profile
  // without an FP8 peak, or for any size but 1, the copy prices GEMMs as a
  // model made by Create does (so AtElementBytes(2) undoes AtElementBytes(1)).
  // profile() stays the profile as given.
  CostModel AtElementBytes(int bytes_per_element) const;

  // One GEMM C[m x n] = A[m x k] B[k x n]: overhead + 2mnk / (peak * eff(m, n, k)),
  // peak the one this model was made at (AtElementBytes; Create: gemm.peak_tflops).
  double GemmUs(int64_t m, int64_t n, int64_t k) const;
  // `batch` GEMMs of one shape in one launch (attention's batched GEMMs):
  // overhead + batch * 2mnk / (peak * eff(m, n, k)).
  double BatchedGemmUs(int64_t batch, int64_t m, int64_t n, int64_t k) const;
  // Trilinear interpolation of the efficiency grid in log2 space, clamped.
  double GemmEfficiency(int64_t m, int64_t n, int64_t k) const;
  // A memory-bound kernel touching `bytes` (read + written).
  double MemoryBoundUs(double bytes) const;
  // The expert activation (forward, or backward) touching `bytes`: the
  // profile's activation line, else the memory model.
  double ActivationUs(double bytes, bool backward) const;
  // The scatter of token rows into the dispatch buffer (inverse = false) or
  // the gather back, touching `bytes`: the profile's kernel line, else the
  // memory model.
  double OrderUs(double bytes, bool inverse) const;
  // Routing's softmax and top-k touching `bytes`: the profile's route line,
  // else the memory model.
  double RouteUs(double bytes) const;

  // An op's cost in context (profile.context.ops): offset + scale * `us` for
  // the op named `op` (without step) holding `resources`; `us` where the
  // profile has no correction for it.
  double InContextUs(std::string_view op, uint8_t resources, double us) const {
    if (op_context_.empty()) return us;
    const auto it = op_context_.find(absl::string_view(op.data(), op.size()));
    if (it == op_context_.end()) return us;
    const OpLine& l = it->second[resources & 7u];
    return l.set ? l.offset_us + l.scale * us : us;
  }

  // A (collective, group shape) as one integer: the fits' key.
  static uint64_t FitKey(Collective c, GroupShape shape);

 private:
  explicit CostModel(ClusterProfile profile);

  // A fit's pieces inline (no pointer chasing in the simulator's hot path):
  // the last piece whose `from` is <= n applies.
  struct Piecewise {
    int count = 0;
    std::array<double, kMaxFitPieces> from{};
    std::array<AlphaBeta, kMaxFitPieces> cost{};
    double At(double n) const {
      int i = count - 1;
      while (i > 0 && n < from[static_cast<size_t>(i)]) --i;
      return cost[static_cast<size_t>(i)].At(n);
    }
  };

  // The efficiency grid's interpolation, uncached.
  double InterpolateGemmEfficiency(int64_t m, int64_t n, int64_t k) const;

  ClusterProfile profile_;
  // Names this model's efficiency grid in GemmEfficiency's per-thread memo
  // (unique per constructed model; copies share the grid and the id).
  uint64_t grid_id_ = 0;
  absl::flat_hash_map<uint64_t, Piecewise> fits_;
  std::array<std::vector<double>, 3> log_axes_;  // log2 of m, n, k grid axes
  double flops_per_us_ = 0.0;  // the GEMM peak in use (AtElementBytes), in flop per microsecond
  double mem_bytes_per_us_ = 0.0;
  struct ActLine {
    double overhead_us = 0.0;
    double bytes_per_us = 1.0;
  };
  // Lines of their own: activation forward and backward, order, i-order, route.
  enum Line : size_t { kActForward, kActBackward, kOrderLine, kIOrderLine, kRouteLine, kLines };
  std::array<ActLine, kLines> act_{};
  double LineUs(Line line, double bytes) const {
    if (bytes <= 0.0) return 0.0;
    const ActLine& l = act_[line];
    return l.overhead_us + bytes / l.bytes_per_us;
  }
  struct OpLine {
    bool set = false;
    double offset_us = 0.0;
    double scale = 1.0;
  };
  // Op name -> correction per resource mask (3 bits).
  absl::flat_hash_map<std::string, std::array<OpLine, 8>> op_context_;
};

}  // namespace moeplan::planner
