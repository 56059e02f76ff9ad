// Op-graph builders for the MP+EP+ESP schedules of docs/schedules.md (default, S1,
// S2 with SAA), forward and backward, on the representative rank 0.
#pragma once

#include "absl/status/status.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/op_graph.h"
#include "moeplan/planner/types.h"

namespace moeplan::planner {

// The shape of a group of `size` ranks starting at rank 0 with the given stride,
// on nodes of `gpus_per_node` GPUs (rank r on node r / gpus_per_node).
GroupShape ShapeOfGroup(int size, int stride, int gpus_per_node);

// Group shapes of rank 0 (docs/notation.md: MP and ESP groups are consecutive ranks,
// EP groups are strided by N_ESP).
struct Topology {
  GroupShape mp, esp, ep;
  // EP-group members on rank 0's node, rank 0 included: a pairwise step to peer
  // i (1 <= i < ep) stays inside the node iff i < ep_ranks_per_node.
  int ep_ranks_per_node = 1;
};
Topology MakeTopology(const ParallelLayout& p, const ClusterShape& c);

// Everything a builder reads. `layer` must have passed ValidateLayer and
// ValidateForSchedule for the schedule being built.
struct LayerContext {
  const LayerConfig* layer = nullptr;
  const CostModel* cost = nullptr;
  Topology topo;
  // How the EP AlltoAlls run (S2's SAA is pairwise either way).
  AllToAllAlgo a2a = AllToAllAlgo::kLinear;
  // Whole models (docs/model.md): the expert dW op depends on dX's inputs and
  // nothing in the layer waits for it, so a dW pass may place it; single
  // layers chain it before the next op as Parm does.
  bool detach_dw = false;
  // Whole models: the block the layer sits in; its ops are named
  // "b<block>.moe.<name>". -1: a single layer, plain names.
  int block = -1;
  // PPMoE (docs/layouts.md): tokens are replicated over the MP group, which
  // holds all the layer's experts (ep * esp = mp): dispatch is a local
  // index-select, the combine a MP-AllReduce; `schedule` is ignored.
  bool local_dispatch = false;
  // Whole models with sequence parallelism (docs/model.md): the layer's input
  // and output are S/mp tokens per rank. S1 splits and gathers nothing (its
  // tokens are already the rank's slice); default and S2 AllGather the input
  // over MP first (and the output gradient in the backward), and each rank
  // keeps its slice of their replicated output.
  bool sequence_parallel = false;
  // FP8 training (whole models; docs/model.md "FP8"): the experts' GEMMs at
  // this cost model's peak (the FP8 one), their inputs and output gradients
  // quantized first, and DeepEP's exchanges towards the experts in FP8 (the
  // combine stays in bytes_per_element). Null: no FP8.
  const CostModel* fp8_gemm = nullptr;
};

// A schedule's ops in five sections, in issue order. A single layer chains
// them; a whole model puts other ops between them (the shared expert after
// the route, so the dispatch overlaps it).
enum class MoeSection : uint8_t {
  kFwdRoute,     // gate and order (S1: after the MP split; S2: before it)
  kFwdExchange,  // dispatch, experts, combine, i-order (S1: then the MP-AllGather)
  kBwdUnroute,   // the i-order's dual (S1/S2: and the MP split's)
  kBwdExchange,  // the combine's dual, expert dX and dW, the dispatch's dual
  kBwdRoute,     // order, gate and the MP collectives of the input gradient
};
inline constexpr MoeSection kMoeSections[] = {MoeSection::kFwdRoute, MoeSection::kFwdExchange,
                                              MoeSection::kBwdUnroute, MoeSection::kBwdExchange,
                                              MoeSection::kBwdRoute};

// The ops a chain continues from (at most two: a pipelined collective ends on
// two streams). kNoOp entries are absent.
struct Frontier {
  OpId a = kNoOp;
  OpId b = kNoOp;
};

// Appends one section of `schedule` after `in` and returns its output frontier.
// The caller has validated the layer for the schedule (BuildSchedule does).
Frontier AppendSection(Schedule schedule, MoeSection section, const LayerContext& ctx,
                       OpGraph* graph, Frontier in);

// Appends forward then backward ops of `schedule` to `graph` (which should be
// empty). Returns InvalidArgument when the layout does not allow the schedule.
absl::Status BuildSchedule(Schedule schedule, const LayerContext& ctx, OpGraph* graph);

// The fused SAA collective of docs/schedules.md alone (forward form: pairwise AlltoAll
// over `a2a` in a2a.ranks - 1 steps of chunk n/W, each arrived chunk AllGathered
// over `gather`), appended after `dep`; returns the op that completes it. Exposed
// for tests and closed-form cross-checks. `a2a_bytes` is the AlltoAll's per-rank
// input n; `gather_chunk_bytes` the AllGather's per-rank input per chunk.
OpId AppendSaa(const CostModel& cost, GroupShape a2a, int a2a_ranks_per_node, GroupShape gather,
               double a2a_bytes, double gather_chunk_bytes, Phase phase, OpId dep, OpGraph* graph);

}  // namespace moeplan::planner
