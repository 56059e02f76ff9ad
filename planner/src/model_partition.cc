// Lancet's operator partition (segments of equal time between MoE layers,
// range costs simulated alone and cached), Tutel's ranges and the AlltoAll
// crossover of the model planner (model_planner_internal.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/hash/hash.h"
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
      if (i + 1 < e && next < opt.partition_groups && acc >= total * next / opt.partition_groups) {
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
    max_span = second > first && first >= 0 ? second - first : static_cast<int>(bounds.size()) - 1;
  }
}

// Whether units [u0, u1) may be split k ways: k no more than the tokens,
// attention no more ways than sequences, no batch-prioritized gate.
bool ModelPlanner::Impl::RangeAllowed(int u0, int u1, int k) const {
  if (k <= 1) return true;
  if (k > Tokens(1)) return false;
  for (int u = u0; u < u1; ++u) {
    const UnitKind kind = units[static_cast<size_t>(u)].kind;
    if (IsAttention(kind) && k > m->micro_batch_size) return false;
    if (kind == UnitKind::kMoeRoute && m->moe.gate == Gate::kBatchPrioritized) return false;
  }
  return true;
}

// P(i, j, k) of segments [i, j): the range simulated alone (inputs from
// before it ready at 0), split k ways; < 0 where k is not allowed. Cached by
// the range's structure (each unit's kind and inputs relative to the range's
// first), k, the pair where it holds MoE units, and the context.
//
// The DP asks for every j of each (i, k) (j - i up to its span): RangeCosts
// answers them together into cost_table. A range's graph is the first ops of
// a longer one from the same unit (EmitRange emits unit by unit), and the
// simulation is causal in issue order, so P(i, j, k) is the latest end among
// the first ops of the graph of the longest range missing from the cache:
// one graph simulated per (i, k), not one per range.
void ModelPlanner::Impl::RangeCosts(int i, int k, double* out) {
  const int nseg = static_cast<int>(bounds.size()) - 1;
  const int last = std::min(nseg, i + std::max(1, max_span));
  if (!span_ready[static_cast<size_t>(i)]) SpanKeys(i);
  // The whole answer is keyed too, by the structure of its units and where
  // its segments end: repeated blocks ask the same questions.
  const bool any_moe =
      span_moe[static_cast<size_t>(i) * std::max(1, max_span) + static_cast<size_t>(last - i - 1)];
  const uint64_t family =
      absl::HashOf(span_family[static_cast<size_t>(i)], k, any_moe ? combo_salt : 0, context_salt);
  if (auto it = family_cache.find(family); it != family_cache.end()) {
    std::copy_n(family_costs.begin() + static_cast<ptrdiff_t>(it->second), last - i, out);
    return;
  }
  RangeCostsOf(i, k, last, out);
  family_cache.emplace(family, family_costs.size());
  family_costs.insert(family_costs.end(), out, out + (last - i));
}

void ModelPlanner::Impl::SpanKeys(int i) {
  const int nseg = static_cast<int>(bounds.size()) - 1;
  const int span = std::max(1, max_span);
  const int last = std::min(nseg, i + span);
  const int u0 = bounds[static_cast<size_t>(i)];
  uint64_t h = 0;
  bool moe = false;
  int u = u0;
  for (int j = i + 1; j <= last; ++j) {
    for (; u < bounds[static_cast<size_t>(j)]; ++u) {
      const Unit& un = units[static_cast<size_t>(u)];
      moe = moe || IsMoeUnit(un.kind);
      h = absl::HashOf(h, static_cast<uint8_t>(un.kind), un.in_a >= u0 ? u - un.in_a : 0,
                       un.in_b >= u0 ? u - un.in_b : 0);
    }
    const size_t at = static_cast<size_t>(i) * span + static_cast<size_t>(j - i - 1);
    span_prefix[at] = h;
    span_moe[at] = moe;
  }
  // The family: every prefix's structure and where its segments end.
  uint64_t f = absl::HashOf(h, last - i);
  for (int j = i + 1; j <= last; ++j) {
    f = absl::HashOf(f, bounds[static_cast<size_t>(j)] - u0);
  }
  span_family[static_cast<size_t>(i)] = f;
  span_ready[static_cast<size_t>(i)] = 1;
}

// RangeCosts' answer for segments i to `last`, range by range from the cache
// or simulated.
void ModelPlanner::Impl::RangeCostsOf(int i, int k, int last, double* out) {
  const int u0 = bounds[static_cast<size_t>(i)];
  int allowed = last;  // the longest allowed (allowed is monotone in j)
  while (allowed > i && !RangeAllowed(u0, bounds[static_cast<size_t>(allowed)], k)) --allowed;
  // Each range's key: its prefix of the span's structure (SpanKeys).
  range_keys.clear();
  const size_t row = static_cast<size_t>(i) * std::max(1, max_span);
  int missing = i;  // the longest range not cached
  for (int j = i + 1; j <= last; ++j) {
    out[j - i - 1] = -1.0;
    if (j > allowed) continue;
    const size_t at = row + static_cast<size_t>(j - i - 1);
    const uint64_t key =
        absl::HashOf(span_prefix[at], k, span_moe[at] ? combo_salt : 0, context_salt);
    range_keys.push_back(key);
    if (auto it = p_cache.find(key); it != p_cache.end()) {
      out[j - i - 1] = it->second;
    } else {
      missing = j;
    }
  }
  if (missing == i) return;
  const int u_end = bounds[static_cast<size_t>(missing)];
  UnitSim sim;
  unit_makespan.clear();
  piece_end.clear();
  bool ok = SimulateUnits(u0, u_end, k, /*standalone=*/true, &sim);
  if (!ok) {
    // The graph built and simulated (an op off device 0).
    range_graph.Clear();
    unit_end.clear();
    EmitRange(u0, u_end, k, &range_graph, true, &unit_end);
    ok = simulator.Schedule(range_graph, &range_sim).ok();
    double makespan = 0.0;
    OpId v = 0;
    unit_makespan.clear();
    for (const OpId end : unit_end) {
      for (; ok && v < end; ++v) {
        const double e = range_sim.times[static_cast<size_t>(v)].end_us;
        if (v == 0 || e > makespan) makespan = e;
      }
      unit_makespan.push_back(makespan);
    }
  }
  for (int j = i + 1; j <= missing; ++j) {
    const int u1 = bounds[static_cast<size_t>(j)];
    double& p = out[j - i - 1];
    if (p >= 0.0) continue;                   // cached
    if (!ok) p = SingleRangeCost(u0, u1, k);  // the graph that fails, found alone
    if (ok) p = unit_makespan[static_cast<size_t>(u1 - u0 - 1)];
    p_cache.emplace(range_keys[static_cast<size_t>(j - i - 1)], p);
  }
}

// Units [u0, u1) split k ways simulated as EmitRange would issue them into
// a graph, without building it: each op timed by the simulator's rule
// (TimeOp) in the same order, so the times are Simulator::Schedule's to the
// bit. `standalone`: inputs from before u0 ready at 0 (else every piece
// of them, as simulated into piece_end before). `sim` carries the resources
// and the latest ends from range to range; unit_makespan gets the latest end
// after each unit (0 before any op). False where an op is not on device 0
// (the caller builds the graph then).
bool ModelPlanner::Impl::SimulateUnits(int u0, int u1, int k, bool standalone, UnitSim* sim) {
  auto run = [&](const Op& op, double start) {
    const double end = TimeOp(op.resources, op.cost_us, start, sim->free_at);
    if (!sim->any || end > sim->makespan) sim->makespan = end;
    if (op.phase == internal::F && end > sim->forward_end) sim->forward_end = end;
    sim->any = true;
    return end;
  };
  for (int j = u0; j < u1; ++j) {
    const Unit& u = units[static_cast<size_t>(j)];
    // ZeRO-3's gathers before the block (EmitRange's ZeroGather): ops
    // depending on nothing, issued first.
    double gather[2] = {-1.0, -1.0};
    if (u.kind == internal::UnitKind::kLn1 && st.zero_stage >= 3) {
      scratch.Clear();
      const Deps gd = ZeroGather(&scratch, u.block, internal::F);
      op_end.assign(static_cast<size_t>(scratch.size()), 0.0);
      for (OpId id = 0; id < scratch.size(); ++id) {
        if (scratch.op(id).device != 0 || !scratch.deps(id).empty()) return false;
        op_end[static_cast<size_t>(id)] = run(scratch.op(id), 0.0);
      }
      if (gd.a != kNoOp) gather[0] = op_end[static_cast<size_t>(gd.a)];
      if (gd.b != kNoOp) gather[1] = op_end[static_cast<size_t>(gd.b)];
    }
    const internal::UnitOps& ops = UnitTemplate(u, k);
    const OpGraph& t = ops.graph;
    // Every entry is written before it is read (dependencies come first).
    op_end.resize(static_cast<size_t>(t.size()) * k);
    for (OpId l = 0; l < t.size(); ++l) {
      const Op& op = t.op(l);
      if (op.device != 0) return false;
      const auto local = t.deps(l);
      for (int p = 0; p < k; ++p) {
        double start = 0.0;  // ends are >= 0: a missing output (-1) never binds
        if (local.empty()) {
          start = std::max({InputsEnd(u, u0, p, standalone), gather[0], gather[1]});
        } else {
          for (OpId d : local) start = std::max(start, op_end[static_cast<size_t>(d) * k + p]);
        }
        op_end[static_cast<size_t>(l) * k + p] = run(op, start);
      }
    }
    piece_begin[static_cast<size_t>(j)] = static_cast<int>(piece_end.size());
    piece_k[static_cast<size_t>(j)] = k;
    for (int p = 0; p < k; ++p) {
      auto at = [&](OpId o) { return o == kNoOp ? -1.0 : op_end[static_cast<size_t>(o) * k + p]; };
      piece_end.push_back({at(ops.out.a), at(ops.out.b)});
    }
    unit_makespan.push_back(sim->makespan);
  }
  return true;
}

// AppendInputs' dependencies as ends: the latest (0 without any).
double ModelPlanner::Impl::InputsEnd(const Unit& u, int range_begin, int p, bool standalone) const {
  double end = 0.0;
  for (int in : {u.in_a, u.in_b}) {
    if (in < 0) continue;
    const size_t first = static_cast<size_t>(piece_begin[static_cast<size_t>(in)]);
    if (in >= range_begin) {
      const auto& o = piece_end[first + static_cast<size_t>(p)];
      end = std::max({end, o[0], o[1]});
    } else if (!standalone) {
      for (int r = 0; r < piece_k[static_cast<size_t>(in)]; ++r) {
        const auto& o = piece_end[first + static_cast<size_t>(r)];
        end = std::max({end, o[0], o[1]});
      }
    }
  }
  return end;
}

// P of units [u0, u1) split k ways from its own graph (kInf when it does not simulate).
double ModelPlanner::Impl::SingleRangeCost(int u0, int u1, int k) {
  range_graph.Clear();
  EmitRange(u0, u1, k, &range_graph, true);
  return simulator.Schedule(range_graph, &range_sim).ok() ? range_sim.makespan_us : kInf;
}

std::vector<Range> ModelPlanner::Impl::PartitionRanges() {
  ResetPieces();
  const int nseg = static_cast<int>(bounds.size()) - 1;
  const int span = std::max(1, max_span), kmax = opt.max_partitions;
  // cost_table[(i * kmax + k - 1) * span + j - i - 1]; NaN: not asked yet.
  cost_table.assign(static_cast<size_t>(nseg) * kmax * span,
                    std::numeric_limits<double>::quiet_NaN());
  span_ready.assign(static_cast<size_t>(nseg), 0);
  span_family.resize(static_cast<size_t>(nseg));
  span_prefix.resize(static_cast<size_t>(nseg) * span);
  span_moe.resize(static_cast<size_t>(nseg) * span);
  const std::vector<PartitionChoice> dp =
      PartitionDp(nseg, max_span, kmax, [&](int i, int j, int k) {
        double* row = cost_table.data() + (static_cast<size_t>(i) * kmax + k - 1) * span;
        if (std::isnan(row[0])) RangeCosts(i, k, row);
        return row[j - i - 1];
      });
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
