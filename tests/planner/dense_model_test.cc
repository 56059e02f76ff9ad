// Dense models (no MoE layer: Llama, the dense GPTs) in the whole-model
// planner (docs/model.md "Dense models"): their blocks are exactly the dense
// blocks of an MoE model, nothing routes or exchanges tokens, the layout
// search places no experts, and the MoE fields and degrees they cannot have
// are refused by name. Round-number costs (test_profile.h).
#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

#include "moeplan/planner/accounting.h"
#include "moeplan/planner/layout.h"
#include "moeplan/planner/layout_planner.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/model_planner.h"
#include "test_profile.h"

namespace moeplan::planner {
namespace {

using testing::RoundNumberModel;

ModelConfig Dense(int mp = 2) { return testing::SmallDenseModel(mp); }
ModelConfig DenseFirst(int mp = 2) { return testing::SmallDenseFirstModel(mp); }

ModelPlan Plan(const ModelConfig& m, std::vector<Variant> variants = {}) {
  ModelPlanner planner(RoundNumberModel());
  ModelPlanOptions o;
  o.variants = std::move(variants);
  ModelPlan plan;
  const absl::Status s = planner.Plan(m, o, &plan);
  EXPECT_TRUE(s.ok()) << s;
  return plan;
}

struct Shape {
  std::string base;
  int64_t rows, count;
  double cost_us;
  bool operator==(const Shape&) const = default;
};

std::vector<Shape> BlockOps(const VariantPlan& v, int block) {
  std::vector<Shape> out;
  for (OpId id = 0; id < v.graph.size(); ++id) {
    const Op& op = v.graph.op(id);
    if (op.block != block) continue;
    out.push_back(
        {std::string(op.base), v.graph.exec(id).rows, v.graph.exec(id).count, op.cost_us});
  }
  return out;
}

TEST(DenseModel, BlocksAreAnMoeModelsDenseBlocksAndNothingRoutes) {
  const ModelPlan dense = Plan(Dense());
  const ModelPlan mixed = Plan(DenseFirst(), {Variant::kNone});
  // No variant splits or reorders around AlltoAlls a dense model lacks.
  ASSERT_EQ(dense.variants.size(), 1u);
  const VariantPlan& v = dense.variants[0];
  EXPECT_EQ(v.variant, Variant::kNone);
  EXPECT_EQ(v.schedule, Schedule::kDefault);
  EXPECT_EQ(dense.moe_layers, 0);
  EXPECT_TRUE(v.layers.empty());
  for (OpId id = 0; id < v.graph.size(); ++id) {
    const Op& op = v.graph.op(id);
    EXPECT_FALSE(op.flags & kMoeScope) << op.Name();
    EXPECT_EQ(std::string(op.base).find("alltoall"), std::string::npos) << op.Name();
  }
  // Blocks 0 and 1: the same ops, sizes and costs as the MoE model's dense blocks.
  const VariantPlan& w = mixed.variants[0];
  for (int block : {0, 1}) {
    const std::vector<Shape> a = BlockOps(v, block), b = BlockOps(w, block);
    ASSERT_FALSE(a.empty());
    EXPECT_EQ(a, b) << "block " << block;
  }
  // Block 2 is dense here and MoE there: the dense FFN (SwiGLU: 2F/t wide).
  bool ffn = false;
  for (const Shape& s : BlockOps(v, 2)) {
    if (s.base == "fwd.fc1") {
      ffn = true;
      EXPECT_EQ(s.rows, 2 * 512 / 2);
    }
  }
  EXPECT_TRUE(ffn);
  // Parameters: every one is active; no expert parameters on a rank.
  const ParamCounts c = CountParams(Dense());
  EXPECT_EQ(c.active, c.total);
  EXPECT_EQ(c.routed_experts, 0.0);
  // mp = 2 splits every weight matrix; the 9 RMSNorms (M each: two per
  // block and the final one) are whole on both ranks.
  EXPECT_EQ(static_cast<double>(dense.params_per_rank), (c.total - 9 * 256) / 2 + 9 * 256);
}

TEST(DenseModel, FieldRulesNameTheField) {
  const ClusterShape cluster = RoundNumberModel().profile().shape;
  struct Case {
    std::string_view label;
    void (*edit)(ModelConfig&);
    std::string_view error;
  };
  const Case cases[] = {
      {"ep", [](ModelConfig& m) { m.parallel.ep = 2; },
       "parallel.ep: must be 1 (or unset) for a dense model: it has no experts to split (got 2)"},
      {"esp", [](ModelConfig& m) { m.parallel.esp = 2; },
       "parallel.esp: must be 1 (or unset) for a dense model: it has no experts to split (got 2)"},
      {"expert size without experts", [](ModelConfig& m) { m.moe.expert_ffn_hidden_size = 64; },
       "moe.num_experts: must be > 0 when moe.expert_ffn_hidden_size is set (a dense model leaves "
       "moe unset; an MoE model needs its experts) (got 0)"},
      {"pattern without experts",
       [](ModelConfig& m) {
         m.moe.layer_pattern = {0, 1, 1, 1};
       },
       "moe.num_experts: must be > 0 when moe.layer_pattern is set (a dense model leaves moe "
       "unset; an MoE model needs its experts) (got 0)"},
      {"too many ranks", [](ModelConfig& m) { m.parallel.dp = 1024; },
       "parallel: mp*dp*pp must be <= the cluster's GPUs"},
  };
  for (const Case& c : cases) {
    ModelConfig m = Dense();
    c.edit(m);
    const absl::Status s = ValidateModel(m, cluster);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.label;
    EXPECT_EQ(std::string(s.message()).rfind(c.error, 0), 0u) << c.label << ": " << s.message();
  }
  EXPECT_TRUE(ValidateModel(Dense(), cluster).ok());
  // S1 and S2 reorder MoE layers: asked for, an error naming the schedule.
  ModelPlanner planner(RoundNumberModel());
  ModelPlanOptions o;
  o.schedules = {Schedule::kS1};
  ModelPlan plan;
  const absl::Status s = planner.Plan(Dense(), o, &plan);
  EXPECT_EQ(std::string(s.message()), "schedules: s1 reorders MoE layers; a dense model has none");
  // A layout of a dense model places no experts.
  Layout l;
  l.dp = 4;
  l.tp = 2;
  l.ep = 2;
  EXPECT_EQ(
      std::string(ValidateLayout(Dense(), l, 8, cluster).message()),
      "layout.ep: must be 1 (or unset) for a dense model: it has no experts to split (got 2)");
  l.ep = 1;
  EXPECT_TRUE(ValidateLayout(Dense(), l, 8, cluster).ok());
}

TEST(DenseModel, SearchPlacesNoExperts) {
  ModelConfig m = Dense();
  m.global_batch_size = 64;
  LayoutPlanner lp(RoundNumberModel());
  SearchOptions so;
  so.top = 1000;
  so.gpus = 8;
  MemoryOptions no_check;
  no_check.gpu_memory_bytes = 0;
  LayoutSearchResult r;
  const absl::Status s = lp.Search(m, so, {}, no_check, &r);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_FALSE(r.candidates.empty());
  int tps = 0;
  for (const LayoutCandidate& c : r.candidates) {
    EXPECT_EQ(c.layout.ep, 1);
    EXPECT_EQ(c.layout.esp, 1);
    EXPECT_EQ(c.variant, Variant::kNone);
    EXPECT_GT(c.tflops_per_gpu, 0.0);
    tps |= 1 << c.layout.tp;
  }
  // The tensor-parallel degrees that divide the 2 key/value groups: 1 and 2.
  EXPECT_EQ(tps, (1 << 1) | (1 << 2));
}

// ZeRO 0-1 synchronise gradients once per iteration, with the last
// micro-batch: a micro-batch's backward does not wait for buckets. With TP 2
// and the DP group on the same node, the buckets' collectives share the link
// with the backward's TP AllReduces; each further micro-batch still costs
// what it costs with no DP group at all (dp 1, no buckets), and only the
// iteration's tail (the last backward with its buckets, and the step) grows.
TEST(DenseModel, GradientBucketsDelayOnlyTheLastMicroBatch) {
  LayoutPlanner lp(RoundNumberModel());
  MemoryOptions no_check;
  no_check.gpu_memory_bytes = 0;
  // Iteration time of m micro-batches of 2 sequences on dp replicas.
  auto iteration = [&](int dp, int m, int zero) {
    ModelConfig model = Dense(2);
    model.parallel.dp = dp;
    model.global_batch_size = int64_t{dp} * m * model.micro_batch_size;
    Layout l;
    l.dp = dp;
    l.tp = 2;
    l.pp = 1;
    l.microbatches = m;
    l.zero_stage = zero;
    // Small buckets: each is issued as soon as its gradients are done,
    // during the backward.
    ModelPlanOptions o;
    o.bucket_bytes = 64 << 10;
    LayoutCandidate c;
    const absl::Status s = lp.Evaluate(model, l, o, no_check, &c);
    EXPECT_TRUE(s.ok()) << s;
    return c.iteration_us;
  };
  const double alone = iteration(1, 3, 0) - iteration(1, 2, 0);
  for (int zero : {0, 1}) {
    EXPECT_REL(iteration(2, 3, zero) - iteration(2, 2, zero), alone);
    EXPECT_GT(iteration(2, 2, zero), iteration(1, 2, zero));  // the buckets: once
  }
  // ZeRO 2 reduce-scatters every micro-batch's gradients: each costs more.
  EXPECT_GT(iteration(2, 3, 2) - iteration(2, 2, 2), alone * (1 + 1e-6));
}

}  // namespace
}  // namespace moeplan::planner
