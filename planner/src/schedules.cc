#include "moeplan/planner/schedules.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "graph_builder.h"
#include "schedule_kernels.h"
#include "moeplan/base/status.h"
#include "moeplan/planner/validate.h"

namespace moeplan::planner {

GroupShape ShapeOfGroup(int size, int stride, int gpus_per_node) {
  if (size <= 1) return {1, 1};
  if (stride >= gpus_per_node) return {size, size};  // consecutive members >= G apart
  const int64_t last = int64_t{size - 1} * stride;
  return {size, static_cast<int>(last / gpus_per_node + 1)};
}

Topology MakeTopology(const ParallelLayout& p, const ClusterShape& c) {
  Topology t;
  const int g = c.gpus_per_node;
  t.mp = ShapeOfGroup(p.mp, 1, g);
  t.esp = ShapeOfGroup(p.esp, 1, g);
  t.ep = ShapeOfGroup(p.ep, p.esp, g);
  t.ep_ranks_per_node = p.esp >= g ? 1 : std::min(p.ep, g / p.esp);
  return t;
}

namespace {

using internal::Kernels;

constexpr Phase F = Phase::kForward;
constexpr Phase B = Phase::kBackward;

// What the ops compute (op_exec.h), in elements of the layer's buffers.
using EK = ExecKind;
using EG = ExecGroup;
// The gate on `tokens` rows of `x`, `cap` slots per expert; its backward adds
// the input gradient to `dx`.
OpExec GateX(Buf x, int64_t tokens, int64_t cap) {
  return {.kind = EK::kGate, .in = x, .tokens = tokens, .capacity = cap};
}
OpExec GateBwdX(Buf x, Buf dx, int64_t tokens, int64_t cap) {
  return {.kind = EK::kGateBackward, .in = x, .out = dx, .tokens = tokens, .capacity = cap};
}
// Order / i-order and their backward on a buffer of `cap` slots per expert in
// `parts` parts; ragged: the dropless compact buffer.
OpExec RouteX(EK k, Buf in, Buf mid, Buf out, int64_t tokens, int64_t cap, int parts, bool ragged) {
  return {.kind = k,
          .in = in,
          .mid = mid,
          .out = out,
          .ragged = ragged,
          .parts = parts,
          .tokens = tokens,
          .capacity = cap};
}
OpExec ExpertX(EK k, Buf in, Buf mid, Buf out, int64_t groups, int64_t rows, bool ragged,
               float scale = 1.0f) {
  return {.kind = k,
          .in = in,
          .mid = mid,
          .out = out,
          .ragged = ragged,
          .groups = static_cast<int32_t>(groups),
          .scale = scale,
          .rows = rows};
}
OpExec CollX(EK k, EG g, Buf in, Buf out, int64_t count, bool ragged = false,
             bool to_experts = false) {
  return {.kind = k,
          .group = g,
          .in = in,
          .out = out,
          .ragged = ragged,
          .to_experts = to_experts,
          .count = count};
}

using internal::Builder;
using internal::Deps;
using A2aNames = Builder::A2aNames;

// The four EP AlltoAll sites, linear and hierarchical names.
constexpr A2aNames kFwdDispatch{"fwd.ep_alltoall_dispatch", "fwd.ep_alltoall_dispatch.2dh_intra",
                                "fwd.ep_alltoall_dispatch.2dh_reorder",
                                "fwd.ep_alltoall_dispatch.2dh_inter", "fwd.ep_allgather_dispatch"};
constexpr A2aNames kFwdCombine{"fwd.ep_alltoall_combine", "fwd.ep_alltoall_combine.2dh_intra",
                               "fwd.ep_alltoall_combine.2dh_reorder",
                               "fwd.ep_alltoall_combine.2dh_inter", "fwd.ep_reducescatter_combine"};
constexpr A2aNames kBwdCombine{"bwd.ep_alltoall_combine", "bwd.ep_alltoall_combine.2dh_intra",
                               "bwd.ep_alltoall_combine.2dh_reorder",
                               "bwd.ep_alltoall_combine.2dh_inter", "bwd.ep_allgather_combine"};
constexpr A2aNames kBwdDispatch{"bwd.ep_alltoall_dispatch", "bwd.ep_alltoall_dispatch.2dh_intra",
                                "bwd.ep_alltoall_dispatch.2dh_reorder",
                                "bwd.ep_alltoall_dispatch.2dh_inter",
                                "bwd.ep_reducescatter_dispatch"};

// DeepEP's inter-node bytes as a share of the linear AlltoAll's: it sends a
// token once to each remote node holding one of its k experts (NVLink fans
// it out there), where the linear AlltoAll sends each (token, expert) copy.
// Uniform routing over the R nodes a token may reach (all N of the EP group,
// or with group-limited routing the nodes its router_group_topk groups of
// num_experts / router_num_groups experts span) reaches R (1 - (1 - 1/R)^k)
// distinct nodes, the share of them off the token's node as of its k copies.
double DeepEpInterShare(const LayerConfig& l, GroupShape ep) {
  const int nodes = ep.nodes;
  if (nodes <= 1 || l.top_k <= 0) return 1.0;
  double reach = nodes;
  if (l.router_num_groups > 0) {
    const double span =
        std::ceil(static_cast<double>(nodes) / static_cast<double>(l.router_num_groups));
    reach = std::min(reach, static_cast<double>(l.router_group_topk) * span);
  }
  const double k = static_cast<double>(l.top_k);
  const double distinct = reach * (1.0 - std::pow(1.0 - 1.0 / reach, k));
  return std::min(1.0, distinct / k);
}

// An FP8 element with its share of a 4-byte scale per 128.
constexpr double kFp8DispatchBytes = 1.0 + 4.0 / 128.0;

// Megatron-Core's allgather dispatcher (docs/model.md "AlltoAll algorithms"):
// towards the experts each EP rank AllGathers the group's `tokens` per rank
// (the forward's with their routing, probabilities and expert map: 5 bytes
// per expert) and keeps its experts' rows; back, the experts' partial
// outputs are ReduceScattered to the ranks the tokens came from. Planned
// only: its ops carry no executable semantics.
Deps EpGather(Builder& b, const LayerContext& ctx, const A2aNames& names, Phase phase,
              int64_t tokens, Deps x, bool to_experts) {
  const LayerConfig& l = *ctx.layer;
  const double piece = static_cast<double>(tokens) * l.model_dim * l.bytes_per_element;
  if (!to_experts) {
    return b.Coll(names.gather_form, phase, Collective::kReduceScatter, ctx.topo.ep, piece, x);
  }
  const double routing = phase == Phase::kForward ? 5.0 * tokens * l.num_experts : 0.0;
  return b.Coll(names.gather_form, phase, Collective::kAllGather, ctx.topo.ep, piece + routing, x);
}

// One of the layer's EP exchanges of the rank's `tokens` (`n` bytes in the
// dispatch buffer) by ctx.a2a: an AlltoAll (linear, 2DH or DeepEP's), or
// the allgather dispatcher's AllGather or ReduceScatter.
Deps EpAllToAll(Builder& b, const LayerContext& ctx, const A2aNames& names, Phase phase, double n,
                int64_t tokens, Deps x, const OpExec& exec) {
  if (ctx.a2a == AllToAllAlgo::kAllGather) {
    return EpGather(b, ctx, names, phase, tokens, x, exec.to_experts);
  }
  const Topology& t = ctx.topo;
  const bool deepep = ctx.a2a == AllToAllAlgo::kDeepEp;
  // FP8 training: DeepEP sends the tokens (and output gradients) towards the
  // experts quantized, one byte each and a 4-byte scale per 128 (DeepSeek-V3's
  // 1 x 128 tiles); what comes back stays in bytes_per_element.
  if (deepep && ctx.fp8_gemm != nullptr && exec.to_experts) {
    n *= kFp8DispatchBytes / ctx.layer->bytes_per_element;
  }
  return b.AllToAll(names, phase, ctx.a2a, t.ep, t.ep_ranks_per_node, n, x, exec,
                    deepep ? DeepEpInterShare(*ctx.layer, t.ep) : 1.0);
}

// Each schedule is written once, as five sections (schedules.h MoeSection);
// a single layer chains them, a whole model interleaves other ops between them.
// The expert backward is dX then dW; with detach_dw the dW op hangs off the
// chain (its inputs are dX's) instead of preceding the next op.
// `groups` x `exec_rows` are the executed expert input's rows per local expert.
Deps ExpertBackward(Builder& b, const LayerContext& ctx, const Kernels& k, int64_t rows, Deps x,
                    int64_t groups, int64_t exec_rows, float dw_scale = 1.0f) {
  const bool rag = ctx.layer->dropless;
  OpExec dx_x, dw_x;  // groups 0: not executable (no buffers named)
  if (groups > 0) {
    dx_x = ExpertX(EK::kExpertBackwardData, Buf::kDeout, Buf::kNone, Buf::kDein, groups, exec_rows,
                   rag);
    dw_x = ExpertX(EK::kExpertBackwardWeights, Buf::kEin, Buf::kDeout, Buf::kNone, groups,
                   exec_rows, rag, dw_scale);
  }
  const Deps dx = b.Compute("bwd.expert_dx", B, Term::kExpert, k.ExpertDx(rows),
                            k.ExpertBytes(rows), x, 0, dx_x);
  const Deps dw = b.Compute("bwd.expert_dw", B, Term::kExpert, k.ExpertDw(rows),
                            k.ExpertBytes(rows), ctx.detach_dw ? x : dx, kWeightGrad, dw_x);
  return ctx.detach_dw ? dx : dw;
}

// The bytes an EP AlltoAll is charged for: a dropless layer's heaviest rank
// receives token_skew times its balanced share, which costs as an even
// AlltoAll of the profile's skewed size on the EP shape (CostModel::
// SkewedAllToAllBytes); padded layers move `balanced` however they route.
double SkewedA2a(const LayerContext& ctx, double balanced) {
  return ctx.cost->SkewedAllToAllBytes(ctx.topo.ep, balanced, ExpertSkew(*ctx.layer));
}

// A dropless layer's dispatch is irregular: first every EP rank learns how many
// rows each peer will send it, an AlltoAll of one int64 count per expert (what
// dropless MoE systems exchange before their AlltoAllv).
constexpr std::string_view kCountsOp = "fwd.ep_alltoall_counts";
constexpr int kCountBytes = 8;
Deps DroplessCounts(Builder& b, const LayerContext& ctx, Deps x) {
  const LayerConfig& l = *ctx.layer;
  // The allgather dispatcher's ranks see every token's routing: no counts.
  if (!l.dropless || ctx.a2a == AllToAllAlgo::kAllGather) return x;
  return b.Coll(kCountsOp, F, Collective::kAllToAll, ctx.topo.ep,
                static_cast<double>(kCountBytes) * l.num_experts, x,
                {.kind = EK::kCounts, .group = EG::kEp});
}

Deps SectionDefault(MoeSection sec, const LayerContext& ctx, Builder& b, Deps x) {
  const LayerConfig& l = *ctx.layer;
  const Topology& t = ctx.topo;
  const Kernels k(ctx);
  const DerivedShape d = Derive(l);
  const int64_t s = d.tokens, cap = d.capacity;
  const double n = static_cast<double>(d.dispatch_bytes) * ExpertSkew(l);  // expert side
  const double a2a = SkewedA2a(ctx, static_cast<double>(d.dispatch_bytes));
  const int64_t rows = k.Skewed(int64_t{l.parallel.ep} * cap);  // per local expert
  // Executed: a dropless layer keeps every choice (capacity S) in a compact
  // buffer; the expert side is W groups of `cap` rows per local expert.
  const bool rag = l.dropless;
  const int64_t xcap = rag ? s : cap, w = l.parallel.ep;
  const int64_t peer = k.LocalExperts() * cap * l.model_dim;
  const float dw_scale = static_cast<float>(l.parallel.esp) / static_cast<float>(l.parallel.mp);
  switch (sec) {
    case MoeSection::kFwdRoute:
      x = b.Compute("fwd.gate", F, Term::kGate, k.GateFwd(s), k.GateBytes(s), x, 0,
                    GateX(Buf::kX, s, xcap));
      return b.Compute("fwd.order", F, Term::kOrder, k.Scatter(s, cap), k.OrderBytes(s, cap), x, 0,
                       RouteX(EK::kOrder, Buf::kX, Buf::kNone, Buf::kDisp, s, xcap, 1, rag));
    case MoeSection::kFwdExchange:
      x = DroplessCounts(b, ctx, x);
      x = EpAllToAll(b, ctx, kFwdDispatch, F, a2a, s, x,
                     CollX(EK::kAllToAll, EG::kEp, Buf::kDisp, Buf::kEin, peer, rag, true));
      x = b.Compute("fwd.expert", F, Term::kExpert, k.ExpertFwd(rows), k.ExpertBytes(rows), x, 0,
                    ExpertX(EK::kExpertForward, Buf::kEin, Buf::kNone, Buf::kEout, w, cap, rag));
      x = b.Coll("fwd.esp_allreduce", F, Collective::kAllReduce, t.esp, n, x,
                 CollX(EK::kAllReduce, EG::kEsp, Buf::kEout, Buf::kEout, w * peer, rag));
      x = EpAllToAll(b, ctx, kFwdCombine, F, a2a, s, x,
                     CollX(EK::kAllToAll, EG::kEp, Buf::kEout, Buf::kComb, peer, rag, false));
      return b.Compute("fwd.iorder", F, Term::kOrder, k.Gather(s, cap), k.OrderBytes(s, cap), x, 0,
                       RouteX(EK::kIOrder, Buf::kComb, Buf::kNone, Buf::kY, s, xcap, 1, rag));
    case MoeSection::kBwdUnroute:
      return b.Compute(
          "bwd.iorder", B, Term::kOrder, k.Unroute(s, cap), k.UnrouteBytes(s, cap), x, 0,
          RouteX(EK::kIOrderBackward, Buf::kDy, Buf::kComb, Buf::kDcomb, s, xcap, 1, rag));
    case MoeSection::kBwdExchange:
      x = EpAllToAll(b, ctx, kBwdCombine, B, a2a, s, x,
                     CollX(EK::kAllToAll, EG::kEp, Buf::kDcomb, Buf::kDeout, peer, rag, true));
      // The output gradient is replicated over the ESP group, so the forward
      // AllReduce's dual is the sum of the shards' partial input gradients,
      // after the expert. With mp > esp, mp / esp ranks send the same tokens
      // to each shard: their weight gradients are scaled by esp / mp.
      x = ExpertBackward(b, ctx, k, rows, x, w, cap, dw_scale);
      x = b.Coll("bwd.esp_allreduce", B, Collective::kAllReduce, t.esp, n, x,
                 CollX(EK::kAllReduce, EG::kEsp, Buf::kDein, Buf::kDein, w * peer, rag));
      return EpAllToAll(b, ctx, kBwdDispatch, B, a2a, s, x,
                        CollX(EK::kAllToAll, EG::kEp, Buf::kDein, Buf::kDdisp, peer, rag, false));
    case MoeSection::kBwdRoute:
      x = b.Compute("bwd.order", B, Term::kOrder, k.Gather(s, cap), k.OrderBytes(s, cap), x, 0,
                    RouteX(EK::kOrderBackward, Buf::kDdisp, Buf::kNone, Buf::kDx, s, xcap, 1, rag));
      return b.Compute("bwd.gate", B, Term::kGate, k.GateBwd(s), k.GateBytes(s), x, 0,
                       GateBwdX(Buf::kX, Buf::kDx, s, xcap));
  }
  return x;
}

// S1's split of the MP group's tokens (or their gradient) into the rank's
// slice, a local copy of `x1` bytes; none with sequence parallelism, whose
// tokens are the rank's slice already.
Deps S1Split(const LayerContext& ctx, Builder& b, std::string_view name, Phase phase, double us,
             double x1, Buf in, Buf out, int64_t slice, Deps x) {
  if (ctx.sequence_parallel) return x;
  return b.Compute(name, phase, Term::kSplit, us, 2.0 * x1, x, 0,
                   CollX(EK::kSlice, EG::kMp, in, out, slice));
}

Deps SectionS1(MoeSection sec, const LayerContext& ctx, Builder& b, Deps x) {
  const LayerConfig& l = *ctx.layer;
  const Topology& t = ctx.topo;
  const Kernels k(ctx);
  // The tokens are split over the n MP ranks; each expert is split over the
  // `shards` ranks of the ESP group, which gathers their rows (n on its own
  // unless each rank routes its own tokens: ValidateForSchedule).
  const int n = l.parallel.mp, shards = l.parallel.esp;
  const DerivedShape d = Derive(l);
  const int64_t s1 = d.tokens / n;            // tokens per rank after the MP split
  const int64_t cap1 = RouteCapacity(l, s1);  // per rank
  const double d1 = static_cast<double>(l.num_experts) * cap1 * l.model_dim * l.bytes_per_element;
  const double x1 = static_cast<double>(d.activation_bytes) / n;
  const double skew = ExpertSkew(l);
  const double a2a = SkewedA2a(ctx, d1);
  const int64_t rows = k.Skewed(int64_t{shards} * l.parallel.ep * cap1);
  const double gate_grad = static_cast<double>(l.model_dim) * l.num_experts * l.bytes_per_element;
  // Executed (elements): the rank's slice, an AlltoAll block per peer, the
  // rank's whole dispatch buffer; the expert side is shards*W groups of cap1 rows.
  const bool rag = l.dropless;
  const int64_t m = l.model_dim, groups = int64_t{shards} * l.parallel.ep;
  const int64_t slice = s1 * m, peer = k.LocalExperts() * cap1 * m, part = l.num_experts * cap1 * m;
  switch (sec) {
    case MoeSection::kFwdRoute:
      x = S1Split(ctx, b, "fwd.mp_split", F, k.Split(x1), x1, Buf::kX, Buf::kXs, slice, x);
      x = b.Compute("fwd.gate", F, Term::kGate, k.GateFwd(s1), k.GateBytes(s1), x, 0,
                    GateX(Buf::kXs, s1, cap1));
      return b.Compute("fwd.order", F, Term::kOrder, k.Scatter(s1, cap1), k.OrderBytes(s1, cap1), x,
                       0, RouteX(EK::kOrder, Buf::kXs, Buf::kNone, Buf::kDisp, s1, cap1, 1, rag));
    case MoeSection::kFwdExchange:
      x = DroplessCounts(b, ctx, x);
      x = EpAllToAll(b, ctx, kFwdDispatch, F, a2a, s1, x,
                     CollX(EK::kAllToAll, EG::kEp, Buf::kDisp, Buf::kRecv, peer, rag, true));
      x = b.Coll("fwd.esp_allgather", F, Collective::kAllGather, t.esp, d1 * skew, x,
                 CollX(EK::kAllGather, EG::kEsp, Buf::kRecv, Buf::kEin, part, rag));
      x = b.Compute(
          "fwd.expert", F, Term::kExpert, k.ExpertFwd(rows), k.ExpertBytes(rows), x, 0,
          ExpertX(EK::kExpertForward, Buf::kEin, Buf::kNone, Buf::kEout, groups, cap1, rag));
      x = b.Coll("fwd.esp_reducescatter", F, Collective::kReduceScatter, t.esp, d1 * skew, x,
                 CollX(EK::kReduceScatter, EG::kEsp, Buf::kEout, Buf::kBack, part, rag));
      x = EpAllToAll(b, ctx, kFwdCombine, F, a2a, s1, x,
                     CollX(EK::kAllToAll, EG::kEp, Buf::kBack, Buf::kComb, peer, rag, false));
      x = b.Compute("fwd.iorder", F, Term::kOrder, k.Gather(s1, cap1), k.OrderBytes(s1, cap1), x, 0,
                    RouteX(EK::kIOrder, Buf::kComb, Buf::kNone, Buf::kYs, s1, cap1, 1, rag));
      if (ctx.sequence_parallel) return x;  // the output stays the rank's slice
      return b.Coll("fwd.mp_allgather", F, Collective::kAllGather, t.mp, x1, x,
                    CollX(EK::kAllGather, EG::kMp, Buf::kYs, Buf::kY, slice));
    // Backward: the dual of each op in reverse (MP-AllGather -> local split,
    // AllGather <-> ReduceScatter, AlltoAll -> AlltoAll, split -> AllGather).
    case MoeSection::kBwdUnroute:
      x = S1Split(ctx, b, "bwd.mp_split", B, k.Split(x1), x1, Buf::kDy, Buf::kDys, slice, x);
      return b.Compute(
          "bwd.iorder", B, Term::kOrder, k.Unroute(s1, cap1), k.UnrouteBytes(s1, cap1), x, 0,
          RouteX(EK::kIOrderBackward, Buf::kDys, Buf::kComb, Buf::kDcomb, s1, cap1, 1, rag));
    case MoeSection::kBwdExchange:
      x = EpAllToAll(b, ctx, kBwdCombine, B, a2a, s1, x,
                     CollX(EK::kAllToAll, EG::kEp, Buf::kDcomb, Buf::kDrecv, peer, rag, true));
      x = b.Coll("bwd.esp_allgather", B, Collective::kAllGather, t.esp, d1 * skew, x,
                 CollX(EK::kAllGather, EG::kEsp, Buf::kDrecv, Buf::kDeout, part, rag));
      x = ExpertBackward(b, ctx, k, rows, x, groups, cap1);
      x = b.Coll("bwd.esp_reducescatter", B, Collective::kReduceScatter, t.esp, d1 * skew, x,
                 CollX(EK::kReduceScatter, EG::kEsp, Buf::kDein, Buf::kDback, part, rag));
      return EpAllToAll(b, ctx, kBwdDispatch, B, a2a, s1, x,
                        CollX(EK::kAllToAll, EG::kEp, Buf::kDback, Buf::kDdisp, peer, rag, false));
    case MoeSection::kBwdRoute:
      x = b.Compute(
          "bwd.order", B, Term::kOrder, k.Gather(s1, cap1), k.OrderBytes(s1, cap1), x, 0,
          RouteX(EK::kOrderBackward, Buf::kDdisp, Buf::kNone, Buf::kDxs, s1, cap1, 1, rag));
      x = b.Compute("bwd.gate", B, Term::kGate, k.GateBwd(s1), k.GateBytes(s1), x, 0,
                    GateBwdX(Buf::kXs, Buf::kDxs, s1, cap1));
      // The gate weights saw only S/N tokens per rank: their gradient is summed
      // over MP (a side branch: only the optimizer waits for it).
      {
        OpExec sum = CollX(EK::kAllReduce, EG::kMp, Buf::kGateGrad, Buf::kGateGrad,
                           l.model_dim * l.num_experts);
        sum.f32 = true;
        b.Coll("bwd.mp_allreduce_gate", B, Collective::kAllReduce, t.mp, gate_grad, x, sum);
      }
      if (ctx.sequence_parallel) return x;
      return b.Coll("bwd.mp_allgather", B, Collective::kAllGather, t.mp, x1, x,
                    CollX(EK::kAllGather, EG::kMp, Buf::kDxs, Buf::kDx, slice));
  }
  return x;
}

Deps SectionS2(MoeSection sec, const LayerContext& ctx, Builder& b, Deps x) {
  const LayerConfig& l = *ctx.layer;
  const Topology& t = ctx.topo;
  const Kernels k(ctx);
  const int n = l.parallel.mp;
  const DerivedShape d = Derive(l);
  const int64_t s = d.tokens;
  // Routing and dropping are exactly the default's at capacity T; the (E, T, M)
  // buffer is split along T, padded to a multiple of N with empty slots.
  const int64_t cap2 = (d.capacity + n - 1) / n * n;
  const double dn = static_cast<double>(l.num_experts) * cap2 * l.model_dim * l.bytes_per_element /
                    n;  // per rank after the split
  const double skew = ExpertSkew(l);
  const double a2a = SkewedA2a(ctx, dn);  // the SAA exchanges' bytes
  const int64_t rows = k.Skewed(int64_t{l.parallel.ep} * cap2);
  const int q = t.ep_ranks_per_node;
  const int w = l.parallel.ep;
  // Executed (elements): the MP rank's part [E][cap2/N][M], SAA chunks of one
  // peer's experts; the expert side is N*W groups of cap2/N rows.
  const bool rag = l.dropless;
  const int64_t m = l.model_dim, part_rows = cap2 / n, groups = int64_t{n} * w;
  const int64_t chunk = k.LocalExperts() * part_rows * m, part = l.num_experts * part_rows * m;
  using SaaExec = Builder::SaaExec;
  const SaaExec dispatch{EG::kEp, EG::kEsp, Buf::kPart, Buf::kRecv, Buf::kEin, chunk, part};
  const SaaExec combine{EG::kEp, EG::kMp, Buf::kBack, Buf::kDback, Buf::kComb, chunk, part};
  const SaaExec bwd_combine{EG::kEp, EG::kEsp, Buf::kDpart, Buf::kDrecv, Buf::kDeout, chunk, part};
  // The dual's output reuses the forward's receive buffer (dead by then).
  const SaaExec bwd_dispatch{EG::kEp, EG::kEsp, Buf::kDein, Buf::kStage, Buf::kRecv, chunk, part};
  switch (sec) {
    case MoeSection::kFwdRoute:
      x = b.Compute("fwd.gate", F, Term::kGate, k.GateFwd(s), k.GateBytes(s), x, 0,
                    GateX(Buf::kX, s, d.capacity));
      x = b.Compute("fwd.order", F, Term::kOrder, k.Scatter(s, cap2), k.OrderBytes(s, cap2), x, 0,
                    RouteX(EK::kOrder, Buf::kX, Buf::kNone, Buf::kDisp, s, cap2, n, rag));
      return b.Compute("fwd.mp_split", F, Term::kSplit, k.Split(dn), 2.0 * dn, x, 0,
                       CollX(EK::kSlice, EG::kMp, Buf::kDisp, Buf::kPart, part));
    case MoeSection::kFwdExchange:
      x = DroplessCounts(b, ctx, x);
      // SAA dispatch: EP-AlltoAll(D/N) fused with ESP-AllGather (expert side: skewed).
      x = b.SaaGather("fwd.saa_dispatch.alltoall", "fwd.saa_dispatch.allgather", F, t.ep, q, t.esp,
                      a2a, dn * skew / w, x, rag ? nullptr : &dispatch);
      x = b.Compute(
          "fwd.expert", F, Term::kExpert, k.ExpertFwd(rows), k.ExpertBytes(rows), x, 0,
          ExpertX(EK::kExpertForward, Buf::kEin, Buf::kNone, Buf::kEout, groups, part_rows, rag));
      x = b.Coll("fwd.esp_reducescatter", F, Collective::kReduceScatter, t.esp, dn * skew, x,
                 CollX(EK::kReduceScatter, EG::kEsp, Buf::kEout, Buf::kBack, part, rag));
      // SAA combine: EP-AlltoAll(D/N) fused with MP-AllGather (token side).
      x = b.SaaGather("fwd.saa_combine.alltoall", "fwd.saa_combine.allgather", F, t.ep, q, t.mp,
                      a2a, dn / w, x, rag ? nullptr : &combine);
      return b.Compute("fwd.iorder", F, Term::kOrder, k.Gather(s, cap2), k.OrderBytes(s, cap2), x,
                       0, RouteX(EK::kIOrder, Buf::kComb, Buf::kNone, Buf::kY, s, cap2, n, rag));
    // Backward. The combine's MP-AllGather has a local split as dual; the
    // AlltoAll that follows it feeds the dual of the forward ESP-ReduceScatter
    // (an ESP-AllGather), so the pair is again an SAA. The dispatch's dual is
    // the ReduceScatter pipelined with the AlltoAll, then the dual of the
    // forward MP-split (an MP-AllGather of D/N).
    case MoeSection::kBwdUnroute:
      x = b.Compute(
          "bwd.iorder", B, Term::kOrder, k.Unroute(s, cap2), k.UnrouteBytes(s, cap2), x, 0,
          RouteX(EK::kIOrderBackward, Buf::kDy, Buf::kComb, Buf::kDcomb, s, cap2, n, rag));
      return b.Compute("bwd.mp_split", B, Term::kSplit, k.Split(dn), 2.0 * dn, x, 0,
                       CollX(EK::kSlice, EG::kMp, Buf::kDcomb, Buf::kDpart, part));
    case MoeSection::kBwdExchange:
      x = b.SaaGather("bwd.saa_combine.alltoall", "bwd.saa_combine.allgather", B, t.ep, q, t.esp,
                      a2a, dn * skew / w, x, rag ? nullptr : &bwd_combine);
      x = ExpertBackward(b, ctx, k, rows, x, groups, part_rows);
      return b.SaaScatter("bwd.saa_dispatch.reducescatter", "bwd.saa_dispatch.alltoall", B, t.ep, q,
                          t.esp, a2a, dn * skew / w, x, rag ? nullptr : &bwd_dispatch);
    case MoeSection::kBwdRoute:
      x = b.Coll("bwd.mp_allgather", B, Collective::kAllGather, t.mp, dn, x,
                 CollX(EK::kAllGather, EG::kMp, Buf::kRecv, Buf::kDdisp, part));
      x = b.Compute("bwd.order", B, Term::kOrder, k.Gather(s, cap2), k.OrderBytes(s, cap2), x, 0,
                    RouteX(EK::kOrderBackward, Buf::kDdisp, Buf::kNone, Buf::kDx, s, cap2, n, rag));
      return b.Compute("bwd.gate", B, Term::kGate, k.GateBwd(s), k.GateBytes(s), x, 0,
                       GateBwdX(Buf::kX, Buf::kDx, s, d.capacity));
  }
  return x;
}

// PPMoE: every MP rank holds the layer's tokens (replicated by Megatron TP)
// and E/ep experts, each sharded esp ways (ep * esp = mp). A rank gates all S
// tokens, index-selects the capacity-T rows of its local experts, runs them,
// scatter-adds the weighted outputs into a partial [S x M], and the MP group
// AllReduces it. Backward: the output gradient is already replicated (the
// AllReduce's dual is the identity); the input gradient is partial per rank
// and is AllReduced over MP, as Megatron's TP MLP does.
Deps SectionLocal(MoeSection sec, const LayerContext& ctx, Builder& b, Deps x) {
  const LayerConfig& l = *ctx.layer;
  const Topology& t = ctx.topo;
  const Kernels k(ctx);
  const DerivedShape d = Derive(l);
  const int64_t s = d.tokens, cap = d.capacity;
  const int64_t rows = k.Skewed(cap);  // per local expert
  const double x_bytes = static_cast<double>(d.activation_bytes);
  const double rows_bytes =
      static_cast<double>(k.LocalExperts()) * cap * l.model_dim * l.bytes_per_element;
  const double select = x_bytes + rows_bytes;
  const double unroute = select + rows_bytes;  // + the rows read for the gate weights' gradient
  switch (sec) {
    case MoeSection::kFwdRoute:
      x = b.Compute("fwd.gate", F, Term::kGate, k.GateFwd(s), k.GateBytes(s), x);
      return b.Compute("fwd.index_select", F, Term::kOrder, ctx.cost->OrderUs(select, false),
                       select, x);
    case MoeSection::kFwdExchange:
      x = b.Compute("fwd.expert", F, Term::kExpert, k.ExpertFwd(rows), k.ExpertBytes(rows), x);
      x = b.Compute("fwd.iorder", F, Term::kOrder, ctx.cost->OrderUs(select, true), select, x);
      return b.Coll("fwd.mp_allreduce_combine", F, Collective::kAllReduce, t.mp, x_bytes, x);
    case MoeSection::kBwdUnroute:
      return b.Compute("bwd.iorder", B, Term::kOrder, ctx.cost->OrderUs(unroute, false), unroute,
                       x);
    case MoeSection::kBwdExchange:  // not executable yet: no buffers named
      return ExpertBackward(b, ctx, k, rows, x, 0, 0);
    case MoeSection::kBwdRoute:
      x = b.Compute("bwd.index_select", B, Term::kOrder, ctx.cost->OrderUs(select, true), select,
                    x);
      x = b.Compute("bwd.gate", B, Term::kGate, k.GateBwd(s), k.GateBytes(s), x);
      return b.Coll("bwd.mp_allreduce", B, Collective::kAllReduce, t.mp, x_bytes, x);
  }
  return x;
}

}  // namespace

OpId AppendSaa(const CostModel& cost, GroupShape a2a, int a2a_ranks_per_node, GroupShape gather,
               double a2a_bytes, double gather_chunk_bytes, Phase phase, OpId dep, OpGraph* graph) {
  Builder b(cost, graph);
  const Deps out = b.SaaGather("saa.alltoall", "saa.allgather", phase, a2a, a2a_ranks_per_node,
                               gather, a2a_bytes, gather_chunk_bytes, Deps{dep});
  return out.a;
}

Frontier AppendSection(Schedule schedule, MoeSection section, const LayerContext& ctx,
                       OpGraph* graph, Frontier in) {
  Builder b(*ctx.cost, graph);
  b.Stamp(ctx.block, ctx.block >= 0 ? kMoeScope : 0);
  Deps x{in.a, in.b};
  if (ctx.local_dispatch) {
    x = SectionLocal(section, ctx, b, x);
    return {x.a, x.b};
  }
  if (ctx.sequence_parallel && schedule != Schedule::kS1 &&
      (section == MoeSection::kFwdRoute || section == MoeSection::kBwdUnroute)) {
    // Default and S2 route the MP group's tokens: the S/mp slices (the
    // output gradient's, in the backward) are AllGathered first. The output
    // is replicated over MP; each rank keeps its slice, no op.
    const LayerConfig& l = *ctx.layer;
    const int n = l.parallel.mp;
    const double piece = static_cast<double>(Derive(l).activation_bytes) / n;
    const int64_t slice = Derive(l).tokens / n * l.model_dim;
    const bool fwd = section == MoeSection::kFwdRoute;
    x = b.Coll(fwd ? "fwd.sp_allgather" : "bwd.sp_allgather", fwd ? F : B, Collective::kAllGather,
               ctx.topo.mp, piece, x,
               CollX(EK::kAllGather, EG::kMp, fwd ? Buf::kXs : Buf::kDys, fwd ? Buf::kX : Buf::kDy,
                     slice));
  }
  switch (schedule) {
    case Schedule::kDefault:
      x = SectionDefault(section, ctx, b, x);
      break;
    case Schedule::kS1:
      x = SectionS1(section, ctx, b, x);
      break;
    case Schedule::kS2:
      x = SectionS2(section, ctx, b, x);
      break;
  }
  return {x.a, x.b};
}

absl::Status BuildSchedule(Schedule schedule, const LayerContext& ctx, OpGraph* graph) {
  MOEPLAN_RETURN_IF_ERROR(ValidateForSchedule(*ctx.layer, schedule));
  if (schedule != Schedule::kDefault && schedule != Schedule::kS1 && schedule != Schedule::kS2) {
    return absl::InvalidArgumentError("schedule: unknown schedule");
  }
  Frontier x;
  for (MoeSection s : kMoeSections) x = AppendSection(schedule, s, ctx, graph, x);
  return absl::OkStatus();
}

}  // namespace moeplan::planner
