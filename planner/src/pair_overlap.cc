// Overlapped forward-backward pairs (pair_overlap.h).
#include "moeplan/planner/pair_overlap.h"

#include <algorithm>
#include <limits>
#include <span>

namespace moeplan::planner {

namespace {

// The ops `ids` of `g` in that order; `start` their start, `quiet` whether
// one is a pass-through.
PhaseOps ItemsOf(const OpGraph& g, std::span<const OpId> ids, absl::FunctionRef<double(OpId)> start,
                 absl::FunctionRef<bool(const Op&)> quiet) {
  std::vector<int32_t> at(static_cast<size_t>(g.size()), -1);
  for (size_t i = 0; i < ids.size(); ++i) at[static_cast<size_t>(ids[i])] = static_cast<int32_t>(i);
  PhaseOps out;
  out.items.reserve(ids.size());
  for (OpId id : ids) {
    const Op& op = g.op(id);
    PhaseOps::Item it;
    const bool pass = quiet(op);
    it.cost_us = pass ? 0.0 : op.cost_us;
    it.resources = pass ? 0 : op.resources;
    it.start_us = start(id);
    it.device = op.device;
    out.devices = std::max(out.devices, op.device + 1);
    it.first_dep = static_cast<uint32_t>(out.deps.size());
    for (OpId d : g.deps(id)) {
      if (at[static_cast<size_t>(d)] >= 0)
        out.deps.push_back(static_cast<uint32_t>(at[static_cast<size_t>(d)]));
    }
    it.end_dep = static_cast<uint32_t>(out.deps.size());
    out.items.push_back(it);
  }
  return out;
}

// The ops of one phase of `g`, in start order, `origin` their start's zero.
PhaseOps PhaseOf(const OpGraph& g, const SimResult& r, bool forward, double origin,
                 absl::FunctionRef<bool(const Op&)> passive) {
  std::vector<OpId> ids;
  for (OpId id = 0; id < g.size(); ++id) {
    if ((g.op(id).phase == Phase::kForward) == forward) ids.push_back(id);
  }
  // Stable: an op starting with its (zero-cost) dependency stays after it.
  std::stable_sort(ids.begin(), ids.end(), [&](OpId a, OpId b) {
    return r.times[static_cast<size_t>(a)].start_us < r.times[static_cast<size_t>(b)].start_us;
  });
  return ItemsOf(
      g, ids, [&](OpId id) { return r.times[static_cast<size_t>(id)].start_us - origin; },
      [&](const Op& op) { return !forward && passive(op); });
}

// When item `it` of `ph` could start: its dependencies' ends in `ends`,
// each resource it holds free (`free_at`, its device's).
double StartOf(const PhaseOps& ph, const PhaseOps::Item& it, const std::vector<double>& ends,
               const double* free_at) {
  double start = 0.0;
  for (uint32_t k = it.first_dep; k < it.end_dep; ++k) start = std::max(start, ends[ph.deps[k]]);
  const double* at = free_at + static_cast<size_t>(it.device) * kNumResources;
  for (int r = 0; r < kNumResources; ++r) {
    if (it.resources & (1u << r)) start = std::max(start, at[r]);
  }
  return start;
}

}  // namespace

PhaseOps PhaseInOrder(const OpGraph& g, std::span<const OpId> ids) {
  return ItemsOf(
      g, ids, [](OpId) { return 0.0; }, [](const Op&) { return false; });
}

ChunkPhases PhasesOf(const OpGraph& g, const SimResult& r,
                     absl::FunctionRef<bool(const Op&)> passive) {
  ChunkPhases out;
  out.fwd = PhaseOf(g, r, true, 0.0, passive);
  out.bwd = PhaseOf(g, r, false, r.forward_end_us, passive);
  return out;
}

PairTime MergedUs(const PhaseOps& f, const PhaseOps& b, MergeScratch* s,
                  std::vector<uint8_t>* order) {
  if (order != nullptr) order->clear();
  s->f_end.assign(f.items.size(), 0.0);
  s->b_end.assign(b.items.size(), 0.0);
  s->free_at.assign(static_cast<size_t>(std::max(f.devices, b.devices)) * kNumResources, 0.0);
  PairTime out;
  size_t i = 0, j = 0;
  while (i < f.items.size() || j < b.items.size()) {
    // Each phase keeps its order; of the two next ops, the one that can
    // start first runs first (the forward's on a tie).
    const double fs = i < f.items.size() ? StartOf(f, f.items[i], s->f_end, s->free_at.data())
                                         : std::numeric_limits<double>::infinity();
    const double bs = j < b.items.size() ? StartOf(b, b.items[j], s->b_end, s->free_at.data())
                                         : std::numeric_limits<double>::infinity();
    const bool fwd = fs <= bs;
    if (order != nullptr) order->push_back(fwd ? 1 : 0);
    const PhaseOps::Item& it = fwd ? f.items[i] : b.items[j];
    const double end = (fwd ? fs : bs) + it.cost_us;
    double* at = s->free_at.data() + static_cast<size_t>(it.device) * kNumResources;
    for (int r = 0; r < kNumResources; ++r) {
      if (it.resources & (1u << r)) at[r] = end;
    }
    if (fwd) {
      s->f_end[i++] = end;
      out.fwd_end_us = std::max(out.fwd_end_us, end);
    } else {
      s->b_end[j++] = end;
      out.bwd_end_us = std::max(out.bwd_end_us, end);
    }
  }
  out.total_us = std::max(out.fwd_end_us, out.bwd_end_us);
  return out;
}

}  // namespace moeplan::planner
