// One MoE layer's ops as the plan states them (docs/executor.md "The plan is
// the program"): the layer's logical buffers (planner::Buf), sized from what
// the plan's ops touch, its weights and routing, and the semantics of every
// ExecKind on them. Private to the executor: MoeLayerRunner drives it through
// the plan interpreter.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "moeplan/executor/comm.h"
#include "moeplan/executor/device.h"
#include "moeplan/executor/interpreter.h"
#include "moeplan/executor/kernels.h"
#include "moeplan/executor/runner.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/op_graph.h"
#include "moeplan/planner/types.h"

namespace moeplan::executor::internal {

// The cost model of a plan built only to be run: round link and kernel
// numbers (the interpreter never reads an op's cost).
const planner::CostModel& NeutralCostModel();

class MoeLayerOps final : public OpHandler {
 public:
  // Sizes every buffer of the layer instance `instance` (OpExec::layer: 0 in a
  // single-layer plan; a whole model's instances are >= 1, of `block`) from
  // the plan's ops, refuses them over the memory limit (nothing allocated),
  // allocates and fills the seeded inputs. An instance without a forward gate
  // (the backward of a partitioned forward) is routed once, untimed, so its
  // routing is valid. Dropless (ragged ops): one untimed gate pass and count
  // exchange size the expert side first — collective over the EP group, every
  // rank taking part even after a local failure.
  static absl::StatusOr<std::unique_ptr<MoeLayerOps>> Create(
      const planner::LayerConfig& layer, const planner::OpGraph& plan, int instance, int block,
      const RunOptions& options, const RankGroups* groups, Device* device, Kernels* kernels);

  // The bytes Create would allocate for the same arguments (a dropless
  // layer: its token side, the expert side following its routing), without
  // allocating or communicating: what a whole model adds up first.
  static absl::StatusOr<size_t> PlannedBytes(const planner::LayerConfig& layer,
                                             const planner::OpGraph& plan, int instance, int block,
                                             const RunOptions& options, const RankGroups* groups);

  Communicator* CommOf(const planner::OpExec& exec) const override {
    return groups_->Of(exec.group);
  }
  absl::Status Run(const planner::Op& op, const planner::OpExec& exec, Request* comm) override;

  absl::StatusOr<LayerResults> Results();
  // This rank's share of the layer's global tensors (docs/executor.md
  // "Layouts checked"), added into `g`, sized by the caller: y, dx [groups x
  // S x M] (MP group g's tokens at g*S), dgate [M x E], dw1 [E x M x F] (F
  // columns of the global w1: 2H gated, else H), dw2 [E x H x M]. Tokens
  // replicated over an MP group count once (its rank 0's; with sequence
  // parallelism each rank's slice), the gate gradient once per MP group,
  // every expert shard where it lives (replicas add up: the gradient
  // reduction over edp).
  absl::Status AddGlobal(LayerResults* g);
  LayerTensors Tensors() const;
  size_t AllocatedBytes() const;  // every buffer this layer holds
  absl::StatusOr<RouteCounts> Routing();

 private:
  MoeLayerOps(const planner::LayerConfig& layer, const RunOptions& opt, const RankGroups* groups,
              Device* dev, Kernels* k)
      : layer_(layer), opt_(opt), groups_(groups), dev_(dev), k_(k) {}

  // Init's steps, in order: the layer's dimensions, the buffers' alias
  // classes, every op's buffer sizes and how the layer is routed (returns the
  // slice that feeds the gate, if any), then allocation and the inputs.
  absl::Status Init(const planner::OpGraph& plan, int instance, int block);
  void SetDimensions();
  void ResolveAliases(const planner::OpGraph& plan, int block);
  absl::StatusOr<const planner::OpExec*> SizeAndRoute(const planner::OpGraph& plan, int instance);
  absl::Status InitPadded(const planner::OpExec* slice_to_gate);
  // Dropless: the host vectors sized, one untimed gate pass and count
  // exchange (collective over the EP group) size the expert side.
  absl::Status InitDropless();

  // ---- buffers ----
  using Buf = planner::Buf;
  static constexpr size_t kBufs = static_cast<size_t>(planner::kNumBufs);
  size_t Root(Buf b) const { return root_[static_cast<size_t>(b)]; }
  char* Ptr(Buf b) const { return buf_[Root(b)].as<char>(); }
  char* At(Buf b, int64_t elems) const { return Ptr(b) + static_cast<size_t>(elems) * es_; }
  // What an op needs of a buffer: `elems` elements (fp32 or the run's dtype).
  void Need(Buf b, int64_t elems, bool f32 = false);
  // Need() of an op's in, mid and out buffers.
  void NeedOf(const planner::OpExec& x, int64_t in, int64_t mid, int64_t out);
  // A dropless buffer sized from the routed rows, once they are known.
  void MarkExpertSide(Buf b);
  int64_t GroupSize(planner::ExecGroup g) const;  // 1 for a group this rank lacks
  absl::Status SizeFromOp(const planner::Op& op, const planner::OpExec& x);
  void SizeFromComputeOp(const planner::OpExec& x);
  void SizeFromCollective(const planner::OpExec& x);
  struct Estimate {
    size_t total = 0, largest = 0;
    std::string largest_name;
  };
  // One allocation pass over the token side and/or the expert side; with
  // `estimate` set, only adds up.
  absl::Status Allocate(bool token_side, bool expert_side, Estimate* estimate);
  absl::StatusOr<size_t> AllocateChecked(bool token_side, bool expert_side, size_t before);
  absl::Status FillInputs();
  // fn(i, global) for each element i of this rank's w1 (or w2) shard, in the
  // shard's order, with its index in the global [E x M x F] w1 (F = 2H
  // gated, else H: gate columns, then up columns) or [E x H x M] w2: global
  // expert ep_rank * El + l, hidden column esp_rank * Hs + j.
  template <class Fn>
  void ForW1Shard(Fn&& fn) const {
    const int64_t e0 = int64_t{groups_->place().ep_rank} * El_;
    const int64_t h0 = int64_t{groups_->place().esp_rank} * Hs_;
    const int64_t global_f = layer_.gated_linear_unit ? 2 * H_ : H_;
    size_t i = 0;
    for (int64_t l = 0; l < El_; ++l) {
      for (int64_t m = 0; m < M_; ++m) {
        for (int64_t j = 0; j < F_; ++j) {
          const int64_t col = j < Hs_ ? h0 + j : H_ + h0 + (j - Hs_);
          fn(i++, static_cast<uint64_t>(((e0 + l) * M_ + m) * global_f + col));
        }
      }
    }
  }
  template <class Fn>
  void ForW2Shard(Fn&& fn) const {
    const int64_t e0 = int64_t{groups_->place().ep_rank} * El_;
    const int64_t h0 = int64_t{groups_->place().esp_rank} * Hs_;
    size_t i = 0;
    for (int64_t l = 0; l < El_; ++l) {
      for (int64_t j = 0; j < Hs_; ++j) {
        for (int64_t m = 0; m < M_; ++m) {
          fn(i++, static_cast<uint64_t>(((e0 + l) * H_ + h0 + j) * M_ + m));
        }
      }
    }
  }

  // ---- op semantics ----
  absl::Status Copy(void* dst, const void* src, int64_t elems, LaneId lane = kComputeLane) {
    return dev_->Copy(dst, src, static_cast<size_t>(elems) * es_, lane);
  }
  DType TypeOf(const planner::OpExec& x) const { return x.f32 ? DType::kF32 : dt_; }
  BufferShape OrderShape(const planner::OpExec& x) const;
  ExpertShape ExpertsOf(const planner::OpExec& x) const;
  const RouteBuffers& OrderRoute() const { return dropless_ ? flat_ : route_; }
  absl::Status GateForward(const void* x);
  absl::Status GateBackward(const void* x, void* dx);
  absl::Status Compute(const planner::OpExec& x);
  absl::StatusOr<Request> Start(const planner::Op& op, const planner::OpExec& x, Communicator* c);

  // ---- dropless ----
  absl::Status CountRoutes();
  absl::Status SizeExchange();
  template <class Fn>
  absl::Status ForBlocksOf(int64_t l, Fn&& fn);
  absl::Status RaggedExpertForward(const planner::OpExec& x);
  absl::Status RaggedExpertBackwardData(const planner::OpExec& x);
  absl::Status RaggedExpertBackwardWeights(const planner::OpExec& x);

  planner::LayerConfig layer_;
  RunOptions opt_;
  const RankGroups* groups_;
  Device* dev_;
  Kernels* k_;
  DType dt_ = DType::kF32;
  size_t es_ = 4;
  int64_t S_ = 0, M_ = 0, H_ = 0, E_ = 0, K_ = 0, El_ = 1, Hs_ = 1;
  int64_t F_ = 1;  // columns of w1 and z: 2 Hs for SwiGLU experts, else Hs
  int W_ = 1;

  // Logical buffers: each resolves to a root (aliases of one-rank groups);
  // the roots own memory. Expert-side roots of a dropless layer are sized
  // from the routed rows.
  std::array<size_t, kBufs> root_{};
  std::array<int64_t, kBufs> need_{};  // bytes
  std::array<bool, kBufs> expert_side_{};
  std::array<DeviceBuffer, kBufs> buf_;
  int64_t hidden_elems_ = 0;  // the expert activations' elements (padded): a
  int64_t pre_elems_ = 0;     // and before the activation: z, dz (2x a gated)

  // The gate, from its op.
  Buf gate_in_ = Buf::kX;
  int64_t gated_ = 0, route_cap_ = 0;
  int64_t route_offset_ = 0;  // the first token this rank gates (an MP slice)
  bool route_once_ = false;   // no forward gate op: routed once at Init
  bool sp_input_ = false;     // sequence parallelism: xs and dys are the inputs
  std::array<bool, kBufs> written_{};  // roots some op of the layer writes

  // Gate and weights.
  DeviceBuffer x32_, dxg32_, logits_, probs_, expert_, slot_, weight_, dweight_, dlogits_;
  DeviceBuffer ones_, skew_bias_;
  DeviceBuffer wg_, w1_, w2_, dw1_, dw2_, z_, a_, dz_;
  RouteBuffers route_;

  // Dropless (docs/executor.md): the routing as k "experts" of S slots, so the
  // choice at compact row i is slot i % S of expert i / S; the irregular
  // exchange's sizes (host vectors sized once).
  bool dropless_ = false;
  DeviceBuffer flat_expert_, flat_slot_;
  RouteBuffers flat_;
  std::vector<int32_t> host_expert_, host_slot_, host_flat_expert_, host_flat_;
  std::vector<int64_t> count_, expert_off_, peer_count_, block_off_;
  std::vector<size_t> send_n_, send_off_, recv_n_, recv_off_;
  int64_t recv_rows_ = 0, recv_cap_ = 0;
};

}  // namespace moeplan::executor::internal
