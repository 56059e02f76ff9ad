// The whole-model planner (docs/model.md): a model's forward and backward on
// the same op graph, cost model and simulator as single layers. The MoE
// layers are the schedule builders' sections (schedules.h); the overlap
// variants are Lancet's weight-gradient (dW) scheduling and operator
// partition, Tutel's AlltoAll/expert pipelining, and no overlap, each with
// every MoE schedule and AlltoAll algorithm the layout allows. One pipeline
// stage of a layout is planned here too (PlanStage); layouts themselves are
// layout.h, which builds on this header, never the other way round.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/limits.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/op_graph.h"
#include "moeplan/planner/simulator.h"
#include "moeplan/planner/types.h"

namespace moeplan::planner {

enum class Variant : uint8_t { kNone = 0, kTutel = 1, kDw = 2, kPartition = 3, kLancet = 4 };
inline constexpr Variant kAllVariants[] = {Variant::kNone, Variant::kTutel, Variant::kDw,
                                           Variant::kPartition, Variant::kLancet};
std::string_view VariantName(Variant v);  // "none", "tutel", "dw", "partition", "lancet"
bool ParseVariant(std::string_view name, Variant* out);

struct ModelPlanOptions {
  std::vector<Variant> variants;    // empty: all five
  std::vector<Schedule> schedules;  // empty: every schedule the layout allows
  std::vector<AllToAllAlgo> algos;  // empty: both (hierarchical where it applies)
  int64_t bucket_bytes = 25 << 20;  // DDP gradient bucket
  int max_partitions = 8;           // rho: most micro-batches a range is split into
  int partition_groups = 5;         // gamma: groups of dense ops between two MoE layers
  int max_span = 0;                 // iota, in groups; 0: the span between two MoE layers
  std::vector<int> tutel_degrees = {1, 2, 4, 8};
  // Memory one plan (or stage) may hold, in bytes: its op graphs and their
  // simulations (the largest graph times the graphs held at once) and dW
  // placement's reachability matrix (backward ops squared, in bits),
  // estimated from the stage's units before any graph is built (docs/model.md
  // "Memory bound"). Over it the plan is ResourceExhausted naming
  // max_plan_bytes; between 1 MiB and 2^40.
  int64_t max_plan_bytes = int64_t{2} << 30;
  // Checked between simulated candidates (DeadlineExceeded once passed).
  Deadline deadline;
};
// InvalidArgument naming the option ("bucket_bytes", "max_partitions", ...).
absl::Status ValidateModelPlanOptions(const ModelPlanOptions& options);

// A forward range of the operator partition: ops first..last split k ways.
struct PartitionRange {
  std::string first_op, last_op;  // names of the range's first and last op (piece 0)
  int k = 1;
  double us = 0.0;  // its time when simulated alone (the DP's P)
};

// dW ops issued right after one backward AlltoAll.
struct DwPlacement {
  std::string alltoall;  // e.g. "b5.moe.bwd.ep_alltoall_combine"
  double alltoall_us = 0.0;
  std::vector<std::string> dw_ops;
  double dw_us = 0.0;
};

struct MoeLayerChoice {
  int block = 0;
  Schedule schedule = Schedule::kDefault;
  AllToAllAlgo algo = AllToAllAlgo::kLinear;
  int partitions = 1;  // micro-batches of the range holding its experts (tutel: r)
};

// One (schedule, algorithm) tried inside a variant.
struct VariantAlternative {
  Schedule schedule = Schedule::kDefault;
  AllToAllAlgo algo = AllToAllAlgo::kLinear;
  int tutel_degree = 0;  // tutel only: the best r for this pair
  double iteration_us = 0.0;
};

struct VariantPlan {
  Variant variant = Variant::kNone;
  Schedule schedule = Schedule::kDefault;  // of every MoE layer
  AllToAllAlgo algo = AllToAllAlgo::kLinear;
  int tutel_degree = 0;  // tutel only
  OpGraph graph;
  SimResult sim;
  std::vector<MoeLayerChoice> layers;
  std::vector<PartitionRange> partitions;        // partition and lancet: the ranges with k > 1
  std::vector<DwPlacement> dw;                   // dw and lancet: one per backward AlltoAll
  std::vector<VariantAlternative> alternatives;  // fastest first
  double iteration_us() const { return sim.makespan_us; }
};

// Where the hierarchical AlltoAll starts beating the linear one for this
// model's dispatch on this cluster: EP groups of W ranks, q per node, W = 2q,
// 4q, ... up to kMaxCrossoverRanks.
struct AllToAllCrossover {
  bool applies = false;       // q >= 2 (several EP ranks per node)
  double bytes = 0.0;         // per-rank AlltoAll size of the default schedule
  int ranks_per_node = 0;     // q
  int faster_from_ranks = 0;  // smallest W where 2dh is faster; 0: none up to the max
  double linear_us = 0.0;     // at the model's EP degree (when it spans nodes)
  double hierarchical_us = 0.0;
};
inline constexpr int kMaxCrossoverRanks = 1 << 16;

struct ModelPlan {
  std::vector<VariantPlan> variants;  // in request order
  int best = 0;                       // index of the fastest
  AllToAllCrossover crossover;
  int moe_layers = 0;
  int64_t params_per_rank = 0;
  const VariantPlan* Find(Variant v) const;
};

// A run of blocks planned as one pipeline stage (docs/layouts.md), and how its
// MoE layers and gradients are laid out.
struct StageOptions {
  int first_block = 0;
  int end_block = -1;  // one past the last block; -1: num_layers
  bool embed = true;   // holds the embedding (the first stage)
  bool head = true;    // holds the final norm, LM head and loss (the last stage)
  // PPMoE: tokens are replicated over the TP group, so dispatch is a local
  // index-select and the combine a TP-AllReduce (no EP AlltoAll).
  bool local_dispatch = false;
  int expert_replicas = 1;  // ranks holding the same expert shard (edp): their gradients sync
  int zero_stage = 0;       // 0-3
  int64_t dense_group_stride = 0;  // 0: parallel.mp (the DP group of the dense parameters)
};

// The parameters one rank of the stage holds (model.h's BlockParams over its
// blocks, plus the embedding and LM head where held).
RankParams StageParams(const ModelConfig& model, const StageOptions& stage);

// Plans whole models against one cost model; reuses its buffers between calls
// (one instance per thread; the CostModel may be shared).
class ModelPlanner {
 public:
  explicit ModelPlanner(const CostModel& cost);
  ~ModelPlanner();
  ModelPlanner(ModelPlanner&&) noexcept;
  const CostModel& cost() const;
  // Validates model and options (InvalidArgument naming the field), then
  // simulates every requested variant with every allowed MoE schedule and
  // AlltoAll algorithm and keeps each variant's fastest.
  absl::Status Plan(const ModelConfig& model, const ModelPlanOptions& options, ModelPlan* out);
  // One stage of a layout: `model` (micro_batch_size and parallel as the
  // layout sets them) is not validated here (ValidateLayout does); options are.
  // kFastestOnly: out->variants holds only the fastest variant (best 0),
  // without alternatives, the one every-variant planning would pick (equal
  // graph and times), found with fewer simulations (docs/model.md
  // "Planning only the fastest"). The layout search plans chunks this way.
  // kFastestTimesOnly: the same plan, its graph without what its ops
  // compute (every OpGraph::exec kind kNone): for callers that read its ops
  // and times only, not an executor (the layout search's chunks).
  // kFastestOnlyChecked: the same plan, every time it sums (forward end plus
  // rest) also simulated whole; InternalError naming the variant where they
  // differ by more than rounding (tests).
  enum class Scope : uint8_t {
    kEveryVariant,
    kFastestOnly,
    kFastestTimesOnly,
    kFastestOnlyChecked
  };
  absl::Status PlanStage(const ModelConfig& model, const ModelPlanOptions& options,
                         const StageOptions& stage, ModelPlan* out,
                         Scope scope = Scope::kEveryVariant);
  // Lower bounds on any variant's per-micro-batch forward and backward of the
  // stage (per phase, the busiest resource's unsplit ops, the least over the
  // schedules and algorithms) and its optimizer step, without simulating.
  // They hold for every ZeRO stage (stage.zero_stage is not read). The layout
  // search prunes with them.
  struct StageBound {
    double fwd_us = 0.0, bwd_us = 0.0;
    double optimizer_us = 0.0;          // ZeRO 0
    double sharded_optimizer_us = 0.0;  // ZeRO >= 1: each rank updates its shard
    // Per resource (compute, intra, inter): each phase's ops as above, and the
    // iteration's gradient synchronisation (one collective of all the
    // gradients per group, which buckets only split) by ZeRO class (0, 1-2,
    // 3), with the optimizer step on compute.
    std::array<double, kNumResources> fwd_res{}, bwd_res{};
    std::array<std::array<double, kNumResources>, 3> sync_res{};
    // ZeRO 3 only: its per-block parameter gathers per micro-batch and
    // resource (the forward's end by the forward's end; the backward's may
    // run during the forward), and fwd_us with the forward's gathers.
    std::array<double, kNumResources> zero3_fwd_res{}, zero3_bwd_res{};
    double zero3_fwd_us = 0.0;
    // With `chain` only (else bwd_us): the backward bounded by its
    // dependencies too. Per schedule and algorithm, the larger of bwd_us's
    // busiest resource and the backward simulated with its dW ops, buckets
    // and gathers passed through (the same for every variant, never longer
    // than one's), the least kept.
    double chain_bwd_us = 0.0;
    // ZeRO 2-3: the gradients' ReduceScatter per resource (sync_res[2] less
    // the optimizer), which ends every micro-batch's backward, and bwd_us
    // (with `chain`, chain_bwd_us) with it.
    std::array<double, kNumResources> rs_res{};
    double rs_bwd_us = 0.0;
  };
  // `chain`: chain_bwd_us too (a simulation of the backward per schedule and
  // algorithm; without it, a pass over the ops).
  absl::Status StageComputeBound(const ModelConfig& model, const ModelPlanOptions& options,
                                 const StageOptions& stage, StageBound* bound, bool chain = false);
  // Whether PlanStage would stay within options.max_plan_bytes, estimated
  // from the stage's units without building a graph: OK, or the
  // ResourceExhausted PlanStage would return (the layout search skips such
  // stages before bounding them). Options are checked like PlanStage's.
  absl::Status CheckStage(const ModelConfig& model, const ModelPlanOptions& options,
                          const StageOptions& stage);

  // The planner's state and work, private to the library
  // (planner/src/model_planner_internal.h).
  struct Impl;

 private:
  // Plans into `out`, or bounds into `bound`, or (both null) only checks the
  // memory bound.
  absl::Status Run(const ModelConfig& model, const ModelPlanOptions& options,
                   const StageOptions& stage, ModelPlan* out, StageBound* bound,
                   Scope scope = Scope::kEveryVariant);
  std::unique_ptr<Impl> impl_;
};

// ---- The algorithms, exposed for tests ----

// Which ops reach which, on the ops [first, graph.size()) of a DAG in
// topological (issue) order: ancestor bitsets computed in one pass,
// O(E * S / 64) for S tracked sources. `sources` (empty: every op) are the
// only ops whose paths are kept; dW placement asks only from its dW ops.
class Reachability {
 public:
  void Compute(const OpGraph& graph, OpId first = 0, std::span<const OpId> sources = {});
  // A directed path from `from` to `to` (from != to), both >= first; `from`
  // must be a source (false otherwise).
  bool Path(OpId from, OpId to) const;
  // Neither reaches the other (both sources).
  bool Independent(OpId a, OpId b) const { return a != b && !Path(a, b) && !Path(b, a); }
  // The sources with a path to any of `ops` (op o here is o - shift), one
  // bit each: Path(s, o) for some o is Reaches(*reached, s), from one pass
  // over the ops' rows.
  void Reaching(std::span<const OpId> ops, OpId shift, std::vector<uint64_t>* reached) const;
  bool Reaches(const std::vector<uint64_t>& reached, OpId source) const;

 private:
  OpId first_ = 0;
  int words_ = 0;
  std::vector<int> bit_;       // op v - first_: its source bit, -1 if not a source
  std::vector<uint64_t> anc_;  // row v - first_: the sources among v's ancestors
};

// Lancet's best fit: for each slot in order (an AlltoAll of slot_us[s]), pick
// unused dW ops with eligible(s, d) that minimise |remaining - dw_us[d]|,
// subtracting each pick, until remaining <= 0 or none is left. Returns the
// picks per slot, in pick order.
std::vector<std::vector<int>> BestFitDw(std::span<const double> slot_us,
                                        std::span<const double> dw_us,
                                        absl::FunctionRef<bool(int slot, int dw)> eligible);

// Lancet's operator-partition DP over segments 0..n: T(j) = min over
// max(0, j - max_span) <= i < j of T(i) + min over 1 <= k <= max_k of
// cost(i, j, k), where cost < 0 means "not allowed" (cost(i, i+1, 1) must be
// allowed). Returns the chosen ranges in order; ties prefer fewer pieces and
// longer earlier ranges are not preferred (first minimum in i, then k).
struct PartitionChoice {
  int begin = 0, end = 0, k = 1;
  double us = 0.0;
};
std::vector<PartitionChoice> PartitionDp(int n, int max_span, int max_k,
                                         absl::FunctionRef<double(int, int, int)> cost);

}  // namespace moeplan::planner
