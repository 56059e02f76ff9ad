// Selective recomputation (docs/layouts.md "Recomputation"): each module
// named in Layout::recompute_modules keeps none of its activations and runs
// its forward again before the backward. Hand-computed memory per module,
// the backward's added time from the module's own forward ops, and the
// field rules. Round-number costs (test_profile.h).
#include <gtest/gtest.h>

#include <string>

#include "moeplan/planner/layout.h"
#include "moeplan/planner/layout_memory.h"
#include "moeplan/planner/layout_planner.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/model_planner.h"
#include "test_profile.h"

namespace moeplan::planner {
namespace {

using testing::RoundNumberModel;

// SmallDenseFirstModel (blocks 0-1 dense, 2-3 MoE: 8 experts, top 2, expert
// FFN 256; hidden 256, 8 heads, seq 128, SwiGLU, unfused attention) with a
// shared expert of 256, and 8 sequences a global batch.
ModelConfig Model() {
  ModelConfig m = testing::SmallDenseFirstModel(2);
  m.moe.num_shared_experts = 1;
  m.moe.shared_expert_ffn_hidden_size = 256;
  m.global_batch_size = 8;
  return m;
}

// dp 4 x tp 2, experts over dp (ep 4, esp = tp 2), one micro-batch of 2.
Layout StageOf(uint8_t modules) {
  Layout l;
  l.dp = 4;
  l.tp = 2;
  l.ep = 4;
  l.esp = 2;
  l.family = Family::kDpMoe;
  l.microbatches = 1;
  l.recompute_modules = modules;
  return l;
}

// Per micro-batch of 2 sequences (S = 256 tokens, M = 256, t = 2, 2-byte
// elements), what each module does not keep, per block:
//   core_attn   5 a L S / t = 5 * 8 * 128 * 256 / 2                 = 655360 B (unfused)
//   layernorm   the two norms' outputs, 2 * S M b = 2 * 256 * 256 * 2 = 262144 B
//   mlp         FC1 out + SwiGLU out, S (2 f + f) b, f = 512 / 2   = 393216 B (dense blocks)
//   moe_act     the experts' activation, R H' b, R = E T = 8 * 64,
//               H' = 256 / 2                                       = 131072 B (MoE blocks)
//   shared      S (2 f_s + f_s) b, f_s = 256 / 2                   = 196608 B (MoE blocks)
// With m micro-batches in flight the stage keeps m times less per block,
// and holds one block's recomputed tensors at a time.
TEST(Recompute, EachModuleFreesItsActivationsAndHoldsOneBlocksAgain) {
  const ModelConfig m = Model();
  const MemoryOptions o;
  const double in_flight = 3.0;
  const MemoryBreakdown none = StageMemory(m, StageOf(0), 2, 0, in_flight, o);
  struct Case {
    uint8_t module;
    double per_block;
    int blocks;
  } cases[] = {
      {kRecomputeCoreAttn, 655360.0, 4},      {kRecomputeLayernorm, 262144.0, 4},
      {kRecomputeMlp, 393216.0, 2},           {kRecomputeMoeAct, 131072.0, 2},
      {kRecomputeSharedExperts, 196608.0, 2},
  };
  for (const Case& c : cases) {
    const MemoryBreakdown with = StageMemory(m, StageOf(c.module), 2, 0, in_flight, o);
    EXPECT_REL(none.activation_per_microbatch - with.activation_per_microbatch,
               c.per_block * c.blocks)
        << int{c.module};
    EXPECT_REL(none.activations - with.activations,
               in_flight * c.per_block * c.blocks - c.per_block)
        << int{c.module};
    EXPECT_REL(with.params, none.params);
  }
  // Modules add up; the held block is the largest sum (a dense block's:
  // 655360 + 262144 + 393216 against an MoE block's 655360 + 262144 +
  // 131072 + 196608).
  const uint8_t all = kRecomputeCoreAttn | kRecomputeLayernorm | kRecomputeMlp | kRecomputeMoeAct |
                      kRecomputeSharedExperts;
  const MemoryBreakdown every = StageMemory(m, StageOf(all), 2, 0, in_flight, o);
  const double dense = 655360.0 + 262144.0 + 393216.0,
               moe = 655360.0 + 262144.0 + 131072.0 + 196608.0;
  EXPECT_REL(none.activations - every.activations, in_flight * 2.0 * (dense + moe) - dense);
}

// Fused attention keeps no scores: core_attn frees nothing there. MLA's up
// projections free the up-projected Q, K and V: S h (2 qk + v) b with 4
// heads per rank of qk 32 + 16 and v 32: 256 * 4 * 128 * 2 = 262144 B.
TEST(Recompute, FusedCoreAttentionAndMlaUpProjections) {
  ModelConfig m = Model();
  m.attention_backend = AttentionBackend::kFlash;
  const MemoryOptions o;
  EXPECT_REL(StageMemory(m, StageOf(kRecomputeCoreAttn), 2, 0, 1.0, o).activations,
             StageMemory(m, StageOf(0), 2, 0, 1.0, o).activations);
  m.multi_latent_attention = true;
  m.mla = testing::SmallMla();
  EXPECT_REL(
      StageMemory(m, StageOf(0), 2, 0, 1.0, o).activation_per_microbatch -
          StageMemory(m, StageOf(kRecomputeMlaUpProj), 2, 0, 1.0, o).activation_per_microbatch,
      4 * 262144.0);
}

// Time: each module's forward runs again in the backward. layernorm: ln1
// and ln2 of 4 blocks, each a memory-bound pass over 2 S M b = 262144 B:
// 3 us + 0.262144 us. moe_act: the activation over each MoE block's rows
// (3 R H' b read and written). The forward is unchanged.
TEST(Recompute, TheBackwardRunsTheModulesForwardAgain) {
  LayoutPlanner planner(RoundNumberModel());
  const ModelConfig m = Model();
  LayoutCandidate none, norms, act;
  ASSERT_TRUE(planner.Evaluate(m, StageOf(0), {}, {}, &none).ok());
  ASSERT_TRUE(planner.Evaluate(m, StageOf(kRecomputeLayernorm), {}, {}, &norms).ok());
  ASSERT_TRUE(planner.Evaluate(m, StageOf(kRecomputeMoeAct), {}, {}, &act).ok());
  EXPECT_DOUBLE_EQ(norms.stage_forward_us, none.stage_forward_us);
  EXPECT_NEAR(norms.stage_backward_us - none.stage_backward_us, 8 * (3.0 + 0.262144), 1e-9);
  EXPECT_NEAR(norms.iteration_us - none.iteration_us, 8 * (3.0 + 0.262144), 1e-6);
  EXPECT_NEAR(norms.compute_us - none.compute_us, 8 * (3.0 + 0.262144), 1e-6);
  const double rows = 8 * 64, shard = 128;
  EXPECT_NEAR(act.stage_backward_us - none.stage_backward_us,
              2 * RoundNumberModel().ActivationUs(3.0 * rows * shard * 2, false), 1e-9);
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(Recompute, FieldRulesNameTheField) {
  const ModelConfig m = Model();
  const ClusterShape c{1, 8};
  EXPECT_TRUE(ValidateLayout(m, StageOf(kRecomputeMlp | kRecomputeMoeAct), 8, c).ok());
  Layout both = StageOf(kRecomputeCoreAttn);
  both.recompute = true;
  EXPECT_EQ(Message(ValidateLayout(m, both, 8, c)),
            "layout.recompute_modules: selective recomputation names modules; full "
            "recomputation (recompute) runs every one: give one of the two (got recompute=true)");
  EXPECT_EQ(Message(ValidateLayout(m, StageOf(kRecomputeMlaUpProj), 8, c)),
            "layout.recompute_modules: names a module the model lacks: the model has no "
            "multi-latent attention (got mla_up_proj)");
  ModelConfig all_moe = m;
  all_moe.moe.layer_pattern = {1, 1, 1, 1};
  EXPECT_EQ(Message(ValidateLayout(all_moe, StageOf(kRecomputeMlp), 8, c)),
            "layout.recompute_modules: names a module the model lacks: every layer is an MoE "
            "layer (mlp is a dense block's MLP) (got mlp)");
  uint8_t bit = 0;
  EXPECT_TRUE(ParseRecomputeModule("moe_act", &bit));
  EXPECT_EQ(bit, kRecomputeMoeAct);
  EXPECT_FALSE(ParseRecomputeModule("moe", &bit));
  for (int i = 0; i < kNumRecomputeModules; ++i) {
    ASSERT_TRUE(ParseRecomputeModule(RecomputeModuleName(i), &bit));
    EXPECT_EQ(bit, 1u << i);
  }
}

}  // namespace
}  // namespace moeplan::planner
