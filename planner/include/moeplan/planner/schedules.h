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
};

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
