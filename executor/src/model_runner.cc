// The whole-model runner: a model variant's op graph interpreted op for op
// (interpreter.h). Routed-expert ops go to their MoE layer instance
// (moe_layer.h, one per OpGraph::layers() entry); dense ops run here on
// scratch memory. Like the layer runner, it holds no schedule of its own.
#include "moeplan/executor/model_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "moe_layer.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/pipeline_program.h"

namespace moeplan::executor {

using planner::ExecGroup;
using planner::ExecKind;
using planner::OpExec;

absl::Status ValidateModelForExecutor(const planner::ModelConfig& model, int world_size) {
  const planner::ParallelLayout& p = model.parallel;
  if (p.cp != 1) {
    return absl::UnimplementedError(
        "parallel.cp: context parallelism is planned but not executable (no ring attention "
        "kernel in the executor)");
  }
  if (model.Fp8()) {
    return absl::UnimplementedError(
        "fp8_format: FP8 training is planned but not executable (the executor's kernels run "
        "f32 or bf16)");
  }
  if (int64_t{p.mp} * p.dp * std::max(1, p.pp) != world_size) {
    return absl::InvalidArgumentError(
        Cat("parallel: mp*dp*pp must equal the number of ranks the executor runs on (got mp*dp*pp=",
            int64_t{p.mp} * p.dp * std::max(1, p.pp), ", ranks=", world_size, ")"));
  }
  return absl::OkStatus();
}

planner::Layout PlainLayout(const planner::Layout& layout) {
  planner::Layout ref = layout;
  ref.sequence_parallel = false;
  ref.a2a_overlap = false;
  ref.dispatcher = planner::Dispatcher::kAllToAll;
  ref.esp = layout.tp;
  ref.ep = layout.GradientRanks();
  if (layout.pipeline == planner::PipelineSchedule::kDualPipe) {
    ref.pipeline = planner::PipelineSchedule::k1F1B;
    ref.virtual_stages = 1;
    ref.stage_layers.clear();
  }
  ref.family = planner::InferFamily(ref);
  return ref;
}

std::vector<InstanceDiff> CompareInstances(const std::vector<InstanceResults>& ref,
                                           const std::vector<InstanceResults>& got) {
  using Key = std::tuple<int, int, int>;
  auto key = [](const planner::ExecLayer& l) { return Key{l.block, l.mb, l.part}; };
  std::map<Key, const InstanceResults*> by_key;
  for (const InstanceResults& g : got) by_key[key(g.layer)] = &g;
  std::vector<InstanceDiff> out;
  for (const InstanceResults& r : ref) {
    InstanceDiff& d = out.emplace_back();
    d.layer = r.layer;
    const auto it = by_key.find(key(r.layer));
    d.missing = it == by_key.end();
    if (d.missing) continue;
    d.tensors = CompareResults(r.tensors, it->second->tensors);
    by_key.erase(it);
  }
  for (const auto& [k, g] : by_key) out.push_back({g->layer, {}, true});  // only in `got`
  return out;
}

namespace {

planner::ClusterShape ClusterOf(int world_size, int hosts) {
  return hosts > 0 && world_size % hosts == 0 ? planner::ClusterShape{hosts, world_size / hosts}
                                              : planner::ClusterShape{1, world_size};
}

}  // namespace

absl::StatusOr<planner::VariantPlan> PlanModelRun(const planner::ModelConfig& model,
                                                  planner::Variant variant, int world_size,
                                                  int hosts, const planner::CostModel* cost,
                                                  planner::ModelPlanOptions o) {
  if (model.parallel.pp != 1) {
    return absl::InvalidArgumentError(
        Cat("parallel.pp: a pipelined model runs with a layout (moeplan-exec --layout) (got pp=",
            model.parallel.pp, ")"));
  }
  MOEPLAN_RETURN_IF_ERROR(ValidateModelForExecutor(model, world_size));
  MOEPLAN_RETURN_IF_ERROR(planner::ValidateModel(model, ClusterOf(world_size, hosts)));
  planner::ModelPlanner planner(cost != nullptr ? *cost : internal::NeutralCostModel());
  o.variants = {variant};
  o.algos = {planner::AllToAllAlgo::kLinear};
  planner::ModelPlan plan;
  MOEPLAN_RETURN_IF_ERROR(planner.Plan(model, o, &plan));
  return std::move(plan.variants.at(0));
}

absl::StatusOr<planner::VariantPlan> PlanLayoutRun(const planner::ModelConfig& model,
                                                   const planner::Layout& layout,
                                                   planner::Variant variant, int world_size,
                                                   const planner::CostModel* cost,
                                                   planner::ModelConfig* run_model,
                                                   planner::ModelPlanOptions o) {
  const planner::Layout l = planner::ResolveLayout(layout);
  if (l.cp != 1) {
    return absl::UnimplementedError(
        "layout.cp: context parallelism is planned but not executable (no ring attention kernel "
        "in the executor)");
  }
  if (l.Gpus() != world_size) {
    return absl::InvalidArgumentError(
        Cat("layout: dp*tp*pp must equal the ranks (", world_size, ") (got ", l.Gpus(), ")"));
  }
  if (l.family == planner::Family::kPpMoe) {
    return absl::InvalidArgumentError(
        "layout.family: the executor runs parm and dpmoe layouts (an expert grid of ep*esp ranks "
        "over the stage, once or replicated); ppmoe's local dispatch is planned but not "
        "executable yet");
  }
  if (l.dispatcher == planner::Dispatcher::kAllGather) {
    return absl::UnimplementedError(
        "layout.dispatcher: the allgather dispatcher is planned but not executable yet");
  }
  if (l.recompute) {
    return absl::InvalidArgumentError(
        "layout.recompute: runs with full activation recomputation are not executable yet");
  }
  if (l.recompute_modules != 0) {
    return absl::InvalidArgumentError(
        "layout.recompute_modules: runs with selective recomputation are not executable yet");
  }
  const planner::CostModel& c = cost != nullptr ? *cost : internal::NeutralCostModel();
  planner::LayoutPlanner planner(c);
  o.variants = {variant};
  o.algos = {planner::AllToAllAlgo::kLinear};
  planner::VariantPlan plan;
  MOEPLAN_RETURN_IF_ERROR(planner.Program(model, l, o, &plan));
  *run_model =
      planner::ModelForLayout(model, l, model.GlobalBatch() / (int64_t{l.dp} * l.microbatches));
  // Explicit: the run model's micro_batch_size * dp is one micro-batch step, not the batch.
  run_model->global_batch_size = model.GlobalBatch();
  MOEPLAN_RETURN_IF_ERROR(ValidateModelForExecutor(*run_model, world_size));
  return plan;
}

namespace {

// The dense side of a model: scratch memory for the compute lane's kernels
// and, per group, for its collectives; MoE ops go to their instance.
class ModelOps final : public OpHandler {
 public:
  ModelOps(const RankGroups* groups, Device* dev, Kernels* k, DType t)
      : groups_(groups), dev_(dev), k_(k), dt_(t), es_(SizeOf(t)) {}

  Communicator* CommOf(const OpExec& x) const override { return groups_->Of(x.group); }

  absl::Status Run(const planner::Op& op, const OpExec& x, Request* comm) override {
    if (x.layer > 0) return layers_[static_cast<size_t>(x.layer - 1)]->Run(op, x, comm);
    if (x.kind == ExecKind::kNop) return absl::OkStatus();
    if (x.kind == ExecKind::kDenseGemm) {
      const int64_t reps = int64_t{std::max(1, x.groups)} * std::max(1, x.parts);
      for (int64_t i = 0; i < reps; ++i) {
        MOEPLAN_RETURN_IF_ERROR(k_->Gemm(false, false, x.tokens, x.rows, x.count, 1.0f, a_.data(),
                                         x.count, b_.data(), x.rows, 0.0f, c_.data(), x.rows, dt_));
      }
      return absl::OkStatus();
    }
    if (x.kind == ExecKind::kDenseMemory) {
      return dev_->Copy(c_.data(), a_.data(), static_cast<size_t>(x.count / 2) * es_, kComputeLane);
    }
    if (comm == nullptr) {
      return absl::InternalError(Cat("plan: op ", op.Name(), " (", planner::ExecKindName(x.kind),
                                     ") has no dense semantics"));
    }
    Communicator* c = groups_->Of(x.group);
    const Scratch& s = comm_[static_cast<size_t>(x.group)];
    const size_t n = static_cast<size_t>(x.count);
    absl::StatusOr<Request> started;
    if (x.kind == ExecKind::kSendRecv) {
      // The pipeline groups hold one rank per stage, ranked by stage.
      started = op.device == groups_->stage()
                    ? c->StartSendRecv(s.send.data(), n, x.parts, nullptr, 0, -1, dt_)
                    : c->StartSendRecv(nullptr, 0, -1, s.recv.data(), n, op.device, dt_);
    } else if (x.kind == ExecKind::kAllReduce) {
      started = c->StartAllReduce(s.send.data(), s.recv.data(), n, dt_);
    } else if (x.kind == ExecKind::kAllGather) {
      started = c->StartAllGather(s.send.data(), s.recv.data(), n, dt_);
    } else if (x.kind == ExecKind::kReduceScatter) {
      started = c->StartReduceScatter(s.send.data(), s.recv.data(), n, dt_);
    } else {
      return absl::InvalidArgumentError(Cat("plan: op ", op.Name(), ": a dense ",
                                            planner::ExecKindName(x.kind), " is not executable"));
    }
    MOEPLAN_ASSIGN_OR_RETURN(*comm, std::move(started));
    return c->Wait(comm);
  }

  // Sizes the scratch memory from the dense ops this rank runs (nothing
  // allocated yet: ScratchBytes() is then what Allocate will take).
  void Size(const planner::OpGraph& plan) {
    int64_t a = 1, b = 1, c = 1;
    std::vector<std::pair<int64_t, int64_t>> comm(planner::kNumExecGroups, {1, 1});
    for (planner::OpId id = 0; id < plan.size(); ++id) {
      const OpExec& x = plan.exec(id);
      if (x.layer > 0 || !planner::RunsOnStage(plan, id, groups_->stage())) continue;
      if (x.kind == ExecKind::kDenseGemm) {
        a = std::max(a, x.tokens * x.count);
        b = std::max(b, x.count * x.rows);
        c = std::max(c, x.tokens * x.rows);
      } else if (x.kind == ExecKind::kDenseMemory) {
        a = std::max(a, x.count / 2);
        c = std::max(c, x.count / 2);
      } else if (planner::IsCollective(x.kind)) {
        const Communicator* g = groups_->Of(x.group);
        const int64_t r = g == nullptr ? 1 : g->size();
        auto& [send, recv] = comm[static_cast<size_t>(x.group)];
        const bool gathers = x.kind == ExecKind::kAllGather;
        const bool scatters = x.kind == ExecKind::kReduceScatter;
        send = std::max(send, scatters ? x.count * r : x.count);
        recv = std::max(recv, gathers ? x.count * r : x.count);
      }
    }
    elems_ = {a, b, c};
    for (size_t g = 0; g < comm.size(); ++g) {
      if (groups_->Of(static_cast<ExecGroup>(g)) == nullptr) continue;
      elems_.push_back(comm[g].first);
      elems_.push_back(comm[g].second);
    }
  }

  // What Allocate takes: every scratch buffer Size counted.
  size_t ScratchBytes() const {
    size_t n = 0;
    for (int64_t e : elems_) n += static_cast<size_t>(e) * es_;
    return n;
  }

  // Allocates the scratch Size counted and fills its inputs.
  absl::Status Allocate(uint64_t seed) {
    // Inputs hold seeded values: GEMMs on finite, non-denormal numbers (what
    // training sees); outputs (tensor 0) are only written. Staged on the host
    // a slice at a time, so filling adds little to the memory the limit counted.
    constexpr size_t kSlice = size_t{1} << 20;  // elements
    auto make = [&](DeviceBuffer* buf, int64_t elems, uint32_t tensor) -> absl::Status {
      const size_t n = static_cast<size_t>(elems);
      MOEPLAN_ASSIGN_OR_RETURN(*buf, DeviceBuffer::Make(dev_, n * es_));
      if (tensor == 0) return absl::OkStatus();
      std::vector<float> host;
      std::vector<uint16_t> half;
      for (size_t at = 0; at < n; at += kSlice) {
        host.resize(std::min(kSlice, n - at));
        for (size_t i = 0; i < host.size(); ++i) host[i] = SeededValue(seed, tensor, at + i, 0.1f);
        MOEPLAN_RETURN_IF_ERROR(UploadAs(*dev_, buf->as<char>() + at * es_, host, dt_, &half));
      }
      return absl::OkStatus();
    };
    constexpr uint32_t kScratch = 0x5c000;
    MOEPLAN_RETURN_IF_ERROR(make(&a_, elems_[0], kScratch + 1));
    MOEPLAN_RETURN_IF_ERROR(make(&b_, elems_[1], kScratch + 2));
    MOEPLAN_RETURN_IF_ERROR(make(&c_, elems_[2], 0));
    size_t next = 3;
    for (size_t g = 0; g < comm_.size(); ++g) {
      if (groups_->Of(static_cast<ExecGroup>(g)) == nullptr) continue;
      MOEPLAN_RETURN_IF_ERROR(make(&comm_[g].send, elems_[next++], kScratch + 10 + g));
      MOEPLAN_RETURN_IF_ERROR(make(&comm_[g].recv, elems_[next++], 0));
    }
    return dev_->Synchronize();
  }

  std::vector<std::unique_ptr<internal::MoeLayerOps>> layers_;

 private:
  struct Scratch {
    DeviceBuffer send, recv;
  };
  const RankGroups* groups_;
  Device* dev_;
  Kernels* k_;
  DType dt_;
  size_t es_;
  std::vector<int64_t> elems_;  // Size's counts: a, b, c, then send, recv per group
  DeviceBuffer a_, b_, c_;
  std::array<Scratch, planner::kNumExecGroups> comm_;
};

// One MoE layer instance of a model's plan (OpGraph::layers(), instance i + 1):
// its layer config and options, and whether this rank's stage runs it.
struct Instance {
  bool mine = false;
  int block = 0;
  planner::LayerConfig layer;
  RunOptions options;
};

std::vector<Instance> InstancesOf(const planner::ModelConfig& model, const planner::OpGraph& plan,
                                  const RunOptions& options, int stage) {
  const std::span<const planner::ExecLayer> layers = plan.layers();
  std::vector<Instance> out(layers.size());
  for (planner::OpId id = 0; id < plan.size(); ++id) {
    const int16_t layer = plan.exec(id).layer;
    if (layer > 0 && static_cast<size_t>(layer) <= layers.size() &&
        planner::RunsOnStage(plan, id, stage)) {
      out[static_cast<size_t>(layer) - 1].mine = true;
    }
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    const planner::ExecLayer& l = layers[i];
    Instance& in = out[i];
    in.block = l.block;
    in.layer = model.MoeLayer();
    in.layer.batch_size = 1;
    in.layer.seq_len = l.tokens;
    in.layer.bytes_per_element = static_cast<int>(SizeOf(options.dtype));
    in.options = options;
    // Each block and micro-batch its own data (the same in every layout of
    // the model, so GlobalResults compare instance by instance).
    in.options.seed = options.seed + (static_cast<uint64_t>(l.block) + 1) * 0x9E3779B97F4A7C15ull +
                      (static_cast<uint64_t>(l.mb + 1) << 24);
    in.options.plan_name = Cat(model.name, "'s MoE layers up to block ", l.block,
                               l.part >= 0 ? Cat(" piece ", l.part) : std::string(),
                               l.mb >= 0 ? Cat(" of micro-batch ", l.mb) : std::string());
  }
  return out;
}

// Refuses a model whose buffers on this rank add up to more than
// options.memory_limit_bytes, before any is allocated; on success each
// instance's limit is what the scratch and the instances before it leave.
absl::Status CheckMemory(const std::string& model_name, const planner::OpGraph& plan,
                         std::vector<Instance>& instances, size_t scratch,
                         const RunOptions& options, const RankGroups* groups) {
  if (options.memory_limit_bytes == 0) return absl::OkStatus();
  size_t moe = 0;
  int count = 0;
  std::vector<size_t> planned(instances.size(), 0);
  for (size_t i = 0; i < instances.size(); ++i) {
    const Instance& in = instances[i];
    if (!in.mine) continue;
    MOEPLAN_ASSIGN_OR_RETURN(
        planned[i], internal::MoeLayerOps::PlannedBytes(in.layer, plan, static_cast<int>(i + 1),
                                                        in.block, in.options, groups));
    moe += planned[i];
    ++count;
  }
  const size_t limit = options.memory_limit_bytes;
  if (scratch + moe > limit) {
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    return absl::ResourceExhaustedError(
        Cat("memory: ", model_name, " needs ", scratch + moe, " bytes per rank (",
            fmt::format("{:.3f}", (scratch + moe) / kGiB), " GiB: ", scratch,
            " of dense scratch and communication buffers, ", moe, " in ", count,
            " MoE layer instance(s)), over the ", limit, " bytes (",
            fmt::format("{:.3f}", limit / kGiB), " GiB) it may use (", options.memory_limit_source,
            "); nothing was allocated: lower micro_batch_size, seq_length, hidden_size, "
            "ffn_hidden_size or vocab_size, or use more ranks"));
  }
  size_t used = scratch;
  for (size_t i = 0; i < instances.size(); ++i) {
    if (!instances[i].mine) continue;
    instances[i].options.memory_limit_bytes = limit - used;  // > 0: the sum fits
    used += planned[i];
  }
  return absl::OkStatus();
}
}  // namespace

class ModelRunner::Impl {
 public:
  std::unique_ptr<RankGroups> groups;
  std::unique_ptr<ModelOps> ops;
  std::unique_ptr<PlanInterpreter> interpreter;
  std::vector<planner::ExecLayer> layers;  // the plan's instances
  std::vector<planner::LayerConfig> configs;
  int mp_groups = 1;  // MP groups per stage
  Device* device = nullptr;
  Communicator* world = nullptr;
};

ModelRunner::ModelRunner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ModelRunner::~ModelRunner() = default;

absl::StatusOr<std::unique_ptr<ModelRunner>> ModelRunner::Create(const planner::ModelConfig& model,
                                                                 const planner::OpGraph& plan,
                                                                 const RunOptions& options,
                                                                 Device* device, Kernels* kernels,
                                                                 Communicator* world) {
  MOEPLAN_RETURN_IF_ERROR(ValidateModelForExecutor(model, world->size()));
  MOEPLAN_RETURN_IF_ERROR(CheckExecutable(plan));
  const int stages = std::max(1, model.parallel.pp);
  for (planner::OpId id = 0; id < plan.size(); ++id) {
    const planner::Op& op = plan.op(id);
    const OpExec& x = plan.exec(id);
    const bool bad_peer =
        x.kind == ExecKind::kSendRecv && (x.parts < 0 || x.parts >= stages || x.parts == op.device);
    if (op.device < 0 || op.device >= stages || bad_peer) {
      return absl::InvalidArgumentError(
          Cat("plan: op ", op.Name(), " runs on pipeline stage ", op.device,
              bad_peer ? Cat(" towards stage ", x.parts) : std::string(), ", but the model has ",
              stages, " (parallel.pp)"));
    }
  }
  if (!kernels->Supports(options.dtype)) {
    return absl::InvalidArgumentError(
        Cat("dtype: the ", kernels->name(), " kernels do not support ", DTypeName(options.dtype)));
  }
  // Every rank has passed validation: the first collective.
  auto impl = std::make_unique<Impl>();
  const planner::LayerConfig moe = model.MoeLayer();
  MOEPLAN_ASSIGN_OR_RETURN(impl->groups, RankGroups::Create(world, moe.parallel, stages));
  MOEPLAN_RETURN_IF_ERROR(impl->groups->AddDataParallel(
      model.parallel.mp, std::max(1, model.parallel.ep * model.parallel.esp)));
  impl->ops = std::make_unique<ModelOps>(impl->groups.get(), device, kernels, options.dtype);
  impl->ops->Size(plan);
  std::vector<Instance> instances = InstancesOf(model, plan, options, impl->groups->stage());
  impl->layers.assign(plan.layers().begin(), plan.layers().end());
  for (const Instance& in : instances) impl->configs.push_back(in.layer);
  impl->mp_groups = world->size() / stages / std::max(1, model.parallel.mp);
  impl->device = device;
  impl->world = world;
  // Every buffer is added up before the first is allocated (docs/executor.md
  // "Whole models"): dense scratch, communication buffers, each MoE instance.
  MOEPLAN_RETURN_IF_ERROR(CheckMemory(model.name, plan, instances, impl->ops->ScratchBytes(),
                                      options, impl->groups.get()));
  MOEPLAN_RETURN_IF_ERROR(impl->ops->Allocate(options.seed));
  for (size_t i = 0; i < instances.size(); ++i) {
    if (!instances[i].mine) {
      impl->ops->layers_.push_back(nullptr);
      continue;
    }
    const Instance& in = instances[i];
    MOEPLAN_ASSIGN_OR_RETURN(
        std::unique_ptr<internal::MoeLayerOps> ops,
        internal::MoeLayerOps::Create(in.layer, plan, static_cast<int>(i + 1), in.block, in.options,
                                      impl->groups.get(), device, kernels));
    impl->ops->layers_.push_back(std::move(ops));
  }
  MOEPLAN_ASSIGN_OR_RETURN(impl->interpreter,
                           PlanInterpreter::Create(plan, impl->ops.get(), device, world,
                                                   options.lanes, impl->groups->stage()));
  return std::unique_ptr<ModelRunner>(new ModelRunner(std::move(impl)));
}

absl::Status ModelRunner::RunIteration() { return impl_->interpreter->RunIteration(); }

absl::StatusOr<std::vector<InstanceResults>> ModelRunner::GlobalResults() {
  Impl& m = *impl_;
  std::vector<InstanceResults> out(m.layers.size());
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const planner::LayerConfig& l = m.configs[i];
    const int64_t s = l.batch_size * l.seq_len, f = l.gated_linear_unit ? 2 : 1;
    LayerResults& g = out[i].tensors;
    out[i].layer = m.layers[i];
    g.y.assign(static_cast<size_t>(m.mp_groups * s * l.model_dim), 0.0f);
    g.dx.assign(g.y.size(), 0.0f);
    g.dgate.assign(static_cast<size_t>(l.model_dim * l.num_experts), 0.0f);
    g.dw1.assign(static_cast<size_t>(l.num_experts * l.model_dim * f * l.hidden_dim), 0.0f);
    g.dw2.assign(static_cast<size_t>(l.num_experts * l.hidden_dim * l.model_dim), 0.0f);
    if (m.ops->layers_[i] != nullptr) MOEPLAN_RETURN_IF_ERROR(m.ops->layers_[i]->AddGlobal(&g));
    // Every rank's share summed over the world (other stages add zeros).
    for (std::vector<float>* t : {&g.y, &g.dx, &g.dgate, &g.dw1, &g.dw2}) {
      const size_t bytes = t->size() * sizeof(float);
      MOEPLAN_ASSIGN_OR_RETURN(DeviceBuffer send, DeviceBuffer::Make(m.device, bytes));
      MOEPLAN_ASSIGN_OR_RETURN(DeviceBuffer recv, DeviceBuffer::Make(m.device, bytes));
      MOEPLAN_RETURN_IF_ERROR(m.device->Upload(send.data(), t->data(), bytes));
      MOEPLAN_RETURN_IF_ERROR(m.world->AllReduce(send.data(), recv.data(), t->size(), DType::kF32));
      MOEPLAN_RETURN_IF_ERROR(m.device->Download(t->data(), recv.data(), bytes));
    }
  }
  return out;
}
const std::vector<OpTime>& ModelRunner::timings() const { return impl_->interpreter->timings(); }
double ModelRunner::forward_us() const { return impl_->interpreter->forward_us(); }
double ModelRunner::total_us() const { return impl_->interpreter->total_us(); }
bool ModelRunner::threaded() const { return impl_->interpreter->threaded(); }
int ModelRunner::layer_instances() const {
  return static_cast<int>(std::count_if(impl_->ops->layers_.begin(), impl_->ops->layers_.end(),
                                        [](const auto& l) { return l != nullptr; }));
}

}  // namespace moeplan::executor
