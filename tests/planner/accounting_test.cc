// Parameter and FLOP accounting (planner/accounting.h) against the model
// cards' published counts and Megatron-LM's FLOPs formula, each worked by
// hand here from the models' published config.json values.
#include "moeplan/planner/accounting.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "moeplan/planner/model.h"

namespace moeplan::planner {
namespace {

// A model as today's Hugging Face configs state it: SwiGLU, RMSNorm, rope,
// untied, no linear biases, every layer MoE.
ModelConfig Modern(int layers, int64_t hidden, int64_t heads, int64_t groups, int64_t head_dim,
                   int64_t experts, int64_t top_k, int64_t expert_ffn, int64_t vocab) {
  ModelConfig m;
  m.name = "m";
  m.num_layers = layers;
  m.hidden_size = hidden;
  m.num_attention_heads = heads;
  m.num_query_groups = groups;
  m.kv_channels = head_dim;
  m.ffn_hidden_size = expert_ffn;
  m.seq_length = 4096;
  m.micro_batch_size = 1;
  m.vocab_size = vocab;
  m.gated_linear_unit = true;
  m.normalization = Normalization::kRmsNorm;
  m.position_embedding_type = PositionEmbedding::kRope;
  m.untie_embeddings_and_output_weights = true;
  m.add_bias_linear = false;
  m.moe.num_experts = experts;
  m.moe.top_k = top_k;
  m.moe.expert_ffn_hidden_size = expert_ffn;
  m.moe.dropless = true;
  m.moe.capacity_factor = 0.0;
  return m;
}

ModelConfig Mixtral8x7B() { return Modern(32, 4096, 32, 8, 128, 8, 2, 14336, 32000); }
ModelConfig Mixtral8x22B() { return Modern(56, 6144, 48, 8, 128, 8, 2, 16384, 32000); }
ModelConfig Qwen3_30B_A3B() {
  ModelConfig m = Modern(48, 2048, 32, 4, 128, 128, 8, 768, 151936);
  m.qk_layernorm = true;
  return m;
}
ModelConfig Qwen3_235B_A22B() {
  ModelConfig m = Modern(94, 4096, 64, 4, 128, 128, 8, 1536, 151936);
  m.qk_layernorm = true;
  return m;
}
ModelConfig DeepSeekV3() {
  ModelConfig m = Modern(61, 7168, 128, 0, 0, 256, 8, 2048, 129280);
  m.ffn_hidden_size = 18432;
  m.multi_latent_attention = true;
  m.mla = {.q_lora_rank = 1536,
           .kv_lora_rank = 512,
           .qk_head_dim = 128,
           .qk_pos_emb_head_dim = 64,
           .v_head_dim = 128};
  m.moe.layer_freq = 0;
  m.moe.layer_pattern.assign(61, 1);
  for (int i = 0; i < 3; ++i) m.moe.layer_pattern[static_cast<size_t>(i)] = 0;
  m.moe.num_shared_experts = 1;
  m.moe.shared_expert_ffn_hidden_size = 2048;
  m.moe.router_num_groups = 8;
  m.moe.router_group_topk = 4;
  m.mtp_num_layers = 1;
  return m;
}

// Within `pct` percent of a published figure.
void Near(double got, double published, double pct) {
  EXPECT_LE(std::abs(got / published - 1.0) * 100.0, pct)
      << "got " << got << ", published " << published;
}

TEST(AccountingTest, MixtralMatchesTheModelCards) {
  // Per layer: q and o 4096x4096, k and v 4096x1024, two norms; a router
  // 4096x8; eight experts of three 4096x14336 matrices.
  const double attn = 2.0 * 4096 * 4096 + 2.0 * 4096 * 1024 + 2 * 4096;
  const double expert = 3.0 * 4096 * 14336;
  const double layer = attn + 4096.0 * 8 + 8 * expert;
  const double embed = 32000.0 * 4096;
  const ParamCounts c = CountParams(Mixtral8x7B());
  EXPECT_DOUBLE_EQ(c.total, 32 * layer + 4096 + 2 * embed);
  EXPECT_DOUBLE_EQ(c.total, 46'702'792'704.0);
  EXPECT_DOUBLE_EQ(c.active, c.total - 32 * 6 * expert);
  EXPECT_DOUBLE_EQ(c.embedding, embed);
  EXPECT_DOUBLE_EQ(c.output_layer, embed);
  Near(c.total, 46.7e9, 1.0);   // "46.7B total parameters"
  Near(c.active, 12.9e9, 1.0);  // "12.9B parameters per token"

  const ParamCounts big = CountParams(Mixtral8x22B());
  const double attn22 = 2.0 * 6144 * 6144 + 2.0 * 6144 * 1024 + 2 * 6144;
  const double expert22 = 3.0 * 6144 * 16384;
  EXPECT_DOUBLE_EQ(big.total,
                   56 * (attn22 + 6144.0 * 8 + 8 * expert22) + 6144 + 2 * 32000.0 * 6144);
  Near(big.total, 141e9, 1.0);  // "141B"
  Near(big.active, 39e9, 1.0);  // "39B active"
}

TEST(AccountingTest, Qwen3MatchesTheModelCardsExactly) {
  // Head size 128 (not 2048 / 32), 4 key/value heads, per-head q/k norms.
  const ParamCounts c = CountParams(Qwen3_30B_A3B());
  const double attn = 2048.0 * (32 + 8) * 128 + 32.0 * 128 * 2048 + 2 * 128 + 2 * 2048;
  const double expert = 3.0 * 2048 * 768;
  const double layer = attn + 2048.0 * 128 + 128 * expert;
  EXPECT_DOUBLE_EQ(c.total, 48 * layer + 2048 + 2 * 151936.0 * 2048);
  EXPECT_DOUBLE_EQ(c.total, 30'532'122'624.0);  // Hugging Face's num_parameters()
  EXPECT_DOUBLE_EQ(c.active, c.total - 48 * 120 * expert);
  Near(c.total, 30.5e9, 1.0);
  Near(c.active, 3.3e9, 2.0);  // 3.35 B: "3.3B" rounds down
  EXPECT_DOUBLE_EQ(CountParams(Qwen3_235B_A22B()).total, 235'093'634'560.0);
  Near(CountParams(Qwen3_235B_A22B()).active, 22e9, 1.0);
}

TEST(AccountingTest, DeepSeekV3MatchesTheModelCard) {
  const ModelConfig m = DeepSeekV3();
  // MLA: q down 7168x1536 (+ norm), q up 1536 x 128 heads x (128 + 64); kv
  // down 7168 x (512 + 64) (+ norm), kv up 512 x 128 x (128 + 128); out
  // 128 x 128 x 7168; the block's two norms.
  const double mla = 7168.0 * 1536 + 1536 + 1536.0 * 128 * 192 + 7168.0 * 576 + 512 +
                     512.0 * 128 * 256 + 128.0 * 128 * 7168 + 2 * 7168;
  EXPECT_DOUBLE_EQ(mla - 2 * 7168, 187'107'328.0);
  const double dense = mla + 3.0 * 7168 * 18432;
  const double expert = 3.0 * 7168 * 2048;
  const double moe = mla + 256.0 * 7168 + expert + 256 * expert;
  const double embed = 129280.0 * 7168;
  const ParamCounts c = CountParams(m);
  EXPECT_DOUBLE_EQ(c.total, 3 * dense + 58 * moe + 7168 + 2 * embed);
  EXPECT_DOUBLE_EQ(c.total, 671'026'404'352.0);
  Near(c.total, 671e9, 1.0);
  // The weights' README: 36.6 B activated, the output layer in, the input
  // embedding out (the card's "37B" rounds this or adds the embedding).
  EXPECT_DOUBLE_EQ(c.active, c.total - 58 * 248 * expert);
  Near(c.active - c.embedding, 36.6e9, 1.0);
  // One MTP depth: an MoE block, 2M x M projection, three norms; 685 B on
  // the Hub also stores the depth's copies of the embedding and head.
  EXPECT_DOUBLE_EQ(c.mtp, moe + 2.0 * 7168 * 7168 + 3 * 7168);
  Near(c.total_with_mtp, 685e9, 1.0);
}

TEST(AccountingTest, FlopsPerTokenFollowMegatron) {
  // DeepSeek-V3 at sequence 4096, by Megatron-LM's terms: 62 attention
  // layers (61 + the MTP depth), MLA's linear part (its latent norms counted
  // as one row each) and its causal core; 3 dense FFNs and 59 MoE ones (the
  // MTP depth is of the last layer's kind) at top-8 routed plus the shared;
  // the MTP projection and norms; two output layers.
  const double s = 4096, h = 7168, n = 128, V = 129280;
  const double q = 1536 * (h + n * 192 + 1), kv = 512 * (h + n * 256 + 1);
  const double attn_linear = q + kv + h * 64 + n * 128 * h;
  const double attn_core = 0.5 * n * (192 + 128) * s;
  const double expected = 6 * (62 * (attn_linear + attn_core) + 3 * h * 3 * 18432 +
                               59 * h * 3 * (2048 * 8 + 2048) + (3 * h + 2 * h * h) + 2 * h * V);
  const double ds = FlopsPerToken(DeepSeekV3());
  EXPECT_DOUBLE_EQ(ds, expected);
  EXPECT_NEAR(ds / 1e9, 260.0, 0.05);
  // Published: 368 TFLOP/s/GPU at 1,412 tokens/s/GPU = 260.6 GFLOP per token.
  Near(ds, 368e12 / 1412, 2.0);

  // Qwen3-235B-A22B at 4096: GQA projections (64 query, 4 key/value heads
  // of 128) and core, 8 of 128 experts, no shared expert, one output layer.
  const double h2 = 4096;
  const double linear = h2 * (64 * 128 + 2 * 4 * 128) + 64 * 128 * h2;
  const double qwen = 6 * (94 * (linear + 64 * 128 * s) + 94 * h2 * 3 * 1536 * 8 + h2 * 151936);
  EXPECT_DOUBLE_EQ(FlopsPerToken(Qwen3_235B_A22B()), qwen);
  Near(qwen, 150e9, 2.0);  // "about 150 GFLOP per token"
}

TEST(AccountingTest, LegacyModelsCountTheirBiasesAndLearnedPositions) {
  // A GPT-style block: LayerNorm (weight and bias), biased linears, GELU FFN
  // of 4M, learned positions, tied head.
  ModelConfig m;
  m.num_layers = 2;
  m.hidden_size = 64;
  m.num_attention_heads = 4;
  m.ffn_hidden_size = 256;
  m.seq_length = 32;
  m.micro_batch_size = 1;
  m.vocab_size = 100;
  m.moe = {.layer_freq = 2, .num_experts = 4, .top_k = 1, .expert_ffn_hidden_size = 128};
  const double M = 64;
  const double attn = 4 * M + 3 * M * M + 3 * M + M * M + M;
  const ParamCounts c = CountParams(m);
  EXPECT_DOUBLE_EQ(c.transformer,
                   (attn + 2 * M * 256 + 256 + M) + (attn + M * 4 + 4 * 2 * M * 128) + 2 * M);
  EXPECT_DOUBLE_EQ(c.embedding, (100 + 32) * M);
  EXPECT_DOUBLE_EQ(c.output_layer, 0.0);
  EXPECT_DOUBLE_EQ(c.active, c.total - 3 * 2 * M * 128);
}

// What the ranks hold adds up to the model: every block's and the
// embedding's parameters over the tensor-parallel ranks and expert shards.
TEST(AccountingTest, RankParamsAddUpToTheModel) {
  for (ModelConfig m : {Mixtral8x7B(), Qwen3_30B_A3B(), DeepSeekV3()}) {
    m.parallel = {.mp = 1, .ep = 1, .esp = 1, .dp = 1, .pp = 1};
    double held = 0.0;
    for (int blk = 0; blk < m.num_layers; ++blk) held += BlockParams(m, blk).total();
    const ParamCounts c = CountParams(m);
    const double norm = static_cast<double>(m.hidden_size);
    EXPECT_DOUBLE_EQ(held + norm, c.transformer) << m.name;
    // Split two ways: the split parts halve, the replicated ones stay.
    m.parallel = {.mp = 2, .ep = 2, .esp = 1, .dp = 1, .pp = 1};
    double split = 0.0;
    for (int blk = 0; blk < m.num_layers; ++blk) split += BlockParams(m, blk).total();
    EXPECT_GT(split, held / 2);
    EXPECT_LT(split, held / 2 * 1.05);
  }
}

TEST(AccountingTest, ThroughputAndMfu) {
  // 1,412 tokens/s/GPU at 260.6 GFLOP per token on a 989.5 TFLOP/s GPU.
  const Throughput t = ThroughputOf(260.6e9, 1412.0 * 8 * 2.0, 2e6, 8, 989.5);
  EXPECT_DOUBLE_EQ(t.tokens_per_s_per_gpu, 1412.0);
  EXPECT_NEAR(t.tflops_per_gpu, 367.97, 0.01);
  EXPECT_NEAR(t.mfu, 367.97 / 989.5, 1e-4);
  EXPECT_EQ(ThroughputOf(1e9, 1.0, 0.0, 8, 1.0).tflops_per_gpu, 0.0);
}

}  // namespace
}  // namespace moeplan::planner
