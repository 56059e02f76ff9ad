// The public ModelPlanner (docs/model.md): options and their rules, which
// MoE schedules and AlltoAll algorithms a plan tries, and the variants it
// keeps. The planner's work is ModelPlanner::Impl (model_planner_internal.h).
#include "moeplan/planner/model_planner.h"

#include <algorithm>
#include <array>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "enum_names.h"
#include "field_rules.h"
#include "model_planner_internal.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/accounting.h"
#include "moeplan/planner/validate.h"

namespace moeplan::planner {

using internal::Bad;
using internal::kInf;
using internal::Range;

std::string_view VariantName(Variant v) {
  switch (v) {
    case Variant::kNone:
      return "none";
    case Variant::kTutel:
      return "tutel";
    case Variant::kDw:
      return "dw";
    case Variant::kPartition:
      return "partition";
    case Variant::kLancet:
      return "lancet";
  }
  return "unknown";
}

bool ParseVariant(std::string_view name, Variant* out) {
  return internal::ParseByName(name, kAllVariants, VariantName, out);
}

absl::Status ValidateModelPlanOptions(const ModelPlanOptions& o) {
  if (o.bucket_bytes < 1 || o.bucket_bytes > (int64_t{1} << 40)) {
    return Bad("bucket_bytes", "must be between 1 and 2^40", Cat(o.bucket_bytes));
  }
  if (o.max_partitions < 1 || o.max_partitions > 64) {
    return Bad("max_partitions", "must be between 1 and 64", Cat(o.max_partitions));
  }
  if (o.partition_groups < 1 || o.partition_groups > 64) {
    return Bad("partition_groups", "must be between 1 and 64", Cat(o.partition_groups));
  }
  if (o.max_span < 0 || o.max_span > 1024) {
    return Bad("max_span", "must be between 0 (the span between two MoE layers) and 1024",
               Cat(o.max_span));
  }
  if (o.max_plan_bytes < (int64_t{1} << 20) || o.max_plan_bytes > (int64_t{1} << 40)) {
    return Bad("max_plan_bytes", "must be between 1 MiB and 2^40", Cat(o.max_plan_bytes));
  }
  if (o.tutel_degrees.empty()) return Bad("tutel_degrees", "must not be empty", "[]");
  for (int r : o.tutel_degrees) {
    if (r < 1 || r > 64) return Bad("tutel_degrees", "each must be between 1 and 64", Cat(r));
  }
  auto once = [](auto list, std::string_view field, auto name) -> absl::Status {
    for (size_t i = 0; i < list.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        if (list[i] == list[j]) {
          return Bad(field, "each may be listed once", Cat(name(list[i]), " twice"));
        }
      }
    }
    return absl::OkStatus();
  };
  MOEPLAN_RETURN_IF_ERROR(once(o.variants, "variants", VariantName));
  MOEPLAN_RETURN_IF_ERROR(once(o.schedules, "schedules", ScheduleName));
  MOEPLAN_RETURN_IF_ERROR(once(o.algos, "alltoall_algorithms", AllToAllAlgoName));
  return absl::OkStatus();
}

const VariantPlan* ModelPlan::Find(Variant v) const {
  for (const VariantPlan& p : variants) {
    if (p.variant == v) return &p;
  }
  return nullptr;
}

RankParams StageParams(const ModelConfig& m, const StageOptions& stage) {
  const int end = stage.end_block < 0 ? m.num_layers : stage.end_block;
  RankParams r;
  // BlockParams depends on whether the block is MoE only: each kind's counted
  // once, added block by block.
  std::optional<RankParams> kind[2];
  for (int blk = stage.first_block; blk < end; ++blk) {
    std::optional<RankParams>& b = kind[m.IsMoeBlock(blk) ? 1 : 0];
    if (!b) b = BlockParams(m, blk);
    r.dense += b->dense;
    r.expert += b->expert;
  }
  const double M = static_cast<double>(m.hidden_size);
  const double v = static_cast<double>(m.vocab_size / m.parallel.mp);
  const double norm = m.normalization == Normalization::kRmsNorm ? M : 2.0 * M;
  if (m.vocab_size > 0 && stage.embed) r.dense += v * M + EmbeddingPositions(m) * M;
  // The output layer: its own weights when untied; tied, a last stage
  // without the embedding holds its own copy of it (Megatron-LM).
  const bool own_head = m.untie_embeddings_and_output_weights || !stage.embed;
  if (m.vocab_size > 0 && stage.head) {
    r.dense += norm + (own_head ? v * M : 0.0);
    // The MTP depths: their norms and input projection, and a block each;
    // without the first stage, a copy of the embedding for their lookups
    // (Megatron-Core builds one on the MTP stage).
    const MtpInputParams in = CountMtpInputParams(m);
    for (int d = 0; d < m.mtp_num_layers; ++d) {
      const RankParams b = BlockParams(m, m.num_layers + d);
      r.dense += b.dense + in.norms + in.projection / m.parallel.mp;
      r.expert += b.expert;
    }
    if (m.mtp_num_layers > 0 && !stage.embed) r.dense += v * M;
  }
  return r;
}

void ModelPlanner::Impl::Configure(const ModelConfig& model, const ModelPlanOptions& options,
                                   const StageOptions& stage) {
  const ClusterShape& cluster = cost.profile().shape;
  m = &model;
  opt = options;
  st = stage;
  first_block = std::clamp(stage.first_block, 0, model.num_layers);
  end_block = stage.end_block < 0 ? model.num_layers
                                  : std::clamp(stage.end_block, first_block, model.num_layers);
  moe_layer = model.MoeLayer();
  dims = DimsOf(model);
  topo = MakeTopology(model.parallel, cluster);
  mp_shape = topo.mp;
  const int g = cluster.gpus_per_node;
  dp_shape = ShapeOfGroup(
      model.parallel.dp,
      stage.dense_group_stride > 0 ? static_cast<int>(stage.dense_group_stride) : model.parallel.mp,
      g);
  cp_shape = ShapeOfGroup(model.parallel.cp, model.parallel.mp, g);
  edp_shape = ShapeOfGroup(
      std::max(1, stage.expert_replicas),
      stage.local_dispatch ? model.parallel.mp : model.parallel.ep * model.parallel.esp, g);
  // Range costs depend on everything a range's ops read: key them by it, so
  // that stages planned one after another (the layout search) share them.
  // The whole model (model.h's AbslHashValue names every field); of the
  // stage, what its ranges read beyond their units (the units themselves are
  // RangeCosts' key): dispatch, ZeRO-3's gathers and the two groups' shapes.
  // The block range, embed and head change which units exist, not their costs.
  [[maybe_unused]] const auto& [first, end, embed, head, local_dispatch, expert_replicas,
                                zero_stage, dense_group_stride] = stage;
  context_salt = absl::HashOf(model, local_dispatch, zero_stage == 3, dp_shape.ranks,
                              dp_shape.nodes, edp_shape.ranks, edp_shape.nodes, &cost);
  if (p_cache.size() > (1u << 18) || family_costs.size() > (1u << 21) ||
      pair_bounds.size() > (1u << 18)) {
    p_cache.clear();
    pair_bounds.clear();
    family_cache.clear();
    family_costs.clear();
  }
  if (model.Fp8() && !fp8_cost) fp8_cost.emplace(cost.AtElementBytes(1));
  linear = model.Fp8() ? &*fp8_cost : &cost;
  unit_ops.clear();
  ++plan_count;
}

ModelPlanner::ModelPlanner(const CostModel& cost) : impl_(std::make_unique<Impl>(cost)) {}
ModelPlanner::~ModelPlanner() = default;
ModelPlanner::ModelPlanner(ModelPlanner&&) noexcept = default;
const CostModel& ModelPlanner::cost() const { return impl_->cost; }

absl::Status ModelPlanner::Plan(const ModelConfig& model, const ModelPlanOptions& options,
                                ModelPlan* out) {
  MOEPLAN_RETURN_IF_ERROR(ValidateModel(model, impl_->cost.profile().shape));
  return PlanStage(model, options, StageOptions{}, out);
}

absl::Status ModelPlanner::PlanStage(const ModelConfig& model, const ModelPlanOptions& options,
                                     const StageOptions& stage, ModelPlan* out, Scope scope) {
  return Run(model, options, stage, out, nullptr, scope);
}

absl::Status ModelPlanner::StageComputeBound(const ModelConfig& model,
                                             const ModelPlanOptions& options,
                                             const StageOptions& stage, StageBound* bound,
                                             bool chain) {
  impl_->bound_chain = chain;
  return Run(model, options, stage, nullptr, bound);
}

absl::Status ModelPlanner::CheckStage(const ModelConfig& model, const ModelPlanOptions& options,
                                      const StageOptions& stage) {
  return Run(model, options, stage, nullptr, nullptr);
}

namespace {

// The MoE schedules a plan tries: the requested ones (each checked against
// the model's MoE layer), else every one that applies; PPMoE runs one way.
absl::StatusOr<std::vector<Schedule>> SchedulesToTry(const ModelConfig& model,
                                                     const ModelPlanOptions& options,
                                                     const StageOptions& stage,
                                                     const LayerConfig& moe_layer) {
  std::vector<Schedule> schedules = options.schedules;
  if (model.IsDense()) {
    // No MoE layer: nothing for S1 or S2 to reorder.
    for (Schedule sc : schedules) {
      if (sc != Schedule::kDefault) {
        return absl::InvalidArgumentError(
            Cat("schedules: ", ScheduleName(sc), " reorders MoE layers; a dense model has none"));
      }
    }
    return std::vector<Schedule>{Schedule::kDefault};
  }
  if (stage.local_dispatch) return std::vector<Schedule>{Schedule::kDefault};
  if (schedules.empty()) {
    // With mp = 1 there is no MP group to pause: S1 and S2 only rename the
    // default. The allgather dispatcher alone has no S2 (its SAA is an
    // AlltoAll of its own).
    const bool gathers = options.algos.size() == 1 && options.algos[0] == AllToAllAlgo::kAllGather;
    for (Schedule sc : kAllSchedules) {
      if (sc != Schedule::kDefault && model.parallel.mp == 1) continue;
      if (sc == Schedule::kS2 && gathers) continue;
      if (ValidateForSchedule(moe_layer, sc).ok()) schedules.push_back(sc);
    }
  }
  // With sequence parallelism each rank routes its own tokens: S1 applies to
  // any ESP group asked for (a folded expert grid asks for it alone).
  const bool own_tokens = model.parallel.mp > 1 && model.parallel.sequence_parallel;
  for (Schedule sc : schedules) {
    if (absl::Status st = ValidateForSchedule(moe_layer, sc, own_tokens); !st.ok()) {
      return absl::InvalidArgumentError(Cat("schedules: ", ScheduleName(sc),
                                            " does not apply to this model: ", View(st.message())));
    }
  }
  return schedules;
}

// The AlltoAll algorithms a plan tries: the requested ones, else linear and,
// where the EP group spans nodes with several EP ranks per node, 2dh.
absl::StatusOr<std::vector<AllToAllAlgo>> AlgosToTry(const ModelConfig& model,
                                                     const ModelPlanOptions& options,
                                                     const StageOptions& stage,
                                                     const Topology& topo) {
  if (stage.local_dispatch) return std::vector<AllToAllAlgo>{AllToAllAlgo::kLinear};
  const bool hier_applies = topo.ep.SpansNodes() && topo.ep_ranks_per_node > 1;
  std::vector<AllToAllAlgo> algos = options.algos;
  if (algos.empty()) {
    algos.push_back(AllToAllAlgo::kLinear);
    if (hier_applies) algos.push_back(AllToAllAlgo::kHierarchical);
  }
  for (AllToAllAlgo a : algos) {
    if (a == AllToAllAlgo::kHierarchical && !hier_applies) {
      return absl::InvalidArgumentError(
          Cat("alltoall_algorithms: 2dh needs an EP group that spans nodes with several EP ranks "
              "per node (got ep=",
              model.parallel.ep, " with ", topo.ep_ranks_per_node, " per node)"));
    }
  }
  return algos;
}

// The least over the schedules and algorithms, per phase (and resource), of
// the stage's lower bounds (StageComputeBound).
absl::Status ComputeBound(ModelPlanner::Impl& s, std::span<const Schedule> schedules,
                          std::span<const AllToAllAlgo> algos, ModelPlanner::StageBound* bound) {
  bound->fwd_us = bound->bwd_us = bound->chain_bwd_us = kInf;
  bound->fwd_res.fill(kInf);
  bound->bwd_res.fill(kInf);
  bound->zero3_fwd_us = kInf;
  double busy[2][kNumResources], gathers[2][kNumResources];
  std::vector<std::array<double, kNumResources>> bwd_busy;  // per pair
  std::vector<double> chains;                               // per pair
  s.GatherBound(gathers);
  for (size_t r = 0; r < kNumResources; ++r) {
    bound->zero3_fwd_res[r] = gathers[0][r];
    bound->zero3_bwd_res[r] = gathers[1][r];
  }
  for (Schedule sc : schedules) {
    for (AllToAllAlgo a : algos) {
      s.sched = sc;
      s.algo = a;
      double chain = 0.0;
      MOEPLAN_RETURN_IF_ERROR(s.PhaseBound(busy, s.bound_chain ? &chain : nullptr));
      // The pair's bound, which the stage's plans read (FastestSearch).
      if (s.bound_chain) s.pair_bounds.emplace(s.PairKey(), s.PairBoundOf(busy, chain));
      bound->fwd_us = std::min(bound->fwd_us, *std::max_element(busy[0], busy[0] + kNumResources));
      double fwd3 = 0.0;
      for (size_t r = 0; r < kNumResources; ++r) fwd3 = std::max(fwd3, busy[0][r] + gathers[0][r]);
      bound->zero3_fwd_us = std::min(bound->zero3_fwd_us, fwd3);
      const double bwd = *std::max_element(busy[1], busy[1] + kNumResources);
      bound->bwd_us = std::min(bound->bwd_us, bwd);
      bound->chain_bwd_us =
          s.bound_chain ? std::min(bound->chain_bwd_us, std::max(bwd, chain)) : bound->bwd_us;
      chains.push_back(chain);
      bwd_busy.emplace_back();
      for (size_t r = 0; r < kNumResources; ++r) {
        bound->fwd_res[r] = std::min(bound->fwd_res[r], busy[0][r]);
        bound->bwd_res[r] = std::min(bound->bwd_res[r], busy[1][r]);
        bwd_busy.back()[r] = busy[1][r];
      }
    }
  }
  bound->optimizer_us = s.OptimizerStepUs(false);
  bound->sharded_optimizer_us = s.OptimizerStepUs(true);
  s.SyncBound(&bound->sync_res);
  // ZeRO 2-3's ReduceScatters descend from the loss like the backward and
  // end it (LayoutPlanner's chunk times): the backward holds them too.
  bound->rs_res = bound->sync_res[2];
  bound->rs_bwd_us = kInf;
  for (size_t i = 0; i < bwd_busy.size(); ++i) {
    double bwd = chains[i];
    for (size_t r = 0; r < kNumResources; ++r)
      bwd = std::max(bwd, bwd_busy[i][r] + bound->rs_res[r]);
    bound->rs_bwd_us = std::min(bound->rs_bwd_us, bwd);
  }
  bound->sync_res[0][0] += bound->optimizer_us;
  bound->sync_res[1][0] += bound->sharded_optimizer_us;
  bound->sync_res[2][0] += bound->sharded_optimizer_us;
  return absl::OkStatus();
}

// *vp as VariantPlan{}, keeping its vectors' capacity.
void ResetVariantPlan(VariantPlan* vp) {
  OpGraph graph = std::move(vp->graph);
  std::vector<OpTime> times = std::move(vp->sim.times);
  std::vector<OpId> path = std::move(vp->sim.critical_path);
  std::vector<MoeLayerChoice> layers = std::move(vp->layers);
  graph.Clear();
  times.clear();
  path.clear();
  layers.clear();
  *vp = VariantPlan{};
  vp->graph = std::move(graph);
  vp->sim.times = std::move(times);
  vp->sim.critical_path = std::move(path);
  vp->layers = std::move(layers);
}

}  // namespace

absl::Status ModelPlanner::Run(const ModelConfig& model, const ModelPlanOptions& options,
                               const StageOptions& stage, ModelPlan* out, StageBound* bound,
                               Scope scope) {
  Impl& s = *impl_;
  MOEPLAN_RETURN_IF_ERROR(ValidateModelPlanOptions(options));
  if (stage.zero_stage < 0 || stage.zero_stage > 3) {
    return absl::InvalidArgumentError(Cat("zero_stage: must be 0-3 (got ", stage.zero_stage, ")"));
  }
  s.Configure(model, options, stage);
  // The graphs a plan is built in record what their ops compute unless the
  // caller reads times only.
  s.g0.RecordExec(scope != Scope::kFastestTimesOnly);
  s.final_graph.RecordExec(scope != Scope::kFastestTimesOnly);
  s.held_graph.RecordExec(scope != Scope::kFastestTimesOnly);  // swapped with final_graph
  s.describe = scope != Scope::kFastestTimesOnly;
  MOEPLAN_ASSIGN_OR_RETURN(const std::vector<Schedule> schedules,
                           SchedulesToTry(model, options, stage, s.moe_layer));
  MOEPLAN_ASSIGN_OR_RETURN(const std::vector<AllToAllAlgo> algos,
                           AlgosToTry(model, options, stage, s.topo));
  std::vector<Variant> variants = options.variants;
  if (variants.empty() && model.IsDense()) {
    // The other variants split or reorder around MoE AlltoAlls: none to overlap.
    variants.push_back(Variant::kNone);
  } else if (variants.empty()) {
    variants.assign(std::begin(kAllVariants), std::end(kAllVariants));
  }

  s.BuildUnits();
  s.ResetPieces();
  // Before any graph is built: what the plan would hold, against the bound.
  MOEPLAN_RETURN_IF_ERROR(s.CheckFootprint(schedules, algos, variants, bound != nullptr));
  if (out == nullptr && bound == nullptr) return absl::OkStatus();
  if (bound != nullptr) {
    MOEPLAN_RETURN_IF_ERROR(ComputeBound(s, schedules, algos, bound));
    return absl::OkStatus();
  }
  s.BuildBounds();

  // Each variant starts empty, on the storage of the last plan's (a planner
  // reused by the layout search copies graphs of the same size into them).
  out->moe_layers = model.NumMoeLayers();
  out->params_per_rank = s.ParamsPerRank();
  out->crossover = model.IsDense() ? AllToAllCrossover{} : s.Crossover();
  out->best = 0;
  if (scope != Scope::kEveryVariant) {
    out->variants.resize(1);
    ResetVariantPlan(&out->variants[0]);
    return PlanFastestVariant(s, options, schedules, algos, variants,
                              scope == Scope::kFastestOnlyChecked, &out->variants[0]);
  }
  out->variants.resize(variants.size());
  for (size_t vi = 0; vi < variants.size(); ++vi) {
    ResetVariantPlan(&out->variants[vi]);
    out->variants[vi].variant = variants[vi];
  }
  MOEPLAN_RETURN_IF_ERROR(PlanVariants(s, options, schedules, algos, out->variants));
  for (size_t i = 1; i < out->variants.size(); ++i) {
    if (out->variants[i].iteration_us() <
        out->variants[static_cast<size_t>(out->best)].iteration_us())
      out->best = static_cast<int>(i);
  }
  return absl::OkStatus();
}

}  // namespace moeplan::planner
