// Model configs, their rules and the parameters a rank holds (docs/model.md).
#include "moeplan/planner/model.h"

#include <algorithm>
#include <cmath>
#include <limits>

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

LayerConfig ModelConfig::MoeLayer() const {
  LayerConfig l;
  l.name = name;
  l.batch_size = micro_batch_size;
  l.seq_len = seq_length;
  l.model_dim = hidden_size;
  l.hidden_dim = moe.expert_ffn_hidden_size;
  l.num_experts = moe.num_experts;
  l.top_k = moe.top_k;
  l.capacity_factor = moe.capacity_factor;
  l.bytes_per_element = bytes_per_element;
  l.parallel = parallel;
  return l;
}

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
  MOEPLAN_RETURN_IF_ERROR(Divides("num_attention_heads", "hidden_size", m.num_attention_heads,
                                  m.hidden_size,
                                  Cat("num_attention_heads=", m.num_attention_heads,
                                      ", hidden_size=", m.hidden_size)));
  if (m.moe.layer_freq < 1 || m.moe.layer_freq > kMaxLayers) {
    return Bad("moe.layer_freq", Cat("must be between 1 and ", kMaxLayers), Cat(m.moe.layer_freq));
  }
  MOEPLAN_RETURN_IF_ERROR(CheckDim("moe.num_experts", m.moe.num_experts));
  MOEPLAN_RETURN_IF_ERROR(CheckDim("moe.expert_ffn_hidden_size", m.moe.expert_ffn_hidden_size));
  if (m.moe.shared_expert_ffn_hidden_size != 0) {
    MOEPLAN_RETURN_IF_ERROR(
        CheckDim("moe.shared_expert_ffn_hidden_size", m.moe.shared_expert_ffn_hidden_size));
  }
  if (m.moe.gate == Gate::kSwitch && m.moe.top_k != 1) {
    return Bad("moe.top_k", "must be 1 with the switch gate", Cat(m.moe.top_k));
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
  // The layer rules (degrees, divisibility, cluster fit, buffer bounds).
  if (absl::Status s = ValidateLayer(m.MoeLayer(), c); !s.ok()) {
    return absl::InvalidArgumentError(ModelField(View(s.message())));
  }
  const ParallelLayout& p = m.parallel;
  if (p.pp != 1) {
    return Bad("parallel.pp",
               "must be 1 for a variants plan (plan pipelines with a layout or a search)",
               Cat(p.pp));
  }
  const std::string mp = Cat("parallel.mp=", p.mp);
  MOEPLAN_RETURN_IF_ERROR(Divides("parallel.mp", "num_attention_heads (Megatron TP splits heads)",
                                  p.mp, m.num_attention_heads,
                                  Cat(mp, ", num_attention_heads=", m.num_attention_heads)));
  MOEPLAN_RETURN_IF_ERROR(Divides("parallel.mp", "ffn_hidden_size", p.mp, m.ffn_hidden_size,
                                  Cat(mp, ", ffn_hidden_size=", m.ffn_hidden_size)));
  if (m.moe.shared_expert_ffn_hidden_size != 0) {
    MOEPLAN_RETURN_IF_ERROR(Divides("parallel.mp", "moe.shared_expert_ffn_hidden_size", p.mp,
                                    m.moe.shared_expert_ffn_hidden_size,
                                    Cat(mp, ", shared_expert_ffn_hidden_size=",
                                        m.moe.shared_expert_ffn_hidden_size)));
  }
  if (m.vocab_size != 0) {
    MOEPLAN_RETURN_IF_ERROR(Divides("parallel.mp", "vocab_size (the LM head is split by vocab)",
                                    p.mp, m.vocab_size, Cat(mp, ", vocab_size=", m.vocab_size)));
  }
  return absl::OkStatus();
}

RankParams BlockParams(const ModelConfig& m, int block) {
  const double M = static_cast<double>(m.hidden_size), t = m.parallel.mp;
  const double attention = 3 * M * M / t + 3 * M / t + M * M / t + M + 4 * M;
  RankParams r;
  if (!m.IsMoeBlock(block)) {
    const double f = static_cast<double>(m.ffn_hidden_size) / t;
    r.dense = attention + 2 * M * f + f + M;
    return r;
  }
  r.dense = attention + M * static_cast<double>(m.moe.num_experts) +
            2 * M * static_cast<double>(m.moe.shared_expert_ffn_hidden_size) / t;
  r.expert = static_cast<double>(m.moe.num_experts / m.parallel.ep) * 2.0 * M *
             static_cast<double>(m.moe.expert_ffn_hidden_size / m.parallel.esp);
  return r;
}

}  // namespace moeplan::planner
