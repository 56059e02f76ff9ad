// The whole-model planner's state and units (private to the planner
// library). ModelPlanner::Impl is defined in pieces, one job per file:
//   model_forward.cc    the forward as units, emitted whole or split k ways
//   model_backward.cc   the backward in reverse with dX / dW ops, AlltoAll slots
//   model_evaluate.cc   one whole graph: dW placement, gradient buckets and the
//                       optimizer (Finalize), simulation, lower bounds
//   model_partition.cc  Lancet's operator partition (segments, range costs),
//                       Tutel's ranges, the AlltoAll crossover
//   model_planner.cc    the public ModelPlanner: options, schedules and
//                       algorithms to try, the variants
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "graph_builder.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/planner/schedules.h"
#include "schedule_kernels.h"

namespace moeplan::planner {
namespace internal {

inline constexpr Phase F = Phase::kForward;
inline constexpr Phase B = Phase::kBackward;
inline constexpr double kInf = std::numeric_limits<double>::infinity();

enum class UnitKind : uint8_t {
  kEmbed,
  kLn1,
  // Sequence parallelism (docs/model.md): the norm's S/t slices AllGathered
  // for the TP-split GEMMs after it (attention, dense MLP, shared experts,
  // LM head).
  kLn1Gather,
  kQkv,
  kQkNorm,  // qk_layernorm: queries and keys normalised per head
  // Multi-head latent attention in place of kQkv: down projections (and
  // their norms), up projections.
  kQDown,
  kQNorm,
  kQUp,
  kKvDown,
  kKvNorm,
  kKvUp,
  kAttnScore,
  kSoftmax,
  kAttnCtx,
  kFlashAttn,  // attention_backend flash / fused: the three above as one kernel
  kProj,
  kProjAllReduce,
  kResidual1,
  kLn2,
  kLn2Gather,
  kFc1,
  kGelu,
  kFc2,
  kFc2AllReduce,
  kResidual2,
  kMoeRoute,
  kSharedGather,
  kSharedFc1,
  kSharedAct,
  kSharedFc2,
  kSharedGate,  // moe.shared_expert_gate: sigmoid(x w) scales the shared output
  kSharedAllReduce,
  kMoeExchange,
  // An MTP depth's input: the next tokens' embedding (a lookup in the
  // shared table), and it and the hidden state normalised, concatenated and
  // projected 2M -> M (before its block).
  kMtpEmbed,
  kMtpNorm,
  kMtpProj,
  kLnF,
  kHeadGather,
  kLmHead,
  kLoss,
};

inline bool IsMoeUnit(UnitKind k) {
  return k >= UnitKind::kMoeRoute && k <= UnitKind::kMoeExchange;
}
// The shared expert's dense units, inside an MoE block's scope.
inline bool IsSharedExpertUnit(UnitKind k) {
  return k >= UnitKind::kSharedGather && k <= UnitKind::kSharedAllReduce;
}
// The routed experts' units: the MoE schedule's sections.
inline bool IsRoutedUnit(UnitKind k) { return IsMoeUnit(k) && !IsSharedExpertUnit(k); }
inline bool IsAttention(UnitKind k) {
  return k == UnitKind::kAttnScore || k == UnitKind::kSoftmax || k == UnitKind::kAttnCtx ||
         k == UnitKind::kFlashAttn;
}

// One forward unit; inputs are earlier unit indices (-1: none).
struct Unit {
  UnitKind kind;
  int16_t block;
  int in_a = -1;
  int in_b = -1;
};

// Units [begin, end) split into k micro-batches.
struct Range {
  int begin = 0, end = 0, k = 1;
  double us = 0.0;
};

// A parameter's gradient: the op that completes it, its bytes, and whether it
// is an expert's (synchronised over the expert replicas, not the dense DP group).
struct Param {
  double bytes;
  OpId producer;
  bool expert = false;
};

// A unit's ops split k ways, as BuildUnit builds them (the template
// EmitRange copies per piece), and its outputs.
struct UnitOps {
  OpGraph graph;
  Deps out;
};

// A DDP gradient bucket of one group (dense over DP, expert over its replicas).
struct Bucket {
  double bytes = 0.0;
  int left = 0;
  bool expert = false;
  int index = 0;  // within its group
  std::vector<OpId> deps;
};

// One backward AlltoAll (a linear collective, the ops of a hierarchical one,
// or an SAA's steps): where dW ops may go. Named "b<block>.moe.<site>" when
// a plan describes its placements (ModelPlanner::Impl::Describe).
struct Slot {
  int block = -1;
  std::string_view site;  // Site() of a static op base
  OpId first = kNoOp;
  OpId last = kNoOp;
  std::vector<OpId> ops;
};

// The backward of one (schedule, algorithm, detach) as EmitBackward builds
// it after a stand-in op 0 for the forward's last op, with its parameters,
// slots and dW ops (ModelPlanner::Impl::CopyBackward).
struct BackwardOps {
  OpGraph graph;
  std::vector<Param> params;
  std::vector<Slot> slots;
  std::vector<OpId> dw_ops;
  int64_t plan = -1;  // the plan (ModelPlanner::Impl::plan_count) it was built for
  uint64_t pair = 0;  // and the (schedule, algorithm)
  int64_t build = 0;  // builds so far (ModelPlanner::Impl::reach_of)
  // Each op's parameters: a list through param_next from param_first (by
  // producer); forward_param: one is produced by op 0, the forward's.
  std::vector<int> param_first, param_next;
  bool forward_param = false;
};

// "bwd.ep_alltoall_combine.2dh_intra" -> "bwd.ep_alltoall_combine"; "bwd.saa_combine.alltoall" ->
// "bwd.saa_combine".
inline std::string_view Site(std::string_view base) {
  const size_t first = base.find('.');
  const size_t second = base.find('.', first + 1);
  return second == std::string_view::npos ? base : base.substr(0, second);
}

inline std::string NameWithoutPart(Op op) {
  op.part = -1;
  return op.Name();
}

// What the dense ops compute (op_exec.h): shapes only, on scratch memory.
inline OpExec DenseMemory(double bytes, double bytes_per_element) {
  return {.kind = ExecKind::kDenseMemory, .count = Bytes(bytes / bytes_per_element)};
}
// `groups` x `reps` GEMMs of m x n x k.
inline OpExec DenseGemm(int64_t m, int64_t n, int64_t k, int64_t groups = 1, int reps = 1) {
  return {.kind = ExecKind::kDenseGemm,
          .parts = reps,
          .groups = static_cast<int32_t>(groups),
          .tokens = m,
          .rows = n,
          .count = k};
}
inline OpExec DenseColl(ExecKind kind, ExecGroup group, double bytes, double bytes_per_element) {
  return {.kind = kind, .group = group, .count = Bytes(bytes / bytes_per_element)};
}
inline constexpr OpExec kJoin = {.kind = ExecKind::kNop};

// A flash / fused attention kernel's forward over `seqs` sequences of L
// tokens, `heads` heads: the score and context GEMMs on the unmasked half
// (causal), nothing of L x L written to memory. Its backward recomputes the
// scores and runs three more products: 2.5x (FlashAttention-2's ratio).
inline double FlashAttentionUs(const CostModel& c, int64_t seqs, int64_t heads, int64_t L,
                               const RankDims& d) {
  return 0.5 *
         (c.BatchedGemmUs(seqs * heads, L, L, d.qk) + c.BatchedGemmUs(seqs * heads, L, d.v, L));
}
inline constexpr double kFlashBackwardRatio = 2.5;

// A GEMM m x n x k op's time and bytes: on `gemm` (the FP8 copy for a linear
// layer under FP8 training), after a cast of `cast` elements priced on `cost`
// (0: none).
struct GemmCost {
  double us = 0.0, bytes = 0.0;
};
inline GemmCost GemmOf(const CostModel& cost, const CostModel& gemm, int64_t mm, int64_t nn,
                       int64_t kk, double e, double cast) {
  GemmCost g{gemm.GemmUs(mm, nn, kk), e * static_cast<double>(mm * kk + kk * nn + mm * nn)};
  if (cast > 0.0) {
    g.us += cost.MemoryBoundUs(Fp8CastBytes(cast, e));
    g.bytes += Fp8CastBytes(cast, e);
  }
  return g;
}

}  // namespace internal

struct ModelPlanner::Impl {
  using Deps = internal::Deps;
  using Builder = internal::Builder;
  using Unit = internal::Unit;
  using Range = internal::Range;
  using Param = internal::Param;
  using Slot = internal::Slot;

  explicit Impl(const CostModel& c) : cost(c) {
    // Graphs only simulated: nothing reads what their ops compute.
    range_graph.RecordExec(false);
    forward_graph.RecordExec(false);
  }

  const CostModel& cost;
  // The linear layers' GEMMs: `cost`, or with FP8 training a copy at the FP8
  // peak (made once: fp8_cost).
  const CostModel* linear = &cost;
  std::optional<CostModel> fp8_cost;
  // ---- Per plan ----
  const ModelConfig* m = nullptr;
  ModelPlanOptions opt;
  StageOptions st;
  int first_block = 0, end_block = 0;
  GroupShape edp_shape;
  LayerConfig moe_layer;
  RankDims dims;
  Topology topo;
  GroupShape mp_shape, dp_shape;
  // Context parallelism's ring (cp ranks at stride mp; one rank without).
  GroupShape cp_shape;
  std::vector<Unit> units;
  std::vector<int> bounds;  // segment boundaries, unit indices, 0 ... units.size()
  int max_span = 1;
  // ---- Per (schedule, algorithm) ----
  Schedule sched = Schedule::kDefault;
  AllToAllAlgo algo = AllToAllAlgo::kLinear;
  uint64_t combo_salt = 0;
  uint64_t context_salt = 0;  // the model, layout and stage a range's costs depend on
  bool bound_chain = false;   // StageComputeBound's `chain`
  // Whether the plan names its partitions and dW placements (not for
  // Scope::kFastestTimesOnly, whose callers read times only).
  bool describe = true;
  // ---- Scratch ----
  OpGraph scratch, range_graph, forward_graph, g0, final_graph;
  OpGraph held_graph;  // FastestSearch's best graph so far
  SimResult held_sim;
  Simulator simulator;
  SimResult range_sim, sim0, final_sim;
  std::vector<OpId> map, dep_buf;
  std::vector<int> piece_begin, piece_k;
  std::vector<int16_t> layer_of;  // EmitRange: each piece's MoE layer instance
  std::vector<std::array<OpId, 2>> piece_out;
  std::vector<Param> params;
  std::vector<Slot> slots;
  std::vector<OpId> dw_ops;
  std::vector<OpId> range_first, range_last;
  absl::flat_hash_map<uint64_t, double> p_cache;
  // The current pair's lower bound on every variant (FastestSearch's), by
  // PairKey: StageComputeBound's (with `chain`) serve the stage's plans
  // (cleared with p_cache).
  absl::flat_hash_map<uint64_t, double> pair_bounds;
  // The partition DP's scratch: each segment i's span structure (SpanKeys,
  // for every k), range_graph's size after each unit, the span's keys, its
  // table of range costs.
  std::vector<uint8_t> span_ready;    // per i
  std::vector<uint64_t> span_family;  // per i: the whole span's structure
  std::vector<uint64_t> span_prefix;  // [i * span + j - i - 1]: units to segment j's end
  std::vector<uint8_t> span_moe;      // the same: whether those units hold MoE ones
  std::vector<OpId> unit_end;
  std::vector<double> unit_makespan;             // SimulateUnits', after each unit
  std::vector<double> op_end;                    // SimulateUnits': a unit's ops' ends, per piece
  std::vector<std::array<double, 2>> piece_end;  // SimulateUnits' piece_out, as ends
  std::vector<uint64_t> range_keys;
  std::vector<double> cost_table;
  // RangeCosts' whole answers: offsets into family_costs (cleared with p_cache).
  absl::flat_hash_map<uint64_t, size_t> family_cache;
  std::vector<double> family_costs;
  Reachability reach;
  // UnitTemplate's, per plan (Configure clears them).
  absl::node_hash_map<uint64_t, internal::UnitOps> unit_ops;
  // CopyBackward's without and with detached dW ops (each valid for the
  // plan and pair it was built for), and its layer map. `reach` holds the
  // reachability of template reach_of[0]'s build reach_of[1] (ops from 1).
  std::array<internal::BackwardOps, 2> bwd_ops;
  std::array<int64_t, 2> reach_of = {-1, -1};
  int64_t plan_count = 0;  // plans configured so far
  std::vector<int16_t> layer_map;
  // PlaceDw's: each slot's AlltoAll time and its dW ops (indices into
  // dw_ops); empty without dW placement.
  std::vector<double> slot_us_, dw_us_;
  std::vector<std::vector<int>> picks_;
  std::vector<std::vector<uint64_t>> slot_reached_;  // per slot: the dW ops reaching it
  const OpGraph* described_ = &g0;  // the graph Evaluate's forward and backward ops are in
  // Finalize's and IssueOrder's scratch.
  std::vector<internal::Bucket> buckets_;
  std::vector<int> bucket_of_, param_first_, param_next_, after_first_, after_last_, after_next_;
  std::vector<OpId> new_id_, after_op_;
  std::vector<uint8_t> consumed_, moved_;

  int64_t Tokens(int k) const { return (m->micro_batch_size * m->seq_length + k - 1) / k; }
  int64_t Seqs(int k) const { return (m->micro_batch_size + k - 1) / k; }
  LayerContext MoeContext(const LayerConfig* layer, int block, bool detach) const;

  // ---- Per plan (model_planner.cc) ----
  // Sets the plan's model, options, stage, groups and the range-cost salt.
  void Configure(const ModelConfig& model, const ModelPlanOptions& options,
                 const StageOptions& stage);

  // ---- Forward (model_forward.cc) ----
  void BuildUnits();
  // Appends a unit's ops for a micro-batch of k pieces' size after `x`.
  Deps BuildUnit(const Unit& u, int k, Builder& b, Deps x, LayerConfig* piece_layer);
  Deps BuildAttentionUnit(internal::UnitKind kind, int k, Builder& b, Deps x);
  Deps BuildRoutedUnit(internal::UnitKind kind, int64_t s, Builder& b, Deps x,
                       LayerConfig* piece_layer);
  Deps ForwardMemory(Builder& b, std::string_view name, double bytes, Deps x) const;
  // `linear`: a linear layer's GEMM (FP8 with FP8 training, its input cast
  // first); else the output layer's, in bytes_per_element.
  Deps ForwardGemm(Builder& b, std::string_view name, int64_t mm, int64_t nn, int64_t kk, Deps x,
                   bool linear = true) const;
  bool Fp8() const { return m->Fp8(); }
  // A parameter's bytes in ZeRO's gathers: 1 with fp8_param_gather.
  double ParamGatherBytes() const { return m->fp8_param_gather ? 1.0 : m->bytes_per_element; }
  // Sequence parallelism (docs/model.md): on, with TP.
  bool SequenceParallel() const { return m->parallel.mp > 1 && m->parallel.sequence_parallel; }
  // The exposed part of a TP sub-block's sequence-parallel collective: with
  // --tp-comm-overlap it runs in mp steps pipelined with its GEMM, one step
  // on the critical path (the GEMM assumed the longer; docs/layouts.md
  // "Overlapped TP communication"). The LM head's are not overlapped.
  double TpCommExposed(std::string_view name) const {
    return SequenceParallel() && m->parallel.tp_comm_overlap &&
                   name.find("lm_head") == std::string_view::npos &&
                   name.find("ln_f") == std::string_view::npos
               ? 1.0 / m->parallel.mp
               : 1.0;
  }
  Deps TpReduce(Builder& b, std::string_view allreduce, std::string_view reducescatter, double sm,
                Deps x) const;
  Deps SpGather(Builder& b, std::string_view name, double sm, Deps x) const;
  // Context parallelism (docs/model.md): the fused attention of `seqs`
  // sequences as a ring of cp blocks, forward or backward, after `x`.
  Deps RingAttention(Builder& b, Phase phase, int64_t seqs, Deps x) const;
  void AppendInputs(const Unit& u, int range_begin, int p, bool standalone);
  // `unit_ends`, if given: g's size after each unit.
  const internal::UnitOps& UnitTemplate(const Unit& u, int k);
  void EmitRange(int u0, int u1, int k, OpGraph* g, bool standalone,
                 std::vector<OpId>* unit_ends = nullptr);
  void ResetPieces();
  Deps ZeroGather(OpGraph* g, int block, Phase phase);

  // ---- Backward (model_backward.cc) ----
  void EmitBackward(Deps x, bool detach);
  internal::BackwardOps& BackwardTemplate(bool detach);
  internal::BackwardOps* CopyBackward(Deps x, bool detach);
  // Without dW placement (the natural issue order): the backward template
  // copied after forward op x with each bucket's collective right after its
  // last gradient, as Finalize issues them (buckets_ left as Finalize's).
  void CopyBackwardWithBuckets(Deps x, const internal::BackwardOps& t);
  // Finalize's end: the optimizer step after every sink, then ZeRO 1-2's
  // parameter gathers per bucket.
  void FinishFinal();
  void RecordSlots(OpId begin, int blk);

  // ---- One whole graph (model_evaluate.cc) ----
  struct Built {
    std::vector<PartitionRange> partitions;
    std::vector<DwPlacement> dw;
  };
  // `bindings` false: final_sim without them (Simulator::Schedule). `built`
  // (if not null): the graph's partitions and dW placements by name
  // (Describe); null where a planner reads times only.
  absl::Status Evaluate(const std::vector<Range>& ranges, bool schedule_dw, Built* built,
                        bool bindings = true);
  // The partitions and dW placements of the graph Evaluate built last (of
  // `ranges`), by name: what a plan reports, built only for one it keeps.
  void Describe(const std::vector<Range>& ranges, Built* built) const;
  // The forward of `ranges` alone, simulated: its end (forward_graph holds it).
  absl::StatusOr<double> ForwardEnd(const std::vector<Range>& ranges);
  // A lower bound on that end: the busiest resource's ops (each unit's
  // template, once per piece).
  double ForwardBusy(const std::vector<Range>& ranges);
  Deps EmitForward(const std::vector<Range>& ranges, OpGraph* g);
  // `reach`: the backward's reachability, its op 0 being g0's op `shift`.
  absl::Status PlaceDw(const Reachability& reach, OpId shift);
  std::vector<OpId> IssueOrder(const std::vector<std::vector<int>>& picks);
  // Per phase and resource, the pair's ops' busy time; `chain` (if not
  // null): its backward simulated without dW ops (model_evaluate.cc).
  absl::Status PhaseBound(double (&busy)[2][kNumResources], double* chain);
  // A lower bound on every variant of the current pair, from PhaseBound: the
  // forward lasts at least its busiest resource's ops, and the backward,
  // which starts after it, at least its busiest resource's ops and its
  // dependency chain. Gradient buckets, the optimizer and ZeRO-3's gathers
  // are left out, which only lowers it. Cached in pair_bounds.
  absl::StatusOr<double> PairBound();
  static double PairBoundOf(const double (&busy)[2][kNumResources], double chain) {
    return *std::max_element(busy[0], busy[0] + kNumResources) +
           std::max(*std::max_element(busy[1], busy[1] + kNumResources), chain);
  }
  // What PhaseBound reads: the context (which holds whether ZeRO 3 gathers,
  // the only ZeRO stage the ops depend on), the stage's blocks and the pair.
  uint64_t PairKey() const;
  // ZeRO-3's parameter gathers of the stage's blocks per phase and resource,
  // whatever st.zero_stage is.
  void GatherBound(double (&busy)[2][kNumResources]);
  void SyncBound(std::array<std::array<double, kNumResources>, 3>* out) const;
  absl::Status Finalize(const std::vector<OpId>& order);
  OpId AddOptimizerStep(bool sharded);
  double OptimizerStepUs(bool sharded, int64_t* bytes_out = nullptr) const;
  StageOptions Stage() const;
  int64_t DenseParamsPerRank() const;
  int64_t ExpertParamsPerRank() const;
  int64_t ParamsPerRank() const { return DenseParamsPerRank() + ExpertParamsPerRank(); }

  // ---- Memory bound (model_footprint.cc) ----
  // The plan's graphs and reachability matrix estimated from the units (for
  // every schedule and algorithm to try; `bound_only`: StageComputeBound's
  // unsplit graphs), against opt.max_plan_bytes: ResourceExhausted over it.
  absl::Status CheckFootprint(std::span<const Schedule> schedules,
                              std::span<const AllToAllAlgo> algos,
                              std::span<const Variant> variants, bool bound_only);

  // ---- Operator partition (model_partition.cc) ----
  void BuildBounds();
  bool RangeAllowed(int u0, int u1, int k) const;
  // P(i, j, k) for every j of the DP's span from segment i into out[j - i - 1].
  void RangeCosts(int i, int k, double* out);
  // span_* of segment i: its units' kinds and inputs relative to its first,
  // hashed unit by unit to each segment end of its span.
  void SpanKeys(int i);
  void RangeCostsOf(int i, int k, int last, double* out);
  double SingleRangeCost(int u0, int u1, int k);
  // SimulateUnits' state from range to range.
  struct UnitSim {
    double free_at[kNumResources] = {0.0, 0.0, 0.0};
    double makespan = 0.0, forward_end = 0.0;
    bool any = false;  // an op was simulated
  };
  bool SimulateUnits(int u0, int u1, int k, bool standalone, UnitSim* sim);
  double InputsEnd(const Unit& u, int range_begin, int p, bool standalone) const;
  std::vector<Range> PartitionRanges();
  std::vector<Range> WholeRanges() const;
  std::vector<Range> TutelRanges(int r) const;
  std::vector<MoeLayerChoice> Layers(const std::vector<Range>& ranges) const;
  AllToAllCrossover Crossover() const;
};

// Every variant of `vps` (each with its variant set) planned with every
// (schedule, algorithm) pair: its fastest kept, every pair's best in its
// alternatives, fastest first (model_variants.cc).
absl::Status PlanVariants(ModelPlanner::Impl& s, const ModelPlanOptions& options,
                          std::span<const Schedule> schedules, std::span<const AllToAllAlgo> algos,
                          std::span<VariantPlan> vps);
// ModelPlanner::Scope::kFastestOnly: the variant PlanVariants would rank
// first, into *out (model_variants.cc); `checked`: kFastestOnlyChecked.
absl::Status PlanFastestVariant(ModelPlanner::Impl& s, const ModelPlanOptions& options,
                                std::span<const Schedule> schedules,
                                std::span<const AllToAllAlgo> algos,
                                std::span<const Variant> variants, bool checked, VariantPlan* out);

}  // namespace moeplan::planner
