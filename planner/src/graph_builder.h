// The op-graph builder every schedule and the whole-model builder share
// (private to the planner library): ops with costs from the cost model,
// collectives on group shapes, the pairwise AlltoAll steps and the SAA
// pipelines of docs/schedules.md. Ops are stamped with the builder's block and
// flags, so a layer built inside a model carries its block's name.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/op_graph.h"
#include "moeplan/planner/types.h"

namespace moeplan::planner::internal {

// The frontier of a chain: the ops the next op must wait for (at most two: a
// pipelined collective ends on two streams).
struct Deps {
  OpId a = kNoOp;
  OpId b = kNoOp;
};

inline ResourceMask ResourcesOf(GroupShape s) {
  if (!s.SpansNodes()) return kIntra;
  if (s.RanksPerNode() == 1) return kInter;
  return kIntra | kInter;  // hierarchical: both link levels
}

inline Term TermOf(Collective c) {
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
inline double InterNodeBytes(Collective c, GroupShape s, double n) {
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

inline int64_t Bytes(double b) { return static_cast<int64_t>(std::llround(b)); }

class Builder {
 public:
  Builder(const CostModel& cost, OpGraph* g) : cost_(cost), g_(g) {}

  // Every op added from now on carries this block and these flags (OpFlag).
  void Stamp(int block, uint8_t flags) {
    block_ = static_cast<int16_t>(block);
    flags_ = flags;
  }
  OpGraph* graph() const { return g_; }
  const CostModel& cost() const { return cost_; }

  Deps Compute(std::string_view name, Phase phase, Term term, double cost_us, double bytes,
               Deps dep, uint8_t flags = 0, const OpExec& exec = {}) {
    return {ChunkCompute(name, -1, phase, term, cost_us, bytes, {dep.a, dep.b}, flags, exec)};
  }

  // Step i of a chain of compute ops (a ring's blocks; -1: a single op).
  OpId ChunkCompute(std::string_view name, int i, Phase phase, Term term, double cost_us,
                    double bytes, std::initializer_list<OpId> deps, uint8_t flags = 0,
                    const OpExec& exec = {}) {
    Op op;
    op.base = name;
    op.step = i;
    op.flags = flags;
    op.kind = OpKind::kCompute;
    op.phase = phase;
    op.term = term;
    op.resources = kCompute;
    op.cost_us = cost_.InContextUs(name, kCompute, cost_us);
    op.bytes = Bytes(bytes);
    return Add(op, deps, exec);
  }

  // A collective on `shape` with per-rank size n; no op for a group of one rank,
  // where an AlltoAll, AllGather or ReduceScatter is the identity: its output
  // buffer is then its input's memory (an alias the executor follows).
  // `exposed`: the part of its time on the critical path (a collective
  // pipelined with a GEMM: one of its steps).
  Deps Coll(std::string_view name, Phase phase, Collective c, GroupShape shape, double n, Deps dep,
            const OpExec& exec = {}, double exposed = 1.0) {
    if (shape.ranks <= 1) {
      if (exec.in != exec.out && exec.out != Buf::kNone) Alias(exec.out, exec.in);
      return dep;
    }
    Op op;
    op.base = name;
    op.kind = OpKind::kComm;
    op.phase = phase;
    op.term = TermOf(c);
    op.resources = ResourcesOf(shape);
    op.cost_us = exposed * cost_.InContextUs(name, op.resources, cost_.CollectiveUs(c, shape, n));
    op.bytes = Bytes(n);
    op.inter_node_bytes = Bytes(InterNodeBytes(c, shape, n));
    return {Add(op, {dep.a, dep.b}, exec)};
  }

  // An AlltoAll of per-rank size n over `shape` by `algo`. Linear: one
  // collective (Coll). Hierarchical (docs/model.md "AlltoAll algorithms"):
  // an AlltoAll among the q = `ranks_per_node` members on the node, a local
  // reorder of the n bytes, then one AlltoAll among the shape.ranks / q ranks
  // of the same local index on every node; it applies only to groups spanning
  // nodes with q > 1 (otherwise the linear op is built).
  struct A2aNames {
    std::string_view linear, intra, reorder, inter;
    std::string_view gather_form;  // the allgather dispatcher's AllGather or ReduceScatter
  };
  // The hierarchical form's ops carry no executable semantics yet (kNone).
  // DeepEP's (docs/model.md "AlltoAll algorithms"): one op holding both
  // links, the `inter_share` of the linear form's inter-node bytes sent over
  // RDMA (one copy per remote node a token reaches) while NVLink forwards
  // every copy inside the nodes, as long as the slower; its data moves as the
  // linear form's (the same executable AlltoAll).
  Deps AllToAll(const A2aNames& names, Phase phase, AllToAllAlgo algo, GroupShape shape,
                int ranks_per_node, double n, Deps dep, const OpExec& exec = {},
                double inter_share = 1.0) {
    if (algo == AllToAllAlgo::kDeepEp && shape.SpansNodes()) {
      return DeepEp(names.linear, phase, shape, n, inter_share, dep, exec);
    }
    if (algo != AllToAllAlgo::kHierarchical || !shape.SpansNodes() || ranks_per_node <= 1) {
      return Coll(names.linear, phase, Collective::kAllToAll, shape, n, dep, exec);
    }
    const GroupShape local{ranks_per_node, 1};
    const int across = shape.ranks / ranks_per_node;
    const GroupShape remote{across, across};
    dep = Coll(names.intra, phase, Collective::kAllToAll, local, n, dep);
    dep =
        Compute(names.reorder, phase, Term::kAllToAll, cost_.MemoryBoundUs(2.0 * n), 2.0 * n, dep);
    return Coll(names.inter, phase, Collective::kAllToAll, remote, n, dep);
  }

  Deps DeepEp(std::string_view name, Phase phase, GroupShape shape, double n, double inter_share,
              Deps dep, const OpExec& exec) {
    const int q = shape.RanksPerNode();
    const double rdma = n * inter_share;
    const double inter =
        cost_.CollectiveUs(Collective::kAllToAll, {shape.nodes, shape.nodes}, rdma);
    const double intra = q > 1 ? cost_.CollectiveUs(Collective::kAllToAll, {q, 1}, n) : 0.0;
    Op op;
    op.base = name;
    op.kind = OpKind::kComm;
    op.phase = phase;
    op.term = Term::kAllToAll;
    op.resources = kIntra | kInter;
    op.cost_us = cost_.InContextUs(name, op.resources, std::max(inter, intra));
    op.bytes = Bytes(n);
    op.inter_node_bytes = Bytes(rdma * (shape.nodes - 1) / shape.nodes);
    return {Add(op, {dep.a, dep.b}, exec)};
  }

  // Step i (1 <= i < W) of a pairwise AlltoAll over `a2a`: one chunk to peer +i,
  // one from peer -i. Every step is timed on the slowest link any pair crosses,
  // which is the inter link whenever the group spans nodes (for a group tiling
  // contiguous node blocks every shift 0 < i < W crosses a boundary for some
  // pair); the representative rank's own bytes cross iff peer i is off-node.
  OpId A2aStep(std::string_view name, int i, Phase phase, GroupShape a2a, int ranks_per_node,
               double chunk, std::initializer_list<OpId> deps, const OpExec& exec = {}) {
    const GroupShape pair{2, a2a.SpansNodes() ? 2 : 1};
    Op op;
    op.base = name;
    op.step = i;
    op.kind = OpKind::kComm;
    op.phase = phase;
    op.term = Term::kAllToAll;
    op.resources = a2a.SpansNodes() ? kInter : kIntra;
    op.cost_us = cost_.InContextUs(name, op.resources,
                                   cost_.CollectiveUs(Collective::kSendRecv, pair, chunk));
    op.bytes = Bytes(chunk);
    op.inter_node_bytes = i >= ranks_per_node ? Bytes(chunk) : 0;
    return Add(op, deps, exec);
  }

  OpId ChunkColl(std::string_view name, int i, Phase phase, Collective c, GroupShape shape,
                 double chunk, std::initializer_list<OpId> deps, const OpExec& exec = {}) {
    Op op;
    op.base = name;
    op.step = i;
    op.kind = OpKind::kComm;
    op.phase = phase;
    op.term = TermOf(c);
    op.resources = ResourcesOf(shape);
    op.cost_us = cost_.InContextUs(name, op.resources, cost_.CollectiveUs(c, shape, chunk));
    op.bytes = Bytes(chunk);
    op.inter_node_bytes = Bytes(InterNodeBytes(c, shape, chunk));
    return Add(op, deps, exec);
  }

  // What an SAA moves (op_exec.h kSaaExchange / kSaaGather / kSaaReduce): the
  // AlltoAll's group and the gather's / scatter's, the input, the AlltoAll's
  // receive (gather form) or the reduced chunks (scatter form), the output,
  // elements per chunk and between group members' blocks. Null: no semantics.
  struct SaaExec {
    ExecGroup a2a = ExecGroup::kNone, group = ExecGroup::kNone;
    Buf in = Buf::kNone, mid = Buf::kNone, out = Buf::kNone;
    int64_t chunk = 0, stride = 0;

    // An exchange step from `send` into `recv`.
    OpExec Exchange(Buf send, Buf recv) const {
      return {
          .kind = ExecKind::kSaaExchange, .group = a2a, .in = send, .out = recv, .count = chunk};
    }
    // A gather or reduce step on `group` of the chunks the AlltoAll moves.
    OpExec Chunks(ExecKind k) const {
      return {.kind = k,
              .group = group,
              .pairs = a2a,
              .in = in,
              .mid = mid,
              .out = out,
              .count = chunk,
              .stride = stride};
    }
  };

  // SAA forward form: AlltoAll steps on one stream, AllGather of each arrived
  // chunk (the local chunk 0 first) on a second. Issue order a2a.1, allgather.0,
  // a2a.2, allgather.1, ... so each gather is issued behind the next exchange.
  // A gather group of one rank has no gather ops: the steps receive into the
  // output and the first also places the local chunk there.
  Deps SaaGather(std::string_view a2a_name, std::string_view ag_name, Phase phase, GroupShape a2a,
                 int ranks_per_node, GroupShape gather, double a2a_bytes, double gather_chunk_bytes,
                 Deps dep, const SaaExec* x = nullptr) {
    const int w = a2a.ranks;
    const double chunk = a2a_bytes / w;
    const bool gathers = gather.ranks > 1;
    OpExec step_x, gather_x;
    if (x != nullptr) {
      step_x = x->Exchange(x->in, gathers ? x->mid : x->out);
      gather_x = x->Chunks(ExecKind::kSaaGather);
      if (w <= 1 && !gathers) Alias(x->out, x->in);
    }
    OpId a2a_prev = kNoOp;  // kNoOp: the chain input `dep`
    OpId ag_prev = kNoOp;
    for (int i = 1; i < w; ++i) {
      OpExec sx = step_x;
      sx.copy_local = x != nullptr && !gathers && i == 1;
      const OpId step =
          a2a_prev == kNoOp
              ? A2aStep(a2a_name, i, phase, a2a, ranks_per_node, chunk, {dep.a, dep.b}, sx)
              : A2aStep(a2a_name, i, phase, a2a, ranks_per_node, chunk, {a2a_prev}, sx);
      if (gathers) {
        // Gather chunk i-1: it arrived with step i-1 (chunk 0 is local).
        ag_prev = GatherChunk(ag_name, i - 1, phase, gather, gather_chunk_bytes, ag_prev, a2a_prev,
                              dep, gather_x);
      }
      a2a_prev = step;
    }
    if (!gathers) return a2a_prev == kNoOp ? dep : Deps{a2a_prev};
    return {GatherChunk(ag_name, w - 1, phase, gather, gather_chunk_bytes, ag_prev, a2a_prev, dep,
                        gather_x)};
  }

  // SAA backward (dual) form: ReduceScatter of the chunk for peer i, then its
  // exchange, pipelined on two streams; the local chunk 0 is reduced last. A
  // scatter group of one rank has no reduce ops: the steps send from the
  // input and the first also places the local chunk in the output.
  Deps SaaScatter(std::string_view rs_name, std::string_view a2a_name, Phase phase, GroupShape a2a,
                  int ranks_per_node, GroupShape scatter, double a2a_bytes,
                  double scatter_chunk_bytes, Deps dep, const SaaExec* x = nullptr) {
    const int w = a2a.ranks;
    const double chunk = a2a_bytes / w;
    const bool scatters = scatter.ranks > 1;
    OpExec step_x, reduce_x;
    if (x != nullptr) {
      step_x = x->Exchange(scatters ? x->mid : x->in, x->out);
      reduce_x = x->Chunks(ExecKind::kSaaReduce);
      if (w <= 1 && !scatters) Alias(x->out, x->in);
    }
    OpId rs_prev = kNoOp, a2a_prev = kNoOp;
    auto after = [&](OpId prev) { return prev == kNoOp ? dep : Deps{prev}; };
    for (int i = 1; i < w; ++i) {
      if (scatters) {
        const Deps d = after(rs_prev);
        rs_prev = ChunkColl(rs_name, i, phase, Collective::kReduceScatter, scatter,
                            scatter_chunk_bytes, {d.a, d.b}, reduce_x);
      }
      const Deps in = after(rs_prev);
      const Deps prev = after(a2a_prev);
      OpExec sx = step_x;
      sx.copy_local = x != nullptr && !scatters && i == 1;
      a2a_prev =
          A2aStep(a2a_name, i, phase, a2a, ranks_per_node, chunk, {in.a, in.b, prev.a, prev.b}, sx);
    }
    if (scatters) {
      const Deps d = after(rs_prev);
      rs_prev = ChunkColl(rs_name, 0, phase, Collective::kReduceScatter, scatter,
                          scatter_chunk_bytes, {d.a, d.b}, reduce_x);
    }
    if (rs_prev == kNoOp) return after(a2a_prev);
    if (a2a_prev == kNoOp) return {rs_prev};
    return {rs_prev, a2a_prev};
  }

 private:
  OpId GatherChunk(std::string_view name, int i, Phase phase, GroupShape gather, double chunk,
                   OpId ag_prev, OpId arrived, Deps dep, const OpExec& exec) {
    // Waits for the previous gather (its stream) and for the chunk's arrival.
    if (ag_prev == kNoOp && arrived == kNoOp) {
      return ChunkColl(name, i, phase, Collective::kAllGather, gather, chunk, {dep.a, dep.b}, exec);
    }
    if (arrived == kNoOp) {
      return ChunkColl(name, i, phase, Collective::kAllGather, gather, chunk,
                       {ag_prev, dep.a, dep.b}, exec);
    }
    return ChunkColl(name, i, phase, Collective::kAllGather, gather, chunk, {ag_prev, arrived},
                     exec);
  }

  OpId Add(Op op, std::initializer_list<OpId> deps, const OpExec& exec) {
    op.block = block_;
    op.flags |= flags_;
    return g_->Add(op, deps, exec);
  }
  void Alias(Buf buf, Buf same_as) { g_->Alias({block_, buf, same_as}); }

  const CostModel& cost_;
  OpGraph* g_;
  int16_t block_ = -1;
  uint8_t flags_ = 0;
};

}  // namespace moeplan::planner::internal
