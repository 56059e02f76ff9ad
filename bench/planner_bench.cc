// Planner speed (docs/conventions.md: benchmarks, not timed tests).
//   BM_PlanLayer/3 schedules fwd+bwd: the GPT-2-style example layer on the default
//     profile, all three schedules built, simulated and ranked (target <= 50 us).
//   BM_SweepGrid: the 1,296-config example grid, single thread (target <= 200 ms).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <iostream>

#include "moeplan/calibration/profiles.h"
#include "moeplan/client/sweep.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/planner.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"

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
  const std::vector<v1::LayerConfig> configs = OrDie(proto::ExpandGrid(grid));
  for (auto _ : state) {
    auto result = client::RunSweep(configs, Cost(), {});
    if (!result.ok()) std::abort();
    benchmark::DoNotOptimize(result->rows.data());
  }
  state.counters["configs"] = static_cast<double>(configs.size());
}
BENCHMARK(BM_SweepGrid)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
