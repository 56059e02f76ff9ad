// A forward and a backward of different micro-batches run together (docs/
// layouts.md "Overlapping micro-batches"): each chunk's two phases as its
// plan ran them alone, and the two merged and simulated on one rank's
// streams (the layout planner's pipeline pairs).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "moeplan/planner/op_graph.h"
#include "moeplan/planner/pipeline.h"
#include "moeplan/planner/simulator.h"

namespace moeplan::planner {

// One phase of a chunk's micro-batch: its ops in the order they started
// when the plan ran alone (which keeps each resource's order), each with
// its cost, resources, device, start (from the phase's start) and its
// dependencies inside the phase (indices into `items`).
struct PhaseOps {
  struct Item {
    double cost_us = 0.0, start_us = 0.0;
    ResourceMask resources = 0;
    int16_t device = 0;
    uint32_t first_dep = 0, end_dep = 0;  // [first, end) of `deps`
  };
  std::vector<Item> items;
  std::vector<uint32_t> deps;
  int devices = 1;
};

struct ChunkPhases {
  PhaseOps fwd, bwd;
};

// The forward and backward phases of chunk graph `g` as simulated in `r`.
// The backward drops its dependencies on the forward (another micro-batch's,
// done by then); ops `passive` says leave the backward (its gradient
// synchronisation, optimizer) stay as pass-throughs: no cost, no resource.
ChunkPhases PhasesOf(const OpGraph& g, const SimResult& r,
                     absl::FunctionRef<bool(const Op&)> passive);

// The ops `ids` of `g`, one phase in issue order (no start times): what a
// pipeline program merges (pipeline_program.h).
PhaseOps PhaseInOrder(const OpGraph& g, std::span<const OpId> ids);

// Reused between merges.
struct MergeScratch {
  std::vector<double> f_end, b_end, free_at;
};

// Phases `f` and `b` run together on one rank's streams, by the
// simulator's rule (an op starts once its dependencies end and its
// resources free): each phase keeps its order, and of the two phases' next
// ops the one that can start first is issued first. Each phase's end and
// the pair's. `order` (optional) receives the issue order: 1 where the
// next op issued is f's, 0 where it is b's.
PairTime MergedUs(const PhaseOps& f, const PhaseOps& b, MergeScratch* scratch,
                  std::vector<uint8_t>* order = nullptr);

}  // namespace moeplan::planner
