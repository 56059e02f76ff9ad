// Evaluation of one layout and the search over every layout of P GPUs
// (docs/layouts.md "Search"): each stage planned with the model planner,
// the pipeline simulated, memory checked, candidates ranked by iteration
// time with lower bounds pruning the rest.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/layout.h"
#include "moeplan/planner/layout_memory.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/planner/pipeline.h"
#include "moeplan/planner/types.h"

namespace moeplan::planner {

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
  double tflops_per_gpu = 0.0;  // model TFLOP/s per GPU (accounting.h)
  double mfu = 0.0;
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
  // Time the busiest stage's overlapped forward-backward pairs save over
  // running their steps in turn, per iteration (a2a_overlap, dualpipe):
  // communication hidden under the other micro-batch's compute, which
  // exposed_comm (each step alone) still counts.
  double overlap_hidden_us = 0.0;
  // The busiest stage's recomputation per iteration (RecomputeUs per
  // micro-batch: the forward again, or the recomputed modules' forward).
  double recompute_us = 0.0;
  // One iteration's pipeline, every stage's steps, sends and tail timed
  // (TracePipeline): only where asked for (SearchOptions::record_pipelines,
  // Evaluate's record_pipeline), else empty.
  std::vector<PipeSpan> pipeline;
};

struct SearchOptions {
  int top = 10;
  int gpus = 0;                             // 0: the profile's
  std::vector<Family> families;             // empty: all
  std::vector<PipelineSchedule> pipelines;  // empty: gpipe, 1f1b, interleaved
  std::vector<int> zero_stages;             // empty: 0-3
  int max_microbatches = 64;
  std::vector<int> virtual_stages = {2};  // interleaved v
  // Sequence parallelism tried (each at most once) where it applies: tp >= 2,
  // seq_length divisible by tp, not ppmoe. Empty: off.
  std::vector<bool> sequence_parallel;
  // Context-parallel degrees tried (each at most once, 1 to 1024), where
  // they apply (docs/layouts.md "Context parallelism"). Empty: 1 only.
  std::vector<int> context_parallel;
  // Expert tensor-parallel degrees tried as folded grids (etp != tp) beside
  // each dpmoe layout with sequence parallelism, every ep the stage allows
  // (each at most once, 1 to 1024; docs/layouts.md "Expert grids"). Empty: none.
  std::vector<int> expert_tensor_parallel;
  // Megatron-Core's A2A overlap across micro-batches tried (each at most
  // once) where it applies: ep >= 2, and one stage, interleaved or dualpipe
  // (docs/layouts.md "Overlapping micro-batches"). Empty: off.
  std::vector<bool> a2a_overlap;
  // Token dispatchers tried (each at most once) where they apply (deepep,
  // allgather: ep >= 2, not ppmoe). Empty: alltoall only.
  std::vector<Dispatcher> dispatchers;
  // Pipeline splits tried (each at most once): false the even one (each
  // chunk floor(L / n) or one more layers), true the FLOP-balanced one
  // (BalancedPipelineLayout: the embedding, MTP depths and loss counted with
  // their chunks), where pp >= 2 and it differs. Empty: even only.
  std::vector<bool> balanced_pipeline;
  // Simulate every candidate that fits instead of stopping at the lower
  // bound (docs/layouts.md "Search"): for profiles whose costs are not
  // subadditive (a piece costing less than its share of the whole).
  bool exhaustive = false;
  // Megatron-Core's --overlap-param-gather on every candidate with zero 1-2,
  // --tp-comm-overlap on every one with sequence parallelism (switches, not
  // axes: neither is ever slower in this model).
  bool overlap_param_gather = false;
  bool tp_comm_overlap = false;
  // Keep every candidate the search enumerated as a SearchPoint (its memory
  // and what the search knows of its time): for a report's throughput-against-
  // memory chart. Off: nothing is kept.
  bool record_points = false;
  // The pipeline timelines (LayoutCandidate::pipeline) of the best N
  // returned candidates, timed once the ranking is done (0 to 1000; 0: none).
  int record_pipelines = 0;
};
// InvalidArgument naming "search.<field>".
absl::Status ValidateSearchOptions(const SearchOptions& options);

struct SearchStats {
  int64_t enumerated = 0, pruned_memory = 0, pruned_bound = 0, simulated = 0;
  int64_t over_limit = 0;  // enumerated with more than kMaxPipelineSteps: skipped
  // Fit GPU memory but a stage's plan would hold more than the plan's
  // max_plan_bytes (ModelPlanner::CheckStage): skipped, never bounded.
  int64_t over_memory = 0;
  int64_t stage_plans = 0, stage_cache_hits = 0;
};

// One candidate the search enumerated (SearchOptions::record_points).
struct SearchPoint {
  enum class Kind : uint8_t {
    kOverMemory,  // does not fit GPU memory (with or without recomputation): not timed
    kSkipped,     // too large to simulate (over_limit, over_memory): not timed
    kBound,       // fits; pruned by its lower bound: iteration_us is that bound
    kSimulated,   // simulated: iteration_us is its time
  };
  Layout layout;  // with the recomputation that fits, where one does
  Kind kind = Kind::kOverMemory;
  double memory_bytes = 0.0;  // the busiest stage's, per GPU
  double iteration_us = 0.0;  // 0: not timed
  // From iteration_us (for kBound an upper bound: the candidate is no faster).
  double tokens_per_s_per_gpu = 0.0;
};

struct LayoutSearchResult {
  std::vector<LayoutCandidate> candidates;  // best first
  std::vector<SearchPoint> points;          // with record_points, in enumeration order
  SearchStats stats;
  int gpus = 0;
  int64_t global_batch = 0;
};

// One instance per thread (keeps a ModelPlanner and a cache of planned stages).
// The model must have passed ValidateModelShape (model.h): the request layer
// (requests/) and every other caller check it once, at their boundary, and
// nothing here checks it again. Layouts, options, memory and search options
// are checked here.
class LayoutPlanner {
 public:
  explicit LayoutPlanner(const CostModel& cost);
  ~LayoutPlanner();
  LayoutPlanner(LayoutPlanner&&) noexcept;

  // Evaluates one layout (microbatches 0: 1 when pp = 1, else pp). An
  // infeasible layout is simulated too and marked with its reason.
  // `record_pipeline`: with its pipeline timeline (LayoutCandidate::pipeline).
  absl::Status Evaluate(const ModelConfig& model, const Layout& layout,
                        const ModelPlanOptions& plan, const MemoryOptions& memory,
                        LayoutCandidate* out, bool record_pipeline = false);
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

  // The planner's state and work, private to the library
  // (planner/src/layout_planner_internal.h).
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeplan::planner
