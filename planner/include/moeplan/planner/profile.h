// Cluster profile: the constants of the cost model (docs/cost-model.md). Times in
// microseconds, sizes in bytes. Converted from moeplan.v1.ClusterProfile by proto/.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "moeplan/planner/types.h"

namespace moeplan::planner {

enum class Collective : uint8_t { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kSendRecv };
inline constexpr int kNumCollectives = 5;
std::string_view CollectiveName(Collective c);  // "allreduce", "allgather", ...

enum class ProfileSource : uint8_t { kUnspecified, kMeasured, kSpec };

// t(n) = alpha_us + beta_us_per_byte * n.
struct AlphaBeta {
  double alpha_us = 0.0;
  double beta_us_per_byte = 0.0;
  double At(double bytes) const { return alpha_us + beta_us_per_byte * bytes; }
};

// `ranks` ranks spread evenly over `nodes` nodes.
struct GroupShape {
  int ranks = 1;
  int nodes = 1;
  bool SpansNodes() const { return nodes > 1; }
  int RanksPerNode() const { return ranks / nodes; }
  friend bool operator==(const GroupShape&, const GroupShape&) = default;
};

// One piece of a piecewise cost: applies from `from_bytes` to the next piece's.
struct FitPiece {
  double from_bytes = 0.0;
  AlphaBeta cost;
};
inline constexpr int kMaxFitPieces = 8;

// A fitted (collective, shape) cost; n in the proto's convention (see profile.proto).
// `pieces` (first from 0, strictly increasing, at most kMaxFitPieces) takes
// precedence over `cost` when not empty.
struct CollectiveFit {
  Collective collective = Collective::kAllReduce;
  GroupShape shape;
  AlphaBeta cost;
  std::vector<FitPiece> pieces;
};

// efficiency over an m x n x k grid (axes strictly increasing), m-major.
struct GemmEfficiencyGrid {
  std::vector<int64_t> m, n, k;
  std::vector<double> efficiency;
};

struct GemmModel {
  double peak_tflops = 0.0;
  double launch_overhead_us = 0.0;
  // Dense peak at 1-byte (FP8) elements; 0 = unset: no FP8 tensor cores, 1-byte
  // GEMMs run at peak_tflops (CostModel::AtElementBytes).
  double fp8_peak_tflops = 0.0;
  GemmEfficiencyGrid grid;  // empty: efficiency 1
};

struct MemoryModel {
  double bandwidth_gbytes_per_s = 0.0;
  double launch_overhead_us = 0.0;
};

// The expert activation, forward and backward; bandwidth 0 = the memory model.
struct ActivationModel {
  MemoryModel forward;
  MemoryModel backward;
};

// The layer's row scatter (order), row gather (i-order) and routing kernels
// (profile.proto's KernelModels); bandwidth 0 = the memory model.
struct KernelModels {
  MemoryModel order;
  MemoryModel iorder;
  MemoryModel route;
};

// In-context costs (docs/cost-model.md "In context"; profile.proto's
// ContextModel). An op correction: the op `op` (its name without step) holding
// `resources` (op_graph.h's Resource bits) costs offset_us + scale * its cost.
struct OpContext {
  std::string op;
  uint8_t resources = 0;
  double offset_us = 0.0;
  double scale = 1.0;
};
inline constexpr size_t kMaxOpContexts = 4096;
// An in-context correction's scale (measured / the profile's own cost of an
// op) lies in [kMinContextScale, kMaxContextScale]: the profile's isolated
// model was measured on the same machine, so an op 100 times slower or faster
// in context says the report (or the profile) is wrong, not the context. The
// shipped testbed refit spans 0.08 to 4.5. A refit never fits outside them, and
// a profile that carries one is refused.
inline constexpr double kMinContextScale = 0.01;
inline constexpr double kMaxContextScale = 100.0;

struct ContextModel {
  // Collectives measured after a compute phase: replace the isolated fit of
  // the same (collective, shape).
  std::vector<CollectiveFit> collectives;
  std::vector<OpContext> ops;
};

// An uneven AlltoAll on one group shape (profile.proto AlltoAllSkew): the
// heaviest rank receiving s times the mean costs as an even AlltoAll of
// n (1 + gamma (s - 1)) bytes.
struct AlltoAllSkew {
  GroupShape shape;
  double gamma = 1.0;  // [0, 1]
};

struct ClusterProfile {
  std::string name;
  uint32_t version = 0;
  ProfileSource source = ProfileSource::kUnspecified;
  ClusterShape shape;
  AlphaBeta intra;  // link level, used where no fit exists
  AlphaBeta inter;
  std::vector<CollectiveFit> collectives;
  GemmModel gemm;
  MemoryModel memory;
  ActivationModel activation;
  KernelModels kernels;
  ContextModel context;
  std::vector<AlltoAllSkew> alltoall_skew;  // shapes without an entry: gamma 1
  double gpu_memory_gib = 0.0;              // per GPU; 0: unknown (memory is not checked)
};

// Field rules of a profile; errors name the JSON path, e.g. "links.inter.beta_us_per_byte".
absl::Status ValidateProfile(const ClusterProfile& profile);

}  // namespace moeplan::planner
