// Model configs, their rules, and the graph algorithms of docs/model.md
// (reachability, best-fit dW placement, the partition DP).
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

std::string_view VariantName(Variant v) {
  switch (v) {
    case Variant::kNone:
      return "none";
    case Variant::kTutel:
      return "tutel";
    case Variant::kDw:
      return "dw";
    case Variant::kPartition:
      return "partition";
    case Variant::kLancet:
      return "lancet";
  }
  return "unknown";
}

bool ParseVariant(std::string_view name, Variant* out) {
  for (Variant v : kAllVariants) {
    if (VariantName(v) == name) {
      *out = v;
      return true;
    }
  }
  return false;
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

absl::Status ValidateModelPlanOptions(const ModelPlanOptions& o) {
  if (o.bucket_bytes < 1 || o.bucket_bytes > (int64_t{1} << 40)) {
    return Bad("bucket_bytes", "must be between 1 and 2^40", Cat(o.bucket_bytes));
  }
  if (o.max_partitions < 1 || o.max_partitions > 64) {
    return Bad("max_partitions", "must be between 1 and 64", Cat(o.max_partitions));
  }
  if (o.partition_groups < 1 || o.partition_groups > 64) {
    return Bad("partition_groups", "must be between 1 and 64", Cat(o.partition_groups));
  }
  if (o.max_span < 0 || o.max_span > 1024) {
    return Bad("max_span", "must be between 0 (the span between two MoE layers) and 1024",
               Cat(o.max_span));
  }
  if (o.tutel_degrees.empty()) return Bad("tutel_degrees", "must not be empty", "[]");
  for (int r : o.tutel_degrees) {
    if (r < 1 || r > 64) return Bad("tutel_degrees", "each must be between 1 and 64", Cat(r));
  }
  auto once = [](auto list, std::string_view field, auto name) -> absl::Status {
    for (size_t i = 0; i < list.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        if (list[i] == list[j]) {
          return Bad(field, "each may be listed once", Cat(name(list[i]), " twice"));
        }
      }
    }
    return absl::OkStatus();
  };
  MOEPLAN_RETURN_IF_ERROR(once(o.variants, "variants", VariantName));
  MOEPLAN_RETURN_IF_ERROR(once(o.schedules, "schedules", ScheduleName));
  MOEPLAN_RETURN_IF_ERROR(once(o.algos, "alltoall_algorithms", AllToAllAlgoName));
  return absl::OkStatus();
}

const VariantPlan* ModelPlan::Find(Variant v) const {
  for (const VariantPlan& p : variants) {
    if (p.variant == v) return &p;
  }
  return nullptr;
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

RankParams StageParams(const ModelConfig& m, const StageOptions& stage) {
  const int end = stage.end_block < 0 ? m.num_layers : stage.end_block;
  RankParams r;
  for (int blk = stage.first_block; blk < end; ++blk) {
    const RankParams b = BlockParams(m, blk);
    r.dense += b.dense;
    r.expert += b.expert;
  }
  const double M = static_cast<double>(m.hidden_size);
  const double v = static_cast<double>(m.vocab_size / m.parallel.mp);
  // A last stage without the embedding holds its own copy of the tied LM head.
  if (m.vocab_size > 0 && stage.embed) r.dense += v * M + static_cast<double>(m.seq_length) * M;
  if (m.vocab_size > 0 && stage.head) r.dense += 2 * M + (stage.embed ? 0.0 : v * M);
  return r;
}

// ---- Reachability ----

void Reachability::Compute(const OpGraph& g, OpId first) {
  first_ = first;
  const int n = g.size() - first;
  words_ = (n + 63) / 64;
  anc_.assign(static_cast<size_t>(n) * words_, 0);
  for (int v = 0; v < n; ++v) {
    uint64_t* row = anc_.data() + static_cast<size_t>(v) * words_;
    for (OpId d : g.deps(first + v)) {
      const int u = d - first;
      if (u < 0) continue;  // before the window: not tracked
      const uint64_t* from = anc_.data() + static_cast<size_t>(u) * words_;
      for (int w = 0; w < words_; ++w) row[w] |= from[w];
      row[u / 64] |= uint64_t{1} << (u % 64);
    }
  }
}

bool Reachability::Path(OpId from, OpId to) const {
  const int u = from - first_, v = to - first_;
  if (u < 0 || v < 0 || u == v) return false;
  return (anc_[static_cast<size_t>(v) * words_ + u / 64] >> (u % 64)) & 1;
}

// ---- Best-fit dW placement ----

std::vector<std::vector<int>> BestFitDw(std::span<const double> slot_us,
                                        std::span<const double> dw_us,
                                        absl::FunctionRef<bool(int, int)> eligible) {
  std::vector<std::vector<int>> picks(slot_us.size());
  std::vector<bool> used(dw_us.size(), false);
  std::vector<std::pair<double, int>> cand;  // (time, dw), sorted
  for (size_t s = 0; s < slot_us.size(); ++s) {
    cand.clear();
    for (size_t d = 0; d < dw_us.size(); ++d) {
      if (!used[d] && eligible(static_cast<int>(s), static_cast<int>(d))) {
        cand.emplace_back(dw_us[d], static_cast<int>(d));
      }
    }
    std::sort(cand.begin(), cand.end());
    double remaining = slot_us[s];
    while (remaining > 0.0 && !cand.empty()) {
      // The candidate closest to the remaining time: at the lower bound or just before.
      auto it = std::lower_bound(cand.begin(), cand.end(), std::pair{remaining, -1});
      if (it == cand.end() ||
          (it != cand.begin() && remaining - std::prev(it)->first <= it->first - remaining)) {
        --it;
      }
      picks[s].push_back(it->second);
      used[static_cast<size_t>(it->second)] = true;
      remaining -= it->first;
      cand.erase(it);
    }
  }
  return picks;
}

// ---- The partition DP ----

std::vector<PartitionChoice> PartitionDp(int n, int max_span, int max_k,
                                         absl::FunctionRef<double(int, int, int)> cost) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> t(static_cast<size_t>(n) + 1, kInf);
  std::vector<PartitionChoice> from(static_cast<size_t>(n) + 1);
  t[0] = 0.0;
  for (int j = 1; j <= n; ++j) {
    for (int i = std::max(0, j - std::max(1, max_span)); i < j; ++i) {
      if (t[static_cast<size_t>(i)] == kInf) continue;
      for (int k = 1; k <= max_k; ++k) {
        const double p = cost(i, j, k);
        if (p < 0.0) continue;
        const double total = t[static_cast<size_t>(i)] + p;
        if (total < t[static_cast<size_t>(j)]) {
          t[static_cast<size_t>(j)] = total;
          from[static_cast<size_t>(j)] = {i, j, k, p};
        }
      }
    }
  }
  std::vector<PartitionChoice> out;
  for (int j = n; j > 0; j = from[static_cast<size_t>(j)].begin) {
    out.push_back(from[static_cast<size_t>(j)]);
  }
  std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace moeplan::planner
