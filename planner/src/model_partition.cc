// Lancet's operator partition (segments of equal time between MoE layers,
// range costs simulated alone and cached), Tutel's ranges and the AlltoAll
// crossover of the model planner (model_planner_internal.h).
#include <cstdint>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/types/span.h"
#include "model_planner_internal.h"

namespace moeplan::planner {

using internal::Builder;
using internal::Deps;
using internal::IsAttention;
using internal::IsMoeUnit;
using internal::IsSharedExpertUnit;
using internal::kInf;
using internal::Range;
using internal::Unit;
using internal::UnitKind;

// Segment boundaries: around every MoE section (the shared expert is one
// segment) and `partition_groups` groups of equal time in each dense stretch.
void ModelPlanner::Impl::BuildBounds() {
  bounds.clear();
  bounds.push_back(0);
  std::vector<double> us(units.size(), 0.0);
  LayerConfig piece_layer;
  for (size_t j = 0; j < units.size(); ++j) {
    if (IsMoeUnit(units[j].kind)) continue;
    scratch.Clear();
    Builder sb(cost, &scratch);
    BuildUnit(units[j], 1, sb, Deps{}, &piece_layer);
    for (OpId o = 0; o < scratch.size(); ++o) us[j] += scratch.op(o).cost_us;
  }
  size_t j = 0;
  const size_t n = units.size();
  while (j < n) {
    if (IsMoeUnit(units[j].kind)) {
      size_t e = j + 1;
      const bool shared = IsSharedExpertUnit(units[j].kind);
      while (shared && e < n && IsSharedExpertUnit(units[e].kind)) ++e;
      bounds.push_back(static_cast<int>(e));
      j = e;
      continue;
    }
    size_t e = j;
    double total = 0.0;
    while (e < n && !IsMoeUnit(units[e].kind)) total += us[e++];
    double acc = 0.0;
    int next = 1;
    for (size_t i = j; i < e; ++i) {
      acc += us[i];
      if (i + 1 < e && next < opt.partition_groups &&
          acc >= total * next / opt.partition_groups) {
        bounds.push_back(static_cast<int>(i + 1));
        while (next < opt.partition_groups && acc >= total * next / opt.partition_groups) ++next;
      }
    }
    bounds.push_back(static_cast<int>(e));
    j = e;
  }
  // The default span: from one MoE layer's route to the next one's.
  max_span = opt.max_span;
  if (max_span == 0) {
    int first = -1, second = -1;
    for (size_t b = 0; b + 1 < bounds.size(); ++b) {
      if (units[static_cast<size_t>(bounds[b])].kind != UnitKind::kMoeRoute) continue;
      if (first < 0) {
        first = static_cast<int>(b);
      } else {
        second = static_cast<int>(b);
        break;
      }
    }
    max_span =
        second > first && first >= 0 ? second - first : static_cast<int>(bounds.size()) - 1;
  }
}

// P(i, j, k) of segments [i, j): the range simulated alone, split k ways;
// < 0 where k is not allowed. Cached by the range's structure.
double ModelPlanner::Impl::RangeCost(int i, int j, int k) {
  const int u0 = bounds[static_cast<size_t>(i)], u1 = bounds[static_cast<size_t>(j)];
  bool moe = false;
  if (k > 1) {
    if (k > Tokens(1)) return -1.0;
    for (int u = u0; u < u1; ++u) {
      const UnitKind kind = units[static_cast<size_t>(u)].kind;
      if (IsAttention(kind) && k > m->micro_batch_size) return -1.0;
      if (kind == UnitKind::kMoeRoute && m->moe.gate == Gate::kBatchPrioritized) return -1.0;
    }
  }
  key_buf.clear();
  for (int u = u0; u < u1; ++u) {
    const Unit& un = units[static_cast<size_t>(u)];
    moe = moe || IsMoeUnit(un.kind);
    key_buf.push_back(static_cast<uint32_t>(un.kind) |
                      static_cast<uint32_t>(un.in_a >= u0 ? u - un.in_a : 0) << 8 |
                      static_cast<uint32_t>(un.in_b >= u0 ? u - un.in_b : 0) << 20);
  }
  const uint64_t key =
      absl::HashOf(absl::MakeSpan(key_buf), k, moe ? combo_salt : 0, context_salt);
  if (auto it = p_cache.find(key); it != p_cache.end()) return it->second;
  range_graph.Clear();
  EmitRange(u0, u1, k, &range_graph, true);
  double us = kInf;
  if (simulator.Run(range_graph, &range_sim).ok()) us = range_sim.makespan_us;
  p_cache.emplace(key, us);
  return us;
}

std::vector<Range> ModelPlanner::Impl::PartitionRanges() {
  ResetPieces();
  const int nseg = static_cast<int>(bounds.size()) - 1;
  const std::vector<PartitionChoice> dp =
      PartitionDp(nseg, max_span, opt.max_partitions,
                  [&](int i, int j, int k) { return RangeCost(i, j, k); });
  std::vector<Range> out;
  for (const PartitionChoice& c : dp) {
    out.push_back(
        {bounds[static_cast<size_t>(c.begin)], bounds[static_cast<size_t>(c.end)], c.k, c.us});
  }
  return out;
}

std::vector<Range> ModelPlanner::Impl::WholeRanges() const {
  return {Range{0, static_cast<int>(units.size()), 1, 0.0}};
}

// Tutel: each MoE layer's exchange (dispatch, experts, combine) split r ways.
std::vector<Range> ModelPlanner::Impl::TutelRanges(int r) const {
  std::vector<Range> out;
  int start = 0;
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    if (units[static_cast<size_t>(u)].kind != UnitKind::kMoeExchange) continue;
    if (u > start) out.push_back({start, u, 1, 0.0});
    out.push_back({u, u + 1, r, 0.0});
    start = u + 1;
  }
  if (start < static_cast<int>(units.size()))
    out.push_back({start, static_cast<int>(units.size()), 1, 0.0});
  return out;
}

std::vector<MoeLayerChoice> ModelPlanner::Impl::Layers(const std::vector<Range>& ranges) const {
  std::vector<MoeLayerChoice> out;
  for (const Range& r : ranges) {
    for (int u = r.begin; u < r.end; ++u) {
      if (units[static_cast<size_t>(u)].kind != UnitKind::kMoeExchange) continue;
      out.push_back({units[static_cast<size_t>(u)].block, sched, algo, r.k});
    }
  }
  return out;
}

AllToAllCrossover ModelPlanner::Impl::Crossover() const {
  AllToAllCrossover c;
  const int g = cost.profile().shape.gpus_per_node;
  const int q = m->parallel.esp >= g ? 1 : g / m->parallel.esp;
  c.ranks_per_node = q;
  c.bytes = static_cast<double>(Derive(moe_layer).dispatch_bytes);
  c.applies = q >= 2;
  if (!c.applies) return c;
  auto linear = [&](int w) {
    return cost.CollectiveUs(Collective::kAllToAll, {w, w / q}, c.bytes);
  };
  auto hier = [&](int w) {
    return cost.CollectiveUs(Collective::kAllToAll, {q, 1}, c.bytes) +
           cost.MemoryBoundUs(2.0 * c.bytes) +
           cost.CollectiveUs(Collective::kAllToAll, {w / q, w / q}, c.bytes);
  };
  for (int w = 2 * q; w <= kMaxCrossoverRanks; w *= 2) {
    if (hier(w) < linear(w)) {
      c.faster_from_ranks = w;
      break;
    }
  }
  if (topo.ep.SpansNodes() && topo.ep_ranks_per_node > 1) {
    c.linear_us = linear(m->parallel.ep);
    c.hierarchical_us = hier(m->parallel.ep);
  }
  return c;
}

}  // namespace moeplan::planner
