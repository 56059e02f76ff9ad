// Pipelines of a layout (docs/layouts.md "Pipelines"): each stage's order of
// forward and backward steps (GPipe, 1F1B, interleaved 1F1B), the walk that
// issues every stage's steps in one order, and the pipeline as an op graph of
// per-stage compute and p2p transfers, simulated.
#pragma once

#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "moeplan/planner/layout.h"
#include "moeplan/planner/op_graph.h"
#include "moeplan/planner/simulator.h"

namespace moeplan::planner {

// One step of a stage's program: forward or backward of chunk `chunk` for micro-batch `mb`.
struct PipeStep {
  bool forward = true;
  int chunk = 0;
  int mb = 0;
  friend bool operator==(const PipeStep&, const PipeStep&) = default;
};
// The order stage `stage` runs its steps in (GPipe: all forwards then all
// backwards; 1F1B: p - s - 1 warm-up forwards, then one forward one backward;
// interleaved: Megatron-LM's order over v chunks, m a multiple of p).
std::vector<PipeStep> PipelineOrder(PipelineSchedule schedule, int stages, int chunks,
                                    int microbatches, int stage);

// Peak micro-batches whose activations stage `stage` holds under `schedule`
// (interleaved: in chunks, divided by v).
double InFlightMicrobatches(PipelineSchedule schedule, int stages, int chunks, int microbatches,
                            int stage);

// Per-micro-batch costs of each (stage, chunk) (index stage * chunks + chunk),
// the p2p transfers between consecutive chunks and each stage's tail (its
// gradient synchronisation and optimizer after the last backward).
struct PipelineSpec {
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  int stages = 1;
  int chunks = 1;
  int microbatches = 1;
  std::vector<double> fwd_us, bwd_us;  // stages * chunks
  std::vector<double> tail_us;         // stages (empty: none)
  double p2p_us = 0.0;                 // one activation (or its gradient) to the next stage
  ResourceMask p2p_resource = kInter;
};

struct PipelineResult {
  double makespan_us = 0.0;
  double pipeline_end_us = 0.0;  // end of the last backward, before tails
  double bubble_us = 0.0;        // pipeline_end_us minus the busiest stage's compute
  double bubble_fraction = 0.0;  // bubble_us / pipeline_end_us
  int busiest_stage = 0;
};

// Builds the pipeline's op graph (op "s<stage>.fwd.c<chunk>.mb<i>" on the
// stage's device, p2p "s<stage>.send_fwd..." on its link) and simulates it:
// `result` holds its times (Simulator::Schedule without bindings; no
// critical path), `out` the summary.
absl::Status SimulatePipeline(const PipelineSpec& spec, OpGraph* graph, Simulator* sim,
                              SimResult* result, PipelineResult* out);

// TimePipeline's buffers, reused between calls: each op's end and each
// (stage, resource)'s free time.
struct PipelineScratch {
  std::vector<double> ends, free_at;
};
// SimulatePipeline's summary without a graph: each op timed as the walk
// issues it (TimeOp), so the same times to the bit (the layout search's
// bounds and candidates, which read the summary only).
absl::Status TimePipeline(const PipelineSpec& spec, PipelineScratch* scratch, PipelineResult* out);

// Every stage's steps in one issue order (the pipeline's only schedule): a
// step is issued once the step feeding it has been (the previous chunk's
// forward, the next chunk's backward, or its own forward), stage by stage.
// `visit(stage, step)` is called once per step; Internal when the orders
// deadlock (a builder bug).
absl::Status WalkPipeline(PipelineSchedule schedule, int stages, int chunks, int microbatches,
                          absl::FunctionRef<void(int stage, const PipeStep& step)> visit);

}  // namespace moeplan::planner
