// Private to hf_config.cc and hf_config_models.cc: the reader of one
// config.json object, which checks each value it is asked for and remembers
// what every key became, and the per-model-type mappings.
#pragma once

#include <rapidjson/document.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "moeplan/proto/hf_config.h"
#include "moeplan/v1/model.pb.h"

namespace moeplan::proto::internal {

// The largest size of any one dimension (planner::internal::kMaxDim).
inline constexpr int64_t kHfMaxDim = int64_t{1} << 24;
inline constexpr int64_t kHfMaxLayers = 1024;

enum class HfType {
  kMixtral,
  kQwen2Moe,
  kQwen3Moe,
  kDeepseekV2,
  kDeepseekV3,
  kOlmoe,
  kLlama,  // dense
  kQwen3,  // dense
};
std::string_view HfTypeName(HfType t);  // the model_type: "qwen3_moe"

// A value as JSON text, bounded and escaped for a message: "llama" with its
// quotes, 1.5, [1,2].
std::string HfGot(const rapidjson::Value& v);

class HfReader {
 public:
  explicit HfReader(const rapidjson::Value& object) : object_(object) {}

  // The value of `key`; nullptr when absent. Null() when present as null.
  const rapidjson::Value* Find(std::string_view key) const;
  bool Present(std::string_view key) const { return Find(key) != nullptr; }
  // Present and not null.
  bool Given(std::string_view key) const;

  // An integer in [lo, hi]: "<key>: required (missing)" when absent or null,
  // "<key>: must be an integer between 1 and 2^24 (got 1.5)" otherwise.
  absl::StatusOr<int64_t> Int(std::string_view key, int64_t lo, int64_t hi) const;
  // The same, `fallback` when absent or null.
  absl::StatusOr<int64_t> IntOr(std::string_view key, int64_t lo, int64_t hi,
                                int64_t fallback) const;
  absl::StatusOr<bool> BoolOr(std::string_view key, bool fallback) const;
  absl::StatusOr<std::string> StringOr(std::string_view key, std::string_view fallback) const;
  // A list of integers in [lo, hi] (null or absent: empty).
  absl::StatusOr<std::vector<int64_t>> IntListOr(std::string_view key, int64_t lo,
                                                 int64_t hi) const;

  // `key` mapped: present, its note "-> <note>"; absent (or null), a default
  // the import applied, listed after the file's keys with `note` and
  // "(absent: default <value>)" (where the file has it: "(null: ...)"). `field` is the moeplan
  // field it set, so a moeplan rule it breaks is said against `key` (Origin).
  void Use(std::string_view key, std::string_view note, std::string_view field = "");
  void UseDefault(std::string_view key, std::string_view value, std::string_view note,
                  std::string_view field = "");
  // Known and without effect on cost for this model type.
  void Ignore(std::string_view key, std::string_view note = "");
  // The config.json key a moeplan field came from; empty when none.
  std::string Origin(std::string_view field) const;

  // Every key of the file in order (used, ignored, else unknown), then the
  // defaults applied.
  std::vector<HfField> Fields() const;

 private:
  const rapidjson::Value& object_;
  std::map<std::string, std::string, std::less<>> used_;     // key -> note
  std::map<std::string, std::string, std::less<>> ignored_;  // key -> note
  std::vector<HfField> defaults_;
  std::map<std::string, std::string, std::less<>> origin_;  // moeplan field -> key
};

// Keys every model type ignores: token ids, dtype, versions, initialisation,
// positions (rope), router losses and scales, dropout, caching.
bool HfCommonlyIgnored(std::string_view key);

// The model's shape keys every type shares (sizes, layers, heads, vocabulary,
// activation, embeddings, norm, biases), into `m`.
absl::Status MapHfCommon(HfType type, HfReader& r, v1::ModelConfig* m);
// Per family: experts, routing, layer pattern, attention kind.
absl::Status MapHfMixtralOlmoe(HfType type, HfReader& r, v1::ModelConfig* m);
absl::Status MapHfQwen(HfType type, HfReader& r, v1::ModelConfig* m);
absl::Status MapHfDeepseek(HfType type, HfReader& r, v1::ModelConfig* m);
// Dense models (Llama, Qwen3): the FFN size; no moe message.
absl::Status MapHfDense(HfType type, HfReader& r, v1::ModelConfig* m);

// "-> moe.layer_freq = 1" or "-> moe.layer_pattern" set on `m` from one
// entry per layer (1: MoE); every layer MoE is layer_freq 1.
void SetHfLayerPattern(const std::vector<int>& moe, v1::ModelConfig* m);
std::string HfPatternNote(const std::vector<int>& moe);

}  // namespace moeplan::proto::internal
