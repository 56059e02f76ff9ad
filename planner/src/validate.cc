#include "moeplan/planner/validate.h"

#include <cmath>
#include <initializer_list>
#include <string_view>
#include <utility>

#include "field_rules.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"

namespace moeplan::planner {
namespace {

using internal::Bad;
using internal::CheckDim;
using internal::kMaxDim;

// Upper bounds that keep every derived product far inside int64 and doubles exact.
constexpr int64_t kMaxTokens = int64_t{1} << 31;       // B * L
constexpr int64_t kMaxBufferBytes = int64_t{1} << 50;  // X and D: 1 PiB
constexpr double kMaxCapacityFactor = 1024.0;
constexpr int kMaxDegree = 1 << 20;

absl::Status CheckDegree(std::string_view field, int v) {
  if (v < 1) return Bad(field, "must be >= 1", Cat(v));
  if (v > kMaxDegree) return Bad(field, Cat("must be <= ", kMaxDegree), Cat(v));
  return absl::OkStatus();
}

// Groups of `size` consecutive (or strided) ranks only have a uniform shape when
// they tile nodes exactly.
bool TilesNodes(int64_t size, int gpus_per_node) {
  return gpus_per_node % size == 0 || size % gpus_per_node == 0;
}

}  // namespace

namespace {

// The layer's dimensions, routing and the buffers they imply.
absl::Status ValidateLayerShape(const LayerConfig& l) {
  MOEPLAN_RETURN_IF_ERROR(CheckDim("batch_size", l.batch_size));
  MOEPLAN_RETURN_IF_ERROR(CheckDim("seq_len", l.seq_len));
  MOEPLAN_RETURN_IF_ERROR(CheckDim("model_dim", l.model_dim));
  MOEPLAN_RETURN_IF_ERROR(CheckDim("hidden_dim", l.hidden_dim));
  MOEPLAN_RETURN_IF_ERROR(CheckDim("num_experts", l.num_experts));
  if (l.top_k < 1) return Bad("top_k", "must be >= 1", Cat(l.top_k));
  if (l.top_k > l.num_experts) {
    return Bad("top_k", "must be <= num_experts",
               Cat("top_k=", l.top_k, ", num_experts=", l.num_experts));
  }
  // Dropless routing has no capacity: the factor may be left unset (0).
  const bool cf_unset = l.dropless && l.capacity_factor == 0.0;
  if (!cf_unset && (!(l.capacity_factor > 0.0) || !std::isfinite(l.capacity_factor) ||
                    l.capacity_factor > kMaxCapacityFactor)) {
    return Bad("capacity_factor",
               Cat("must be > 0 and <= ", kMaxCapacityFactor, " (or unset when dropless)"),
               Cat(l.capacity_factor));
  }
  if (l.bytes_per_element != 1 && l.bytes_per_element != 2 && l.bytes_per_element != 4) {
    return Bad("bytes_per_element", "must be 1 (fp8), 2 (fp16/bf16) or 4 (fp32)",
               Cat(l.bytes_per_element));
  }
  if (!(l.token_skew >= 1.0) || !std::isfinite(l.token_skew) || l.token_skew > 1024.0) {
    return Bad("token_skew", "must be >= 1 (1 = balanced routing) and <= 1024", Cat(l.token_skew));
  }
  const int64_t tokens = l.batch_size * l.seq_len;
  if (tokens > kMaxTokens) {
    return Bad("batch_size", Cat("batch_size*seq_len must be <= ", kMaxTokens), Cat(tokens));
  }
  // Bound the buffers in double before Derive forms them in int64 (E*T*M*b can
  // overflow for absurd but in-range fields).
  const double cap =
      std::ceil(static_cast<double>(l.top_k) * (l.dropless ? l.token_skew : l.capacity_factor) *
                static_cast<double>(tokens) / static_cast<double>(l.num_experts));
  const double x_bytes = static_cast<double>(tokens) * l.model_dim * l.bytes_per_element;
  const double d_bytes =
      static_cast<double>(l.num_experts) * cap * l.model_dim * l.bytes_per_element;
  if (x_bytes > kMaxBufferBytes || d_bytes > kMaxBufferBytes) {
    return Bad("batch_size",
               "the activation S*M*b and dispatch buffer E*T*M*b must each be <= 1 PiB",
               Cat("X=", x_bytes, " B, D=", d_bytes, " B"));
  }
  return absl::OkStatus();
}

absl::Status CheckDegrees(const ParallelLayout& p) {
  MOEPLAN_RETURN_IF_ERROR(CheckDegree("parallel.mp", p.mp));
  MOEPLAN_RETURN_IF_ERROR(CheckDegree("parallel.ep", p.ep));
  MOEPLAN_RETURN_IF_ERROR(CheckDegree("parallel.esp", p.esp));
  MOEPLAN_RETURN_IF_ERROR(CheckDegree("parallel.dp", p.dp));
  return CheckDegree("parallel.pp", p.pp);
}

// How one stage's mp * dp ranks (and pp stages of them) fit the cluster.
absl::Status CheckStageFitsCluster(const ParallelLayout& p, const ClusterShape& c) {
  const int64_t dense = int64_t{p.mp} * p.dp;
  const int64_t total = dense * p.pp;
  if (total > c.TotalGpus()) {
    return Bad(
        "parallel",
        Cat("mp*dp*pp must be <= the cluster's GPUs (", c.nodes, " nodes x ", c.gpus_per_node, ")"),
        Cat(total, " ranks"));
  }
  const int g = c.gpus_per_node;
  if (!TilesNodes(p.mp, g)) {
    return Bad("parallel.mp", Cat("must divide gpus_per_node (", g, ") or be a multiple of it"),
               Cat(p.mp));
  }
  if (!TilesNodes(p.esp, g)) {
    return Bad("parallel.esp", Cat("must divide gpus_per_node (", g, ") or be a multiple of it"),
               Cat(p.esp));
  }
  if (!TilesNodes(dense, g)) {
    return Bad("parallel", Cat("mp*dp must divide gpus_per_node (", g, ") or be a multiple of it"),
               Cat(dense));
  }
  return absl::OkStatus();
}

// The parallel degrees: one stage's ranks, what each degree divides, and
// how the groups fit the cluster's nodes.
absl::Status ValidateLayerParallel(const LayerConfig& l, const ClusterShape& c) {
  const ParallelLayout& p = l.parallel;
  MOEPLAN_RETURN_IF_ERROR(CheckDegrees(p));
  if (p.sequence_parallel) {
    return Bad("parallel.sequence_parallel",
               "applies to models and layouts: a single MoE layer has no TP sub-blocks to split "
               "the sequence around",
               "true");
  }
  if (p.cp != 1) {
    return Bad("parallel.cp",
               "applies to layouts: a single MoE layer has no attention to split the sequence "
               "for",
               Cat(p.cp));
  }
  const int64_t dense = int64_t{p.mp} * p.dp;
  const int64_t expert = int64_t{p.ep} * p.esp;
  if (dense != expert) {
    return Bad("parallel", "mp*dp must equal ep*esp (both are the ranks of one pipeline stage)",
               Cat("mp*dp=", dense, ", ep*esp=", expert));
  }
  if (l.num_experts % p.ep != 0) {
    return Bad("parallel.ep", "must divide num_experts",
               Cat("ep=", p.ep, ", num_experts=", l.num_experts));
  }
  if (l.hidden_dim % p.esp != 0) {
    return Bad("parallel.esp", "must divide hidden_dim (experts are split along H)",
               Cat("esp=", p.esp, ", hidden_dim=", l.hidden_dim));
  }
  if (p.mp % p.esp != 0) {
    // The default schedule runs each shard on the tokens its MP group holds and
    // sums the partial outputs over ESP; S1 and S2 need esp == mp.
    return Bad("parallel.esp",
               "must divide mp: each ESP group sits inside an MP group, so every shard of an "
               "expert sees the same tokens",
               Cat("mp=", p.mp, ", esp=", p.esp));
  }
  return CheckStageFitsCluster(p, c);
}

}  // namespace

absl::Status ValidateLayer(const LayerConfig& l, const ClusterShape& c) {
  MOEPLAN_RETURN_IF_ERROR(ValidateLayerShape(l));
  return ValidateLayerParallel(l, c);
}

absl::Status ValidateDenseParallel(const ParallelLayout& p, const ClusterShape& c) {
  MOEPLAN_RETURN_IF_ERROR(CheckDegrees(p));
  for (auto [field, v] :
       {std::pair<std::string_view, int>{"parallel.ep", p.ep}, {"parallel.esp", p.esp}}) {
    if (v != 1) {
      return Bad(field, "must be 1 (or unset) for a dense model: it has no experts to split",
                 Cat(v));
    }
  }
  return CheckStageFitsCluster(p, c);
}

absl::Status ValidateForSchedule(const LayerConfig& l, Schedule schedule, bool own_tokens) {
  if (schedule == Schedule::kDefault) return absl::OkStatus();
  const ParallelLayout& p = l.parallel;
  if (p.mp != p.esp && !(own_tokens && schedule == Schedule::kS1)) {
    return Bad("parallel.esp",
               Cat("schedules s1 and s2 need esp == mp (the ESP group is the MP group); "
                   "plan only the default schedule for this layout"),
               Cat("mp=", p.mp, ", esp=", p.esp, ", schedule ", ScheduleName(schedule)));
  }
  if (schedule == Schedule::kS1 && (l.batch_size * l.seq_len) % p.mp != 0) {
    return Bad("batch_size",
               "s1 splits the batch_size*seq_len tokens over the mp ranks; it must be "
               "divisible by parallel.mp",
               Cat("batch_size*seq_len=", l.batch_size * l.seq_len, ", mp=", p.mp));
  }
  return absl::OkStatus();
}

}  // namespace moeplan::planner
