// Whole models (docs/model.md) as their users describe them: a transformer
// with an MoE layer every `layer_freq` blocks, its field rules, and the
// parameters one rank holds. Planning them is model_planner.h; layouts and
// the search are layout.h and layout_planner.h.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "moeplan/planner/types.h"

namespace moeplan::planner {

// How tokens are routed. Top-k and switch route each token on its own, so the
// gate may be split into micro-batches; batch-prioritized routing ranks all
// tokens of the batch first, so nothing before it can be partitioned with it.
enum class Gate : uint8_t { kTopK = 0, kSwitch = 1, kBatchPrioritized = 2 };
std::string_view GateName(Gate g);  // "top_k", "switch", "batch_prioritized"

struct MoeSpec {
  int layer_freq = 1;  // block i is an MoE block iff i % layer_freq == 0 (Megatron-LM)
  int64_t num_experts = 0;
  int64_t top_k = 1;
  double capacity_factor = 1.0;
  int64_t expert_ffn_hidden_size = 0;
  int64_t shared_expert_ffn_hidden_size = 0;  // 0: no shared expert
  Gate gate = Gate::kTopK;
};

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
  int64_t global_batch_size = 0;  // sequences per iteration; 0: micro_batch_size * parallel.dp

  bool IsMoeBlock(int block) const { return block % moe.layer_freq == 0; }
  int NumMoeLayers() const { return (num_layers + moe.layer_freq - 1) / moe.layer_freq; }
  // The MoE layer every MoE block runs (a LayerConfig for the schedule builders).
  LayerConfig MoeLayer() const;
  int64_t GlobalBatch() const {
    return global_batch_size > 0 ? global_batch_size : micro_batch_size * parallel.dp;
  }
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
  const auto& [layer_freq, num_experts, top_k, capacity_factor, expert_ffn_hidden_size,
               shared_expert_ffn_hidden_size, gate] = s;
  return H::combine(std::move(h), layer_freq, num_experts, top_k, capacity_factor,
                    expert_ffn_hidden_size, shared_expert_ffn_hidden_size,
                    static_cast<uint8_t>(gate));
}

template <typename H>
H AbslHashValue(H h, const ModelConfig& m) {
  const auto& [name, num_layers, hidden_size, num_attention_heads, ffn_hidden_size, seq_length,
               micro_batch_size, vocab_size, bytes_per_element, moe, parallel,
               global_batch_size] = m;
  return H::combine(std::move(h), name, num_layers, hidden_size, num_attention_heads,
                    ffn_hidden_size, seq_length, micro_batch_size, vocab_size, bytes_per_element,
                    moe, parallel, global_batch_size);
}

}  // namespace moeplan::planner
