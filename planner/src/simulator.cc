#include "moeplan/planner/simulator.h"

#include <algorithm>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"

namespace moeplan::planner {
namespace {

constexpr int kComputeIndex = 0;

}  // namespace

absl::Status Simulator::Run(const OpGraph& graph, SimResult* r) {
  MOEPLAN_RETURN_IF_ERROR(Schedule(graph, r));
  Details(graph, r);
  return absl::OkStatus();
}

absl::Status Simulator::Schedule(const OpGraph& graph, SimResult* r) {
  const int n = graph.size();
  r->times.resize(static_cast<size_t>(n));  // every entry is written below
  r->critical_path.clear();
  r->critical_term_us.fill(0.0);
  r->makespan_us = r->forward_end_us = 0.0;
  r->compute_busy_us = r->comm_busy_us = r->hidden_comm_us = r->exposed_comm_us = 0.0;
  r->inter_node_bytes = 0;

  free_at_.assign(kNumResources, 0.0);
  last_on_.assign(kNumResources, kNoOp);

  for (int v = 0; v < n; ++v) {
    const Op& op = graph.op(v);
    double start = 0.0;
    OpId binding = kNoOp;
    // Dependencies first, so that on ties the data dependency is reported as binding.
    for (const OpId u : graph.deps(v)) {
      if (u >= v || u < 0) {
        return absl::InternalError(Cat("op graph: op ", v, " (", op.Name(), ") depends on op ", u,
                                       " issued after it; builders must add "
                                       "dependencies first"));
      }
      if (binding == kNoOp || r->times[u].end_us > start) {
        start = r->times[u].end_us;
        binding = u;
      }
    }
    if (op.device < 0) {
      return absl::InternalError(Cat("op graph: op ", v, " (", op.Name(), ") has device ",
                                     op.device));
    }
    const size_t base = static_cast<size_t>(op.device) * kNumResources;
    if (base >= free_at_.size()) {
      free_at_.resize(base + kNumResources, 0.0);
      last_on_.resize(base + kNumResources, kNoOp);
    }
    double* free_at = free_at_.data() + base;
    OpId* last_on = last_on_.data() + base;
    for (int res = 0; res < kNumResources; ++res) {
      if ((op.resources & (1u << res)) && free_at[res] > start) {
        start = free_at[res];
        binding = last_on[res];
      }
    }
    const double end = start + op.cost_us;
    r->times[v] = OpTime{start, end, binding, false};
    for (int res = 0; res < kNumResources; ++res) {
      if (op.resources & (1u << res)) {
        free_at[res] = end;
        last_on[res] = v;
      }
    }
    if (op.phase == Phase::kForward) r->forward_end_us = std::max(r->forward_end_us, end);
    r->inter_node_bytes += op.inter_node_bytes;
    if (v == 0 || end > r->makespan_us) r->makespan_us = end;
  }
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
