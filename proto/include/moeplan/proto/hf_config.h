// Hugging Face `config.json` files of MoE models imported as moeplan.v1
// ModelConfig (docs/model.md "Hugging Face config.json"): the six model types
// mixtral, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3 and olmoe, mapped
// field by field with transformers' semantics, every key of the file accounted
// for as used, ignored (no effect on cost) or unknown.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "moeplan/v1/model.pb.h"

namespace moeplan::proto {

// What a config.json does not say: the training run's shape and precision.
struct HfTraining {
  int seq_length = 4096;
  int micro_batch_size = 1;
  int global_batch_size = 0;  // 0: unset (micro_batch_size x dp)
  // FP8 training (ModelConfig's fp8_format, fp8_recipe, fp8_param_gather);
  // empty format: BF16 only.
  std::string fp8_format;
  std::string fp8_recipe;
  bool fp8_param_gather = false;
};

// One key of the file (or a default the import applied for an absent one).
struct HfField {
  std::string name;  // the key as written (untrusted: print it with Printable)
  enum Use { kUsed, kIgnored, kUnknown } use = kUnknown;
  // kUsed: "-> num_query_groups = 8" (what it became); kIgnored: why, or
  // empty; kUnknown: "(not used)".
  std::string note;
};

struct HfImport {
  v1::ModelConfig model;
  // The file's top-level keys in file order (a null one whose default was
  // applied says "(null: default ...)"), then the absent keys whose
  // transformers default the import applied (note "... (absent: default ...)").
  std::vector<HfField> fields;
};

std::string_view HfUseName(HfField::Use use);  // "used", "ignored", "unknown"

// A JSON object with a "model_type" or "architectures" key: a Hugging Face
// config rather than a moeplan ModelConfig (which has neither field). Never
// fails: text that is not such an object is false.
bool LooksLikeHfConfig(std::string_view json_text);

// Parses `json_text` strictly (the pass ParseJson runs: a key twice, invalid
// UTF-8, comments, trailing commas and nesting past 100 refused) and maps it.
// `name` becomes the model's name (control characters replaced by '_', cut at
// kMaxNameBytes; empty: the model_type). The result has passed ModelFromProto
// and planner::ValidateModelShape. Errors are InvalidArgument, one line naming
// the config.json key:
//   model_type: must be one of mixtral, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3, olmoe (got
//   "llama") n_group: must divide n_routed_experts (got n_group=7, n_routed_experts=256)
//   num_attention_heads: required (missing)
// and a moeplan rule broken by a mapped value names the key first:
//   "num_key_value_heads: num_query_groups must divide num_attention_heads ...".
absl::StatusOr<HfImport> ImportHfConfig(std::string_view json_text, const HfTraining& training,
                                        std::string_view name);

}  // namespace moeplan::proto
