// Hugging Face config.json import (proto/include/moeplan/proto/hf_config.h):
// the published configs under examples/hf/ with hand-checked values, the
// mapping rules, and bad configs refused on one line naming the key.
#include "moeplan/proto/hf_config.h"

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "moeplan/planner/accounting.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"

namespace moeplan::proto {
namespace {

std::string Example(const std::string& name) {
  absl::StatusOr<std::string> text =
      ReadFile(std::string(MOEPLAN_SOURCE_DIR) + "/examples/hf/" + name + "/config.json");
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

v1::ModelConfig Import(const std::string& name, const HfTraining& t = {}) {
  absl::StatusOr<HfImport> r = ImportHfConfig(Example(name), t, name);
  EXPECT_TRUE(r.ok()) << name << ": " << r.status();
  return r.ok() ? r->model : v1::ModelConfig();
}

const HfField* FindField(const std::vector<HfField>& fields, const std::string& name) {
  for (const HfField& f : fields) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

// A JSON text with `key`'s value replaced (or the key added at the front);
// `value` empty removes the key.
std::string Edit(std::string json, const std::string& key, const std::string& value) {
  const std::string quoted = "\"" + key + "\":";
  const size_t at = json.find(quoted);
  if (at == std::string::npos) {
    return value.empty() ? json
                         : "{" + quoted + " " + value + ", " + json.substr(json.find('{') + 1);
  }
  size_t end = at + quoted.size();
  int depth = 0;
  for (; end < json.size(); ++end) {
    const char c = json[end];
    if (c == '[' || c == '{') ++depth;
    if (c == ']' || c == '}') {
      if (depth == 0) break;
      --depth;
    }
    if (c == ',' && depth == 0) break;
  }
  if (!value.empty()) return json.substr(0, at) + quoted + " " + value + json.substr(end);
  if (json[end] == ',') ++end;
  return json.substr(0, at) + json.substr(end);
}

TEST(ImportHfConfig, EveryExampleImportsAndValidates) {
  for (const char* name :
       {"mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3",
        "deepseek-v2", "qwen2-57b-a14b", "olmoe-1b-7b", "llama-3-8b", "qwen3-8b"}) {
    const std::string text = Example(name);
    EXPECT_TRUE(LooksLikeHfConfig(text)) << name;
    absl::StatusOr<HfImport> r = ImportHfConfig(text, HfTraining{}, name);
    ASSERT_TRUE(r.ok()) << name << ": " << r.status();
    EXPECT_EQ(r->model.name(), name);
    // The written model is a native model file moeplan reads back as it is.
    absl::StatusOr<std::string> json = ToJson(r->model);
    ASSERT_TRUE(json.ok());
    v1::ModelConfig back;
    ASSERT_TRUE(ParseJson(*json, &back).ok()) << name;
    absl::StatusOr<planner::ModelConfig> model = ModelFromProto(back);
    ASSERT_TRUE(model.ok()) << name << ": " << model.status();
    EXPECT_TRUE(planner::ValidateModelShape(*model).ok()) << name;
    if (!model->IsDense()) {
      EXPECT_TRUE(model->moe.dropless) << name;
      EXPECT_EQ(model->moe.capacity_factor, 0.0) << name;
    }
    EXPECT_EQ(model->parallel.TotalRanks(), 1) << name;
    EXPECT_EQ(model->normalization, planner::Normalization::kRmsNorm) << name;
    EXPECT_EQ(model->position_embedding_type, planner::PositionEmbedding::kRope) << name;
    EXPECT_FALSE(model->add_bias_linear) << name;
    EXPECT_TRUE(model->gated_linear_unit) << name;
    EXPECT_TRUE(model->untie_embeddings_and_output_weights) << name;
    EXPECT_EQ(model->seq_length, 4096) << name;
    EXPECT_EQ(model->bytes_per_element, 2) << name;
    // Every key of the file is accounted for, and these examples hold none unknown.
    for (const HfField& f : r->fields) EXPECT_NE(f.use, HfField::kUnknown) << name << " " << f.name;
  }
}

// Dense models: no moe message (a dense ModelConfig), the FFN from
// intermediate_size; parameters as the model cards give them: Llama 3 8B
// 8.03 B; Qwen3-8B 8.2 B, 6.95 B without the embedding and output layer.
TEST(ImportHfConfig, DenseLlamaAndQwen3) {
  const v1::ModelConfig llama = Import("llama-3-8b");
  EXPECT_FALSE(llama.has_moe());
  EXPECT_EQ(llama.ffn_hidden_size(), 14336);
  EXPECT_EQ(llama.num_query_groups(), 8);
  EXPECT_FALSE(llama.qk_layernorm());
  const v1::ModelConfig qwen = Import("qwen3-8b");
  EXPECT_FALSE(qwen.has_moe());
  EXPECT_EQ(qwen.ffn_hidden_size(), 12288);
  EXPECT_EQ(qwen.kv_channels(), 0);  // head_dim 128 = 4096 / 32
  EXPECT_TRUE(qwen.qk_layernorm());
  for (const auto& [m, total, body] :
       {std::tuple{llama, 8.03e9, 6.98e9}, std::tuple{qwen, 8.19e9, 6.95e9}}) {
    absl::StatusOr<planner::ModelConfig> pm = ModelFromProto(m);
    ASSERT_TRUE(pm.ok()) << pm.status();
    EXPECT_TRUE(pm->IsDense());
    EXPECT_EQ(pm->NumMoeLayers(), 0);
    const planner::ParamCounts c = planner::CountParams(*pm);
    EXPECT_NEAR(c.total, total, 0.01 * total) << m.name();
    EXPECT_NEAR(c.transformer, body, 0.01 * body) << m.name();
    EXPECT_EQ(c.active, c.total) << m.name();
  }
}

TEST(ImportHfConfig, Qwen3_30B_A3B) {
  const v1::ModelConfig m = Import("qwen3-30b-a3b");
  EXPECT_EQ(m.hidden_size(), 2048);
  EXPECT_EQ(m.num_layers(), 48);
  EXPECT_EQ(m.kv_channels(), 128);  // head_dim, not hidden / heads (64)
  EXPECT_EQ(m.num_query_groups(), 4);
  EXPECT_EQ(m.moe().num_experts(), 128);
  EXPECT_EQ(m.moe().top_k(), 8);
  EXPECT_EQ(m.moe().expert_ffn_hidden_size(), 768);
  EXPECT_EQ(m.moe().layer_freq(), 1);
  EXPECT_EQ(m.moe().layer_pattern_size(), 0);
  EXPECT_TRUE(m.qk_layernorm());
  EXPECT_FALSE(m.add_qkv_bias());
  EXPECT_FALSE(m.moe().has_shared_expert_ffn_hidden_size());
  EXPECT_EQ(m.vocab_size(), 151936);
}

TEST(ImportHfConfig, DeepSeekV3) {
  const v1::ModelConfig m = Import("deepseek-v3");
  ASSERT_EQ(m.moe().layer_pattern_size(), 61);
  for (int i = 0; i < 61; ++i) EXPECT_EQ(m.moe().layer_pattern(i), i < 3 ? 0 : 1) << i;
  EXPECT_EQ(m.moe().layer_freq(), 0);
  EXPECT_EQ(m.ffn_hidden_size(), 18432);
  const v1::MultiLatentAttention& a = m.multi_latent_attention();
  EXPECT_EQ(a.q_lora_rank(), 1536);
  EXPECT_EQ(a.kv_lora_rank(), 512);
  EXPECT_EQ(a.qk_head_dim(), 128);
  EXPECT_EQ(a.qk_pos_emb_head_dim(), 64);
  EXPECT_EQ(a.v_head_dim(), 128);
  EXPECT_FALSE(m.has_num_query_groups());
  EXPECT_EQ(m.moe().router_num_groups(), 8);
  EXPECT_EQ(m.moe().router_group_topk(), 4);
  EXPECT_EQ(m.moe().num_shared_experts(), 1);
  EXPECT_EQ(m.moe().shared_expert_ffn_hidden_size(), 2048);
  EXPECT_FALSE(m.moe().shared_expert_gate());
  EXPECT_EQ(m.moe().num_experts(), 256);
  EXPECT_EQ(m.mtp_num_layers(), 1);
}

TEST(ImportHfConfig, DeepSeekV2GroupLimitedGreedyAndTwoSharedExperts) {
  const v1::ModelConfig m = Import("deepseek-v2");
  EXPECT_EQ(m.moe().layer_pattern(0), 0);
  EXPECT_EQ(m.moe().layer_pattern(1), 1);
  EXPECT_EQ(m.moe().router_num_groups(), 8);
  EXPECT_EQ(m.moe().router_group_topk(), 3);
  EXPECT_EQ(m.moe().num_shared_experts(), 2);
  EXPECT_EQ(m.moe().shared_expert_ffn_hidden_size(), 1536);
  EXPECT_FALSE(m.has_mtp_num_layers());
  // "greedy" routes among all experts: no groups; q_lora_rank null: no query LoRA.
  absl::StatusOr<HfImport> greedy = ImportHfConfig(
      Edit(Edit(Example("deepseek-v2"), "topk_method", "\"greedy\""), "q_lora_rank", "null"), {},
      "lite");
  ASSERT_TRUE(greedy.ok()) << greedy.status();
  EXPECT_FALSE(greedy->model.moe().has_router_num_groups());
  EXPECT_FALSE(greedy->model.multi_latent_attention().has_q_lora_rank());
  EXPECT_EQ(FindField(greedy->fields, "n_group")->use, HfField::kIgnored);
}

TEST(ImportHfConfig, Qwen2_57B_A14B) {
  const v1::ModelConfig m = Import("qwen2-57b-a14b");
  EXPECT_EQ(m.moe().shared_expert_ffn_hidden_size(), 20480);
  EXPECT_EQ(m.moe().num_shared_experts(), 1);
  EXPECT_TRUE(m.moe().shared_expert_gate());
  EXPECT_TRUE(m.add_qkv_bias());
  EXPECT_EQ(m.num_query_groups(), 4);
  EXPECT_FALSE(m.has_kv_channels());  // 3584 / 28 = 128
  EXPECT_EQ(m.moe().num_experts(), 64);
  EXPECT_EQ(m.moe().expert_ffn_hidden_size(), 2560);
  EXPECT_FALSE(m.qk_layernorm());
}

TEST(ImportHfConfig, Mixtral) {
  const v1::ModelConfig m = Import("mixtral-8x7b");
  EXPECT_EQ(m.num_query_groups(), 8);
  EXPECT_EQ(m.moe().layer_freq(), 1);
  EXPECT_EQ(m.moe().layer_pattern_size(), 0);
  EXPECT_TRUE(m.untie_embeddings_and_output_weights());
  EXPECT_EQ(m.moe().num_experts(), 8);
  EXPECT_EQ(m.moe().top_k(), 2);
  EXPECT_EQ(m.moe().expert_ffn_hidden_size(), 14336);
  EXPECT_EQ(m.ffn_hidden_size(), 14336);  // required, unused: every layer is MoE
  EXPECT_FALSE(m.add_qkv_bias());
  const v1::ModelConfig big = Import("mixtral-8x22b");
  EXPECT_EQ(big.num_layers(), 56);
  EXPECT_EQ(big.num_query_groups(), 8);
  EXPECT_EQ(big.hidden_size(), 6144);
}

TEST(ImportHfConfig, Olmoe) {
  const v1::ModelConfig m = Import("olmoe-1b-7b");
  EXPECT_TRUE(m.qk_layernorm());
  EXPECT_FALSE(m.has_num_query_groups());  // 16 key/value heads of 16
  EXPECT_EQ(m.moe().num_experts(), 64);
  EXPECT_EQ(m.moe().top_k(), 8);
  EXPECT_EQ(m.moe().expert_ffn_hidden_size(), 1024);
}

TEST(ImportHfConfig, TrainingSettingsAndName) {
  HfTraining t;
  t.seq_length = 2048;
  t.micro_batch_size = 2;
  t.global_batch_size = 512;
  t.fp8_format = "hybrid";
  t.fp8_recipe = "blockwise";
  t.fp8_param_gather = true;
  absl::StatusOr<HfImport> r = ImportHfConfig(Example("olmoe-1b-7b"), t, "a\x1b[2Jb\xff");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model.seq_length(), 2048);
  EXPECT_EQ(r->model.micro_batch_size(), 2);
  EXPECT_EQ(r->model.global_batch_size(), 512);
  EXPECT_EQ(r->model.bytes_per_element(), 2);  // FP8 training keeps BF16 activations
  EXPECT_EQ(r->model.fp8_format(), "hybrid");
  EXPECT_EQ(r->model.fp8_recipe(), "blockwise");
  EXPECT_TRUE(r->model.fp8_param_gather());
  EXPECT_EQ(r->model.name(), "a_[2Jb_");
  EXPECT_FALSE(Import("olmoe-1b-7b").has_global_batch_size());
  absl::StatusOr<HfImport> unnamed = ImportHfConfig(Example("olmoe-1b-7b"), {}, "");
  ASSERT_TRUE(unnamed.ok());
  EXPECT_EQ(unnamed->model.name(), "olmoe");
  absl::StatusOr<HfImport> long_name =
      ImportHfConfig(Example("olmoe-1b-7b"), {}, std::string(1000, 'x'));
  ASSERT_TRUE(long_name.ok());
  EXPECT_EQ(long_name->model.name().size(), kMaxNameBytes);
}

TEST(ImportHfConfig, FieldsSayWhatEachKeyBecame) {
  const std::string text =
      Edit(Edit(Example("mixtral-8x7b"), "num_key_value_heads", ""), "foo", "{\"bar\": 1}");
  absl::StatusOr<HfImport> r = ImportHfConfig(text, {}, "m");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_NE(FindField(r->fields, "foo"), nullptr);
  EXPECT_EQ(FindField(r->fields, "foo")->use, HfField::kUnknown);
  EXPECT_EQ(FindField(r->fields, "foo")->note, "(not used)");
  EXPECT_EQ(r->fields.front().name, "foo");  // file order
  EXPECT_EQ(FindField(r->fields, "rope_theta")->use, HfField::kIgnored);
  EXPECT_EQ(FindField(r->fields, "intermediate_size")->note,
            "-> moe.expert_ffn_hidden_size = 14336; ffn_hidden_size = 14336 (no dense FFN: "
            "required, unused)");
  // Absent: MixtralConfig's default of 8 key/value heads, listed after the file's keys.
  const HfField* kv = FindField(r->fields, "num_key_value_heads");
  ASSERT_NE(kv, nullptr);
  EXPECT_EQ(kv->use, HfField::kUsed);
  EXPECT_EQ(kv->note, "-> num_query_groups = 8 (absent: default 8)");
  EXPECT_EQ(r->model.num_query_groups(), 8);
  EXPECT_EQ(HfUseName(HfField::kIgnored), "ignored");
  // null is the default too, said where the file has the key.
  absl::StatusOr<HfImport> nulls = ImportHfConfig(
      Edit(Edit(Example("mixtral-8x7b"), "num_key_value_heads", "null"), "head_dim", "null"), {},
      "m");
  ASSERT_TRUE(nulls.ok()) << nulls.status();
  EXPECT_EQ(FindField(nulls->fields, "num_key_value_heads")->note,
            "-> num_query_groups = 8 (null: default 8)");
  EXPECT_EQ(FindField(nulls->fields, "head_dim")->use, HfField::kUsed);
  for (const HfField& f : nulls->fields) EXPECT_NE(f.use, HfField::kUnknown) << f.name;
  EXPECT_EQ(nulls->fields.size(), 26u);  // the file's 25 keys and head_dim, each once
}

TEST(ImportHfConfig, QwenLayerRuleCountsFromOne) {
  // decoder_sparse_step 2: layers 1, 3, 5, ... are MoE ((i + 1) % 2 == 0);
  // mlp_only_layers makes layer 3 dense too.
  const std::string text =
      Edit(Edit(Example("qwen3-30b-a3b"), "decoder_sparse_step", "2"), "mlp_only_layers", "[3]");
  absl::StatusOr<HfImport> r = ImportHfConfig(text, {}, "q");
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::MoeConfig& e = r->model.moe();
  ASSERT_EQ(e.layer_pattern_size(), 48);
  EXPECT_EQ(e.layer_pattern(0), 0);
  EXPECT_EQ(e.layer_pattern(1), 1);
  EXPECT_EQ(e.layer_pattern(3), 0);
  EXPECT_EQ(e.layer_pattern(5), 1);
  EXPECT_EQ(r->model.ffn_hidden_size(), 6144);  // the dense layers' intermediate_size
  // The architectures name the type when model_type is absent.
  absl::StatusOr<HfImport> by_arch = ImportHfConfig(Edit(text, "model_type", ""), {}, "q");
  ASSERT_TRUE(by_arch.ok()) << by_arch.status();
  EXPECT_TRUE(by_arch->model.qk_layernorm());
}

TEST(LooksLikeHfConfig, OnlyObjectsWithModelTypeOrArchitectures) {
  EXPECT_TRUE(LooksLikeHfConfig(R"({"architectures": []})"));
  EXPECT_TRUE(LooksLikeHfConfig(R"({"model_type": 3})"));
  EXPECT_FALSE(LooksLikeHfConfig(R"({"name": "m", "num_layers": 4})"));
  EXPECT_FALSE(LooksLikeHfConfig(R"([{"model_type": "mixtral"}])"));
  EXPECT_FALSE(LooksLikeHfConfig("{\"model_type\": "));
  EXPECT_FALSE(LooksLikeHfConfig(""));
  absl::StatusOr<std::string> native =
      ReadFile(std::string(MOEPLAN_SOURCE_DIR) + "/examples/models/qwen-moe-like.json");
  ASSERT_TRUE(native.ok());
  EXPECT_FALSE(LooksLikeHfConfig(*native));
}

struct BadCase {
  const char* label;
  const char* example;
  const char* key;
  const char* value;  // "" removes the key
  const char* error;
};

class BadHfConfigTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadHfConfigTest, OneLineErrorNamingTheKey) {
  const BadCase& c = GetParam();
  absl::StatusOr<HfImport> r = ImportHfConfig(Edit(Example(c.example), c.key, c.value), {}, "m");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()), c.error);
}

INSTANTIATE_TEST_SUITE_P(
    Table, BadHfConfigTest,
    ::testing::Values(
        BadCase{"unknown_model_type", "mixtral-8x7b", "model_type", "\"gpt2\"",
                "model_type: must be one of mixtral, qwen2_moe, qwen3_moe, deepseek_v2, "
                "deepseek_v3, olmoe, llama, qwen3 (got \"gpt2\")"},
        BadCase{"dense_missing_ffn", "llama-3-8b", "intermediate_size", "",
                "intermediate_size: required (missing)"},
        BadCase{"dense_with_experts", "llama-3-8b", "num_local_experts", "8",
                "num_local_experts: an MoE key in a llama (dense) config: is model_type right? "
                "(got 8)"},
        BadCase{"qwen3_sliding", "qwen3-8b", "use_sliding_window", "true",
                "use_sliding_window: a sliding attention window is not modelled (got true)"},
        BadCase{"n_group_not_dividing", "deepseek-v3", "n_group", "7",
                "n_group: must divide n_routed_experts (got n_group=7, n_routed_experts=256)"},
        BadCase{"missing_heads", "qwen3-30b-a3b", "num_attention_heads", "",
                "num_attention_heads: required (missing)"},
        BadCase{"sliding_window", "mixtral-8x7b", "sliding_window", "4096",
                "sliding_window: a sliding attention window is not modelled (got 4096)"},
        BadCase{"use_sliding_window", "qwen2-57b-a14b", "use_sliding_window", "true",
                "use_sliding_window: a sliding attention window is not modelled (got true)"},
        BadCase{"gelu", "olmoe-1b-7b", "hidden_act", "\"gelu\"",
                "hidden_act: must be \"silu\" (SwiGLU; other activations are not modelled) "
                "(got \"gelu\")"},
        BadCase{"top_k_over_experts", "mixtral-8x7b", "num_experts_per_tok", "9",
                "num_experts_per_tok: must be between 1 and num_local_experts (got "
                "num_experts_per_tok=9, num_local_experts=8)"},
        BadCase{"fractional_hidden", "qwen3-30b-a3b", "hidden_size", "1.5",
                "hidden_size: must be an integer between 1 and 2^24 (got 1.5)"},
        BadCase{"too_many_layers", "mixtral-8x7b", "num_hidden_layers", "2000",
                "num_hidden_layers: must be an integer between 1 and 1024 (got 2000)"},
        BadCase{"topk_group_over_groups", "deepseek-v3", "topk_group", "9",
                "topk_group: must be between 1 and n_group (got topk_group=9, n_group=8)"},
        BadCase{"topk_method", "deepseek-v2", "topk_method", "\"random\"",
                "topk_method: must be \"greedy\", \"group_limited_greedy\" or \"noaux_tc\" (got "
                "\"random\")"},
        BadCase{"no_moe_layer", "deepseek-v3", "first_k_dense_replace", "61",
                "first_k_dense_replace: must leave at least one MoE layer (got "
                "first_k_dense_replace=61, moe_layer_freq=1, num_hidden_layers=61)"},
        BadCase{"kv_heads_not_dividing", "mixtral-8x7b", "num_key_value_heads", "5",
                "num_key_value_heads: num_query_groups must divide num_attention_heads (each "
                "key/value head serves a group) (got num_query_groups=5, num_attention_heads=32)"},
        BadCase{"top_k_out_of_groups", "deepseek-v3", "num_experts_per_tok", "200",
                "num_experts_per_tok: moe.top_k must be <= the experts of router_group_topk "
                "groups (router_group_topk * num_experts / router_num_groups) (got top_k=200, "
                "reachable=128)"},
        BadCase{"tie_not_bool", "qwen3-30b-a3b", "tie_word_embeddings", "0",
                "tie_word_embeddings: must be true or false (got 0)"},
        BadCase{"mlp_only_out_of_range", "qwen3-30b-a3b", "mlp_only_layers", "[48]",
                "mlp_only_layers[0]: must be an integer between 0 and 47 (got 48)"}),
    [](const auto& info) { return std::string(info.param.label); });

TEST(ImportHfConfig, StrictJsonAndShapeErrors) {
  const auto error = [](const std::string& text) {
    absl::StatusOr<HfImport> r = ImportHfConfig(text, {}, "m");
    return r.ok() ? std::string("ok") : std::string(r.status().message());
  };
  EXPECT_EQ(error("{\"model_type\": \"mixtral\",\n \"hidden_size\": 1,\n \"hidden_size\": 2}"),
            "line 3, column 2: hidden_size: duplicate key (a key may appear once per object)");
  EXPECT_EQ(error("{\"model_type\": \"mixtral\", \"x\": \"\xff\"}").rfind("column ", 0), 0u);
  EXPECT_EQ(error("[1]"), "config.json: must be a JSON object with \"model_type\" (got [1])");
  EXPECT_EQ(error("{}"), "model_type: required (missing; nor are architectures given)");
  EXPECT_EQ(error(std::string(200, '[') + std::string(200, ']')),
            "column 101: nested deeper than 100 arrays and objects");
}

}  // namespace
}  // namespace moeplan::proto
