// Today's model shapes in the whole-model graph (docs/model.md): GQA,
// SwiGLU, MLA, fused attention, MTP depths, layer patterns, uneven pipeline
// stages and their field rules. Round-number costs (test_profile.h): a GEMM
// is 5 us + 2mnk / 1e8 us, so sizes are read back from the ops.
#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "moeplan/planner/accounting.h"
#include "moeplan/planner/layout.h"
#include "moeplan/planner/layout_planner.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/model_planner.h"
#include "test_profile.h"

namespace moeplan::planner {
namespace {

using testing::RoundNumberModel;

ModelConfig Base(int mp = 1) {
  ModelConfig m;
  m.name = "modern";
  m.num_layers = 4;
  m.hidden_size = 256;
  m.num_attention_heads = 8;
  m.ffn_hidden_size = 512;
  m.seq_length = 128;
  m.micro_batch_size = 2;
  m.vocab_size = 1024;
  m.moe.layer_freq = 1;
  m.moe.num_experts = 8;
  m.moe.top_k = 2;
  m.moe.capacity_factor = 1.0;
  m.moe.expert_ffn_hidden_size = 256;
  m.parallel = {.mp = mp, .ep = 8, .esp = 1, .dp = 8 / mp, .pp = 1};
  return m;
}

VariantPlan PlanNone(const ModelConfig& m) {
  ModelPlanner planner(RoundNumberModel());
  ModelPlanOptions o;
  o.variants = {Variant::kNone};
  o.schedules = {Schedule::kDefault};
  ModelPlan plan;
  const absl::Status s = planner.Plan(m, o, &plan);
  EXPECT_TRUE(s.ok()) << s;
  return plan.variants.empty() ? VariantPlan{} : plan.variants[0];
}

// The first op named `base` of block `block`, or nullptr.
const OpExec* FindExec(const VariantPlan& v, std::string_view base, int block) {
  for (OpId id = 0; id < v.graph.size(); ++id) {
    const Op& op = v.graph.op(id);
    if (op.base == base && op.block == block) return &v.graph.exec(id);
  }
  return nullptr;
}

// The bytes the first op named `base` of block `block` touches; -1 when none.
int64_t BytesOf(const VariantPlan& v, std::string_view base, int block) {
  for (OpId id = 0; id < v.graph.size(); ++id) {
    const Op& op = v.graph.op(id);
    if (op.base == base && op.block == block) return op.bytes;
  }
  return -1;
}

int Count(const VariantPlan& v, std::string_view base) {
  int n = 0;
  for (OpId id = 0; id < v.graph.size(); ++id) n += v.graph.op(id).base == base;
  return n;
}

TEST(ModernModel, GroupedQueryAttentionShrinksTheKeyValueProjections) {
  ModelConfig m = Base(/*mp=*/2);
  m.num_query_groups = 2;
  m.kv_channels = 64;  // 8 heads of 64: a 512-wide attention on a 256-wide model
  const VariantPlan v = PlanNone(m);
  const OpExec* qkv = FindExec(v, "fwd.qkv", 0);
  ASSERT_NE(qkv, nullptr);
  // Per TP rank: 4 query heads and 1 key/value group of 64: (4 + 2) x 64.
  EXPECT_EQ(qkv->rows, 6 * 64);
  EXPECT_EQ(qkv->count, 256);
  const OpExec* proj = FindExec(v, "fwd.proj", 0);
  ASSERT_NE(proj, nullptr);
  EXPECT_EQ(proj->rows, 256);
  EXPECT_EQ(proj->count, 4 * 64);
  const OpExec* score = FindExec(v, "fwd.attn_score", 0);
  ASSERT_NE(score, nullptr);
  EXPECT_EQ(score->count, 64);  // the head size, not hidden / heads = 32
}

TEST(ModernModel, SwigluDoublesTheFirstGemmEverywhere) {
  ModelConfig m = Base();
  m.moe.layer_pattern = {0, 1, 1, 1};
  m.moe.layer_freq = 0;
  m.moe.shared_expert_ffn_hidden_size = 128;
  m.moe.num_shared_experts = 2;
  const VariantPlan gelu = PlanNone(m);
  m.gated_linear_unit = true;
  const VariantPlan glu = PlanNone(m);
  EXPECT_EQ(FindExec(gelu, "fwd.fc1", 0)->rows, 512);
  EXPECT_EQ(FindExec(glu, "fwd.fc1", 0)->rows, 1024);
  EXPECT_EQ(FindExec(glu, "fwd.shared_fc1", 1)->rows, 2 * 2 * 128);
  EXPECT_EQ(FindExec(glu, "fwd.shared_fc2", 1)->count, 2 * 128);
  EXPECT_EQ(Count(glu, "fwd.swiglu"), 1);  // the one dense block
  EXPECT_EQ(Count(glu, "fwd.gelu"), 0);
  EXPECT_EQ(Count(gelu, "fwd.gelu"), 1);
  // The experts' first GEMMs double too: the whole iteration grows.
  EXPECT_GT(glu.iteration_us(), gelu.iteration_us());
  // The layer the experts run says so.
  EXPECT_TRUE(m.MoeLayer().gated_linear_unit);
}

TEST(ModernModel, MlaProjectsDownAndUp) {
  ModelConfig m = Base(/*mp=*/2);
  m.multi_latent_attention = true;
  m.mla = testing::SmallMla();
  const VariantPlan v = PlanNone(m);
  EXPECT_EQ(Count(v, "fwd.qkv"), 0);
  // Down projections whole on each TP rank; up projections over its 4 heads.
  EXPECT_EQ(FindExec(v, "fwd.q_down", 0)->rows, 96);
  EXPECT_EQ(FindExec(v, "fwd.q_up", 0)->rows, 4 * (32 + 16));
  EXPECT_EQ(FindExec(v, "fwd.q_up", 0)->count, 96);
  EXPECT_EQ(FindExec(v, "fwd.kv_down", 0)->rows, 64 + 16);
  EXPECT_EQ(FindExec(v, "fwd.kv_up", 0)->rows, 4 * (32 + 32));
  EXPECT_EQ(FindExec(v, "fwd.attn_score", 0)->count, 48);
  EXPECT_EQ(FindExec(v, "fwd.proj", 0)->count, 4 * 32);
  EXPECT_EQ(Count(v, "bwd.q_down_dw"), 4);
  EXPECT_EQ(Count(v, "bwd.kv_up_dw"), 4);
  // Without query compression the queries are projected from the input.
  m.mla.q_lora_rank = 0;
  const VariantPlan direct = PlanNone(m);
  EXPECT_EQ(Count(direct, "fwd.q_down"), 0);
  EXPECT_EQ(FindExec(direct, "fwd.q_up", 0)->count, 256);
}

TEST(ModernModel, FusedAttentionKeepsNoScores) {
  ModelConfig m = Base();
  const VariantPlan unfused = PlanNone(m);
  m.attention_backend = AttentionBackend::kFlash;
  const VariantPlan flash = PlanNone(m);
  EXPECT_EQ(Count(flash, "fwd.softmax"), 0);
  EXPECT_EQ(Count(flash, "fwd.flash_attn"), 4);
  EXPECT_EQ(Count(flash, "bwd.flash_attn"), 4);
  EXPECT_EQ(Count(unfused, "fwd.flash_attn"), 0);
  // The causal half: the fused forward costs half the two GEMMs.
  auto us = [](const VariantPlan& v, std::string_view base) {
    for (OpId id = 0; id < v.graph.size(); ++id) {
      if (v.graph.op(id).base == base) return v.graph.op(id).cost_us;
    }
    return -1.0;
  };
  EXPECT_DOUBLE_EQ(us(flash, "fwd.flash_attn"),
                   0.5 * (us(unfused, "fwd.attn_score") + us(unfused, "fwd.attn_ctx")));
  EXPECT_DOUBLE_EQ(us(flash, "bwd.flash_attn"), 2.5 * us(flash, "fwd.flash_attn"));
  // Memory: no s^2 term.
  Layout l;
  l.dp = 8;
  l.ep = 8;
  l.microbatches = 1;
  l.family = Family::kParm;
  const MemoryOptions o;
  m.attention_backend = AttentionBackend::kUnfused;
  const double a = StageMemory(m, l, 2, 0, 1.0, o).activation_per_microbatch;
  m.attention_backend = AttentionBackend::kFlash;
  const double b = StageMemory(m, l, 2, 0, 1.0, o).activation_per_microbatch;
  // 5 a s^2 b / t per block in 2-byte units, times e / 2 = 1: 5 x 8 x 128 x 256 x 4 blocks.
  EXPECT_DOUBLE_EQ(a - b, 5.0 * 8 * 128 * 256 * 4);
}

TEST(ModernModel, MtpDepthsRunAfterTheLastLayer) {
  ModelConfig m = Base();
  m.mtp_num_layers = 2;
  const VariantPlan v = PlanNone(m);
  EXPECT_EQ(Count(v, "fwd.lm_head"), 3);  // the main output layer and two depths'
  EXPECT_EQ(Count(v, "fwd.mtp_proj"), 2);
  EXPECT_NE(FindExec(v, "fwd.qkv", 4), nullptr);  // depth 0 is block 4
  EXPECT_NE(FindExec(v, "fwd.qkv", 5), nullptr);
  EXPECT_NE(FindExec(v, "fwd.gate", 5), nullptr) << "a depth is of the last layer's kind (MoE)";
  EXPECT_EQ(FindExec(v, "fwd.qkv", 6), nullptr);
  // The parameters the plan synchronises include the depths'.
  m.mtp_num_layers = 0;
  EXPECT_GT(PlanNone(m).iteration_us(), 0.0);
  StageOptions all;
  m.mtp_num_layers = 2;
  const RankParams with = StageParams(m, all);
  m.mtp_num_layers = 0;
  const RankParams without = StageParams(m, all);
  const double M = 256;
  EXPECT_DOUBLE_EQ(with.total() - without.total(),
                   2 * (BlockParams(m, 3).total() + 3 * 2 * M + 2 * M * M));
  // A last stage without the first holds a copy of the embedding for the
  // depths' lookups (Megatron-Core builds one on the MTP stage): V x M more.
  StageOptions last;
  last.first_block = 2;
  last.embed = false;
  const RankParams copy_with = [&] {
    ModelConfig d = m;
    d.mtp_num_layers = 2;
    return StageParams(d, last);
  }();
  EXPECT_DOUBLE_EQ(copy_with.total() - StageParams(m, last).total(),
                   2 * (BlockParams(m, 3).total() + 3 * 2 * M + 2 * M * M) + 1024 * M);
  // Each depth looks its tokens up: an embedding lookup forward and backward.
  m.mtp_num_layers = 2;
  const VariantPlan d = PlanNone(m);
  EXPECT_EQ(Count(d, "fwd.mtp_embed"), 2);
  EXPECT_EQ(Count(d, "bwd.mtp_embed"), 2);
  // The same lookup as the main embedding's.
  EXPECT_GT(BytesOf(d, "fwd.embed", -1), 0);
  EXPECT_EQ(BytesOf(d, "fwd.mtp_embed", 4), BytesOf(d, "fwd.embed", -1));
}

// Qwen2's gated shared expert: sigmoid(x w) scales the shared output, one
// memory-bound op each way (3 S M b forward: the GEMV's input, the output
// read and written; 4 S M b backward), and its M weights are synchronised.
TEST(ModernModel, SharedExpertGateScalesTheSharedOutput) {
  ModelConfig m = Base();
  m.moe.shared_expert_ffn_hidden_size = 128;
  const VariantPlan plain = PlanNone(m);
  EXPECT_EQ(Count(plain, "fwd.shared_gate"), 0);
  m.moe.shared_expert_gate = true;
  const VariantPlan gated = PlanNone(m);
  EXPECT_EQ(Count(gated, "fwd.shared_gate"), 4);
  EXPECT_EQ(Count(gated, "bwd.shared_gate"), 4);
  const int64_t sm = 2 * 128 * 256 * 2;  // S = B L tokens of M, 2 bytes each
  EXPECT_EQ(BytesOf(gated, "fwd.shared_gate", 0), 3 * sm);
  EXPECT_EQ(BytesOf(gated, "bwd.shared_gate", 0), 4 * sm);
  EXPECT_GT(gated.iteration_us(), plain.iteration_us());
}

TEST(ModernModel, LayerPatternPicksTheMoeBlocks) {
  ModelConfig m = Base();
  m.moe.layer_freq = 0;
  m.moe.layer_pattern = {0, 0, 1, 1};
  EXPECT_EQ(m.NumMoeLayers(), 2);
  const VariantPlan v = PlanNone(m);
  EXPECT_EQ(FindExec(v, "fwd.gate", 1), nullptr);
  EXPECT_NE(FindExec(v, "fwd.fc1", 1), nullptr);
  EXPECT_NE(FindExec(v, "fwd.gate", 2), nullptr);
}

TEST(ModernModel, UnevenStagesSpreadTheLayers) {
  ModelConfig m = Base();
  m.num_layers = 7;
  m.moe.layer_freq = 1;
  LayoutPlanner lp(RoundNumberModel());
  Layout l;
  l.dp = 2;
  l.ep = 2;
  l.pp = 4;  // 7 layers over 4 stages: 1, 2, 2, 2
  l.microbatches = 4;
  l.family = Family::kParm;
  m.global_batch_size = 16;
  LayoutCandidate c;
  const absl::Status s = lp.Evaluate(m, l, {}, {}, &c);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_GT(c.iteration_us, 0.0);
  EXPECT_GT(c.tflops_per_gpu, 0.0);
  EXPECT_DOUBLE_EQ(c.tflops_per_gpu, FlopsPerToken(m) * c.tokens_per_s_per_gpu / 1e12);
  EXPECT_DOUBLE_EQ(c.mfu, c.tflops_per_gpu / 100.0);
  l.pp = 8;
  EXPECT_EQ(std::string(ValidateLayout(m, l, 16, ClusterShape{8, 8}).message()),
            "layout.pp: must be <= num_layers (7) (got 8)");
}

TEST(ModernModel, FieldRulesNameTheField) {
  struct Case {
    void (*edit)(ModelConfig&);
    std::string want;
  } cases[] = {
      {[](ModelConfig& m) { m.num_query_groups = 3; },
       "num_query_groups: must divide num_attention_heads"},
      {[](ModelConfig& m) { m.kv_channels = -1; }, "kv_channels: must be > 0 (got -1)"},
      {[](ModelConfig& m) {
         m.multi_latent_attention = true;
         m.mla = {.kv_lora_rank = 64, .qk_head_dim = 32, .v_head_dim = 32};
         m.num_query_groups = 2;
       },
       "num_query_groups: must be unset with multi_latent_attention (got 2)"},
      {[](ModelConfig& m) {
         m.multi_latent_attention = true;
         m.mla = {.qk_head_dim = 32, .v_head_dim = 32};
       },
       "multi_latent_attention.kv_lora_rank: must be > 0 (got 0)"},
      {[](ModelConfig& m) {
         m.moe.layer_pattern = {1, 1};
       },
       "moe.layer_freq: must be unset (0) when moe.layer_pattern is given (got 1)"},
      {[](ModelConfig& m) {
         m.moe.layer_freq = 0;
         m.moe.layer_pattern = {1, 1};
       },
       "moe.layer_pattern: must have one entry per layer (num_layers) (got 2 entries, "
       "num_layers=4)"},
      {[](ModelConfig& m) {
         m.moe.layer_freq = 0;
         m.moe.layer_pattern = {0, 0, 0, 0};
       },
       "moe.layer_pattern: must mark at least one MoE layer (1) (got all 0)"},
      {[](ModelConfig& m) { m.moe.num_shared_experts = 2; },
       "moe.num_shared_experts: needs moe.shared_expert_ffn_hidden_size (their size) (got 2)"},
      {[](ModelConfig& m) { m.moe.shared_expert_gate = true; },
       "moe.shared_expert_gate: needs a shared expert"},
      {[](ModelConfig& m) {
         m.moe.router_num_groups = 3;
         m.moe.router_group_topk = 1;
       },
       "moe.router_num_groups: must divide moe.num_experts (got router_num_groups=3, "
       "num_experts=8)"},
      {[](ModelConfig& m) {
         m.moe.router_num_groups = 4;
         m.moe.router_group_topk = 5;
       },
       "moe.router_group_topk: must be between 1 and moe.router_num_groups"},
      {[](ModelConfig& m) {
         m.moe.router_num_groups = 4;
         m.moe.router_group_topk = 1;
         m.moe.top_k = 3;
       },
       "moe.top_k: must be <= the experts of router_group_topk groups"},
      {[](ModelConfig& m) { m.moe.dropless = true; },
       "moe.capacity_factor: must be unset with moe.dropless (no capacity) (got 1)"},
      {[](ModelConfig& m) {
         m.moe.router_force_load_balancing = true;
         m.moe.token_skew = 2.0;
       },
       "moe.token_skew: must be unset or 1 with moe.router_force_load_balancing (got 2)"},
      {[](ModelConfig& m) { m.mtp_num_layers = 17; },
       "mtp_num_layers: must be between 0 and 16 (got 17)"},
      {[](ModelConfig& m) {
         m.vocab_size = 0;
         m.mtp_num_layers = 1;
       },
       "mtp_num_layers: needs vocab_size"},
      {[](ModelConfig& m) {
         m.parallel.mp = 2;
         m.parallel.dp = 4;
         m.num_query_groups = 1;
       },
       "parallel.mp: must divide num_query_groups"},
  };
  for (const Case& k : cases) {
    ModelConfig m = Base();
    k.edit(m);
    const absl::Status s = ValidateModel(m, ClusterShape{8, 8});
    EXPECT_EQ(std::string(s.message()).rfind(k.want, 0), 0u) << s.message() << "\nwant " << k.want;
  }
}

TEST(ModernModel, DroplessModelsPlan) {
  ModelConfig m = Base();
  m.moe.dropless = true;
  m.moe.capacity_factor = 0.0;
  m.moe.token_skew = 1.5;
  const VariantPlan v = PlanNone(m);
  EXPECT_GT(v.iteration_us(), 0.0);
  EXPECT_TRUE(m.MoeLayer().dropless);
  EXPECT_EQ(m.MoeLayer().token_skew, 1.5);
}

}  // namespace
}  // namespace moeplan::planner
