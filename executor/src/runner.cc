// The MoE-layer runner: the planner's op graph for one layer (default, S1 or
// S2; docs/schedules.md), interpreted op for op (interpreter.h) on the layer's
// buffers and kernels (moe_layer.h). The runner holds no schedule of its own:
// what runs, in which order and on which lane, is the plan.
#include "moeplan/executor/runner.h"

#include "moe_layer.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/schedules.h"
#include "moeplan/planner/validate.h"

namespace moeplan::executor {

using planner::Schedule;

absl::Status ValidateWorld(const planner::LayerConfig& layer, int world_size) {
  const planner::ParallelLayout& p = layer.parallel;
  if (p.pp != 1) {
    return absl::InvalidArgumentError(
        Cat("parallel.pp: the executor runs one pipeline stage; must be 1 (got ", p.pp, ")"));
  }
  if (int64_t{p.mp} * p.dp != world_size) {
    return absl::InvalidArgumentError(
        Cat("parallel: mp*dp must equal the number of ranks the executor runs on (got mp*dp=",
            int64_t{p.mp} * p.dp, ", ranks=", world_size, ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateForExecutor(const planner::LayerConfig& layer, Schedule schedule,
                                 int world_size) {
  if (layer.dropless && schedule != Schedule::kDefault) {
    return absl::InvalidArgumentError(Cat(
        "dropless: the executor runs dropless layers (an irregular AlltoAll) under the default "
        "schedule only; ",
        planner::ScheduleName(schedule),
        "'s ESP gathers of uneven blocks are planned but not executable: use --schedule default "
        "or set dropless to false"));
  }
  // esp | mp, which the default schedule needs, is ValidateLayer's.
  return ValidateWorld(layer, world_size);
}

namespace internal {

const planner::CostModel& NeutralCostModel() {
  static const planner::CostModel* const model = [] {
    planner::ClusterProfile p;
    p.name = "neutral";
    p.version = 1;
    p.source = planner::ProfileSource::kSpec;
    p.shape = {1, 8};
    p.intra = {1.0, 0.001};
    p.inter = {10.0, 0.01};
    p.gemm.peak_tflops = 100.0;
    p.gemm.launch_overhead_us = 5.0;
    p.memory.bandwidth_gbytes_per_s = 1000.0;
    p.memory.launch_overhead_us = 3.0;
    absl::StatusOr<planner::CostModel> m = planner::CostModel::Create(std::move(p));
    return new planner::CostModel(*std::move(m));
  }();
  return *model;
}

}  // namespace internal

absl::StatusOr<planner::OpGraph> PlanLayerRun(const planner::LayerConfig& layer, Schedule schedule,
                                              int world_size, int hosts,
                                              const planner::CostModel* cost) {
  const planner::ClusterShape cluster = hosts > 0 && world_size % hosts == 0
                                            ? planner::ClusterShape{hosts, world_size / hosts}
                                            : planner::ClusterShape{1, world_size};
  MOEPLAN_RETURN_IF_ERROR(ValidateWorld(layer, world_size));
  MOEPLAN_RETURN_IF_ERROR(planner::ValidateLayer(layer, cluster));
  MOEPLAN_RETURN_IF_ERROR(planner::ValidateForSchedule(layer, schedule));
  MOEPLAN_RETURN_IF_ERROR(ValidateForExecutor(layer, schedule, world_size));
  planner::LayerContext ctx;
  ctx.layer = &layer;
  ctx.cost = cost != nullptr ? cost : &internal::NeutralCostModel();
  ctx.topo = planner::MakeTopology(layer.parallel, cluster);
  planner::OpGraph graph;
  MOEPLAN_RETURN_IF_ERROR(planner::BuildSchedule(schedule, ctx, &graph));
  return graph;
}

class MoeLayerRunner::Impl {
 public:
  std::unique_ptr<RankGroups> groups;
  std::unique_ptr<internal::MoeLayerOps> ops;
  std::unique_ptr<PlanInterpreter> interpreter;
};

MoeLayerRunner::MoeLayerRunner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MoeLayerRunner::~MoeLayerRunner() = default;

absl::StatusOr<std::unique_ptr<MoeLayerRunner>> MoeLayerRunner::Create(
    const planner::LayerConfig& layer, const planner::OpGraph& plan, const RunOptions& options,
    Device* device, Kernels* kernels, Communicator* world) {
  const int size = world->size();
  MOEPLAN_RETURN_IF_ERROR(ValidateWorld(layer, size));
  MOEPLAN_RETURN_IF_ERROR(planner::ValidateLayer(layer, planner::ClusterShape{1, size}));
  MOEPLAN_RETURN_IF_ERROR(CheckExecutable(plan));
  // Every rank has passed validation: the first collective.
  auto impl = std::make_unique<Impl>();
  MOEPLAN_ASSIGN_OR_RETURN(impl->groups, RankGroups::Create(world, layer.parallel));
  MOEPLAN_ASSIGN_OR_RETURN(
      impl->ops, internal::MoeLayerOps::Create(layer, plan, /*instance=*/0, /*block=*/-1, options,
                                               impl->groups.get(), device, kernels));
  MOEPLAN_ASSIGN_OR_RETURN(impl->interpreter, PlanInterpreter::Create(plan, impl->ops.get(), device,
                                                                      world, options.lanes));
  return std::unique_ptr<MoeLayerRunner>(new MoeLayerRunner(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<MoeLayerRunner>> MoeLayerRunner::Create(
    const planner::LayerConfig& layer, const RunOptions& options, Device* device, Kernels* kernels,
    Communicator* world) {
  MOEPLAN_ASSIGN_OR_RETURN(
      planner::OpGraph plan,
      PlanLayerRun(layer, options.schedule, world->size(), options.hosts, options.cost));
  RunOptions opt = options;
  if (opt.plan_name == RunOptions{}.plan_name) {
    opt.plan_name = Cat("the ", planner::ScheduleName(options.schedule), " schedule");
  }
  return Create(layer, plan, opt, device, kernels, world);
}

absl::Status MoeLayerRunner::RunIteration() { return impl_->interpreter->RunIteration(); }
absl::Status MoeLayerRunner::RunPhase(planner::Phase phase) {
  const double start = phase == planner::Phase::kForward ? 0.0 : impl_->interpreter->forward_us();
  return impl_->interpreter->RunPhases(PhaseSet::Of(phase), start);
}
LayerTensors MoeLayerRunner::Tensors() const { return impl_->ops->Tensors(); }
const std::vector<OpTime>& MoeLayerRunner::timings() const { return impl_->interpreter->timings(); }
double MoeLayerRunner::forward_us() const { return impl_->interpreter->forward_us(); }
double MoeLayerRunner::total_us() const { return impl_->interpreter->total_us(); }
bool MoeLayerRunner::threaded() const { return impl_->interpreter->threaded(); }
absl::StatusOr<LayerResults> MoeLayerRunner::Results() { return impl_->ops->Results(); }
absl::StatusOr<RouteCounts> MoeLayerRunner::Routing() { return impl_->ops->Routing(); }
const RankPlace& MoeLayerRunner::place() const { return impl_->groups->place(); }

}  // namespace moeplan::executor
