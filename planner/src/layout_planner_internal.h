// The layout planner's state (private to the planner library): planned
// chunks and their lower bounds cached per (model, options), the pipeline's
// scratch graph. Methods are in layout_planner.cc; the search that drives
// them is layout_search.cc.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "moeplan/planner/layout_planner.h"
#include "moeplan/planner/pair_overlap.h"
#include "moeplan/planner/pipeline.h"
#include "moeplan/planner/pipeline_program.h"

namespace moeplan::planner {
namespace internal {

// A planned chunk: per-micro-batch forward and backward, its tail, the best
// variant and the critical-path terms per micro-batch.
struct ChunkTimes {
  double fwd = 0.0, bwd = 0.0, tail = 0.0;
  double grad_sync = 0.0, optimizer = 0.0;
  // ZeRO 1-2: the parameter AllGathers' part of the tail (after the step).
  double gather = 0.0;
  // The tail with the layout's parameter gathers under the next forward
  // (Layout::overlap_param_gather): up to one forward of them hidden.
  double TailUs(const Layout& l) const { return tail - HiddenGatherUs(l); }
  double HiddenGatherUs(const Layout& l) const {
    return l.overlap_param_gather ? std::min(gather, fwd) : 0.0;
  }
  std::array<double, kNumTerms> fwd_terms{}, bwd_terms{};
  // The forward compute time of each selective recomputation module
  // (RecomputeModule index) in one micro-batch.
  std::array<double, kNumRecomputeModules> module_fwd{};
  Variant variant = Variant::kNone;
  Schedule schedule = Schedule::kDefault;
  AllToAllAlgo algo = AllToAllAlgo::kLinear;
  // The forward and backward phases, kept for layouts that overlap
  // forward-backward pairs (Layout::OverlapsPairs); shared by the copies.
  std::shared_ptr<const ChunkPhases> phases;
};

// A chunk's part of a layout's lower bound (LayoutPlanner::Impl::BoundOf):
// per-micro-batch forward and backward steps, tail, and load on its stage;
// `exact` when they are its planned times (its load then left at 0).
struct ChunkBound {
  double fwd = 0.0, bwd = 0.0, tail = 0.0, load = 0.0;
  bool exact = false;
  // Exact: its phases (overlapping layouts) and its recomputation per backward.
  std::shared_ptr<const ChunkPhases> phases;
  double recompute = 0.0;
};

struct ChunkKey {
  int64_t mbs;
  int tp, cp, dp, ep, esp, edp, zero, blocks, phase;
  uint8_t family;
  bool embed, head, sequence_parallel, tp_comm_overlap;
  uint8_t dispatcher;
  // With moe.layer_pattern (phase 0): the chunk's blocks' entries, which
  // decide its MoE blocks as the phase does for moe.layer_freq.
  std::vector<uint8_t> pattern;
  friend bool operator==(const ChunkKey&, const ChunkKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const ChunkKey& k) {
    return H::combine(std::move(h), k.mbs, k.tp, k.cp, k.dp, k.ep, k.esp, k.edp, k.zero, k.blocks,
                      k.phase, k.family, k.embed, k.head, k.sequence_parallel, k.tp_comm_overlap,
                      k.dispatcher, k.pattern);
  }
};

// What recomputation adds to a chunk's backward per micro-batch: full, the
// whole forward; selective, its modules' forward compute.
inline double RecomputeUs(const Layout& l, const ChunkTimes& t) {
  if (l.recompute) return t.fwd;
  double us = 0.0;
  for (int i = 0; i < kNumRecomputeModules; ++i) {
    if (l.recompute_modules & (1u << i)) us += t.module_fwd[static_cast<size_t>(i)];
  }
  return us;
}

inline bool IsComm(Term t) {
  return t == Term::kAllToAll || t == Term::kAllGather || t == Term::kReduceScatter ||
         t == Term::kAllReduce || t == Term::kSendRecv;
}

}  // namespace internal

struct LayoutPlanner::Impl {
  using ChunkKey = internal::ChunkKey;
  using ChunkTimes = internal::ChunkTimes;

  explicit Impl(const CostModel& c) : cost(c), planner(c) {}
  const CostModel& cost;
  ModelPlanner planner;
  ModelPlan plan;
  absl::flat_hash_map<ChunkKey, ChunkTimes> cache;
  absl::flat_hash_map<ChunkKey, ModelPlanner::StageBound> bounds;
  // Chunks checked against the plan's max_plan_bytes (ModelPlanner::CheckStage).
  absl::flat_hash_map<ChunkKey, absl::Status> checked;
  PipelineScratch pipe_scratch;  // TimePipeline's
  Simulator pipe_sim;
  // Times' scratch: a chunk's graph with its synchronisation passed through.
  OpGraph quiet_graph;
  SimResult quiet_sim;
  SearchStats* stats = nullptr;
  ModelPlanOptions plan_options;
  // Keep every planned chunk's phases (a search that tries overlapped
  // pairs: one plan serves both kinds of layout).
  bool keep_phases = false;
  // PairUs's merges by (forward's phases, backward's phases).
  absl::flat_hash_map<std::pair<const ChunkPhases*, const ChunkPhases*>, PairTime> merged;
  MergeScratch merge_scratch;

  ChunkKey KeyOf(const ModelConfig& model, const Layout& l, int64_t mbs, const StageOptions& so,
                 int zero) const;
  // Chunk (stage, chunk) planned at `mbs` sequences per micro-batch, cached.
  absl::StatusOr<ChunkTimes> Chunk(const ModelConfig& model, const Layout& l, int64_t mbs,
                                   int stage, int chunk);
  // A planned chunk's times; `sync_in_backward` (ZeRO 2-3): its gradient
  // buckets end every micro-batch's backward. Otherwise (ZeRO 0-1) only the
  // last micro-batch synchronises: the backward is the chunk's without its
  // buckets, and what they add to the last one is in the tail.
  // `phases`: with ChunkTimes::phases.
  absl::StatusOr<ChunkTimes> Times(const VariantPlan& vp, bool sync_in_backward, bool phases);
  // An overlapped pair's times (PipelineSpec::pairs): chunk `f`'s forward
  // (f_us) with chunk `b`'s backward (b_us, `recompute` of it its
  // recomputation, run first) merged (MergedUs, cached); never below either
  // step alone, and when no faster than both in turn, those.
  PairTime PairUs(const ChunkPhases& f, const ChunkPhases& b, double f_us, double b_us,
                  double recompute);
  // ChunkTimes::module_fwd of a chunk's plan: `m` the stage's model.
  void ModuleTimes(const ModelConfig& m, const Layout& l, const StageOptions& so, const OpGraph& g,
                   ChunkTimes* t) const;
  PipelineLinks Links(const ModelConfig& model, const Layout& l, int64_t mbs) const;
  void P2p(const ModelConfig& model, const Layout& l, int64_t mbs, PipelineSpec* spec) const;
  // Evaluates a validated layout with `mbs` sequences per micro-batch;
  // `trace`: with its pipeline timeline (LayoutCandidate::pipeline).
  absl::Status Run(const ModelConfig& model, const Layout& l, int64_t mbs, const MemoryOptions& mem,
                   LayoutCandidate* out, bool trace = false);
  // The candidate's time breakdown from its busiest stage's chunks.
  void Breakdown(const Layout& l, const PipelineSpec& spec, const PipelineResult& pr,
                 const std::vector<ChunkTimes>& chunks, LayoutCandidate* out) const;
  // OK when every chunk's plan stays within the plan's max_plan_bytes, else
  // the first chunk's ResourceExhausted (ModelPlanner::CheckStage), cached.
  absl::Status CheckChunks(const ModelConfig& model, const Layout& l, int64_t mbs);
  // A lower bound on the layout's iteration time (never above Run's);
  // `refined`: tighter, with the times of the chunks already planned.
  // `unplanned`: the chunk (stage * v + chunk) not yet planned of largest
  // load, -1 if none.
  absl::StatusOr<double> Bound(const ModelConfig& model, const Layout& l, int64_t mbs,
                               bool refined = false, int* unplanned = nullptr);
  // One chunk's part of Bound.
  absl::StatusOr<internal::ChunkBound> BoundOf(const ModelConfig& model, const Layout& l,
                                               int64_t mbs, const StageOptions& so, bool refined);
  // The layout's refined bound, planning its chunks one at a time (largest
  // load first) until it reaches `cut` or all are planned.
  absl::StatusOr<double> NoFasterThan(const ModelConfig& model, const Layout& l, int64_t mbs,
                                      double cut);
  // The caches hold chunks of one (model, options); a new call starts afresh.
  void Begin(const ModelConfig& model, const ModelPlanOptions& options);
  // Memory options with the profile's GPU memory where they say "the profile's".
  MemoryOptions ResolveMemory(const MemoryOptions& o) const;
};

}  // namespace moeplan::planner
