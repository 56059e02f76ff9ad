// One whole graph of the model planner (model_planner_internal.h): forward
// ranges and backward, dW placement, gradient buckets and the optimizer
// step, simulated; and the lower bounds the layout search prunes with.
#include <algorithm>
#include <array>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/hash/hash.h"
#include "model_planner_internal.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"

namespace moeplan::planner {

using internal::B;
using internal::DenseColl;
using internal::DenseMemory;
using internal::Deps;
using internal::F;
using internal::kJoin;
using internal::NameWithoutPart;
using internal::Param;
using internal::Range;
using internal::Slot;

// The forward split per `ranges` into `g` (each range's first and last op
// recorded); returns what the backward starts after: the loss (or last
// block), joined when it ends in k pieces.
Deps ModelPlanner::Impl::EmitForward(const std::vector<Range>& ranges, OpGraph* g) {
  range_first.clear();
  range_last.clear();
  for (const Range& r : ranges) {
    range_first.push_back(g->size());
    EmitRange(r.begin, r.end, r.k, g, false);
    range_last.push_back(g->size() - 1);
  }
  const size_t last = units.size() - 1;
  const size_t first_piece = static_cast<size_t>(piece_begin[last]);
  if (piece_k[last] == 1 && piece_out[first_piece][1] == kNoOp) return {piece_out[first_piece][0]};
  dep_buf.clear();
  for (int p = 0; p < piece_k[last]; ++p) {
    const auto& o = piece_out[first_piece + static_cast<size_t>(p)];
    dep_buf.push_back(o[0]);
    dep_buf.push_back(o[1]);
  }
  Op join;
  join.base = "fwd.join";
  join.term = Term::kDense;
  return {g->Add(join, dep_buf, kJoin)};
}

absl::StatusOr<double> ModelPlanner::Impl::ForwardEnd(const std::vector<Range>& ranges) {
  // Simulated without building the graph (SimulateUnits); the final join
  // (no cost, after ops that all end by the forward's end) changes nothing.
  ResetPieces();
  piece_end.clear();
  unit_makespan.clear();
  UnitSim sim;
  bool ok = true;
  for (const Range& r : ranges) {
    ok = ok && SimulateUnits(r.begin, r.end, r.k, /*standalone=*/false, &sim);
  }
  if (ok) return sim.forward_end;
  forward_graph.Clear();
  ResetPieces();
  EmitForward(ranges, &forward_graph);
  MOEPLAN_RETURN_IF_ERROR(simulator.Schedule(forward_graph, &sim0));
  return sim0.forward_end_us;
}

double ModelPlanner::Impl::ForwardBusy(const std::vector<Range>& ranges) {
  double busy[kNumResources] = {0.0, 0.0, 0.0};
  for (const Range& r : ranges) {
    for (int u = r.begin; u < r.end; ++u) {
      const OpGraph& t = UnitTemplate(units[static_cast<size_t>(u)], r.k).graph;
      for (OpId id = 0; id < t.size(); ++id) {
        const Op& op = t.op(id);
        for (int res = 0; res < kNumResources; ++res) {
          if (op.resources & (1u << res)) busy[res] += r.k * op.cost_us;
        }
      }
    }
  }
  return *std::max_element(busy, busy + kNumResources);
}

// Lancet's dW placement on g0 (its backward from `bwd_begin`): each slot's
// AlltoAll time from g0 simulated, dW ops best-fit into the slots they are
// independent of, into picks_ (per slot).
absl::Status ModelPlanner::Impl::PlaceDw(const Reachability& reach, OpId shift) {
  MOEPLAN_RETURN_IF_ERROR(simulator.Schedule(g0, &sim0, 0, /*bindings=*/false));
  std::vector<double>& slot_us = slot_us_;
  std::vector<double>& dw_us = dw_us_;
  for (const Slot& s : slots) {
    slot_us.push_back(sim0.times[static_cast<size_t>(s.last)].end_us -
                      sim0.times[static_cast<size_t>(s.first)].start_us);
  }
  for (OpId d : dw_ops) dw_us.push_back(g0.op(d).cost_us);
  // A dW op issued before a slot is independent of it when it reaches none
  // of its ops (no path runs from a later op to an earlier one): the dW ops
  // reaching each slot, once.
  slot_reached_.resize(slots.size());
  for (size_t s = 0; s < slots.size(); ++s) reach.Reaching(slots[s].ops, shift, &slot_reached_[s]);
  picks_ = BestFitDw(slot_us, dw_us, [&](int s, int d) {
    const OpId dw = dw_ops[static_cast<size_t>(d)];
    const Slot& slot = slots[static_cast<size_t>(s)];
    if (dw >= slot.first) return false;  // only delayed, never hoisted
    return !reach.Reaches(slot_reached_[static_cast<size_t>(s)], dw - shift);
  });
  return absl::OkStatus();
}

void ModelPlanner::Impl::Describe(const std::vector<Range>& ranges, Built* built) const {
  built->partitions.clear();
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (ranges[i].k == 1) continue;
    built->partitions.push_back({NameWithoutPart(described_->op(range_first[i])),
                                 NameWithoutPart(described_->op(range_last[i])), ranges[i].k,
                                 ranges[i].us});
  }
  built->dw.clear();
  for (size_t s = 0; s < picks_.size(); ++s) {
    DwPlacement pl;
    pl.alltoall = Cat("b", slots[s].block, ".moe.", slots[s].site);
    pl.alltoall_us = slot_us_[s];
    for (int d : picks_[s]) {
      pl.dw_ops.push_back(described_->op(dw_ops[static_cast<size_t>(d)]).Name());
      pl.dw_us += dw_us_[static_cast<size_t>(d)];
    }
    built->dw.push_back(std::move(pl));
  }
}

// Issue order: natural, with placed dW ops moved right after their AlltoAll.
std::vector<OpId> ModelPlanner::Impl::IssueOrder(const std::vector<std::vector<int>>& picks) {
  std::vector<OpId> order;
  order.reserve(static_cast<size_t>(g0.size()));
  // after_[v]: the dW ops issued right after v (a list through after_next_,
  // in pick order); moved_: those ops' own places, skipped.
  after_first_.assign(static_cast<size_t>(g0.size()), -1);
  after_last_.assign(static_cast<size_t>(g0.size()), -1);
  moved_.assign(static_cast<size_t>(g0.size()), 0);
  after_op_.clear();
  after_next_.clear();
  for (size_t s = 0; s < picks.size(); ++s) {
    const size_t at = static_cast<size_t>(slots[s].last);
    for (int d : picks[s]) {
      const OpId dw = dw_ops[static_cast<size_t>(d)];
      moved_[static_cast<size_t>(dw)] = 1;
      const int node = static_cast<int>(after_op_.size());
      after_op_.push_back(dw);
      after_next_.push_back(-1);
      if (after_last_[at] < 0) {
        after_first_[at] = node;
      } else {
        after_next_[static_cast<size_t>(after_last_[at])] = node;
      }
      after_last_[at] = node;
    }
  }
  for (OpId v = 0; v < g0.size(); ++v) {
    if (!moved_[static_cast<size_t>(v)]) order.push_back(v);
    for (int n = after_first_[static_cast<size_t>(v)]; n >= 0;
         n = after_next_[static_cast<size_t>(n)]) {
      order.push_back(after_op_[static_cast<size_t>(n)]);
    }
  }
  return order;
}

// Builds forward (split per `ranges`) + backward into g0, places dW ops when
// `schedule_dw`, then writes the issue order with gradient buckets and the
// optimizer into final_graph and simulates it.
absl::Status ModelPlanner::Impl::Evaluate(const std::vector<Range>& ranges, bool schedule_dw,
                                          Built* built, bool bindings) {
  g0.Clear();
  params.clear();
  slots.clear();
  dw_ops.clear();
  ResetPieces();
  slot_us_.clear();
  dw_us_.clear();
  picks_.clear();
  const Deps x = EmitForward(ranges, &g0);
  const OpId bwd_begin = g0.size();
  if (!schedule_dw && x.b == kNoOp) {
    // Issued in the natural order: the graph Finalize would copy g0 into,
    // built in place.
    const internal::BackwardOps& t = BackwardTemplate(false);
    if (!t.forward_param) {
      CopyBackwardWithBuckets(x, t);
      std::swap(g0, final_graph);
      described_ = &final_graph;  // g0's ops, at their ids
      FinishFinal();
      if (built != nullptr) Describe(ranges, built);
      return simulator.Schedule(final_graph, &final_sim, 0, bindings);
    }
  }
  internal::BackwardOps* bwd = CopyBackward(x, schedule_dw);
  if (schedule_dw && !slots.empty() && !dw_ops.empty()) {
    if (bwd == nullptr) {
      reach_of = {-1, -1};
      reach.Compute(g0, bwd_begin, dw_ops);
      MOEPLAN_RETURN_IF_ERROR(PlaceDw(reach, 0));
    } else {
      // The template's ops from 1 are g0's from bwd_begin: its reachability
      // serves every graph it is copied into (dw, then lancet).
      const int64_t which = bwd == &bwd_ops[1] ? 1 : 0;
      if (reach_of[0] != which || reach_of[1] != bwd->build) {
        reach.Compute(bwd->graph, 1, bwd->dw_ops);
      }
      reach_of = {which, bwd->build};
      MOEPLAN_RETURN_IF_ERROR(PlaceDw(reach, bwd_begin - 1));
    }
  }
  described_ = &g0;
  if (built != nullptr) Describe(ranges, built);
  MOEPLAN_RETURN_IF_ERROR(Finalize(IssueOrder(picks_)));
  // The schedule alone: VariantSearch completes (Simulator::Details) the one it keeps.
  return simulator.Schedule(final_graph, &final_sim, 0, bindings);
}

// A lower bound on any variant's forward and backward of this schedule and
// algorithm (docs/layouts.md "Search"): each resource runs its ops one at a
// time, so a phase lasts at least the busiest resource's sum of that
// phase's ops. Every forward op ends by the forward's end and every
// backward op descends from the loss; gradient buckets and ZeRO-3 gathers
// (prefetched, depending on nothing) are left out. Ops are unsplit: with
// alpha-beta costs and GEMM efficiency that does not fall with size, k
// pieces never cost less than the whole.
//
// `chain` bounds the backward by its dependencies too: every variant's
// backward is this pair's (CopyBackward: the same graph after any forward,
// whose last op all of it descends from, so it starts on free resources when
// the forward ends), with its dW ops in autograd's order or delayed (dW
// placement keeps the other ops' order). The simulator's times are a max-plus
// recursion over dependencies and each resource's previous op, so they only
// fall when an op becomes a pass-through (no cost, no resource, its
// dependencies kept): with the dW ops, gradient buckets and ZeRO-3 gathers
// passed through, the backward left is the same whatever the variant, and its
// simulated length is at most any variant's backward.
absl::Status ModelPlanner::Impl::PhaseBound(double (&busy)[2][kNumResources], double* chain) {
  // The sums in the order the whole graph issues its ops (the forward's
  // units, then the backward), read from the ops' templates: the forward
  // unsplit is each unit's template once (ZeRO-3's gathers, prefetched, are
  // not in them), the backward is the pair's template after its stand-in.
  for (auto& phase : busy) std::fill(std::begin(phase), std::end(phase), 0.0);
  auto add = [&](const Op& op) {
    if (op.flags & (kGradSync | kPrefetch)) return;
    for (int r = 0; r < kNumResources; ++r) {
      if (op.resources & (1u << r)) busy[op.phase == F ? 0 : 1][r] += op.cost_us;
    }
  };
  for (const internal::Unit& u : units) {
    const OpGraph& t = UnitTemplate(u, 1).graph;
    for (OpId id = 0; id < t.size(); ++id) add(t.op(id));
  }
  const internal::BackwardOps& bwd = BackwardTemplate(false);
  for (OpId id = 1; id < bwd.graph.size(); ++id) add(bwd.graph.op(id));
  // SyncBound reads the parameters the backward completes.
  params = bwd.params;
  if (chain == nullptr) return absl::OkStatus();
  // The backward alone: the forward stands as one op at time 0.
  MOEPLAN_RETURN_IF_ERROR(
      simulator.Schedule(bwd.graph, &sim0, kWeightGrad | kGradSync | kPrefetch, false));
  *chain = sim0.makespan_us;
  return absl::OkStatus();
}

uint64_t ModelPlanner::Impl::PairKey() const {
  return absl::HashOf(context_salt, first_block, end_block, st.embed, st.head, st.local_dispatch,
                      static_cast<uint8_t>(sched), static_cast<uint8_t>(algo));
}

absl::StatusOr<double> ModelPlanner::Impl::PairBound() {
  const uint64_t key = PairKey();
  if (auto it = pair_bounds.find(key); it != pair_bounds.end()) return it->second;
  double busy[2][kNumResources];
  double chain = 0.0;
  MOEPLAN_RETURN_IF_ERROR(PhaseBound(busy, &chain));
  const double bound = PairBoundOf(busy, chain);
  pair_bounds.emplace(key, bound);
  return bound;
}

// The gathers ZeroGather adds to each block's forward and backward (the
// blocks of the kLn1 units: EmitRange gathers before each, the backward
// before each block it walks) under ZeRO 3, summed per phase and resource.
void ModelPlanner::Impl::GatherBound(double (&busy)[2][kNumResources]) {
  for (auto& phase : busy) std::fill(std::begin(phase), std::end(phase), 0.0);
  const int zero = st.zero_stage;
  st.zero_stage = 3;
  for (const Unit& u : units) {
    if (u.kind != internal::UnitKind::kLn1) continue;
    for (Phase ph : {F, B}) {
      scratch.Clear();
      ZeroGather(&scratch, u.block, ph);
      for (OpId id = 0; id < scratch.size(); ++id) {
        const Op& op = scratch.op(id);
        for (int r = 0; r < kNumResources; ++r) {
          if (op.resources & (1u << r)) busy[ph == F ? 0 : 1][r] += op.cost_us;
        }
      }
    }
  }
  st.zero_stage = zero;
}

// What Finalize's buckets cost at least, per resource, by ZeRO class (0;
// 1-2; 3): with alpha-beta costs the buckets of a group cost no less than
// one collective of all of them. ZeRO 1-2 add the parameter AllGather after
// the step; ZeRO-3's per-block gathers are left out. Reads `params` (g0's).
void ModelPlanner::Impl::SyncBound(std::array<std::array<double, kNumResources>, 3>* out) const {
  double bytes[2] = {0.0, 0.0};  // dense, expert
  for (const Param& p : params) bytes[p.expert ? 1 : 0] += p.bytes;
  for (int z = 0; z < 3; ++z) {
    auto& a = (*out)[static_cast<size_t>(z)];
    a.fill(0.0);
    for (int grp = 0; grp < 2; ++grp) {
      const GroupShape shape = grp ? edp_shape : dp_shape;
      if (shape.ranks <= 1 || bytes[grp] <= 0.0) continue;
      const double shard = bytes[grp] / shape.ranks;
      const ResourceMask mask = internal::ResourcesOf(shape);
      // One collective of every bucket's bytes, corrected in context like
      // each bucket's (offset + scale x: below the sum over the buckets).
      const bool e = grp == 1;
      double us =
          z == 0
              ? cost.InContextUs(e ? "bwd.expert_grad_allreduce" : "bwd.grad_allreduce", mask,
                                 cost.CollectiveUs(Collective::kAllReduce, shape, bytes[grp]))
              : cost.InContextUs(e ? "bwd.expert_grad_reducescatter" : "bwd.grad_reducescatter",
                                 mask, cost.CollectiveUs(Collective::kReduceScatter, shape, shard));
      if (z == 1) {
        us += cost.InContextUs(e ? "optimizer.expert_param_allgather" : "optimizer.param_allgather",
                               mask, cost.CollectiveUs(Collective::kAllGather, shape, shard));
      }
      for (int r = 0; r < kNumResources; ++r) {
        if (mask & (1u << r)) a[static_cast<size_t>(r)] += us;
      }
    }
  }
}

namespace {

// The buckets of `bucket_bytes` per group, in the order gradients are
// produced (reverse layer order), and each parameter's bucket (reusing the
// vectors' storage).
void MakeBuckets(const std::vector<internal::Param>& params, int64_t bucket_bytes,
                 std::vector<internal::Bucket>* buckets, std::vector<int>* bucket_of) {
  size_t n = 0;
  bucket_of->assign(params.size(), 0);
  int open[2] = {-1, -1};
  int count[2] = {0, 0};
  for (size_t i = 0; i < params.size(); ++i) {
    const int grp = params[i].expert ? 1 : 0;
    if (open[grp] < 0 ||
        (*buckets)[static_cast<size_t>(open[grp])].bytes >= static_cast<double>(bucket_bytes)) {
      if (n == buckets->size()) buckets->emplace_back();
      internal::Bucket& bk = (*buckets)[n];
      bk.bytes = 0.0;
      bk.left = 0;
      bk.expert = params[i].expert;
      bk.index = count[grp]++;
      bk.deps.clear();
      open[grp] = static_cast<int>(n++);
    }
    (*bucket_of)[i] = open[grp];
    (*buckets)[static_cast<size_t>(open[grp])].bytes += params[i].bytes;
    (*buckets)[static_cast<size_t>(open[grp])].left += 1;
  }
  buckets->resize(n);
}

// A bucket's collective `c` over its group: the op (costed in context) and
// what it computes.
std::pair<Op, OpExec> SyncOp(const ModelPlanner::Impl& s, const internal::Bucket& bk,
                             std::string_view base, Collective c) {
  const GroupShape shape = bk.expert ? s.edp_shape : s.dp_shape;
  // AllReduce: n is the bucket; ReduceScatter / AllGather: a rank's shard.
  // The gathers move parameters (1 byte each with fp8_param_gather).
  const double scale =
      c == Collective::kAllGather ? s.ParamGatherBytes() / s.m->bytes_per_element : 1.0;
  const double n = (c == Collective::kAllReduce ? bk.bytes : bk.bytes / shape.ranks) * scale;
  Op op;
  op.base = base;
  op.kind = OpKind::kComm;
  op.phase = B;
  op.flags = kGradSync;
  op.term = internal::TermOf(c);
  op.resources = internal::ResourcesOf(shape);
  op.cost_us = s.cost.InContextUs(base, op.resources, s.cost.CollectiveUs(c, shape, n));
  op.bytes = internal::Bytes(n);
  op.inter_node_bytes = internal::Bytes(internal::InterNodeBytes(c, shape, n));
  op.step = bk.index;
  const ExecKind kind = c == Collective::kAllReduce       ? ExecKind::kAllReduce
                        : c == Collective::kReduceScatter ? ExecKind::kReduceScatter
                                                          : ExecKind::kAllGather;
  return {op,
          DenseColl(kind, bk.expert ? ExecGroup::kEdp : ExecGroup::kDp, n, s.m->bytes_per_element)};
}

// Op `id` produced one of `bk`'s gradients; the last one issues the
// bucket's collective into `g` (AllReduce; ZeRO >= 1: ReduceScatter), unless
// its group has one rank.
void FeedBucket(const ModelPlanner::Impl& s, internal::Bucket* bk, OpId id, bool sharded,
                OpGraph* g) {
  bk->deps.push_back(id);
  if (--bk->left > 0) return;
  if ((bk->expert ? s.edp_shape : s.dp_shape).ranks <= 1) return;
  const auto [op, exec] =
      sharded
          ? SyncOp(s, *bk, bk->expert ? "bwd.expert_grad_reducescatter" : "bwd.grad_reducescatter",
                   Collective::kReduceScatter)
          : SyncOp(s, *bk, bk->expert ? "bwd.expert_grad_allreduce" : "bwd.grad_allreduce",
                   Collective::kAllReduce);
  g->Add(op, bk->deps, exec);
}

}  // namespace

// Copies g0 in `order` into final_graph, issuing each DDP bucket's
// collective as soon as its last gradient is issued (AllReduce; ZeRO >= 1:
// ReduceScatter), dense parameters over the DP group and expert ones over
// their replicas, then the optimizer step after every op nothing else waits
// for (ZeRO 1-2: then the updated parameters are AllGathered per bucket).
absl::Status ModelPlanner::Impl::Finalize(const std::vector<OpId>& order) {
  final_graph.Clear();
  final_graph.Reserve(g0.size() + 64, g0.size() * 2);
  final_graph.CopyTables(g0);
  std::vector<internal::Bucket>& buckets = buckets_;
  MakeBuckets(params, opt.bucket_bytes, &buckets, &bucket_of_);
  // Each op's parameters, in order: a list through param_next_ from param_first_.
  param_first_.assign(static_cast<size_t>(g0.size()), -1);
  param_next_.assign(params.size(), -1);
  for (size_t i = params.size(); i-- > 0;) {
    const OpId p = params[i].producer;
    if (p < 0 || p >= g0.size()) continue;
    param_next_[i] = param_first_[static_cast<size_t>(p)];
    param_first_[static_cast<size_t>(p)] = static_cast<int>(i);
  }
  const bool sharded = st.zero_stage >= 1;
  std::vector<OpId>& new_id = new_id_;
  new_id.assign(static_cast<size_t>(g0.size()), kNoOp);
  for (OpId v : order) {
    dep_buf.clear();
    for (OpId d : g0.deps(v)) {
      if (new_id[static_cast<size_t>(d)] == kNoOp) {
        return absl::InternalError(Cat("model graph: ", g0.op(v).Name(),
                                       " issued before its dependency ", g0.op(d).Name()));
      }
      dep_buf.push_back(new_id[static_cast<size_t>(d)]);
    }
    const OpId id = final_graph.Add(g0.op(v), dep_buf, g0.exec(v));
    new_id[static_cast<size_t>(v)] = id;
    for (int pi = param_first_[static_cast<size_t>(v)]; pi >= 0;
         pi = param_next_[static_cast<size_t>(pi)]) {
      FeedBucket(*this, &buckets[static_cast<size_t>(bucket_of_[static_cast<size_t>(pi)])], id,
                 sharded, &final_graph);
    }
  }
  FinishFinal();
  return absl::OkStatus();
}

void ModelPlanner::Impl::FinishFinal() {
  const OpId step_id = AddOptimizerStep(st.zero_stage >= 1);
  if (st.zero_stage == 1 || st.zero_stage == 2) {
    for (const internal::Bucket& bk : buckets_) {
      if ((bk.expert ? edp_shape : dp_shape).ranks <= 1) continue;
      const auto [op, exec] = SyncOp(
          *this, bk, bk.expert ? "optimizer.expert_param_allgather" : "optimizer.param_allgather",
          Collective::kAllGather);
      final_graph.Add(op, {step_id}, exec);
    }
  }
}

// Finalize's loop over g0's ops in the natural order, the forward's taken
// as they are (no parameter is the forward's) and the backward's copied
// from the template.
void ModelPlanner::Impl::CopyBackwardWithBuckets(Deps x, const internal::BackwardOps& t) {
  const OpGraph& tg = t.graph;
  std::vector<internal::Bucket>& buckets = buckets_;
  MakeBuckets(t.params, opt.bucket_bytes, &buckets, &bucket_of_);
  const bool sharded = st.zero_stage >= 1;
  layer_map.assign(1, 0);
  for (const ExecLayer& l : tg.layers()) layer_map.push_back(g0.AddLayer(l));
  for (const BufAlias& a : tg.aliases()) g0.Alias(a);
  new_id_.assign(static_cast<size_t>(tg.size()), kNoOp);
  new_id_[0] = x.a;
  g0.Reserve(g0.size() + tg.size() + 64, 0);
  for (OpId v = 1; v < tg.size(); ++v) {
    dep_buf.clear();
    for (OpId d : tg.deps(v)) dep_buf.push_back(new_id_[static_cast<size_t>(d)]);
    OpExec exec = tg.exec(v);
    exec.layer = layer_map[static_cast<size_t>(exec.layer)];
    const OpId id = g0.Add(tg.op(v), dep_buf, exec);
    new_id_[static_cast<size_t>(v)] = id;
    for (int pi = t.param_first[static_cast<size_t>(v)]; pi >= 0;
         pi = t.param_next[static_cast<size_t>(pi)]) {
      FeedBucket(*this, &buckets[static_cast<size_t>(bucket_of_[static_cast<size_t>(pi)])], id,
                 sharded, &g0);
    }
  }
}

// The optimizer waits for every sink of final_graph (gradients, buckets, side branches).
OpId ModelPlanner::Impl::AddOptimizerStep(bool sharded) {
  std::vector<uint8_t>& consumed = consumed_;
  consumed.assign(static_cast<size_t>(final_graph.size()), 0);
  for (OpId v = 0; v < final_graph.size(); ++v) {
    for (OpId d : final_graph.deps(v)) consumed[static_cast<size_t>(d)] = 1;
  }
  dep_buf.clear();
  for (OpId v = 0; v < final_graph.size(); ++v) {
    if (!consumed[static_cast<size_t>(v)]) dep_buf.push_back(v);
  }
  Op step;
  step.base = "optimizer.step";
  step.phase = B;
  step.term = Term::kOptimizer;
  step.cost_us = OptimizerStepUs(sharded, &step.bytes);
  return final_graph.Add(step, dep_buf,
                         DenseMemory(static_cast<double>(step.bytes), m->bytes_per_element));
}

// The optimizer step: each rank updates its shard (`sharded`: ZeRO >= 1
// divides the states by the group), reading and writing fp32 states and the weights.
double ModelPlanner::Impl::OptimizerStepUs(bool sharded, int64_t* bytes_out) const {
  const double shard = sharded ? static_cast<double>(DenseParamsPerRank()) / dp_shape.ranks +
                                     static_cast<double>(ExpertParamsPerRank()) / edp_shape.ranks
                               : static_cast<double>(ParamsPerRank());
  const double bytes = shard * (24.0 + 2.0 * m->bytes_per_element);
  if (bytes_out != nullptr) *bytes_out = internal::Bytes(bytes);
  return cost.InContextUs("optimizer.step", kCompute, cost.MemoryBoundUs(bytes));
}

StageOptions ModelPlanner::Impl::Stage() const {
  StageOptions o = st;
  o.first_block = first_block;
  o.end_block = end_block;
  return o;
}

int64_t ModelPlanner::Impl::DenseParamsPerRank() const {
  return static_cast<int64_t>(StageParams(*m, Stage()).dense);
}

int64_t ModelPlanner::Impl::ExpertParamsPerRank() const {
  return static_cast<int64_t>(StageParams(*m, Stage()).expert);
}

}  // namespace moeplan::planner
