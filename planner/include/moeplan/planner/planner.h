// Planning one MoE layer: build every requested schedule's op graph, simulate
// forward + backward, rank the candidates and explain the choice (docs/schedules.md
// "Automatic choice").
#pragma once

#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/op_graph.h"
#include "moeplan/planner/simulator.h"
#include "moeplan/planner/types.h"

namespace moeplan::planner {

struct Candidate {
  Schedule schedule = Schedule::kDefault;
  // Flat vectors: sorting candidates moves them cheaply, and a planner that
  // plans again rebuilds each graph in the storage it already has.
  OpGraph op_graph;
  SimResult sim;

  const OpGraph& graph() const { return op_graph; }

  double total_us() const { return sim.makespan_us; }
  double forward_us() const { return sim.forward_end_us; }
  double backward_us() const { return sim.makespan_us - sim.forward_end_us; }
};

struct TermDelta {
  Term term = Term::kGate;
  double delta_us = 0.0;  // best minus runner-up on the critical path (< 0: best spends less)
};

struct Decision {
  Schedule best = Schedule::kDefault;
  bool has_runner_up = false;
  Schedule runner_up = Schedule::kDefault;
  double margin_us = 0.0;                 // runner-up total minus best total
  double margin_pct = 0.0;                // of the runner-up's total
  double speedup_over_default = 0.0;      // default total / best total; 0 if default not planned
  std::vector<TermDelta> deciding_terms;  // largest |delta| first, zero deltas left out
  std::string summary;                    // one line, for people
};

struct LayerPlan {
  DerivedShape derived;
  std::vector<Candidate> candidates;  // fastest first; ties keep request order
  Decision decision;

  const Candidate* Find(Schedule s) const;
};

// Plans layers against one cost model. Reuses its buffers between calls, so one
// instance per thread; the CostModel may be shared.
class LayerPlanner {
 public:
  explicit LayerPlanner(const CostModel& cost) : cost_(cost) {}

  // Validates `layer` against the profile's cluster and every requested schedule
  // (InvalidArgument naming the field), then plans. Empty `schedules`: all three.
  // At mp = 1, where S1 and S2 run the default's collectives, a list with the
  // default plans the default alone and the decision's summary says so.
  // Duplicate schedules are an error. On error `out` is left unspecified.
  absl::Status Plan(const LayerConfig& layer, std::span<const Schedule> schedules, LayerPlan* out);
  const CostModel& cost() const { return cost_; }

 private:
  const CostModel& cost_;
  Simulator simulator_;
};

// Convenience for one-off plans.
absl::StatusOr<LayerPlan> PlanLayer(const LayerConfig& layer, const CostModel& cost,
                                    std::span<const Schedule> schedules = {});

}  // namespace moeplan::planner
