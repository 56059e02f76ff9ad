// Parameter and FLOP accounting (docs/model.md "Accounting").
#include "moeplan/planner/accounting.h"

#include <algorithm>

namespace moeplan::planner {
namespace {

double Norm(const ModelConfig& m, double width) {
  return m.normalization == Normalization::kRmsNorm ? width : 2.0 * width;
}

// The FFN's weight matrices over M * F: 3 with a gated linear unit (gate,
// up, down), else 2.
double FfnMatrices(const ModelConfig& m) { return m.gated_linear_unit ? 3.0 : 2.0; }

double AttentionParams(const ModelConfig& m) {
  const double M = static_cast<double>(m.hidden_size);
  const double h = static_cast<double>(m.num_attention_heads);
  double p = 2.0 * Norm(m, M);  // the block's two norms
  if (m.multi_latent_attention) {
    const MlaSpec& a = m.mla;
    const double qk = static_cast<double>(a.qk_head_dim + a.qk_pos_emb_head_dim);
    const double rq = static_cast<double>(a.q_lora_rank), rkv = static_cast<double>(a.kv_lora_rank);
    p += rq > 0 ? M * rq + Norm(m, rq) + rq * h * qk : M * h * qk;
    p += M * (rkv + static_cast<double>(a.qk_pos_emb_head_dim)) + Norm(m, rkv) +
         rkv * h * static_cast<double>(a.qk_head_dim + a.v_head_dim);
    p += h * static_cast<double>(a.v_head_dim) * M;
  } else {
    const double d = static_cast<double>(m.HeadDim());
    const double g = static_cast<double>(m.QueryGroups());
    const double qkv = (h + 2.0 * g) * d;
    p += M * qkv + h * d * M;
    if (m.add_qkv_bias || m.add_bias_linear) p += qkv;
    if (m.qk_layernorm) p += 2.0 * Norm(m, d);
  }
  if (m.add_bias_linear) p += M;  // the output projection's bias
  return p;
}

double FfnParams(const ModelConfig& m, double width, bool biases) {
  const double M = static_cast<double>(m.hidden_size);
  double p = FfnMatrices(m) * M * width;
  if (biases) p += static_cast<double>(m.FfnInputFactor()) * width + M;
  return p;
}

double BlockTotal(const BlockParamCounts& b, const ModelConfig& m, bool moe) {
  if (!moe) return b.attention + b.ffn;
  return b.attention + b.router + b.shared_experts +
         static_cast<double>(m.moe.num_experts) * b.routed_expert;
}

}  // namespace

BlockParamCounts CountBlockParams(const ModelConfig& m, bool moe) {
  BlockParamCounts b;
  const double M = static_cast<double>(m.hidden_size);
  b.attention = AttentionParams(m);
  if (!moe) {
    b.ffn = FfnParams(m, static_cast<double>(m.ffn_hidden_size), m.add_bias_linear);
    return b;
  }
  b.router = M * static_cast<double>(m.moe.num_experts);
  if (m.moe.SharedFfnSize() > 0) {
    b.shared_experts = FfnParams(m, static_cast<double>(m.moe.SharedFfnSize()), false);
    if (m.moe.shared_expert_gate) b.shared_experts += M;
  }
  b.routed_expert = FfnParams(m, static_cast<double>(m.moe.expert_ffn_hidden_size), false);
  return b;
}

MtpInputParams CountMtpInputParams(const ModelConfig& m) {
  const double M = static_cast<double>(m.hidden_size);
  return {3.0 * Norm(m, M), 2.0 * M * M};
}

ParamCounts CountParams(const ModelConfig& m) {
  const double M = static_cast<double>(m.hidden_size);
  const double V = static_cast<double>(m.vocab_size);
  ParamCounts c;
  c.embedding = m.vocab_size > 0 ? (V + EmbeddingPositions(m)) * M : 0.0;
  c.output_layer = m.untie_embeddings_and_output_weights ? V * M : 0.0;
  const BlockParamCounts dense = CountBlockParams(m, false), moe = CountBlockParams(m, true);
  const double k = static_cast<double>(m.moe.top_k), E = static_cast<double>(m.moe.num_experts);
  for (int blk = 0; blk < m.num_layers; ++blk) {
    const bool is_moe = m.IsMoeBlock(blk);
    c.transformer += BlockTotal(is_moe ? moe : dense, m, is_moe);
    if (is_moe) {
      c.routed_experts += E * moe.routed_expert;
      c.routed_experts_active += k * moe.routed_expert;
    }
  }
  c.transformer += Norm(m, M);  // the final norm
  const bool last_moe = m.IsMoeBlock(m.num_layers - 1);
  // Each depth: its norms and input projection, a block of the last layer's kind.
  const MtpInputParams in = CountMtpInputParams(m);
  c.mtp = m.mtp_num_layers *
          (in.norms + in.projection + BlockTotal(last_moe ? moe : dense, m, last_moe));
  c.total = c.embedding + c.output_layer + c.transformer;
  c.active = c.total - (c.routed_experts - c.routed_experts_active);
  c.total_with_mtp = c.total + c.mtp;
  return c;
}

FlopTerms FlopTermsOf(const ModelConfig& m) {
  const double M = static_cast<double>(m.hidden_size);
  const double h = static_cast<double>(m.num_attention_heads);
  const double s = static_cast<double>(m.seq_length);
  // The attention's weights and its core (QK^T and PV, causal: half of s).
  double attn_linear = 0.0, attn_core = 0.0;
  if (m.multi_latent_attention) {
    const MlaSpec& a = m.mla;
    const double qk = static_cast<double>(a.qk_head_dim + a.qk_pos_emb_head_dim);
    const double rq = static_cast<double>(a.q_lora_rank), rkv = static_cast<double>(a.kv_lora_rank);
    // Megatron-LM counts each latent norm as one more row (the "+ 1").
    const double q = rq > 0 ? rq * (M + h * qk + 1.0) : M * h * qk;
    const double kv = rkv * (M + h * static_cast<double>(a.qk_head_dim + a.v_head_dim) + 1.0);
    const double rope = M * static_cast<double>(a.qk_pos_emb_head_dim);
    const double out = h * static_cast<double>(a.v_head_dim) * M;
    attn_linear = q + kv + rope + out;
    attn_core = 0.5 * h * (qk + static_cast<double>(a.v_head_dim)) * s;
  } else {
    const double d = static_cast<double>(m.HeadDim());
    const double g = static_cast<double>(m.QueryGroups());
    attn_linear = M * (h * d + 2.0 * g * d) + h * d * M;
    attn_core = h * d * s;  // (1/2 causal) x (2 GEMMs)
  }
  const double c = FfnMatrices(m);
  FlopTerms t;
  t.attention = attn_linear + attn_core;
  t.dense_ffn = M * c * static_cast<double>(m.ffn_hidden_size);
  t.moe_ffn =
      M * c *
      (static_cast<double>(m.moe.expert_ffn_hidden_size) * static_cast<double>(m.moe.top_k) +
       static_cast<double>(m.moe.SharedFfnSize()));
  t.mtp_input = 3.0 * M + 2.0 * M * M;
  t.output_layer = M * static_cast<double>(m.vocab_size);
  return t;
}

double FlopsPerToken(const ModelConfig& m) {
  const FlopTerms t = FlopTermsOf(m);
  const double D = m.mtp_num_layers;
  const int moe_layers = m.NumMoeLayers();
  const bool last_moe = m.IsMoeBlock(m.num_layers - 1);
  const double n_moe = moe_layers + (last_moe ? D : 0.0);
  const double n_dense = (m.num_layers - moe_layers) + (last_moe ? 0.0 : D);
  const double n_attn = m.num_layers + D;
  const double per_token = n_attn * t.attention + n_dense * t.dense_ffn + n_moe * t.moe_ffn +
                           D * t.mtp_input + t.output_layer * (D + 1.0);
  return 6.0 * per_token;
}

double EmbeddingPositions(const ModelConfig& m) {
  return m.position_embedding_type == PositionEmbedding::kLearnedAbsolute
             ? static_cast<double>(m.seq_length)
             : 0.0;
}

RankDims DimsOf(const ModelConfig& m) {
  const int64_t t = m.parallel.mp;
  RankDims d;
  d.heads = m.num_attention_heads / t;
  if (m.multi_latent_attention) {
    const MlaSpec& a = m.mla;
    d.groups = d.heads;
    d.qk = a.qk_head_dim + a.qk_pos_emb_head_dim;
    d.v = a.v_head_dim;
    d.q_lora = a.q_lora_rank;
    d.kv_lora = a.kv_lora_rank;
    d.rope = a.qk_pos_emb_head_dim;
    d.q_up = d.heads * d.qk;
    d.kv_up = d.heads * (a.qk_head_dim + a.v_head_dim);
  } else {
    d.groups = std::max<int64_t>(1, m.QueryGroups() / t);
    d.qk = d.v = m.HeadDim();
    d.qkv = (d.heads + 2 * d.groups) * d.qk;
  }
  d.attn_out = d.heads * d.v;
  d.ffn = m.ffn_hidden_size / t;
  d.ffn_in = m.FfnInputFactor() * d.ffn;
  d.shared = m.moe.SharedFfnSize() / t;
  d.shared_in = m.FfnInputFactor() * d.shared;
  d.vocab = m.vocab_size / t;
  return d;
}

RankParams BlockParams(const ModelConfig& m, int block) {
  const double M = static_cast<double>(m.hidden_size), t = m.parallel.mp;
  const bool moe = m.IsMoeBlock(block);
  const BlockParamCounts b = CountBlockParams(m, moe);
  // Held whole by every tensor-parallel rank: norms, the output projection's
  // bias, MLA's down projections and their norms, the router, the shared
  // experts' gate; everything else is split t ways.
  double replicated = 2.0 * Norm(m, M) + (m.add_bias_linear ? M : 0.0);
  if (m.multi_latent_attention) {
    const MlaSpec& a = m.mla;
    const double rq = static_cast<double>(a.q_lora_rank), rkv = static_cast<double>(a.kv_lora_rank);
    if (rq > 0) replicated += M * rq + Norm(m, rq);
    replicated += M * (rkv + static_cast<double>(a.qk_pos_emb_head_dim)) + Norm(m, rkv);
  } else if (m.qk_layernorm) {
    replicated += 2.0 * Norm(m, static_cast<double>(m.HeadDim()));
  }
  RankParams r;
  r.dense = (b.attention - replicated) / t + replicated;
  if (!moe) {
    const double bias = m.add_bias_linear ? M : 0.0;
    r.dense += (b.ffn - bias) / t + bias;
    return r;
  }
  const double gate = m.moe.shared_expert_gate ? M : 0.0;
  r.dense += b.router + (b.shared_experts - gate) / t + gate;
  r.expert =
      static_cast<double>(m.moe.num_experts / m.parallel.ep) * b.routed_expert / m.parallel.esp;
  return r;
}

Throughput ThroughputOf(double flops_per_token, double tokens, double iteration_us, int gpus,
                        double peak_tflops) {
  Throughput t;
  if (!(iteration_us > 0.0) || gpus < 1) return t;
  t.tokens_per_s_per_gpu = tokens / (iteration_us * 1e-6) / gpus;
  t.tflops_per_gpu = flops_per_token * t.tokens_per_s_per_gpu / 1e12;
  t.mfu = peak_tflops > 0.0 ? t.tflops_per_gpu / peak_tflops : 0.0;
  return t;
}

double DensePeakTflops(const ClusterProfile& profile, int bytes_per_element) {
  return bytes_per_element == 1 && profile.gemm.fp8_peak_tflops > 0.0 ? profile.gemm.fp8_peak_tflops
                                                                      : profile.gemm.peak_tflops;
}

}  // namespace moeplan::planner
