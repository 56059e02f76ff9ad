// Pipelines of a layout (docs/layouts.md "Pipelines"): each stage's order of
// forward and backward steps (GPipe, 1F1B, interleaved 1F1B, DualPipe), the
// walk that issues every stage's steps in one order, and the pipeline as an
// op graph of per-stage compute and p2p transfers, simulated.
#pragma once

#include <array>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "moeplan/planner/layout.h"
#include "moeplan/planner/op_graph.h"
#include "moeplan/planner/simulator.h"

namespace moeplan::planner {

// One step of a stage's program: forward or backward of chunk `chunk` for
// micro-batch `mb`. `with_next`: it runs overlapped with the order's next
// step, a forward and a backward of different micro-batches as one
// (docs/layouts.md "Overlapping micro-batches").
struct PipeStep {
  bool forward = true;
  int chunk = 0;
  int mb = 0;
  bool with_next = false;
  friend bool operator==(const PipeStep&, const PipeStep&) = default;
};
// The order stage `stage` runs its steps in (GPipe: all forwards then all
// backwards; 1F1B: p - s - 1 warm-up forwards, then one forward one backward;
// interleaved: Megatron-LM's order over v chunks, m a multiple of p).
// `overlap` (Megatron-Core's 1F1B A2A overlap; not GPipe): one more warm-up
// forward, and each forward then runs with the backward after it.
// DualPipe (p even, m even and >= 2p, v = 2 by construction): DeepSeek's
// bidirectional order of PipelineChunks' two chunks, m / 2 micro-batches
// each, its forward-backward pairs overlapped whatever `overlap` says.
std::vector<PipeStep> PipelineOrder(PipelineSchedule schedule, int stages, int chunks,
                                    int microbatches, int stage, bool overlap = false);

// Peak micro-batches whose activations stage `stage` holds under `schedule`
// (interleaved and DualPipe: in chunks, divided by the chunks).
double InFlightMicrobatches(PipelineSchedule schedule, int stages, int chunks, int microbatches,
                            int stage, bool overlap = false);

// Where DualPipe's chunk `chunk` of stage `stage` sits: micro-batches enter
// direction 0 at stage 0 and direction 1 at stage p - 1; each stage holds
// model segment min(s, p-1-s) as chunk 0 and p-1-min(s, p-1-s) as chunk 1.
struct DualPipeChunk {
  int direction = 0, segment = 0;
};
DualPipeChunk DualPipeChunkOf(int stages, int stage, int chunk);
// The most forwards of each chunk stage `stage` holds at once under DualPipe
// (chunk 0, the earlier segment, holds many; chunk 1 few).
std::array<int, 2> DualPipeHeld(int stages, int microbatches, int stage);

// An overlapped forward-backward pair's times from its start: when each
// step's output is ready (<= total) and when the pair frees its stage.
struct PairTime {
  double fwd_end_us = 0.0, bwd_end_us = 0.0, total_us = 0.0;
};

// Per-micro-batch costs of each (stage, chunk) (index stage * chunks + chunk),
// the p2p transfers between consecutive chunks and each stage's tail (its
// gradient synchronisation and optimizer after the last backward).
struct PipelineSpec {
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  int stages = 1;
  int chunks = 1;  // DualPipe: 2
  int microbatches = 1;
  std::vector<double> fwd_us, bwd_us;  // stages * chunks
  // Overlapped forward-backward pairs (PipelineOrder's `overlap`; DualPipe
  // needs them): chunk f's forward run with chunk b's backward, index
  // (stage * chunks + f) * chunks + b. Empty: no overlap.
  std::vector<PairTime> pairs;
  std::vector<double> tail_us;         // stages (empty: none)
  double p2p_us = 0.0;                 // one activation (or its gradient) to the next stage
  ResourceMask p2p_resource = kInter;
};

struct PipelineResult {
  double makespan_us = 0.0;
  double pipeline_end_us = 0.0;  // end of the last backward, before tails
  double bubble_us = 0.0;        // pipeline_end_us minus the busiest stage's steps
  double bubble_fraction = 0.0;  // bubble_us / pipeline_end_us
  int busiest_stage = 0;
};

// Builds the pipeline's op graph (op "s<stage>.fwd.c<chunk>.mb<i>" on the
// stage's device, an overlapped pair "pipe.fb", p2p "s<stage>.send_fwd..."
// on its link) and simulates it:
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

// One span of a pipeline's timeline (TracePipeline): a step on its stage,
// an overlapped forward-backward pair (`step` the forward, `paired` the
// backward), the send after a step on the stage's link, or the stage's tail
// (gradient synchronisation and optimizer). Micro-batches are numbered per
// chunk's direction under DualPipe (0 .. m/2 - 1), else 0 .. m - 1.
struct PipeSpan {
  enum class Kind : uint8_t { kStep, kPair, kSend, kTail };
  Kind kind = Kind::kStep;
  int stage = 0;
  PipeStep step, paired;
  double start_us = 0.0, end_us = 0.0;
};
// TimePipeline's times as spans, in issue order (a pair's span from its
// first op's start to its second's end): the same times to the bit.
// `out` is cleared first.
absl::Status TracePipeline(const PipelineSpec& spec, PipelineScratch* scratch,
                           std::vector<PipeSpan>* out, PipelineResult* summary);

// Every stage's steps in one issue order (the pipeline's only schedule): a
// step is issued once the step feeding it has been (the previous chunk's
// forward, the next chunk's backward, or its own forward), stage by stage;
// an overlapped pair once both its steps' inputs have been. `visit(stage,
// step)` is called once per step, a pair's two in a row; Internal when the
// orders deadlock (a builder bug).
absl::Status WalkPipeline(PipelineSchedule schedule, int stages, int chunks, int microbatches,
                          absl::FunctionRef<void(int stage, const PipeStep& step)> visit,
                          bool overlap = false);

// The step feeding step `st` of stage `stage`: `none` for a micro-batch's
// first forward, else (stage, chunk, forward) of the step before it in the
// model's forward or backward pass (the last chunk's backward: its own
// forward). `last`: nothing downstream reads it (the model's last forward,
// its first chunk's backward), so it sends nothing.
struct PipeFeed {
  int stage = 0, chunk = 0;
  bool forward = true, none = false, last = false;
};
PipeFeed DualPipeFeedOf(int stages, int stage, const PipeStep& st);
// Inline: the walks of the search's bounds ask it for every step.
inline PipeFeed FeedOf(PipelineSchedule schedule, int p, int v, int s, const PipeStep& st) {
  if (schedule == PipelineSchedule::kDualPipe) return DualPipeFeedOf(p, s, st);
  const int c = st.chunk;
  if (st.forward) {
    const bool last = s == p - 1 && c == v - 1;
    if (s > 0) return {s - 1, c, true, false, last};
    if (c > 0) return {p - 1, c - 1, true, false, last};
    return {0, 0, true, true, last};
  }
  const bool last = s == 0 && c == 0;
  if (s < p - 1) return {s + 1, c, false, false, last};
  if (c < v - 1) return {0, c + 1, false, false, last};
  return {s, c, true, false, last};
}

}  // namespace moeplan::planner
