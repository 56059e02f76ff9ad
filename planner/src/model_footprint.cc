// The memory bound of a model plan (docs/model.md "Memory bound"): what the
// plan's graphs, simulations and dW placement would hold, estimated from the
// stage's units before any graph is built (model_planner_internal.h).
#include <algorithm>
#include <array>
#include <cstdint>
#include <span>

#include "model_planner_internal.h"
#include "moeplan/base/format.h"
#include "moeplan/base/strings.h"

namespace moeplan::planner {

using internal::Builder;
using internal::Deps;
using internal::Unit;
using internal::UnitKind;

namespace {

// Bytes one op holds in a graph with its simulation: the op, what it
// computes, its dependency index and up to four dependencies, its time, its
// critical-path entry and issue-order slot, times 1.5 for the vectors' growth.
constexpr int64_t kBytesPerOp =
    3 * static_cast<int64_t>(sizeof(Op) + sizeof(OpExec) + 5 * sizeof(OpId) + sizeof(OpTime) +
                             2 * sizeof(OpId) + sizeof(std::vector<OpId>)) /
    2;
// The backward of a unit: a dX op, a dW op and their collectives for each
// forward op (an SAA's dual as many steps as its forward), with slack.
constexpr int64_t kBackwardPerForward = 3;
constexpr int kNumUnitKinds = static_cast<int>(UnitKind::kLoss) + 1;

}  // namespace

absl::Status ModelPlanner::Impl::CheckFootprint(std::span<const Schedule> schedules,
                                                std::span<const AllToAllAlgo> algos,
                                                std::span<const Variant> variants,
                                                bool bound_only) {
  // The most pieces a range (k_all) and an MoE exchange (k_moe) is split into.
  int k_all = 1, k_moe = 1;
  bool reach = false;
  for (Variant v : bound_only ? std::span<const Variant>{} : variants) {
    if (v == Variant::kPartition || v == Variant::kLancet) k_all = opt.max_partitions;
    if (v == Variant::kTutel) {
      k_moe = *std::max_element(opt.tutel_degrees.begin(), opt.tutel_degrees.end());
    }
    if (v == Variant::kDw || v == Variant::kLancet) reach = true;
  }
  k_moe = std::max(k_moe, k_all);
  // Each kind's ops built whole, the most over the schedules and algorithms
  // (the same for every block of the kind): one build per kind, not per unit.
  std::array<int64_t, kNumUnitKinds> ops{};
  ops.fill(-1);
  const Schedule sched0 = sched;
  const AllToAllAlgo algo0 = algo;
  LayerConfig piece_layer;
  int64_t fwd_whole = 0, fwd_split = 0;
  for (const Unit& u : units) {
    int64_t& n = ops[static_cast<size_t>(u.kind)];
    if (n < 0) {
      for (Schedule sc : schedules) {
        for (AllToAllAlgo a : algos) {
          sched = sc;
          algo = a;
          scratch.Clear();
          Builder sb(cost, &scratch);
          BuildUnit(u, 1, sb, Deps{}, &piece_layer);
          n = std::max<int64_t>(n, scratch.size());
        }
      }
    }
    fwd_whole += n;
    fwd_split += n * (u.kind == UnitKind::kMoeExchange ? k_moe : k_all);
  }
  sched = sched0;
  algo = algo0;
  const int64_t blocks = end_block - first_block;
  // ZeRO-3's gathers (two per block and phase), the join, the optimizer.
  const int64_t fixed = 4 * blocks + 8;
  const int64_t backward = kBackwardPerForward * fwd_whole + fixed;
  // The final graph: forward, backward, and a gradient bucket per dW op at most.
  const int64_t graph_ops = 2 * (fwd_split + backward);
  const int64_t graphs = bound_only ? 1 : 2 + static_cast<int64_t>(variants.size());
  const double graph_bytes = static_cast<double>(graphs) * graph_ops * kBytesPerOp;
  const double reach_bytes = reach ? static_cast<double>(backward) * backward / 8.0 : 0.0;
  const double total = graph_bytes + reach_bytes;
  if (total <= static_cast<double>(opt.max_plan_bytes)) return absl::OkStatus();
  return absl::ResourceExhaustedError(Cat(
      "max_plan_bytes: a plan of ", blocks, " blocks would hold ~", FormatBytes(total), " (",
      graphs, " graphs of up to ", graph_ops, " ops",
      reach ? Cat(" and dW placement's reachability of ", backward, " backward ops squared")
            : std::string(),
      "), over the bound of ", FormatBytes(static_cast<double>(opt.max_plan_bytes)),
      "; plan fewer blocks per stage (more pipeline stages), a smaller expert-parallel group "
      "(its SAA steps are per peer) or fewer variants"));
}

}  // namespace moeplan::planner
