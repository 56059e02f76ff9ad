// Whole-model planning (docs/model.md): the graph algorithms against brute
// force, the model graph's structure, and the variants' invariants.
#include "moeplan/planner/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/hash/hash.h"
#include "moeplan/base/format.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/planner/schedules.h"
#include "test_profile.h"

namespace moeplan::planner {
namespace {

using testing::RoundNumberModel;
using testing::RoundNumberProfile;

// A small model on RoundNumberProfile (4 nodes x 8): 4 blocks, MoE every
// other block, 2 experts per rank over 32 ranks.
ModelConfig SmallModel(int mp = 1, Gate gate = Gate::kSwitch) {
  ModelConfig m;
  m.name = "small";
  m.num_layers = 4;
  m.hidden_size = 256;
  m.num_attention_heads = 8;
  m.ffn_hidden_size = 1024;
  m.seq_length = 128;
  m.micro_batch_size = 8;
  m.bytes_per_element = 2;
  m.moe.layer_freq = 2;
  m.moe.num_experts = 64;
  m.moe.top_k = 1;
  m.moe.capacity_factor = 1.0;
  m.moe.expert_ffn_hidden_size = 1024;
  m.moe.gate = gate;
  m.parallel = {.mp = mp, .ep = 32 / mp, .esp = mp, .dp = 32 / mp, .pp = 1};
  return m;
}

// ---- Reachability ----

TEST(Reachability, MatchesDepthFirstSearchOnRandomDags) {
  std::mt19937 rng(7);
  int reaching = 0;  // sources found reaching a set: the check below is not vacuous
  for (int trial = 0; trial < 30; ++trial) {
    const int n = 5 + static_cast<int>(rng() % 150);
    OpGraph g;
    std::vector<std::vector<int>> succ(n);
    for (int v = 0; v < n; ++v) {
      std::vector<OpId> deps;
      for (int u = 0; u < v; ++u) {
        if (rng() % 100 < 4) deps.push_back(u);
      }
      Op op;
      op.base = "x";
      g.Add(op, deps);
      for (OpId u : deps) succ[u].push_back(v);
    }
    const int first = static_cast<int>(rng() % 5);
    Reachability r, from_some;
    r.Compute(g, first);
    // Tracking only some sources keeps exactly their paths.
    std::vector<OpId> sources;
    std::vector<bool> is_source(n, false);
    for (int v = first; v < n; ++v) {
      if (rng() % 3 == 0) {
        sources.push_back(v);
        is_source[v] = true;
      }
    }
    from_some.Compute(g, first, sources);
    for (int a = first; a < n; ++a) {
      // Everything reachable from a by DFS over ops >= first.
      std::vector<bool> seen(n, false);
      std::vector<int> stack = {a};
      while (!stack.empty()) {
        const int v = stack.back();
        stack.pop_back();
        for (int w : succ[v]) {
          if (!seen[w]) {
            seen[w] = true;
            stack.push_back(w);
          }
        }
      }
      for (int b = first; b < n; ++b) {
        if (a == b) continue;
        ASSERT_EQ(r.Path(a, b), static_cast<bool>(seen[b])) << a << " -> " << b;
        ASSERT_EQ(from_some.Path(a, b), is_source[a] && seen[b])
            << a << " -> " << b << " (sources)";
      }
    }
    // Reaching a set of ops, shifted ids included: a source reaches the set
    // exactly when it has a path to one of them.
    const OpId shift = static_cast<OpId>(rng() % 3);
    for (int round = 0; round < 5; ++round) {
      std::vector<OpId> set;
      for (int v = 0; v < n; ++v) {
        if (rng() % 6 == 0) set.push_back(v + shift);
      }
      std::vector<uint64_t> reached;
      from_some.Reaching(set, shift, &reached);
      for (int a = 0; a < n; ++a) {
        bool any = false;
        for (OpId o : set) any = any || from_some.Path(a, o - shift);
        ASSERT_EQ(from_some.Reaches(reached, a), any) << a << " reaches the set";
        reaching += any;
      }
    }
  }
  EXPECT_GT(reaching, 100);
}

// ---- Best fit ----

TEST(BestFitDw, PicksTheClosestUntilCovered) {
  // Slot of 10: closest to 10 is 9 (|1|), then remaining 1: closest is 1.5 -> covered.
  const std::vector<double> slots = {10.0, 4.0};
  const std::vector<double> dw = {9.0, 1.5, 3.0, 20.0};
  auto picks = BestFitDw(slots, dw, [](int, int) { return true; });
  ASSERT_EQ(picks.size(), 2u);
  EXPECT_EQ(picks[0], (std::vector<int>{0, 1}));
  // Slot of 4: 3 (|1|) beats 20 (|16|), then remaining 1: 20 is all that is left.
  EXPECT_EQ(picks[1], (std::vector<int>{2, 3}));
}

TEST(BestFitDw, RespectsEligibilityAndTies) {
  const std::vector<double> slots = {5.0};
  const std::vector<double> dw = {4.0, 6.0, 5.0};
  // 5.0 is exact but not eligible; 4 and 6 tie at |1|: the smaller one first.
  auto picks = BestFitDw(slots, dw, [](int, int d) { return d != 2; });
  EXPECT_EQ(picks[0], (std::vector<int>{0, 1}));
  // Nothing eligible: nothing placed.
  picks = BestFitDw(slots, dw, [](int, int) { return false; });
  EXPECT_TRUE(picks[0].empty());
}

// ---- The partition DP against exhaustive search ----

TEST(PartitionDp, MatchesExhaustiveSearch) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 8);
    const int span = 1 + static_cast<int>(rng() % 4);
    const int max_k = 1 + static_cast<int>(rng() % 4);
    std::map<std::tuple<int, int, int>, double> table;
    auto cost = [&](int i, int j, int k) {
      auto key = std::make_tuple(i, j, k);
      if (!table.count(key)) {
        // Some pieces not allowed; k = 1 always is.
        table[key] = (k > 1 && rng() % 5 == 0) ? -1.0 : 1.0 + static_cast<double>(rng() % 100);
      }
      return table[key];
    };
    const auto dp = PartitionDp(n, span, max_k, cost);
    double dp_total = 0.0;
    int at = 0;
    for (const PartitionChoice& c : dp) {
      EXPECT_EQ(c.begin, at);
      EXPECT_LE(c.end - c.begin, span);
      dp_total += c.us;
      at = c.end;
    }
    EXPECT_EQ(at, n);
    std::function<double(int)> best = [&](int i) -> double {
      if (i == n) return 0.0;
      double b = 1e300;
      for (int j = i + 1; j <= std::min(n, i + span); ++j) {
        for (int k = 1; k <= max_k; ++k) {
          const double p = cost(i, j, k);
          if (p >= 0) b = std::min(b, p + best(j));
        }
      }
      return b;
    };
    EXPECT_DOUBLE_EQ(dp_total, best(0)) << "trial " << trial;
  }
}

// ---- The model graph ----

ModelPlan PlanOrDie(const ModelConfig& m, const CostModel& cost, ModelPlanOptions o = {}) {
  ModelPlanner planner(cost);
  ModelPlan plan;
  const absl::Status s = planner.Plan(m, o, &plan);
  EXPECT_TRUE(s.ok()) << s;
  return plan;
}

int CountOps(const VariantPlan& v, std::string_view name_part, int block = -2) {
  int n = 0;
  for (OpId id = 0; id < v.graph.size(); ++id) {
    const Op& op = v.graph.op(id);
    if (block != -2 && op.block != block) continue;
    if (op.Name().find(name_part) != std::string::npos) ++n;
  }
  return n;
}

TEST(ModelGraph, MegatronTensorParallelAllReducesPerBlock) {
  ModelPlanOptions o;
  o.variants = {Variant::kNone};
  o.schedules = {Schedule::kDefault};
  const ModelPlan plan = PlanOrDie(SmallModel(/*mp=*/2), RoundNumberModel(), o);
  const VariantPlan& v = plan.variants[0];
  // Dense block 1: two forward AllReduces (after proj and fc2), two backward
  // (after the fc1 and qkv input gradients). MoE block 0: the attention's two.
  for (const char* name : {"b1.fwd.proj_allreduce", "b1.fwd.fc2_allreduce", "b1.bwd.fc1_allreduce",
                           "b1.bwd.qkv_allreduce"}) {
    EXPECT_EQ(CountOps(v, name), 1) << name;
  }
  int tp = 0;
  for (OpId id = 0; id < v.graph.size(); ++id) {
    const Op& op = v.graph.op(id);
    if (op.block == 1 && op.term == Term::kAllReduce && op.kind == OpKind::kComm) ++tp;
  }
  EXPECT_EQ(tp, 4);
  // With mp = 1 there are none.
  const ModelPlan one = PlanOrDie(SmallModel(1), RoundNumberModel(), o);
  int tp_one = 0;
  for (OpId id = 0; id < one.variants[0].graph.size(); ++id) {
    const Op& op = one.variants[0].graph.op(id);
    tp_one += op.block >= 0 && op.term == Term::kAllReduce && op.kind == OpKind::kComm;
  }
  EXPECT_EQ(tp_one, 0);
}

TEST(ModelGraph, OpsAreNamedByBlockAndEveryWeightGemmHasItsDw) {
  ModelPlanOptions o;
  o.variants = {Variant::kNone};
  const ModelPlan plan = PlanOrDie(SmallModel(), RoundNumberModel(), o);
  const VariantPlan& v = plan.variants[0];
  EXPECT_EQ(CountOps(v, "b3.fwd.qkv"), 1);
  EXPECT_EQ(CountOps(v, "b3.bwd.qkv_dw"), 1);
  EXPECT_EQ(CountOps(v, "b2.moe.fwd.gate"), 1);
  EXPECT_EQ(CountOps(v, "b2.moe.bwd.expert_dw"), 1);
  EXPECT_EQ(CountOps(v, "b1.moe."), 0) << "block 1 is dense";
  int dw = 0;
  for (OpId id = 0; id < v.graph.size(); ++id) dw += (v.graph.op(id).flags & kWeightGrad) != 0;
  // Per block: qkv, proj; dense blocks fc1, fc2; MoE blocks the experts.
  EXPECT_EQ(dw, 4 * 2 + 2 * 2 + 2 * 1);
  // One optimizer step, last.
  EXPECT_EQ(v.graph.op(v.graph.size() - 1).Name(), "optimizer.step");
  // Gradient buckets exist (dp = 32) and each waits for gradients.
  EXPECT_GE(CountOps(v, "bwd.grad_allreduce"), 1);
}

// What each op of a whole model computes (op_exec.h), in closed form: the
// dense ops' shapes, the data-parallel collectives' groups and counts, and
// the MoE layer instance (block, piece, tokens) every routed-expert op uses.
TEST(ModelGraph, EveryOpSaysWhatItComputes) {
  for (int mp : {1, 2}) {
    const ModelConfig m = SmallModel(mp);
    const int64_t S = m.micro_batch_size * m.seq_length, M = m.hidden_size, L = m.seq_length;
    const int64_t hp = m.num_attention_heads / mp, d = M / m.num_attention_heads;
    ModelPlanOptions o;
    o.algos = {AllToAllAlgo::kLinear};
    const ModelPlan plan = PlanOrDie(m, RoundNumberModel(), o);
    ASSERT_EQ(plan.variants.size(), 5u);
    for (const VariantPlan& v : plan.variants) {
      SCOPED_TRACE(::testing::Message() << VariantName(v.variant) << " mp " << mp);
      const OpGraph& g = v.graph;
      ASSERT_FALSE(g.layers().empty());
      std::set<int> blocks_with_layers;
      for (OpId id = 0; id < g.size(); ++id) {
        const Op& op = g.op(id);
        const OpExec& x = g.exec(id);
        SCOPED_TRACE(op.Name());
        EXPECT_NE(x.kind, ExecKind::kNone);
        const bool dense = x.kind == ExecKind::kNop || x.kind == ExecKind::kDenseGemm ||
                           x.kind == ExecKind::kDenseMemory || x.in == Buf::kNone;
        if (dense) {
          EXPECT_EQ(x.layer, 0);
          continue;
        }
        // A routed-expert op: its block's instance, for its piece.
        ASSERT_GE(x.layer, 1);
        ASSERT_LE(x.layer, static_cast<int>(g.layers().size()));
        const ExecLayer& l = g.layers()[static_cast<size_t>(x.layer - 1)];
        EXPECT_EQ(l.block, op.block);
        EXPECT_TRUE(m.IsMoeBlock(op.block));
        EXPECT_NE(op.flags & kMoeScope, 0);
        blocks_with_layers.insert(l.block);
        if (op.phase == Phase::kBackward || op.part < 0) {
          EXPECT_EQ(l.part, -1);
          EXPECT_EQ(l.tokens, S);
        } else {
          EXPECT_EQ(l.part, op.part);
          EXPECT_LT(l.tokens, S);
          EXPECT_GE(l.tokens * (op.part + 1), S * op.part / (op.part + 1));
        }
      }
      EXPECT_EQ(blocks_with_layers, (std::set<int>{0, 2}));
      // Dense shapes (whole micro-batches in the backward).
      auto exec_of = [&](std::string_view name) -> OpExec {
        for (OpId id = 0; id < g.size(); ++id) {
          if (g.op(id).Name() == name) return g.exec(id);
        }
        ADD_FAILURE() << "no op " << name;
        return {};
      };
      OpExec x = exec_of("b1.bwd.qkv_dx");
      EXPECT_EQ(x.kind, ExecKind::kDenseGemm);
      EXPECT_EQ(std::make_tuple(x.tokens, x.rows, x.count, x.groups, x.parts),
                std::make_tuple(S, M, 3 * M / mp, 1, 1));
      x = exec_of("b1.bwd.attn_score");
      EXPECT_EQ(std::make_tuple(x.tokens, x.rows, x.count, x.groups, x.parts),
                std::make_tuple(L, d, L, static_cast<int32_t>(m.micro_batch_size * hp), 2));
      x = exec_of("b1.bwd.ln2");
      EXPECT_EQ(x.kind, ExecKind::kDenseMemory);
      EXPECT_EQ(x.count, 3 * S * M);
      x = exec_of("optimizer.step");
      EXPECT_EQ(x.kind, ExecKind::kDenseMemory);
      EXPECT_EQ(x.count * m.bytes_per_element, g.op(g.size() - 1).bytes);
      if (mp > 1) {
        x = exec_of("b1.bwd.fc1_allreduce");
        EXPECT_EQ(std::make_tuple(x.kind, x.group, x.count),
                  std::make_tuple(ExecKind::kAllReduce, ExecGroup::kMp, S * M));
      }
      // Gradient buckets: AllReduce over the dense replicas, count = bytes / e.
      int buckets = 0;
      for (OpId id = 0; id < g.size(); ++id) {
        if (g.op(id).base != "bwd.grad_allreduce") continue;
        ++buckets;
        EXPECT_EQ(g.exec(id).kind, ExecKind::kAllReduce);
        EXPECT_EQ(g.exec(id).group, ExecGroup::kDp);
        EXPECT_EQ(g.exec(id).count * m.bytes_per_element, g.op(id).bytes);
      }
      EXPECT_GE(buckets, 1);
    }
  }
}

TEST(ModelGraph, WithoutCommunicationEveryVariantTakesTheSameTime) {
  ClusterProfile p = RoundNumberProfile();
  // Profiles need beta > 0: 1e-18 us/B makes every collective cost < 1e-9 us.
  p.intra = {0.0, 1e-18};
  p.inter = {0.0, 1e-18};
  const CostModel cost = *CostModel::Create(p);
  for (int mp : {1, 2}) {
    const ModelPlan plan = PlanOrDie(SmallModel(mp), cost);
    ASSERT_EQ(plan.variants.size(), 5u);
    const double none = plan.variants[0].iteration_us();
    for (const VariantPlan& v : plan.variants) {
      EXPECT_NEAR(v.iteration_us(), none, 1e-6 * none) << VariantName(v.variant) << " mp " << mp;
      EXPECT_NEAR(v.sim.exposed_comm_us, 0.0, 1e-6);
    }
  }
}

TEST(ModelGraph, NoPartitionContainsABatchPrioritizedGate) {
  const ModelPlan plan = PlanOrDie(SmallModel(1, Gate::kBatchPrioritized), RoundNumberModel());
  for (const VariantPlan& v : plan.variants) {
    for (OpId id = 0; id < v.graph.size(); ++id) {
      const Op& op = v.graph.op(id);
      if (op.base == "fwd.gate" || op.base == "fwd.order") {
        EXPECT_EQ(op.part, -1) << VariantName(v.variant) << ": " << op.Name();
      }
    }
  }
}

TEST(ModelGraph, VariantsNeverLoseToNoOverlap) {
  for (int mp : {1, 2}) {
    const ModelPlan plan = PlanOrDie(SmallModel(mp), RoundNumberModel());
    const double none = plan.Find(Variant::kNone)->iteration_us();
    for (const VariantPlan& v : plan.variants) {
      EXPECT_LE(v.iteration_us(), none * (1 + 1e-9)) << VariantName(v.variant);
    }
    const VariantPlan& lancet = *plan.Find(Variant::kLancet);
    EXPECT_LT(lancet.iteration_us(), none);
    EXPECT_FALSE(lancet.dw.empty());
    EXPECT_EQ(lancet.layers.size(), 2u);
    // Placed dW ops are issued right after their AlltoAll and overlap it.
    size_t placed = 0;
    for (const DwPlacement& p : lancet.dw) placed += p.dw_ops.size();
    EXPECT_GT(placed, 0u);
  }
}

TEST(ModelGraph, AlternativesCoverEverySchedule) {
  const ModelPlan plan = PlanOrDie(SmallModel(2), RoundNumberModel());
  const VariantPlan& lancet = *plan.Find(Variant::kLancet);
  std::set<Schedule> seen;
  for (const VariantAlternative& a : lancet.alternatives) seen.insert(a.schedule);
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_DOUBLE_EQ(lancet.alternatives.front().iteration_us, lancet.iteration_us());
}

// ---- The layout search's lower bounds (docs/layouts.md "Search") ----

// A variant's backward as the layout search times it: from the forward's end
// to the last op that is not a gradient bucket or the optimizer (ZeRO 2-3:
// the backward's ReduceScatters count).
double BackwardUs(const VariantPlan& v, bool reduce_scatter_in_backward) {
  double end = v.sim.forward_end_us;
  for (OpId id = 0; id < v.graph.size(); ++id) {
    const Op& op = v.graph.op(id);
    if (op.term == Term::kOptimizer) continue;
    if ((op.flags & kGradSync) && !(reduce_scatter_in_backward && op.base.substr(0, 4) == "bwd.")) {
      continue;
    }
    end = std::max(end, v.sim.times[static_cast<size_t>(id)].end_us);
  }
  return end - v.sim.forward_end_us;
}

// SmallModel, with SwiGLU experts and a shared expert when `gated`.
ModelConfig GatedSmallModel(int mp, bool gated) {
  ModelConfig m = SmallModel(mp);
  m.gated_linear_unit = gated;
  m.moe.num_shared_experts = gated ? 1 : 0;
  m.moe.shared_expert_ffn_hidden_size = gated ? 512 : 0;
  return m;
}

// The backward bounded by its dependencies (its dW ops, buckets and gathers
// passed through) is never longer than any variant's backward under any
// ZeRO stage, and never shorter than the busiest resource's: here it is the
// tighter of the two by far, the AlltoAlls and the dX GEMMs waiting on each
// other.
TEST(StageBound, TheBackwardChainBoundsEveryVariant) {
  ModelPlanner planner(RoundNumberModel());
  int tighter = 0;
  for (int mp : {1, 2}) {
    for (bool gated : {false, true}) {
      const ModelConfig m = GatedSmallModel(mp, gated);
      for (int zero : {0, 1, 2, 3}) {
        StageOptions so;
        so.zero_stage = zero;
        ModelPlan plan;
        ASSERT_TRUE(planner.PlanStage(m, {}, so, &plan).ok());
        ModelPlanner::StageBound b;
        ASSERT_TRUE(planner.StageComputeBound(m, {}, so, &b, /*chain=*/true).ok());
        ModelPlanner::StageBound plain;
        ASSERT_TRUE(planner.StageComputeBound(m, {}, so, &plain).ok());
        EXPECT_EQ(plain.chain_bwd_us, plain.bwd_us);
        EXPECT_EQ(plain.bwd_us, b.bwd_us);
        EXPECT_GE(b.chain_bwd_us, b.bwd_us);
        EXPECT_GE(b.rs_bwd_us, plain.rs_bwd_us);
        if (b.chain_bwd_us > 1.2 * b.bwd_us) ++tighter;
        for (const VariantPlan& v : plan.variants) {
          const std::string what =
              Cat(VariantName(v.variant), " mp ", mp, " gated ", gated, " zero ", zero);
          EXPECT_LE(b.chain_bwd_us, BackwardUs(v, false) * (1 + 1e-12)) << what;
          if (zero >= 2) {
            EXPECT_LE(b.rs_bwd_us, BackwardUs(v, true) * (1 + 1e-12)) << what;
          }
        }
      }
    }
  }
  EXPECT_GT(tighter, 0);
}

// ---- The partition's range costs (model_partition.cc) ----

// Each range the partition DP chose reports its time simulated alone: its
// ops, as the plan issues them, with their inputs from before it ready at 0.
// Under ZeRO 3 a range starting at a block holds that block's parameter
// gathers too.
TEST(PartitionRanges, CostIsTheRangeSimulatedAlone) {
  ModelPlanner planner(RoundNumberModel());
  int ranges = 0, gathered = 0;
  for (int mp : {1, 2, 4, 8}) {
    for (int zero : {0, 3}) {
      ModelConfig m = GatedSmallModel(mp, true);
      m.seq_length = 1024;
      m.micro_batch_size = 16;
      StageOptions so;
      so.zero_stage = zero;
      ModelPlanOptions opt;
      opt.variants = {Variant::kPartition};
      ModelPlan plan;
      ASSERT_TRUE(planner.PlanStage(m, opt, so, &plan).ok());
      const VariantPlan& v = plan.variants[0];
      const OpGraph& g = v.graph;
      auto base_name = [&](OpId id) {
        Op op = g.op(id);
        op.part = -1;
        return op.Name();
      };
      for (const PartitionRange& r : v.partitions) {
        const std::string what = Cat("mp ", mp, " zero ", zero, " ", r.first_op, "..", r.last_op);
        OpId first = kNoOp, last = kNoOp;
        for (OpId id = 0; id < g.size() && g.op(id).phase == Phase::kForward; ++id) {
          if (first == kNoOp && base_name(id) == r.first_op) first = id;
          if (first != kNoOp && base_name(id) == r.last_op) last = id;
        }
        ASSERT_NE(first, kNoOp) << what;
        ASSERT_NE(last, kNoOp) << what;
        OpGraph alone;
        std::vector<OpId> deps;
        for (OpId id = first; id <= last; ++id) {
          deps.clear();
          for (OpId d : g.deps(id)) {
            if (d >= first) deps.push_back(d - first);
          }
          alone.Add(g.op(id), deps);
          if (g.op(id).flags & kPrefetch) ++gathered;
        }
        Simulator sim;
        SimResult res;
        ASSERT_TRUE(sim.Schedule(alone, &res).ok()) << what;
        EXPECT_EQ(res.makespan_us, r.us) << what;
        ++ranges;
      }
    }
  }
  EXPECT_GT(ranges, 8);
  EXPECT_GT(gathered, 0);  // ZeRO 3's gathers were inside some range
}

// ---- The backward's blocks (model_backward.cc) ----

// Blocks of a kind after the first are copied from it: in every variant's
// graph each block's layer instances name it and its AlltoAll slots carry
// its number once; issued in their natural order (no dW placement), each
// block's backward ops are the first's of its kind (names, costs,
// resources, flags) under its own number.
TEST(BackwardBlocks, CopiesAreTheirBlocksOwn) {
  ModelPlanner planner(RoundNumberModel());
  for (bool sp : {false, true}) {
    for (int zero : {0, 3}) {
      ModelConfig m = GatedSmallModel(2, true);
      m.num_layers = 6;  // MoE every other block
      m.parallel.sequence_parallel = sp;
      StageOptions so;
      so.zero_stage = zero;
      ModelPlan plan;
      ASSERT_TRUE(planner.PlanStage(m, ModelPlanOptions{}, so, &plan).ok());
      for (const VariantPlan& v : plan.variants) {
        const std::string what = Cat("sp ", sp, " zero ", zero, " ", VariantName(v.variant));
        const OpGraph& g = v.graph;
        std::vector<std::vector<OpId>> ops(6);
        for (OpId id = 0; id < g.size(); ++id) {
          const Op& op = g.op(id);
          if (op.phase == Phase::kBackward && op.block >= 0 && op.block < 6) {
            ops[static_cast<size_t>(op.block)].push_back(id);
          }
          const int16_t layer = g.exec(id).layer;
          if (layer > 0) {
            ASSERT_LE(static_cast<size_t>(layer), g.layers().size()) << what;
            EXPECT_EQ(g.layers()[static_cast<size_t>(layer) - 1].block, op.block)
                << what << " " << op.Name();
          }
        }
        // dW placement moves dW ops block by block differently: compare the
        // natural issue order only.
        const bool placed = v.variant == Variant::kDw || v.variant == Variant::kLancet;
        for (int b = 2; b < 6 && !placed; ++b) {
          const std::vector<OpId>& want = ops[static_cast<size_t>(b % 2)];
          const std::vector<OpId>& got = ops[static_cast<size_t>(b)];
          ASSERT_EQ(got.size(), want.size()) << what << " block " << b;
          for (size_t i = 0; i < got.size(); ++i) {
            const Op& x = g.op(got[i]);
            const Op& y = g.op(want[i]);
            EXPECT_EQ(x.base, y.base) << what << " block " << b << " op " << i;
            EXPECT_EQ(x.step, y.step) << what << " " << x.Name();
            EXPECT_EQ(x.cost_us, y.cost_us) << what << " " << x.Name();
            EXPECT_EQ(x.resources, y.resources) << what << " " << x.Name();
            EXPECT_EQ(x.flags, y.flags) << what << " " << x.Name();
          }
        }
        std::set<std::string> slots;
        for (const DwPlacement& d : v.dw) {
          EXPECT_TRUE(slots.insert(d.alltoall).second) << what << " " << d.alltoall;
          ASSERT_EQ(d.alltoall.rfind("b", 0), 0u) << what << " " << d.alltoall;
          EXPECT_TRUE(m.IsMoeBlock(d.alltoall[1] - '0')) << what << " " << d.alltoall;
        }
      }
    }
  }
}

// ---- Planning only the fastest (docs/model.md) ----

// The fastest-only plan (one whole graph per dW kind and pair, the other
// forwards alone, sums simulated whole near the least) is the plan
// every-variant planning ranks first: the same variant, pair, degree, graph
// and times, under every ZeRO stage, stage position and variant set.
TEST(FastestOnly, PicksWhatEveryVariantPlanningPicks) {
  ModelPlanner planner(RoundNumberModel());
  const std::vector<std::vector<Variant>> sets = {{},
                                                  {Variant::kLancet},
                                                  {Variant::kNone, Variant::kTutel},
                                                  {Variant::kPartition, Variant::kDw}};
  int cases = 0;
  for (int mp : {1, 2}) {
    for (bool gated : {false, true}) {
      const ModelConfig m = GatedSmallModel(mp, gated);
      for (int zero : {0, 1, 2, 3}) {
        for (int part = 0; part < 3; ++part) {
          StageOptions so;
          so.zero_stage = zero;
          if (part == 1) so.end_block = m.num_layers / 2, so.head = false;
          if (part == 2) so.first_block = m.num_layers / 2, so.embed = false;
          for (const std::vector<Variant>& set : sets) {
            ModelPlanOptions opt;
            opt.variants = set;
            ModelPlan every, fastest, checked;
            ASSERT_TRUE(planner.PlanStage(m, opt, so, &every).ok());
            ASSERT_TRUE(
                planner.PlanStage(m, opt, so, &fastest, ModelPlanner::Scope::kFastestOnly).ok());
            // Every sum it adds up equals its graph simulated whole.
            const absl::Status sums =
                planner.PlanStage(m, opt, so, &checked, ModelPlanner::Scope::kFastestOnlyChecked);
            ASSERT_TRUE(sums.ok()) << sums;
            EXPECT_EQ(checked.variants[0].sim.makespan_us, fastest.variants[0].sim.makespan_us);
            const std::string what = Cat("mp ", mp, " gated ", gated, " zero ", zero, " part ",
                                         part, " variants ", set.size());
            ASSERT_EQ(fastest.variants.size(), 1u) << what;
            EXPECT_EQ(fastest.best, 0) << what;
            const VariantPlan& want = every.variants[static_cast<size_t>(every.best)];
            const VariantPlan& got = fastest.variants[0];
            EXPECT_EQ(got.variant, want.variant) << what;
            EXPECT_EQ(got.schedule, want.schedule) << what;
            EXPECT_EQ(got.algo, want.algo) << what;
            EXPECT_EQ(got.tutel_degree, want.tutel_degree) << what;
            EXPECT_EQ(got.sim.makespan_us, want.sim.makespan_us) << what;
            EXPECT_EQ(got.sim.forward_end_us, want.sim.forward_end_us) << what;
            EXPECT_EQ(got.sim.critical_path, want.sim.critical_path) << what;
            EXPECT_EQ(got.graph.size(), want.graph.size()) << what;
            EXPECT_EQ(got.layers.size(), want.layers.size()) << what;
            EXPECT_EQ(got.partitions.size(), want.partitions.size()) << what;
            EXPECT_EQ(got.dw.size(), want.dw.size()) << what;
            EXPECT_TRUE(got.alternatives.empty()) << what;
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 2 * 2 * 4 * 3 * 4);
}

// ---- The memory bound (docs/model.md "Memory bound") ----

// 1,024 MoE blocks with S1/S2 over an EP group of 4,096: each SAA has a step
// per peer, so one stage graph would be ~10^8 ops and dW placement's
// reachability (backward ops squared) far more; before the bound this
// allocated until std::bad_alloc. The estimate refuses it from the units,
// before any graph is built.
ModelConfig HugeStage() {
  ModelConfig m = SmallModel(8);
  m.num_layers = 1024;
  m.moe.layer_freq = 1;
  m.moe.num_experts = 4096;
  m.micro_batch_size = 1;
  m.parallel = {.mp = 8, .ep = 4096, .esp = 8, .dp = 4096, .pp = 1};
  return m;
}

TEST(ModelMemory, AStageOverTheBoundIsRefusedBeforeItIsBuilt) {
  ModelPlanner planner(RoundNumberModel());
  ModelPlan plan;
  const absl::Status s = planner.PlanStage(HugeStage(), {}, StageOptions{}, &plan);
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(std::string(s.message()).rfind("max_plan_bytes: a plan of 1024 blocks would hold ~", 0),
            0u)
      << s;
  const std::string bound = FormatBytes(static_cast<double>(ModelPlanOptions{}.max_plan_bytes));
  EXPECT_NE(std::string(s.message()).find("over the bound of " + bound + ";"), std::string::npos)
      << s;
  // The search's lower bound builds unsplit graphs of every schedule: refused too.
  ModelPlanner::StageBound b;
  EXPECT_EQ(planner.StageComputeBound(HugeStage(), {}, StageOptions{}, &b).code(),
            absl::StatusCode::kResourceExhausted);
  // The planner is still usable afterwards.
  EXPECT_TRUE(planner.Plan(SmallModel(2), {}, &plan).ok());
}

TEST(ModelMemory, TheBoundIsAnOptionAndJustUnderItIsRefused) {
  ModelPlanner planner(RoundNumberModel());
  ModelPlan plan;
  ModelPlanOptions o;
  ASSERT_TRUE(planner.Plan(SmallModel(2), o, &plan).ok());
  ASSERT_TRUE(planner.CheckStage(SmallModel(2), o, StageOptions{}).ok());
  // The small model's estimate is a few MiB: a 1 MiB bound refuses it, the
  // same answer from CheckStage (nothing built) and Plan.
  o.max_plan_bytes = int64_t{1} << 20;
  const absl::Status check = planner.CheckStage(SmallModel(2), o, StageOptions{});
  ASSERT_EQ(check.code(), absl::StatusCode::kResourceExhausted) << check;
  EXPECT_EQ(planner.Plan(SmallModel(2), o, &plan), check);
  // Fewer variants hold fewer graphs and no reachability matrix.
  o.variants = {Variant::kNone};
  o.max_plan_bytes = 2 << 20;
  EXPECT_TRUE(planner.Plan(SmallModel(2), o, &plan).ok());
  o.max_plan_bytes = (int64_t{1} << 20) - 1;
  EXPECT_EQ(ValidateModelPlanOptions(o).message(),
            "max_plan_bytes: must be between 1 MiB and 2^40 (got 1048575)");
}

TEST(ModelGraph, RejectsBadConfigsNamingTheField) {
  const ClusterShape c{4, 8};
  struct Case {
    std::function<void(ModelConfig&)> edit;
    std::string field;
  } cases[] = {
      {[](ModelConfig& m) { m.num_layers = 0; }, "num_layers:"},
      {[](ModelConfig& m) { m.num_attention_heads = 7; }, "num_attention_heads:"},
      {[](ModelConfig& m) { m.moe.num_experts = 48; }, "parallel.ep:"},
      {[](ModelConfig& m) { m.moe.top_k = 2; }, "moe.top_k:"},
      {[](ModelConfig& m) { m.moe.layer_freq = 0; }, "moe.layer_freq:"},
      {[](ModelConfig& m) { m.micro_batch_size = 0; }, "micro_batch_size:"},
      {[](ModelConfig& m) { m.moe.capacity_factor = -1; }, "moe.capacity_factor:"},
  };
  for (const Case& k : cases) {
    ModelConfig m = SmallModel();
    k.edit(m);
    const absl::Status s = ValidateModel(m, c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(s.message()).rfind(k.field, 0), 0u) << s;
  }
  EXPECT_TRUE(ValidateModel(SmallModel(), c).ok());
}

}  // namespace
// ---- The range-cost cache's key ----

// ModelPlanner caches range costs under a hash of the whole ModelConfig
// (model.h's AbslHashValue: a structured binding per struct, so a field
// added without it does not compile). Every field must move the hash.
TEST(ModelConfigHash, EveryFieldMovesTheHash) {
  const std::function<void(ModelConfig&)> edits[] = {
      [](ModelConfig& m) { m.name += "x"; },
      [](ModelConfig& m) { m.num_layers += 2; },
      [](ModelConfig& m) { m.hidden_size *= 2; },
      [](ModelConfig& m) { m.num_attention_heads *= 2; },
      [](ModelConfig& m) { m.ffn_hidden_size *= 2; },
      [](ModelConfig& m) { m.seq_length *= 2; },
      [](ModelConfig& m) { m.micro_batch_size *= 2; },
      [](ModelConfig& m) { m.vocab_size = 512; },
      [](ModelConfig& m) { m.bytes_per_element = 4; },
      [](ModelConfig& m) { m.moe.layer_freq = 1; },
      [](ModelConfig& m) { m.moe.num_experts *= 2; },
      [](ModelConfig& m) { m.moe.top_k = 2; },
      [](ModelConfig& m) { m.moe.capacity_factor = 1.25; },
      [](ModelConfig& m) { m.moe.expert_ffn_hidden_size *= 2; },
      [](ModelConfig& m) { m.moe.shared_expert_ffn_hidden_size = 512; },
      [](ModelConfig& m) { m.moe.gate = Gate::kTopK; },
      [](ModelConfig& m) { m.parallel.mp = 2; },
      [](ModelConfig& m) { m.parallel.ep = 16; },
      [](ModelConfig& m) { m.parallel.esp = 2; },
      [](ModelConfig& m) { m.parallel.dp = 16; },
      [](ModelConfig& m) { m.parallel.pp = 2; },
      [](ModelConfig& m) { m.global_batch_size = 512; },
      [](ModelConfig& m) {
        m.moe.layer_pattern = {1, 0};
      },
      [](ModelConfig& m) { m.moe.num_shared_experts = 2; },
      [](ModelConfig& m) { m.moe.shared_expert_gate = true; },
      [](ModelConfig& m) { m.moe.router_num_groups = 4; },
      [](ModelConfig& m) { m.moe.router_group_topk = 2; },
      [](ModelConfig& m) { m.moe.dropless = true; },
      [](ModelConfig& m) { m.moe.token_skew = 1.5; },
      [](ModelConfig& m) { m.moe.router_force_load_balancing = true; },
      [](ModelConfig& m) { m.num_query_groups = 2; },
      [](ModelConfig& m) { m.kv_channels = 128; },
      [](ModelConfig& m) { m.gated_linear_unit = true; },
      [](ModelConfig& m) { m.multi_latent_attention = true; },
      [](ModelConfig& m) { m.mla.q_lora_rank = 64; },
      [](ModelConfig& m) { m.mla.kv_lora_rank = 64; },
      [](ModelConfig& m) { m.mla.qk_head_dim = 64; },
      [](ModelConfig& m) { m.mla.qk_pos_emb_head_dim = 32; },
      [](ModelConfig& m) { m.mla.v_head_dim = 64; },
      [](ModelConfig& m) { m.untie_embeddings_and_output_weights = true; },
      [](ModelConfig& m) { m.mtp_num_layers = 1; },
      [](ModelConfig& m) { m.add_qkv_bias = true; },
      [](ModelConfig& m) { m.normalization = Normalization::kRmsNorm; },
      [](ModelConfig& m) { m.qk_layernorm = true; },
      [](ModelConfig& m) { m.add_bias_linear = false; },
      [](ModelConfig& m) { m.position_embedding_type = PositionEmbedding::kRope; },
      [](ModelConfig& m) { m.attention_backend = AttentionBackend::kFlash; },
  };
  const ModelConfig base = SmallModel();
  std::set<size_t> seen = {absl::HashOf(base)};
  for (size_t i = 0; i < std::size(edits); ++i) {
    ModelConfig m = base;
    edits[i](m);
    EXPECT_TRUE(seen.insert(absl::HashOf(m)).second) << "edit " << i << " left the hash unmoved";
  }
}

// One planner reused across models that differ in a single field plans each
// as a fresh planner does: no range cost of one is served to the other.
TEST(ModelConfigHash, AReusedPlannerPlansLikeAFreshOne) {
  const std::function<void(ModelConfig&)> edits[] = {
      [](ModelConfig& m) { m.moe.capacity_factor = 2.0; },
      [](ModelConfig& m) {
        m.moe.shared_expert_ffn_hidden_size = 512;
        m.moe.num_shared_experts = 1;  // the planner's struct has no default for it
      },
      [](ModelConfig& m) { m.moe.gate = Gate::kTopK; },
      [](ModelConfig& m) { m.ffn_hidden_size = 2048; },
      [](ModelConfig& m) { m.bytes_per_element = 4; },
      [](ModelConfig& m) { m.gated_linear_unit = true; },
      [](ModelConfig& m) { m.num_query_groups = 2; },
      [](ModelConfig& m) { m.attention_backend = AttentionBackend::kFlash; },
      [](ModelConfig& m) { m.add_bias_linear = false; },
  };
  ModelPlanner reused(RoundNumberModel());
  ModelPlan plan;
  ASSERT_TRUE(reused.Plan(SmallModel(), {}, &plan).ok());
  for (size_t i = 0; i < std::size(edits); ++i) {
    ModelConfig m = SmallModel();
    edits[i](m);
    ModelPlan again;
    ASSERT_TRUE(reused.Plan(m, {}, &again).ok()) << i;
    const ModelPlan fresh = PlanOrDie(m, RoundNumberModel());
    ASSERT_EQ(again.variants.size(), fresh.variants.size());
    for (size_t v = 0; v < fresh.variants.size(); ++v) {
      EXPECT_EQ(again.variants[v].iteration_us(), fresh.variants[v].iteration_us())
          << "edit " << i << ", " << VariantName(fresh.variants[v].variant);
      EXPECT_EQ(again.variants[v].partitions.size(), fresh.variants[v].partitions.size());
    }
  }
}

}  // namespace moeplan::planner
