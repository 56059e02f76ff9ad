// Domain types of the planner (docs/notation.md). Plain structs: the planner never sees
// protobuf; proto/ converts and the functions in validate.h check them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace moeplan::planner {

// Parallel degrees. P = mp * dp = ep * esp ranks per pipeline stage.
struct ParallelLayout {
  int mp = 1;   // N_MP
  int ep = 1;   // N_EP
  int esp = 1;  // N_ESP
  int dp = 1;   // N_DP
  int pp = 1;   // N_PP
  // Megatron-Core's sequence parallelism: the norms, residuals and dropouts
  // between the TP sub-blocks run on S/mp tokens, and each TP AllReduce is a
  // ReduceScatter + AllGather (docs/model.md "Sequence parallelism"). Models
  // only: a single MoE layer has no TP sub-blocks.
  bool sequence_parallel = false;
  // Context parallelism (models only, set by a layout): cp of the dp ranks
  // split each sequence (seq_length is then a rank's chunk) and exchange K/V
  // around a ring in attention (docs/model.md "Context parallelism").
  int cp = 1;
  // Megatron-Core's --tp-comm-overlap (set by a layout, with sequence
  // parallelism): the TP sub-blocks' AllGathers and ReduceScatters run
  // pipelined with their GEMMs, one of the mp steps exposed (docs/layouts.md
  // "Overlapped TP communication").
  bool tp_comm_overlap = false;

  int StageRanks() const { return mp * dp; }
  int TotalRanks() const { return mp * dp * pp; }
};
// Every field (a structured binding: a field added without it fails to compile).
template <typename H>
H AbslHashValue(H h, const ParallelLayout& p) {
  const auto& [mp, ep, esp, dp, pp, sequence_parallel, cp, tp_comm_overlap] = p;
  return H::combine(std::move(h), mp, ep, esp, dp, pp, sequence_parallel, cp, tp_comm_overlap);
}

// One MoE layer. Dimensions are element counts.
struct LayerConfig {
  std::string name;
  int64_t batch_size = 0;        // B: sequences per micro-batch on one MP group
  int64_t seq_len = 0;           // L
  int64_t model_dim = 0;         // M
  int64_t hidden_dim = 0;        // H
  int64_t num_experts = 0;       // E
  int64_t top_k = 0;             // k
  double capacity_factor = 0.0;  // f
  int bytes_per_element = 2;     // b
  // >= 1: the heaviest rank's routed tokens over the balanced share. With
  // padded capacity it decides only how many tokens are dropped; dropless, it
  // scales the heaviest rank's AlltoAll bytes and expert rows.
  double token_skew = 1.0;
  // false: every expert's buffer is padded to capacity T (tokens beyond it are
  // dropped), so costs do not depend on routing. true: no capacity; experts
  // get exactly what was routed to them (irregular AlltoAll); capacity_factor
  // is unused.
  bool dropless = false;
  // SwiGLU experts: the first GEMM projects to 2 x hidden_dim (gate and up),
  // silu(gate) * up brings it back to hidden_dim.
  bool gated_linear_unit = false;
  // Group-limited routing (ModelConfig's moe.router_num_groups and
  // router_group_topk; 0: none): what DeepEP's inter-node bytes depend on.
  int64_t router_num_groups = 0, router_group_topk = 0;
  ParallelLayout parallel;
};

// The cluster's shape: `nodes` nodes of `gpus_per_node` GPUs; rank r on node r / G.
struct ClusterShape {
  int nodes = 1;
  int gpus_per_node = 1;
  int TotalGpus() const { return nodes * gpus_per_node; }
};

enum class Schedule { kDefault = 0, kS1 = 1, kS2 = 2 };
inline constexpr Schedule kAllSchedules[] = {Schedule::kDefault, Schedule::kS1, Schedule::kS2};
inline constexpr int kNumSchedules = 3;

std::string_view ScheduleName(Schedule s);  // "default", "s1", "s2"
bool ParseSchedule(std::string_view name, Schedule* out);

// How an MoE layer's EP AlltoAlls run (docs/model.md): one pairwise exchange
// over the EP group, or hierarchically (inside the node, then between nodes).
// DeepEP's: a token sent once per remote node over RDMA, then forwarded
// inside the node over NVLink (tried only when asked: a dispatcher choice).
// kAllGather: Megatron-Core's allgather dispatcher (the EP group's tokens
// AllGathered, the outputs ReduceScattered), not an AlltoAll.
enum class AllToAllAlgo : uint8_t { kLinear = 0, kHierarchical = 1, kDeepEp = 2, kAllGather = 3 };
inline constexpr AllToAllAlgo kAllAllToAllAlgos[] = {
    AllToAllAlgo::kLinear, AllToAllAlgo::kHierarchical, AllToAllAlgo::kDeepEp,
    AllToAllAlgo::kAllGather};
std::string_view AllToAllAlgoName(AllToAllAlgo a);  // "linear", "2dh", "deepep", "allgather"
bool ParseAllToAllAlgo(std::string_view name, AllToAllAlgo* out);

// Derived sizes of docs/notation.md (per MP group / per rank, bytes where named so).
struct DerivedShape {
  int64_t tokens = 0;            // S = B * L
  int64_t capacity = 0;          // T = ceil(k * f * S / E); dropless: ceil(k * S / E)
  int64_t activation_bytes = 0;  // X = S * M * b
  int64_t dispatch_bytes = 0;    // D = E * T * M * b
};

// T = ceil(k * f * tokens / E), exact for capacity factors with up to six
// decimals (the product is formed in integers, so 2 * 1.2 * 1000 / 8 is 300,
// not 301).
int64_t Capacity(int64_t top_k, double capacity_factor, int64_t tokens, int64_t num_experts);

DerivedShape Derive(const LayerConfig& layer);

// Rows per expert that `tokens` routed tokens occupy before skew: the padded
// capacity T, or dropless the balanced share ceil(k * tokens / E).
int64_t RouteCapacity(const LayerConfig& layer, int64_t tokens);

// What the heaviest rank's expert side is scaled by: token_skew when dropless,
// 1 when padded (a padded buffer costs the same however tokens are routed).
double ExpertSkew(const LayerConfig& layer);

// The share of the heaviest rank's routed tokens a padded buffer drops:
// 1 - f / token_skew when token_skew > f; 0 when dropless or within capacity.
double DroppedShare(const LayerConfig& layer);

}  // namespace moeplan::planner
