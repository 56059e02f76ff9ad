// Layouts of a whole model and the search over them (docs/layouts.md): the
// DPMoE, PPMoE and MP+EP+ESP (Parm) families with tensor, pipeline, expert and
// data parallelism and ZeRO; pipelines (GPipe, 1F1B, interleaved 1F1B) as op
// graphs of per-stage compute and p2p transfers; a per-rank memory model; and
// a search that ranks every layout of P GPUs by simulated iteration time.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/op_graph.h"
#include "moeplan/planner/simulator.h"
#include "moeplan/planner/types.h"

namespace moeplan::planner {

enum class Family : uint8_t {
  kDpMoe =
      0,  // experts over data-parallel ranks (ep | dp), each sharded like the dense TP (esp = tp)
  kPpMoe = 1,  // experts over the TP group (ep * esp = tp): local dispatch, TP-AllReduce combine
  kParm = 2,   // MP+EP+ESP: ep * esp = tp * dp, per-layer default / S1 / S2
};
inline constexpr Family kAllFamilies[] = {Family::kDpMoe, Family::kPpMoe, Family::kParm};
std::string_view FamilyName(Family f);  // "dpmoe", "ppmoe", "parm"
bool ParseFamily(std::string_view name, Family* out);

enum class PipelineSchedule : uint8_t { kGpipe = 0, k1F1B = 1, kInterleaved = 2 };
inline constexpr PipelineSchedule kAllPipelineSchedules[] = {
    PipelineSchedule::kGpipe, PipelineSchedule::k1F1B, PipelineSchedule::kInterleaved};
std::string_view PipelineScheduleName(PipelineSchedule s);  // "gpipe", "1f1b", "interleaved"
bool ParsePipelineSchedule(std::string_view name, PipelineSchedule* out);

// One layout of P = dp * tp * pp GPUs. Rank order: TP innermost (consecutive
// ranks of a node), then DP, then PP (stages on different nodes once a stage
// fills them). Experts: ESP innermost, then EP, then expert replicas.
struct Layout {
  int dp = 1, tp = 1, pp = 1, ep = 1, esp = 1;
  int microbatches = 1;  // m per iteration per replica
  int zero_stage = 0;
  Family family = Family::kParm;
  PipelineSchedule pipeline = PipelineSchedule::k1F1B;
  int virtual_stages = 1;  // v (interleaved)
  bool recompute = false;  // full activation recomputation

  int Gpus() const { return dp * tp * pp; }
  // Ranks holding the same expert shard (their gradients are synchronised).
  int ExpertReplicas() const { return family == Family::kPpMoe ? dp : dp * tp / (ep * esp); }
};

// The family a (dp, tp, ep, esp) belongs to when none is named: ppmoe when
// ep * esp = tp > 1, dpmoe when esp = tp and ep < dp, else parm.
Family InferFamily(const Layout& l);

// Field rules of a layout for `model` on `cluster` with `global_batch`
// sequences per iteration; errors InvalidArgument "layout.<field>: <rule> (got ...)",
// and ResourceExhausted for a pipeline over kMaxPipelineSteps.
absl::Status ValidateLayout(const ModelConfig& model, const Layout& layout, int64_t global_batch,
                            const ClusterShape& cluster);

// Steps of the layout's pipeline simulation (pp * virtual_stages *
// microbatches * 2) and the check of them against kMaxPipelineSteps.
int64_t PipelineSteps(const Layout& layout);
absl::Status CheckPipelineSteps(const Layout& layout);

// A layout as it runs: microbatches 0 reads as pp, and one stage runs
// 1F1B (each micro-batch's backward after its forward). Not validated.
Layout ResolveLayout(const Layout& layout);

// The model as one stage of the layout runs it: micro_batch_size per
// micro-batch, parallel {mp = tp, ep, esp, dp, pp}.
ModelConfig ModelForLayout(const ModelConfig& model, const Layout& layout,
                           int64_t micro_batch_size);

// ---- Memory (per rank) ----

struct MemoryOptions {
  double param_bytes = 0.0;  // per parameter; 0: the model's bytes_per_element
  double grad_bytes = 4.0;
  double optimizer_bytes = 12.0;
  double gpu_memory_bytes = -1.0;  // < 0: the profile's; 0: not checked
};
// InvalidArgument naming "memory.<field>".
absl::Status ValidateMemoryOptions(const MemoryOptions& options);

struct MemoryBreakdown {
  double params = 0.0, grads = 0.0, optimizer = 0.0;
  double activations = 0.0;  // activation_per_microbatch * in_flight (+ one block when recomputing)
  double activation_per_microbatch = 0.0;
  double in_flight = 0.0;  // micro-batches whose activations are held at once
  double capacity_buffers = 0.0;
  double total = 0.0;
  double limit = 0.0;  // 0: not checked
  int stage = 0;
  bool fits() const { return limit <= 0.0 || total <= limit; }
  // "needs 41.2 GiB of 32 GiB (9.2 GiB over); largest term: optimizer states 24.1 GiB".
  std::string OverReason() const;
};

// Stage `stage`'s memory with `in_flight` micro-batches of activations held
// (the pipeline schedule's peak at that stage).
MemoryBreakdown StageMemory(const ModelConfig& model, const Layout& layout,
                            int64_t micro_batch_size, int stage, double in_flight,
                            const MemoryOptions& options);

// Peak micro-batches whose activations stage `stage` holds under `schedule`
// (interleaved: in chunks, divided by v).
double InFlightMicrobatches(PipelineSchedule schedule, int stages, int chunks, int microbatches,
                            int stage);

// ---- Pipelines ----

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
// stage's device, p2p "s<stage>.send_fwd..." on its link) and simulates it.
absl::Status SimulatePipeline(const PipelineSpec& spec, OpGraph* graph, Simulator* sim,
                              SimResult* result, PipelineResult* out);

// Every stage's steps in one issue order (the pipeline's only schedule): a
// step is issued once the step feeding it has been (the previous chunk's
// forward, the next chunk's backward, or its own forward), stage by stage.
// `visit(stage, step)` is called once per step; Internal when the orders
// deadlock (a builder bug).
absl::Status WalkPipeline(PipelineSchedule schedule, int stages, int chunks, int microbatches,
                          absl::FunctionRef<void(int stage, const PipeStep& step)> visit);

// ---- Programs: what the executor runs of a pipelined layout ----

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

// ---- Evaluation and search ----

struct CandidateTerm {
  Term term;
  double us;
};

struct LayoutCandidate {
  Layout layout;
  int64_t micro_batch_size = 0;
  bool feasible = true;
  std::string infeasible_reason;
  double iteration_us = 0.0;
  double tokens_per_s_per_gpu = 0.0;
  MemoryBreakdown memory;
  // The busiest stage's best overlap variant and MoE schedule.
  Variant variant = Variant::kNone;
  Schedule schedule = Schedule::kDefault;
  AllToAllAlgo algo = AllToAllAlgo::kLinear;
  double compute_us = 0.0;
  std::vector<CandidateTerm> exposed_comm;  // by term, critical-path time
  double grad_sync_us = 0.0, optimizer_us = 0.0;
  double bubble_us = 0.0, bubble_fraction = 0.0;
  double stage_forward_us = 0.0, stage_backward_us = 0.0;
};

struct SearchOptions {
  int top = 10;
  int gpus = 0;                             // 0: the profile's
  std::vector<Family> families;             // empty: all
  std::vector<PipelineSchedule> pipelines;  // empty: all
  std::vector<int> zero_stages;             // empty: 0-3
  int max_microbatches = 64;
  std::vector<int> virtual_stages = {2};  // interleaved v
  // Simulate every candidate that fits instead of stopping at the lower
  // bound (docs/layouts.md "Search"): for profiles whose costs are not
  // subadditive (a piece costing less than its share of the whole).
  bool exhaustive = false;
};
// InvalidArgument naming "search.<field>".
absl::Status ValidateSearchOptions(const SearchOptions& options);

struct SearchStats {
  int64_t enumerated = 0, pruned_memory = 0, pruned_bound = 0, simulated = 0;
  int64_t over_limit = 0;  // enumerated with more than kMaxPipelineSteps: skipped
  int64_t stage_plans = 0, stage_cache_hits = 0;
};

struct LayoutSearchResult {
  std::vector<LayoutCandidate> candidates;  // best first
  SearchStats stats;
  int gpus = 0;
  int64_t global_batch = 0;
};

// One instance per thread (keeps a ModelPlanner and a cache of planned stages).
class LayoutPlanner {
 public:
  explicit LayoutPlanner(const CostModel& cost);
  ~LayoutPlanner();
  LayoutPlanner(LayoutPlanner&&) noexcept;

  // Evaluates one layout (microbatches 0: 1 when pp = 1, else pp). An
  // infeasible layout is simulated too and marked with its reason.
  absl::Status Evaluate(const ModelConfig& model, const Layout& layout,
                        const ModelPlanOptions& plan, const MemoryOptions& memory,
                        LayoutCandidate* out);
  // Ranks every layout of options.gpus GPUs; returns the top feasible ones.
  absl::Status Search(const ModelConfig& model, const SearchOptions& options,
                      const ModelPlanOptions& plan, const MemoryOptions& memory,
                      LayoutSearchResult* out);
  // The program of one layout (BuildPipelineProgram) with every chunk
  // planned under `plan` (one variant pinned: plan.variants = {v}), and its
  // simulation: out->graph and out->sim; variant, schedule and algorithm of
  // the first chunk; the MoE layer choices of every chunk. Layouts are checked
  // like Evaluate's (microbatches 0: pp).
  absl::Status Program(const ModelConfig& model, const Layout& layout, const ModelPlanOptions& plan,
                       VariantPlan* out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeplan::planner
