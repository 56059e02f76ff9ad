// Evaluating one layout (docs/layouts.md): each chunk planned by the model
// planner and cached, the pipeline simulated with p2p transfers, the time
// and memory breakdown; the lower bounds the search prunes with; and a
// layout's executable program. The search itself is layout_search.cc.
#include "moeplan/planner/layout_planner.h"

#include <algorithm>
#include <array>
#include <memory>
#include <vector>

#include "field_rules.h"
#include "layout_internal.h"
#include "layout_planner_internal.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/accounting.h"
#include "moeplan/planner/layout_memory.h"

namespace moeplan::planner {

using internal::Bad;
using internal::ChunkKey;
using internal::ChunkOptions;
using internal::ChunkTimes;
using internal::IsComm;

namespace {

// The plan options of a layout's chunks. DPMoE's TP group is its ESP group,
// every rank routing the TP group's tokens (the default schedule); with
// sequence parallelism each rank holds its own S/t tokens, and S1 (gather
// over ESP on the expert side) is Megatron-Core's dispatch of them, so it is
// tried too. A folded expert grid (esp != tp, sequence parallel) has only
// that dispatch. A dense model (no MoE layer to route) plans the default.
ModelPlanOptions OptionsFor(const ModelConfig& model, const ModelPlanOptions& options,
                            const Layout& l) {
  ModelPlanOptions opt = options;
  const bool dense = model.IsDense();
  if (l.dispatcher == Dispatcher::kDeepEp) opt.algos = {AllToAllAlgo::kDeepEp};
  if (l.dispatcher == Dispatcher::kAllGather) {
    // Its exchanges are the default's and S1's (S2's SAA is an AlltoAll of
    // its own): without them listed, SchedulesToTry leaves S2 out.
    opt.algos = {AllToAllAlgo::kAllGather};
    std::erase(opt.schedules, Schedule::kS2);
  }
  if (l.family == Family::kDpMoe && l.esp != l.tp && !dense) {
    opt.schedules = {Schedule::kS1};
  } else if (l.family == Family::kDpMoe) {
    const bool s1 =
        !dense && l.sequence_parallel && l.tp > 1 &&
        (options.schedules.empty() || std::find(options.schedules.begin(), options.schedules.end(),
                                                Schedule::kS1) != options.schedules.end());
    opt.schedules = {Schedule::kDefault};
    if (s1) opt.schedules.push_back(Schedule::kS1);
  }
  return opt;
}

}  // namespace

ChunkKey LayoutPlanner::Impl::KeyOf(const ModelConfig& model, const Layout& l, int64_t mbs,
                                    const StageOptions& so, int zero) const {
  // Which of the chunk's blocks are MoE: the phase of moe.layer_freq, or the
  // chunk's slice of moe.layer_pattern (layer_freq is 0 then).
  const std::vector<uint8_t>& listed = model.moe.layer_pattern;
  const auto at = [&](int block) {
    return listed.begin() + std::clamp<ptrdiff_t>(block, 0, static_cast<ptrdiff_t>(listed.size()));
  };
  return ChunkKey{mbs,
                  l.tp,
                  l.cp,
                  l.dp,
                  l.ep,
                  l.esp,
                  l.ExpertReplicas(),
                  zero,
                  so.end_block - so.first_block,
                  listed.empty() ? so.first_block % model.moe.layer_freq : 0,
                  static_cast<uint8_t>(l.family),
                  so.embed,
                  so.head,
                  l.sequence_parallel,
                  l.tp_comm_overlap,
                  static_cast<uint8_t>(l.dispatcher),
                  std::vector<uint8_t>(at(so.first_block), at(so.end_block))};
}

absl::StatusOr<ChunkTimes> LayoutPlanner::Impl::Chunk(const ModelConfig& model, const Layout& l,
                                                      int64_t mbs, int stage, int chunk) {
  const StageOptions so = ChunkOptions(model, l, stage, chunk);
  // A chunk planned without its phases is planned again for a layout that
  // overlaps pairs (not in a search that keeps them all: keep_phases).
  if (auto it = cache.find(KeyOf(model, l, mbs, so, l.zero_stage));
      it != cache.end() && (it->second.phases || !l.OverlapsPairs())) {
    if (stats) ++stats->stage_cache_hits;
    return it->second;
  }
  if (stats) ++stats->stage_plans;
  const ModelConfig m = ModelForLayout(model, l, mbs);
  const ModelPlanOptions opt = OptionsFor(model, plan_options, l);
  MOEPLAN_RETURN_IF_ERROR(
      planner.PlanStage(m, opt, so, &plan, ModelPlanner::Scope::kFastestTimesOnly));
  const VariantPlan& vp = plan.variants[static_cast<size_t>(plan.best)];
  // ZeRO 1 and 2 build the same graph (reduce-scatter buckets, gathers after
  // the step); 2 only counts the buckets as part of every micro-batch's backward.
  // The modules' forward times read no ZeRO: once for both.
  ChunkTimes modules;
  ModuleTimes(m, l, so, vp.graph, &modules);
  for (int z : {l.zero_stage, l.zero_stage == 1 ? 2 : l.zero_stage == 2 ? 1 : -1}) {
    if (z < 0) continue;
    MOEPLAN_ASSIGN_OR_RETURN(ChunkTimes t, Times(vp, z >= 2, keep_phases || l.OverlapsPairs()));
    t.module_fwd = modules.module_fwd;
    cache.insert_or_assign(KeyOf(model, l, mbs, so, z), t);
  }
  return cache.find(KeyOf(model, l, mbs, so, l.zero_stage))->second;
}

// The time of one micro-batch's activation (or gradient) to the next stage:
// each TP rank sends its 1/tp (Megatron-LM's scatter-gather) of its
// context-parallel chunk, across nodes once a stage fills a node, and the
// receiving TP group AllGathers the pieces (inside its node). Both are
// charged to the send, which holds the sender's link.
PipelineLinks LayoutPlanner::Impl::Links(const ModelConfig& model, const Layout& l,
                                         int64_t mbs) const {
  const int g = cost.profile().shape.gpus_per_node;
  const bool across = int64_t{l.dp} * l.tp * l.cp >= g;
  const int64_t tokens = mbs * model.seq_length / l.cp;
  const double bytes =
      static_cast<double>(tokens) * model.hidden_size * model.bytes_per_element / l.tp;
  PipelineLinks k;
  k.elements = tokens * model.hidden_size / l.tp;
  k.bytes = static_cast<int64_t>(bytes);
  k.send_us = cost.CollectiveUs(Collective::kSendRecv, GroupShape{2, across ? 2 : 1}, bytes);
  k.send_resources = across ? kInter : kIntra;
  k.tp = l.tp;
  k.gather_us = cost.CollectiveUs(Collective::kAllGather, GroupShape{l.tp, 1}, bytes);
  return k;
}

void LayoutPlanner::Impl::P2p(const ModelConfig& model, const Layout& l, int64_t mbs,
                              PipelineSpec* spec) const {
  const PipelineLinks k = Links(model, l, mbs);
  spec->p2p_us = k.send_us + k.gather_us;
  spec->p2p_resource = k.send_resources;
}

// Evaluates a validated layout with `mbs` sequences per micro-batch.
absl::Status LayoutPlanner::Impl::Run(const ModelConfig& model, const Layout& l, int64_t mbs,
                                      const MemoryOptions& mem, LayoutCandidate* out, bool trace) {
  const int p = l.pp, v = l.Chunks(), m = l.microbatches;
  PipelineSpec spec;
  spec.schedule = l.pipeline;
  spec.stages = p;
  spec.chunks = v;
  spec.microbatches = m;
  spec.fwd_us.assign(static_cast<size_t>(p * v), 0.0);
  spec.bwd_us.assign(static_cast<size_t>(p * v), 0.0);
  spec.tail_us.assign(static_cast<size_t>(p), 0.0);
  std::vector<ChunkTimes> chunks(static_cast<size_t>(p * v));
  for (int s = 0; s < p; ++s) {
    for (int c = 0; c < v; ++c) {
      MOEPLAN_ASSIGN_OR_RETURN(ChunkTimes t, Chunk(model, l, mbs, s, c));
      const size_t i = static_cast<size_t>(s) * v + c;
      spec.fwd_us[i] = t.fwd;
      // Recomputation runs the chunk's forward (full) or its modules'
      // forward (selective) again before its backward.
      spec.bwd_us[i] = t.bwd + RecomputeUs(l, t);
      spec.tail_us[static_cast<size_t>(s)] += t.TailUs(l);
      chunks[i] = t;
    }
  }
  if (l.OverlapsPairs()) {
    // Each pair of a stage's chunks: one's forward with the other's backward.
    spec.pairs.assign(static_cast<size_t>(p) * v * v, PairTime{});
    for (int st = 0; st < p; ++st) {
      for (int f = 0; f < v; ++f) {
        for (int b = 0; b < v; ++b) {
          const size_t fi = static_cast<size_t>(st) * v + f, bi = static_cast<size_t>(st) * v + b;
          spec.pairs[fi * v + b] = PairUs(*chunks[fi].phases, *chunks[bi].phases, spec.fwd_us[fi],
                                          spec.bwd_us[bi], RecomputeUs(l, chunks[bi]));
        }
      }
    }
  }
  P2p(model, l, mbs, &spec);
  PipelineResult pr;
  out->pipeline.clear();
  MOEPLAN_RETURN_IF_ERROR(trace ? TracePipeline(spec, &pipe_scratch, &out->pipeline, &pr)
                                : TimePipeline(spec, &pipe_scratch, &pr));
  if (stats) ++stats->simulated;

  out->layout = l;
  out->micro_batch_size = mbs;
  out->iteration_us = pr.makespan_us;
  const double tokens = static_cast<double>(model.GlobalBatch()) * model.seq_length;
  const Throughput tp = ThroughputOf(FlopsPerToken(model), tokens, pr.makespan_us, l.Gpus(),
                                     DensePeakTflops(cost.profile(), model.bytes_per_element));
  out->tokens_per_s_per_gpu = tp.tokens_per_s_per_gpu;
  out->tflops_per_gpu = tp.tflops_per_gpu;
  out->mfu = tp.mfu;
  out->bubble_us = pr.bubble_us;
  out->bubble_fraction = pr.makespan_us > 0.0 ? pr.bubble_us / pr.makespan_us : 0.0;
  Breakdown(l, spec, pr, chunks, out);
  out->overlap_hidden_us = 0.0;
  if (!spec.pairs.empty()) {
    const int s = pr.busiest_stage;
    const std::vector<PipeStep> order = PipelineOrder(l.pipeline, p, v, m, s, l.a2a_overlap);
    for (size_t i = 0; i + 1 < order.size(); ++i) {
      if (!order[i].with_next) continue;
      const size_t f = static_cast<size_t>(s) * v + order[i].chunk,
                   b = static_cast<size_t>(s) * v + order[i + 1].chunk;
      out->overlap_hidden_us +=
          spec.fwd_us[f] + spec.bwd_us[b] -
          spec.pairs[f * v + static_cast<size_t>(order[i + 1].chunk)].total_us;
    }
  }
  // Memory: the stage that needs the most.
  out->memory = MemoryBreakdown{};
  for (int st = 0; st < p; ++st) {
    const MemoryBreakdown mb = StageMemory(
        model, l, mbs, st, InFlightMicrobatches(l.pipeline, p, v, m, st, l.a2a_overlap), mem);
    if (st == 0 || mb.total > out->memory.total) out->memory = mb;
  }
  out->feasible = out->memory.fits();
  out->infeasible_reason = out->memory.OverReason();
  return absl::OkStatus();
}

// One chunk's part of a bound: its pipeline steps, its tail, its load on its
// stage. `refined` and planned (a cache hit): its times (`exact`; the
// pipeline's simulation holds its load). Otherwise its lower bounds
// (StageComputeBound): each resource r is held for at least
// F_r + B_r + G_r by a chunk's planned iteration (forward,
// backward, gradient synchronisation and optimizer), every forward op ends
// by the forward's end and every backward op by the backward's, and the
// stage runs m of each before its tail: m (F_r + B_r) + G_r per chunk.
// Refined, ZeRO 3's gathers count (they end by their phase's end, but the
// backward's may run during the forward: they add to the forward's bound and
// to the load only) and so do ZeRO 2-3's ReduceScatters, which end every
// micro-batch's backward; and the backward is bounded by its dependencies
// too (StageBound::chain_bwd_us). The search sorts by the unrefined bound (ties in
// iteration time keep the order they always had) and skips by the refined one.
absl::StatusOr<internal::ChunkBound> LayoutPlanner::Impl::BoundOf(const ModelConfig& model,
                                                                  const Layout& l, int64_t mbs,
                                                                  const StageOptions& so,
                                                                  bool refined) {
  const double m = l.ChunkMicrobatches();
  internal::ChunkBound out;
  if (refined) {
    auto it = cache.find(KeyOf(model, l, mbs, so, l.zero_stage));
    if (it != cache.end()) {
      const ChunkTimes& t = it->second;
      out.fwd = t.fwd;
      out.bwd = t.bwd + RecomputeUs(l, t);
      out.tail = t.TailUs(l);
      // Its load is the pipeline's own: simulated exactly, left out here.
      out.exact = true;
      out.phases = t.phases;
      out.recompute = RecomputeUs(l, t);
      return out;
    }
  }
  const ChunkKey key = KeyOf(model, l, mbs, so, /*zero=*/0);  // the bounds hold for every stage
  auto it = bounds.find(key);
  if (it == bounds.end()) {
    const ModelPlanOptions opt = OptionsFor(model, plan_options, l);
    ModelPlanner::StageBound b;
    MOEPLAN_RETURN_IF_ERROR(
        planner.StageComputeBound(ModelForLayout(model, l, mbs), opt, so, &b, /*chain=*/true));
    it = bounds.emplace(key, b).first;
  }
  const ModelPlanner::StageBound& b = it->second;
  // Refined: ZeRO 3's gathers and ZeRO 2-3's ReduceScatters counted too.
  const bool z3 = refined && l.zero_stage == 3, rs = refined && l.zero_stage >= 2;
  const size_t zc = l.zero_stage == 0 ? 0 : l.zero_stage <= 2 ? 1 : 2;
  const double fwd = z3 ? b.zero3_fwd_us : b.fwd_us;
  out.fwd = fwd;
  out.bwd = (rs ? b.rs_bwd_us : refined ? b.chain_bwd_us : b.bwd_us) + (l.recompute ? fwd : 0.0);
  out.tail = l.zero_stage >= 1 ? b.sharded_optimizer_us : b.optimizer_us;
  for (size_t r = 0; r < kNumResources; ++r) {
    const double f = (b.fwd_res[r] + (z3 ? b.zero3_fwd_res[r] : 0.0)) * (l.recompute ? 2.0 : 1.0);
    const double bw = b.bwd_res[r] + (z3 ? b.zero3_bwd_res[r] : 0.0);
    // ZeRO 2-3: m - 1 backwards hold their ReduceScatters, the last one's
    // are in the synchronisation.
    out.load =
        std::max(out.load, rs ? (m - 1.0) * (f + bw + b.rs_res[r]) + f + bw + b.sync_res[zc][r]
                              : m * (f + bw) + b.sync_res[zc][r]);
  }
  return out;
}

// Two lower bounds, the larger kept: the pipeline simulated with each
// chunk's part (BoundOf) and the exact p2p (simulated times only grow with
// op costs), and the busiest stage's load. `refined`: BoundOf's, planned
// chunks counting with their times; `unplanned`, if given, is the
// stage-major index of the chunk not yet planned whose load bound is
// largest (-1: none).
absl::StatusOr<double> LayoutPlanner::Impl::Bound(const ModelConfig& model, const Layout& l,
                                                  int64_t mbs, bool refined, int* unplanned) {
  const int p = l.pp, v = l.Chunks();
  PipelineSpec spec;
  spec.schedule = l.pipeline;
  spec.stages = p;
  spec.chunks = v;
  spec.microbatches = l.microbatches;
  spec.fwd_us.assign(static_cast<size_t>(p * v), 0.0);
  spec.bwd_us.assign(static_cast<size_t>(p * v), 0.0);
  spec.tail_us.assign(static_cast<size_t>(p), 0.0);
  double load = 0.0, heaviest = -1.0;
  if (unplanned != nullptr) *unplanned = -1;
  const bool pairs = l.OverlapsPairs();
  if (pairs) spec.pairs.assign(static_cast<size_t>(p) * v * v, PairTime{});
  std::vector<internal::ChunkBound> stage(static_cast<size_t>(v));
  for (int st = 0; st < p; ++st) {
    double stage_load = 0.0;
    for (int c = 0; c < v; ++c) {
      MOEPLAN_ASSIGN_OR_RETURN(stage[static_cast<size_t>(c)],
                               BoundOf(model, l, mbs, ChunkOptions(model, l, st, c), refined));
      const internal::ChunkBound& b = stage[static_cast<size_t>(c)];
      const size_t i = static_cast<size_t>(st) * v + c;
      spec.fwd_us[i] = b.fwd;
      spec.bwd_us[i] = b.bwd;
      spec.tail_us[static_cast<size_t>(st)] += b.tail;
      stage_load += b.load;
      if (unplanned != nullptr && !b.exact && b.load > heaviest) {
        heaviest = b.load;
        *unplanned = static_cast<int>(i);
      }
    }
    // A pair takes at least either step alone (PairUs); planned chunks' pairs exactly.
    for (int f = 0; pairs && f < v; ++f) {
      for (int c = 0; c < v; ++c) {
        const internal::ChunkBound &fb = stage[static_cast<size_t>(f)],
                                   &bb = stage[static_cast<size_t>(c)];
        // Unplanned: the pair's outputs ready at its start (a lower bound).
        spec.pairs[(static_cast<size_t>(st) * v + f) * v + c] =
            fb.phases && bb.phases ? PairUs(*fb.phases, *bb.phases, fb.fwd, bb.bwd, bb.recompute)
                                   : PairTime{0.0, 0.0, std::max(fb.fwd, bb.bwd)};
      }
    }
    load = std::max(load, stage_load);
  }
  P2p(model, l, mbs, &spec);
  PipelineResult pr;
  MOEPLAN_RETURN_IF_ERROR(TimePipeline(spec, &pipe_scratch, &pr));
  return std::max(pr.makespan_us, load);
}

// The layout's refined bound after planning, one at a time, the unplanned
// chunk of largest load until the bound reaches `cut` or every chunk is
// planned (its bound then no faster than its iteration: the pipeline of its
// times, simulated as Run does).
absl::StatusOr<double> LayoutPlanner::Impl::NoFasterThan(const ModelConfig& model, const Layout& l,
                                                         int64_t mbs, double cut) {
  const int v = l.Chunks();
  for (;;) {
    int next = -1;
    MOEPLAN_ASSIGN_OR_RETURN(const double bound, Bound(model, l, mbs, true, &next));
    if (bound >= cut || next < 0) return bound;
    MOEPLAN_RETURN_IF_ERROR(Chunk(model, l, mbs, next / v, next % v).status());
  }
}

absl::Status LayoutPlanner::Impl::CheckChunks(const ModelConfig& model, const Layout& l,
                                              int64_t mbs) {
  const int v = l.Chunks();
  for (int st = 0; st < l.pp; ++st) {
    for (int c = 0; c < v; ++c) {
      const StageOptions so = ChunkOptions(model, l, st, c);
      const ChunkKey key = KeyOf(model, l, mbs, so, /*zero=*/0);  // the estimate reads no ZeRO
      auto it = checked.find(key);
      if (it == checked.end()) {
        const ModelPlanOptions opt = OptionsFor(model, plan_options, l);
        it = checked.emplace(key, planner.CheckStage(ModelForLayout(model, l, mbs), opt, so)).first;
      }
      if (!it->second.ok()) return it->second;
    }
  }
  return absl::OkStatus();
}

void LayoutPlanner::Impl::Begin(const ModelConfig& model, const ModelPlanOptions& options) {
  // The caches hold chunks of one (model, options); a new call starts afresh.
  cache.clear();
  bounds.clear();
  checked.clear();
  merged.clear();
  keep_phases = false;
  plan_options = options;
}

void LayoutPlanner::Impl::Breakdown(const Layout& l, const PipelineSpec& spec,
                                    const PipelineResult& pr, const std::vector<ChunkTimes>& chunks,
                                    LayoutCandidate* out) const {
  const int v = l.Chunks(), m = l.ChunkMicrobatches();
  const int s = pr.busiest_stage;
  std::array<double, kNumTerms> terms{};
  out->compute_us = out->grad_sync_us = out->optimizer_us = 0.0;
  out->stage_forward_us = out->stage_backward_us = out->recompute_us = 0.0;
  for (int c = 0; c < v; ++c) {
    const ChunkTimes& t = chunks[static_cast<size_t>(s) * v + c];
    for (int k = 0; k < kNumTerms; ++k) {
      terms[static_cast<size_t>(k)] +=
          m * (t.fwd_terms[static_cast<size_t>(k)] * (l.recompute ? 2.0 : 1.0) +
               t.bwd_terms[static_cast<size_t>(k)]);
    }
    out->grad_sync_us += std::max(0.0, t.grad_sync - t.HiddenGatherUs(l));
    out->optimizer_us += t.optimizer;
    out->stage_forward_us += t.fwd;
    out->stage_backward_us += spec.bwd_us[static_cast<size_t>(s) * v + c];
    // Selective recomputation's modules: compute, added to the backward.
    if (!l.recompute) out->compute_us += m * RecomputeUs(l, t);
    out->recompute_us += m * RecomputeUs(l, t);
    if (c == 0) {
      out->variant = t.variant;
      out->schedule = t.schedule;
      out->algo = t.algo;
    }
  }
  out->exposed_comm.clear();
  for (int k = 0; k < kNumTerms; ++k) {
    const Term term = static_cast<Term>(k);
    if (IsComm(term)) {
      if (terms[static_cast<size_t>(k)] > 0.0) {
        out->exposed_comm.push_back({term, terms[static_cast<size_t>(k)]});
      }
    } else if (term != Term::kOptimizer) {
      out->compute_us += terms[static_cast<size_t>(k)];
    }
  }
}

MemoryOptions LayoutPlanner::Impl::ResolveMemory(const MemoryOptions& o) const {
  MemoryOptions r = o;
  if (r.gpu_memory_bytes < 0.0) r.gpu_memory_bytes = cost.profile().gpu_memory_gib * internal::kGiB;
  return r;
}

LayoutPlanner::LayoutPlanner(const CostModel& cost) : impl_(std::make_unique<Impl>(cost)) {}
LayoutPlanner::~LayoutPlanner() = default;
LayoutPlanner::LayoutPlanner(LayoutPlanner&&) noexcept = default;

namespace {

// A layout evaluated on its own: resolved (ResolveLayout) and the checks of
// ValidateLayout on as many nodes of the profile's size as it spans (like
// --gpus of the search).
absl::StatusOr<Layout> OneLayout(const ModelConfig& model, const Layout& layout,
                                 const ClusterShape& shape) {
  const Layout l = ResolveLayout(layout);
  const int64_t nodes =
      (int64_t{l.dp} * l.tp * l.cp * l.pp + shape.gpus_per_node - 1) / shape.gpus_per_node;
  const ClusterShape cluster{static_cast<int>(std::clamp<int64_t>(nodes, shape.nodes, 1 << 20)),
                             shape.gpus_per_node};
  MOEPLAN_RETURN_IF_ERROR(ValidateLayout(model, l, model.GlobalBatch(), cluster));
  return l;
}

}  // namespace

absl::Status LayoutPlanner::Evaluate(const ModelConfig& model, const Layout& layout,
                                     const ModelPlanOptions& plan, const MemoryOptions& memory,
                                     LayoutCandidate* out, bool record_pipeline) {
  Impl& s = *impl_;
  MOEPLAN_RETURN_IF_ERROR(ValidateModelPlanOptions(plan));
  MOEPLAN_RETURN_IF_ERROR(ValidateMemoryOptions(memory));
  MOEPLAN_ASSIGN_OR_RETURN(const Layout l, OneLayout(model, layout, s.cost.profile().shape));
  const int64_t global = model.GlobalBatch();
  s.Begin(model, plan);
  s.stats = nullptr;
  const int64_t mbs = global / (int64_t{l.dp} * l.microbatches);
  if (record_pipeline) {
    MOEPLAN_RETURN_IF_ERROR(CheckTimelineSpans(
        PipelineSpans(l), 1, "ask with fewer micro-batches (layout.microbatches) or without it"));
  }
  return s.Run(model, l, mbs, s.ResolveMemory(memory), out, record_pipeline);
}

absl::Status LayoutPlanner::Program(const ModelConfig& model, const Layout& layout,
                                    const ModelPlanOptions& plan, VariantPlan* out) {
  Impl& s = *impl_;
  MOEPLAN_RETURN_IF_ERROR(ValidateModelPlanOptions(plan));
  MOEPLAN_ASSIGN_OR_RETURN(const Layout l, OneLayout(model, layout, s.cost.profile().shape));
  const int p = l.pp, v = l.Chunks();
  const int64_t mbs = model.GlobalBatch() / (int64_t{l.dp} * l.microbatches);
  const ModelConfig m = ModelForLayout(model, l, mbs);
  const ModelPlanOptions opt = OptionsFor(model, plan, l);
  std::vector<VariantPlan> chunks(static_cast<size_t>(p * v));
  std::vector<const OpGraph*> graphs(chunks.size());
  *out = VariantPlan{};
  for (int st = 0; st < p; ++st) {
    for (int c = 0; c < v; ++c) {
      MOEPLAN_RETURN_IF_ERROR(s.planner.PlanStage(m, opt, ChunkOptions(model, l, st, c), &s.plan,
                                                  ModelPlanner::Scope::kFastestOnly));
      const size_t k = static_cast<size_t>(st) * v + c;
      chunks[k] = std::move(s.plan.variants[static_cast<size_t>(s.plan.best)]);
      graphs[k] = &chunks[k].graph;
      for (const MoeLayerChoice& choice : chunks[k].layers) out->layers.push_back(choice);
    }
  }
  std::sort(out->layers.begin(), out->layers.end(),
            [](const MoeLayerChoice& a, const MoeLayerChoice& b) { return a.block < b.block; });
  const PipelineLinks links = s.Links(model, l, mbs);
  MOEPLAN_RETURN_IF_ERROR(BuildPipelineProgram(l, graphs, links, &out->graph));
  MOEPLAN_RETURN_IF_ERROR(s.pipe_sim.Run(out->graph, &out->sim));
  out->variant = chunks[0].variant;
  out->schedule = chunks[0].schedule;
  out->algo = chunks[0].algo;
  out->tutel_degree = chunks[0].tutel_degree;
  return absl::OkStatus();
}

}  // namespace moeplan::planner
