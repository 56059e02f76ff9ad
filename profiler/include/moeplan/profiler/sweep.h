// What moeplan-profile measures (docs/cost-model.md): the group shapes of a cluster of
// `nodes` x `ranks_per_node` ranks, how each shape's sibling groups are formed,
// and the points of the sweep. Pure: no MPI, no devices, so it is unit-tested.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "moeplan/planner/profile.h"

namespace moeplan::profiler {

using planner::Collective;
using planner::GroupShape;

// Ranks are numbered node-major: rank = node * ranks_per_node + local.
struct NodeLayout {
  int nodes = 1;
  int ranks_per_node = 1;
  int ranks() const { return nodes * ranks_per_node; }
};

// The shapes the planner can ask for on this layout: intra-node groups of r
// ranks (r | ranks_per_node), inter-node groups of n nodes with one rank each
// (n | nodes), and hierarchical groups of r ranks on each of n nodes — every
// (r, n) with r | ranks_per_node, n | nodes, r * n >= 2. Sorted by (nodes, ranks).
std::vector<GroupShape> ProfiledShapes(const NodeLayout& layout);

// The sibling groups of `shape` that together cover every rank: nodes are taken
// in consecutive blocks of shape.nodes, and each node's ranks in consecutive
// slices of shape.RanksPerNode(). Returns (color, key) for `rank`: the group id
// and the rank's position in its group (node-major inside the group).
struct GroupSlot {
  int color = 0;
  int key = 0;
};
GroupSlot SlotOf(const NodeLayout& layout, GroupShape shape, int rank);
int GroupsOf(const NodeLayout& layout, GroupShape shape);

// SAA's two groups as S2 forms them (docs/schedules.md): consecutive gather groups of
// `gather_ranks` (the MP group) and AlltoAll groups strided by it (EP).
struct SaaShape {
  int gather_ranks = 1;
  GroupShape gather;
  GroupShape a2a;
  int a2a_ranks_per_node = 1;
};
// One per divisor N of the world with 1 < N and P / N > 1 and N <= ranks_per_node
// (the MP group inside a node, as Parm assumes), shapes as the planner's
// MakeTopology computes them.
std::vector<SaaShape> SaaShapes(const NodeLayout& layout);

// nccl-tests' bandwidth figures for one collective of `bytes` (the proto
// convention) on `ranks` ranks taking `us`: algbw = S / t with S the data size
// nccl-tests reports (AllGather: the output, ReduceScatter: the input, others:
// the buffer), busbw = algbw * (AllReduce 2(n-1)/n; AllGather, ReduceScatter,
// AlltoAll (n-1)/n; SendRecv 1). GB/s (1e9 bytes).
struct Bandwidth {
  double algbw = 0.0;
  double busbw = 0.0;
};
Bandwidth BandwidthOf(Collective c, int ranks, int64_t bytes, double us);

// The compute phase of in-context points: square GEMMs of this size.
inline constexpr int64_t kContextGemm = 256;

// The memory-bound kernels run on a fixed routing of S tokens: E experts, top-k,
// capacity factor 1 (T = ceil(k S / E) slots per expert).
inline constexpr int64_t kMemoryExperts = 16;
inline constexpr int64_t kMemoryTopK = 2;
// The memory-bound kernels swept, in order: data movement, routing (softmax and
// top-k), and the expert activation forward and backward (GELU; compute-bound
// on CPUs, so calibrate fits it its own lines).
inline constexpr std::array<std::string_view, 6> kMemoryKernels = {"copy",  "order", "iorder",
                                                                   "route", "gelu",  "gelu_bwd"};

struct SweepOptions {
  int64_t min_bytes = 1 << 10;
  int64_t max_bytes = int64_t{256} << 20;
  int size_step = 2;  // multiply by this from min to max
  std::vector<Collective> collectives = {Collective::kAllReduce, Collective::kAllGather,
                                         Collective::kReduceScatter, Collective::kAllToAll,
                                         Collective::kSendRecv};
  // Irregular AlltoAll (AlltoAllv), whatever `collectives` holds: on every
  // group shape of r ranks, even (load 1: the base) and each load L <= r (one
  // rank receives L times the mean, each L > 1), isolated; empty: none.
  std::vector<double> alltoallv_loads = {2.0, 4.0};
  bool saa = true;
  // > 0: every collective and SAA point is measured twice, isolated and then
  // in context after a compute phase of this many µs (Point::context_us).
  double context_us = 0.0;
  // GEMM grid: every (m, n, k) from `gemm_sizes`^3 with 2mnk <= gemm_max_flop,
  // each as NN, NT and TN (the executor's forward, input-gradient and
  // weight-gradient forms), plus the 1x1x1 launch-overhead probe.
  std::vector<int64_t> gemm_sizes = {16, 64, 256, 1024, 4096};
  double gemm_max_flop = 4e9;
  // Memory-bound kernels: tokens per sweep point, for each of kMemoryKernels.
  std::vector<int64_t> memory_tokens = {256, 1024, 4096, 16384};
  int64_t memory_model_dim = 1024;
  // Per-rank memory the buffers of one point may take; larger points are skipped.
  int64_t max_point_bytes = int64_t{4} << 30;
};

// One point of the sweep.
struct Point {
  enum class Kind { kCollective, kSaa, kGemm, kMemory };
  Kind kind = Kind::kCollective;
  Collective collective = Collective::kAllReduce;
  GroupShape shape;                       // collectives
  SaaShape saa;                           // SAA
  bool dual = false;                      // SAA backward form
  int64_t bytes = 0;                      // collectives, SAA: n in the proto's convention
  int64_t m = 0, n = 0, k = 0;            // GEMM
  bool trans_a = false, trans_b = false;  // GEMM: NN, NT (input grads), TN (weight grads)
  // Collectives, SAA: the compute phase (µs) before each timed repetition;
  // 0: isolated (docs/cost-model.md "In context").
  double context_us = 0.0;
  // AlltoAll: through the irregular path (AlltoAllv) with group rank 0
  // receiving `load` times the mean (CollectiveSample.load_ratio; 1: even).
  bool irregular = false;
  double load = 1.0;
  std::string kernel;  // memory: one of kMemoryKernels
  int64_t tokens = 0;  // memory
  // Per-rank bytes of the buffers the point allocates (for the memory guard).
  int64_t buffer_bytes = 0;
  std::string Label() const;  // "allgather 4 ranks/2 nodes 1 MiB", "gemm 64x1024x256", ...
};

struct Sweep {
  std::vector<Point> points;
  std::vector<std::string> skipped;  // what was left out and why
};
// The whole sweep, in the order it runs: collectives by shape then size (each
// shape's irregular AlltoAlls after its collectives), SAA, GEMMs, memory-bound
// kernels. InvalidArgument
// for inconsistent options (named).
absl::StatusOr<Sweep> PlanSweep(const NodeLayout& layout, const SweepOptions& options);

// The handful of points `moeplan profile-check` re-measures (docs/calibration.md
// "Stale profiles"): three GEMMs, the data-movement and activation kernels at
// one size, the pair SendRecv of each link level at 64 KiB, 1 MiB and 4 MiB,
// and an AlltoAll of `collective_bytes` / 4, x 1 and x 4 on every group shape:
// three points per link term, so one disturbed point does not decide its
// median. With the check's short budget it takes well under a minute.
Sweep PlanCheckSweep(const NodeLayout& layout, int64_t collective_bytes = int64_t{1} << 20);

}  // namespace moeplan::profiler
