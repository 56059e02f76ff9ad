// Hugging Face config.json import (docs/model.md "Hugging Face config.json"):
// the strict pass, the reader of the file's keys, the model type, and the
// moeplan rules run on the result. The per-type mappings are
// hf_config_models.cc.
#include "moeplan/proto/hf_config.h"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <algorithm>
#include <utility>

#include "hf_config_internal.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/model.h"
#include "moeplan/proto/convert.h"
#include "strict_json.h"

namespace moeplan::proto {

namespace internal {
namespace {

constexpr unsigned kDomFlags =
    rapidjson::kParseIterativeFlag | rapidjson::kParseValidateEncodingFlag;

std::string RangeText(int64_t v) { return v == kHfMaxDim ? std::string("2^24") : Cat(v); }

absl::Status BadInt(std::string_view key, int64_t lo, int64_t hi, const rapidjson::Value& v) {
  return absl::InvalidArgumentError(Cat(key, ": must be an integer between ", RangeText(lo),
                                        " and ", RangeText(hi), " (got ", HfGot(v), ")"));
}

absl::Status Missing(std::string_view key, const rapidjson::Value* v) {
  return absl::InvalidArgumentError(
      Cat(key, ": required (", v == nullptr ? "missing" : "got null", ")"));
}

std::string_view KeyOf(const rapidjson::Value& name) {
  return {name.GetString(), name.GetStringLength()};
}

}  // namespace

std::string_view HfTypeName(HfType t) {
  switch (t) {
    case HfType::kMixtral:
      return "mixtral";
    case HfType::kQwen2Moe:
      return "qwen2_moe";
    case HfType::kQwen3Moe:
      return "qwen3_moe";
    case HfType::kDeepseekV2:
      return "deepseek_v2";
    case HfType::kDeepseekV3:
      return "deepseek_v3";
    case HfType::kOlmoe:
      return "olmoe";
    case HfType::kLlama:
      return "llama";
    case HfType::kQwen3:
      return "qwen3";
  }
  return "unknown";
}

std::string HfGot(const rapidjson::Value& v) {
  rapidjson::StringBuffer buffer;
  rapidjson::Writer<rapidjson::StringBuffer> writer(buffer);
  v.Accept(writer);
  return Printable(std::string_view(buffer.GetString(), buffer.GetSize()), kQuotedBytes);
}

const rapidjson::Value* HfReader::Find(std::string_view key) const {
  for (auto it = object_.MemberBegin(); it != object_.MemberEnd(); ++it) {
    if (KeyOf(it->name) == key) return &it->value;
  }
  return nullptr;
}

bool HfReader::Given(std::string_view key) const {
  const rapidjson::Value* v = Find(key);
  return v != nullptr && !v->IsNull();
}

absl::StatusOr<int64_t> HfReader::Int(std::string_view key, int64_t lo, int64_t hi) const {
  const rapidjson::Value* v = Find(key);
  if (v == nullptr || v->IsNull()) return Missing(key, v);
  if (!v->IsInt64() || v->GetInt64() < lo || v->GetInt64() > hi) return BadInt(key, lo, hi, *v);
  return v->GetInt64();
}

absl::StatusOr<int64_t> HfReader::IntOr(std::string_view key, int64_t lo, int64_t hi,
                                        int64_t fallback) const {
  if (!Given(key)) return fallback;
  return Int(key, lo, hi);
}

absl::StatusOr<bool> HfReader::BoolOr(std::string_view key, bool fallback) const {
  const rapidjson::Value* v = Find(key);
  if (v == nullptr || v->IsNull()) return fallback;
  if (!v->IsBool()) {
    return absl::InvalidArgumentError(Cat(key, ": must be true or false (got ", HfGot(*v), ")"));
  }
  return v->GetBool();
}

absl::StatusOr<std::string> HfReader::StringOr(std::string_view key,
                                               std::string_view fallback) const {
  const rapidjson::Value* v = Find(key);
  if (v == nullptr || v->IsNull()) return std::string(fallback);
  if (!v->IsString()) {
    return absl::InvalidArgumentError(Cat(key, ": must be a string (got ", HfGot(*v), ")"));
  }
  return std::string(v->GetString(), v->GetStringLength());
}

absl::StatusOr<std::vector<int64_t>> HfReader::IntListOr(std::string_view key, int64_t lo,
                                                         int64_t hi) const {
  std::vector<int64_t> out;
  const rapidjson::Value* v = Find(key);
  if (v == nullptr || v->IsNull()) return out;
  if (!v->IsArray()) {
    return absl::InvalidArgumentError(
        Cat(key, ": must be a list of integers (got ", HfGot(*v), ")"));
  }
  for (rapidjson::SizeType i = 0; i < v->Size(); ++i) {
    const rapidjson::Value& e = (*v)[i];
    if (!e.IsInt64() || e.GetInt64() < lo || e.GetInt64() > hi) {
      return BadInt(Cat(key, "[", i, "]"), lo, hi, e);
    }
    out.push_back(e.GetInt64());
  }
  return out;
}

void HfReader::Use(std::string_view key, std::string_view note, std::string_view field) {
  std::string& at = used_[std::string(key)];
  at += at.empty() ? Cat("-> ", note) : Cat("; ", note);
  if (!field.empty()) origin_[std::string(field)] = std::string(key);
}

void HfReader::UseDefault(std::string_view key, std::string_view value, std::string_view note,
                          std::string_view field) {
  if (Present(key)) {  // null: the default too, listed where the file has it
    Use(key, Cat(note, " (null: default ", value, ")"), field);
    return;
  }
  defaults_.push_back(
      {std::string(key), HfField::kUsed, Cat("-> ", note, " (absent: default ", value, ")")});
  if (!field.empty()) origin_[std::string(field)] = std::string(key);
}

void HfReader::Ignore(std::string_view key, std::string_view note) {
  ignored_[std::string(key)] = std::string(note);
}

std::string HfReader::Origin(std::string_view field) const {
  const auto it = origin_.find(field);
  return it == origin_.end() ? std::string() : it->second;
}

std::vector<HfField> HfReader::Fields() const {
  std::vector<HfField> out;
  for (auto it = object_.MemberBegin(); it != object_.MemberEnd(); ++it) {
    const std::string_view key = KeyOf(it->name);
    HfField f{std::string(key), HfField::kUnknown, "(not used)"};
    if (const auto u = used_.find(key); u != used_.end()) {
      f.use = HfField::kUsed;
      f.note = u->second;
    } else if (const auto i = ignored_.find(key); i != ignored_.end()) {
      f.use = HfField::kIgnored;
      f.note = i->second;
    } else if (HfCommonlyIgnored(key)) {
      f.use = HfField::kIgnored;
      f.note.clear();
    }
    out.push_back(std::move(f));
  }
  out.insert(out.end(), defaults_.begin(), defaults_.end());
  return out;
}

bool HfCommonlyIgnored(std::string_view key) {
  static constexpr std::string_view kKeys[] = {
      "_name_or_path",
      "attention_dropout",
      "aux_loss_alpha",
      "auto_map",
      "bos_token_id",
      "dtype",
      "eos_token_id",
      "ep_size",
      "initializer_range",
      "max_position_embeddings",
      "norm_topk_prob",
      "output_router_logits",
      "pad_token_id",
      "pretraining_tp",
      "rope_interleave",
      "rope_parameters",
      "rope_scaling",
      "rope_theta",
      "routed_scaling_factor",
      "router_aux_loss_coef",
      "router_jitter_noise",
      "scoring_func",
      "seq_aux",
      "torch_dtype",
      "transformers_version",
      "use_cache",
  };
  return std::find(std::begin(kKeys), std::end(kKeys), key) != std::end(kKeys);
}

void SetHfLayerPattern(const std::vector<int>& moe, v1::ModelConfig* m) {
  v1::MoeConfig* e = m->mutable_moe();
  if (std::all_of(moe.begin(), moe.end(), [](int v) { return v == 1; })) {
    e->set_layer_freq(1);
    return;
  }
  e->clear_layer_freq();
  for (int v : moe) e->add_layer_pattern(v);
}

std::string HfPatternNote(const std::vector<int>& moe) {
  if (std::all_of(moe.begin(), moe.end(), [](int v) { return v == 1; })) {
    return "moe.layer_freq = 1 (every layer MoE)";
  }
  std::string runs;
  for (size_t i = 0; i < moe.size();) {
    size_t j = i;
    while (j < moe.size() && moe[j] == moe[i]) ++j;
    runs += Cat(runs.empty() ? "" : ", ", moe[i], " x", j - i);
    i = j;
  }
  return Cat("moe.layer_pattern = [", runs, "]");
}

}  // namespace internal

namespace {

using internal::HfReader;
using internal::HfType;

constexpr std::pair<std::string_view, HfType> kTypes[] = {
    {"mixtral", HfType::kMixtral},
    {"qwen2_moe", HfType::kQwen2Moe},
    {"qwen3_moe", HfType::kQwen3Moe},
    {"deepseek_v2", HfType::kDeepseekV2},
    {"deepseek_v3", HfType::kDeepseekV3},
    {"olmoe", HfType::kOlmoe},
    {"llama", HfType::kLlama},
    {"qwen3", HfType::kQwen3},
};
constexpr std::pair<std::string_view, HfType> kArchitectures[] = {
    {"MixtralForCausalLM", HfType::kMixtral},       {"Qwen2MoeForCausalLM", HfType::kQwen2Moe},
    {"Qwen3MoeForCausalLM", HfType::kQwen3Moe},     {"DeepseekV2ForCausalLM", HfType::kDeepseekV2},
    {"DeepseekV3ForCausalLM", HfType::kDeepseekV3}, {"OlmoeForCausalLM", HfType::kOlmoe},
    {"LlamaForCausalLM", HfType::kLlama},           {"Qwen3ForCausalLM", HfType::kQwen3},
};

// "model_type" decides; without it, the first of "architectures" known.
absl::StatusOr<HfType> DetectType(HfReader& r) {
  if (const rapidjson::Value* v = r.Find("model_type"); v != nullptr && !v->IsNull()) {
    const std::string_view got =
        v->IsString() ? std::string_view(v->GetString(), v->GetStringLength()) : "";
    for (const auto& [name, type] : kTypes) {
      if (got != name) continue;
      if (r.Present("architectures")) r.Ignore("architectures", "(model_type decides)");
      return type;
    }
    return absl::InvalidArgumentError(
        Cat("model_type: must be one of mixtral, qwen2_moe, qwen3_moe, deepseek_v2, "
            "deepseek_v3, olmoe, llama, qwen3 (got ",
            internal::HfGot(*v), ")"));
  }
  const rapidjson::Value* a = r.Find("architectures");
  if (a == nullptr || a->IsNull()) {
    return absl::InvalidArgumentError(
        "model_type: required (missing; nor are architectures given)");
  }
  if (a->IsArray()) {
    for (const rapidjson::Value& e : a->GetArray()) {
      if (!e.IsString()) continue;
      for (const auto& [name, type] : kArchitectures) {
        if (std::string_view(e.GetString(), e.GetStringLength()) == name) {
          r.Use("architectures", Cat("model_type ", internal::HfTypeName(type)));
          return type;
        }
      }
    }
  }
  return absl::InvalidArgumentError(
      Cat("architectures: must name one of MixtralForCausalLM, Qwen2MoeForCausalLM, "
          "Qwen3MoeForCausalLM, DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, OlmoeForCausalLM, "
          "LlamaForCausalLM, Qwen3ForCausalLM when model_type is absent (got ",
          internal::HfGot(*a), ")"));
}

// The length of the UTF-8 character at s[i] (1 to 4), 0 when the bytes there
// are not one (truncated, overlong, a surrogate, past U+10FFFF).
size_t Utf8CharLength(std::string_view s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return 0;
  }
  const unsigned char b1 = n > 1 ? static_cast<unsigned char>(s[i + 1]) : 0;
  const bool bad = (n == 2 && c < 0xc2) || (n == 3 && c == 0xe0 && b1 < 0xa0) ||
                   (n == 3 && c == 0xed && b1 >= 0xa0) || (n == 4 && c == 0xf0 && b1 < 0x90) ||
                   (n == 4 && (c > 0xf4 || (c == 0xf4 && b1 >= 0x90)));
  return bad ? 0 : n;
}

// Valid UTF-8 without control characters, at most kMaxNameBytes: what
// CheckName and protobuf's string fields accept.
std::string SanitizeName(std::string_view name) {
  std::string out;
  for (size_t i = 0; i < name.size();) {
    const size_t n = Utf8CharLength(name, i);
    const std::string_view ch = name.substr(i, n == 0 ? 1 : n);
    out +=
        n == 0 || FindControlCharacter(ch) != std::string_view::npos ? std::string_view("_") : ch;
    i += ch.size();
  }
  return out.substr(0, strings_internal::Utf8Prefix(out, kMaxNameBytes));
}

// A moeplan rule broken by a mapped value, said against the config.json key
// it came from: "num_key_value_heads: num_query_groups must divide ...".
absl::Status FromKey(const HfReader& r, const absl::Status& s) {
  const std::string_view msg = View(s.message());
  const size_t colon = msg.find(": ");
  if (colon == std::string_view::npos) return s;
  const std::string_view field = msg.substr(0, colon);
  const std::string key = r.Origin(field);
  if (key.empty() || key == field) return s;
  return absl::Status(s.code(), Cat(key, ": ", field, " ", msg.substr(colon + 2)));
}

void SetTraining(const HfTraining& t, v1::ModelConfig* m) {
  m->set_seq_length(t.seq_length);
  m->set_micro_batch_size(t.micro_batch_size);
  if (t.global_batch_size != 0) m->set_global_batch_size(t.global_batch_size);
  m->set_bytes_per_element(2);
  m->set_fp8_format(t.fp8_format);
  m->set_fp8_recipe(t.fp8_recipe);
  m->set_fp8_param_gather(t.fp8_param_gather);
  if (m->has_moe()) {  // a dense model has none
    m->mutable_moe()->set_gate(v1::GATE_TOP_K);
    m->mutable_moe()->set_dropless(true);
  }
  v1::ParallelLayout* p = m->mutable_parallel();
  p->set_mp(1);
  p->set_ep(1);
  p->set_esp(1);
  p->set_dp(1);
  p->set_pp(1);
}

}  // namespace

std::string_view HfUseName(HfField::Use use) {
  switch (use) {
    case HfField::kUsed:
      return "used";
    case HfField::kIgnored:
      return "ignored";
    case HfField::kUnknown:
      return "unknown";
  }
  return "unknown";
}

bool LooksLikeHfConfig(std::string_view json_text) {
  rapidjson::Document d;
  d.Parse<internal::kDomFlags>(json_text.data(), json_text.size());
  return !d.HasParseError() && d.IsObject() &&
         (d.HasMember("model_type") || d.HasMember("architectures"));
}

absl::StatusOr<HfImport> ImportHfConfig(std::string_view json_text, const HfTraining& training,
                                        std::string_view name) {
  MOEPLAN_RETURN_IF_ERROR(internal::CheckStrictJson(json_text));
  rapidjson::Document d;
  d.Parse<internal::kDomFlags>(json_text.data(), json_text.size());
  if (d.HasParseError()) return absl::InvalidArgumentError("invalid JSON");
  if (!d.IsObject()) {
    return absl::InvalidArgumentError(Cat(
        "config.json: must be a JSON object with \"model_type\" (got ", internal::HfGot(d), ")"));
  }
  HfReader r(d);
  MOEPLAN_ASSIGN_OR_RETURN(const HfType type, DetectType(r));
  HfImport out;
  v1::ModelConfig& m = out.model;
  m.set_schema_version(1);
  const std::string safe = SanitizeName(name);
  m.set_name(safe.empty() ? std::string(internal::HfTypeName(type)) : safe);
  MOEPLAN_RETURN_IF_ERROR(internal::MapHfCommon(type, r, &m));
  switch (type) {
    case HfType::kMixtral:
    case HfType::kOlmoe:
      MOEPLAN_RETURN_IF_ERROR(internal::MapHfMixtralOlmoe(type, r, &m));
      break;
    case HfType::kQwen2Moe:
    case HfType::kQwen3Moe:
      MOEPLAN_RETURN_IF_ERROR(internal::MapHfQwen(type, r, &m));
      break;
    case HfType::kDeepseekV2:
    case HfType::kDeepseekV3:
      MOEPLAN_RETURN_IF_ERROR(internal::MapHfDeepseek(type, r, &m));
      break;
    case HfType::kLlama:
    case HfType::kQwen3:
      MOEPLAN_RETURN_IF_ERROR(internal::MapHfDense(type, r, &m));
      break;
  }
  SetTraining(training, &m);
  absl::StatusOr<planner::ModelConfig> model = ModelFromProto(m);
  if (!model.ok()) return FromKey(r, model.status());
  if (absl::Status s = planner::ValidateModelShape(*model); !s.ok()) return FromKey(r, s);
  out.fields = r.Fields();
  return out;
}

}  // namespace moeplan::proto
