// The op graph (docs/simulator.md): a DAG of ops, each with a name, kind, held
// resources, cost and dependencies. Ops are added in issue
// order and may only depend on ops added before them, so vertex order is both the
// per-resource issue order and a topological order: the simulator needs one pass.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moeplan/planner/op_exec.h"

namespace moeplan::planner {

// Resources an op occupies (a bit mask; a fused op may hold several).
enum Resource : uint8_t { kCompute = 1, kIntra = 2, kInter = 4 };
inline constexpr int kNumResources = 3;
using ResourceMask = uint8_t;
std::string ResourceMaskName(ResourceMask mask);  // e.g. "intra+inter"
// The inverse of ResourceMaskName; false for an empty or unknown name.
bool ParseResourceMask(std::string_view name, ResourceMask* mask);
std::string_view ResourceName(int index);  // 0 compute, 1 intra, 2 inter

enum class OpKind : uint8_t { kCompute, kComm };
enum class Phase : uint8_t { kForward, kBackward };

// The cost-model term an op is accounted under (critical-path attribution).
enum class Term : uint8_t {
  kGate,
  kOrder,  // order, i-order
  kSplit,  // local MP splits
  kExpert,
  kAllToAll,
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kSendRecv,
  kDense,      // whole models: attention, dense FFN, norms, residuals, embeddings
  kOptimizer,  // whole models: the optimizer step
};
inline constexpr int kNumTerms = 11;
std::string_view TermName(Term t);

// Op flags.
enum OpFlag : uint8_t {
  kWeightGrad = 1,  // a weight-gradient (dW) op: nothing in the layer waits for it
  kMoeScope = 2,    // whole models: an op of an MoE layer ("b5.moe.fwd.gate")
  kGradSync = 4,    // whole models: a gradient bucket's collective or ZeRO's parameter gather
                    // after the optimizer (once per iteration, not per micro-batch)
  kPrefetch = 8,    // whole models: ZeRO-3's parameter gather, which depends on nothing
  kStaged = 16,     // a pipeline program's op: its name starts with its stage, "s<device>."
};

struct Op {
  // Static name (a string literal). The full name is
  //   ["s<device>."] ["c<chunk>."] ["mb<mb>."] ["b<block>."] ["moe."] <base> [".<step>"]
  //   [".p<part>"]
  // with the parts present when kStaged is set, chunk >= 0, mb >= 0, block >= 0,
  // kMoeScope is set, step >= 0, part >= 0 (a pipeline program's ops:
  // "s1.mb3.b5.moe.fwd.gate", "s0.c1.optimizer.step").
  std::string_view base;
  int step = -1;
  int16_t block = -1;  // whole models: the transformer block
  int16_t part = -1;   // partitioned ops (docs/model.md): the micro-batch piece
  uint8_t flags = 0;   // OpFlag bits
  OpKind kind = OpKind::kCompute;
  Phase phase = Phase::kForward;
  Term term = Term::kGate;
  ResourceMask resources = kCompute;
  // Pipelines (docs/layouts.md): the stage whose resources the op holds; each
  // device has its own compute, intra and inter resources. 0 elsewhere.
  int16_t device = 0;
  int16_t mb = -1;    // a pipeline program's micro-batch
  int8_t chunk = -1;  // an interleaved pipeline program's model chunk of the stage
  double cost_us = 0.0;
  int64_t bytes = 0;             // comm: the collective's n; compute: bytes touched
  int64_t inter_node_bytes = 0;  // bytes this rank sends across nodes

  std::string Name() const;
};

using OpId = int;
inline constexpr OpId kNoOp = -1;

// Storage is flat and reused: Clear() keeps every buffer's capacity, so
// rebuilding a graph of the same size (every plan after the first on a planner)
// allocates nothing. Dependencies are stored per op, CSR-style, in issue order.
// boost_graph.h gives the same DAG as a Boost.Graph for graph algorithms.
class OpGraph {
 public:
  // Appends `op` after every op added so far (issue order) depending on `deps`.
  // kNoOp entries are ignored; others must be ids returned earlier (the
  // simulator checks).
  OpId Add(const Op& op, std::initializer_list<OpId> deps, const OpExec& exec = {}) {
    return Add(op, std::span<const OpId>(deps.begin(), deps.size()), exec);
  }
  // Inline: builders add every op of every graph a planner simulates.
  OpId Add(const Op& op, std::span<const OpId> deps, const OpExec& exec = {}) {
    const OpId id = size();
    ops_.push_back(op);
    if (record_exec_) exec_.push_back(exec);
    for (OpId d : deps) {
      if (d != kNoOp) dep_ids_.push_back(d);
    }
    dep_begin_.push_back(static_cast<uint32_t>(dep_ids_.size()));
    return id;
  }
  // Records that `alias.buf` of a layer is the same memory as `alias.same_as`
  // (once: a repeated alias is not stored again).
  void Alias(const BufAlias& alias);
  // A whole model's MoE layer instance (OpExec::layer): its index, >= 1, the
  // same for the same instance.
  int16_t AddLayer(const ExecLayer& layer);
  void SetExecLayer(OpId id, int16_t layer) {
    if (record_exec_) exec_[static_cast<size_t>(id)].layer = layer;
  }
  // false: Add drops what each op computes and exec() answers kind kNone for
  // every op (graphs a planner only simulates). Kept across Clear().
  void RecordExec(bool record);
  // Takes `from`'s aliases and layer instances (a graph rebuilt from its ops).
  void CopyTables(const OpGraph& from);

  int size() const { return static_cast<int>(ops_.size()); }
  const Op& op(OpId id) const { return ops_[static_cast<size_t>(id)]; }
  // The ops `id` depends on.
  std::span<const OpId> deps(OpId id) const {
    return {dep_ids_.data() + dep_begin_[static_cast<size_t>(id)],
            dep_ids_.data() + dep_begin_[static_cast<size_t>(id) + 1]};
  }
  // What the op computes (op_exec.h); kind kNone where the builder said nothing.
  const OpExec& exec(OpId id) const {
    static constexpr OpExec kNothing{};
    return record_exec_ ? exec_[static_cast<size_t>(id)] : kNothing;
  }
  std::span<const BufAlias> aliases() const { return aliases_; }
  std::span<const ExecLayer> layers() const { return layers_; }
  bool HasDep(OpId from, OpId to) const;
  // Replaces op `id`'s cost (a replay puts measured durations on the plan).
  void SetCost(OpId id, double cost_us) { ops_[static_cast<size_t>(id)].cost_us = cost_us; }
  void Clear();
  // Capacity hints for builders that know their size.
  void Reserve(int ops, int deps);

 private:
  std::vector<Op> ops_;
  // Kept beside the ops, not in them: the simulator's pass reads only ops_.
  std::vector<OpExec> exec_;
  std::vector<BufAlias> aliases_;
  std::vector<ExecLayer> layers_;
  std::vector<OpId> dep_ids_;
  std::vector<uint32_t> dep_begin_ = {0};  // deps of op i: [dep_begin_[i], dep_begin_[i + 1])
  bool record_exec_ = true;
};

}  // namespace moeplan::planner
