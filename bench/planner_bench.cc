// Planner speed (docs/conventions.md: benchmarks, not timed tests).
//   BM_PlanLayer/3 schedules fwd+bwd: the GPT-2-style example layer on the default
//     profile, all three schedules built, simulated and ranked (target <= 50 us).
//   BM_SweepGrid: the 1,296-config example grid, single thread (target <= 200 ms).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "moeplan/calibration/profiles.h"
#include "moeplan/client/sweep.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/layout_planner.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/planner/planner.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/hf_config.h"
#include "moeplan/proto/json.h"
#include "moeplan/requests/grid.h"

namespace {

using namespace moeplan;

template <class T>
T OrDie(absl::StatusOr<T> v) {
  if (!v.ok()) {
    std::cerr << v.status() << "\n";
    std::abort();
  }
  return *std::move(v);
}

const planner::CostModel& Cost() {
  static const planner::CostModel* cost = new planner::CostModel(
      OrDie(planner::CostModel::Create(OrDie(calibration::LoadProfile("a100-8x8")).profile)));
  return *cost;
}

planner::LayerConfig ExampleLayer(const char* file) {
  v1::LayerConfig msg;
  if (!proto::ReadJsonFile(std::string(MOEPLAN_SOURCE_DIR "/examples/") + file, &msg).ok()) {
    std::abort();
  }
  return OrDie(proto::LayerFromProto(msg));
}

// Steady state: one planner reused (as the sweep and the server do).
void BM_PlanLayer(benchmark::State& state, const char* file) {
  const planner::LayerConfig layer = ExampleLayer(file);
  planner::LayerPlanner planner(Cost());
  planner::LayerPlan plan;
  size_t ops = 0;
  for (auto _ : state) {
    if (!planner.Plan(layer, {}, &plan).ok()) std::abort();
    benchmark::DoNotOptimize(plan.decision.best);
  }
  for (const auto& c : plan.candidates) ops += c.graph().size();
  state.counters["ops"] = static_cast<double>(ops);
}
BENCHMARK_CAPTURE(BM_PlanLayer, gpt2_3_schedules_fwd_bwd, "gpt2-moe-layer.json")
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_PlanLayer, bert_3_schedules_fwd_bwd, "bert-moe-layer.json")
    ->Unit(benchmark::kMicrosecond);

// One-shot: a fresh planner and plan per call (the CLI's path).
void BM_PlanLayerOneShot(benchmark::State& state) {
  const planner::LayerConfig layer = ExampleLayer("gpt2-moe-layer.json");
  for (auto _ : state) {
    auto plan = planner::PlanLayer(layer, Cost());
    if (!plan.ok()) std::abort();
    benchmark::DoNotOptimize(plan->decision.best);
  }
}
BENCHMARK(BM_PlanLayerOneShot)->Unit(benchmark::kMicrosecond);

void BM_SweepGrid(benchmark::State& state) {
  v1::LayerGrid grid;
  if (!proto::ReadJsonFile(MOEPLAN_SOURCE_DIR "/examples/parm-grid.json", &grid).ok()) std::abort();
  const std::vector<v1::LayerConfig> configs = OrDie(requests::ExpandGrid(grid));
  for (auto _ : state) {
    auto result = client::RunSweep(configs, Cost(), {});
    if (!result.ok()) std::abort();
    benchmark::DoNotOptimize(result->rows.data());
  }
  state.counters["configs"] = static_cast<double>(configs.size());
}
BENCHMARK(BM_SweepGrid)->Unit(benchmark::kMillisecond);

}  // namespace

// Whole models (docs/model.md): every variant (none, tutel at r = 1, 2, 4, 8,
// dw, partition with its DP, lancet) with every (schedule, AlltoAll) pair the
// layout allows, on 64 A100s. One planner reused; the partition DP's range
// cache is rebuilt per plan.
// Plans `model` whole with every variant per iteration on one reused planner.
void RunPlan(benchmark::State& state, const planner::ModelConfig& model,
             const planner::CostModel& cost) {
  planner::ModelPlanner planner(cost);
  planner::ModelPlan plan;
  for (auto _ : state) {
    if (!planner.Plan(model, {}, &plan).ok()) std::abort();
    benchmark::DoNotOptimize(plan.best);
  }
  size_t ops = 0;
  for (const auto& v : plan.variants) ops += static_cast<size_t>(v.graph.size());
  state.counters["ops_kept"] = static_cast<double>(ops);
}

void BM_PlanModel(benchmark::State& state, const char* file) {
  v1::ModelConfig msg;
  if (!proto::ReadJsonFile(std::string(MOEPLAN_SOURCE_DIR "/examples/models/") + file, &msg).ok()) {
    std::abort();
  }
  RunPlan(state, OrDie(proto::ModelFromProto(msg)), Cost());
}
BENCHMARK_CAPTURE(BM_PlanModel, gpt2_l_moe_all_variants_64_gpus, "gpt2-l-moe.a100.json")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_PlanModel, gpt2_s_moe_all_variants_64_gpus, "gpt2-s-moe.a100.json")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_PlanModel, fine_grained_mp2_all_variants_64_gpus, "fine-grained-moe.json")
    ->Unit(benchmark::kMillisecond);

// A Hugging Face config.json (examples/hf/) as a ModelConfig of the given
// parallel degrees.
planner::ModelConfig HfModel(const char* dir, int ep, int dp, int64_t global_batch) {
  const std::string text = OrDie(
      proto::ReadFile(std::string(MOEPLAN_SOURCE_DIR "/examples/hf/") + dir + "/config.json"));
  proto::HfTraining training;
  training.global_batch_size = static_cast<int>(global_batch);
  proto::HfImport imported = OrDie(proto::ImportHfConfig(text, training, dir));
  v1::ParallelLayout* p = imported.model.mutable_parallel();
  p->set_mp(1);
  p->set_ep(ep);
  p->set_esp(1);
  p->set_dp(dp);
  p->set_pp(1);
  return OrDie(proto::ModelFromProto(imported.model));
}

// DeepSeek-V3 whole (61 blocks, 58 MoE layers of 256 experts, MLA, an MTP
// depth), every variant, on 64 H100s at EP 64.
void BM_PlanDeepSeekV3(benchmark::State& state) {
  RunPlan(state, HfModel("deepseek-v3", 64, 64, 0),
          OrDie(planner::CostModel::Create(OrDie(calibration::LoadProfile("h100-8x8")).profile)));
}
BENCHMARK(BM_PlanDeepSeekV3)->Unit(benchmark::kMillisecond);

// The layout search (docs/layouts.md) with every variant, family, ZeRO stage
// and pipeline schedule: GPT-3 Medium + 64 experts on 32 V100s, and a
// Qwen-MoE-like model (128 experts, top-8) on 1,024 A100s. A fresh planner per
// iteration: nothing is cached between searches.
// One search of `model` on `gpus` GPUs per iteration, its counts reported.
void RunSearch(benchmark::State& state, const planner::ModelConfig& model, const char* profile,
               int gpus, planner::SearchOptions options = {}) {
  const planner::CostModel cost =
      OrDie(planner::CostModel::Create(OrDie(calibration::LoadProfile(profile)).profile));
  options.gpus = gpus;
  options.top = 10;
  planner::LayoutSearchResult r;
  for (auto _ : state) {
    planner::LayoutPlanner lp(cost);
    if (!lp.Search(model, options, {}, {}, &r).ok()) std::abort();
    benchmark::DoNotOptimize(r.candidates.data());
  }
  state.counters["enumerated"] = static_cast<double>(r.stats.enumerated);
  state.counters["pruned_memory"] = static_cast<double>(r.stats.pruned_memory);
  state.counters["pruned_bound"] = static_cast<double>(r.stats.pruned_bound);
  state.counters["simulated"] = static_cast<double>(r.stats.simulated);
  state.counters["stage_plans"] = static_cast<double>(r.stats.stage_plans);
}

void BM_SearchLayouts(benchmark::State& state, const char* file, const char* profile, int gpus) {
  v1::ModelConfig msg;
  if (!proto::ReadJsonFile(std::string(MOEPLAN_SOURCE_DIR "/examples/models/") + file, &msg).ok()) {
    std::abort();
  }
  RunSearch(state, OrDie(proto::ModelFromProto(msg)), profile, gpus);
}
BENCHMARK_CAPTURE(BM_SearchLayouts, gpt3_medium_moe_32_v100, "gpt3-medium-moe.json", "v100-8x8", 32)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);
BENCHMARK_CAPTURE(BM_SearchLayouts, qwen_moe_1024_a100, "qwen-moe-like.json", "a100-8x8", 1024)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);

// Today's models searched on 1,024 H100s (examples/hf/), global batch 8,192.
void BM_SearchHf(benchmark::State& state, const char* dir) {
  RunSearch(state, HfModel(dir, 1, 1, 8192), "h100-8x8", 1024);
}

// DeepSeek-V3 on 1,024 or 8,192 H100s, global batch 8,192: the default axes,
// or every opt-in axis of issue 37 too (sequence parallelism both ways,
// folded grids of ETP 1, CP 1 and 2, the A2A overlap both ways, DualPipe
// beside the three schedules).
void BM_SearchDeepSeekV3(benchmark::State& state, int gpus, bool every_axis) {
  planner::SearchOptions o;
  if (every_axis) {
    o.sequence_parallel = {false, true};
    o.expert_tensor_parallel = {1};
    o.context_parallel = {1, 2};
    o.a2a_overlap = {false, true};
    o.pipelines = {planner::PipelineSchedule::kGpipe, planner::PipelineSchedule::k1F1B,
                   planner::PipelineSchedule::kInterleaved, planner::PipelineSchedule::kDualPipe};
  }
  RunSearch(state, HfModel("deepseek-v3", 1, 1, 8192), "h100-8x8", gpus, o);
}
BENCHMARK_CAPTURE(BM_SearchDeepSeekV3, h100_8192, 8192, false)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);
BENCHMARK_CAPTURE(BM_SearchDeepSeekV3, h100_1024_every_axis, 1024, true)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);
BENCHMARK_CAPTURE(BM_SearchDeepSeekV3, h100_8192_every_axis, 8192, true)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);
// DeepSeek-V3 trained as published (FP8) on 1,024 H100s: the default axes with
// the FLOP-balanced pipeline split and every dispatcher tried too.
void BM_SearchDeepSeekV3Fp8Splits(benchmark::State& state) {
  planner::SearchOptions o;
  o.balanced_pipeline = {false, true};
  o.dispatchers = {planner::Dispatcher::kAllToAll, planner::Dispatcher::kDeepEp,
                   planner::Dispatcher::kAllGather};
  planner::ModelConfig m = HfModel("deepseek-v3", 1, 1, 8192);
  m.fp8_format = planner::Fp8Format::kHybrid;
  RunSearch(state, m, "h100-8x8", 1024, o);
}
BENCHMARK(BM_SearchDeepSeekV3Fp8Splits)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK_CAPTURE(BM_SearchHf, qwen3_235b_1024_h100, "qwen3-235b-a22b")
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);
BENCHMARK_CAPTURE(BM_SearchHf, deepseek_v3_1024_h100, "deepseek-v3")
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);

// A pipelined layout's program (docs/layouts.md "Programs"): every chunk
// planned with one variant, then copied per micro-batch with its transfers
// and simulated. GPT-3 Medium + 64 experts on 32 V100s, dp 8 x pp 4, 1F1B
// over `m` micro-batches. A fresh planner per iteration.
void BM_PipelineProgram(benchmark::State& state) {
  v1::ModelConfig msg;
  if (!proto::ReadJsonFile(MOEPLAN_SOURCE_DIR "/examples/models/gpt3-medium-moe.json", &msg).ok()) {
    std::abort();
  }
  const planner::ModelConfig model = OrDie(proto::ModelFromProto(msg));
  const planner::CostModel cost =
      OrDie(planner::CostModel::Create(OrDie(calibration::LoadProfile("v100-8x8")).profile));
  planner::Layout l;
  l.dp = 8;
  l.pp = 4;
  l.ep = 8;
  l.microbatches = static_cast<int>(state.range(0));
  planner::ModelPlanOptions o;
  o.variants = {planner::Variant::kLancet};
  o.algos = {planner::AllToAllAlgo::kLinear};
  planner::VariantPlan plan;
  for (auto _ : state) {
    planner::LayoutPlanner lp(cost);
    if (absl::Status st = lp.Program(model, l, o, &plan); !st.ok()) {
      std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
      std::abort();
    }
    benchmark::DoNotOptimize(plan.sim.makespan_us);
  }
  state.counters["ops"] = static_cast<double>(plan.graph.size());
}
BENCHMARK(BM_PipelineProgram)->Arg(4)->Arg(16)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
