// Model configs, their rules and the parameters a rank holds (docs/model.md).
#include "moeplan/planner/model.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "enum_names.h"
#include "field_rules.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/validate.h"

namespace moeplan::planner {
namespace {

using internal::Bad;
using internal::CheckDim;

constexpr int kMaxLayers = 1024;

absl::Status Divides(std::string_view field, std::string_view what, int64_t d, int64_t n,
                     std::string_view got) {
  if (d > 0 && n % d == 0) return absl::OkStatus();
  return Bad(field, Cat("must divide ", what), got);
}

// The layer rules name LayerConfig fields; say them as the model file does.
std::string ModelField(std::string_view msg) {
  static constexpr std::pair<std::string_view, std::string_view> kMap[] = {
      {"batch_size", "micro_batch_size"},
      {"seq_len", "seq_length"},
      {"model_dim", "hidden_size"},
      {"hidden_dim", "moe.expert_ffn_hidden_size"},
      {"num_experts", "moe.num_experts"},
      {"top_k", "moe.top_k"},
      {"capacity_factor", "moe.capacity_factor"},
  };
  for (const auto& [layer, model] : kMap) {
    if (msg.rfind(layer, 0) == 0 && msg.size() > layer.size() && msg[layer.size()] == ':') {
      return Cat(model, msg.substr(layer.size()));
    }
  }
  return std::string(msg);
}

constexpr int kMaxMtpLayers = 16;

absl::Status ValidateAttention(const ModelConfig& m) {
  const std::string heads = Cat("num_attention_heads=", m.num_attention_heads);
  if (m.kv_channels != 0) {
    MOEPLAN_RETURN_IF_ERROR(CheckDim("kv_channels", m.kv_channels));
  } else if (!m.multi_latent_attention) {
    MOEPLAN_RETURN_IF_ERROR(
        Divides("num_attention_heads", "hidden_size (or set kv_channels, the head size)",
                m.num_attention_heads, m.hidden_size, Cat(heads, ", hidden_size=", m.hidden_size)));
  }
  if (m.num_query_groups != 0) {
    MOEPLAN_RETURN_IF_ERROR(CheckDim("num_query_groups", m.num_query_groups));
    MOEPLAN_RETURN_IF_ERROR(Divides("num_query_groups",
                                    "num_attention_heads (each key/value head serves a group)",
                                    m.num_query_groups, m.num_attention_heads,
                                    Cat("num_query_groups=", m.num_query_groups, ", ", heads)));
  }
  if (!m.multi_latent_attention) return absl::OkStatus();
  if (m.num_query_groups != 0) {
    return Bad("num_query_groups", "must be unset with multi_latent_attention",
               Cat(m.num_query_groups));
  }
  if (m.kv_channels != 0) {
    return Bad("kv_channels",
               "must be unset with multi_latent_attention (its head sizes are qk_head_dim, "
               "qk_pos_emb_head_dim and v_head_dim)",
               Cat(m.kv_channels));
  }
  const MlaSpec& a = m.mla;
  if (a.q_lora_rank != 0) {
    MOEPLAN_RETURN_IF_ERROR(CheckDim("multi_latent_attention.q_lora_rank", a.q_lora_rank));
  }
  MOEPLAN_RETURN_IF_ERROR(CheckDim("multi_latent_attention.kv_lora_rank", a.kv_lora_rank));
  MOEPLAN_RETURN_IF_ERROR(CheckDim("multi_latent_attention.qk_head_dim", a.qk_head_dim));
  if (a.qk_pos_emb_head_dim < 0 || a.qk_pos_emb_head_dim > internal::kMaxDim) {
    return Bad("multi_latent_attention.qk_pos_emb_head_dim",
               Cat("must be between 0 and ", internal::kMaxDim), Cat(a.qk_pos_emb_head_dim));
  }
  return CheckDim("multi_latent_attention.v_head_dim", a.v_head_dim);
}

// A dense model (moe.num_experts 0) sets none of the MoE layers' fields.
absl::Status ValidateDenseMoeFields(const MoeSpec& e) {
  const std::pair<std::string_view, bool> kSet[] = {
      {"moe.layer_pattern", !e.layer_pattern.empty()},
      {"moe.expert_ffn_hidden_size", e.expert_ffn_hidden_size != 0},
      {"moe.shared_expert_ffn_hidden_size", e.shared_expert_ffn_hidden_size != 0},
      {"moe.num_shared_experts", e.num_shared_experts != 0},
      {"moe.shared_expert_gate", e.shared_expert_gate},
      {"moe.router_num_groups", e.router_num_groups != 0},
      {"moe.dropless", e.dropless},
      {"moe.router_force_load_balancing", e.router_force_load_balancing},
  };
  for (const auto& [field, set] : kSet) {
    if (set) {
      return Bad("moe.num_experts",
                 Cat("must be > 0 when ", field,
                     " is set (a dense model leaves moe unset; an MoE model needs its experts)"),
                 "0");
    }
  }
  return absl::OkStatus();
}

// The MoE layers' pattern, experts and routing (the layer rules on one rank
// are ValidateModelMoeLayer's).
absl::Status ValidateMoeRouting(const ModelConfig& m) {
  const MoeSpec& e = m.moe;
  if (m.IsDense()) return ValidateDenseMoeFields(e);
  if (!e.layer_pattern.empty()) {
    if (e.layer_freq != 0) {
      return Bad("moe.layer_freq", "must be unset (0) when moe.layer_pattern is given",
                 Cat(e.layer_freq));
    }
    if (static_cast<int>(e.layer_pattern.size()) != m.num_layers) {
      return Bad("moe.layer_pattern", "must have one entry per layer (num_layers)",
                 Cat(e.layer_pattern.size(), " entries, num_layers=", m.num_layers));
    }
    if (m.NumMoeLayers() == 0) {
      return Bad("moe.layer_pattern", "must mark at least one MoE layer (1)", "all 0");
    }
  } else if (e.layer_freq < 1 || e.layer_freq > kMaxLayers) {
    return Bad("moe.layer_freq", Cat("must be between 1 and ", kMaxLayers), Cat(e.layer_freq));
  }
  MOEPLAN_RETURN_IF_ERROR(CheckDim("moe.num_experts", e.num_experts));
  MOEPLAN_RETURN_IF_ERROR(CheckDim("moe.expert_ffn_hidden_size", e.expert_ffn_hidden_size));
  if (e.shared_expert_ffn_hidden_size != 0) {
    MOEPLAN_RETURN_IF_ERROR(
        CheckDim("moe.shared_expert_ffn_hidden_size", e.shared_expert_ffn_hidden_size));
    if (e.num_shared_experts < 0 || e.num_shared_experts > 64) {
      return Bad("moe.num_shared_experts", "must be between 1 and 64 (unset: 1)",
                 Cat(e.num_shared_experts));
    }
  } else if (e.num_shared_experts != 0) {
    return Bad("moe.num_shared_experts", "needs moe.shared_expert_ffn_hidden_size (their size)",
               Cat(e.num_shared_experts));
  }
  if (e.shared_expert_gate && e.shared_expert_ffn_hidden_size == 0) {
    return Bad("moe.shared_expert_gate",
               "needs a shared expert (moe.shared_expert_ffn_hidden_size)", "true");
  }
  if (e.gate == Gate::kSwitch && e.top_k != 1) {
    return Bad("moe.top_k", "must be 1 with the switch gate", Cat(e.top_k));
  }
  if (e.router_num_groups != 0) {
    const std::string got =
        Cat("router_num_groups=", e.router_num_groups, ", num_experts=", e.num_experts);
    MOEPLAN_RETURN_IF_ERROR(CheckDim("moe.router_num_groups", e.router_num_groups));
    MOEPLAN_RETURN_IF_ERROR(Divides("moe.router_num_groups", "moe.num_experts", e.router_num_groups,
                                    e.num_experts, got));
    if (e.router_group_topk < 1 || e.router_group_topk > e.router_num_groups) {
      return Bad("moe.router_group_topk", "must be between 1 and moe.router_num_groups",
                 Cat("router_group_topk=", e.router_group_topk,
                     ", router_num_groups=", e.router_num_groups));
    }
    const int64_t reachable = e.router_group_topk * (e.num_experts / e.router_num_groups);
    if (e.top_k > reachable) {
      return Bad("moe.top_k",
                 "must be <= the experts of router_group_topk groups "
                 "(router_group_topk * num_experts / router_num_groups)",
                 Cat("top_k=", e.top_k, ", reachable=", reachable));
    }
  }
  if (e.dropless && e.capacity_factor != 0.0) {
    return Bad("moe.capacity_factor", "must be unset with moe.dropless (no capacity)",
               Cat(e.capacity_factor));
  }
  if (e.router_force_load_balancing && e.token_skew != 1.0) {
    return Bad("moe.token_skew", "must be unset or 1 with moe.router_force_load_balancing",
               Cat(e.token_skew));
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view GateName(Gate g) {
  switch (g) {
    case Gate::kTopK:
      return "top_k";
    case Gate::kSwitch:
      return "switch";
    case Gate::kBatchPrioritized:
      return "batch_prioritized";
  }
  return "unknown";
}

std::string_view NormalizationName(Normalization n) {
  return n == Normalization::kRmsNorm ? "RMSNorm" : "LayerNorm";
}

std::string_view AttentionBackendName(AttentionBackend a) {
  switch (a) {
    case AttentionBackend::kUnfused:
      return "unfused";
    case AttentionBackend::kFlash:
      return "flash";
    case AttentionBackend::kFused:
      return "fused";
  }
  return "unknown";
}

std::string_view PositionEmbeddingName(PositionEmbedding p) {
  switch (p) {
    case PositionEmbedding::kLearnedAbsolute:
      return "learned_absolute";
    case PositionEmbedding::kRope:
      return "rope";
    case PositionEmbedding::kNone:
      return "none";
  }
  return "unknown";
}

std::string_view Fp8FormatName(Fp8Format f) {
  switch (f) {
    case Fp8Format::kNone:
      return "none";
    case Fp8Format::kE4M3:
      return "e4m3";
    case Fp8Format::kHybrid:
      return "hybrid";
  }
  return "unknown";
}

bool ParseFp8Format(std::string_view name, Fp8Format* out) {
  return internal::ParseByName(name, kAllFp8Formats, Fp8FormatName, out);
}

std::string_view Fp8RecipeName(Fp8Recipe r) {
  switch (r) {
    case Fp8Recipe::kDelayed:
      return "delayed";
    case Fp8Recipe::kTensorwise:
      return "tensorwise";
    case Fp8Recipe::kBlockwise:
      return "blockwise";
    case Fp8Recipe::kMxfp8:
      return "mxfp8";
  }
  return "unknown";
}

bool ParseFp8Recipe(std::string_view name, Fp8Recipe* out) {
  return internal::ParseByName(name, kAllFp8Recipes, Fp8RecipeName, out);
}

int ModelConfig::NumMoeLayers() const {
  if (IsDense()) return 0;
  if (moe.layer_pattern.empty()) return (num_layers + moe.layer_freq - 1) / moe.layer_freq;
  int n = 0;
  for (uint8_t v : moe.layer_pattern) n += v != 0;
  return n;
}

LayerConfig ModelConfig::MoeLayer() const {
  LayerConfig l;
  l.name = name;
  l.batch_size = micro_batch_size;
  l.seq_len = seq_length;
  l.model_dim = hidden_size;
  // A dense model's placeholder: its FFN as one expert every token reaches,
  // so that the shape rules (sizes, element bytes, token bounds) still apply.
  const bool dense = IsDense();
  l.hidden_dim = dense ? ffn_hidden_size : moe.expert_ffn_hidden_size;
  l.num_experts = dense ? 1 : moe.num_experts;
  l.top_k = dense ? 1 : moe.top_k;
  l.capacity_factor = dense ? 1.0 : moe.capacity_factor;
  l.bytes_per_element = bytes_per_element;
  l.dropless = moe.dropless;
  l.token_skew = moe.token_skew;
  l.gated_linear_unit = gated_linear_unit;
  l.router_num_groups = dense ? 0 : moe.router_num_groups;
  l.router_group_topk = dense ? 0 : moe.router_group_topk;
  l.parallel = parallel;
  // The model's blocks split the sequence around the layer; the layer's
  // sections read it from the model (LayerContext::sequence_parallel).
  l.parallel.sequence_parallel = false;
  // Context parallelism splits the sequence before the layer: its tokens are
  // the rank's chunks (seq_length), its cp ranks counted in dp.
  l.parallel.cp = 1;
  return l;
}

namespace {

// Element sizes and FP8 training (docs/model.md "FP8").
absl::Status ValidatePrecision(const ModelConfig& m) {
  if (m.bytes_per_element == 1) {
    return Bad("bytes_per_element",
               "must be 2 (bf16/fp16) or 4 (fp32) in a model: FP8 training keeps activations, "
               "communication and the output layer in BF16; set fp8_format (e4m3 or hybrid) for "
               "FP8 GEMMs",
               "1");
  }
  if (m.Fp8() && m.bytes_per_element != 2) {
    return Bad("fp8_format", "needs bytes_per_element 2 (FP8 GEMMs beside BF16 activations)",
               Cat(Fp8FormatName(m.fp8_format), ", bytes_per_element=", m.bytes_per_element));
  }
  if (m.fp8_param_gather && !m.Fp8()) {
    return Bad("fp8_param_gather", "needs fp8_format (the weights it gathers are FP8)", "true");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateModelShape(const ModelConfig& m) {
  if (m.num_layers < 1 || m.num_layers > kMaxLayers) {
    return Bad("num_layers", Cat("must be between 1 and ", kMaxLayers), Cat(m.num_layers));
  }
  MOEPLAN_RETURN_IF_ERROR(CheckDim("hidden_size", m.hidden_size));
  MOEPLAN_RETURN_IF_ERROR(CheckDim("num_attention_heads", m.num_attention_heads));
  MOEPLAN_RETURN_IF_ERROR(CheckDim("ffn_hidden_size", m.ffn_hidden_size));
  MOEPLAN_RETURN_IF_ERROR(CheckDim("seq_length", m.seq_length));
  MOEPLAN_RETURN_IF_ERROR(CheckDim("micro_batch_size", m.micro_batch_size));
  if (m.vocab_size != 0) MOEPLAN_RETURN_IF_ERROR(CheckDim("vocab_size", m.vocab_size));
  MOEPLAN_RETURN_IF_ERROR(ValidateAttention(m));
  MOEPLAN_RETURN_IF_ERROR(ValidateMoeRouting(m));
  MOEPLAN_RETURN_IF_ERROR(ValidatePrecision(m));
  if (m.mtp_num_layers < 0 || m.mtp_num_layers > kMaxMtpLayers) {
    return Bad("mtp_num_layers", Cat("must be between 0 and ", kMaxMtpLayers),
               Cat(m.mtp_num_layers));
  }
  if (m.mtp_num_layers > 0 && m.vocab_size == 0) {
    return Bad("mtp_num_layers",
               "needs vocab_size (each depth embeds the next tokens and predicts them)",
               Cat(m.mtp_num_layers));
  }
  if (m.global_batch_size < 0 || m.global_batch_size > (int64_t{1} << 24)) {
    return Bad("global_batch_size", "must be between 0 (micro_batch_size * parallel.dp) and 2^24",
               Cat(m.global_batch_size));
  }
  return ValidateModelMoeLayer(m);
}

absl::Status ValidateModelMoeLayer(const ModelConfig& m) {
  // The layer rules on one rank (dimensions and buffer bounds).
  LayerConfig one = m.MoeLayer();
  one.parallel = ParallelLayout{};
  if (absl::Status s = ValidateLayer(one, ClusterShape{}); !s.ok()) {
    return absl::InvalidArgumentError(ModelField(View(s.message())));
  }
  return absl::OkStatus();
}

absl::Status ValidateModel(const ModelConfig& m, const ClusterShape& c) {
  MOEPLAN_RETURN_IF_ERROR(ValidateModelShape(m));
  if (m.IsDense()) {
    MOEPLAN_RETURN_IF_ERROR(ValidateDenseParallel(m.parallel, c));
  } else if (absl::Status s = ValidateLayer(m.MoeLayer(), c); !s.ok()) {
    // The layer rules (degrees, divisibility, cluster fit, buffer bounds).
    return absl::InvalidArgumentError(ModelField(View(s.message())));
  }
  const ParallelLayout& p = m.parallel;
  if (p.pp != 1) {
    return Bad("parallel.pp",
               "must be 1 for a variants plan (plan pipelines with a layout or a search)",
               Cat(p.pp));
  }
  if (p.sequence_parallel) {
    if (p.mp < 2) {
      return Bad("parallel.sequence_parallel",
                 "splits the sequence over the TP group: needs parallel.mp >= 2",
                 Cat("parallel.mp=", p.mp));
    }
    if (m.seq_length % p.mp != 0) {
      return Bad("parallel.sequence_parallel",
                 "splits each sequence over the TP group: seq_length must be divisible by "
                 "parallel.mp",
                 Cat("seq_length=", m.seq_length, ", parallel.mp=", p.mp));
    }
  }
  if (p.cp != 1) {
    // Set by a layout (ModelForLayout), which checked its own rules.
    if (p.cp < 1 || p.dp % p.cp != 0) {
      return Bad("parallel.cp", "must be >= 1 and divide parallel.dp (which counts the cp ranks)",
                 Cat("cp=", p.cp, ", dp=", p.dp));
    }
    if (!m.FusedAttention()) {
      return Bad("parallel.cp",
                 "context parallelism runs the attention as a ring of fused kernels: needs "
                 "attention_backend flash or fused",
                 Cat("cp=", p.cp));
    }
  }
  const std::string mp = Cat("parallel.mp=", p.mp);
  MOEPLAN_RETURN_IF_ERROR(Divides("parallel.mp", "num_attention_heads (Megatron TP splits heads)",
                                  p.mp, m.num_attention_heads,
                                  Cat(mp, ", num_attention_heads=", m.num_attention_heads)));
  MOEPLAN_RETURN_IF_ERROR(Divides("parallel.mp", "ffn_hidden_size", p.mp, m.ffn_hidden_size,
                                  Cat(mp, ", ffn_hidden_size=", m.ffn_hidden_size)));
  if (m.moe.SharedFfnSize() != 0) {
    MOEPLAN_RETURN_IF_ERROR(Divides("parallel.mp",
                                    "the shared experts' size (moe.num_shared_experts * "
                                    "moe.shared_expert_ffn_hidden_size)",
                                    p.mp, m.moe.SharedFfnSize(),
                                    Cat(mp, ", shared experts' size=", m.moe.SharedFfnSize())));
  }
  if (m.num_query_groups != 0) {
    MOEPLAN_RETURN_IF_ERROR(
        Divides("parallel.mp", "num_query_groups (Megatron TP splits the key/value heads)", p.mp,
                m.num_query_groups, Cat(mp, ", num_query_groups=", m.num_query_groups)));
  }
  if (m.vocab_size != 0) {
    MOEPLAN_RETURN_IF_ERROR(Divides("parallel.mp", "vocab_size (the LM head is split by vocab)",
                                    p.mp, m.vocab_size, Cat(mp, ", vocab_size=", m.vocab_size)));
  }
  return absl::OkStatus();
}

}  // namespace moeplan::planner
