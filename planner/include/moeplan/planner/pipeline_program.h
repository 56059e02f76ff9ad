// Programs: what the executor runs of a pipelined layout (docs/layouts.md
// "Programs"): every stage's planned chunk graphs copied per micro-batch in
// the pipeline's order, with the transfers between stages.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "moeplan/planner/layout.h"
#include "moeplan/planner/op_graph.h"

namespace moeplan::planner {


// One micro-batch's activation (or gradient) between consecutive chunks:
// each TP rank sends its 1/tp (`elements` of the model's element type), and
// the receiving TP group AllGathers the pieces (tp > 1).
struct PipelineLinks {
  int64_t elements = 0;
  int64_t bytes = 0;
  double send_us = 0.0;
  ResourceMask send_resources = kInter;  // the sending stage's link
  int tp = 1;
  double gather_us = 0.0;
};

// The program of a pipelined layout (docs/layouts.md "Programs"): one op
// graph holding every stage's ops (Op::device the stage, names
// "s<stage>.[c<chunk>.]mb<i>.<chunk op>"). Each step of PipelineOrder is a
// copy of its chunk's planned forward or backward ops for micro-batch i, in
// WalkPipeline's order; between chunks, "pipe.send_fwd" / "pipe.send_bwd"
// (ExecKind::kSendRecv on the sender's link, on pp_even / pp_odd by the
// sender's parity) and, with tp > 1, the receiver's "pipe.gather_fwd" /
// "pipe.gather_bwd" (its MP AllGather, issued first in the receiving step),
// which the step's first ops wait for. After a stage's last step, each
// chunk's tail once: its gradient buckets (ZeRO 2-3: those are in every
// micro-batch's backward instead), optimizer step and ZeRO 1-2 gathers,
// waiting for micro-batch m-1's backward. Every MoE layer instance is per
// micro-batch. `chunks[stage * v + chunk]` are the chunks' planned graphs
// (ModelPlanner::PlanStage). InvalidArgument for recompute (not built).
absl::Status BuildPipelineProgram(const Layout& layout, std::span<const OpGraph* const> chunks,
                                  const PipelineLinks& links, OpGraph* out);

// Whether op `id` of a program runs on stage `stage`: its own ops, and the
// transfers it receives. One stage (every op on device 0): every op.
bool RunsOnStage(const OpGraph& program, OpId id, int stage);

}  // namespace moeplan::planner
