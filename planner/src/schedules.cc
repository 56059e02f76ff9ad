#include "moeplan/planner/schedules.h"

#include <algorithm>
#include <cmath>

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

// The frontier of a chain: the ops the next op must wait for (at most two: a
// pipelined collective ends on two streams).
struct Deps {
  OpId a = kNoOp;
  OpId b = kNoOp;
};

ResourceMask ResourcesOf(GroupShape s) {
  if (!s.SpansNodes()) return kIntra;
  if (s.RanksPerNode() == 1) return kInter;
  return kIntra | kInter;  // hierarchical: both link levels
}

Term TermOf(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return Term::kAllReduce;
    case Collective::kAllGather:
      return Term::kAllGather;
    case Collective::kReduceScatter:
      return Term::kReduceScatter;
    case Collective::kAllToAll:
      return Term::kAllToAll;
    case Collective::kSendRecv:
      return Term::kSendRecv;
  }
  return Term::kSendRecv;
}

// Bytes the representative rank sends across nodes, for the slowest rank of the
// algorithm the fallback formulas assume (ring / pairwise).
double InterNodeBytes(Collective c, GroupShape s, double n) {
  if (!s.SpansNodes()) return 0.0;
  const double r = s.ranks;
  switch (c) {
    case Collective::kAllToAll:
      return n * (r - s.RanksPerNode()) / r;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
      return (r - 1.0) * n;
    case Collective::kAllReduce:
      return 2.0 * (r - 1.0) / r * n;
    case Collective::kSendRecv:
      return n;
  }
  return 0.0;
}

int64_t Bytes(double b) { return static_cast<int64_t>(std::llround(b)); }

class Builder {
 public:
  Builder(const CostModel& cost, OpGraph* g) : cost_(cost), g_(g) {}

  Deps Compute(std::string_view name, Phase phase, Term term, double cost_us, double bytes,
               Deps dep) {
    Op op;
    op.base = name;
    op.kind = OpKind::kCompute;
    op.phase = phase;
    op.term = term;
    op.resources = kCompute;
    op.cost_us = cost_us;
    op.bytes = Bytes(bytes);
    return {g_->Add(op, {dep.a, dep.b})};
  }

  // A collective on `shape` with per-rank size n; no op for a group of one rank.
  Deps Coll(std::string_view name, Phase phase, Collective c, GroupShape shape, double n,
            Deps dep) {
    if (shape.ranks <= 1) return dep;
    Op op;
    op.base = name;
    op.kind = OpKind::kComm;
    op.phase = phase;
    op.term = TermOf(c);
    op.resources = ResourcesOf(shape);
    op.cost_us = cost_.CollectiveUs(c, shape, n);
    op.bytes = Bytes(n);
    op.inter_node_bytes = Bytes(InterNodeBytes(c, shape, n));
    return {g_->Add(op, {dep.a, dep.b})};
  }

  // Step i (1 <= i < W) of a pairwise AlltoAll over `a2a`: one chunk to peer +i,
  // one from peer -i. Every step is timed on the slowest link any pair crosses,
  // which is the inter link whenever the group spans nodes (for a group tiling
  // contiguous node blocks every shift 0 < i < W crosses a boundary for some
  // pair); the representative rank's own bytes cross iff peer i is off-node.
  OpId A2aStep(std::string_view name, int i, Phase phase, GroupShape a2a, int ranks_per_node,
               double chunk, std::initializer_list<OpId> deps) {
    const GroupShape pair{2, a2a.SpansNodes() ? 2 : 1};
    Op op;
    op.base = name;
    op.step = i;
    op.kind = OpKind::kComm;
    op.phase = phase;
    op.term = Term::kAllToAll;
    op.resources = a2a.SpansNodes() ? kInter : kIntra;
    op.cost_us = cost_.CollectiveUs(Collective::kSendRecv, pair, chunk);
    op.bytes = Bytes(chunk);
    op.inter_node_bytes = i >= ranks_per_node ? Bytes(chunk) : 0;
    return g_->Add(op, deps);
  }

  OpId ChunkColl(std::string_view name, int i, Phase phase, Collective c, GroupShape shape,
                 double chunk, std::initializer_list<OpId> deps) {
    Op op;
    op.base = name;
    op.step = i;
    op.kind = OpKind::kComm;
    op.phase = phase;
    op.term = TermOf(c);
    op.resources = ResourcesOf(shape);
    op.cost_us = cost_.CollectiveUs(c, shape, chunk);
    op.bytes = Bytes(chunk);
    op.inter_node_bytes = Bytes(InterNodeBytes(c, shape, chunk));
    return g_->Add(op, deps);
  }

  // SAA forward form: AlltoAll steps on one stream, AllGather of each arrived
  // chunk (the local chunk 0 first) on a second. Issue order a2a.1, allgather.0,
  // a2a.2, allgather.1, ... so each gather is issued behind the next exchange.
  Deps SaaGather(std::string_view a2a_name, std::string_view ag_name, Phase phase, GroupShape a2a,
                 int ranks_per_node, GroupShape gather, double a2a_bytes, double gather_chunk_bytes,
                 Deps dep) {
    const int w = a2a.ranks;
    const double chunk = a2a_bytes / w;
    const bool gathers = gather.ranks > 1;
    OpId a2a_prev = kNoOp;  // kNoOp: the chain input `dep`
    OpId ag_prev = kNoOp;
    for (int i = 1; i < w; ++i) {
      const OpId step =
          a2a_prev == kNoOp
              ? A2aStep(a2a_name, i, phase, a2a, ranks_per_node, chunk, {dep.a, dep.b})
              : A2aStep(a2a_name, i, phase, a2a, ranks_per_node, chunk, {a2a_prev});
      if (gathers) {
        // Gather chunk i-1: it arrived with step i-1 (chunk 0 is local).
        ag_prev =
            GatherChunk(ag_name, i - 1, phase, gather, gather_chunk_bytes, ag_prev, a2a_prev, dep);
      }
      a2a_prev = step;
    }
    if (!gathers) return a2a_prev == kNoOp ? dep : Deps{a2a_prev};
    return {GatherChunk(ag_name, w - 1, phase, gather, gather_chunk_bytes, ag_prev, a2a_prev, dep)};
  }

  // SAA backward (dual) form: ReduceScatter of the chunk for peer i, then its
  // exchange, pipelined on two streams; the local chunk 0 is reduced last.
  Deps SaaScatter(std::string_view rs_name, std::string_view a2a_name, Phase phase, GroupShape a2a,
                  int ranks_per_node, GroupShape scatter, double a2a_bytes,
                  double scatter_chunk_bytes, Deps dep) {
    const int w = a2a.ranks;
    const double chunk = a2a_bytes / w;
    const bool scatters = scatter.ranks > 1;
    OpId rs_prev = kNoOp, a2a_prev = kNoOp;
    auto after = [&](OpId prev) { return prev == kNoOp ? dep : Deps{prev}; };
    for (int i = 1; i < w; ++i) {
      if (scatters) {
        const Deps d = after(rs_prev);
        rs_prev = ChunkColl(rs_name, i, phase, Collective::kReduceScatter, scatter,
                            scatter_chunk_bytes, {d.a, d.b});
      }
      const Deps in = after(rs_prev);
      const Deps prev = after(a2a_prev);
      a2a_prev =
          A2aStep(a2a_name, i, phase, a2a, ranks_per_node, chunk, {in.a, in.b, prev.a, prev.b});
    }
    if (scatters) {
      const Deps d = after(rs_prev);
      rs_prev = ChunkColl(rs_name, 0, phase, Collective::kReduceScatter, scatter,
                          scatter_chunk_bytes, {d.a, d.b});
    }
    if (rs_prev == kNoOp) return after(a2a_prev);
    if (a2a_prev == kNoOp) return {rs_prev};
    return {rs_prev, a2a_prev};
  }

 private:
  OpId GatherChunk(std::string_view name, int i, Phase phase, GroupShape gather, double chunk,
                   OpId ag_prev, OpId arrived, Deps dep) {
    // Waits for the previous gather (its stream) and for the chunk's arrival.
    if (ag_prev == kNoOp && arrived == kNoOp) {
      return ChunkColl(name, i, phase, Collective::kAllGather, gather, chunk, {dep.a, dep.b});
    }
    if (arrived == kNoOp) {
      return ChunkColl(name, i, phase, Collective::kAllGather, gather, chunk,
                       {ag_prev, dep.a, dep.b});
    }
    return ChunkColl(name, i, phase, Collective::kAllGather, gather, chunk, {ag_prev, arrived});
  }

  const CostModel& cost_;
  OpGraph* g_;
};

// Compute-op costs shared by all schedules. Sizes in elements, b bytes each.
class Kernels {
 public:
  explicit Kernels(const LayerContext& ctx) : l_(*ctx.layer), c_(*ctx.cost) {
    b_ = l_.bytes_per_element;
  }

  // Gate: logits GEMM [S x M]·[M x E], then softmax and top-k over S x E
  // (read logits, write probabilities, read them for top-k: 3 S E b bytes).
  double GateBytes(int64_t s) const { return 3.0 * s * l_.num_experts * b_; }
  double GateFwd(int64_t s) const {
    return c_.GemmUs(s, l_.num_experts, l_.model_dim) + c_.MemoryBoundUs(GateBytes(s));
  }
  // dX = dL·Wg^T and dWg = X^T·dL, plus the softmax backward.
  double GateBwd(int64_t s) const {
    return c_.GemmUs(s, l_.model_dim, l_.num_experts) + c_.GemmUs(l_.model_dim, l_.num_experts, s) +
           c_.MemoryBoundUs(GateBytes(s));
  }
  // Order / i-order: scatter S tokens into the (E, T, M) buffer or gather back.
  double OrderBytes(int64_t s, int64_t t) const {
    return static_cast<double>(s) * l_.model_dim * b_ +
           static_cast<double>(l_.num_experts) * t * l_.model_dim * b_;
  }
  double Order(int64_t s, int64_t t) const { return c_.MemoryBoundUs(OrderBytes(s, t)); }
  // A local split copies its slice: read + write.
  double Split(double slice_bytes) const { return c_.MemoryBoundUs(2.0 * slice_bytes); }

  // Expert FFN shard on `rows` tokens per local expert: [rows x M]·[M x H'] and
  // [rows x H']·[H' x M] for each of E / ep local experts, plus the activation.
  int64_t LocalExperts() const { return l_.num_experts / l_.parallel.ep; }
  int64_t Shard() const { return l_.hidden_dim / l_.parallel.esp; }
  double ActBytes(int64_t rows) const {
    return static_cast<double>(LocalExperts()) * rows * Shard() * b_;
  }
  double ExpertFwd(int64_t rows) const {
    const int64_t h = Shard(), m = l_.model_dim;
    return LocalExperts() * (c_.GemmUs(rows, h, m) + c_.GemmUs(rows, m, h)) +
           c_.ActivationUs(2.0 * ActBytes(rows), /*backward=*/false);
  }
  // Input gradients: the two GEMMs transposed, and the activation backward.
  double ExpertDx(int64_t rows) const {
    const int64_t h = Shard(), m = l_.model_dim;
    return LocalExperts() * (c_.GemmUs(rows, h, m) + c_.GemmUs(rows, m, h)) +
           c_.ActivationUs(3.0 * ActBytes(rows), /*backward=*/true);
  }
  // Weight gradients: dW2 = A^T·dY [H' x M], dW1 = X^T·dA [M x H'], reducing over rows.
  double ExpertDw(int64_t rows) const {
    const int64_t h = Shard(), m = l_.model_dim;
    return LocalExperts() * (c_.GemmUs(h, m, rows) + c_.GemmUs(m, h, rows));
  }
  double ExpertBytes(int64_t rows) const {
    return static_cast<double>(LocalExperts()) * rows * l_.model_dim * b_ * 2.0 +
           2.0 * ActBytes(rows);
  }
  // Token skew scales the heaviest rank's expert-side rows.
  int64_t Skewed(int64_t rows) const {
    return static_cast<int64_t>(std::ceil(static_cast<double>(rows) * l_.token_skew - 1e-9));
  }

 private:
  const LayerConfig& l_;
  const CostModel& c_;
  int b_;
};

constexpr Phase F = Phase::kForward;
constexpr Phase B = Phase::kBackward;

absl::Status BuildDefault(const LayerContext& ctx, OpGraph* g) {
  const LayerConfig& l = *ctx.layer;
  const Topology& t = ctx.topo;
  const Kernels k(ctx);
  Builder b(*ctx.cost, g);
  const DerivedShape d = Derive(l);
  const int64_t s = d.tokens, cap = d.capacity;
  const double skew = l.token_skew;
  const double dbuf = static_cast<double>(d.dispatch_bytes);
  const int64_t rows = k.Skewed(int64_t{l.parallel.ep} * cap);  // per local expert

  Deps x;
  x = b.Compute("fwd.gate", F, Term::kGate, k.GateFwd(s), k.GateBytes(s), x);
  x = b.Compute("fwd.order", F, Term::kOrder, k.Order(s, cap), k.OrderBytes(s, cap), x);
  x = b.Coll("fwd.ep_alltoall_dispatch", F, Collective::kAllToAll, t.ep, dbuf * skew, x);
  x = b.Compute("fwd.expert", F, Term::kExpert, k.ExpertFwd(rows), k.ExpertBytes(rows), x);
  x = b.Coll("fwd.esp_allreduce", F, Collective::kAllReduce, t.esp, dbuf * skew, x);
  x = b.Coll("fwd.ep_alltoall_combine", F, Collective::kAllToAll, t.ep, dbuf * skew, x);
  x = b.Compute("fwd.iorder", F, Term::kOrder, k.Order(s, cap), k.OrderBytes(s, cap), x);

  x = b.Compute("bwd.iorder", B, Term::kOrder, k.Order(s, cap), k.OrderBytes(s, cap), x);
  x = b.Coll("bwd.ep_alltoall_combine", B, Collective::kAllToAll, t.ep, dbuf * skew, x);
  // The output gradient is replicated over the ESP group, so the forward AllReduce's
  // dual is the sum of the shards' partial input gradients, after the expert.
  x = b.Compute("bwd.expert_dx", B, Term::kExpert, k.ExpertDx(rows), k.ExpertBytes(rows), x);
  x = b.Compute("bwd.expert_dw", B, Term::kExpert, k.ExpertDw(rows), k.ExpertBytes(rows), x);
  x = b.Coll("bwd.esp_allreduce", B, Collective::kAllReduce, t.esp, dbuf * skew, x);
  x = b.Coll("bwd.ep_alltoall_dispatch", B, Collective::kAllToAll, t.ep, dbuf * skew, x);
  x = b.Compute("bwd.order", B, Term::kOrder, k.Order(s, cap), k.OrderBytes(s, cap), x);
  b.Compute("bwd.gate", B, Term::kGate, k.GateBwd(s), k.GateBytes(s), x);
  return absl::OkStatus();
}

absl::Status BuildS1(const LayerContext& ctx, OpGraph* g) {
  const LayerConfig& l = *ctx.layer;
  const Topology& t = ctx.topo;
  const Kernels k(ctx);
  Builder b(*ctx.cost, g);
  const int n = l.parallel.mp;
  const DerivedShape d = Derive(l);
  const int64_t s1 = d.tokens / n;  // tokens per rank after the MP split
  const int64_t cap1 = Capacity(l.top_k, l.capacity_factor, s1, l.num_experts);  // per rank
  const double d1 = static_cast<double>(l.num_experts) * cap1 * l.model_dim * l.bytes_per_element;
  const double x1 = static_cast<double>(d.activation_bytes) / n;
  const double skew = l.token_skew;
  const int64_t rows = k.Skewed(int64_t{n} * l.parallel.ep * cap1);
  const double gate_grad = static_cast<double>(l.model_dim) * l.num_experts * l.bytes_per_element;

  Deps x;
  x = b.Compute("fwd.mp_split", F, Term::kSplit, k.Split(x1), 2.0 * x1, x);
  x = b.Compute("fwd.gate", F, Term::kGate, k.GateFwd(s1), k.GateBytes(s1), x);
  x = b.Compute("fwd.order", F, Term::kOrder, k.Order(s1, cap1), k.OrderBytes(s1, cap1), x);
  x = b.Coll("fwd.ep_alltoall_dispatch", F, Collective::kAllToAll, t.ep, d1 * skew, x);
  x = b.Coll("fwd.esp_allgather", F, Collective::kAllGather, t.esp, d1 * skew, x);
  x = b.Compute("fwd.expert", F, Term::kExpert, k.ExpertFwd(rows), k.ExpertBytes(rows), x);
  x = b.Coll("fwd.esp_reducescatter", F, Collective::kReduceScatter, t.esp, d1 * skew, x);
  x = b.Coll("fwd.ep_alltoall_combine", F, Collective::kAllToAll, t.ep, d1 * skew, x);
  x = b.Compute("fwd.iorder", F, Term::kOrder, k.Order(s1, cap1), k.OrderBytes(s1, cap1), x);
  x = b.Coll("fwd.mp_allgather", F, Collective::kAllGather, t.mp, x1, x);

  // Backward: the dual of each op in reverse (MP-AllGather -> local split,
  // AllGather <-> ReduceScatter, AlltoAll -> AlltoAll, split -> AllGather).
  x = b.Compute("bwd.mp_split", B, Term::kSplit, k.Split(x1), 2.0 * x1, x);
  x = b.Compute("bwd.iorder", B, Term::kOrder, k.Order(s1, cap1), k.OrderBytes(s1, cap1), x);
  x = b.Coll("bwd.ep_alltoall_combine", B, Collective::kAllToAll, t.ep, d1 * skew, x);
  x = b.Coll("bwd.esp_allgather", B, Collective::kAllGather, t.esp, d1 * skew, x);
  x = b.Compute("bwd.expert_dx", B, Term::kExpert, k.ExpertDx(rows), k.ExpertBytes(rows), x);
  x = b.Compute("bwd.expert_dw", B, Term::kExpert, k.ExpertDw(rows), k.ExpertBytes(rows), x);
  x = b.Coll("bwd.esp_reducescatter", B, Collective::kReduceScatter, t.esp, d1 * skew, x);
  x = b.Coll("bwd.ep_alltoall_dispatch", B, Collective::kAllToAll, t.ep, d1 * skew, x);
  x = b.Compute("bwd.order", B, Term::kOrder, k.Order(s1, cap1), k.OrderBytes(s1, cap1), x);
  x = b.Compute("bwd.gate", B, Term::kGate, k.GateBwd(s1), k.GateBytes(s1), x);
  // The gate weights saw only S/N tokens per rank: their gradient is summed over MP.
  b.Coll("bwd.mp_allreduce_gate", B, Collective::kAllReduce, t.mp, gate_grad, x);
  b.Coll("bwd.mp_allgather", B, Collective::kAllGather, t.mp, x1, x);
  return absl::OkStatus();
}

absl::Status BuildS2(const LayerContext& ctx, OpGraph* g) {
  const LayerConfig& l = *ctx.layer;
  const Topology& t = ctx.topo;
  const Kernels k(ctx);
  Builder b(*ctx.cost, g);
  const int n = l.parallel.mp;
  const DerivedShape d = Derive(l);
  const int64_t s = d.tokens;
  // Routing and dropping are exactly the default's at capacity T; the (E, T, M)
  // buffer is split along T, padded to a multiple of N with empty slots.
  const int64_t cap2 = (d.capacity + n - 1) / n * n;
  const double dn = static_cast<double>(l.num_experts) * cap2 * l.model_dim * l.bytes_per_element /
                    n;  // per rank after the split
  const double skew = l.token_skew;
  const int64_t rows = k.Skewed(int64_t{l.parallel.ep} * cap2);
  const int q = t.ep_ranks_per_node;
  const int w = l.parallel.ep;

  Deps x;
  x = b.Compute("fwd.gate", F, Term::kGate, k.GateFwd(s), k.GateBytes(s), x);
  x = b.Compute("fwd.order", F, Term::kOrder, k.Order(s, cap2), k.OrderBytes(s, cap2), x);
  x = b.Compute("fwd.mp_split", F, Term::kSplit, k.Split(dn), 2.0 * dn, x);
  // SAA dispatch: EP-AlltoAll(D/N) fused with ESP-AllGather (expert side: skewed).
  x = b.SaaGather("fwd.saa_dispatch.alltoall", "fwd.saa_dispatch.allgather", F, t.ep, q, t.esp,
                  dn * skew, dn * skew / w, x);
  x = b.Compute("fwd.expert", F, Term::kExpert, k.ExpertFwd(rows), k.ExpertBytes(rows), x);
  x = b.Coll("fwd.esp_reducescatter", F, Collective::kReduceScatter, t.esp, dn * skew, x);
  // SAA combine: EP-AlltoAll(D/N) fused with MP-AllGather (token side).
  x = b.SaaGather("fwd.saa_combine.alltoall", "fwd.saa_combine.allgather", F, t.ep, q, t.mp,
                  dn * skew, dn / w, x);
  x = b.Compute("fwd.iorder", F, Term::kOrder, k.Order(s, cap2), k.OrderBytes(s, cap2), x);

  // Backward. The combine's MP-AllGather has a local split as dual; the AlltoAll
  // that follows it feeds the dual of the forward ESP-ReduceScatter (an
  // ESP-AllGather), so the pair is again an SAA. The dispatch's dual is the
  // ReduceScatter pipelined with the AlltoAll, then the dual of the forward
  // MP-split (an MP-AllGather of D/N).
  x = b.Compute("bwd.iorder", B, Term::kOrder, k.Order(s, cap2), k.OrderBytes(s, cap2), x);
  x = b.Compute("bwd.mp_split", B, Term::kSplit, k.Split(dn), 2.0 * dn, x);
  x = b.SaaGather("bwd.saa_combine.alltoall", "bwd.saa_combine.allgather", B, t.ep, q, t.esp,
                  dn * skew, dn * skew / w, x);
  x = b.Compute("bwd.expert_dx", B, Term::kExpert, k.ExpertDx(rows), k.ExpertBytes(rows), x);
  x = b.Compute("bwd.expert_dw", B, Term::kExpert, k.ExpertDw(rows), k.ExpertBytes(rows), x);
  x = b.SaaScatter("bwd.saa_dispatch.reducescatter", "bwd.saa_dispatch.alltoall", B, t.ep, q, t.esp,
                   dn * skew, dn * skew / w, x);
  x = b.Coll("bwd.mp_allgather", B, Collective::kAllGather, t.mp, dn, x);
  x = b.Compute("bwd.order", B, Term::kOrder, k.Order(s, cap2), k.OrderBytes(s, cap2), x);
  b.Compute("bwd.gate", B, Term::kGate, k.GateBwd(s), k.GateBytes(s), x);
  return absl::OkStatus();
}

}  // namespace

OpId AppendSaa(const CostModel& cost, GroupShape a2a, int a2a_ranks_per_node, GroupShape gather,
               double a2a_bytes, double gather_chunk_bytes, Phase phase, OpId dep, OpGraph* graph) {
  Builder b(cost, graph);
  const Deps out = b.SaaGather("saa.alltoall", "saa.allgather", phase, a2a, a2a_ranks_per_node,
                               gather, a2a_bytes, gather_chunk_bytes, Deps{dep});
  return out.a;
}

absl::Status BuildSchedule(Schedule schedule, const LayerContext& ctx, OpGraph* graph) {
  MOEPLAN_RETURN_IF_ERROR(ValidateForSchedule(*ctx.layer, schedule));
  switch (schedule) {
    case Schedule::kDefault:
      return BuildDefault(ctx, graph);
    case Schedule::kS1:
      return BuildS1(ctx, graph);
    case Schedule::kS2:
      return BuildS2(ctx, graph);
  }
  return absl::InvalidArgumentError("schedule: unknown schedule");
}

}  // namespace moeplan::planner
