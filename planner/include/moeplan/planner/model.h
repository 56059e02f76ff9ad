// Whole models (docs/model.md) as their users describe them: a transformer
// with an MoE layer every `layer_freq` blocks, its field rules, and the
// parameters one rank holds. Planning them is model_planner.h; layouts and
// the search are layout.h and layout_planner.h.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "moeplan/planner/types.h"

namespace moeplan::planner {

// How tokens are routed. Top-k and switch route each token on its own, so the
// gate may be split into micro-batches; batch-prioritized routing ranks all
// tokens of the batch first, so nothing before it can be partitioned with it.
enum class Gate : uint8_t { kTopK = 0, kSwitch = 1, kBatchPrioritized = 2 };
std::string_view GateName(Gate g);  // "top_k", "switch", "batch_prioritized"

struct MoeSpec {
  // Block i is an MoE block iff i % layer_freq == 0 (Megatron-LM), unless
  // layer_pattern is given: one entry per block, 1 for MoE (layer_freq 0).
  int layer_freq = 1;
  std::vector<uint8_t> layer_pattern;
  int64_t num_experts = 0;
  int64_t top_k = 1;
  double capacity_factor = 1.0;  // 0 when dropless
  int64_t expert_ffn_hidden_size = 0;
  int64_t shared_expert_ffn_hidden_size = 0;  // each shared expert's; 0: none
  int64_t num_shared_experts = 0;             // 0: 1 when a size is given
  bool shared_expert_gate = false;            // a sigmoid gate scales their output (Qwen2)
  int64_t router_num_groups = 0;              // group-limited routing; 0: none
  int64_t router_group_topk = 0;
  bool dropless = false;
  double token_skew = 1.0;
  bool router_force_load_balancing = false;
  Gate gate = Gate::kTopK;

  // Every shared expert's FFN size together (Megatron-LM's
  // moe_shared_expert_intermediate_size).
  int64_t SharedFfnSize() const {
    return (num_shared_experts > 0 ? num_shared_experts : 1) * shared_expert_ffn_hidden_size;
  }
};

// Multi-head latent attention (DeepSeek-V2/V3). q_lora_rank 0: queries are
// projected from the hidden state directly.
struct MlaSpec {
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_head_dim = 0;
  int64_t qk_pos_emb_head_dim = 0;
  int64_t v_head_dim = 0;
};

enum class Normalization : uint8_t { kLayerNorm = 0, kRmsNorm = 1 };
std::string_view NormalizationName(Normalization n);  // "LayerNorm", "RMSNorm"
enum class AttentionBackend : uint8_t { kUnfused = 0, kFlash = 1, kFused = 2 };
std::string_view AttentionBackendName(AttentionBackend a);  // "unfused", "flash", "fused"
enum class PositionEmbedding : uint8_t { kLearnedAbsolute = 0, kRope = 1, kNone = 2 };
std::string_view PositionEmbeddingName(PositionEmbedding p);  // "learned_absolute", "rope", "none"

// FP8 training (Megatron-Core's --fp8-format, --fp8-recipe; docs/model.md
// "FP8"): the linear layers' GEMMs at the FP8 peak, their inputs quantized by
// memory-bound casts; activations, attention, communication and the optimizer
// stay in bytes_per_element. kNone: no FP8.
enum class Fp8Format : uint8_t { kNone = 0, kE4M3 = 1, kHybrid = 2 };
inline constexpr Fp8Format kAllFp8Formats[] = {Fp8Format::kNone, Fp8Format::kE4M3,
                                               Fp8Format::kHybrid};
std::string_view Fp8FormatName(Fp8Format f);  // "none", "e4m3", "hybrid"
bool ParseFp8Format(std::string_view name, Fp8Format* out);
// How scales are kept; priced alike (the casts' traffic), printed as the
// launcher's --fp8-recipe.
enum class Fp8Recipe : uint8_t { kDelayed = 0, kTensorwise = 1, kBlockwise = 2, kMxfp8 = 3 };
inline constexpr Fp8Recipe kAllFp8Recipes[] = {Fp8Recipe::kDelayed, Fp8Recipe::kTensorwise,
                                               Fp8Recipe::kBlockwise, Fp8Recipe::kMxfp8};
std::string_view Fp8RecipeName(Fp8Recipe r);  // "delayed", "tensorwise", "blockwise", "mxfp8"
bool ParseFp8Recipe(std::string_view name, Fp8Recipe* out);

// One transformer as Megatron-LM users describe it. Sizes are element counts.
struct ModelConfig {
  std::string name;
  int num_layers = 0;
  int64_t hidden_size = 0;          // M
  int64_t num_attention_heads = 0;  // h
  int64_t ffn_hidden_size = 0;      // F of the dense FFN blocks
  int64_t seq_length = 0;           // L
  int64_t micro_batch_size = 0;     // B, sequences per micro-batch on one MP group
  int64_t vocab_size = 0;           // 0: no embedding, LM head or loss ops
  int bytes_per_element = 2;
  MoeSpec moe;
  ParallelLayout parallel;
  int64_t global_batch_size = 0;   // sequences per iteration; 0: micro_batch_size * parallel.dp
  int64_t num_query_groups = 0;    // key/value heads (GQA); 0: num_attention_heads
  int64_t kv_channels = 0;         // head size; 0: hidden_size / num_attention_heads
  bool gated_linear_unit = false;  // SwiGLU FFNs (dense and experts)
  bool multi_latent_attention = false;
  MlaSpec mla;  // when multi_latent_attention
  bool untie_embeddings_and_output_weights = false;
  int mtp_num_layers = 0;
  bool add_qkv_bias = false;
  Normalization normalization = Normalization::kLayerNorm;
  bool qk_layernorm = false;
  bool add_bias_linear = true;
  PositionEmbedding position_embedding_type = PositionEmbedding::kLearnedAbsolute;
  AttentionBackend attention_backend = AttentionBackend::kUnfused;
  Fp8Format fp8_format = Fp8Format::kNone;
  Fp8Recipe fp8_recipe = Fp8Recipe::kDelayed;
  // Megatron-Core's --fp8-param-gather: FP8 weights held (1 byte each) and
  // gathered after the optimizer step in FP8.
  bool fp8_param_gather = false;

  bool Fp8() const { return fp8_format != Fp8Format::kNone; }
  // A flash / fused attention kernel: no L x L tensor in memory.
  bool FusedAttention() const { return attention_backend != AttentionBackend::kUnfused; }
  // A dense model (Llama, GPT): no MoE layer at all; moe is left unset
  // (num_experts 0) and parallel.ep / esp are 1.
  bool IsDense() const { return moe.num_experts == 0; }
  // Blocks from num_layers on are the MTP depths': of the last layer's kind.
  bool IsMoeBlock(int block) const {
    if (IsDense()) return false;
    if (block >= num_layers) block = num_layers - 1;
    if (!moe.layer_pattern.empty()) {
      return block >= 0 && block < static_cast<int>(moe.layer_pattern.size()) &&
             moe.layer_pattern[static_cast<size_t>(block)] != 0;
    }
    return block % moe.layer_freq == 0;
  }
  int NumMoeLayers() const;
  // The MoE layer every MoE block runs (a LayerConfig for the schedule
  // builders); of a dense model, a placeholder no block runs.
  LayerConfig MoeLayer() const;
  int64_t GlobalBatch() const {
    return global_batch_size > 0 ? global_batch_size : micro_batch_size * parallel.dp;
  }
  int64_t QueryGroups() const {
    return num_query_groups > 0 ? num_query_groups : num_attention_heads;
  }
  int64_t HeadDim() const {
    return kv_channels > 0 ? kv_channels : hidden_size / num_attention_heads;
  }
  // The FFNs' first GEMM's output over the FFN size: 2 with a gated linear unit.
  int64_t FfnInputFactor() const { return gated_linear_unit ? 2 : 1; }
};

// Field rules, errors InvalidArgument "<json field>: <rule> (got ...)" with the
// model file's field names ("moe.num_experts", "parallel.ep").
absl::Status ValidateModel(const ModelConfig& model, const ClusterShape& cluster);
// The same rules without parallel.* (layouts are checked by ValidateLayout).
// Planning code below the request layer (ModelPlanner::PlanStage,
// LayoutPlanner) trusts a model that passed it and does not check it again.
absl::Status ValidateModelShape(const ModelConfig& model);
// The part of ValidateModelShape that depends on micro_batch_size: the MoE
// layer's own rules (dimensions, buffer bounds) on one rank. ValidateLayout
// runs it at the layout's micro-batch.
absl::Status ValidateModelMoeLayer(const ModelConfig& model);

// The widths one tensor-parallel rank's ops work on (t = parallel.mp): heads
// and FFNs split t ways; MLA's down projections whole on every rank.
struct RankDims {
  int64_t heads = 0;   // query heads
  int64_t groups = 0;  // key/value heads (GQA), at least 1
  int64_t qk = 0;      // a head's query/key size (MLA: qk_head_dim + qk_pos_emb_head_dim)
  int64_t v = 0;       // a head's value size
  int64_t qkv = 0;     // standard attention's fused QKV projection: (heads + 2 groups) x qk
  // MLA: down projections (whole) and up projections (split).
  int64_t q_lora = 0, kv_lora = 0, rope = 0;
  int64_t q_up = 0;                   // heads x qk
  int64_t kv_up = 0;                  // heads x (qk_head_dim + v)
  int64_t attn_out = 0;               // the output projection's input: heads x v
  int64_t ffn = 0, ffn_in = 0;        // dense FFN, its first GEMM's output (2x with GLU)
  int64_t shared = 0, shared_in = 0;  // all shared experts together
  int64_t vocab = 0;
};
RankDims DimsOf(const ModelConfig& model);
// Rows of the learned position embedding: seq_length, or 0 (rope, none).
double EmbeddingPositions(const ModelConfig& model);

// Parameters one rank holds (element counts): dense ones split by
// parallel.mp (attention, norms, dense FFNs, gates, shared experts, and the
// embedding / LM head where held), and its E/ep local experts' 1/esp shards.
struct RankParams {
  double dense = 0.0;
  double expert = 0.0;
  double total() const { return dense + expert; }
};
RankParams BlockParams(const ModelConfig& model, int block);

// ---- Hashing: every field, so that a cache keyed by it cannot forget one ----
//
// Each function names every field of its struct with a structured binding:
// adding a field without hashing it fails to compile here (ParallelLayout's
// is in types.h). Caches of derived costs key on these (ModelPlanner's range
// costs); tests/planner/model_test.cc checks that each field moves the hash.

template <typename H>
H AbslHashValue(H h, const MoeSpec& s) {
  const auto& [layer_freq, layer_pattern, num_experts, top_k, capacity_factor,
               expert_ffn_hidden_size, shared_expert_ffn_hidden_size, num_shared_experts,
               shared_expert_gate, router_num_groups, router_group_topk, dropless, token_skew,
               router_force_load_balancing, gate] = s;
  return H::combine(std::move(h), layer_freq, layer_pattern, num_experts, top_k, capacity_factor,
                    expert_ffn_hidden_size, shared_expert_ffn_hidden_size, num_shared_experts,
                    shared_expert_gate, router_num_groups, router_group_topk, dropless, token_skew,
                    router_force_load_balancing, static_cast<uint8_t>(gate));
}

template <typename H>
H AbslHashValue(H h, const MlaSpec& s) {
  const auto& [q_lora_rank, kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim, v_head_dim] = s;
  return H::combine(std::move(h), q_lora_rank, kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim,
                    v_head_dim);
}

template <typename H>
H AbslHashValue(H h, const ModelConfig& m) {
  const auto& [name, num_layers, hidden_size, num_attention_heads, ffn_hidden_size, seq_length,
               micro_batch_size, vocab_size, bytes_per_element, moe, parallel, global_batch_size,
               num_query_groups, kv_channels, gated_linear_unit, multi_latent_attention, mla,
               untie_embeddings_and_output_weights, mtp_num_layers, add_qkv_bias, normalization,
               qk_layernorm, add_bias_linear, position_embedding_type, attention_backend,
               fp8_format, fp8_recipe, fp8_param_gather] = m;
  return H::combine(
      std::move(h), name, num_layers, hidden_size, num_attention_heads, ffn_hidden_size, seq_length,
      micro_batch_size, vocab_size, bytes_per_element, moe, parallel, global_batch_size,
      num_query_groups, kv_channels, gated_linear_unit, multi_latent_attention, mla,
      untie_embeddings_and_output_weights, mtp_num_layers, add_qkv_bias,
      static_cast<uint8_t>(normalization), qk_layernorm, add_bias_linear,
      static_cast<uint8_t>(position_embedding_type), static_cast<uint8_t>(attention_backend),
      static_cast<uint8_t>(fp8_format), static_cast<uint8_t>(fp8_recipe), fp8_param_gather);
}

}  // namespace moeplan::planner
