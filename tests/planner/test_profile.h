// The hand-made profile the planner tests compute expectations from: round
// numbers so every cost can be checked by hand.
//   4 nodes x 8 GPUs; intra alpha 2 us, beta 0.001 us/B; inter alpha 10 us,
//   beta 0.01 us/B; GEMM peak 100 TFLOP/s = 1e8 flop/us, overhead 5 us, no
//   efficiency grid (efficiency 1); memory 1000 GB/s = 1e6 B/us, overhead 3 us.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <utility>

#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/profile.h"
#include "moeplan/planner/types.h"

// Relative tolerance of 1e-9 (absolute near zero).
#define EXPECT_REL(actual, expected) \
  EXPECT_NEAR((actual), (expected), 1e-9 * std::max(1.0, std::abs(double(expected))))

namespace moeplan::planner::testing {

inline ClusterProfile RoundNumberProfile() {
  ClusterProfile p;
  p.name = "test-4x8";
  p.version = 1;
  p.source = ProfileSource::kSpec;
  p.shape = {4, 8};
  p.intra = {2.0, 0.001};
  p.inter = {10.0, 0.01};
  p.gemm.peak_tflops = 100.0;
  p.gemm.launch_overhead_us = 5.0;
  p.memory.bandwidth_gbytes_per_s = 1000.0;
  p.memory.launch_overhead_us = 3.0;
  return p;
}

// A shared model of RoundNumberProfile().
inline const CostModel& RoundNumberModel() {
  static const CostModel* m = [] {
    absl::StatusOr<CostModel> c = CostModel::Create(RoundNumberProfile());
    if (!c.ok()) std::abort();
    return new CostModel(*std::move(c));
  }();
  return *m;
}

// A small layer valid for every schedule on RoundNumberProfile():
// S = B*L = 4*256 = 1024 tokens, M = 256, H = 1024, E = 16, k = 2, f = 1, b = 2:
// T = 2*1024/16 = 128 (divisible by 2, 4, 8), X = 1024*256*2 = 524288 B,
// D = 16*128*256*2 = 1048576 B.
inline LayerConfig SmallLayer(int mp, int ep, int esp, int dp) {
  LayerConfig l;
  l.name = "moe";
  l.batch_size = 4;
  l.seq_len = 256;
  l.model_dim = 256;
  l.hidden_dim = 1024;
  l.num_experts = 16;
  l.top_k = 2;
  l.capacity_factor = 1.0;
  l.bytes_per_element = 2;
  l.token_skew = 1.0;
  l.parallel = {.mp = mp, .ep = ep, .esp = esp, .dp = dp, .pp = 1};
  return l;
}

// A small dense model (Llama-like: GQA, SwiGLU, RMSNorm, RoPE, no biases) of
// 4 blocks, TP `mp` over 8 GPUs.
inline ModelConfig SmallDenseModel(int mp = 2) {
  ModelConfig m;
  m.name = "dense";
  m.num_layers = 4;
  m.hidden_size = 256;
  m.num_attention_heads = 8;
  m.num_query_groups = 2;
  m.ffn_hidden_size = 512;
  m.gated_linear_unit = true;
  m.seq_length = 128;
  m.micro_batch_size = 2;
  m.vocab_size = 1024;
  m.normalization = Normalization::kRmsNorm;
  m.position_embedding_type = PositionEmbedding::kRope;
  m.add_bias_linear = false;
  m.moe.num_experts = 0;  // dense
  m.parallel = {.mp = mp, .ep = 1, .esp = 1, .dp = 8 / mp, .pp = 1};
  return m;
}

// The same model with MoE layers in blocks 2 and 3 only (8 experts, top 2,
// EP 8): blocks 0 and 1 are dense blocks of an MoE model.
inline ModelConfig SmallDenseFirstModel(int mp = 2) {
  ModelConfig m = SmallDenseModel(mp);
  m.moe.layer_freq = 0;
  m.moe.layer_pattern = {0, 0, 1, 1};
  m.moe.num_experts = 8;
  m.moe.top_k = 2;
  m.moe.capacity_factor = 1.0;
  m.moe.expert_ffn_hidden_size = 256;
  m.parallel.ep = 8;
  m.parallel.esp = 1;
  return m;
}

// A small multi-latent attention (DeepSeek-V2/V3's MLA at toy sizes).
inline MlaSpec SmallMla() {
  return {.q_lora_rank = 96,
          .kv_lora_rank = 64,
          .qk_head_dim = 32,
          .qk_pos_emb_head_dim = 16,
          .v_head_dim = 32};
}

}  // namespace moeplan::planner::testing
