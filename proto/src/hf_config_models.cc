// The mapping of each Hugging Face model type onto moeplan.v1.ModelConfig
// (docs/model.md "Hugging Face config.json"), with transformers' semantics and
// its config classes' defaults for absent keys. The model's shape (sizes,
// layers, heads, vocabulary, experts, top-k, expert sizes, MLA ranks) must be
// in the file: a class default there would be another model's.
#include <algorithm>
#include <string>
#include <vector>

#include "hf_config_internal.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"

namespace moeplan::proto::internal {
namespace {

bool IsDeepseek(HfType t) { return t == HfType::kDeepseekV2 || t == HfType::kDeepseekV3; }
bool IsDense(HfType t) { return t == HfType::kLlama || t == HfType::kQwen3; }

absl::Status Bad(std::string_view key, std::string_view rule, std::string_view got) {
  return absl::InvalidArgumentError(Cat(key, ": ", rule, " (got ", got, ")"));
}

// What the model type fixes without a key of its own.
std::string TypeNote(HfType t) {
  std::string note = Cat("mapping of ", HfTypeName(t),
                         ": normalization \"RMSNorm\", position_embedding_type \"rope\", "
                         "attention_backend \"flash\" (Megatron-Core's default picks a fused "
                         "kernel), add_bias_linear false");
  note += IsDense(t) ? ", dense (no moe)" : ", moe.gate GATE_TOP_K, moe.dropless true";
  if (t == HfType::kQwen3Moe || t == HfType::kOlmoe || t == HfType::kQwen3) {
    note += ", qk_layernorm true";
  }
  if (IsDeepseek(t)) note += ", multi_latent_attention";
  return note;
}

// Grouped-query attention (every type but DeepSeek's MLA). The default of
// num_key_value_heads is the config class's: 8 (Mixtral), 16 (Qwen2-MoE), 4
// (Qwen3-MoE), num_attention_heads (OLMoE).
absl::Status MapAttentionHeads(HfType type, HfReader& r, int64_t hidden, int64_t heads,
                               v1::ModelConfig* m) {
  const int64_t fallback = type == HfType::kMixtral    ? 8
                           : type == HfType::kQwen2Moe ? 16
                           : type == HfType::kQwen3Moe ? 4
                           : type == HfType::kQwen3    ? 32
                                                       : heads;
  MOEPLAN_ASSIGN_OR_RETURN(const int64_t kv,
                           r.IntOr("num_key_value_heads", 1, kHfMaxDim, fallback));
  if (kv != heads) m->set_num_query_groups(static_cast<int32_t>(kv));
  const std::string kv_note = kv != heads ? Cat("num_query_groups = ", kv)
                                          : "num_query_groups unset (= num_attention_heads)";
  if (r.Given("num_key_value_heads")) {
    r.Use("num_key_value_heads", kv_note, "num_query_groups");
  } else {
    r.UseDefault(
        "num_key_value_heads",
        type == HfType::kOlmoe || type == HfType::kLlama ? "num_attention_heads" : Cat(fallback),
        kv_note, "num_query_groups");
  }
  if (!r.Given("head_dim")) {
    if (r.Present("head_dim")) {
      r.Use("head_dim", "kv_channels unset (null: hidden_size / num_attention_heads)");
    }
    return absl::OkStatus();
  }
  MOEPLAN_ASSIGN_OR_RETURN(const int64_t head_dim, r.Int("head_dim", 1, kHfMaxDim));
  if (hidden % heads == 0 && hidden / heads == head_dim) {
    r.Use("head_dim", "kv_channels unset (= hidden_size / num_attention_heads)", "kv_channels");
  } else {
    m->set_kv_channels(static_cast<int32_t>(head_dim));
    r.Use("head_dim", Cat("kv_channels = ", head_dim), "kv_channels");
  }
  return absl::OkStatus();
}

// Attention and linear biases: attention_bias (q, k, v and, in transformers,
// o_proj or DeepSeek's down-projections too) and mlp_bias.
absl::Status MapBiases(HfReader& r, v1::ModelConfig* m) {
  MOEPLAN_ASSIGN_OR_RETURN(const bool attention_bias, r.BoolOr("attention_bias", false));
  m->set_add_qkv_bias(attention_bias);
  if (r.Given("attention_bias")) {
    r.Use("attention_bias",
          attention_bias ? "add_qkv_bias = true (the output projection's bias is not modelled)"
                         : "add_qkv_bias = false",
          "add_qkv_bias");
  }
  MOEPLAN_ASSIGN_OR_RETURN(const bool mlp_bias, r.BoolOr("mlp_bias", false));
  m->set_add_bias_linear(mlp_bias);
  if (r.Given("mlp_bias")) {
    r.Use("mlp_bias", Cat("add_bias_linear = ", mlp_bias ? "true" : "false"), "add_bias_linear");
  }
  return absl::OkStatus();
}

// layer_types (newer configs): one entry per layer, full attention only.
absl::Status CheckLayerTypes(HfReader& r) {
  const rapidjson::Value* v = r.Find("layer_types");
  if (v == nullptr || v->IsNull()) return absl::OkStatus();
  if (!v->IsArray()) return Bad("layer_types", "must be a list of strings", HfGot(*v));
  for (rapidjson::SizeType i = 0; i < v->Size(); ++i) {
    const rapidjson::Value& e = (*v)[i];
    if (!e.IsString() || std::string_view(e.GetString(), e.GetStringLength()) != "full_attention") {
      return Bad(Cat("layer_types[", i, "]"),
                 "must be \"full_attention\" (a sliding attention window is not modelled)",
                 HfGot(e));
    }
  }
  r.Ignore("layer_types", "(full attention in every layer)");
  return absl::OkStatus();
}

struct Experts {
  std::string key;
  int64_t count = 0;
  int64_t top_k = 0;
};

// The routed experts' count (under the first of `keys` given) and top-k.
absl::StatusOr<Experts> ReadExperts(HfReader& r, std::vector<std::string_view> keys,
                                    v1::ModelConfig* m) {
  Experts e;
  for (std::string_view k : keys) {
    if (!r.Given(k)) continue;
    if (!e.key.empty()) {
      return Bad(k, Cat("must not be given with ", e.key, " (both name the expert count)"),
                 HfGot(*r.Find(k)));
    }
    e.key = std::string(k);
  }
  if (e.key.empty()) e.key = std::string(keys.front());
  MOEPLAN_ASSIGN_OR_RETURN(e.count, r.Int(e.key, 1, kHfMaxDim));
  MOEPLAN_ASSIGN_OR_RETURN(e.top_k, r.Int("num_experts_per_tok", 1, kHfMaxDim));
  if (e.top_k > e.count) {
    return Bad("num_experts_per_tok", Cat("must be between 1 and ", e.key),
               Cat("num_experts_per_tok=", e.top_k, ", ", e.key, "=", e.count));
  }
  m->mutable_moe()->set_num_experts(static_cast<int32_t>(e.count));
  m->mutable_moe()->set_top_k(static_cast<int32_t>(e.top_k));
  r.Use(e.key, Cat("moe.num_experts = ", e.count), "moe.num_experts");
  r.Use("num_experts_per_tok", Cat("moe.top_k = ", e.top_k), "moe.top_k");
  return e;
}

// The dense FFN size: intermediate_size where a dense layer exists; every
// layer MoE, intermediate_size when given (unused), else the expert size
// (the field is required and unused).
absl::Status MapDenseFfn(HfReader& r, const std::vector<int>& moe, int64_t expert,
                         v1::ModelConfig* m) {
  const bool dense = std::find(moe.begin(), moe.end(), 0) != moe.end();
  if (dense || r.Given("intermediate_size")) {
    MOEPLAN_ASSIGN_OR_RETURN(const int64_t ffn, r.Int("intermediate_size", 1, kHfMaxDim));
    m->set_ffn_hidden_size(static_cast<int32_t>(ffn));
    r.Use("intermediate_size",
          Cat("ffn_hidden_size = ", ffn,
              dense ? " (the dense layers)" : " (unused: every layer is MoE)"),
          "ffn_hidden_size");
    return absl::OkStatus();
  }
  m->set_ffn_hidden_size(static_cast<int32_t>(expert));
  r.Use("moe_intermediate_size",
        Cat("ffn_hidden_size = ", expert, " (no dense FFN: required, unused)"), "ffn_hidden_size");
  return absl::OkStatus();
}

absl::Status NoMoeLayer(std::string_view key, std::string_view got) {
  return Bad(key, "must leave at least one MoE layer", got);
}

absl::StatusOr<int64_t> ExpertSize(HfReader& r, std::string_view key, v1::ModelConfig* m) {
  MOEPLAN_ASSIGN_OR_RETURN(const int64_t expert, r.Int(key, 1, kHfMaxDim));
  m->mutable_moe()->set_expert_ffn_hidden_size(static_cast<int32_t>(expert));
  r.Use(key, Cat("moe.expert_ffn_hidden_size = ", expert), "moe.expert_ffn_hidden_size");
  return expert;
}

}  // namespace

absl::Status MapHfCommon(HfType type, HfReader& r, v1::ModelConfig* m) {
  if (r.Present("model_type")) r.Use("model_type", TypeNote(type));
  MOEPLAN_ASSIGN_OR_RETURN(const int64_t hidden, r.Int("hidden_size", 1, kHfMaxDim));
  m->set_hidden_size(static_cast<int32_t>(hidden));
  r.Use("hidden_size", Cat("hidden_size = ", hidden), "hidden_size");
  MOEPLAN_ASSIGN_OR_RETURN(const int64_t layers, r.Int("num_hidden_layers", 1, kHfMaxLayers));
  m->set_num_layers(static_cast<int32_t>(layers));
  r.Use("num_hidden_layers", Cat("num_layers = ", layers), "num_layers");
  MOEPLAN_ASSIGN_OR_RETURN(const int64_t heads, r.Int("num_attention_heads", 1, kHfMaxDim));
  m->set_num_attention_heads(static_cast<int32_t>(heads));
  r.Use("num_attention_heads", Cat("num_attention_heads = ", heads), "num_attention_heads");
  MOEPLAN_ASSIGN_OR_RETURN(const int64_t vocab, r.Int("vocab_size", 1, kHfMaxDim));
  m->set_vocab_size(static_cast<int32_t>(vocab));
  r.Use("vocab_size", Cat("vocab_size = ", vocab), "vocab_size");
  MOEPLAN_ASSIGN_OR_RETURN(const std::string act, r.StringOr("hidden_act", "silu"));
  if (act != "silu") {
    return Bad("hidden_act", "must be \"silu\" (SwiGLU; other activations are not modelled)",
               HfGot(*r.Find("hidden_act")));
  }
  m->set_gated_linear_unit(true);
  if (r.Given("hidden_act")) {
    r.Use("hidden_act", "gated_linear_unit = true (SwiGLU)");
  } else {
    r.UseDefault("hidden_act", "\"silu\"", "gated_linear_unit = true (SwiGLU)");
  }
  MOEPLAN_ASSIGN_OR_RETURN(const bool tie, r.BoolOr("tie_word_embeddings", false));
  m->set_untie_embeddings_and_output_weights(!tie);
  const std::string untie = Cat("untie_embeddings_and_output_weights = ", tie ? "false" : "true");
  if (r.Given("tie_word_embeddings")) {
    r.Use("tie_word_embeddings", untie);
  } else {
    r.UseDefault("tie_word_embeddings", "false", untie);
  }
  m->set_normalization("RMSNorm");
  if (r.Present("rms_norm_eps")) r.Use("rms_norm_eps", "normalization = \"RMSNorm\"");
  m->set_position_embedding_type("rope");
  m->set_attention_backend("flash");
  MOEPLAN_RETURN_IF_ERROR(MapBiases(r, m));
  MOEPLAN_RETURN_IF_ERROR(CheckLayerTypes(r));
  if (IsDeepseek(type)) return absl::OkStatus();
  return MapAttentionHeads(type, r, hidden, heads, m);
}

absl::Status MapHfMixtralOlmoe(HfType type, HfReader& r, v1::ModelConfig* m) {
  const bool mixtral = type == HfType::kMixtral;
  MOEPLAN_RETURN_IF_ERROR(
      ReadExperts(r,
                  mixtral ? std::vector<std::string_view>{"num_local_experts", "num_experts"}
                          : std::vector<std::string_view>{"num_experts"},
                  m)
          .status());
  MOEPLAN_ASSIGN_OR_RETURN(const int64_t expert, ExpertSize(r, "intermediate_size", m));
  m->set_ffn_hidden_size(static_cast<int32_t>(expert));
  r.Use("intermediate_size", Cat("ffn_hidden_size = ", expert, " (no dense FFN: required, unused)"),
        "ffn_hidden_size");
  const std::vector<int> all(static_cast<size_t>(m->num_layers()), 1);
  SetHfLayerPattern(all, m);
  if (mixtral) {
    if (r.Given("sliding_window")) {
      return Bad("sliding_window", "a sliding attention window is not modelled",
                 HfGot(*r.Find("sliding_window")));
    }
    if (r.Present("sliding_window")) r.Ignore("sliding_window", "(null: full attention)");
  } else {
    m->set_qk_layernorm(true);
    r.Ignore("clip_qkv", "(clamps q, k and v: no cost)");
  }
  return absl::OkStatus();
}

namespace {

// Qwen's layer rule: layer i is MoE iff i is not in mlp_only_layers and
// (i + 1) % decoder_sparse_step == 0 (not Megatron's i % freq == 0).
absl::StatusOr<std::vector<int>> QwenPattern(HfReader& r, int layers) {
  MOEPLAN_ASSIGN_OR_RETURN(const int64_t step, r.IntOr("decoder_sparse_step", 1, kHfMaxLayers, 1));
  MOEPLAN_ASSIGN_OR_RETURN(const std::vector<int64_t> dense,
                           r.IntListOr("mlp_only_layers", 0, layers - 1));
  std::vector<int> moe(static_cast<size_t>(layers));
  for (int i = 0; i < layers; ++i) {
    const bool listed = std::find(dense.begin(), dense.end(), i) != dense.end();
    moe[static_cast<size_t>(i)] = !listed && (i + 1) % step == 0 ? 1 : 0;
  }
  if (std::find(moe.begin(), moe.end(), 1) == moe.end()) {
    return NoMoeLayer(dense.empty() ? "decoder_sparse_step" : "mlp_only_layers",
                      Cat("decoder_sparse_step=", step, ", ", dense.size(),
                          " mlp_only_layers, num_hidden_layers=", layers));
  }
  const std::string note = HfPatternNote(moe);
  if (r.Given("decoder_sparse_step")) {
    r.Use("decoder_sparse_step", note, "moe.layer_pattern");
  } else {
    r.UseDefault("decoder_sparse_step", "1", note, "moe.layer_pattern");
  }
  if (r.Present("mlp_only_layers")) r.Use("mlp_only_layers", note);
  return moe;
}

absl::Status QwenSharedExpert(HfType type, HfReader& r, v1::ModelConfig* m) {
  if (type == HfType::kQwen3Moe) {
    m->set_qk_layernorm(true);
    return absl::OkStatus();
  }
  MOEPLAN_ASSIGN_OR_RETURN(const int64_t shared,
                           r.Int("shared_expert_intermediate_size", 0, kHfMaxDim));
  v1::MoeConfig* e = m->mutable_moe();
  if (shared > 0) {
    e->set_shared_expert_ffn_hidden_size(static_cast<int32_t>(shared));
    e->set_num_shared_experts(1);
    e->set_shared_expert_gate(true);
  }
  r.Use("shared_expert_intermediate_size",
        shared > 0 ? Cat("moe.shared_expert_ffn_hidden_size = ", shared,
                         ", moe.num_shared_experts = 1, moe.shared_expert_gate = true")
                   : "no shared expert",
        "moe.shared_expert_ffn_hidden_size");
  MOEPLAN_ASSIGN_OR_RETURN(const bool qkv_bias, r.BoolOr("qkv_bias", true));
  if (qkv_bias) m->set_add_qkv_bias(true);
  const std::string note = Cat("add_qkv_bias = ", m->add_qkv_bias() ? "true" : "false");
  if (r.Given("qkv_bias")) {
    r.Use("qkv_bias", note, "add_qkv_bias");
  } else {
    r.UseDefault("qkv_bias", "true", note, "add_qkv_bias");
  }
  return absl::OkStatus();
}

// Qwen's sliding window: off (use_sliding_window false) or refused.
absl::Status QwenFullAttention(HfReader& r) {
  MOEPLAN_ASSIGN_OR_RETURN(const bool sliding, r.BoolOr("use_sliding_window", false));
  if (sliding) {
    return Bad("use_sliding_window", "a sliding attention window is not modelled", "true");
  }
  if (r.Present("use_sliding_window")) r.Ignore("use_sliding_window", "(false: full attention)");
  if (r.Present("sliding_window")) {
    r.Ignore("sliding_window", "(unused: use_sliding_window is false)");
  }
  r.Ignore("max_window_layers", "(unused: use_sliding_window is false)");
  return absl::OkStatus();
}

}  // namespace

absl::Status MapHfQwen(HfType type, HfReader& r, v1::ModelConfig* m) {
  MOEPLAN_RETURN_IF_ERROR(
      ReadExperts(r,
                  type == HfType::kQwen3Moe
                      ? std::vector<std::string_view>{"num_experts", "num_local_experts"}
                      : std::vector<std::string_view>{"num_experts"},
                  m)
          .status());
  MOEPLAN_ASSIGN_OR_RETURN(const int64_t expert, ExpertSize(r, "moe_intermediate_size", m));
  MOEPLAN_ASSIGN_OR_RETURN(const std::vector<int> moe, QwenPattern(r, m->num_layers()));
  SetHfLayerPattern(moe, m);
  MOEPLAN_RETURN_IF_ERROR(MapDenseFfn(r, moe, expert, m));
  MOEPLAN_RETURN_IF_ERROR(QwenSharedExpert(type, r, m));
  return QwenFullAttention(r);
}

absl::Status MapHfDense(HfType type, HfReader& r, v1::ModelConfig* m) {
  // An MoE model's file under a dense type would lose its experts: refused.
  for (std::string_view key : {"num_local_experts", "num_experts", "n_routed_experts",
                               "num_experts_per_tok", "moe_intermediate_size"}) {
    if (r.Given(key)) {
      return Bad(key,
                 Cat("an MoE key in a ", HfTypeName(type), " (dense) config: is model_type right?"),
                 HfGot(*r.Find(key)));
    }
  }
  MOEPLAN_ASSIGN_OR_RETURN(const int64_t ffn, r.Int("intermediate_size", 1, kHfMaxDim));
  m->set_ffn_hidden_size(static_cast<int32_t>(ffn));
  r.Use("intermediate_size", Cat("ffn_hidden_size = ", ffn), "ffn_hidden_size");
  if (type == HfType::kLlama) return absl::OkStatus();
  m->set_qk_layernorm(true);
  return QwenFullAttention(r);
}

namespace {

// DeepSeek's layer rule (its own modelling code): layer i is MoE iff
// i >= first_k_dense_replace and i % moe_layer_freq == 0. Defaults:
// first_k_dense_replace 0 (V2) / 3 (V3), moe_layer_freq 1.
absl::StatusOr<std::vector<int>> DeepseekPattern(HfType type, HfReader& r, int layers) {
  const int64_t first_default = type == HfType::kDeepseekV3 ? 3 : 0;
  MOEPLAN_ASSIGN_OR_RETURN(const int64_t first,
                           r.IntOr("first_k_dense_replace", 0, layers, first_default));
  MOEPLAN_ASSIGN_OR_RETURN(const int64_t freq, r.IntOr("moe_layer_freq", 1, kHfMaxLayers, 1));
  std::vector<int> moe(static_cast<size_t>(layers));
  for (int i = 0; i < layers; ++i) moe[static_cast<size_t>(i)] = i >= first && i % freq == 0;
  if (std::find(moe.begin(), moe.end(), 1) == moe.end()) {
    return NoMoeLayer("first_k_dense_replace",
                      Cat("first_k_dense_replace=", first, ", moe_layer_freq=", freq,
                          ", num_hidden_layers=", layers));
  }
  const std::string note = HfPatternNote(moe);
  if (r.Given("first_k_dense_replace")) {
    r.Use("first_k_dense_replace", note, "moe.layer_pattern");
  } else {
    r.UseDefault("first_k_dense_replace", Cat(first_default), note, "moe.layer_pattern");
  }
  if (r.Given("moe_layer_freq")) r.Use("moe_layer_freq", note);
  return moe;
}

// n_shared_experts experts of moe_intermediate_size each (transformers builds
// one MLP of their total width: the same cost). Default 2 (V2) / 1 (V3).
absl::Status DeepseekShared(HfType type, HfReader& r, int64_t expert, v1::ModelConfig* m) {
  const int64_t fallback = r.Present("n_shared_experts") ? 0 : type == HfType::kDeepseekV3 ? 1 : 2;
  MOEPLAN_ASSIGN_OR_RETURN(const int64_t n, r.IntOr("n_shared_experts", 0, 64, fallback));
  v1::MoeConfig* e = m->mutable_moe();
  if (n > 0) {
    e->set_num_shared_experts(static_cast<int32_t>(n));
    e->set_shared_expert_ffn_hidden_size(static_cast<int32_t>(expert));
  }
  const std::string note =
      n > 0 ? Cat("moe.num_shared_experts = ", n, ", moe.shared_expert_ffn_hidden_size = ", expert)
            : "no shared expert";
  if (r.Present("n_shared_experts")) {
    r.Use("n_shared_experts", note, "moe.num_shared_experts");
  } else {
    r.UseDefault("n_shared_experts", Cat(fallback), note, "moe.num_shared_experts");
  }
  return absl::OkStatus();
}

// Group-limited routing: n_group groups of experts, a token's experts from
// topk_group of them, unless topk_method is "greedy". Defaults: V2 "greedy"
// (n_group, topk_group None), V3 "noaux_tc" (8, 4).
absl::Status DeepseekGroups(HfType type, HfReader& r, const Experts& x, v1::ModelConfig* m) {
  const bool v3 = type == HfType::kDeepseekV3;
  MOEPLAN_ASSIGN_OR_RETURN(const std::string method,
                           r.StringOr("topk_method", v3 ? "noaux_tc" : "greedy"));
  if (method != "greedy" && method != "group_limited_greedy" && method != "noaux_tc") {
    return Bad("topk_method", "must be \"greedy\", \"group_limited_greedy\" or \"noaux_tc\"",
               HfGot(*r.Find("topk_method")));
  }
  if (method == "greedy") {
    r.Use("topk_method", "no group-limited routing");
    r.Ignore("n_group", "(topk_method \"greedy\": no group limit)");
    r.Ignore("topk_group", "(topk_method \"greedy\": no group limit)");
    return absl::OkStatus();
  }
  for (const char* key : {"n_group", "topk_group"}) {
    if (r.Present(key) && !r.Given(key)) {
      return Bad(key, Cat("required with topk_method \"", method, "\""), "null");
    }
  }
  if (!v3) {
    MOEPLAN_RETURN_IF_ERROR(r.Int("n_group", 1, kHfMaxDim).status());
    MOEPLAN_RETURN_IF_ERROR(r.Int("topk_group", 1, kHfMaxDim).status());
  }
  MOEPLAN_ASSIGN_OR_RETURN(const int64_t groups, r.IntOr("n_group", 1, kHfMaxDim, 8));
  MOEPLAN_ASSIGN_OR_RETURN(const int64_t topk, r.IntOr("topk_group", 1, kHfMaxDim, 4));
  if (x.count % groups != 0) {
    return Bad("n_group", Cat("must divide ", x.key),
               Cat("n_group=", groups, ", ", x.key, "=", x.count));
  }
  if (topk > groups) {
    return Bad("topk_group", "must be between 1 and n_group",
               Cat("topk_group=", topk, ", n_group=", groups));
  }
  r.Use("topk_method", Cat("group-limited routing (\"", method, "\")"));
  if (groups > 1) {
    m->mutable_moe()->set_router_num_groups(static_cast<int32_t>(groups));
    m->mutable_moe()->set_router_group_topk(static_cast<int32_t>(topk));
  }
  const std::string g =
      groups > 1 ? Cat("moe.router_num_groups = ", groups) : "one group: no limit";
  const std::string t = groups > 1 ? Cat("moe.router_group_topk = ", topk) : "one group: no limit";
  if (r.Given("n_group"))
    r.Use("n_group", g, "moe.router_num_groups");
  else
    r.UseDefault("n_group", "8", g, "moe.router_num_groups");
  if (r.Given("topk_group"))
    r.Use("topk_group", t, "moe.router_group_topk");
  else
    r.UseDefault("topk_group", "4", t, "moe.router_group_topk");
  return absl::OkStatus();
}

// Multi-head latent attention: q_lora_rank (null: queries projected
// directly), kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim.
absl::Status DeepseekMla(HfReader& r, v1::ModelConfig* m) {
  v1::MultiLatentAttention* a = m->mutable_multi_latent_attention();
  const std::string f = "multi_latent_attention.";
  if (!r.Present("q_lora_rank"))
    return Bad("q_lora_rank", "required (null: no query LoRA)", "missing");
  if (r.Given("q_lora_rank")) {
    MOEPLAN_ASSIGN_OR_RETURN(const int64_t q, r.Int("q_lora_rank", 1, kHfMaxDim));
    a->set_q_lora_rank(static_cast<int32_t>(q));
    r.Use("q_lora_rank", Cat(f, "q_lora_rank = ", q), f + "q_lora_rank");
  } else {
    r.Use("q_lora_rank", Cat(f, "q_lora_rank unset (queries projected directly)"));
  }
  MOEPLAN_ASSIGN_OR_RETURN(const int64_t kv, r.Int("kv_lora_rank", 1, kHfMaxDim));
  a->set_kv_lora_rank(static_cast<int32_t>(kv));
  r.Use("kv_lora_rank", Cat(f, "kv_lora_rank = ", kv), f + "kv_lora_rank");
  MOEPLAN_ASSIGN_OR_RETURN(const int64_t nope, r.Int("qk_nope_head_dim", 1, kHfMaxDim));
  a->set_qk_head_dim(static_cast<int32_t>(nope));
  r.Use("qk_nope_head_dim", Cat(f, "qk_head_dim = ", nope), f + "qk_head_dim");
  MOEPLAN_ASSIGN_OR_RETURN(const int64_t rope, r.Int("qk_rope_head_dim", 0, kHfMaxDim));
  a->set_qk_pos_emb_head_dim(static_cast<int32_t>(rope));
  r.Use("qk_rope_head_dim", Cat(f, "qk_pos_emb_head_dim = ", rope), f + "qk_pos_emb_head_dim");
  MOEPLAN_ASSIGN_OR_RETURN(const int64_t v, r.Int("v_head_dim", 1, kHfMaxDim));
  a->set_v_head_dim(static_cast<int32_t>(v));
  r.Use("v_head_dim", Cat(f, "v_head_dim = ", v), f + "v_head_dim");
  r.Ignore("num_key_value_heads", "(MLA: keys and values come from kv_lora_rank)");
  r.Ignore("head_dim", "(MLA: the head sizes are qk_nope_head_dim, qk_rope_head_dim, v_head_dim)");
  return absl::OkStatus();
}

}  // namespace

absl::Status MapHfDeepseek(HfType type, HfReader& r, v1::ModelConfig* m) {
  MOEPLAN_ASSIGN_OR_RETURN(const Experts x, ReadExperts(r, {"n_routed_experts"}, m));
  MOEPLAN_ASSIGN_OR_RETURN(const int64_t expert, ExpertSize(r, "moe_intermediate_size", m));
  MOEPLAN_ASSIGN_OR_RETURN(const std::vector<int> moe, DeepseekPattern(type, r, m->num_layers()));
  SetHfLayerPattern(moe, m);
  MOEPLAN_RETURN_IF_ERROR(MapDenseFfn(r, moe, expert, m));
  MOEPLAN_RETURN_IF_ERROR(DeepseekShared(type, r, expert, m));
  MOEPLAN_RETURN_IF_ERROR(DeepseekGroups(type, r, x, m));
  MOEPLAN_RETURN_IF_ERROR(DeepseekMla(r, m));
  if (type == HfType::kDeepseekV3) {
    MOEPLAN_ASSIGN_OR_RETURN(const int64_t mtp, r.IntOr("num_nextn_predict_layers", 0, 16, 0));
    if (mtp > 0) m->set_mtp_num_layers(static_cast<int32_t>(mtp));
    const std::string note = mtp > 0 ? Cat("mtp_num_layers = ", mtp) : "no multi-token prediction";
    if (r.Given("num_nextn_predict_layers")) {
      r.Use("num_nextn_predict_layers", note, "mtp_num_layers");
    } else {
      r.UseDefault("num_nextn_predict_layers", "0", note, "mtp_num_layers");
    }
  }
  r.Ignore("quantization_config",
           "(the checkpoint's storage format; --fp8-format sets FP8 training)");
  return absl::OkStatus();
}

}  // namespace moeplan::proto::internal
