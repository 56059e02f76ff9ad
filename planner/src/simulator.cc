#include "moeplan/planner/simulator.h"

#include <algorithm>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"

namespace moeplan::planner {
namespace {

constexpr int kComputeIndex = 0;
static_assert(kNumResources == 3, "the resource steps below are unrolled");

// An op holding `held` starts no earlier than each of them frees; with
// bindings, the first later one in index order binds it. Unrolled.
template <bool kBindings, unsigned kR>
inline void WaitFor(unsigned held, const double* free_at, const OpId* last_on, double* start,
                    OpId* binding) {
  if (!(held & (1u << kR))) return;
  if constexpr (kBindings) {
    if (free_at[kR] > *start) {
      *start = free_at[kR];
      *binding = last_on[kR];
    }
  } else {
    *start = std::max(*start, free_at[kR]);
  }
}
template <bool kBindings>
inline void WaitForResources(unsigned held, const double* free_at, const OpId* last_on,
                             double* start, OpId* binding) {
  WaitFor<kBindings, 0>(held, free_at, last_on, start, binding);
  WaitFor<kBindings, 1>(held, free_at, last_on, start, binding);
  WaitFor<kBindings, 2>(held, free_at, last_on, start, binding);
}

// The op `v` ending at `end` holds them until then.
template <bool kBindings>
inline void HoldResources(unsigned held, OpId v, double end, double* free_at, OpId* last_on) {
  for (unsigned r : {0u, 1u, 2u}) {
    if (!(held & (1u << r))) continue;
    free_at[r] = end;
    if constexpr (kBindings) last_on[r] = v;
  }
}

}  // namespace

absl::Status Simulator::Run(const OpGraph& graph, SimResult* r) {
  MOEPLAN_RETURN_IF_ERROR(Schedule(graph, r));
  Details(graph, r);
  return absl::OkStatus();
}

absl::Status Simulator::Schedule(const OpGraph& graph, SimResult* r, uint8_t pass_through,
                                 bool bindings) {
  return bindings ? ScheduleOps<true>(graph, r, pass_through)
                  : ScheduleOps<false>(graph, r, pass_through);
}

template <bool kBindings>
absl::Status Simulator::ScheduleOps(const OpGraph& graph, SimResult* r, uint8_t pass_through) {
  const int n = graph.size();
  r->times.resize(static_cast<size_t>(n));  // every entry is written below
  r->critical_path.clear();
  r->critical_term_us.fill(0.0);
  r->makespan_us = r->forward_end_us = 0.0;
  r->compute_busy_us = r->comm_busy_us = r->hidden_comm_us = r->exposed_comm_us = 0.0;
  r->inter_node_bytes = 0;

  free_at_.assign(kNumResources, 0.0);
  last_on_.assign(kNumResources, kNoOp);

  // Locals, not r's fields: the stores below cannot alias them.
  OpTime* const times = r->times.data();
  double forward_end = 0.0, makespan = 0.0;
  int64_t inter_node_bytes = 0;
  for (int v = 0; v < n; ++v) {
    const Op& op = graph.op(v);
    double start = 0.0;
    OpId binding = kNoOp;
    // Dependencies first, so that on ties the data dependency is reported as binding.
    for (const OpId u : graph.deps(v)) {
      if (static_cast<unsigned>(u) >= static_cast<unsigned>(v)) {  // u < 0 or u >= v
        return absl::InternalError(Cat("op graph: op ", v, " (", op.Name(), ") depends on op ", u,
                                       " issued after it; builders must add "
                                       "dependencies first"));
      }
      const double e = times[u].end_us;
      if constexpr (kBindings) {
        if (binding == kNoOp || e > start) {
          start = e;
          binding = u;
        }
      } else {
        start = std::max(start, e);  // ends are >= 0: the same start
      }
    }
    if (op.device < 0) {
      return absl::InternalError(
          Cat("op graph: op ", v, " (", op.Name(), ") has device ", op.device));
    }
    const size_t base = static_cast<size_t>(op.device) * kNumResources;
    if (base >= free_at_.size()) {
      free_at_.resize(base + kNumResources, 0.0);
      last_on_.resize(base + kNumResources, kNoOp);
    }
    double* free_at = free_at_.data() + base;
    OpId* last_on = last_on_.data() + base;
    const bool passes = (op.flags & pass_through) != 0;
    const unsigned held = passes ? 0u : op.resources;
    WaitForResources<kBindings>(held, free_at, last_on, &start, &binding);
    const double end = passes ? start : start + op.cost_us;
    times[v] = OpTime{start, end, binding, false};
    HoldResources<kBindings>(held, v, end, free_at, last_on);
    if (op.phase == Phase::kForward && end > forward_end) forward_end = end;
    inter_node_bytes += op.inter_node_bytes;
    if (v == 0 || end > makespan) makespan = end;
  }
  r->makespan_us = makespan;
  r->forward_end_us = forward_end;
  r->inter_node_bytes = inter_node_bytes;
  return absl::OkStatus();
}

void Simulator::Details(const OpGraph& graph, SimResult* r) {
  // The op that ends last (the first of equals), and each resource's busy
  // intervals on device 0 in issue order.
  for (auto& b : busy_) b.clear();
  OpId last_op = kNoOp;
  double makespan = 0.0;
  for (OpId v = 0; v < graph.size(); ++v) {
    const Op& op = graph.op(v);
    const OpTime& t = r->times[static_cast<size_t>(v)];
    for (int res = 0; res < kNumResources; ++res) {
      if ((op.resources & (1u << res)) && op.cost_us > 0.0 && op.device == 0) {
        busy_[res].push_back({t.start_us, t.end_us});
      }
    }
    if (last_op == kNoOp || t.end_us > makespan) {
      makespan = t.end_us;
      last_op = v;
    }
  }
  r->critical_path.clear();
  r->critical_term_us.fill(0.0);
  TraceCriticalPath(graph, last_op, r);
  SumOverlap(r);
}

// Critical path: follow binding predecessors back from the op that ends last.
// Each op on it starts exactly when its binding predecessor ends, so the path is
// gapless and its durations sum to the makespan.
void Simulator::TraceCriticalPath(const OpGraph& graph, OpId last_op, SimResult* r) {
  for (OpId v = last_op; v != kNoOp; v = r->times[v].binding) {
    r->times[v].critical = true;
    r->critical_path.push_back(v);
    r->critical_term_us[static_cast<int>(graph.op(v).term)] += graph.op(v).cost_us;
  }
  std::reverse(r->critical_path.begin(), r->critical_path.end());
}

// Busy intervals on one resource are disjoint and sorted by start (issue order).
// Comm busy time is the union of intra and inter; hidden is its overlap with compute.
void Simulator::SumOverlap(SimResult* r) {
  const auto& compute = busy_[kComputeIndex];
  const auto& intra = busy_[1];
  const auto& inter = busy_[2];
  comm_union_.clear();
  size_t a = 0, b = 0;
  while (a < intra.size() || b < inter.size()) {
    const Interval next =
        (b == inter.size() || (a < intra.size() && intra[a].begin <= inter[b].begin)) ? intra[a++]
                                                                                      : inter[b++];
    if (!comm_union_.empty() && next.begin <= comm_union_.back().end) {
      comm_union_.back().end = std::max(comm_union_.back().end, next.end);
    } else {
      comm_union_.push_back(next);
    }
  }
  r->compute_busy_us = 0.0;
  for (const Interval& c : compute) r->compute_busy_us += c.end - c.begin;
  r->comm_busy_us = 0.0;
  for (const Interval& c : comm_union_) r->comm_busy_us += c.end - c.begin;
  double hidden = 0.0;
  for (size_t i = 0, j = 0; i < comm_union_.size() && j < compute.size();) {
    const double lo = std::max(comm_union_[i].begin, compute[j].begin);
    const double hi = std::min(comm_union_[i].end, compute[j].end);
    if (hi > lo) hidden += hi - lo;
    if (comm_union_[i].end < compute[j].end) {
      ++i;
    } else {
      ++j;
    }
  }
  r->hidden_comm_us = hidden;
  r->exposed_comm_us = r->comm_busy_us - hidden;
}

}  // namespace moeplan::planner
