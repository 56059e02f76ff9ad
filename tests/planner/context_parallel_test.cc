// Context parallelism (docs/model.md "Context parallelism"): each sequence
// split over cp ranks, the attention a ring of cp fused blocks with cp - 1
// K/V exchange steps beside them (and the dK/dV partials following in the
// backward), the cp ranks counted with dp for gradients, ZeRO and the
// expert grid, and the field rules naming the field. Round-number costs
// (test_profile.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moeplan/planner/layout.h"
#include "moeplan/planner/layout_memory.h"
#include "moeplan/planner/layout_planner.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/planner/validate.h"
#include "test_profile.h"

namespace moeplan::planner {
namespace {

using testing::RoundNumberModel;

// SmallDenseFirstModel with fused attention (CP needs it): 4 blocks, the
// last two MoE (8 experts), seq_length 128, micro-batch 2, 8 query heads in
// 2 groups of head size 32.
ModelConfig Model(int64_t seq_length = 128) {
  ModelConfig m = testing::SmallDenseFirstModel(2);
  m.attention_backend = AttentionBackend::kFlash;
  m.seq_length = seq_length;
  m.global_batch_size = 0;
  return m;
}

// A one-stage layout of tp 2 over 8 GPUs: dp x cp = 4.
Layout StageOf(int dp, int cp, int ep = 4) {
  Layout l;
  l.dp = dp;
  l.tp = 2;
  l.cp = cp;
  l.ep = ep;
  l.esp = 2;
  l.family = Family::kDpMoe;
  l.microbatches = 1;
  return l;
}

// The stage's model planned without overlap variants, the default schedule.
VariantPlan PlanStage(const ModelConfig& model, const Layout& l) {
  const ModelConfig m = ModelForLayout(model, l, model.micro_batch_size);
  ModelPlanner planner(RoundNumberModel());
  ModelPlanOptions o;
  o.variants = {Variant::kNone};
  o.schedules = {Schedule::kDefault};
  o.algos = {AllToAllAlgo::kLinear};
  ModelPlan plan;
  const absl::Status s = planner.Plan(m, o, &plan);
  EXPECT_TRUE(s.ok()) << s;
  return plan.variants.empty() ? VariantPlan{} : plan.variants[0];
}

// The ops of `v` named `base` in block `block`, by step.
std::vector<OpId> Steps(const VariantPlan& v, std::string_view base, int block) {
  std::vector<OpId> out;
  for (OpId id = 0; id < v.graph.size(); ++id) {
    const Op& op = v.graph.op(id);
    if (op.base == base && op.block == block) out.push_back(id);
  }
  std::sort(out.begin(), out.end(),
            [&](OpId a, OpId b) { return v.graph.op(a).step < v.graph.op(b).step; });
  return out;
}

bool IsRingOp(std::string_view base) {
  return base.find("flash_attn") != std::string_view::npos ||
         base.find(".cp_") != std::string_view::npos;
}

// cp = 4 (tp 2, so the ring's ranks sit 2 apart inside one node): per
// block the forward runs 4 attention blocks and 3 exchange steps, step i
// starting with block i - 1 (step 1 with block 0, both right after the QKV
// projection) and block i when both block i - 1 and step i have ended. Each
// step sends the rank's K/V chunk: 2 sequences x 32 tokens x 1 group x (32 +
// 32) x 2 bytes = 8192 B at intra alpha 2 us + beta 0.001 us/B. The
// backward: 3 K/V steps, and the dK/dV partials' 3 steps plus the last hop
// to their owner, with 3 adds.
TEST(ContextParallel, TheRingHasCpMinusOneStepsBesideTheAttentionBlocks) {
  const VariantPlan v = PlanStage(Model(), StageOf(1, 4));
  const std::vector<OpTime>& t = v.sim.times;
  for (int blk = 0; blk < 4; ++blk) {
    const std::vector<OpId> blocks = Steps(v, "fwd.flash_attn", blk);
    const std::vector<OpId> kv = Steps(v, "fwd.cp_kv_sendrecv", blk);
    ASSERT_EQ(blocks.size(), 4u) << blk;
    ASSERT_EQ(kv.size(), 3u) << blk;
    for (int i = 1; i < 4; ++i) {
      const Op& step = v.graph.op(kv[i - 1]);
      EXPECT_EQ(step.step, i);
      EXPECT_EQ(step.bytes, 8192);
      EXPECT_DOUBLE_EQ(step.cost_us, 2.0 + 0.001 * 8192);
      EXPECT_EQ(step.inter_node_bytes, 0);
      const OpTime& s = t[kv[i - 1]];
      const OpTime& before = t[blocks[i - 1]];
      // The step runs while block i - 1 does: it starts before that ends.
      EXPECT_LT(s.start_us, before.end_us) << "block " << blk << " step " << i;
      EXPECT_DOUBLE_EQ(t[blocks[i]].start_us, std::max(before.end_us, s.end_us));
    }
    EXPECT_DOUBLE_EQ(t[kv[0]].start_us, t[blocks[0]].start_us);
    EXPECT_EQ(Steps(v, "bwd.flash_attn", blk).size(), 4u);
    EXPECT_EQ(Steps(v, "bwd.cp_kv_sendrecv", blk).size(), 3u);
    EXPECT_EQ(Steps(v, "bwd.cp_dkv_sendrecv", blk).size(), 4u);
    EXPECT_EQ(Steps(v, "bwd.cp_dkv_add", blk).size(), 3u);
  }
  // Each block is a cp-th of the attention: the kernel over 32 x 32 tokens.
  const VariantPlan plain = PlanStage(Model(32), StageOf(4, 1));
  const std::vector<OpId> one = Steps(plain, "fwd.flash_attn", 0);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_DOUBLE_EQ(v.graph.op(Steps(v, "fwd.flash_attn", 0)[0]).cost_us,
                   plain.graph.op(one[0]).cost_us);
}

// The cp ranks are data-parallel ranks to everything but the attention: a
// layout of dp 1 x cp 4 over sequences of 128 runs every other op as dp 4
// over sequences of 32 does (the same ops, costs and groups: the MoE
// dispatch over dp x cp, the gradients reduced over DP x CP).
TEST(ContextParallel, RanksCountAsDataParallelOutsideTheAttention) {
  const VariantPlan cp = PlanStage(Model(128), StageOf(1, 4));
  const VariantPlan dp = PlanStage(Model(32), StageOf(4, 1));
  std::multimap<std::string, double> a, b;
  for (OpId id = 0; id < cp.graph.size(); ++id) {
    const Op& op = cp.graph.op(id);
    if (!IsRingOp(op.base)) a.insert({op.Name(), op.cost_us});
  }
  for (OpId id = 0; id < dp.graph.size(); ++id) {
    const Op& op = dp.graph.op(id);
    if (!IsRingOp(op.base)) b.insert({op.Name(), op.cost_us});
  }
  EXPECT_GT(a.size(), 100u);
  EXPECT_EQ(a, b);
}

// Memory: activations are the rank's chunk's (a cp-th), ZeRO shards the
// dense state over dp x cp and the experts' over their replicas (dp x cp x
// tp / (ep x esp)).
TEST(ContextParallel, MemoryIsTheChunksAndZeroShardsOverDpTimesCp) {
  MemoryOptions o;
  Layout two = StageOf(2, 2);
  Layout one = StageOf(4, 1);
  two.zero_stage = one.zero_stage = 1;
  const MemoryBreakdown with = StageMemory(Model(128), two, 2, 0, 1.0, o);
  const MemoryBreakdown same = StageMemory(Model(64), one, 2, 0, 1.0, o);
  EXPECT_REL(with.activations, same.activations);
  EXPECT_REL(with.optimizer, same.optimizer);
  EXPECT_EQ(two.GradientRanks(), 4);
  EXPECT_EQ(two.ExpertReplicas(), 1);
  const MemoryBreakdown whole = StageMemory(Model(128), one, 2, 0, 1.0, o);
  EXPECT_REL(with.activations * 2.0, whole.activations);
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(ContextParallel, FieldRulesNameTheField) {
  const ClusterShape c{1, 8};
  EXPECT_TRUE(ValidateLayout(Model(), StageOf(1, 4), 8, c).ok());
  EXPECT_EQ(Message(ValidateLayout(Model(100), StageOf(1, 4), 8, c)),
            "layout.cp: splits each sequence into 2*cp chunks (two per rank, balancing the causal "
            "mask): seq_length must be divisible by 2*cp (got seq_length=100, cp=4)");
  ModelConfig unfused = Model();
  unfused.attention_backend = AttentionBackend::kUnfused;
  EXPECT_EQ(Message(ValidateLayout(unfused, StageOf(1, 4), 8, c)),
            "layout.cp: runs attention as a ring of fused kernels: needs attention_backend flash "
            "or fused (got cp=4)");
  EXPECT_EQ(Message(ValidateLayout(Model(), StageOf(2, 4), 8, c)),
            "layout: dp*tp*cp*pp must be <= the GPUs (8) (got 16)");
  EXPECT_EQ(Message(ValidateLayout(Model(), StageOf(1, 0), 8, c)),
            "layout.cp: must be between 1 and 1048576 (got 0)");
  // The experts spread over dp x cp ranks: ep 8 does not divide 1 x 4.
  EXPECT_EQ(Message(ValidateLayout(Model(), StageOf(1, 4, 8), 8, c)),
            "layout.ep: dpmoe spreads the experts over data-parallel ranks: must divide dp*cp "
            "(got ep=8, dp*cp=4)");
  Layout sp = StageOf(1, 4);
  sp.sequence_parallel = true;
  EXPECT_TRUE(ValidateLayout(Model(), sp, 8, c).ok());
  // TP 4 x CP 2: chunks of 12 / 2 tokens do not split 4 ways.
  ModelConfig twelve = Model(12);
  twelve.num_query_groups = 4;
  Layout tp4 = sp;
  tp4.tp = 4;
  tp4.cp = 2;
  EXPECT_EQ(Message(ValidateLayout(twelve, tp4, 8, c)),
            "layout.sequence_parallel: splits each sequence (each context-parallel chunk) over "
            "the TP group: seq_length must be divisible by tp*cp (got seq_length=12, tp*cp=8)");
  // A single layer has no attention.
  LayerConfig layer = testing::SmallLayer(2, 8, 2, 8);
  layer.parallel.cp = 2;
  EXPECT_EQ(Message(ValidateLayer(layer, ClusterShape{4, 8})),
            "parallel.cp: applies to layouts: a single MoE layer has no attention to split the "
            "sequence for (got 2)");
}

// Evaluated whole: the cp ranks multiply the GPUs, the tokens per GPU stay
// the global batch's over them.
TEST(ContextParallel, EvaluatesAndCountsItsGpus) {
  LayoutPlanner planner(RoundNumberModel());
  ModelConfig m = Model();
  m.global_batch_size = 8;
  LayoutCandidate cand;
  const absl::Status s = planner.Evaluate(m, StageOf(2, 2), {}, {}, &cand);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(cand.layout.Gpus(), 8);
  EXPECT_EQ(cand.micro_batch_size, 4);  // 8 sequences over dp 2
  EXPECT_REL(cand.tokens_per_s_per_gpu, 8.0 * 128 / (cand.iteration_us * 1e-6) / 8);
}

// The search's context_parallel and expert_tensor_parallel axes: every
// candidate the search would simulate, with cp 1 and 2 and the folded etp 1
// grids beside the tied dpmoe ones under sequence parallelism, each valid
// and each degree where it applies; and the field rules.
TEST(ContextParallel, TheSearchTriesTheDegreesAndFoldedGridsAsked) {
  LayoutPlanner planner(RoundNumberModel());
  ModelConfig m = Model();
  m.global_batch_size = 8;
  SearchOptions so;
  so.top = 1000;
  so.gpus = 8;
  so.exhaustive = true;
  so.pipelines = {PipelineSchedule::k1F1B};
  so.zero_stages = {0};
  so.max_microbatches = 1;
  so.sequence_parallel = {false, true};
  MemoryOptions no_check;
  no_check.gpu_memory_bytes = 0;
  LayoutSearchResult plain, wide;
  ASSERT_TRUE(planner.Search(m, so, {}, no_check, &plain).ok());
  so.context_parallel = {1, 2};
  so.expert_tensor_parallel = {1};
  ASSERT_TRUE(planner.Search(m, so, {}, no_check, &wide).ok());
  EXPECT_GT(wide.stats.enumerated, plain.stats.enumerated);
  int cp2 = 0, folded = 0;
  for (const LayoutCandidate& c : wide.candidates) {
    const Layout& l = c.layout;
    EXPECT_TRUE(ValidateLayout(m, l, 8, ClusterShape{1, 8}).ok()) << l.dp << " " << l.cp;
    EXPECT_EQ(l.Gpus(), 8);
    cp2 += l.cp == 2;
    const bool is_folded = l.family == Family::kDpMoe && l.esp != l.tp;
    folded += is_folded;
    if (is_folded) {
      EXPECT_TRUE(l.sequence_parallel);
      EXPECT_EQ(l.esp, 1);
    }
  }
  EXPECT_GT(cp2, 0);
  EXPECT_GT(folded, 0);
  for (const LayoutCandidate& c : plain.candidates) {
    EXPECT_EQ(c.layout.cp, 1);
    EXPECT_FALSE(c.layout.family == Family::kDpMoe && c.layout.esp != c.layout.tp);
  }
  SearchOptions bad;
  bad.context_parallel = {2, 2};
  EXPECT_EQ(Message(ValidateSearchOptions(bad)),
            "search.context_parallel: each may be listed once (got 2 twice)");
  bad.context_parallel = {0};
  EXPECT_EQ(Message(ValidateSearchOptions(bad)),
            "search.context_parallel: each must be between 1 and 1024 (got 0)");
  bad.context_parallel = {};
  bad.expert_tensor_parallel = {1};
  EXPECT_EQ(Message(ValidateSearchOptions(bad)),
            "search.expert_tensor_parallel: folded expert grids run with sequence parallelism, "
            "which the search must try (search.sequence_parallel with true; --sequence-parallel "
            "on or both) (got 1 degrees)");
}

}  // namespace
}  // namespace moeplan::planner
