// The MoE-layer runner (docs/schedules.md, docs/executor.md): one MoE layer forward and backward
// with real data, run by interpreting the planner's op graph for it (the
// default, S1 or S2 schedule: the plan is the program), every op timed under
// the name the planner gives it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "moeplan/executor/comm.h"
#include "moeplan/executor/device.h"
#include "moeplan/executor/interpreter.h"
#include "moeplan/executor/kernels.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/op_graph.h"
#include "moeplan/planner/types.h"

namespace moeplan::executor {

// The layout fits the job: one pipeline stage (pp = 1) on exactly mp*dp ranks.
absl::Status ValidateWorld(const planner::LayerConfig& layer, int world_size);

// What the executor runs on top of the planner's rules (ValidateLayer and
// ValidateForSchedule): one pipeline stage on exactly mp*dp ranks, and
// dropless layers under the default schedule only. Same answer on every rank.
absl::Status ValidateForExecutor(const planner::LayerConfig& layer, planner::Schedule schedule,
                                 int world_size);

struct RunOptions {
  DType dtype = DType::kF32;
  uint64_t seed = 1;
  // Skewed routing: >= 0, 0 = none. Expert e is given the popularity
  // 1 / (1 + rank_e)^skew_exponent (Zipf), rank_e its place in a permutation
  // of the experts drawn from `seed`, and the gate adds log(popularity) to every
  // token's logits: a constant bias, so training math is unchanged.
  double skew_exponent = 0.0;
  // Bytes of device memory the runner may allocate per rank (0: no check).
  // Its buffers are added up first: over this, Create fails ResourceExhausted
  // naming the total and the largest tensor, having allocated nothing.
  size_t memory_limit_bytes = 0;
  std::string memory_limit_source = "--max-memory-gib";  // says where the limit came from
  std::string plan_name = "the plan";  // what errors call the plan ("the s2 schedule")
  LaneMode lanes = LaneMode::kAuto;

  // Only for the Create overload that asks the planner for the plan: the
  // schedule, the nodes the ranks run on (intra / inter resources follow),
  // and the cost model (null: costs of no interest, a neutral model).
  planner::Schedule schedule = planner::Schedule::kDefault;
  int hosts = 1;
  const planner::CostModel* cost = nullptr;
};

// The plan the executor runs for `layer` under `schedule` on `world_size`
// ranks over `hosts` nodes: the planner's op graph (BuildSchedule, linear
// AlltoAlls) after ValidateLayer, ValidateForSchedule and ValidateForExecutor.
// `cost` null: a neutral cost model (the ops' costs are not read).
absl::StatusOr<planner::OpGraph> PlanLayerRun(const planner::LayerConfig& layer,
                                              planner::Schedule schedule, int world_size, int hosts,
                                              const planner::CostModel* cost);

// How the last iteration routed the tokens this rank gated.
struct RouteCounts {
  std::vector<int64_t> routed;  // [E]: choices per expert, before capacity
  int64_t dropped = 0;          // choices dropped by capacity
};

// The gate bias of RunOptions::skew_exponent: log(popularity) per expert [E].
std::vector<float> SkewBias(int64_t experts, double exponent, uint64_t seed);

// Host copies (fp32) of what a rank computed, for correctness checks.
struct LayerResults {
  std::vector<float> y;      // [S x M]: the MP group's output
  std::vector<float> dx;     // [S x M]: gradient of the MP group's input
  std::vector<float> dgate;  // [M x E]: gate weight gradient (summed over the MP group's tokens)
  std::vector<float> dw1;    // [El x M x Hs]: this rank's expert shards ([El x M x 2Hs] gated)
  std::vector<float> dw2;    // [El x Hs x M]
  // Routing of the tokens this rank gated: tokens [route_offset, route_offset + n).
  int64_t route_offset = 0;
  std::vector<int32_t> expert;  // [n x k]
  std::vector<int32_t> slot;    // [n x k], -1 = dropped
};

// Where one rank's layer tensors live (device memory, the run's dtype; the
// gate's are fp32), for a caller that brings its own data (moeplan.torch):
// it writes x, the weights and dy, and reads y and the gradients. The layout
// is LayerResults's; the buffers stay valid while the runner lives.
struct LayerTensors {
  int64_t tokens = 0, model_dim = 0, experts = 0;                 // S, M, E
  int64_t local_experts = 0, hidden_shard = 0;                    // E/ep, H/esp
  bool gated = false;                                             // SwiGLU experts (kernels.h)
  void *x = nullptr, *y = nullptr, *dy = nullptr, *dx = nullptr;  // [S x M]
  float *gate = nullptr, *dgate = nullptr;                        // [M x E]
  void *w1 = nullptr, *dw1 = nullptr;                             // [El x M x W1Columns()]
  void *w2 = nullptr, *dw2 = nullptr;                             // [El x Hs x M]
  // Columns of w1 and dw1: gated, 2Hs ([gate | up] halves), else Hs.
  int64_t W1Columns() const { return gated ? 2 * hidden_shard : hidden_shard; }
};

class MoeLayerRunner {
 public:
  // Validates the layer on the world (ValidateWorld, ValidateLayer), then —
  // collective over `world` — splits the MP, EP and ESP groups, sizes every
  // buffer from the plan's ops, allocates, and fills inputs, weights and the
  // output gradient from `seed` (the same global tensors for every schedule
  // and layout). A plan op without executable semantics is an error naming
  // it. Device, kernels and world must outlive the runner.
  static absl::StatusOr<std::unique_ptr<MoeLayerRunner>> Create(const planner::LayerConfig& layer,
                                                                const planner::OpGraph& plan,
                                                                const RunOptions& options,
                                                                Device* device, Kernels* kernels,
                                                                Communicator* world);
  // The same with the plan of options.schedule (PlanLayerRun).
  static absl::StatusOr<std::unique_ptr<MoeLayerRunner>> Create(const planner::LayerConfig& layer,
                                                                const RunOptions& options,
                                                                Device* device, Kernels* kernels,
                                                                Communicator* world);
  ~MoeLayerRunner();

  // Barrier, the plan's forward and backward ops, synchronize; then
  // timings() holds the ops of this iteration in issue order.
  absl::Status RunIteration();
  // One phase of the plan (a training step's forward, later its backward):
  // the phase's ops after a barrier, synchronized. The backward reads what
  // the last forward left in the buffers; its ops are timed from the end of
  // that forward, so timings() after both reads as one iteration's.
  absl::Status RunPhase(planner::Phase phase);
  LayerTensors Tensors() const;
  const std::vector<OpTime>& timings() const;
  double forward_us() const;  // end of the last forward op
  double total_us() const;    // end of the last op
  bool threaded() const;      // lanes are host threads (real overlap on the CPU)

  // Downloads the results of the last iteration.
  absl::StatusOr<LayerResults> Results();
  // Counts the last iteration's routing (downloads the routing table only).
  absl::StatusOr<RouteCounts> Routing();

  const RankPlace& place() const;

  class Impl;

 private:
  explicit MoeLayerRunner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The seeded value of element `index` of a named global tensor: uniform in
// [-scale, scale), a pure function of (seed, tensor, index).
float SeededValue(uint64_t seed, uint32_t tensor, uint64_t index, float scale);

}  // namespace moeplan::executor
