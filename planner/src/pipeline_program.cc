// Programs of pipelined layouts (docs/layouts.md "Programs"): the chunk
// graphs copied per micro-batch in the pipeline's order, with transfers.
#include "moeplan/planner/pipeline_program.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/limits.h"
#include "moeplan/planner/pair_overlap.h"
#include "moeplan/planner/pipeline.h"

namespace moeplan::planner {

namespace {

// What a chunk graph's op is in the program: part of every micro-batch's
// forward or backward, or of the chunk's tail (once per iteration).
enum class Role : uint8_t { kForward, kBackward, kTail };

Role RoleOf(const Op& op, int zero_stage) {
  if (op.term == Term::kOptimizer) return Role::kTail;
  // ZeRO 2-3 reduce-scatter each micro-batch's gradients as they come (the
  // buckets issued in the backward, "bwd."); 0-1 once the last one is in.
  if ((op.flags & kGradSync) && !(zero_stage >= 2 && op.base.substr(0, 4) == "bwd.")) {
    return Role::kTail;
  }
  return op.phase == Phase::kForward ? Role::kForward : Role::kBackward;
}

// A chunk graph read once: each op's role, the ops each step copies, and the
// step's roots (its first ops, which wait for the transfer feeding the step)
// and ends (what the transfer after it waits for).
struct ChunkShape {
  std::vector<Role> role;
  std::vector<OpId> ops[3];  // by role, in issue order
  std::vector<uint8_t> root;
  std::vector<OpId> ends[2];  // forward, backward
};

absl::Status ShapeOf(const OpGraph& g, int zero_stage, ChunkShape* out) {
  const int n = g.size();
  out->role.resize(static_cast<size_t>(n));
  out->root.assign(static_cast<size_t>(n), 0);
  std::vector<uint8_t> consumed(static_cast<size_t>(n), 0);
  for (OpId id = 0; id < n; ++id) {
    const Role r = RoleOf(g.op(id), zero_stage);
    out->role[static_cast<size_t>(id)] = r;
    out->ops[static_cast<size_t>(r)].push_back(id);
    bool root = r != Role::kTail && !(g.op(id).flags & kPrefetch);
    for (OpId d : g.deps(id)) {
      const Role dr = out->role[static_cast<size_t>(d)];
      if (dr == Role::kTail && r != Role::kTail) {
        return absl::InternalError(
            Cat("pipeline program: ", g.op(id).Name(), " waits for the tail op ", g.op(d).Name()));
      }
      if (r == Role::kForward && dr == Role::kBackward) {
        return absl::InternalError(Cat("pipeline program: the forward op ", g.op(id).Name(),
                                       " waits for the backward op ", g.op(d).Name()));
      }
      if (dr == r) {
        root = false;
        // What buckets and prefetches wait for still ends the phase's chain.
        if (!(g.op(id).flags & (kGradSync | kPrefetch))) consumed[static_cast<size_t>(d)] = 1;
      }
    }
    out->root[static_cast<size_t>(id)] = root;
  }
  // Ends: the ops of a phase nothing of it waits for, gradient buckets and
  // prefetches aside; backward weight gradients too unless they end the
  // chain (a chunk's input gradient is sent before its dW ops run).
  for (int phase = 0; phase < 2; ++phase) {
    std::vector<OpId> ends, dw;
    for (OpId id : out->ops[phase]) {
      const Op& op = g.op(id);
      if (consumed[static_cast<size_t>(id)] || (op.flags & (kGradSync | kPrefetch))) continue;
      ((op.flags & kWeightGrad) ? dw : ends).push_back(id);
    }
    if (ends.empty()) ends = std::move(dw);
    if (ends.empty() && !out->ops[phase].empty()) {
      return absl::InternalError("pipeline program: a chunk phase has no last op");
    }
    out->ends[phase] = std::move(ends);
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// Builds one program: the state the copies of chunk ops, the transfers and
// the receivers' gathers share while WalkPipeline issues the steps.
class ProgramBuilder {
 public:
  ProgramBuilder(const Layout& l, std::span<const OpGraph* const> chunks,
                 const std::vector<ChunkShape>& shapes, const PipelineLinks& links, OpGraph* out)
      : p_(l.pp),
        v_(l.Chunks()),
        m_(l.ChunkMicrobatches()),
        dual_(l.pipeline == PipelineSchedule::kDualPipe),
        chunks_(chunks),
        shapes_(shapes),
        links_(links),
        out_(out),
        ids_(chunks.size() * static_cast<size_t>(m_)),
        instances_(ids_.size()),
        input_(ids_.size() * 2, kNoOp) {}

  // One step: the receiver's gather, the chunk's ops, the transfer after
  // them. An overlapped pair (the first step `with_next`) is issued with its
  // second step: both gathers, the two steps' ops merged, both transfers.
  void Step(int s, const PipeStep& st) {
    if (st.with_next && !pending_) {
      pending_ = st;
      return;
    }
    if (pending_) {
      const PipeStep first = *pending_;
      pending_.reset();
      Gather(s, first);
      Gather(s, st);
      Pair(s, first.forward ? first : st, first.forward ? st : first);
      Transfer(s, first);
      Transfer(s, st);
      return;
    }
    Gather(s, st);
    Copy(s, st.chunk, st.mb, st.forward ? Role::kForward : Role::kBackward);
    Transfer(s, st);
  }
  // After a stage's last step, each chunk's tail once.
  void Tails() {
    for (int s = 0; s < p_; ++s) {
      for (int c = 0; c < v_; ++c) Copy(s, c, m_ - 1, Role::kTail);
    }
  }
  const absl::Status& error() const { return error_; }

 private:
  size_t Slot(int s, int c, int i) const { return (static_cast<size_t>(s) * v_ + c) * m_ + i; }

  void Stamp(Op* op, int s, int c, int i) const {
    op->flags |= kStaged;
    op->device = static_cast<int16_t>(s);
    op->chunk = static_cast<int8_t>(v_ > 1 ? c : -1);
    op->mb = static_cast<int16_t>(i);
  }

  // The program's MoE layer instance of chunk layer `layer` for micro-batch i.
  int16_t Instance(const OpGraph& g, std::vector<int16_t>& inst, int16_t layer, int i) {
    int16_t& mine = inst[static_cast<size_t>(layer)];
    if (mine == 0) {
      ExecLayer el = g.layers()[static_cast<size_t>(layer - 1)];
      el.mb = static_cast<int16_t>(i);
      if (out_->layers().size() >= static_cast<size_t>(INT16_MAX) && error_.ok()) {
        error_ = absl::ResourceExhaustedError(
            "pipeline program: more than 32767 MoE layer instances; use fewer "
            "micro-batches or blocks");
      }
      mine = out_->AddLayer(el);
    }
    return mine;
  }

  // Where the copies of one role of chunk (s, c) for micro-batch i go (tail:
  // i = m - 1's maps, the copies without a micro-batch), looked up once.
  struct CopyTo {
    const OpGraph* g;
    const ChunkShape* shape;
    std::vector<OpId>* map;
    std::vector<int16_t>* inst;
    OpId in;  // the transfer its first ops wait for
    int s, c, mb;
    bool tail;
  };
  CopyTo Target(int s, int c, int i, Role role) {
    const size_t k = Chunk(s, c), slot = Slot(s, c, i);
    const OpGraph& g = *chunks_[k];
    std::vector<OpId>& map = ids_[slot];
    if (map.empty()) map.assign(static_cast<size_t>(g.size()), kNoOp);
    std::vector<int16_t>& inst = instances_[slot];
    if (inst.empty()) inst.assign(g.layers().size() + 1, 0);
    const bool tail = role == Role::kTail;
    return {&g,    &shapes_[k], &map, &inst, tail ? kNoOp : input_[slot * 2 + (role == Role::kForward)],
            s,     c,           ModelMicrobatch(s, c, i), tail};
  }
  // Copies every op of `role` of chunk (s, c) for micro-batch i.
  void Copy(int s, int c, int i, Role role) {
    const CopyTo to = Target(s, c, i, role);
    for (OpId id : to.shape->ops[static_cast<size_t>(role)]) CopyOp(to, id);
  }
  // The forward step `f` and the backward step `b` of stage s merged: their
  // ops in the order the planner's pair simulation issues them (MergedUs,
  // each step's ops in its order), so the lanes overlap them as planned.
  void Pair(int s, const PipeStep& f, const PipeStep& b) {
    const CopyTo ft = Target(s, f.chunk, f.mb, Role::kForward);
    const CopyTo bt = Target(s, b.chunk, b.mb, Role::kBackward);
    const std::vector<OpId>& fo = ft.shape->ops[0];
    const std::vector<OpId>& bo = bt.shape->ops[1];
    MergedUs(PhaseInOrder(*ft.g, fo), PhaseInOrder(*bt.g, bo), &merge_, &order_);
    size_t i = 0, j = 0;
    for (uint8_t from_f : order_) {
      if (from_f) {
        CopyOp(ft, fo[i++]);
      } else {
        CopyOp(bt, bo[j++]);
      }
    }
  }
  size_t Chunk(int s, int c) const { return static_cast<size_t>(s) * v_ + c; }
  // A micro-batch's number in the model: DualPipe's direction-1 micro-batch
  // i is m/2 + i (the two directions carry different micro-batches).
  int ModelMicrobatch(int s, int c, int i) const {
    return dual_ && DualPipeChunkOf(p_, s, c).direction == 1 ? m_ + i : i;
  }
  void CopyOp(const CopyTo& to, OpId id) {
    const OpGraph& g = *to.g;
    std::vector<OpId>& map = *to.map;
    deps_.clear();
    for (OpId d : g.deps(id)) {
      const OpId nd = map[static_cast<size_t>(d)];
      if (nd == kNoOp && error_.ok()) {
        error_ = absl::InternalError(Cat("pipeline program: ", g.op(id).Name(),
                                         " issued before its dependency ", g.op(d).Name()));
      }
      deps_.push_back(nd);
    }
    if (to.shape->root[static_cast<size_t>(id)] && to.in != kNoOp) deps_.push_back(to.in);
    Op op = g.op(id);
    Stamp(&op, to.s, to.c, to.tail ? -1 : to.mb);
    OpExec x = g.exec(id);
    if (x.layer > 0) x.layer = Instance(g, *to.inst, x.layer, to.mb);
    map[static_cast<size_t>(id)] = out_->Add(op, deps_, x);
  }

  // The step a transfer after (s, st) feeds, or false when none does: the
  // last chunk's forward (its backward follows on this stage) and the first
  // chunk's backward (the end of the micro-batch).
  bool Destination(int s, const PipeStep& st, int* ds, int* dc) const {
    *ds = s;
    *dc = st.chunk;
    if (dual_) {
      // Segment k of direction d: stage k (d = 0) or p - 1 - k, chunk 0 when
      // k < p / 2 (DualPipeFeedOf's placement).
      const DualPipeChunk at = DualPipeChunkOf(p_, s, st.chunk);
      const int k = at.segment + (st.forward ? 1 : -1);
      if (k < 0 || k >= p_) return false;
      *ds = at.direction == 0 ? k : p_ - 1 - k;
      *dc = k < p_ / 2 ? 0 : 1;
      return true;
    }
    if (st.forward) {
      if (s < p_ - 1) {
        *ds = s + 1;
      } else if (st.chunk < v_ - 1) {
        *ds = 0;
        *dc = st.chunk + 1;
      } else {
        return false;
      }
    } else if (s > 0) {
      *ds = s - 1;
    } else if (st.chunk > 0) {
      *ds = p_ - 1;
      *dc = st.chunk - 1;
    } else {
      return false;
    }
    return true;
  }

  void Transfer(int s, const PipeStep& st) {
    const bool fwd = st.forward;
    int ds = s, dc = st.chunk;
    if (!Destination(s, st, &ds, &dc)) return;
    const size_t k = static_cast<size_t>(s) * v_ + st.chunk;
    const std::vector<OpId>& map = ids_[Slot(s, st.chunk, st.mb)];
    deps_.clear();
    for (OpId e : shapes_[k].ends[fwd ? 0 : 1]) deps_.push_back(map[static_cast<size_t>(e)]);
    Op send;
    send.base = fwd ? "pipe.send_fwd" : "pipe.send_bwd";
    send.kind = OpKind::kComm;
    send.phase = fwd ? Phase::kForward : Phase::kBackward;
    send.term = Term::kSendRecv;
    send.resources = links_.send_resources;
    send.cost_us = links_.send_us;
    send.bytes = links_.bytes;
    send.inter_node_bytes = links_.send_resources & kInter ? links_.bytes : 0;
    Stamp(&send, s, st.chunk, ModelMicrobatch(s, st.chunk, st.mb));
    OpExec sx;
    sx.kind = ExecKind::kSendRecv;
    sx.group = s % 2 == 0 ? ExecGroup::kPpEven : ExecGroup::kPpOdd;
    sx.parts = ds;
    sx.count = links_.elements;
    input_[Slot(ds, dc, st.mb) * 2 + (fwd ? 1 : 0)] = out_->Add(send, deps_, sx);
  }

  // With tp > 1 the receiving TP group gathers a transfer's pieces first
  // thing in the step that uses them: issued there, not with the send, it
  // never holds the receiver's link ahead of the receiver's earlier work.
  void Gather(int s, const PipeStep& st) {
    OpId& in = input_[Slot(s, st.chunk, st.mb) * 2 + (st.forward ? 1 : 0)];
    if (links_.tp <= 1 || in == kNoOp) return;
    Op op;
    op.base = st.forward ? "pipe.gather_fwd" : "pipe.gather_bwd";
    op.kind = OpKind::kComm;
    op.phase = st.forward ? Phase::kForward : Phase::kBackward;
    op.term = Term::kAllGather;
    op.resources = kIntra;
    op.cost_us = links_.gather_us;
    op.bytes = links_.bytes;
    Stamp(&op, s, st.chunk, ModelMicrobatch(s, st.chunk, st.mb));
    OpExec x;
    x.kind = ExecKind::kAllGather;
    x.group = ExecGroup::kMp;
    x.count = links_.elements;
    in = out_->Add(op, {in}, x);
  }

  const int p_, v_, m_;  // m_: micro-batches per chunk (DualPipe: per direction)
  const bool dual_;
  std::span<const OpGraph* const> chunks_;
  const std::vector<ChunkShape>& shapes_;
  const PipelineLinks& links_;
  OpGraph* out_;
  // The copy of chunk op `id` for micro-batch i of (stage, chunk): ids_[Slot][id].
  std::vector<std::vector<OpId>> ids_;
  std::vector<std::vector<int16_t>> instances_;
  // The transfer each step waits for (forward, backward).
  std::vector<OpId> input_;
  std::vector<OpId> deps_;
  std::optional<PipeStep> pending_;  // a pair's first step, until its second
  MergeScratch merge_;
  std::vector<uint8_t> order_;
  absl::Status error_;
};

}  // namespace

absl::Status BuildPipelineProgram(const Layout& l, std::span<const OpGraph* const> chunks,
                                  const PipelineLinks& links, OpGraph* out) {
  const int p = l.pp, v = l.Chunks(), m = l.ChunkMicrobatches();
  if (p < 1 || m < 1 || static_cast<int>(chunks.size()) != p * v) {
    return absl::InvalidArgumentError(
        Cat("pipeline program: needs pp * virtual_stages chunk graphs (got ", chunks.size(),
            " for pp=", p, ", virtual_stages=", v, ", microbatches=", m, ")"));
  }
  if (l.recompute) {
    return absl::InvalidArgumentError(
        "layout.recompute: programs with full activation recomputation are not built yet");
  }
  if (l.recompute_modules != 0) {
    return absl::InvalidArgumentError(
        "layout.recompute_modules: programs with selective recomputation are not built yet");
  }
  if (int64_t{p} * v * m * 2 > kMaxPipelineSteps) return CheckPipelineSteps(l);
  std::vector<ChunkShape> shapes(chunks.size());
  int64_t total = 0;
  for (size_t k = 0; k < chunks.size(); ++k) {
    MOEPLAN_RETURN_IF_ERROR(ShapeOf(*chunks[k], l.zero_stage, &shapes[k]));
    total += int64_t{chunks[k]->size()} * m;
  }
  if (total > kMaxProgramOps) {
    return absl::ResourceExhaustedError(Cat("pipeline program: ", total,
                                            " ops exceed the limit of ", kMaxProgramOps,
                                            "; use fewer micro-batches or blocks"));
  }
  out->Clear();
  out->Reserve(static_cast<int>(total + 4 * int64_t{p} * v * m), static_cast<int>(total * 3));
  ProgramBuilder builder(l, chunks, shapes, links, out);
  MOEPLAN_RETURN_IF_ERROR(WalkPipeline(
      l.pipeline, p, v, l.microbatches, [&](int s, const PipeStep& st) { builder.Step(s, st); },
      l.a2a_overlap));
  builder.Tails();
  MOEPLAN_RETURN_IF_ERROR(builder.error());
  for (const OpGraph* g : chunks) {
    for (const BufAlias& a : g->aliases()) out->Alias(a);
  }
  return absl::OkStatus();
}

bool RunsOnStage(const OpGraph& program, OpId id, int stage) {
  if (program.op(id).device == stage) return true;
  const OpExec& x = program.exec(id);
  return x.kind == ExecKind::kSendRecv && x.parts == stage;
}

}  // namespace moeplan::planner
