// Hand-checkable timelines of the simulator (docs/simulator.md): small DAGs built with
// OpGraph::Add, each result compared whole (every op's start, end, binding op and
// critical flag; makespan; critical path; busy / hidden / exposed comm time).
#include "moeplan/planner/simulator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "moeplan/base/strings.h"
#include "moeplan/planner/boost_graph.h"
#include "moeplan/planner/op_graph.h"

namespace moeplan::planner {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

Op MakeOp(std::string_view base, ResourceMask res, double cost_us, Term term = Term::kGate,
          Phase phase = Phase::kForward) {
  Op op;
  op.base = base;
  op.kind = res == kCompute ? OpKind::kCompute : OpKind::kComm;
  op.phase = phase;
  op.term = term;
  op.resources = res;
  op.cost_us = cost_us;
  return op;
}

struct Want {
  double start, end;
  OpId binding;
  bool critical;
};

void ExpectTimes(const SimResult& r, const std::vector<Want>& want) {
  ASSERT_EQ(r.times.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("op " + std::to_string(i));
    EXPECT_DOUBLE_EQ(r.times[i].start_us, want[i].start);
    EXPECT_DOUBLE_EQ(r.times[i].end_us, want[i].end);
    EXPECT_EQ(r.times[i].binding, want[i].binding);
    EXPECT_EQ(r.times[i].critical, want[i].critical);
  }
}

// Sum of the critical path's op durations, and of critical_term_us.
double PathSum(const OpGraph& g, const SimResult& r) {
  double s = 0.0;
  for (OpId v : r.critical_path) s += g.op(v).cost_us;
  return s;
}
double TermSum(const SimResult& r) {
  return std::accumulate(r.critical_term_us.begin(), r.critical_term_us.end(), 0.0);
}

SimResult MustRun(const OpGraph& g) {
  Simulator sim;
  SimResult r;
  const absl::Status s = sim.Run(g, &r);
  EXPECT_TRUE(s.ok()) << s;
  return r;
}

TEST(OpGraphTest, NamesAndResources) {
  Op op = MakeOp("fwd.saa.alltoall", kInter, 1.0);
  EXPECT_EQ(op.Name(), "fwd.saa.alltoall");
  op.step = 3;
  EXPECT_EQ(op.Name(), "fwd.saa.alltoall.3");
  op.step = 0;
  EXPECT_EQ(op.Name(), "fwd.saa.alltoall.0");
  EXPECT_EQ(ResourceMaskName(kCompute), "compute");
  EXPECT_EQ(ResourceMaskName(kIntra | kInter), "intra+inter");
  EXPECT_EQ(ResourceMaskName(kCompute | kIntra | kInter), "compute+intra+inter");
  EXPECT_EQ(ResourceName(0), "compute");
  EXPECT_EQ(ResourceName(1), "intra");
  EXPECT_EQ(ResourceName(2), "inter");
  EXPECT_EQ(TermName(Term::kAllToAll), "alltoall");
  EXPECT_EQ(TermName(Term::kExpert), "expert");

  OpGraph g;
  EXPECT_EQ(g.Add(MakeOp("a", kCompute, 1), {}), 0);
  EXPECT_EQ(g.Add(MakeOp("b", kCompute, 1), {0, kNoOp}), 1);
  EXPECT_EQ(g.size(), 2);
  EXPECT_EQ(g.op(1).Name(), "b");
  EXPECT_EQ(g.deps(1).size(), 1u);  // kNoOp ignored
  EXPECT_EQ(boost::in_degree(1, ToBoostGraph(g)), 1u);
  g.Clear();
  EXPECT_EQ(g.size(), 0);
}

TEST(SimulatorTest, EmptyGraph) {
  OpGraph g;
  const SimResult r = MustRun(g);
  EXPECT_THAT(r.times, IsEmpty());
  EXPECT_THAT(r.critical_path, IsEmpty());
  EXPECT_EQ(r.makespan_us, 0.0);
  EXPECT_EQ(r.forward_end_us, 0.0);
  EXPECT_EQ(r.comm_busy_us, 0.0);
  EXPECT_EQ(r.compute_busy_us, 0.0);
  EXPECT_EQ(TermSum(r), 0.0);
}

// a(compute 2) -> b(intra 3) -> c(compute 1):
//   a [0,2]  b [2,5]  c [5,6]; makespan 6; everything critical; comm [2,5] exposed.
TEST(SimulatorTest, Chain) {
  OpGraph g;
  Op a = MakeOp("a", kCompute, 2, Term::kGate);
  a.inter_node_bytes = 0;
  const OpId ia = g.Add(a, {});
  Op b = MakeOp("b", kIntra, 3, Term::kAllToAll);
  b.inter_node_bytes = 100;
  const OpId ib = g.Add(b, {ia});
  const OpId ic = g.Add(MakeOp("c", kCompute, 1, Term::kExpert), {ib});
  const SimResult r = MustRun(g);
  ExpectTimes(r, {{0, 2, kNoOp, true}, {2, 5, 0, true}, {5, 6, 1, true}});
  EXPECT_DOUBLE_EQ(r.makespan_us, 6);
  EXPECT_DOUBLE_EQ(r.forward_end_us, 6);
  EXPECT_THAT(r.critical_path, ElementsAre(ia, ib, ic));
  EXPECT_DOUBLE_EQ(r.compute_busy_us, 3);
  EXPECT_DOUBLE_EQ(r.comm_busy_us, 3);
  EXPECT_DOUBLE_EQ(r.hidden_comm_us, 0);
  EXPECT_DOUBLE_EQ(r.exposed_comm_us, 3);
  EXPECT_EQ(r.inter_node_bytes, 100);
  EXPECT_DOUBLE_EQ(r.critical_term_us[int(Term::kGate)], 2);
  EXPECT_DOUBLE_EQ(r.critical_term_us[int(Term::kAllToAll)], 3);
  EXPECT_DOUBLE_EQ(r.critical_term_us[int(Term::kExpert)], 1);
  EXPECT_DOUBLE_EQ(TermSum(r), r.makespan_us);
}

// a(compute 1) -> b(compute 2), c(intra 3) -> d(compute 1) on b and c.
//   a [0,1]; b [1,3] and c [1,4] overlap; d waits for c: [4,5].
//   critical a, c, d; comm [1,4] = 3, hidden by b [1,3] = 2, exposed 1.
TEST(SimulatorTest, DiamondOverlapsComputeAndComm) {
  OpGraph g;
  const OpId a = g.Add(MakeOp("a", kCompute, 1, Term::kGate), {});
  const OpId b = g.Add(MakeOp("b", kCompute, 2, Term::kExpert), {a});
  const OpId c = g.Add(MakeOp("c", kIntra, 3, Term::kAllGather), {a});
  const OpId d = g.Add(MakeOp("d", kCompute, 1, Term::kOrder), {b, c});
  const SimResult r = MustRun(g);
  ExpectTimes(r, {{0, 1, kNoOp, true}, {1, 3, a, false}, {1, 4, a, true}, {4, 5, c, true}});
  EXPECT_DOUBLE_EQ(r.makespan_us, 5);
  EXPECT_THAT(r.critical_path, ElementsAre(a, c, d));
  EXPECT_DOUBLE_EQ(r.compute_busy_us, 4);
  EXPECT_DOUBLE_EQ(r.comm_busy_us, 3);
  EXPECT_DOUBLE_EQ(r.hidden_comm_us, 2);
  EXPECT_DOUBLE_EQ(r.exposed_comm_us, 1);
  EXPECT_DOUBLE_EQ(r.critical_term_us[int(Term::kGate)], 1);
  EXPECT_DOUBLE_EQ(r.critical_term_us[int(Term::kAllGather)], 3);
  EXPECT_DOUBLE_EQ(r.critical_term_us[int(Term::kOrder)], 1);
  EXPECT_DOUBLE_EQ(r.critical_term_us[int(Term::kExpert)], 0);
  EXPECT_DOUBLE_EQ(TermSum(r), r.makespan_us);
  EXPECT_DOUBLE_EQ(PathSum(g, r), r.makespan_us);
}

// r(compute 1) fans out to x1(intra 2), x2(inter 4), x3(compute 3); s(compute 1) joins.
//   r [0,1]; x1 [1,3]; x2 [1,5]; x3 [1,4]; s [5,6] bound by x2.
//   comm union [1,3] u [1,5] = [1,5] = 4; hidden by x3 [1,4] = 3; exposed 1.
TEST(SimulatorTest, FanOutFanIn) {
  OpGraph g;
  const OpId r0 = g.Add(MakeOp("r", kCompute, 1, Term::kGate), {});
  const OpId x1 = g.Add(MakeOp("x1", kIntra, 2, Term::kAllGather), {r0});
  const OpId x2 = g.Add(MakeOp("x2", kInter, 4, Term::kAllToAll), {r0});
  const OpId x3 = g.Add(MakeOp("x3", kCompute, 3, Term::kExpert), {r0});
  const OpId s = g.Add(MakeOp("s", kCompute, 1, Term::kOrder), {x1, x2, x3});
  const SimResult r = MustRun(g);
  ExpectTimes(r, {{0, 1, kNoOp, true},
                  {1, 3, r0, false},
                  {1, 5, r0, true},
                  {1, 4, r0, false},
                  {5, 6, x2, true}});
  EXPECT_DOUBLE_EQ(r.makespan_us, 6);
  EXPECT_THAT(r.critical_path, ElementsAre(r0, x2, s));
  EXPECT_DOUBLE_EQ(r.compute_busy_us, 5);
  EXPECT_DOUBLE_EQ(r.comm_busy_us, 4);
  EXPECT_DOUBLE_EQ(r.hidden_comm_us, 3);
  EXPECT_DOUBLE_EQ(r.exposed_comm_us, 1);
  EXPECT_DOUBLE_EQ(r.critical_term_us[int(Term::kAllToAll)], 4);
  EXPECT_DOUBLE_EQ(TermSum(r), 6);
}

// Stream semantics: each resource runs its ops in issue order.
//   0 a intra 5, no deps          [0,5]
//   1 b compute 1, no deps        [0,1]
//   2 c intra 1, dep b (ready 1)  [5,6]  waits for a on intra: binding a
//   3 e compute 2, dep c          [6,8]
//   4 f compute 1, no deps        [8,9]  ready at 0 but issued after e: binding e
// Critical a, c, e, f. comm [0,5] u [5,6] = [0,6] = 6; hidden by b [0,1] = 1.
TEST(SimulatorTest, IssueOrderOnAResourceDelaysReadyOps) {
  OpGraph g;
  const OpId a = g.Add(MakeOp("a", kIntra, 5, Term::kAllToAll), {});
  const OpId b = g.Add(MakeOp("b", kCompute, 1, Term::kGate), {});
  const OpId c = g.Add(MakeOp("c", kIntra, 1, Term::kAllGather), {b});
  const OpId e = g.Add(MakeOp("e", kCompute, 2, Term::kExpert), {c});
  const OpId f = g.Add(MakeOp("f", kCompute, 1, Term::kOrder), {});
  const SimResult r = MustRun(g);
  ExpectTimes(r, {{0, 5, kNoOp, true},
                  {0, 1, kNoOp, false},
                  {5, 6, a, true},
                  {6, 8, c, true},
                  {8, 9, e, true}});
  EXPECT_DOUBLE_EQ(r.makespan_us, 9);
  EXPECT_THAT(r.critical_path, ElementsAre(a, c, e, f));
  EXPECT_DOUBLE_EQ(r.compute_busy_us, 4);
  EXPECT_DOUBLE_EQ(r.comm_busy_us, 6);
  EXPECT_DOUBLE_EQ(r.hidden_comm_us, 1);
  EXPECT_DOUBLE_EQ(r.exposed_comm_us, 5);
  EXPECT_DOUBLE_EQ(r.critical_term_us[int(Term::kAllToAll)], 5);
  EXPECT_DOUBLE_EQ(r.critical_term_us[int(Term::kAllGather)], 1);
  EXPECT_DOUBLE_EQ(r.critical_term_us[int(Term::kExpert)], 2);
  EXPECT_DOUBLE_EQ(r.critical_term_us[int(Term::kOrder)], 1);
  EXPECT_DOUBLE_EQ(r.critical_term_us[int(Term::kGate)], 0);
  EXPECT_DOUBLE_EQ(TermSum(r), r.makespan_us);
}

// On a tie between a dependency's end and a resource's free time, the data
// dependency is the binding op.
//   0 a compute 2 [0,2]; 1 b intra 2 [0,2]; 2 c compute 1 dep b: [2,3], binding b.
TEST(SimulatorTest, TieBindsTheDependency) {
  OpGraph g;
  const OpId a = g.Add(MakeOp("a", kCompute, 2), {});
  const OpId b = g.Add(MakeOp("b", kIntra, 2), {});
  const OpId c = g.Add(MakeOp("c", kCompute, 1), {b});
  const SimResult r = MustRun(g);
  ExpectTimes(r, {{0, 2, kNoOp, false}, {0, 2, kNoOp, true}, {2, 3, b, true}});
  EXPECT_THAT(r.critical_path, ElementsAre(b, c));
  EXPECT_DOUBLE_EQ(r.hidden_comm_us, 2);
  EXPECT_DOUBLE_EQ(r.exposed_comm_us, 0);
  (void)a;
}

// Between dependencies that end at the same time, the first listed one binds.
//   0 a compute 2 [0,2]; 1 b intra 2 [0,2]; 2 c inter 1, deps {a, b}: [2,3], binding a;
//   3 d inter 1, deps {b, a}: [3,4], binding c (its resource predecessor ends last).
//   4 e intra 1, deps {b, a}: [2,3], binding b.
TEST(SimulatorTest, TieBetweenDependenciesBindsTheFirstListed) {
  OpGraph g;
  const OpId a = g.Add(MakeOp("a", kCompute, 2), {});
  const OpId b = g.Add(MakeOp("b", kIntra, 2), {});
  const OpId c = g.Add(MakeOp("c", kInter, 1), {a, b});
  g.Add(MakeOp("d", kInter, 1), {b, a});
  g.Add(MakeOp("e", kIntra, 1), {b, a});
  const SimResult r = MustRun(g);
  ExpectTimes(r, {{0, 2, kNoOp, true},
                  {0, 2, kNoOp, false},
                  {2, 3, a, true},
                  {3, 4, c, true},
                  {2, 3, b, false}});
  EXPECT_THAT(r.critical_path, ElementsAre(a, c, 3));
}

// A fused op holds intra and inter and blocks both.
//   0 p intra 2                 [0,2]
//   1 q inter 3                 [0,3]
//   2 fused intra+inter 4       [3,7]  waits for both links (inter frees last: q)
//   3 r intra 1, no deps        [7,8]  behind the fused op
//   4 s inter 1, no deps        [7,8]  behind the fused op
//   5 t compute 1, no deps      [0,1]
// makespan 8 (r ends first at 8): critical q, fused, r. comm union [0,8] = 8; hidden 1.
// Pass-through ops (Schedule's pass_through flags) hold no resource and
// take no time; their dependencies still order the graph.
//   0 a compute 2; 1 w compute 5 dW (after a); 2 b compute 1 (after a);
//   3 c inter 3 (after w).
// Whole: a [0,2], w [2,7], b [7,8] behind w on compute, c [7,10].
// w passed through: a [0,2], w [2,2], b [2,3] (after a), c [2,5] (after w).
TEST(SimulatorTest, PassThroughOpsHoldNothing) {
  OpGraph g;
  const OpId a = g.Add(MakeOp("a", kCompute, 2), {});
  Op dw = MakeOp("w", kCompute, 5);
  dw.flags = kWeightGrad;
  const OpId w = g.Add(dw, {a});
  g.Add(MakeOp("b", kCompute, 1), {a});
  g.Add(MakeOp("c", kInter, 3, Term::kAllToAll), {w});
  Simulator sim;
  SimResult r;
  ASSERT_TRUE(sim.Schedule(g, &r).ok());
  ExpectTimes(r, {{0, 2, kNoOp, false}, {2, 7, a, false}, {7, 8, w, false}, {7, 10, w, false}});
  EXPECT_DOUBLE_EQ(r.makespan_us, 10);
  ASSERT_TRUE(sim.Schedule(g, &r, kGradSync).ok());  // no op has it: the same
  EXPECT_DOUBLE_EQ(r.makespan_us, 10);
  ASSERT_TRUE(sim.Schedule(g, &r, kWeightGrad | kGradSync).ok());
  ExpectTimes(r, {{0, 2, kNoOp, false}, {2, 2, a, false}, {2, 3, a, false}, {2, 5, w, false}});
  EXPECT_DOUBLE_EQ(r.makespan_us, 5);
}

// Without bindings the times are the same; every binding is kNoOp.
TEST(SimulatorTest, ScheduleWithoutBindingsKeepsTheTimes) {
  OpGraph g;
  const OpId a = g.Add(MakeOp("a", kCompute, 2), {});
  const OpId b = g.Add(MakeOp("b", kIntra, 3, Term::kAllToAll), {a});
  const OpId c = g.Add(MakeOp("c", kCompute, 1), {a});
  g.Add(MakeOp("d", kIntra | kInter, 4, Term::kAllReduce), {c});
  g.Add(MakeOp("e", kCompute, 2, Term::kGate), {b, c});
  Simulator sim;
  SimResult with, without;
  ASSERT_TRUE(sim.Schedule(g, &with).ok());
  ASSERT_TRUE(sim.Schedule(g, &without, 0, /*bindings=*/false).ok());
  ASSERT_EQ(with.times.size(), without.times.size());
  for (size_t i = 0; i < with.times.size(); ++i) {
    EXPECT_EQ(without.times[i].start_us, with.times[i].start_us) << i;
    EXPECT_EQ(without.times[i].end_us, with.times[i].end_us) << i;
    EXPECT_EQ(without.times[i].binding, kNoOp) << i;
  }
  EXPECT_EQ(with.times[static_cast<size_t>(b)].binding, a);
  EXPECT_EQ(without.makespan_us, with.makespan_us);
  EXPECT_DOUBLE_EQ(with.makespan_us, 9);  // a [0,2], b [2,5], c [2,3], d [5,9], e [5,7]
}

// A graph that drops what its ops compute keeps their dependencies.
TEST(OpGraphTest, RecordExecOff) {
  OpGraph g;
  g.RecordExec(false);
  OpExec x;
  x.kind = ExecKind::kDenseGemm;
  const OpId a = g.Add(MakeOp("a", kCompute, 1), {}, x);
  const OpId b = g.Add(MakeOp("b", kCompute, 1), {a}, x);
  EXPECT_EQ(g.exec(b).kind, ExecKind::kNone);
  EXPECT_THAT(g.deps(b), ElementsAre(a));
  g.Clear();  // the setting stays
  g.Add(MakeOp("a", kCompute, 1), {}, x);
  EXPECT_EQ(g.exec(0).kind, ExecKind::kNone);
  g.RecordExec(true);  // ops added before say nothing; new ones are kept
  const OpId c = g.Add(MakeOp("c", kCompute, 1), {0}, x);
  EXPECT_EQ(g.exec(0).kind, ExecKind::kNone);
  EXPECT_EQ(g.exec(c).kind, ExecKind::kDenseGemm);
}

TEST(SimulatorTest, FusedOpBlocksBothLinks) {
  OpGraph g;
  const OpId p = g.Add(MakeOp("p", kIntra, 2, Term::kAllGather), {});
  const OpId q = g.Add(MakeOp("q", kInter, 3, Term::kAllToAll), {});
  const OpId fused = g.Add(MakeOp("fused", kIntra | kInter, 4, Term::kAllReduce), {});
  const OpId r_ = g.Add(MakeOp("r", kIntra, 1, Term::kAllGather), {});
  const OpId s = g.Add(MakeOp("s", kInter, 1, Term::kAllToAll), {});
  const OpId t = g.Add(MakeOp("t", kCompute, 1, Term::kGate), {});
  const SimResult r = MustRun(g);
  ExpectTimes(r, {{0, 2, kNoOp, false},
                  {0, 3, kNoOp, true},
                  {3, 7, q, true},
                  {7, 8, fused, true},
                  {7, 8, fused, false},
                  {0, 1, kNoOp, false}});
  EXPECT_DOUBLE_EQ(r.makespan_us, 8);
  EXPECT_THAT(r.critical_path, ElementsAre(q, fused, r_));
  EXPECT_DOUBLE_EQ(r.compute_busy_us, 1);
  EXPECT_DOUBLE_EQ(r.comm_busy_us, 8);
  EXPECT_DOUBLE_EQ(r.hidden_comm_us, 1);
  EXPECT_DOUBLE_EQ(r.exposed_comm_us, 7);
  EXPECT_DOUBLE_EQ(r.critical_term_us[int(Term::kAllToAll)], 3);
  EXPECT_DOUBLE_EQ(r.critical_term_us[int(Term::kAllReduce)], 4);
  EXPECT_DOUBLE_EQ(r.critical_term_us[int(Term::kAllGather)], 1);
  EXPECT_DOUBLE_EQ(TermSum(r), r.makespan_us);
  (void)p;
  (void)s;
  (void)t;
}

// A fused op with a gap on one of its links: intra is free at 1 but inter only at 6,
// so the fused op starts at 6 and the intra link idles [1,6].
//   0 x intra 1 [0,1]; 1 y inter 6 [0,6]; 2 f intra+inter 2 [6,8]; 3 z intra 1 [8,9].
// comm union: [0,1] u [0,6] u [6,8] u [8,9] = [0,9] = 9.
TEST(SimulatorTest, FusedOpWaitsForItsBusiestLink) {
  OpGraph g;
  g.Add(MakeOp("x", kIntra, 1), {});
  g.Add(MakeOp("y", kInter, 6), {});
  g.Add(MakeOp("f", kIntra | kInter, 2), {});
  g.Add(MakeOp("z", kIntra, 1), {});
  const SimResult r = MustRun(g);
  ExpectTimes(r, {{0, 1, kNoOp, false}, {0, 6, kNoOp, true}, {6, 8, 1, true}, {8, 9, 2, true}});
  EXPECT_THAT(r.critical_path, ElementsAre(1, 2, 3));
  EXPECT_DOUBLE_EQ(r.makespan_us, 9);
  EXPECT_DOUBLE_EQ(r.comm_busy_us, 9);
  EXPECT_DOUBLE_EQ(r.hidden_comm_us, 0);
  EXPECT_DOUBLE_EQ(r.exposed_comm_us, 9);
  EXPECT_DOUBLE_EQ(r.compute_busy_us, 0);
}

// Zero-cost ops take no time, hold nothing and stay on the path.
//   0 z0 compute 0 [0,0]; 1 a compute 2 dep z0 [0,2] (binding z0);
//   2 z1 intra 0 dep a [2,2]; 3 b inter 3 dep z1 [2,5]; 4 c compute 1 dep b [5,6].
TEST(SimulatorTest, ZeroCostOps) {
  OpGraph g;
  const OpId z0 = g.Add(MakeOp("z0", kCompute, 0, Term::kSplit), {});
  const OpId a = g.Add(MakeOp("a", kCompute, 2, Term::kGate), {z0});
  const OpId z1 = g.Add(MakeOp("z1", kIntra, 0, Term::kAllGather), {a});
  const OpId b = g.Add(MakeOp("b", kInter, 3, Term::kAllToAll), {z1});
  const OpId c = g.Add(MakeOp("c", kCompute, 1, Term::kOrder), {b});
  const SimResult r = MustRun(g);
  ExpectTimes(
      r,
      {{0, 0, kNoOp, true}, {0, 2, z0, true}, {2, 2, a, true}, {2, 5, z1, true}, {5, 6, b, true}});
  EXPECT_DOUBLE_EQ(r.makespan_us, 6);
  EXPECT_THAT(r.critical_path, ElementsAre(z0, a, z1, b, c));
  EXPECT_DOUBLE_EQ(r.compute_busy_us, 3);
  EXPECT_DOUBLE_EQ(r.comm_busy_us, 3);
  EXPECT_DOUBLE_EQ(r.hidden_comm_us, 0);
  EXPECT_DOUBLE_EQ(r.exposed_comm_us, 3);
  EXPECT_DOUBLE_EQ(r.critical_term_us[int(Term::kSplit)], 0);
  EXPECT_DOUBLE_EQ(r.critical_term_us[int(Term::kAllGather)], 0);
  EXPECT_DOUBLE_EQ(TermSum(r), r.makespan_us);
}

// A zero-cost op leaves no busy time: the next op on its resource starts at 0.
TEST(SimulatorTest, ZeroCostOpDoesNotOccupyItsResource) {
  OpGraph g;
  g.Add(MakeOp("long", kCompute, 4), {});
  g.Add(MakeOp("comm", kIntra, 0), {});   // [0,0]
  g.Add(MakeOp("comm2", kIntra, 2), {});  // [0,2]: the zero-cost op left no busy time
  const SimResult r = MustRun(g);
  ExpectTimes(r, {{0, 4, kNoOp, true}, {0, 0, kNoOp, false}, {0, 2, kNoOp, false}});
  EXPECT_THAT(r.critical_path, ElementsAre(0));
  EXPECT_DOUBLE_EQ(r.comm_busy_us, 2);
  EXPECT_DOUBLE_EQ(r.hidden_comm_us, 2);
  EXPECT_DOUBLE_EQ(r.exposed_comm_us, 0);
}

TEST(SimulatorTest, DependencyIssuedAfterTheOpIsAnInternalError) {
  OpGraph g;
  g.Add(MakeOp("a", kCompute, 1), {});
  g.Add(MakeOp("b", kCompute, 1), {2});  // op 2 does not exist yet
  g.Add(MakeOp("c", kCompute, 1), {0});  // (vertex 2 was created by the edge; c is 3)
  Simulator sim;
  SimResult r;
  const absl::Status s = sim.Run(g, &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  const std::string msg(View(s.message()));
  EXPECT_NE(msg.find("op 1 (b) depends on op 2"), std::string::npos) << msg;
}

TEST(SimulatorTest, SelfDependencyIsAnInternalError) {
  OpGraph g;
  g.Add(MakeOp("a", kCompute, 1), {});
  g.Add(MakeOp("self", kCompute, 1), {0, 1});
  Simulator sim;
  SimResult r;
  const absl::Status s = sim.Run(g, &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(std::string(View(s.message())).find("(self)"), std::string::npos) << s;
}

// Forward and backward ops interleaved:
//   0 fa fwd compute 2        [0,2]
//   1 bb bwd intra 3, dep fa  [2,5]
//   2 fc fwd compute 1        [2,3]  (compute free at 2)
//   3 bd bwd compute 2, dep bb, fc [5,7]
// forward_end_us = 3 (the last forward end, not the first backward start); makespan 7.
TEST(SimulatorTest, ForwardEndWithMixedPhases) {
  OpGraph g;
  const OpId fa = g.Add(MakeOp("fa", kCompute, 2, Term::kGate, Phase::kForward), {});
  const OpId bb = g.Add(MakeOp("bb", kIntra, 3, Term::kAllToAll, Phase::kBackward), {fa});
  const OpId fc = g.Add(MakeOp("fc", kCompute, 1, Term::kOrder, Phase::kForward), {});
  const OpId bd = g.Add(MakeOp("bd", kCompute, 2, Term::kExpert, Phase::kBackward), {bb, fc});
  const SimResult r = MustRun(g);
  ExpectTimes(r, {{0, 2, kNoOp, true}, {2, 5, fa, true}, {2, 3, fa, false}, {5, 7, bb, true}});
  EXPECT_DOUBLE_EQ(r.forward_end_us, 3);
  EXPECT_DOUBLE_EQ(r.makespan_us, 7);
  EXPECT_THAT(r.critical_path, ElementsAre(fa, bb, bd));
  EXPECT_DOUBLE_EQ(r.critical_term_us[int(Term::kGate)], 2);
  EXPECT_DOUBLE_EQ(r.critical_term_us[int(Term::kAllToAll)], 3);
  EXPECT_DOUBLE_EQ(r.critical_term_us[int(Term::kExpert)], 2);
  EXPECT_DOUBLE_EQ(r.critical_term_us[int(Term::kOrder)], 0);
  EXPECT_DOUBLE_EQ(TermSum(r), r.makespan_us);
  EXPECT_DOUBLE_EQ(r.hidden_comm_us, 1);  // [2,5] vs compute [2,3]
  EXPECT_DOUBLE_EQ(r.exposed_comm_us, 2);

  // A forward op issued later that ends earlier does not move forward_end_us back.
  //   0 f1 fwd compute 4 [0,4]; 1 f2 fwd intra 1 [0,1]; 2 b1 bwd compute 1 [4,5].
  OpGraph m;
  m.Add(MakeOp("f1", kCompute, 4, Term::kGate, Phase::kForward), {});
  m.Add(MakeOp("f2", kIntra, 1, Term::kAllToAll, Phase::kForward), {});
  m.Add(MakeOp("b1", kCompute, 1, Term::kGate, Phase::kBackward), {});
  const SimResult rm = MustRun(m);
  EXPECT_DOUBLE_EQ(rm.forward_end_us, 4);
  EXPECT_DOUBLE_EQ(rm.makespan_us, 5);

  // Only backward ops: forward_end_us stays 0.
  OpGraph h;
  h.Add(MakeOp("b1", kCompute, 4, Term::kGate, Phase::kBackward), {});
  const SimResult rh = MustRun(h);
  EXPECT_DOUBLE_EQ(rh.forward_end_us, 0);
  EXPECT_DOUBLE_EQ(rh.makespan_us, 4);
}

// The simulator and the result are reusable: a second run on a smaller graph
// leaves nothing of the first.
TEST(SimulatorTest, ReuseGivesTheSameResultAsAFreshRun) {
  OpGraph big;
  const OpId a = big.Add(MakeOp("a", kCompute, 1, Term::kGate), {});
  const OpId b = big.Add(MakeOp("b", kInter, 10, Term::kAllToAll), {a});
  big.Add(MakeOp("c", kCompute, 3, Term::kExpert), {b});
  OpGraph small;
  const OpId x = small.Add(MakeOp("x", kIntra, 2, Term::kAllGather), {});
  small.Add(MakeOp("y", kCompute, 1, Term::kOrder), {x});

  Simulator sim;
  SimResult r;
  ASSERT_TRUE(sim.Run(big, &r).ok());
  ASSERT_TRUE(sim.Run(small, &r).ok());
  const SimResult fresh = MustRun(small);
  ExpectTimes(r, {{0, 2, kNoOp, true}, {2, 3, 0, true}});
  EXPECT_THAT(r.critical_path, ElementsAre(0, 1));
  EXPECT_DOUBLE_EQ(r.makespan_us, fresh.makespan_us);
  EXPECT_DOUBLE_EQ(r.makespan_us, 3);
  EXPECT_DOUBLE_EQ(r.comm_busy_us, 2);
  EXPECT_DOUBLE_EQ(r.compute_busy_us, 1);
  EXPECT_DOUBLE_EQ(r.hidden_comm_us, 0);
  EXPECT_DOUBLE_EQ(r.exposed_comm_us, 2);
  EXPECT_EQ(r.critical_term_us, fresh.critical_term_us);
  EXPECT_DOUBLE_EQ(r.critical_term_us[int(Term::kAllToAll)], 0);
  EXPECT_DOUBLE_EQ(TermSum(r), 3);
}

// Comm on both links partially overlapping compute several times:
//   0 c1 compute 2 [0,2]; 1 m1 intra 3 [0,3]; 2 m2 inter 2, dep c1 [2,4];
//   3 c2 compute 1, dep m1 [3,4]; 4 m3 intra 1, dep c2 [4,5]; 5 c3 compute 2 [4,6].
// comm union [0,3] u [2,4] u [4,5] = [0,5] = 5; compute [0,2],[3,4],[4,6];
// hidden = 2 + 1 + 1 = 4; exposed 1. makespan 6, critical m1, c2, c3.
TEST(SimulatorTest, HiddenCommAcrossSeveralIntervals) {
  OpGraph g;
  const OpId c1 = g.Add(MakeOp("c1", kCompute, 2), {});
  const OpId m1 = g.Add(MakeOp("m1", kIntra, 3), {});
  g.Add(MakeOp("m2", kInter, 2), {c1});
  const OpId c2 = g.Add(MakeOp("c2", kCompute, 1), {m1});
  g.Add(MakeOp("m3", kIntra, 1), {c2});
  const OpId c3 = g.Add(MakeOp("c3", kCompute, 2), {});
  const SimResult r = MustRun(g);
  ExpectTimes(r, {{0, 2, kNoOp, false},
                  {0, 3, kNoOp, true},
                  {2, 4, c1, false},
                  {3, 4, m1, true},
                  {4, 5, c2, false},
                  {4, 6, c2, true}});
  EXPECT_THAT(r.critical_path, ElementsAre(m1, c2, c3));
  EXPECT_DOUBLE_EQ(r.makespan_us, 6);
  EXPECT_DOUBLE_EQ(r.comm_busy_us, 5);
  EXPECT_DOUBLE_EQ(r.compute_busy_us, 5);
  EXPECT_DOUBLE_EQ(r.hidden_comm_us, 4);
  EXPECT_DOUBLE_EQ(r.exposed_comm_us, 1);
}

}  // namespace
}  // namespace moeplan::planner

// ---- Cross-check against Boost.Graph algorithms on every schedule's graph ----

#include <boost/graph/topological_sort.hpp>

#include "moeplan/planner/planner.h"

namespace moeplan::planner {
namespace {

ClusterProfile CrossCheckProfile() {
  ClusterProfile p;
  p.name = "crosscheck";
  p.version = 1;
  p.source = ProfileSource::kSpec;
  p.shape = {4, 8};
  p.intra = {2.0, 1e-5};
  p.inter = {8.0, 1e-4};
  p.gemm.peak_tflops = 100;
  p.gemm.launch_overhead_us = 3;
  p.memory = {1000, 2};
  return p;
}

TEST(BoostCrossCheck, ScheduleGraphsAreDagsAndMakespanBoundsLongestPath) {
  const CostModel cost = *CostModel::Create(CrossCheckProfile());
  LayerConfig l;
  l.batch_size = 8;
  l.seq_len = 512;
  l.model_dim = 1024;
  l.hidden_dim = 4096;
  l.num_experts = 32;
  l.top_k = 2;
  l.capacity_factor = 1.0;
  l.parallel = {4, 8, 4, 8, 1};
  absl::StatusOr<LayerPlan> plan = PlanLayer(l, cost);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const Candidate& c : plan->candidates) {
    SCOPED_TRACE(std::string(ScheduleName(c.schedule)));
    const OpBoostGraph g = ToBoostGraph(c.graph());
    ASSERT_EQ(static_cast<int>(boost::num_vertices(g)), c.graph().size());
    // Boost's topological sort throws not_a_dag on a cycle.
    std::vector<size_t> reverse_topo;
    ASSERT_NO_THROW(boost::topological_sort(g, std::back_inserter(reverse_topo)));
    // Longest dependency path (ignoring resources) in topological order.
    std::vector<double> finish(boost::num_vertices(g), 0.0);
    double longest = 0.0;
    for (auto it = reverse_topo.rbegin(); it != reverse_topo.rend(); ++it) {
      double start = 0.0;
      for (auto [e, end] = boost::in_edges(*it, g); e != end; ++e) {
        start = std::max(start, finish[boost::source(*e, g)]);
      }
      finish[*it] = start + g[*it].cost_us;
      longest = std::max(longest, finish[*it]);
    }
    EXPECT_GE(c.total_us() + 1e-9, longest) << "resources can only delay ops";
    EXPECT_GT(longest, 0.0);
    // Consecutive critical-path ops are joined by an edge or share a resource.
    const auto& path = c.sim.critical_path;
    for (size_t i = 1; i < path.size(); ++i) {
      const bool edge = boost::edge(path[i - 1], path[i], g).second;
      const bool shared =
          (c.graph().op(path[i - 1]).resources & c.graph().op(path[i]).resources) != 0;
      EXPECT_TRUE(edge || shared) << c.graph().op(path[i]).Name();
    }
  }
}

}  // namespace
}  // namespace moeplan::planner
