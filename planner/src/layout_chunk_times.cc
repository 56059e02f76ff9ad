// A planned chunk's times (layout_planner_internal.h): its forward,
// backward and tail read from its simulated graph, its recomputation
// modules' forward times, and its overlapped forward-backward pairs'
// times (docs/layouts.md "Recomputation", "Overlapping micro-batches").
#include <algorithm>
#include <memory>
#include <string_view>

#include "layout_internal.h"
#include "layout_planner_internal.h"
#include "moeplan/base/status.h"
#include "moeplan/planner/layout_memory.h"
#include "moeplan/planner/pair_overlap.h"

namespace moeplan::planner {

using internal::ChunkTimes;

namespace {

// The forward compute ops of each recomputation module, by name (the
// experts' activation is inside fwd.expert: timed apart below).
struct ModuleOp {
  std::string_view base;
  int module;
};
constexpr ModuleOp kModuleOps[] = {
    {"fwd.flash_attn", 0}, {"fwd.attn_score", 0},  {"fwd.softmax", 0},    {"fwd.attn_ctx", 0},
    {"fwd.ln1", 1},        {"fwd.ln2", 1},         {"fwd.fc1", 2},        {"fwd.gelu", 2},
    {"fwd.swiglu", 2},     {"fwd.fc2", 2},         {"fwd.shared_fc1", 4}, {"fwd.shared_act", 4},
    {"fwd.shared_fc2", 4}, {"fwd.shared_gate", 4}, {"fwd.q_up", 5},       {"fwd.kv_up", 5},
};

}  // namespace

void LayoutPlanner::Impl::ModuleTimes(const ModelConfig& m, const Layout& l, const StageOptions& so,
                                      const OpGraph& g, ChunkTimes* t) const {
  t->module_fwd.fill(0.0);
  for (OpId id = 0; id < g.size(); ++id) {
    const Op& op = g.op(id);
    if (op.phase != Phase::kForward || op.kind != OpKind::kCompute) continue;
    for (const ModuleOp& mo : kModuleOps) {
      if (op.base == mo.base) {
        t->module_fwd[static_cast<size_t>(mo.module)] += op.cost_us;
        break;
      }
    }
  }
  // moe_act: the activation over the rows a rank's experts hold, per MoE
  // block (the MTP depths' with the head).
  int moe_blocks = 0;
  for (int blk = so.first_block; blk < so.end_block; ++blk) moe_blocks += m.IsMoeBlock(blk);
  if (so.head && m.vocab_size > 0 && m.mtp_num_layers > 0 && m.IsMoeBlock(m.num_layers)) {
    moe_blocks += m.mtp_num_layers;
  }
  if (moe_blocks > 0) {
    const double rows = ExpertRows(m, l, static_cast<double>(m.micro_batch_size) * m.seq_length);
    const double act =
        rows * static_cast<double>(m.moe.expert_ffn_hidden_size) / l.esp * m.bytes_per_element;
    t->module_fwd[3] =
        moe_blocks * cost.ActivationUs((1.0 + m.FfnInputFactor()) * act, /*backward=*/false);
  }
}

// A planned chunk's times (layout_planner_internal.h). The chunk's graph is
// one micro-batch with its gradient synchronisation and optimizer step.
// ZeRO 0-1 synchronise once per iteration, overlapping the last
// micro-batch's backward: every micro-batch's backward is the graph's with
// the buckets, optimizer and parameter gathers passed through (no cost, no
// resource, dependencies kept), and the last one's extra time to the graph's
// end is the tail. ZeRO 2-3 reduce-scatter every micro-batch's gradients: the
// buckets end each backward.
absl::StatusOr<ChunkTimes> LayoutPlanner::Impl::Times(const VariantPlan& vp, bool sync_in_backward,
                                                      bool phases) {
  ChunkTimes t;
  t.variant = vp.variant;
  t.schedule = vp.schedule;
  t.algo = vp.algo;
  const OpGraph& g = vp.graph;
  const SimResult& r = vp.sim;
  auto synchronises = [&](const Op& op) {
    return op.term == Term::kOptimizer || (op.flags & kGradSync) != 0;
  };
  // The backward without the synchronisation: its end, and the graph its
  // critical path is read from.
  const OpGraph* steps = &g;
  const SimResult* times = &r;
  double bwd_end = r.forward_end_us;
  if (sync_in_backward) {
    for (OpId id = 0; id < g.size(); ++id) {
      const Op& op = g.op(id);
      if (op.term == Term::kOptimizer) continue;
      // ZeRO 2-3: the gradients' ReduceScatters end the backward; the
      // parameter gathers after the step do not.
      if ((op.flags & kGradSync) && op.base.substr(0, 4) != "bwd.") continue;
      bwd_end = std::max(bwd_end, r.times[static_cast<size_t>(id)].end_us);
    }
  } else {
    quiet_graph.Clear();
    quiet_graph.CopyTables(g);
    for (OpId id = 0; id < g.size(); ++id) {
      Op op = g.op(id);
      if (synchronises(op)) {
        op.cost_us = 0.0;
        op.resources = 0;
      }
      quiet_graph.Add(op, g.deps(id), g.exec(id));
    }
    MOEPLAN_RETURN_IF_ERROR(pipe_sim.Run(quiet_graph, &quiet_sim));
    for (OpId id = 0; id < g.size(); ++id) {
      if (synchronises(g.op(id))) continue;
      bwd_end = std::max(bwd_end, quiet_sim.times[static_cast<size_t>(id)].end_us);
    }
    steps = &quiet_graph;
    times = &quiet_sim;
  }
  t.fwd = r.forward_end_us;
  t.bwd = bwd_end - t.fwd;
  t.tail = std::max(0.0, r.makespan_us - bwd_end);
  // ZeRO 1-2's gathers after the step: from its end to the graph's.
  for (OpId id = 0; id < g.size(); ++id) {
    if (g.op(id).term != Term::kOptimizer) continue;
    const double step_end = std::max(bwd_end, r.times[static_cast<size_t>(id)].end_us);
    t.gather = std::max(t.gather, r.makespan_us - step_end);
  }
  for (OpId id : times->critical_path) {
    const Op& op = steps->op(id);
    const double end = times->times[static_cast<size_t>(id)].end_us;
    if (end <= t.fwd + 1e-9) {
      t.fwd_terms[static_cast<size_t>(op.term)] += op.cost_us;
    } else if (end <= bwd_end + 1e-9 && (sync_in_backward || !synchronises(g.op(id)))) {
      t.bwd_terms[static_cast<size_t>(op.term)] += op.cost_us;
    }
  }
  // What the iteration adds after the backward, from the whole graph.
  for (OpId id : r.critical_path) {
    const Op& op = g.op(id);
    if (r.times[static_cast<size_t>(id)].end_us <= bwd_end + 1e-9 && !synchronises(op)) continue;
    if (op.term == Term::kOptimizer) {
      t.optimizer += op.cost_us;
    } else if (sync_in_backward ? r.times[static_cast<size_t>(id)].end_us > bwd_end + 1e-9
                                : synchronises(op)) {
      t.grad_sync += op.cost_us;
    }
  }
  if (phases) {
    // The backward's synchronisation leaves it as Times did: ZeRO 2-3 keep
    // their ReduceScatters, ZeRO 0-1 (the quiet graph) none.
    t.phases = std::make_shared<const ChunkPhases>(PhasesOf(*steps, *times, [&](const Op& op) {
      return sync_in_backward ? op.term == Term::kOptimizer ||
                                    ((op.flags & kGradSync) && op.base.substr(0, 4) != "bwd.")
                              : synchronises(op);
    }));
  }
  return t;
}

PairTime LayoutPlanner::Impl::PairUs(const ChunkPhases& f, const ChunkPhases& b, double f_us,
                                     double b_us, double recompute) {
  auto [it, fresh] = merged.try_emplace({&f, &b});
  if (fresh) it->second = MergedUs(f.fwd, b.bwd, &merge_scratch);
  PairTime t = it->second;
  t.fwd_end_us += recompute;
  t.bwd_end_us += recompute;
  t.total_us += recompute;
  if (t.total_us >= f_us + b_us) return {f_us, f_us + b_us, f_us + b_us};
  t.total_us = std::max(t.total_us, std::max(f_us, b_us));
  return t;
}

}  // namespace moeplan::planner
