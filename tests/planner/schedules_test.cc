// Invariants of the MP+EP+ESP schedules (docs/schedules.md): traffic reduction of S1/S2,
// op sequences, the SAA pipeline against its closed form, backward duals, the
// planner's ranking and explanation, and token skew.
#include "moeplan/planner/schedules.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "moeplan/base/strings.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/planner.h"
#include "moeplan/planner/simulator.h"
#include "moeplan/planner/types.h"
#include "test_profile.h"

namespace moeplan::planner {
namespace {

using testing::RoundNumberModel;
using testing::RoundNumberProfile;
const CostModel& Model() { return RoundNumberModel(); }
ClusterProfile MakeProfile() { return RoundNumberProfile(); }

using ::testing::ElementsAreArray;

LayerConfig MakeLayer(int mp, int ep, int esp, int dp) {
  return testing::SmallLayer(mp, ep, esp, dp);
}
constexpr int64_t kD = 1048576;
constexpr int64_t kX = 524288;

LayerContext Context(const LayerConfig& l) {
  LayerContext ctx;
  ctx.layer = &l;
  ctx.cost = &Model();
  ctx.topo = MakeTopology(l.parallel, Model().profile().shape);
  return ctx;
}

OpGraph Build(Schedule s, const LayerConfig& l) {
  OpGraph g;
  const absl::Status st = BuildSchedule(s, Context(l), &g);
  EXPECT_TRUE(st.ok()) << st;
  return g;
}

SimResult Simulate(const OpGraph& g) {
  Simulator sim;
  SimResult r;
  const absl::Status st = sim.Run(g, &r);
  EXPECT_TRUE(st.ok()) << st;
  return r;
}

std::vector<std::string> Names(const OpGraph& g, Phase phase) {
  std::vector<std::string> out;
  for (OpId v = 0; v < g.size(); ++v) {
    if (g.op(v).phase == phase) out.push_back(g.op(v).Name());
  }
  return out;
}

OpId Find(const OpGraph& g, const std::string& name) {
  for (OpId v = 0; v < g.size(); ++v) {
    if (g.op(v).Name() == name) return v;
  }
  return kNoOp;
}

bool HasEdge(const OpGraph& g, OpId from, OpId to) { return g.HasDep(from, to); }

int CountContaining(const OpGraph& g, const std::string& part) {
  int n = 0;
  for (OpId v = 0; v < g.size(); ++v) n += g.op(v).Name().find(part) != std::string::npos;
  return n;
}

// ---------------------------------------------------------------------------
// Topology.

TEST(TopologyTest, GroupShapes) {
  EXPECT_EQ(ShapeOfGroup(1, 4, 8), (GroupShape{1, 1}));
  EXPECT_EQ(ShapeOfGroup(4, 1, 8), (GroupShape{4, 1}));
  EXPECT_EQ(ShapeOfGroup(16, 1, 8), (GroupShape{16, 2}));
  EXPECT_EQ(ShapeOfGroup(8, 4, 8), (GroupShape{8, 4}));  // ranks 0,4,...,28
  EXPECT_EQ(ShapeOfGroup(4, 8, 8), (GroupShape{4, 4}));  // one rank per node
  EXPECT_EQ(ShapeOfGroup(2, 4, 8), (GroupShape{2, 1}));  // ranks 0,4

  const ClusterShape c{4, 8};
  Topology t = MakeTopology({.mp = 4, .ep = 8, .esp = 4, .dp = 8}, c);
  EXPECT_EQ(t.mp, (GroupShape{4, 1}));
  EXPECT_EQ(t.esp, (GroupShape{4, 1}));
  EXPECT_EQ(t.ep, (GroupShape{8, 4}));
  EXPECT_EQ(t.ep_ranks_per_node, 2);
  t = MakeTopology({.mp = 8, .ep = 4, .esp = 8, .dp = 4}, c);
  EXPECT_EQ(t.ep, (GroupShape{4, 4}));
  EXPECT_EQ(t.ep_ranks_per_node, 1);
  t = MakeTopology({.mp = 2, .ep = 16, .esp = 2, .dp = 16}, c);
  EXPECT_EQ(t.ep, (GroupShape{16, 4}));
  EXPECT_EQ(t.ep_ranks_per_node, 4);
  t = MakeTopology({.mp = 2, .ep = 4, .esp = 2, .dp = 4}, c);
  EXPECT_EQ(t.ep, (GroupShape{4, 1}));
  EXPECT_EQ(t.ep_ranks_per_node, 4);
  t = MakeTopology({.mp = 2, .ep = 2, .esp = 2, .dp = 2}, c);  // ranks 0, 2 on node 0
  EXPECT_EQ(t.ep, (GroupShape{2, 1}));
  EXPECT_EQ(t.ep_ranks_per_node, 2);
  t = MakeTopology({.mp = 16, .ep = 2, .esp = 16, .dp = 2}, c);
  EXPECT_EQ(t.mp, (GroupShape{16, 2}));
  EXPECT_EQ(t.ep, (GroupShape{2, 2}));
  EXPECT_EQ(t.ep_ranks_per_node, 1);
}

// ---------------------------------------------------------------------------
// (a) S1 and S2 send 1/N of default's inter-node bytes.

struct TrafficCase {
  int mp, ep, esp, dp;
  int64_t default_inter;  // hand-computed
};

// Default: four AlltoAlls of D, each sending D*(W - ranks_per_node)/W across nodes.
//   mp=esp=4, ep=8 (EP {8,4}, 2 per node): 4 * 1048576 * 6/8 = 3145728
//   mp=esp=8, ep=4 (EP {4,4}, 1 per node): 4 * 1048576 * 3/4 = 3145728
//   mp=esp=2, ep=16 (EP {16,4}, 4 per node): 4 * 1048576 * 12/16 = 3145728
//   mp=esp=4, ep=4, dp=4 on 2 nodes (EP {4,2}): 4 * 1048576 * 2/4 = 2097152
TEST(SchedulesTest, S1AndS2SendOneNthOfDefaultsInterNodeBytes) {
  const TrafficCase cases[] = {
      {4, 8, 4, 8, 3145728}, {8, 4, 8, 4, 3145728}, {2, 16, 2, 16, 3145728}, {4, 4, 4, 4, 2097152}};
  for (const TrafficCase& c : cases) {
    SCOPED_TRACE(Cat("mp=", c.mp, " ep=", c.ep));
    const LayerConfig l = MakeLayer(c.mp, c.ep, c.esp, c.dp);
    const SimResult def = Simulate(Build(Schedule::kDefault, l));
    const SimResult s1 = Simulate(Build(Schedule::kS1, l));
    const SimResult s2 = Simulate(Build(Schedule::kS2, l));
    EXPECT_EQ(def.inter_node_bytes, c.default_inter);
    EXPECT_EQ(s1.inter_node_bytes * c.mp, def.inter_node_bytes);
    EXPECT_EQ(s2.inter_node_bytes * c.mp, def.inter_node_bytes);
    EXPECT_EQ(s1.inter_node_bytes, c.default_inter / c.mp);
    EXPECT_EQ(s2.inter_node_bytes, c.default_inter / c.mp);
  }
}

TEST(SchedulesTest, NoInterNodeBytesInsideOneNode) {
  const LayerConfig l = MakeLayer(2, 4, 2, 4);  // 8 ranks on node 0
  for (Schedule s : kAllSchedules) {
    SCOPED_TRACE(std::string(ScheduleName(s)));
    const OpGraph g = Build(s, l);
    EXPECT_EQ(Simulate(g).inter_node_bytes, 0);
    for (OpId v = 0; v < g.size(); ++v) {
      EXPECT_EQ(g.op(v).resources & kInter, 0) << g.op(v).Name();
    }
  }
}

// ---------------------------------------------------------------------------
// (b) Op sequences in issue order. Layout mp = esp = 4, ep = W = 4, dp = 4 (16 ranks
// on 2 nodes; EP group {4,2}).

LayerConfig SequenceLayer() { return MakeLayer(4, 4, 4, 4); }

TEST(SchedulesTest, DefaultOpSequence) {
  const OpGraph g = Build(Schedule::kDefault, SequenceLayer());
  EXPECT_THAT(Names(g, Phase::kForward),
              ElementsAreArray({"fwd.gate", "fwd.order", "fwd.ep_alltoall_dispatch", "fwd.expert",
                                "fwd.esp_allreduce", "fwd.ep_alltoall_combine", "fwd.iorder"}));
  EXPECT_THAT(
      Names(g, Phase::kBackward),
      ElementsAreArray({"bwd.iorder", "bwd.ep_alltoall_combine", "bwd.expert_dx", "bwd.expert_dw",
                        "bwd.esp_allreduce", "bwd.ep_alltoall_dispatch", "bwd.order", "bwd.gate"}));
  // Forward ops are all issued before backward ops.
  EXPECT_EQ(g.size(), 15);
  for (OpId v = 0; v < 7; ++v) EXPECT_EQ(g.op(v).phase, Phase::kForward);
}

TEST(SchedulesTest, S1OpSequence) {
  const OpGraph g = Build(Schedule::kS1, SequenceLayer());
  EXPECT_THAT(Names(g, Phase::kForward),
              ElementsAreArray({"fwd.mp_split", "fwd.gate", "fwd.order", "fwd.ep_alltoall_dispatch",
                                "fwd.esp_allgather", "fwd.expert", "fwd.esp_reducescatter",
                                "fwd.ep_alltoall_combine", "fwd.iorder", "fwd.mp_allgather"}));
  EXPECT_THAT(Names(g, Phase::kBackward),
              ElementsAreArray({"bwd.mp_split", "bwd.iorder", "bwd.ep_alltoall_combine",
                                "bwd.esp_allgather", "bwd.expert_dx", "bwd.expert_dw",
                                "bwd.esp_reducescatter", "bwd.ep_alltoall_dispatch", "bwd.order",
                                "bwd.gate", "bwd.mp_allreduce_gate", "bwd.mp_allgather"}));
}

TEST(SchedulesTest, S2OpSequenceInterleavesSaaSteps) {
  const OpGraph g = Build(Schedule::kS2, SequenceLayer());
  // schedules.cc: "Issue order a2a.1, allgather.0, a2a.2, allgather.1, ..." then the
  // last chunk's gather; the dual issues rs.i before a2a.i and reduces chunk 0 last.
  EXPECT_THAT(Names(g, Phase::kForward), ElementsAreArray({"fwd.gate",
                                                           "fwd.order",
                                                           "fwd.mp_split",
                                                           "fwd.saa_dispatch.alltoall.1",
                                                           "fwd.saa_dispatch.allgather.0",
                                                           "fwd.saa_dispatch.alltoall.2",
                                                           "fwd.saa_dispatch.allgather.1",
                                                           "fwd.saa_dispatch.alltoall.3",
                                                           "fwd.saa_dispatch.allgather.2",
                                                           "fwd.saa_dispatch.allgather.3",
                                                           "fwd.expert",
                                                           "fwd.esp_reducescatter",
                                                           "fwd.saa_combine.alltoall.1",
                                                           "fwd.saa_combine.allgather.0",
                                                           "fwd.saa_combine.alltoall.2",
                                                           "fwd.saa_combine.allgather.1",
                                                           "fwd.saa_combine.alltoall.3",
                                                           "fwd.saa_combine.allgather.2",
                                                           "fwd.saa_combine.allgather.3",
                                                           "fwd.iorder"}));
  EXPECT_THAT(Names(g, Phase::kBackward), ElementsAreArray({"bwd.iorder",
                                                            "bwd.mp_split",
                                                            "bwd.saa_combine.alltoall.1",
                                                            "bwd.saa_combine.allgather.0",
                                                            "bwd.saa_combine.alltoall.2",
                                                            "bwd.saa_combine.allgather.1",
                                                            "bwd.saa_combine.alltoall.3",
                                                            "bwd.saa_combine.allgather.2",
                                                            "bwd.saa_combine.allgather.3",
                                                            "bwd.expert_dx",
                                                            "bwd.expert_dw",
                                                            "bwd.saa_dispatch.reducescatter.1",
                                                            "bwd.saa_dispatch.alltoall.1",
                                                            "bwd.saa_dispatch.reducescatter.2",
                                                            "bwd.saa_dispatch.alltoall.2",
                                                            "bwd.saa_dispatch.reducescatter.3",
                                                            "bwd.saa_dispatch.alltoall.3",
                                                            "bwd.saa_dispatch.reducescatter.0",
                                                            "bwd.mp_allgather",
                                                            "bwd.order",
                                                            "bwd.gate"}));
}

// The SAA dispatch with W = 8 (mp = esp = 4, ep = 8 over 4 nodes): a2a.1..7 and
// allgather.0..7 interleaved, with the data dependencies of the pipeline.
TEST(SchedulesTest, S2SaaDispatchStepsAndDependencies) {
  const OpGraph g = Build(Schedule::kS2, MakeLayer(4, 8, 4, 8));
  constexpr int kW = 8;
  std::vector<std::string> want;
  for (int i = 1; i < kW; ++i) {
    want.push_back(Cat("fwd.saa_dispatch.alltoall.", i));
    want.push_back(Cat("fwd.saa_dispatch.allgather.", i - 1));
  }
  want.push_back(Cat("fwd.saa_dispatch.allgather.", kW - 1));
  std::vector<std::string> got;
  for (const std::string& n : Names(g, Phase::kForward)) {
    if (n.rfind("fwd.saa_dispatch.", 0) == 0) got.push_back(n);
  }
  EXPECT_THAT(got, ElementsAreArray(want));

  // dn = D/4 = 262144; chunk 32768 per step; the gather chunk dn/W = 32768 too.
  const OpId split = Find(g, "fwd.mp_split");
  ASSERT_NE(split, kNoOp);
  for (int i = 0; i < kW; ++i) {
    SCOPED_TRACE(i);
    const OpId ag = Find(g, Cat("fwd.saa_dispatch.allgather.", i));
    ASSERT_NE(ag, kNoOp);
    EXPECT_EQ(g.op(ag).resources, kIntra);
    EXPECT_EQ(g.op(ag).term, Term::kAllGather);
    EXPECT_EQ(g.op(ag).bytes, 32768);
    EXPECT_EQ(g.op(ag).inter_node_bytes, 0);
    // AllGather {4,1} of 32768 B: 3*(2 + 32.768) = 104.304.
    EXPECT_REL(g.op(ag).cost_us, 104.304);
    if (i == 0) {
      EXPECT_TRUE(HasEdge(g, split, ag));  // the local chunk needs no exchange
    } else {
      EXPECT_TRUE(HasEdge(g, Find(g, Cat("fwd.saa_dispatch.alltoall.", i)), ag));
      EXPECT_TRUE(HasEdge(g, Find(g, Cat("fwd.saa_dispatch.allgather.", i - 1)), ag));
    }
  }
  for (int i = 1; i < kW; ++i) {
    SCOPED_TRACE(i);
    const OpId a2a = Find(g, Cat("fwd.saa_dispatch.alltoall.", i));
    ASSERT_NE(a2a, kNoOp);
    EXPECT_EQ(g.op(a2a).resources, kInter);
    EXPECT_EQ(g.op(a2a).term, Term::kAllToAll);
    EXPECT_EQ(g.op(a2a).bytes, 32768);
    // Peers 1 (rank 4) is on node 0, peers 2..7 are off-node (2 EP ranks per node).
    EXPECT_EQ(g.op(a2a).inter_node_bytes, i >= 2 ? 32768 : 0);
    // SendRecv {2,2} of 32768 B: 10 + 327.68 = 337.68.
    EXPECT_REL(g.op(a2a).cost_us, 337.68);
    EXPECT_TRUE(
        HasEdge(g, i == 1 ? split : Find(g, Cat("fwd.saa_dispatch.alltoall.", i - 1)), a2a));
  }
  // The expert waits for the last gather.
  EXPECT_TRUE(HasEdge(g, Find(g, "fwd.saa_dispatch.allgather.7"), Find(g, "fwd.expert")));
}

// ---------------------------------------------------------------------------
// (c), (d) SAA alone against the sequential AlltoAll + AllGather pair.

struct SaaTimes {
  double saa, sequential;
};

// SAA over an inter-node group of W ranks (one per node) with an intra gather over
// `gather` ranks, against one AlltoAll of a2a_bytes then one AllGather of
// W * chunk bytes.
SaaTimes CompareSaa(const CostModel& cost, int w, int gather, double a2a_bytes, double gather_chunk,
                    OpGraph* saa_graph = nullptr) {
  const GroupShape a2a{w, w};
  const GroupShape ag{gather, 1};
  OpGraph saa;
  const OpId last =
      AppendSaa(cost, a2a, 1, ag, a2a_bytes, gather_chunk, Phase::kForward, kNoOp, &saa);
  const SimResult rs = Simulate(saa);
  EXPECT_EQ(last, saa.size() - 1);
  EXPECT_DOUBLE_EQ(rs.times[last].end_us, rs.makespan_us);

  OpGraph seq;
  Op op;
  op.base = "alltoall";
  op.kind = OpKind::kComm;
  op.term = Term::kAllToAll;
  op.resources = kInter;
  op.cost_us = cost.CollectiveUs(Collective::kAllToAll, a2a, a2a_bytes);
  const OpId first = seq.Add(op, {});
  op.base = "allgather";
  op.term = Term::kAllGather;
  op.resources = kIntra;
  op.cost_us = cost.CollectiveUs(Collective::kAllGather, ag, w * gather_chunk);
  seq.Add(op, {first});
  const SimResult rq = Simulate(seq);
  if (saa_graph) *saa_graph = saa;
  return {rs.makespan_us, rq.makespan_us};
}

// a = SendRecv {2,2} of 4000/4 = 1000 B = 10 + 10 = 20; g = AllGather {2,1} of 18000 B =
// 2 + 18 = 20. SAA: W*g = (W-1)*max(a,g) + g = 80. Sequential: AlltoAll {4,4} of 4000 B
// = 3*(10 + 10) = 60, then AllGather {2,1} of 72000 B = 2 + 72 = 74: 134.
TEST(SaaTest, EqualStepCostsBeatTheSequentialPair) {
  OpGraph g;
  const SaaTimes t = CompareSaa(Model(), 4, 2, 4000, 18000, &g);
  EXPECT_REL(t.saa, 80.0);
  EXPECT_REL(t.sequential, 134.0);
  EXPECT_LT(t.saa, t.sequential);

  // The whole timeline: a2a.i on inter [20(i-1), 20i]; allgather.i on intra [20i, 20i+20].
  const SimResult r = Simulate(g);
  std::vector<std::string> names;
  for (OpId v = 0; v < g.size(); ++v) names.push_back(g.op(v).Name());
  EXPECT_THAT(names, ElementsAreArray({"saa.alltoall.1", "saa.allgather.0", "saa.alltoall.2",
                                       "saa.allgather.1", "saa.alltoall.3", "saa.allgather.2",
                                       "saa.allgather.3"}));
  const double want[][2] = {{0, 20}, {0, 20}, {20, 40}, {20, 40}, {40, 60}, {40, 60}, {60, 80}};
  for (OpId v = 0; v < g.size(); ++v) {
    SCOPED_TRACE(names[v]);
    EXPECT_REL(r.times[v].start_us, want[v][0]);
    EXPECT_REL(r.times[v].end_us, want[v][1]);
  }
  EXPECT_REL(r.comm_busy_us, 80.0);
  EXPECT_EQ(r.inter_node_bytes, 3 * 1000);  // every step leaves the node
}

struct SaaCase {
  int w, gather;
  double a2a_bytes, gather_chunk;
};

// Closed form: (W-1)*max(a,g) + g when a >= g, W*g when a <= g.
TEST(SaaTest, MatchesTheClosedForm) {
  const SaaCase cases[] = {
      {4, 2, 4000, 18000},    // a = g = 20
      {4, 2, 40000, 1000},    // a = 10 + 100 = 110 > g = 3
      {8, 4, 80000, 100},     // a = 110 > g = 3*(2.1) = 6.3
      {4, 8, 400, 10000},     // a = 11 < g = 7*12 = 84
      {2, 2, 1000, 5000},     // a = 15 > g = 7
      {16, 8, 1.6e6, 50000},  // a = 10 + 1000 = 1010 > g = 7*52 = 364
      {3, 4, 300, 3e5},       // a = 11 < g = 3*302 = 906
  };
  for (const SaaCase& c : cases) {
    SCOPED_TRACE(Cat("W=", c.w, " N=", c.gather, " n=", c.a2a_bytes, " c=", c.gather_chunk));
    const double a =
        Model().CollectiveUs(Collective::kSendRecv, GroupShape{2, 2}, c.a2a_bytes / c.w);
    const double g =
        Model().CollectiveUs(Collective::kAllGather, GroupShape{c.gather, 1}, c.gather_chunk);
    const double closed = a >= g ? (c.w - 1) * std::max(a, g) + g : c.w * g;
    const SaaTimes t = CompareSaa(Model(), c.w, c.gather, c.a2a_bytes, c.gather_chunk);
    EXPECT_REL(t.saa, closed);
    // SAA never loses when the exchange step dominates: it saves (N-1)(W-1) c beta_intra.
    if (a >= g) {
      EXPECT_REL(t.sequential - t.saa, (c.gather - 1) * (c.w - 1) * c.gather_chunk *
                                           MakeProfile().intra.beta_us_per_byte);
    }
  }
}

// Tiny messages: a = 10 + 0.01 = 10.01, g = 7*(2 + 0.001) = 14.007 (the gather pays its
// start-up W times). SAA = 4*14.007 = 56.028; sequential = 3*(10 + 0.01) + 7*(2 + 0.004)
// = 30.03 + 14.028 = 44.058.
TEST(SaaTest, LosesWhenStartUpDominates) {
  const SaaTimes t = CompareSaa(Model(), 4, 8, 4, 1);
  EXPECT_REL(t.saa, 56.028);
  EXPECT_REL(t.sequential, 44.058);
  EXPECT_GT(t.saa, t.sequential);

  // Larger intra start-up makes it worse: intra alpha 50: g = 7*50.001 = 350.007,
  // SAA = 1400.028; sequential = 30.03 + 7*50.004 = 380.058.
  ClusterProfile p = MakeProfile();
  p.intra.alpha_us = 50.0;
  const absl::StatusOr<CostModel> slow = CostModel::Create(p);
  ASSERT_TRUE(slow.ok());
  const SaaTimes u = CompareSaa(*slow, 4, 8, 4, 1);
  EXPECT_REL(u.saa, 1400.028);
  EXPECT_REL(u.sequential, 380.058);
  EXPECT_GT(u.saa, u.sequential);
}

TEST(SaaTest, DegenerateGroups) {
  // No gather (one-rank group): only the W-1 exchange steps, 3*(10 + 10) = 60.
  OpGraph g;
  const OpId last = AppendSaa(Model(), GroupShape{4, 4}, 1, GroupShape{1, 1}, 4000, 1000,
                              Phase::kForward, kNoOp, &g);
  EXPECT_EQ(g.size(), 3);
  EXPECT_EQ(last, 2);
  EXPECT_REL(Simulate(g).makespan_us, 60.0);
  // W = 1: only the gather of the local chunk, 1*(2 + 1) = 3.
  OpGraph h;
  AppendSaa(Model(), GroupShape{1, 1}, 1, GroupShape{2, 1}, 4000, 1000, Phase::kForward, kNoOp, &h);
  ASSERT_EQ(h.size(), 1);
  EXPECT_EQ(h.op(0).Name(), "saa.allgather.0");
  EXPECT_REL(Simulate(h).makespan_us, 3.0);
}

// ---------------------------------------------------------------------------
// (e) Backward duals.

int IndexOf(const std::vector<std::string>& v, const std::string& s) {
  const auto it = std::find(v.begin(), v.end(), s);
  return it == v.end() ? -1 : static_cast<int>(it - v.begin());
}

TEST(SchedulesTest, BackwardUsesTheDuals) {
  const LayerConfig l = MakeLayer(4, 8, 4, 8);
  const std::vector<std::string> s1 = Names(Build(Schedule::kS1, l), Phase::kBackward);
  const std::vector<std::string> s2 = Names(Build(Schedule::kS2, l), Phase::kBackward);
  const std::vector<std::string> def = Names(Build(Schedule::kDefault, l), Phase::kBackward);

  // S1: ESP-AllGather before the input gradient, ESP-ReduceScatter after the weight
  // gradient, and the gate's MP-AllReduce.
  const int ag = IndexOf(s1, "bwd.esp_allgather"), dx = IndexOf(s1, "bwd.expert_dx");
  const int dw = IndexOf(s1, "bwd.expert_dw"), rs = IndexOf(s1, "bwd.esp_reducescatter");
  ASSERT_GE(ag, 0);
  ASSERT_GE(dx, 0);
  ASSERT_GE(dw, 0);
  ASSERT_GE(rs, 0);
  EXPECT_LT(ag, dx);
  EXPECT_LT(dx, dw);
  EXPECT_LT(dw, rs);
  EXPECT_EQ(std::count(s1.begin(), s1.end(), "bwd.mp_allreduce_gate"), 1);
  EXPECT_EQ(IndexOf(s1, "bwd.esp_allreduce"), -1);

  // Only S1 reduces the gate gradient over MP.
  EXPECT_EQ(IndexOf(s2, "bwd.mp_allreduce_gate"), -1);
  EXPECT_EQ(IndexOf(def, "bwd.mp_allreduce_gate"), -1);

  // Default: exactly one ESP-AllReduce, after the weight gradient.
  EXPECT_EQ(std::count(def.begin(), def.end(), "bwd.esp_allreduce"), 1);
  EXPECT_GT(IndexOf(def, "bwd.esp_allreduce"), IndexOf(def, "bwd.expert_dw"));
  EXPECT_EQ(IndexOf(def, "bwd.esp_allgather"), -1);
  EXPECT_EQ(IndexOf(def, "bwd.esp_reducescatter"), -1);

  // S2: the dispatch's dual is ReduceScatter steps pipelined with AlltoAll steps.
  int rs_steps = 0, a2a_steps = 0;
  for (const std::string& n : s2) {
    rs_steps += n.rfind("bwd.saa_dispatch.reducescatter.", 0) == 0;
    a2a_steps += n.rfind("bwd.saa_dispatch.alltoall.", 0) == 0;
  }
  EXPECT_EQ(rs_steps, 8);   // chunks 0..7
  EXPECT_EQ(a2a_steps, 7);  // steps 1..7
  EXPECT_GT(IndexOf(s2, "bwd.saa_dispatch.reducescatter.1"), IndexOf(s2, "bwd.expert_dw"));
  EXPECT_LT(IndexOf(s2, "bwd.saa_combine.allgather.7"), IndexOf(s2, "bwd.expert_dx"));

  // The S1 gate gradient is M*E*b = 256*16*2 = 8192 B, AllReduce {4,1}:
  // 2*3*(2 + 2048*0.001) = 24.288.
  const OpGraph g1 = Build(Schedule::kS1, l);
  const OpId gate = Find(g1, "bwd.mp_allreduce_gate");
  EXPECT_EQ(g1.op(gate).bytes, 8192);
  EXPECT_REL(g1.op(gate).cost_us, 24.288);
}

// ---------------------------------------------------------------------------
// Op costs come from the cost model (default, mp = esp = 4, ep = 8).

// A collective holds the links its group crosses: intra only inside a node, inter only
// with one rank per node, both for a hierarchical group.
TEST(SchedulesTest, CollectivesHoldTheLinksTheirGroupCrosses) {
  struct Case {
    int mp, ep, esp, dp;
    ResourceMask a2a;
  };
  for (const Case& c :
       {Case{2, 4, 2, 4, kIntra}, Case{8, 4, 8, 4, kInter}, Case{4, 8, 4, 8, kIntra | kInter}}) {
    SCOPED_TRACE(Cat("ep=", c.ep, " esp=", c.esp));
    const OpGraph g = Build(Schedule::kDefault, MakeLayer(c.mp, c.ep, c.esp, c.dp));
    for (const char* name : {"fwd.ep_alltoall_dispatch", "fwd.ep_alltoall_combine",
                             "bwd.ep_alltoall_combine", "bwd.ep_alltoall_dispatch"}) {
      const OpId v = Find(g, name);
      ASSERT_NE(v, kNoOp) << name;
      EXPECT_EQ(g.op(v).resources, c.a2a) << name;
      EXPECT_EQ(g.op(v).kind, OpKind::kComm) << name;
    }
    EXPECT_EQ(g.op(Find(g, "fwd.esp_allreduce")).resources, kIntra);
    EXPECT_EQ(g.op(Find(g, "fwd.expert")).resources, kCompute);
    // S2's exchange steps run on inter whenever the EP group spans nodes.
    const OpGraph g2 = Build(Schedule::kS2, MakeLayer(c.mp, c.ep, c.esp, c.dp));
    EXPECT_EQ(g2.op(Find(g2, "fwd.saa_dispatch.alltoall.1")).resources,
              c.a2a == kIntra ? kIntra : kInter);
  }
}

TEST(SchedulesTest, DefaultOpCostsAreTheCostModels) {
  const OpGraph g = Build(Schedule::kDefault, MakeLayer(4, 8, 4, 8));
  // AlltoAll {8,4} of D: 7*(10 + 131072*0.01) = 9245.04; inter bytes D*6/8 = 786432.
  const Op& a2a = g.op(Find(g, "fwd.ep_alltoall_dispatch"));
  EXPECT_REL(a2a.cost_us, 9245.04);
  EXPECT_EQ(a2a.bytes, kD);
  EXPECT_EQ(a2a.inter_node_bytes, 786432);
  EXPECT_EQ(a2a.resources, kIntra | kInter);  // hierarchical group
  // AllReduce {4,1} of D: 2*3*(2 + 262144*0.001) = 1584.864, intra only.
  const Op& ar = g.op(Find(g, "fwd.esp_allreduce"));
  EXPECT_REL(ar.cost_us, 1584.864);
  EXPECT_EQ(ar.resources, kIntra);
  EXPECT_EQ(ar.inter_node_bytes, 0);
  // Gate: GEMM 1024x16x256 = 5 + 8388608/1e8 = 5.08388608, softmax/top-k over
  // 3*1024*16*2 = 98304 B = 3.098304: 8.18219008.
  EXPECT_REL(g.op(Find(g, "fwd.gate")).cost_us, 8.18219008);
  // Order: S*M*b + E*T*M*b = 524288 + 1048576 = 1572864 B: 3 + 1.572864 = 4.572864.
  EXPECT_REL(g.op(Find(g, "fwd.order")).cost_us, 4.572864);
  EXPECT_REL(g.op(Find(g, "fwd.iorder")).cost_us, 4.572864);
  // Expert: 2 local experts x rows 8*128 = 1024, shard H/4 = 256:
  // 2 * (2 * (5 + 2*1024*256*256/1e8)) = 4 * 6.34217728 = 25.36870912, plus the
  // activation 2 * (2*1024*256*2 = 1048576) B = 3 + 2.097152: 30.46586112.
  EXPECT_REL(g.op(Find(g, "fwd.expert")).cost_us, 30.46586112);
}

TEST(SchedulesTest, ExpertActivationUsesTheProfilesActivationLines) {
  // Same layer as above with a measured activation: forward 1 GB/s + 10 us,
  // backward 0.5 GB/s + 20 us (1 GB/s = 1e3 B/us).
  ClusterProfile p = MakeProfile();
  p.activation.forward = {1.0, 10.0};
  p.activation.backward = {0.5, 20.0};
  absl::StatusOr<CostModel> cost = CostModel::Create(p);
  ASSERT_TRUE(cost.ok()) << cost.status();
  const LayerConfig l = MakeLayer(4, 8, 4, 8);
  LayerContext ctx = Context(l);
  ctx.cost = &*cost;
  OpGraph g;
  ASSERT_TRUE(BuildSchedule(Schedule::kDefault, ctx, &g).ok());
  // GEMMs 25.36870912 as above; activation forward 2 * 1048576 B at 1e3 B/us:
  // 10 + 2097.152.
  EXPECT_REL(g.op(Find(g, "fwd.expert")).cost_us, 25.36870912 + 2107.152);
  // Input gradients: the same GEMMs, activation backward 3 * 1048576 B at
  // 500 B/us: 20 + 6291.456.
  EXPECT_REL(g.op(Find(g, "bwd.expert_dx")).cost_us, 25.36870912 + 6311.456);
  // Weight gradients have no activation: the same as without the lines.
  const OpGraph plain = Build(Schedule::kDefault, l);
  EXPECT_REL(g.op(Find(g, "bwd.expert_dw")).cost_us,
             plain.op(Find(plain, "bwd.expert_dw")).cost_us);
}

// ---------------------------------------------------------------------------
// (f) Time accounting of whole schedules.

TEST(SchedulesTest, TimeAccountingOfEverySchedule) {
  const LayerConfig layers[] = {MakeLayer(4, 8, 4, 8), MakeLayer(8, 4, 8, 4),
                                MakeLayer(2, 16, 2, 16), MakeLayer(2, 4, 2, 4)};
  for (const LayerConfig& l : layers) {
    absl::StatusOr<LayerPlan> plan = PlanLayer(l, Model());
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(plan->candidates.size(), 3u);
    for (const Candidate& c : plan->candidates) {
      SCOPED_TRACE(Cat("mp=", l.parallel.mp, " ep=", l.parallel.ep, " ", ScheduleName(c.schedule)));
      EXPECT_DOUBLE_EQ(c.forward_us() + c.backward_us(), c.total_us());
      EXPECT_GT(c.forward_us(), 0.0);
      EXPECT_GT(c.backward_us(), 0.0);
      double path = 0.0;
      for (OpId v : c.sim.critical_path) path += c.graph().op(v).cost_us;
      EXPECT_REL(path, c.sim.makespan_us);
      EXPECT_REL(std::accumulate(c.sim.critical_term_us.begin(), c.sim.critical_term_us.end(), 0.0),
                 c.sim.makespan_us);
      // The path is gapless from 0 to the makespan.
      ASSERT_FALSE(c.sim.critical_path.empty());
      EXPECT_EQ(c.sim.times[c.sim.critical_path.front()].start_us, 0.0);
      EXPECT_EQ(c.sim.times[c.sim.critical_path.back()].end_us, c.sim.makespan_us);
      for (size_t i = 1; i < c.sim.critical_path.size(); ++i) {
        EXPECT_EQ(c.sim.times[c.sim.critical_path[i]].start_us,
                  c.sim.times[c.sim.critical_path[i - 1]].end_us);
      }
      // The simulator result equals a fresh simulation of the candidate's graph.
      EXPECT_DOUBLE_EQ(Simulate(c.graph()).makespan_us, c.total_us());
      EXPECT_LE(c.sim.hidden_comm_us, c.sim.comm_busy_us);
      EXPECT_DOUBLE_EQ(c.sim.exposed_comm_us, c.sim.comm_busy_us - c.sim.hidden_comm_us);
    }
  }
}

// Default is a chain: nothing overlaps, the makespan is the sum of all op costs.
TEST(SchedulesTest, DefaultIsAChain) {
  const OpGraph g = Build(Schedule::kDefault, MakeLayer(4, 8, 4, 8));
  const SimResult r = Simulate(g);
  double sum = 0.0, fwd = 0.0;
  for (OpId v = 0; v < g.size(); ++v) {
    sum += g.op(v).cost_us;
    if (g.op(v).phase == Phase::kForward) fwd += g.op(v).cost_us;
  }
  EXPECT_REL(r.makespan_us, sum);
  EXPECT_REL(r.forward_end_us, fwd);
  EXPECT_EQ(static_cast<int>(r.critical_path.size()), g.size());
  EXPECT_DOUBLE_EQ(r.hidden_comm_us, 0.0);
}

// ---------------------------------------------------------------------------
// (g) Degenerate layouts.

TEST(SchedulesTest, NoAllToAllWithoutExpertParallelism) {
  const LayerConfig l = MakeLayer(8, 1, 8, 1);
  for (Schedule s : kAllSchedules) {
    SCOPED_TRACE(std::string(ScheduleName(s)));
    const OpGraph g = Build(s, l);
    EXPECT_EQ(CountContaining(g, "alltoall"), 0);
    for (OpId v = 0; v < g.size(); ++v) EXPECT_NE(g.op(v).term, Term::kAllToAll);
    EXPECT_EQ(Simulate(g).inter_node_bytes, 0);
    EXPECT_GT(CountContaining(g, "expert"), 0);
  }
}

TEST(SchedulesTest, NoEspOpsWithoutExpertSharding) {
  const LayerConfig l = MakeLayer(1, 8, 1, 8);
  for (Schedule s : kAllSchedules) {
    SCOPED_TRACE(std::string(ScheduleName(s)));
    const OpGraph g = Build(s, l);
    EXPECT_EQ(CountContaining(g, "esp"), 0);
    EXPECT_EQ(CountContaining(g, "allgather"), 0);
    EXPECT_EQ(CountContaining(g, "reducescatter"), 0);
    EXPECT_EQ(CountContaining(g, "allreduce"), 0);
    for (OpId v = 0; v < g.size(); ++v) {
      if (g.op(v).kind == OpKind::kComm) {
        EXPECT_EQ(g.op(v).term, Term::kAllToAll) << g.op(v).Name();
      }
    }
    EXPECT_GT(CountContaining(g, "alltoall"), 0);
  }
}

TEST(SchedulesTest, BuildRejectsALayoutTheScheduleCannotRun) {
  const LayerConfig l = MakeLayer(2, 8, 1, 4);  // mp != esp
  OpGraph g;
  EXPECT_TRUE(BuildSchedule(Schedule::kDefault, Context(l), &g).ok());
  for (Schedule s : {Schedule::kS1, Schedule::kS2}) {
    OpGraph h;
    const absl::Status st = BuildSchedule(s, Context(l), &h);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_EQ(std::string(View(st.message())).rfind("parallel.esp: ", 0), 0u) << st;
  }
}

// ---------------------------------------------------------------------------
// (h) Ranking and explanation.

void ExpectWellRanked(const LayerPlan& plan) {
  ASSERT_FALSE(plan.candidates.empty());
  for (size_t i = 1; i < plan.candidates.size(); ++i) {
    EXPECT_LE(plan.candidates[i - 1].total_us(), plan.candidates[i].total_us());
  }
  const Decision& d = plan.decision;
  const Candidate& best = plan.candidates[0];
  EXPECT_EQ(d.best, best.schedule);
  if (plan.candidates.size() < 2) {
    EXPECT_FALSE(d.has_runner_up);
    EXPECT_EQ(d.margin_us, 0.0);
    EXPECT_TRUE(d.deciding_terms.empty());
    return;
  }
  const Candidate& second = plan.candidates[1];
  EXPECT_TRUE(d.has_runner_up);
  EXPECT_EQ(d.runner_up, second.schedule);
  EXPECT_DOUBLE_EQ(d.margin_us, second.total_us() - best.total_us());
  EXPECT_DOUBLE_EQ(d.margin_pct, 100.0 * d.margin_us / second.total_us());
  for (size_t i = 1; i < d.deciding_terms.size(); ++i) {
    EXPECT_GE(std::abs(d.deciding_terms[i - 1].delta_us), std::abs(d.deciding_terms[i].delta_us));
  }
  // Every non-negligible term delta is listed, with the right value.
  int listed = 0;
  for (int t = 0; t < kNumTerms; ++t) {
    const double delta = best.sim.critical_term_us[t] - second.sim.critical_term_us[t];
    const auto it = std::find_if(d.deciding_terms.begin(), d.deciding_terms.end(),
                                 [t](const TermDelta& x) { return static_cast<int>(x.term) == t; });
    if (std::abs(delta) > 1e-6) {
      ++listed;
      ASSERT_NE(it, d.deciding_terms.end()) << TermName(static_cast<Term>(t));
      EXPECT_DOUBLE_EQ(it->delta_us, delta);
    } else {
      EXPECT_EQ(it, d.deciding_terms.end()) << TermName(static_cast<Term>(t));
    }
  }
  EXPECT_EQ(static_cast<int>(d.deciding_terms.size()), listed);
  EXPECT_EQ(d.summary.find('\n'), std::string::npos);
  EXPECT_EQ(d.summary.rfind(std::string(ScheduleName(best.schedule)) + " is fastest", 0), 0u)
      << d.summary;
}

TEST(PlannerTest, RanksCandidatesFastestFirstAndExplains) {
  const LayerConfig layers[] = {MakeLayer(4, 8, 4, 8), MakeLayer(8, 4, 8, 4),
                                MakeLayer(2, 16, 2, 16), MakeLayer(2, 4, 2, 4),
                                MakeLayer(4, 4, 4, 4)};
  LayerPlanner planner(Model());
  for (const LayerConfig& l : layers) {
    SCOPED_TRACE(Cat("mp=", l.parallel.mp, " ep=", l.parallel.ep));
    LayerPlan plan;
    ASSERT_TRUE(planner.Plan(l, {}, &plan).ok());
    ASSERT_EQ(plan.candidates.size(), 3u);
    ExpectWellRanked(plan);
    const Candidate* def = plan.Find(Schedule::kDefault);
    ASSERT_NE(def, nullptr);
    ASSERT_NE(plan.Find(Schedule::kS1), nullptr);
    ASSERT_NE(plan.Find(Schedule::kS2), nullptr);
    EXPECT_DOUBLE_EQ(plan.decision.speedup_over_default,
                     def->total_us() / plan.candidates[0].total_us());
    EXPECT_EQ(plan.derived.capacity, 128);
    EXPECT_EQ(plan.derived.dispatch_bytes, kD);
    EXPECT_EQ(plan.derived.activation_bytes, kX);
    // Each candidate's simulation equals simulating a freshly built graph.
    for (const Candidate& c : plan.candidates) {
      EXPECT_DOUBLE_EQ(Simulate(Build(c.schedule, l)).makespan_us, c.total_us());
    }
  }
}

TEST(PlannerTest, SubsetsAndSingleSchedule) {
  const LayerConfig l = MakeLayer(4, 8, 4, 8);
  const Schedule two[] = {Schedule::kS2, Schedule::kS1};
  absl::StatusOr<LayerPlan> plan = PlanLayer(l, Model(), two);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->candidates.size(), 2u);
  EXPECT_EQ(plan->Find(Schedule::kDefault), nullptr);
  EXPECT_EQ(plan->decision.speedup_over_default, 0.0);
  ExpectWellRanked(*plan);

  const Schedule one[] = {Schedule::kDefault};
  plan = PlanLayer(l, Model(), one);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->candidates.size(), 1u);
  ExpectWellRanked(*plan);
  EXPECT_DOUBLE_EQ(plan->decision.speedup_over_default, 1.0);
  EXPECT_NE(plan->decision.summary.find("only schedule"), std::string::npos);

  // Reusing a planner for a smaller request leaves no stale candidates.
  LayerPlanner planner(Model());
  LayerPlan reused;
  ASSERT_TRUE(planner.Plan(l, {}, &reused).ok());
  ASSERT_TRUE(planner.Plan(l, one, &reused).ok());
  ASSERT_EQ(reused.candidates.size(), 1u);
  EXPECT_EQ(reused.candidates[0].schedule, Schedule::kDefault);
  EXPECT_DOUBLE_EQ(reused.candidates[0].total_us(), plan->candidates[0].total_us());
  EXPECT_EQ(reused.candidates[0].graph().size(), plan->candidates[0].graph().size());
}

// On this profile inter-node bandwidth dominates: S1 and S2 cut inter-node
// traffic N-fold, so both beat default on a layout whose EP group spans nodes.
TEST(PlannerTest, S1AndS2BeatDefaultWhenInterNodeTrafficDominates) {
  absl::StatusOr<LayerPlan> plan = PlanLayer(MakeLayer(4, 8, 4, 8), Model());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NE(plan->decision.best, Schedule::kDefault);
  EXPECT_EQ(plan->candidates.back().schedule, Schedule::kDefault);
  EXPECT_GT(plan->decision.speedup_over_default, 1.0);
  // The a2a term is where the default loses.
  const Candidate* def = plan->Find(Schedule::kDefault);
  EXPECT_LT(plan->candidates[0].sim.critical_term_us[int(Term::kAllToAll)],
            def->sim.critical_term_us[int(Term::kAllToAll)]);
}

// ---------------------------------------------------------------------------
// (i) Token skew.

TEST(SchedulesTest, DroplessTokenSkewScalesDefaultsAllToAll) {
  LayerConfig l = MakeLayer(4, 8, 4, 8);
  l.dropless = true;  // f = 1: the balanced share is the padded capacity T = 128
  const SimResult r1 = Simulate(Build(Schedule::kDefault, l));
  l.token_skew = 2.0;
  const SimResult r2 = Simulate(Build(Schedule::kDefault, l));
  // Four AlltoAlls {8,4}: skew 1: 4 * 7*(10 + 1048576/8*0.01) = 4 * 9245.04 = 36980.16;
  // skew 2: 4 * 7*(10 + 2097152/8*0.01) = 4 * 18420.08 = 73680.32; plus, either
  // way, the count exchange first: 16 experts * 8 bytes, 7*(10 + 128/8*0.01) = 71.12.
  EXPECT_REL(r1.critical_term_us[int(Term::kAllToAll)], 36980.16 + 71.12);
  EXPECT_REL(r2.critical_term_us[int(Term::kAllToAll)], 73680.32 + 71.12);
  EXPECT_GT(r2.critical_term_us[int(Term::kExpert)], r1.critical_term_us[int(Term::kExpert)]);
  // Gate and order work on the rank's own tokens: unchanged.
  EXPECT_REL(r2.critical_term_us[int(Term::kGate)], r1.critical_term_us[int(Term::kGate)]);
  EXPECT_REL(r2.critical_term_us[int(Term::kOrder)], r1.critical_term_us[int(Term::kOrder)]);
  EXPECT_GT(r2.makespan_us, r1.makespan_us);
  // The counts' 128 bytes, 6/8 of them off-node, do not scale with the skew.
  EXPECT_EQ(r2.inter_node_bytes - 96, 2 * (r1.inter_node_bytes - 96));
}

// The profile's AlltoAllSkew gamma on the EP shape decides how much of the
// heaviest rank's extra load costs as extra AlltoAll bytes: 1 (no entry) the
// whole token_skew, 0 none (the exchange moves the same bytes in all); the
// ESP collectives and the expert rows scale with the skew either way.
TEST(SchedulesTest, DroplessAllToAllFollowsTheProfilesSkewGamma) {
  LayerConfig l = MakeLayer(4, 8, 4, 8);
  l.dropless = true;
  l.token_skew = 2.0;
  auto simulate = [&](std::optional<double> gamma) {
    ClusterProfile p = Model().profile();
    if (gamma) p.alltoall_skew.push_back({{8, 4}, *gamma});
    absl::StatusOr<CostModel> cost = CostModel::Create(p);
    EXPECT_TRUE(cost.ok()) << cost.status();
    LayerContext ctx = Context(l);
    ctx.cost = &*cost;
    OpGraph g;
    EXPECT_TRUE(BuildSchedule(Schedule::kDefault, ctx, &g).ok());
    return Simulate(g);
  };
  const SimResult one = simulate(std::nullopt), full = simulate(1.0), half = simulate(0.5),
                  none = simulate(0.0);
  // Four AlltoAlls {8,4} of 1 MiB x (1 + gamma): 4 * 7 * (10 + 1048576 * (1 + gamma) / 8 * 0.01),
  // plus the count exchange (71.12).
  EXPECT_REL(one.critical_term_us[int(Term::kAllToAll)], 73680.32 + 71.12);
  EXPECT_REL(full.critical_term_us[int(Term::kAllToAll)], 73680.32 + 71.12);
  EXPECT_REL(half.critical_term_us[int(Term::kAllToAll)], 55330.24 + 71.12);
  EXPECT_REL(none.critical_term_us[int(Term::kAllToAll)], 36980.16 + 71.12);
  EXPECT_REL(none.critical_term_us[int(Term::kExpert)], one.critical_term_us[int(Term::kExpert)]);
  EXPECT_REL(none.critical_term_us[int(Term::kAllReduce)],
             one.critical_term_us[int(Term::kAllReduce)]);
  // Padded layers move their buffers whatever gamma is.
  l.dropless = false;
  EXPECT_REL(simulate(0.0).makespan_us, simulate(1.0).makespan_us);
}

// A dropless dispatch is irregular: the EP ranks first exchange one int64
// count per expert, right before it, in every schedule; padded layers and EP
// groups of one rank have no such op.
TEST(SchedulesTest, DroplessExchangesCountsBeforeTheDispatch) {
  for (Schedule s : kAllSchedules) {
    SCOPED_TRACE(std::string(ScheduleName(s)));
    LayerConfig l = MakeLayer(4, 8, 4, 8);
    l.dropless = true;
    const OpGraph g = Build(s, l);
    int counts = -1, dispatch = -1;
    for (int i = 0; i < g.size(); ++i) {
      const std::string name = g.op(i).Name();
      if (name == "fwd.ep_alltoall_counts") counts = i;
      if (dispatch < 0 && (name.rfind("fwd.ep_alltoall_dispatch", 0) == 0 ||
                           name.rfind("fwd.saa_dispatch.alltoall", 0) == 0)) {
        dispatch = i;
      }
    }
    ASSERT_GE(counts, 0);
    EXPECT_EQ(g.op(counts).bytes, 16 * 8);
    EXPECT_EQ(g.op(counts).kind, OpKind::kComm);
    EXPECT_EQ(g.op(counts).term, Term::kAllToAll);
    EXPECT_LT(counts, dispatch);
    l.dropless = false;
    const OpGraph padded = Build(s, l);
    EXPECT_EQ(padded.size(), g.size() - 1);
    for (int i = 0; i < padded.size(); ++i)
      EXPECT_NE(padded.op(i).Name(), "fwd.ep_alltoall_counts");
  }
  LayerConfig one = MakeLayer(4, 1, 4, 1);  // EP of one rank: nothing to exchange
  one.dropless = true;
  const OpGraph g = Build(Schedule::kDefault, one);
  for (int i = 0; i < g.size(); ++i) EXPECT_NE(g.op(i).Name(), "fwd.ep_alltoall_counts");
}

TEST(SchedulesTest, DroplessTokenSkewSlowsEverySchedule) {
  for (Schedule s : kAllSchedules) {
    SCOPED_TRACE(std::string(ScheduleName(s)));
    LayerConfig l = MakeLayer(4, 8, 4, 8);
    l.dropless = true;
    const SimResult r1 = Simulate(Build(s, l));
    l.token_skew = 1.5;
    const SimResult r2 = Simulate(Build(s, l));
    EXPECT_GT(r2.critical_term_us[int(Term::kAllToAll)], r1.critical_term_us[int(Term::kAllToAll)]);
    EXPECT_GT(r2.makespan_us, r1.makespan_us);
  }
}

// A padded buffer costs the same however the tokens were routed: skew only
// drops tokens, and the plan says how many.
TEST(SchedulesTest, PaddedTokenSkewChangesNoCostAndNamesTheDrops) {
  for (Schedule s : kAllSchedules) {
    SCOPED_TRACE(std::string(ScheduleName(s)));
    LayerConfig l = MakeLayer(4, 8, 4, 8);
    const SimResult r1 = Simulate(Build(s, l));
    l.token_skew = 4.0;
    const SimResult r4 = Simulate(Build(s, l));
    EXPECT_EQ(r4.makespan_us, r1.makespan_us);
    EXPECT_EQ(r4.inter_node_bytes, r1.inter_node_bytes);
  }
  LayerConfig l = MakeLayer(4, 8, 4, 8);
  l.capacity_factor = 1.25;
  l.token_skew = 1.25;
  EXPECT_EQ(DroppedShare(l), 0.0) << "within capacity";
  l.token_skew = 2.5;
  EXPECT_DOUBLE_EQ(DroppedShare(l), 0.5);
  absl::StatusOr<LayerPlan> plan = PlanLayer(l, Model());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NE(plan->decision.summary.find("padded at capacity_factor 1.25, token_skew 2.5 drops 50% "
                                        "of the heaviest rank's tokens"),
            std::string::npos)
      << plan->decision.summary;
  l.dropless = true;
  EXPECT_EQ(DroppedShare(l), 0.0);
  plan = PlanLayer(l, Model());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->decision.summary.find("drops"), std::string::npos);
}

// Dropless routing has no capacity: the balanced share k*S/E, whatever f is.
TEST(SchedulesTest, DroplessIgnoresTheCapacityFactor) {
  LayerConfig l = MakeLayer(4, 8, 4, 8);
  l.dropless = true;
  const SimResult f1 = Simulate(Build(Schedule::kS1, l));
  l.capacity_factor = 2.0;
  EXPECT_EQ(Simulate(Build(Schedule::kS1, l)).makespan_us, f1.makespan_us);
  EXPECT_EQ(Derive(l).capacity, 128);  // 2 * 1024 / 16
  EXPECT_EQ(RouteCapacity(l, 512), 64);
  l.dropless = false;
  EXPECT_EQ(Derive(l).capacity, 256);
  EXPECT_GT(Simulate(Build(Schedule::kS1, l)).makespan_us, f1.makespan_us);
}

// ---------------------------------------------------------------------------
// What the ops compute (op_exec.h): the executor runs these, so every field
// is checked against the layer's arithmetic. SequenceLayer: S = 1024, M = 256,
// E = 16, k = 2, f = 1 -> T = 128; mp = ep = esp = 4 -> El = 4.

const OpExec& ExecOf(const OpGraph& g, const std::string& name) {
  const OpId v = Find(g, name);
  EXPECT_NE(v, kNoOp) << name;
  static const OpExec kNone;
  return v == kNoOp ? kNone : g.exec(v);
}

TEST(OpExecTest, EveryScheduleOpSaysWhatItComputes) {
  for (Schedule s : kAllSchedules) {
    const OpGraph g = Build(s, SequenceLayer());
    for (OpId v = 0; v < g.size(); ++v) {
      EXPECT_NE(g.exec(v).kind, ExecKind::kNone) << ScheduleName(s) << " " << g.op(v).Name();
      // Collectives name their group; compute ops run on the compute resource.
      EXPECT_EQ(g.op(v).kind == OpKind::kComm, IsCollective(g.exec(v).kind)) << g.op(v).Name();
    }
    EXPECT_TRUE(g.aliases().empty()) << "no group of one rank in this layout";
  }
}

TEST(OpExecTest, DefaultMovesCapacityBlocks) {
  const OpGraph g = Build(Schedule::kDefault, SequenceLayer());
  const OpExec& gate = ExecOf(g, "fwd.gate");
  EXPECT_EQ(gate.kind, ExecKind::kGate);
  EXPECT_EQ(gate.in, Buf::kX);
  EXPECT_EQ(gate.tokens, 1024);
  EXPECT_EQ(gate.capacity, 128);
  const OpExec& order = ExecOf(g, "fwd.order");
  EXPECT_EQ(order.out, Buf::kDisp);
  EXPECT_EQ(order.parts, 1);
  const OpExec& a2a = ExecOf(g, "fwd.ep_alltoall_dispatch");
  EXPECT_EQ(a2a.kind, ExecKind::kAllToAll);
  EXPECT_EQ(a2a.group, ExecGroup::kEp);
  EXPECT_EQ(a2a.in, Buf::kDisp);
  EXPECT_EQ(a2a.out, Buf::kEin);
  EXPECT_EQ(a2a.count, 4 * 128 * 256);  // El * T * M per peer
  const OpExec& expert = ExecOf(g, "fwd.expert");
  EXPECT_EQ(expert.groups, 4);
  EXPECT_EQ(expert.rows, 128);
  const OpExec& ar = ExecOf(g, "fwd.esp_allreduce");
  EXPECT_EQ(ar.group, ExecGroup::kEsp);
  EXPECT_EQ(ar.in, Buf::kEout);
  EXPECT_EQ(ar.out, Buf::kEout);
  EXPECT_EQ(ar.count, 4 * 4 * 128 * 256);
  const OpExec& dw = ExecOf(g, "bwd.expert_dw");
  EXPECT_EQ(dw.in, Buf::kEin);
  EXPECT_EQ(dw.mid, Buf::kDeout);
  EXPECT_EQ(dw.scale, 1.0f);
  EXPECT_EQ(ExecOf(g, "bwd.gate").out, Buf::kDx);
  // mp = 4 over esp = 2: each shard sees every token twice; dW is halved.
  EXPECT_EQ(ExecOf(Build(Schedule::kDefault, MakeLayer(4, 8, 2, 8)), "bwd.expert_dw").scale, 0.5f);
}

TEST(OpExecTest, S1SplitsGathersAndSumsTheGateOverMp) {
  const OpGraph g = Build(Schedule::kS1, SequenceLayer());
  const OpExec& split = ExecOf(g, "fwd.mp_split");
  EXPECT_EQ(split.kind, ExecKind::kSlice);
  EXPECT_EQ(split.group, ExecGroup::kMp);
  EXPECT_EQ(split.count, 256 * 256);  // S/N tokens of M
  EXPECT_EQ(ExecOf(g, "fwd.gate").in, Buf::kXs);
  EXPECT_EQ(ExecOf(g, "fwd.gate").capacity, 32);  // ceil(2 * 256 / 16)
  const OpExec& ag = ExecOf(g, "fwd.esp_allgather");
  EXPECT_EQ(ag.kind, ExecKind::kAllGather);
  EXPECT_EQ(ag.in, Buf::kRecv);
  EXPECT_EQ(ag.out, Buf::kEin);
  EXPECT_EQ(ag.count, 16 * 32 * 256);  // the rank's whole dispatch buffer
  EXPECT_EQ(ExecOf(g, "fwd.expert").groups, 16);
  EXPECT_EQ(ExecOf(g, "fwd.expert").rows, 32);
  const OpExec& gate = ExecOf(g, "bwd.mp_allreduce_gate");
  EXPECT_EQ(gate.in, Buf::kGateGrad);
  EXPECT_TRUE(gate.f32);
  EXPECT_EQ(gate.count, 256 * 16);
}

TEST(OpExecTest, S2SaaStepsNameTheirChunks) {
  const OpGraph g = Build(Schedule::kS2, SequenceLayer());
  EXPECT_EQ(ExecOf(g, "fwd.order").parts, 4);
  EXPECT_EQ(ExecOf(g, "fwd.order").capacity, 128);
  const OpExec& step = ExecOf(g, "fwd.saa_dispatch.alltoall.1");
  EXPECT_EQ(step.kind, ExecKind::kSaaExchange);
  EXPECT_EQ(step.group, ExecGroup::kEp);
  EXPECT_EQ(step.in, Buf::kPart);
  EXPECT_EQ(step.out, Buf::kRecv);
  EXPECT_EQ(step.count, 4 * 32 * 256);  // El * T2/N * M
  EXPECT_FALSE(step.copy_local);
  const OpExec& gather = ExecOf(g, "fwd.saa_dispatch.allgather.0");
  EXPECT_EQ(gather.kind, ExecKind::kSaaGather);
  EXPECT_EQ(gather.group, ExecGroup::kEsp);
  EXPECT_EQ(gather.pairs, ExecGroup::kEp);
  EXPECT_EQ(gather.mid, Buf::kRecv);
  EXPECT_EQ(gather.out, Buf::kEin);
  EXPECT_EQ(gather.stride, 16 * 32 * 256);  // one member's [E][T2/N][M] block
  EXPECT_EQ(ExecOf(g, "fwd.saa_combine.allgather.3").group, ExecGroup::kMp);
  const OpExec& reduce = ExecOf(g, "bwd.saa_dispatch.reducescatter.0");
  EXPECT_EQ(reduce.kind, ExecKind::kSaaReduce);
  EXPECT_EQ(reduce.in, Buf::kDein);
  EXPECT_EQ(reduce.mid, Buf::kStage);
  EXPECT_EQ(ExecOf(g, "bwd.saa_dispatch.alltoall.2").in, Buf::kStage);
}

// A group of one rank has no op; what its identity collective leaves is an
// alias, and an SAA gather of one rank becomes exchanges into the output.
TEST(OpExecTest, OneRankGroupsLeaveAliasesNotOps) {
  const OpGraph def = Build(Schedule::kDefault, MakeLayer(1, 1, 1, 1));
  std::vector<std::pair<Buf, Buf>> got;
  for (const BufAlias& a : def.aliases()) got.emplace_back(a.buf, a.same_as);
  EXPECT_THAT(got, ElementsAreArray(std::vector<std::pair<Buf, Buf>>{{Buf::kEin, Buf::kDisp},
                                                                     {Buf::kComb, Buf::kEout},
                                                                     {Buf::kDeout, Buf::kDcomb},
                                                                     {Buf::kDdisp, Buf::kDein}}));
  const OpGraph s2 = Build(Schedule::kS2, MakeLayer(1, 4, 1, 4));
  const OpExec& first = ExecOf(s2, "fwd.saa_dispatch.alltoall.1");
  EXPECT_EQ(first.out, Buf::kEin);
  EXPECT_TRUE(first.copy_local);
  EXPECT_FALSE(ExecOf(s2, "fwd.saa_dispatch.alltoall.2").copy_local);
  EXPECT_EQ(ExecOf(s2, "bwd.saa_dispatch.alltoall.1").in, Buf::kDein);
  EXPECT_TRUE(ExecOf(s2, "bwd.saa_dispatch.alltoall.1").copy_local);
}

TEST(OpExecTest, HierarchicalAllToAllIsPlannedButNotExecutable) {
  const LayerConfig l = MakeLayer(1, 16, 1, 16);  // 8 GPUs per node: 2 nodes, 8 EP ranks each
  LayerContext ctx = Context(l);
  ctx.a2a = AllToAllAlgo::kHierarchical;
  OpGraph g;
  ASSERT_TRUE(BuildSchedule(Schedule::kDefault, ctx, &g).ok());
  EXPECT_EQ(ExecOf(g, "fwd.ep_alltoall_dispatch.2dh_intra").kind, ExecKind::kNone);
  EXPECT_EQ(ExecOf(g, "fwd.expert").kind, ExecKind::kExpertForward);
}

}  // namespace
}  // namespace moeplan::planner
