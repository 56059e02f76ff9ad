// The whole-model runner (docs/executor.md "Whole models"): one variant's op
// graph of a model (ModelPlanner: Lancet's dW placement and operator
// partition, Tutel's pipelining, or none) interpreted op for op, forward,
// backward, gradient buckets and the optimizer step. Routed-expert ops compute
// on their MoE layer instance's buffers (one per block and micro-batch piece,
// seeded like single layers); dense ops run a kernel of their shape on scratch
// memory, and dense collectives move their counts on the tensor- and
// data-parallel groups. Values do not flow from block to block: what is
// measured is each op's time in the plan's order and overlap.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "moeplan/executor/check.h"
#include "moeplan/executor/comm.h"
#include "moeplan/executor/device.h"
#include "moeplan/executor/interpreter.h"
#include "moeplan/executor/kernels.h"
#include "moeplan/executor/runner.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/layout.h"
#include "moeplan/planner/layout_planner.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/model_planner.h"

namespace moeplan::executor {

// What the executor runs of a model: parallel.mp * dp * pp must be the
// ranks (a pipeline's stages are consecutive blocks of mp * dp ranks). Same
// answer on every rank.
absl::Status ValidateModelForExecutor(const planner::ModelConfig& model, int world_size);

// The variant the executor runs: the model planned for `world_size` ranks on
// `hosts` nodes with `cost` (null: a neutral cost model), restricted to the
// linear AlltoAll (the hierarchical one's steps are not executable yet).
// `options` sets the rest (its variants and algos are replaced). One stage:
// parallel.pp must be 1 (pipelines: PlanLayoutRun).
absl::StatusOr<planner::VariantPlan> PlanModelRun(const planner::ModelConfig& model,
                                                  planner::Variant variant, int world_size,
                                                  int hosts, const planner::CostModel* cost,
                                                  planner::ModelPlanOptions options = {});

// A layout's program as the executor runs it (planner::LayoutPlanner::Program,
// every chunk planned with `variant` and the linear AlltoAll) on
// dp * tp * pp = `world_size` ranks; `run_model` receives the model as each
// stage runs it (its parallel and micro_batch_size are the layout's), what
// ModelRunner::Create takes. The executor runs parm and dpmoe layouts
// (folded expert grids and replicas), sequence parallelism, the A2A overlap
// and DualPipe; ppmoe's local dispatch, context parallelism, the allgather
// dispatcher, FP8 and recomputation are refused naming the layout field.
absl::StatusOr<planner::VariantPlan> PlanLayoutRun(const planner::ModelConfig& model,
                                                   const planner::Layout& layout,
                                                   planner::Variant variant, int world_size,
                                                   const planner::CostModel* cost,
                                                   planner::ModelConfig* run_model,
                                                   planner::ModelPlanOptions options = {});

// One MoE layer instance of a model's plan, its tensors assembled from every
// rank (ModelRunner::GlobalResults): y and dx of every MP group's tokens of
// the stage ([groups x S x M]), the gate gradient summed over MP groups, the
// full expert weight gradients ([E x M x F], F = 2H gated else H, and
// [E x H x M]) summed over their replicas. No routing.
struct InstanceResults {
  planner::ExecLayer layer;
  LayerResults tensors;
};

// The layout a checked layout is held against (moeplan-exec --check,
// docs/executor.md "Layouts checked"): the same tp, dp, cp, pp, micro-batches
// and ZeRO stage, without sequence parallelism or A2A overlap, the AlltoAll
// dispatcher, the expert grid tied to the attention grid (esp = tp, ep =
// dp * cp, family re-inferred) and, for DualPipe, 1F1B over the even split.
// Not validated (ep must still divide the experts).
planner::Layout PlainLayout(const planner::Layout& layout);

// One instance of a checked run against the reference run's (matched by
// block, micro-batch and piece): y, dx, dgate, dw1, dw2 (CompareResults), or
// `missing` when one run lacks it.
struct InstanceDiff {
  planner::ExecLayer layer;
  std::vector<TensorDiff> tensors;
  bool missing = false;
};
// Every instance of `ref` and of `got` (those only `got` has: missing).
std::vector<InstanceDiff> CompareInstances(const std::vector<InstanceResults>& ref,
                                           const std::vector<InstanceResults>& got);

class ModelRunner {
 public:
  // Collective over `world`: validates, splits the stages and the MP, EP,
  // ESP, DP and EDP groups inside them (a pipeline: and its pp groups),
  // builds every MoE layer instance the rank's ops name (its buffers
  // sized from its ops; the memory limit applies to all of them together,
  // instance by instance) and the scratch memory of the dense ops, then the
  // interpreter. Options: dtype, seed, memory limit, lanes.
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(const planner::ModelConfig& model,
                                                             const planner::OpGraph& plan,
                                                             const RunOptions& options,
                                                             Device* device, Kernels* kernels,
                                                             Communicator* world);
  ~ModelRunner();

  absl::Status RunIteration();
  const std::vector<OpTime>& timings() const;
  double forward_us() const;
  double total_us() const;
  bool threaded() const;
  int layer_instances() const;  // MoE layer instances built
  // Collective over the world, after an iteration: every instance of the
  // plan assembled from every rank's share (docs/executor.md "Layouts
  // checked"), in the plan's order. Tokens are the stage's, so two layouts
  // of one model with the same tp, dp and micro-batches compare instance by
  // instance whatever their expert grid, sequence parallelism or overlap.
  absl::StatusOr<std::vector<InstanceResults>> GlobalResults();

  class Impl;

 private:
  explicit ModelRunner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeplan::executor
