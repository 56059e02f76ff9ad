// The sweep moeplan-profile runs: group shapes and sibling groups of a node
// layout, SAA's groups, nccl-tests' bandwidth factors, and the point list.
#include "moeplan/profiler/sweep.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "moeplan/planner/schedules.h"

namespace moeplan::profiler {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

MATCHER_P2(Shape, ranks, nodes, "") { return arg.ranks == ranks && arg.nodes == nodes; }

TEST(ProfiledShapes, IntraInterAndHierarchical) {
  EXPECT_THAT(ProfiledShapes({1, 4}), ElementsAre(Shape(2, 1), Shape(4, 1)));
  EXPECT_THAT(ProfiledShapes({2, 2}), ElementsAre(Shape(2, 1), Shape(2, 2), Shape(4, 2)));
  EXPECT_THAT(ProfiledShapes({2, 4}),
              ElementsAre(Shape(2, 1), Shape(4, 1), Shape(2, 2), Shape(4, 2), Shape(8, 2)));
  EXPECT_THAT(ProfiledShapes({1, 1}), ElementsAre());
}

// Every shape's sibling groups partition the world; each group has keys
// 0..ranks-1, spans exactly shape.nodes nodes with RanksPerNode() ranks on each.
TEST(SlotOf, SiblingGroupsPartitionTheWorld) {
  for (NodeLayout l : {NodeLayout{1, 4}, NodeLayout{2, 2}, NodeLayout{2, 4}, NodeLayout{4, 2}}) {
    for (GroupShape s : ProfiledShapes(l)) {
      std::map<int, std::set<int>> keys;
      std::map<int, std::map<int, int>> per_node;  // color -> node -> ranks
      for (int r = 0; r < l.ranks(); ++r) {
        const GroupSlot slot = SlotOf(l, s, r);
        EXPECT_TRUE(keys[slot.color].insert(slot.key).second) << "duplicate key";
        ++per_node[slot.color][r / l.ranks_per_node];
      }
      ASSERT_EQ(static_cast<int>(keys.size()), GroupsOf(l, s));
      for (const auto& [color, k] : keys) {
        EXPECT_EQ(static_cast<int>(k.size()), s.ranks);
        EXPECT_EQ(*k.begin(), 0);
        EXPECT_EQ(*k.rbegin(), s.ranks - 1);
        EXPECT_EQ(static_cast<int>(per_node[color].size()), s.nodes);
        for (const auto& [node, n] : per_node[color]) EXPECT_EQ(n, s.RanksPerNode());
      }
    }
  }
}

TEST(SlotOf, HandCheckedTwoByFour) {
  const NodeLayout l{2, 4};
  // Hierarchical 4 ranks over 2 nodes: ranks 0,1 (node 0) with 4,5 (node 1).
  EXPECT_EQ(SlotOf(l, {4, 2}, 0).color, SlotOf(l, {4, 2}, 5).color);
  EXPECT_EQ(SlotOf(l, {4, 2}, 5).key, 3);
  EXPECT_NE(SlotOf(l, {4, 2}, 0).color, SlotOf(l, {4, 2}, 2).color);
  // Inter-node pairs: rank r with r + 4.
  EXPECT_EQ(SlotOf(l, {2, 2}, 3).color, SlotOf(l, {2, 2}, 7).color);
  EXPECT_EQ(SlotOf(l, {2, 2}, 7).key, 1);
}

TEST(SaaShapes, AsTheS2PlannerSeesThem) {
  const std::vector<SaaShape> two = SaaShapes({2, 2});
  ASSERT_EQ(two.size(), 1u);
  EXPECT_EQ(two[0].gather_ranks, 2);
  EXPECT_THAT(two[0].gather, Shape(2, 1));
  EXPECT_THAT(two[0].a2a, Shape(2, 2));  // strided by 2 = G: one rank per node
  EXPECT_EQ(two[0].a2a_ranks_per_node, 1);

  const std::vector<SaaShape> one = SaaShapes({1, 4});
  ASSERT_EQ(one.size(), 1u);  // N = 2 (N = 4 leaves no AlltoAll)
  EXPECT_THAT(one[0].a2a, Shape(2, 1));
  EXPECT_EQ(one[0].a2a_ranks_per_node, 2);

  const std::vector<SaaShape> eight = SaaShapes({2, 4});
  ASSERT_EQ(eight.size(), 2u);  // N = 2, 4
  EXPECT_THAT(eight[0].a2a, Shape(4, 2));
  EXPECT_EQ(eight[0].a2a_ranks_per_node, 2);
  EXPECT_THAT(eight[1].a2a, Shape(2, 2));
}

TEST(BandwidthOf, NcclTestsFactors) {
  // 1e6 bytes in 1000 us is 1 GB/s of algorithm bandwidth.
  EXPECT_DOUBLE_EQ(BandwidthOf(Collective::kAllReduce, 4, 1'000'000, 1000).algbw, 1.0);
  EXPECT_DOUBLE_EQ(BandwidthOf(Collective::kAllReduce, 4, 1'000'000, 1000).busbw, 1.5);
  // AllGather counts the gathered output: 4 x 1e6 bytes.
  EXPECT_DOUBLE_EQ(BandwidthOf(Collective::kAllGather, 4, 1'000'000, 1000).algbw, 4.0);
  EXPECT_DOUBLE_EQ(BandwidthOf(Collective::kAllGather, 4, 1'000'000, 1000).busbw, 3.0);
  EXPECT_DOUBLE_EQ(BandwidthOf(Collective::kReduceScatter, 2, 1'000'000, 1000).busbw, 1.0);
  EXPECT_DOUBLE_EQ(BandwidthOf(Collective::kAllToAll, 8, 1'000'000, 1000).busbw, 0.875);
  EXPECT_DOUBLE_EQ(BandwidthOf(Collective::kSendRecv, 2, 1'000'000, 1000).busbw, 1.0);
  EXPECT_DOUBLE_EQ(BandwidthOf(Collective::kSendRecv, 2, 1'000'000, 0).algbw, 0.0);
}

TEST(PlanSweep, CountsPointsAndLeavesOutWithReasons) {
  SweepOptions o;
  o.min_bytes = 1024;
  o.max_bytes = 4096;  // 1, 2, 4 KiB
  o.gemm_sizes = {16, 4096};
  o.gemm_max_flop = 2.0 * 4096 * 4096 * 16;  // only 4096^3 is above the cap
  o.memory_tokens = {256};
  absl::StatusOr<Sweep> s = PlanSweep({2, 2}, o);
  ASSERT_TRUE(s.ok()) << s.status();
  std::map<Point::Kind, int> kinds;
  for (const Point& p : s->points) ++kinds[p.kind];
  // Shapes {2,1}, {2,2}, {4,2}: 4 collectives x 3 sizes each, SendRecv on the
  // two pairs only; irregular AlltoAlls: loads 1 (even) and 2 on every
  // shape, load 4 on the 4-rank one, 3 sizes each.
  EXPECT_EQ(kinds[Point::Kind::kCollective], 3 * 4 * 3 + 2 * 3 + (3 + 3 + 1) * 3);
  int irregular = 0;
  for (const Point& p : s->points) {
    if (!p.irregular) continue;
    ++irregular;
    EXPECT_EQ(p.collective, Collective::kAllToAll);
    EXPECT_LE(p.load, p.shape.ranks);
    EXPECT_EQ(p.context_us, 0.0) << "irregular AlltoAlls are measured isolated";
  }
  EXPECT_EQ(irregular, (3 + 3 + 1) * 3);
  EXPECT_EQ(kinds[Point::Kind::kSaa], 1 * 2 * 3);  // N = 2, forward and dual
  // The probe and 7 of the 8 grid points (the cap is inclusive), each as NN,
  // NT and TN.
  EXPECT_EQ(kinds[Point::Kind::kGemm], 1 + 7 * 3);
  EXPECT_EQ(kinds[Point::Kind::kMemory], 6);  // copy, order, iorder, route, gelu, gelu_bwd
  ASSERT_EQ(s->skipped.size(), 1u);
  EXPECT_THAT(s->skipped[0],
              HasSubstr("gemm 4096x4096x4096 (NN, NT, TN): 137 GFLOP, above --gemm-max-gflop"));

  o.max_point_bytes = 8 * 1024;  // AllGather of 4 KiB on 4 ranks needs 20 KiB
  s = PlanSweep({2, 2}, o);
  ASSERT_TRUE(s.ok());
  bool guard = false;
  for (const std::string& why : s->skipped)
    guard = guard || why.find("per rank, more than") != std::string::npos;
  EXPECT_TRUE(guard);
}

// Irregular AlltoAlls are a part of their own: without any other collective
// they are still swept, the even one first, and labelled with their load.
TEST(PlanSweep, UnevenAlltoAllsStandAlone) {
  SweepOptions o;
  o.min_bytes = o.max_bytes = 1 << 20;
  o.collectives.clear();
  o.saa = false;
  o.gemm_sizes.clear();
  o.memory_tokens.clear();
  o.alltoallv_loads = {2.0, 4.0};
  absl::StatusOr<Sweep> s = PlanSweep({2, 2}, o);
  ASSERT_TRUE(s.ok()) << s.status();
  std::vector<std::string> labels;
  for (const Point& p : s->points) labels.push_back(p.Label());  // no GEMM launch probe either
  EXPECT_THAT(labels, ::testing::ElementsAre("alltoallv 2 ranks/1 node 1 MiB heaviest 1x",
                                             "alltoallv 2 ranks/1 node 1 MiB heaviest 2x",
                                             "alltoallv 2 ranks/2 nodes 1 MiB heaviest 1x",
                                             "alltoallv 2 ranks/2 nodes 1 MiB heaviest 2x",
                                             "alltoallv 4 ranks/2 nodes 1 MiB heaviest 1x",
                                             "alltoallv 4 ranks/2 nodes 1 MiB heaviest 2x",
                                             "alltoallv 4 ranks/2 nodes 1 MiB heaviest 4x"));
  o.alltoallv_loads = {1.0};
  EXPECT_THAT(std::string(PlanSweep({2, 2}, o).status().message()),
              HasSubstr("--alltoallv-loads: must be > 1"));
}

TEST(PlanSweep, RejectsBadOptionsNamingTheFlag) {
  SweepOptions o;
  o.max_bytes = 512;
  EXPECT_THAT(std::string(PlanSweep({1, 2}, o).status().message()), HasSubstr("--max-bytes"));
  o = SweepOptions();
  o.size_step = 1;
  EXPECT_THAT(std::string(PlanSweep({1, 2}, o).status().message()), HasSubstr("--size-step"));
  o = SweepOptions();
  o.gemm_sizes = {0};
  EXPECT_THAT(std::string(PlanSweep({1, 2}, o).status().message()), HasSubstr("--gemm-sizes"));
}

// Labels name sizes as base's FormatBytes does (its units are tested in
// tests/base/base_test.cc).
TEST(Point, LabelNamesShapeAndSize) {
  Point p;
  p.collective = Collective::kAllGather;
  p.shape = {4, 2};
  p.bytes = 1536;
  EXPECT_EQ(p.Label(), "allgather 4 ranks/2 nodes 1.5 KiB");
  p.bytes = int64_t{256} << 20;
  EXPECT_EQ(p.Label(), "allgather 4 ranks/2 nodes 256 MiB");
}

}  // namespace
}  // namespace moeplan::profiler
