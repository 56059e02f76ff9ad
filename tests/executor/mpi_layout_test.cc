// Layouts the planner builds from Megatron-Core's parallelism, run by the
// executor on 4 and 8 ranks (executor_mpi_test): sequence parallelism, folded
// expert grids (EP spanning TP and DP ranks, expert replicas), the A2A
// overlap of micro-batches and DualPipe's bidirectional pipeline each compute
// what the plain layout computes (docs/executor.md "Layouts checked"): every
// MoE layer instance's output, input gradient, gate gradient and expert
// weight gradients, assembled over all ranks, against the plain layout's.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "../planner/test_profile.h"
#include "moeplan/executor/model_runner.h"
#include "moeplan/planner/layout.h"
#include "moeplan/planner/pipeline.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"
#include "mpi_world.h"

namespace moeplan::executor {
namespace {

using mpi_test::g_backend;
using mpi_test::WorldSize;
using planner::Family;
using planner::PipelineSchedule;

// tests/executor/models/tiny-check.json, the model moeplan-exec --check's
// CLI test runs: four MoE blocks (every block), 8 experts top-2, capacity
// factor E/k, so no token is dropped and S1 (which a folded grid runs) keeps
// what the default keeps.
planner::ModelConfig CheckModel() {
  v1::ModelConfig msg;
  absl::Status st =
      proto::ReadJsonFile(MOEPLAN_SOURCE_DIR "/tests/executor/models/tiny-check.json", &msg);
  absl::StatusOr<planner::ModelConfig> m =
      st.ok() ? proto::ModelFromProto(msg) : absl::StatusOr<planner::ModelConfig>(st);
  if (!m.ok()) {  // the same file on every rank: all stop here
    ADD_FAILURE() << m.status();
    std::abort();
  }
  return *m;
}

struct Case {
  const char* name;
  planner::Layout layout;
};

planner::Layout L(int dp, int tp, int pp, int ep, int esp, int microbatches) {
  planner::Layout l;
  l.dp = dp;
  l.tp = tp;
  l.pp = pp;
  l.ep = ep;
  l.esp = esp;
  l.microbatches = microbatches;
  return l;
}

planner::Layout With(planner::Layout l, bool sp, bool overlap,
                     PipelineSchedule pipeline = PipelineSchedule::k1F1B, int v = 1) {
  l.sequence_parallel = sp;
  l.a2a_overlap = overlap;
  l.pipeline = pipeline;
  l.virtual_stages = v;
  l.family = planner::InferFamily(l);
  return l;
}

// The layouts of the world size: each is Megatron-Core parallelism the
// plain layout (tied expert grid, no SP, no overlap, 1F1B) does not use.
std::vector<Case> Cases() {
  constexpr auto k1F1B = PipelineSchedule::k1F1B;
  constexpr auto kInterleaved = PipelineSchedule::kInterleaved;
  constexpr auto kDual = PipelineSchedule::kDualPipe;
  if (WorldSize() == 4) {
    return {
        {"sp", With(L(2, 2, 1, 2, 2, 2), true, false)},
        {"ep spanning tp and dp, sp", With(L(2, 2, 1, 4, 1, 2), true, false)},
        {"expert replicas (dpmoe)", With(L(4, 1, 1, 2, 1, 2), false, false)},
        {"a2a overlap, one stage", With(L(2, 2, 1, 2, 2, 2), false, true)},
        {"a2a overlap, interleaved", With(L(2, 1, 2, 2, 1, 4), false, true, kInterleaved, 2)},
        {"dualpipe", With(L(2, 1, 2, 2, 1, 4), false, false, kDual)},
    };
  }
  return {
      {"folded grid with replicas, sp", With(L(4, 2, 1, 4, 1, 2), true, false)},
      {"sp, a2a overlap", With(L(4, 2, 1, 4, 2, 2), true, true, k1F1B)},
      {"dualpipe, sp, ep spanning tp and dp", With(L(2, 2, 2, 4, 1, 4), true, false, kDual)},
      {"expert replicas, a2a overlap, interleaved",
       With(L(4, 1, 2, 2, 1, 4), false, true, kInterleaved, 2)},
  };
}

// The layout's program run twice, its instances assembled over the world.
std::vector<InstanceResults> RunLayout(const planner::ModelConfig& model,
                                       const planner::Layout& l) {
  planner::ModelConfig run;
  absl::StatusOr<planner::VariantPlan> plan = PlanLayoutRun(
      model, l, planner::Variant::kNone, WorldSize(), &planner::testing::RoundNumberModel(), &run);
  if (!plan.ok()) {  // the same on every rank: all stop here
    ADD_FAILURE() << plan.status();
    return {};
  }
  absl::StatusOr<std::unique_ptr<ModelRunner>> r =
      ModelRunner::Create(run, plan->graph, RunOptions{}, g_backend->device.get(),
                          g_backend->kernels.get(), g_backend->world.get());
  if (!r.ok()) {
    ADD_FAILURE() << r.status();
    std::abort();  // the other ranks are stuck in Create's collectives
  }
  for (int it = 0; it < 2; ++it) {
    if (const absl::Status st = (*r)->RunIteration(); !st.ok()) {
      ADD_FAILURE() << st;
      std::abort();
    }
  }
  absl::StatusOr<std::vector<InstanceResults>> got = (*r)->GlobalResults();
  if (!got.ok()) {
    ADD_FAILURE() << got.status();
    std::abort();
  }
  return *std::move(got);
}

TEST(MpiLayouts, ComputeWhatThePlainLayoutComputes) {
  for (const Case& c : Cases()) {
    const planner::Layout plain = PlainLayout(c.layout);
    SCOPED_TRACE(c.name);
    ASSERT_EQ(plain.family, Family::kParm);
    ASSERT_FALSE(plain.sequence_parallel || plain.a2a_overlap);
    ASSERT_EQ(plain.esp, c.layout.tp);
    planner::ModelConfig m = CheckModel();
    m.global_batch_size = int64_t{c.layout.dp} * c.layout.microbatches;
    const std::vector<InstanceResults> ref = RunLayout(m, plain);
    const std::vector<InstanceResults> got = RunLayout(m, c.layout);
    // One instance per block and micro-batch on both sides.
    EXPECT_EQ(ref.size(), static_cast<size_t>(m.num_layers * c.layout.microbatches));
    for (const InstanceDiff& d : CompareInstances(ref, got)) {
      SCOPED_TRACE(testing::Message()
                   << "block " << d.layer.block << " micro-batch " << d.layer.mb);
      EXPECT_FALSE(d.missing);
      ASSERT_EQ(d.tensors.size(), d.missing ? 0u : 5u);
      for (const TensorDiff& t : d.tensors) {
        EXPECT_GT(t.max_abs_ref, 0.0) << t.tensor << " is zero: nothing was compared";
        EXPECT_LE(t.max_abs_diff, 1e-4 * t.max_abs_ref) << t.tensor;
      }
    }
  }
}

// Different blocks and micro-batches see different data (each instance is
// seeded by both), so an instance run under the wrong micro-batch's number
// (a pair of the overlapped stage crossed) cannot pass the comparison above.
TEST(MpiLayouts, InstancesOfDifferentMicrobatchesDiffer) {
  planner::ModelConfig m = CheckModel();
  const planner::Layout l = With(L(WorldSize() / 2, 2, 1, WorldSize() / 2, 2, 2), false, false);
  m.global_batch_size = int64_t{l.dp} * l.microbatches;
  const std::vector<InstanceResults> got = RunLayout(m, l);
  ASSERT_EQ(got.size(), 8u);
  for (size_t i = 1; i < got.size(); ++i) {
    EXPECT_NE(got[0].tensors.y, got[i].tensors.y) << "instance " << i;
    EXPECT_NE(got[0].tensors.dw1, got[i].tensors.dw1) << "instance " << i;
  }
}

}  // namespace
}  // namespace moeplan::executor
