// Validation of layer configs and layouts (docs/notation.md). Every error is
// InvalidArgument with a one-line message "<field>: <rule> (got <values>)", the
// field named by its JSON (proto) path, e.g. "parallel.ep".
#pragma once

#include "absl/status/status.h"
#include "moeplan/planner/types.h"

namespace moeplan::planner {

// Sizes, ranges and the divisibility rules that hold for every schedule, and that
// the layout fits the cluster.
absl::Status ValidateLayer(const LayerConfig& layer, const ClusterShape& cluster);

// A dense model's degrees (no MoE layer): ep and esp 1, and mp * dp * pp
// ranks that fit the cluster's nodes as ValidateLayer's do.
absl::Status ValidateDenseParallel(const ParallelLayout& parallel, const ClusterShape& cluster);

// The extra rules of one schedule (S1/S2: mp == esp; S1: tokens divisible by mp).
// Assumes ValidateLayer passed. `own_tokens`: each rank enters the layer with
// its own S/mp tokens (a model's sequence parallelism), which S1 routes with
// an ESP group of any size (Megatron-Core's dispatch over a folded expert
// grid, docs/layouts.md "Expert grids"); S2 still needs esp == mp.
absl::Status ValidateForSchedule(const LayerConfig& layer, Schedule schedule,
                                 bool own_tokens = false);

}  // namespace moeplan::planner
