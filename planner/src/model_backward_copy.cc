// The whole model's backward copied after each forward from the template
// model_backward.cc emits (model_planner_internal.h), and the AlltoAll slots
// Lancet may place dW ops beside.
#include <string_view>
#include <utility>

#include "model_planner_internal.h"

namespace moeplan::planner {

using internal::Deps;
using internal::Site;
using internal::Slot;

// The backward of the current pair after forward op `x` (x.b kNoOp: what
// EmitForward returns), copied from a template built once per plan: the
// backward reads nothing of the forward but its last op, so it is the same
// graph after any forward, its ids shifted, x standing for the template's
// op 0, its layer instances and aliases added to g0 in the order it added
// them (AddLayer and Alias keep the first of equals, as emitting does).
// Returns the template (for its reachability), or null where x.b is set and
// the backward was emitted. Templates keep their storage from plan to plan.
internal::BackwardOps* ModelPlanner::Impl::CopyBackward(Deps x, bool detach) {
  if (x.b != kNoOp) {
    EmitBackward(x, detach);
    return nullptr;
  }
  internal::BackwardOps& t = BackwardTemplate(detach);
  const OpGraph& tg = t.graph;
  const OpId shift = g0.size() - 1;  // template op i is g0's op i + shift
  auto id = [&](OpId v) { return v == 0 ? x.a : v == kNoOp ? kNoOp : v + shift; };
  layer_map.assign(1, 0);
  for (const ExecLayer& l : tg.layers()) layer_map.push_back(g0.AddLayer(l));
  for (const BufAlias& a : tg.aliases()) g0.Alias(a);
  for (OpId v = 1; v < tg.size(); ++v) {
    dep_buf.clear();
    for (OpId d : tg.deps(v)) dep_buf.push_back(id(d));
    OpExec exec = tg.exec(v);
    exec.layer = layer_map[static_cast<size_t>(exec.layer)];
    g0.Add(tg.op(v), dep_buf, exec);
  }
  for (internal::Param p : t.params) {
    p.producer = id(p.producer);
    params.push_back(p);
  }
  slots.resize(t.slots.size());
  for (size_t i = 0; i < t.slots.size(); ++i) {
    const Slot& from = t.slots[i];
    Slot& to = slots[i];
    to.block = from.block;
    to.site = from.site;
    to.first = id(from.first);
    to.last = id(from.last);
    to.ops.clear();
    for (OpId o : from.ops) to.ops.push_back(id(o));
  }
  for (OpId d : t.dw_ops) dw_ops.push_back(id(d));
  return &t;
}

void ModelPlanner::Impl::RecordSlots(OpId begin, int blk) {
  for (OpId id = begin; id < g0.size(); ++id) {
    const Op& op = g0.op(id);
    if (op.kind != OpKind::kComm || op.term != Term::kAllToAll) continue;
    const std::string_view site = Site(op.base);
    if (!slots.empty() && slots.back().first >= begin &&
        Site(g0.op(slots.back().first).base) == site) {
      slots.back().ops.push_back(id);
      slots.back().last = id;
      continue;
    }
    Slot s;
    s.block = blk;
    s.site = site;
    s.first = s.last = id;
    s.ops.push_back(id);
    slots.push_back(std::move(s));
  }
}

}  // namespace moeplan::planner
