// What an op computes (docs/executor.md "The plan is the program"): the
// executor interprets these, op for op; costing and simulation never read them.
// Sizes are element counts (the executor's dtype fixes the bytes), buffers are
// the logical buffers of the op's MoE layer (its block), and groups the layer's
// communicators, so one plan runs on every rank of the layout.
#pragma once

#include <cstdint>
#include <string_view>

namespace moeplan::planner {

enum class ExecKind : uint8_t {
  kNone = 0,  // planned only: the executor refuses a plan holding one, naming it
  // The MoE layer's kernels (executor Kernels) on the layer's buffers.
  kGate,                   // in: tokens [tokens x M]; softmax, top-k, capacity
  kGateBackward,           // in: the gate's input; out: the input gradient (added to)
  kOrder,                  // in [tokens x M] -> out, the dispatch buffer
  kIOrder,                 // in, the combined buffer -> out [tokens x M]
  kIOrderBackward,         // in dy [tokens x M], mid the combined buffer -> out
  kOrderBackward,          // in, the dispatch gradient -> out [tokens x M]
  kExpertForward,          // in -> out
  kExpertBackwardData,     // in (output gradient) -> out (input gradient)
  kExpertBackwardWeights,  // in (the forward input), mid (the output gradient)
  // A local MP split: out = block r of `in`, r the rank in `group`, `count`
  // elements per block.
  kSlice,
  // Whole models' dense ops, run for their shape on scratch memory (no
  // values flow between them):
  kNop,          // a join: waits for its dependencies, computes nothing
  kDenseGemm,    // `groups` x `parts` GEMMs of tokens x rows x count (m x n x k)
  kDenseMemory,  // a memory-bound kernel touching `count` elements (read + written)
  // Collectives on `group`. count: AllGather's per-rank input, ReduceScatter's
  // per-rank output, AllReduce's buffer (in == out), AlltoAll's block per peer.
  // Whole models' dense collectives (tensor-parallel AllReduce, gradient
  // buckets, ZeRO's parameter gathers) name no buffer: scratch memory.
  kCounts,  // dropless: every peer's per-expert routed counts (host values)
  kAllToAll,
  kAllGather,
  kReduceScatter,
  kAllReduce,
  // The SAA steps of docs/schedules.md, chunk = count elements, q the rank in
  // `pairs` (the AlltoAll group) and W its size:
  //   exchange (on `group`, the AlltoAll's): step i sends chunk q+i of `in`,
  //     receives chunk q-i of `out`;
  //   gather (on `group`, `pairs` the AlltoAll's): AllGathers the chunk c =
  //     q-i that arrived with step i (c = q: from `in`, else from `mid`) into
  //     out + c*chunk + member*stride;
  //   reduce: ReduceScatters chunk c = q+i (member blocks at
  //     in + c*chunk + member*stride) into mid's chunk c; step 0 (c = q, the
  //     local one, reduced last) into out's chunk q.
  kSaaExchange,
  kSaaGather,
  kSaaReduce,
  // Pipelines (docs/layouts.md): one micro-batch's activation (or its
  // gradient), `count` elements, from the op's stage (Op::device) to stage
  // `parts` over `group` (kPpEven / kPpOdd by the sending stage's parity:
  // the ranks at the same place of every stage, ordered by stage). The sending stage runs it as a
  // send, the receiving stage as a receive; both under the op's name. Scratch memory.
  kSendRecv,
};
std::string_view ExecKindName(ExecKind k);  // "gate", "alltoall", "saa_gather", ...
// Whether ops of kind `k` communicate (every kind from kCounts on).
inline bool IsCollective(ExecKind k) { return k >= ExecKind::kCounts; }

// The layer's communicators on a rank (docs/notation.md), and a whole model's
// data-parallel groups: dp, the replicas of the dense parameters (ranks of one
// MP rank, strided by mp); edp, the replicas of an expert shard (strided by
// ep * esp). A pipeline's p2p transfers: pp_even and pp_odd, the ranks at the
// same place of every stage (strided by the stage's size), carrying what even
// and odd stages send, so a stage's sends and receives (from its neighbours,
// of the other parity) run on lanes of their own and a send never waits
// behind a receive. In a pipelined run every other group is inside a stage.
enum class ExecGroup : uint8_t { kNone = 0, kMp, kEp, kEsp, kDp, kEdp, kPpEven, kPpOdd };
inline constexpr int kNumExecGroups = 8;
std::string_view ExecGroupName(ExecGroup g);  // "mp", "ep", "esp", "dp", "edp", "pp_even", "pp_odd"

// Logical buffers of an MoE layer (docs/executor.md "Buffers"). x, y, dy, dx
// are the layer's [S x M] input, output and their gradients; the rest are what
// the schedules move between kernels and collectives.
enum class Buf : uint8_t {
  kNone = 0,
  kX,
  kY,
  kDy,
  kDx,
  kXs,  // S1: the rank's token slice, and its output / gradients
  kYs,
  kDys,
  kDxs,
  kDisp,  // the dispatch buffer (order's output) and its gradient
  kDdisp,
  kComb,  // the combined buffer (i-order's input) and its gradient
  kDcomb,
  kPart,  // S2: the MP rank's part of the dispatch buffer, and its gradient
  kDpart,
  kRecv,  // AlltoAll results before a gather / after a scatter
  kDrecv,
  kBack,
  kDback,
  kStage,  // the SAA dual's reduced chunks before their exchange
  kEin,    // expert input / output and their gradients
  kEout,
  kDein,
  kDeout,
  kGateGrad,  // the gate weights' gradient (fp32)
};
inline constexpr int kNumBufs = 25;
std::string_view BufName(Buf b);  // "x", "disp", "ein", ...

// 64 bytes, kept beside the ops (the simulator never touches them).
struct OpExec {
  ExecKind kind = ExecKind::kNone;
  ExecGroup group = ExecGroup::kNone;
  ExecGroup pairs = ExecGroup::kNone;  // SAA gather / reduce: the AlltoAll's group
  Buf in = Buf::kNone, mid = Buf::kNone, out = Buf::kNone;
  // Dropless: sizes are the iteration's routed counts, not these (order /
  // i-order on a compact buffer, AlltoAllv, experts on uneven blocks).
  bool ragged = false;
  bool to_experts = false;  // a ragged AlltoAll: towards the experts, or back
  bool f32 = false;         // fp32 elements whatever the run's dtype (the gate's)
  // An SAA exchange whose gather / scatter group has one rank: step 1 also
  // places the local chunk q of `in` at chunk q of `out` (what the gather of
  // one rank does).
  bool copy_local = false;
  // The MoE layer instance whose buffers the op uses: 0 in a single-layer plan
  // (its one layer) and for a whole model's dense ops; i >= 1 a whole model's
  // OpGraph::layers()[i - 1].
  int16_t layer = 0;
  // Gate: tokens routed and their capacity per expert. Order family: tokens,
  // the buffer's capacity and parts ([parts][E][capacity/parts][M]). Experts:
  // `groups` groups of [E/ep][rows][M]. SendRecv: `parts` is the receiving stage.
  int32_t parts = 1;
  int32_t groups = 0;
  float scale = 1.0f;  // expert weight gradients: their scale
  int64_t tokens = 0, capacity = 0;
  int64_t rows = 0;
  int64_t count = 0;   // elements (see ExecKind)
  int64_t stride = 0;  // SAA: elements between the group members' blocks
};

static_assert(sizeof(OpExec) == 64);

// A whole model's MoE layer instance: a block's layer over `tokens` tokens,
// for one micro-batch piece (part >= 0) of a partitioned forward or the whole
// micro-batch (part -1), of one pipeline micro-batch (mb >= 0). Each has its own buffers, weights
// and routing.
struct ExecLayer {
  int16_t block = -1;
  int16_t part = -1;
  int64_t tokens = 0;
  int16_t mb = -1;  // a pipeline's micro-batch (each has its own activations); -1 elsewhere
  bool operator==(const ExecLayer&) const = default;
};

// Two logical buffers of one layer that are the same memory: what an identity
// collective of a one-rank group (for which the planner emits no op) leaves.
struct BufAlias {
  int16_t block = -1;
  Buf buf = Buf::kNone;  // is the same memory as
  Buf same_as = Buf::kNone;
};

}  // namespace moeplan::planner
