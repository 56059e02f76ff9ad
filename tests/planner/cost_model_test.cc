// Closed-form checks of the cost model (docs/cost-model.md): link-level fallback formulas
// for every collective on intra, inter and hierarchical shapes, fitted overrides,
// GEMM efficiency interpolation, memory-bound kernels and profile validation.
#include "moeplan/planner/cost_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "moeplan/base/strings.h"
#include "moeplan/planner/profile.h"
#include "test_profile.h"

namespace moeplan::planner {
namespace {

using testing::RoundNumberProfile;
ClusterProfile MakeProfile() { return RoundNumberProfile(); }

CostModel MakeModel(ClusterProfile p = MakeProfile()) {
  absl::StatusOr<CostModel> m = CostModel::Create(std::move(p));
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

constexpr Collective kAllCollectives[] = {Collective::kAllReduce, Collective::kAllGather,
                                          Collective::kReduceScatter, Collective::kAllToAll,
                                          Collective::kSendRecv};

TEST(CostModelTest, CollectiveNames) {
  EXPECT_EQ(CollectiveName(Collective::kAllReduce), "allreduce");
  EXPECT_EQ(CollectiveName(Collective::kAllGather), "allgather");
  EXPECT_EQ(CollectiveName(Collective::kReduceScatter), "reducescatter");
  EXPECT_EQ(CollectiveName(Collective::kAllToAll), "alltoall");
  EXPECT_EQ(CollectiveName(Collective::kSendRecv), "sendrecv");
}

TEST(CostModelTest, FallbackIntraShape) {
  const CostModel m = MakeModel();
  const GroupShape s{4, 1};  // intra: alpha 2, beta 0.001
  const double n = 4000;
  EXPECT_FALSE(s.SpansNodes());
  EXPECT_EQ(&m.LinkFor(s), &m.profile().intra);
  // AllReduce 2(s-1)(a + n/s b) = 2*3*(2 + 1000*0.001) = 6*3 = 18.
  EXPECT_REL(m.CollectiveUs(Collective::kAllReduce, s, n), 18.0);
  // AllGather (s-1)(a + n b) = 3*(2 + 4) = 18.
  EXPECT_REL(m.CollectiveUs(Collective::kAllGather, s, n), 18.0);
  // ReduceScatter: same formula = 18.
  EXPECT_REL(m.CollectiveUs(Collective::kReduceScatter, s, n), 18.0);
  // AllToAll (s-1)(a + n/s b) = 3*(2 + 1) = 9.
  EXPECT_REL(m.CollectiveUs(Collective::kAllToAll, s, n), 9.0);
  // SendRecv on an intra pair: a + n b = 2 + 4 = 6.
  EXPECT_REL(m.CollectiveUs(Collective::kSendRecv, GroupShape{2, 1}, n), 6.0);
  // A larger intra group: AllGather over 8 ranks of 500 B = 7*(2 + 0.5) = 17.5.
  EXPECT_REL(m.CollectiveUs(Collective::kAllGather, GroupShape{8, 1}, 500), 17.5);
}

TEST(CostModelTest, FallbackInterShape) {
  const CostModel m = MakeModel();
  const GroupShape s{4, 4};  // one rank per node: inter, alpha 10, beta 0.01
  const double n = 4000;
  EXPECT_TRUE(s.SpansNodes());
  EXPECT_EQ(&m.LinkFor(s), &m.profile().inter);
  // AllReduce 2*3*(10 + 1000*0.01) = 6*20 = 120.
  EXPECT_REL(m.CollectiveUs(Collective::kAllReduce, s, n), 120.0);
  // AllGather 3*(10 + 40) = 150.
  EXPECT_REL(m.CollectiveUs(Collective::kAllGather, s, n), 150.0);
  EXPECT_REL(m.CollectiveUs(Collective::kReduceScatter, s, n), 150.0);
  // AllToAll 3*(10 + 10) = 60.
  EXPECT_REL(m.CollectiveUs(Collective::kAllToAll, s, n), 60.0);
  // SendRecv across nodes: 10 + 40 = 50.
  EXPECT_REL(m.CollectiveUs(Collective::kSendRecv, GroupShape{2, 2}, n), 50.0);
}

TEST(CostModelTest, FallbackHierarchicalShapeUsesInterLink) {
  const CostModel m = MakeModel();
  const GroupShape s{16, 2};  // 8 ranks on each of 2 nodes: slowest link = inter
  const double n = 1600;
  EXPECT_TRUE(s.SpansNodes());
  EXPECT_EQ(s.RanksPerNode(), 8);
  EXPECT_EQ(&m.LinkFor(s), &m.profile().inter);
  // AllReduce 2*15*(10 + 100*0.01) = 30*11 = 330.
  EXPECT_REL(m.CollectiveUs(Collective::kAllReduce, s, n), 330.0);
  // AllGather 15*(10 + 16) = 390.
  EXPECT_REL(m.CollectiveUs(Collective::kAllGather, s, n), 390.0);
  EXPECT_REL(m.CollectiveUs(Collective::kReduceScatter, s, n), 390.0);
  // AllToAll 15*(10 + 1) = 165.
  EXPECT_REL(m.CollectiveUs(Collective::kAllToAll, s, n), 165.0);
  // SendRecv: a + n b with the inter link = 10 + 16 = 26.
  EXPECT_REL(m.CollectiveUs(Collective::kSendRecv, s, n), 26.0);
  // Another hierarchical shape, 4 ranks on 2 nodes: AllToAll 3*(10 + 400*0.01) = 42.
  EXPECT_REL(m.CollectiveUs(Collective::kAllToAll, GroupShape{4, 2}, n), 42.0);
}

TEST(CostModelTest, GroupsOfOneRankCostNothing) {
  const CostModel m = MakeModel();
  for (Collective c : kAllCollectives) {
    SCOPED_TRACE(std::string(CollectiveName(c)));
    EXPECT_EQ(m.CollectiveUs(c, GroupShape{1, 1}, 1e9), 0.0);
    EXPECT_EQ(m.CollectiveUs(c, GroupShape{1, 1}, 0.0), 0.0);
  }
}

TEST(CostModelTest, ZeroBytesCostsOnlyStartUp) {
  const CostModel m = MakeModel();
  // AllReduce of 0 bytes on {4,4}: 2*3*10 = 60; AllToAll: 3*10 = 30; SendRecv: 10.
  EXPECT_REL(m.CollectiveUs(Collective::kAllReduce, GroupShape{4, 4}, 0), 60.0);
  EXPECT_REL(m.CollectiveUs(Collective::kAllToAll, GroupShape{4, 4}, 0), 30.0);
  EXPECT_REL(m.CollectiveUs(Collective::kSendRecv, GroupShape{2, 2}, 0), 10.0);
}

TEST(CostModelTest, FitOverridesExactlyItsShapeAndCollective) {
  ClusterProfile p = MakeProfile();
  p.collectives.push_back({Collective::kAllToAll, GroupShape{4, 4}, AlphaBeta{1.0, 0.5}, {}});
  p.collectives.push_back({Collective::kAllReduce, GroupShape{8, 1}, AlphaBeta{7.0, 0.25}, {}});
  const CostModel m = MakeModel(p);

  // The fitted pairs: t = alpha + beta n.
  EXPECT_TRUE(m.HasFit(Collective::kAllToAll, GroupShape{4, 4}));
  EXPECT_REL(m.CollectiveUs(Collective::kAllToAll, GroupShape{4, 4}, 4000), 1.0 + 0.5 * 4000);
  EXPECT_TRUE(m.HasFit(Collective::kAllReduce, GroupShape{8, 1}));
  EXPECT_REL(m.CollectiveUs(Collective::kAllReduce, GroupShape{8, 1}, 800), 7.0 + 0.25 * 800);

  // Same shape, other collective: fallback. AllGather {4,4}, 4000 B = 150 (see above).
  EXPECT_FALSE(m.HasFit(Collective::kAllGather, GroupShape{4, 4}));
  EXPECT_REL(m.CollectiveUs(Collective::kAllGather, GroupShape{4, 4}, 4000), 150.0);
  // AllReduce {4,4}: 120 (fallback).
  EXPECT_FALSE(m.HasFit(Collective::kAllReduce, GroupShape{4, 4}));
  EXPECT_REL(m.CollectiveUs(Collective::kAllReduce, GroupShape{4, 4}, 4000), 120.0);
  // Same collective, other shapes: fallback.
  // AllToAll {4,1}, 4000 B = 9 (intra); {8,8}: 7*(10 + 500*0.01) = 105; {4,2}: 3*(10+10) = 60.
  EXPECT_FALSE(m.HasFit(Collective::kAllToAll, GroupShape{4, 1}));
  EXPECT_REL(m.CollectiveUs(Collective::kAllToAll, GroupShape{4, 1}, 4000), 9.0);
  EXPECT_FALSE(m.HasFit(Collective::kAllToAll, GroupShape{8, 8}));
  EXPECT_REL(m.CollectiveUs(Collective::kAllToAll, GroupShape{8, 8}, 4000), 105.0);
  EXPECT_FALSE(m.HasFit(Collective::kAllToAll, GroupShape{4, 2}));
  EXPECT_REL(m.CollectiveUs(Collective::kAllToAll, GroupShape{4, 2}, 4000), 60.0);
  // AllReduce {8,2} (same ranks, other nodes): 2*7*(10 + 100*0.01) = 154.
  EXPECT_FALSE(m.HasFit(Collective::kAllReduce, GroupShape{8, 2}));
  EXPECT_REL(m.CollectiveUs(Collective::kAllReduce, GroupShape{8, 2}, 800), 154.0);
  // A fitted shape of one rank is impossible, and groups of one still cost 0.
  EXPECT_EQ(m.CollectiveUs(Collective::kAllToAll, GroupShape{1, 1}, 4000), 0.0);
}

TEST(CostModelTest, NoFitsMeansHasFitIsFalseEverywhere) {
  const CostModel m = MakeModel();
  for (Collective c : kAllCollectives) {
    EXPECT_FALSE(m.HasFit(c, GroupShape{2, 1}));
    EXPECT_FALSE(m.HasFit(c, GroupShape{4, 4}));
  }
}

TEST(CostModelTest, GemmWithEmptyGridHasEfficiencyOne) {
  const CostModel m = MakeModel();
  EXPECT_EQ(m.GemmEfficiency(1000, 1000, 1000), 1.0);
  EXPECT_EQ(m.GemmEfficiency(1, 7, 1 << 20), 1.0);
  // 5 + 2*1000^3 / 1e8 = 5 + 20 = 25.
  EXPECT_REL(m.GemmUs(1000, 1000, 1000), 25.0);
  // 5 + 2*256*128*64 / 1e8 = 5 + 4194304/1e8 = 5.04194304.
  EXPECT_REL(m.GemmUs(256, 128, 64), 5.04194304);
  // Empty GEMMs cost nothing (no launch).
  EXPECT_EQ(m.GemmUs(0, 10, 10), 0.0);
  EXPECT_EQ(m.GemmUs(10, 0, 10), 0.0);
  EXPECT_EQ(m.GemmUs(10, 10, 0), 0.0);
}

// 2 x 2 x 2 grid, m {64, 256}, n {32, 128}, k {16, 256}, m-major; entry i = 0.1 (i + 1):
//   (m, n, k) = (64,32,16) .1  (64,32,256) .2  (64,128,16) .3  (64,128,256) .4
//               (256,32,16) .5 (256,32,256) .6 (256,128,16) .7 (256,128,256) .8
ClusterProfile GridProfile() {
  ClusterProfile p = MakeProfile();
  p.gemm.grid.m = {64, 256};
  p.gemm.grid.n = {32, 128};
  p.gemm.grid.k = {16, 256};
  p.gemm.grid.efficiency = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8};
  return p;
}

TEST(CostModelTest, GemmEfficiencyAtGridPoints) {
  const CostModel m = MakeModel(GridProfile());
  EXPECT_REL(m.GemmEfficiency(64, 32, 16), 0.1);
  EXPECT_REL(m.GemmEfficiency(64, 32, 256), 0.2);
  EXPECT_REL(m.GemmEfficiency(64, 128, 16), 0.3);
  EXPECT_REL(m.GemmEfficiency(64, 128, 256), 0.4);
  EXPECT_REL(m.GemmEfficiency(256, 32, 16), 0.5);
  EXPECT_REL(m.GemmEfficiency(256, 32, 256), 0.6);
  EXPECT_REL(m.GemmEfficiency(256, 128, 16), 0.7);
  EXPECT_REL(m.GemmEfficiency(256, 128, 256), 0.8);
}

TEST(CostModelTest, GemmEfficiencyInterpolatesInLogSpace) {
  const CostModel m = MakeModel(GridProfile());
  // m = 128 is the log2 midpoint of 64 and 256 (7 between 6 and 8): the average.
  EXPECT_REL(m.GemmEfficiency(128, 32, 16), (0.1 + 0.5) / 2);    // 0.3
  EXPECT_REL(m.GemmEfficiency(128, 128, 256), (0.4 + 0.8) / 2);  // 0.6
  // n = 64 is the log2 midpoint of 32 and 128.
  EXPECT_REL(m.GemmEfficiency(64, 64, 16), (0.1 + 0.3) / 2);  // 0.2
  // k = 64 is the log2 midpoint of 16 and 256 (6 between 4 and 8).
  EXPECT_REL(m.GemmEfficiency(256, 128, 64), (0.7 + 0.8) / 2);  // 0.75
  // k = 32: log2 5, a quarter of the way from 4 to 8: 0.75*0.1 + 0.25*0.2 = 0.125.
  EXPECT_REL(m.GemmEfficiency(64, 32, 32), 0.125);
  // Linear (not log) interpolation would give m = 160 the midpoint; log space does not:
  // t = (log2 160 - 6) / 2 = 0.66096..., e = 0.1 + 0.4 t.
  EXPECT_REL(m.GemmEfficiency(160, 32, 16), 0.1 + 0.4 * (std::log2(160.0) - 6.0) / 2.0);
  // The centre of the cube: the average of all eight = 0.45.
  EXPECT_REL(m.GemmEfficiency(128, 64, 64), 0.45);
}

TEST(CostModelTest, GemmEfficiencyClampsOutsideTheGrid) {
  const CostModel m = MakeModel(GridProfile());
  EXPECT_REL(m.GemmEfficiency(1, 1, 1), 0.1);
  EXPECT_REL(m.GemmEfficiency(8, 16, 2), 0.1);
  EXPECT_REL(m.GemmEfficiency(1 << 20, 1 << 20, 1 << 20), 0.8);
  EXPECT_REL(m.GemmEfficiency(1 << 20, 1, 1), 0.5);
  EXPECT_REL(m.GemmEfficiency(1, 1 << 20, 1 << 20), 0.4);
  // Clamped on m only, interpolated on n: m below the grid, n = 64: (0.1 + 0.3) / 2.
  EXPECT_REL(m.GemmEfficiency(2, 64, 16), 0.2);
  // Far above m, n midpoint, k midpoint: average of the m = 256 face = 0.65.
  EXPECT_REL(m.GemmEfficiency(100000, 64, 64), 0.65);
}

// GemmEfficiency keeps a per-thread memo of the shapes it was asked: models
// with different grids, asked for the same shapes in turn and for more shapes
// than the memo holds, each answer what they answered the first time.
TEST(CostModelTest, GemmEfficiencyMemoKeepsModelsApart) {
  const CostModel a = MakeModel(GridProfile());
  ClusterProfile pb = GridProfile();
  for (double& e : pb.gemm.grid.efficiency) e = 1.0 - e;  // 0.9 ... 0.2
  const CostModel b = MakeModel(pb);
  EXPECT_REL(a.GemmEfficiency(64, 32, 16), 0.1);
  EXPECT_REL(b.GemmEfficiency(64, 32, 16), 0.9);
  EXPECT_REL(a.GemmEfficiency(64, 32, 16), 0.1);
  // A copy at another element size shares the grid.
  EXPECT_REL(a.AtElementBytes(1).GemmEfficiency(256, 128, 256), 0.8);
  std::vector<double> first;
  for (int64_t m = 1; m <= 4096; m += 3) first.push_back(a.GemmEfficiency(m, 7 * m, 100));
  for (int64_t m = 1; m <= 4096; m += 3) {
    // b's values are 1 - a's: the grid is reversed and interpolation is linear.
    ASSERT_NEAR(b.GemmEfficiency(m, 7 * m, 100), 1.0 - first[static_cast<size_t>(m / 3)], 1e-12)
        << m;
  }
  for (int64_t m = 1; m <= 4096; m += 3) {
    ASSERT_EQ(a.GemmEfficiency(m, 7 * m, 100), first[static_cast<size_t>(m / 3)]) << m;
  }
}

TEST(CostModelTest, GemmTimeUsesInterpolatedEfficiency) {
  const CostModel m = MakeModel(GridProfile());
  // (256, 128, 256): e = 0.8, flops 2*256*128*256 = 16777216; 5 + 16777216 / (1e8*0.8)
  // = 5 + 0.2097152 = 5.2097152.
  EXPECT_REL(m.GemmUs(256, 128, 256), 5.2097152);
  // (128, 64, 64): e = 0.45, flops 2*128*64*64 = 1048576; 5 + 1048576 / 4.5e7.
  EXPECT_REL(m.GemmUs(128, 64, 64), 5.0 + 1048576.0 / 4.5e7);
  // (4096, 4096, 4096): clamped to 0.8; flops 2*2^36 = 137438953472; / 8e7 = 1717.98691840.
  EXPECT_REL(m.GemmUs(4096, 4096, 4096), 5.0 + 1717.9869184);
}

// FP8: 1-byte GEMMs run at gemm.fp8_peak_tflops where the profile sets it, on
// the same efficiency grid; without it, 1-byte GEMMs run at peak_tflops.
TEST(CostModelTest, OneByteGemmsRunAtTheFp8PeakWhereSet) {
  ClusterProfile p = GridProfile();
  p.gemm.fp8_peak_tflops = 2.0 * p.gemm.peak_tflops;
  const CostModel bf16 = MakeModel(p);
  const CostModel fp8 = bf16.AtElementBytes(1);
  for (auto [m, n, k] : {std::array<int64_t, 3>{256, 128, 256},
                         {128, 64, 64},
                         {4096, 4096, 4096},
                         {1, 7, 1 << 20}}) {
    SCOPED_TRACE(Cat(m, "x", n, "x", k));
    const double launch = p.gemm.launch_overhead_us;
    EXPECT_REL(fp8.GemmUs(m, n, k) - launch, (bf16.GemmUs(m, n, k) - launch) / 2.0);
    EXPECT_REL(fp8.BatchedGemmUs(3, m, n, k) - launch,
               (bf16.BatchedGemmUs(3, m, n, k) - launch) / 2.0);
    EXPECT_EQ(fp8.GemmEfficiency(m, n, k), bf16.GemmEfficiency(m, n, k));
    // 2- and 4-byte elements: the peak_tflops model, also from the FP8 copy.
    EXPECT_EQ(bf16.AtElementBytes(2).GemmUs(m, n, k), bf16.GemmUs(m, n, k));
    EXPECT_EQ(bf16.AtElementBytes(4).GemmUs(m, n, k), bf16.GemmUs(m, n, k));
    EXPECT_EQ(fp8.AtElementBytes(2).GemmUs(m, n, k), bf16.GemmUs(m, n, k));
  }
  // (256, 128, 256): e = 0.8; 5 + 16777216 / (2e8 * 0.8) = 5.1048576.
  EXPECT_REL(fp8.GemmUs(256, 128, 256), 5.1048576);
  // Nothing but GEMMs changes, and the profile is the one given.
  EXPECT_EQ(fp8.MemoryBoundUs(1e6), bf16.MemoryBoundUs(1e6));
  EXPECT_EQ(fp8.CollectiveUs(Collective::kAllToAll, GroupShape{8, 2}, 1e6),
            bf16.CollectiveUs(Collective::kAllToAll, GroupShape{8, 2}, 1e6));
  EXPECT_EQ(fp8.profile().gemm.peak_tflops, 100.0);
  EXPECT_EQ(fp8.profile().gemm.fp8_peak_tflops, 200.0);
}

TEST(CostModelTest, WithoutAnFp8PeakOneByteGemmsRunAtPeak) {
  const CostModel bf16 = MakeModel(GridProfile());
  const CostModel fp8 = bf16.AtElementBytes(1);
  for (auto [m, n, k] :
       {std::array<int64_t, 3>{256, 128, 256}, {128, 64, 64}, {4096, 4096, 4096}}) {
    EXPECT_EQ(fp8.GemmUs(m, n, k), bf16.GemmUs(m, n, k));
    EXPECT_EQ(fp8.BatchedGemmUs(2, m, n, k), bf16.BatchedGemmUs(2, m, n, k));
  }
  for (int bytes : {1, 2, 4}) EXPECT_EQ(bf16.PeakTflops(bytes), 100.0) << bytes;
}

TEST(CostModelTest, PeakTflopsIsTheDensePeakOfTheElementSize) {
  ClusterProfile p = MakeProfile();
  p.gemm.fp8_peak_tflops = 250.0;
  const CostModel m = MakeModel(p);
  EXPECT_EQ(m.PeakTflops(1), 250.0);
  EXPECT_EQ(m.PeakTflops(2), 100.0);
  EXPECT_EQ(m.PeakTflops(4), 100.0);
  // The copies answer alike: the peak belongs to the profile, not the copy.
  EXPECT_EQ(m.AtElementBytes(1).PeakTflops(2), 100.0);
  EXPECT_EQ(m.AtElementBytes(2).PeakTflops(1), 250.0);
  // A 1000^3 GEMM at 1 byte: 5 + 2e9 / 2.5e8 = 13 us.
  EXPECT_REL(m.AtElementBytes(1).GemmUs(1000, 1000, 1000), 13.0);
}

TEST(CostModelTest, GemmGridWithSingletonAxes) {
  ClusterProfile p = MakeProfile();
  p.gemm.grid.m = {128};
  p.gemm.grid.n = {128};
  p.gemm.grid.k = {64, 256};
  p.gemm.grid.efficiency = {0.5, 1.0};
  const CostModel m = MakeModel(p);
  EXPECT_REL(m.GemmEfficiency(1, 1, 64), 0.5);
  EXPECT_REL(m.GemmEfficiency(99999, 7, 128), 0.75);  // k = 128: log midpoint of 64, 256
  EXPECT_REL(m.GemmEfficiency(128, 128, 1 << 30), 1.0);
}

TEST(CostModelTest, MemoryBoundKernels) {
  const CostModel m = MakeModel();
  // 3 + bytes / 1e6 B/us.
  EXPECT_REL(m.MemoryBoundUs(2e6), 5.0);
  EXPECT_REL(m.MemoryBoundUs(1), 3.000001);
  EXPECT_REL(m.MemoryBoundUs(5e8), 503.0);
  EXPECT_EQ(m.MemoryBoundUs(0), 0.0);
  EXPECT_EQ(m.MemoryBoundUs(-5), 0.0);
}

TEST(CostModelTest, ActivationUsesItsOwnLinesElseTheMemoryModel) {
  // Unset: the memory model (3 + bytes / 1e6 B/us) for both directions.
  const CostModel plain = MakeModel();
  EXPECT_REL(plain.ActivationUs(2e6, false), 5.0);
  EXPECT_REL(plain.ActivationUs(2e6, true), 5.0);
  EXPECT_EQ(plain.ActivationUs(0, true), 0.0);
  // Forward 10 GB/s + 1 us, backward 4 GB/s + 2 us; memory untouched.
  ClusterProfile p = MakeProfile();
  p.activation.forward = {10.0, 1.0};
  p.activation.backward = {4.0, 2.0};
  absl::StatusOr<CostModel> m = CostModel::Create(p);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_REL(m->ActivationUs(2e6, false), 1.0 + 2e6 / 1e4);
  EXPECT_REL(m->ActivationUs(2e6, true), 2.0 + 2e6 / 4e3);
  EXPECT_REL(m->MemoryBoundUs(2e6), 5.0);
  // Only one direction measured: the other keeps the memory model.
  p.activation.forward = {};
  m = CostModel::Create(p);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_REL(m->ActivationUs(2e6, false), 5.0);
  EXPECT_REL(m->ActivationUs(2e6, true), 502.0);
}

TEST(CostModelTest, LayerKernelsUseTheirOwnLinesElseTheMemoryModel) {
  const CostModel plain = MakeModel();
  EXPECT_REL(plain.OrderUs(2e6, false), 5.0);
  EXPECT_REL(plain.OrderUs(2e6, true), 5.0);
  EXPECT_REL(plain.RouteUs(2e6), 5.0);
  EXPECT_EQ(plain.RouteUs(0), 0.0);
  // order 2 GB/s + 1 us, i-order 1 GB/s + 2 us, route 0.5 GB/s + 4 us.
  ClusterProfile p = MakeProfile();
  p.kernels.order = {2.0, 1.0};
  p.kernels.iorder = {1.0, 2.0};
  p.kernels.route = {0.5, 4.0};
  absl::StatusOr<CostModel> m = CostModel::Create(p);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_REL(m->OrderUs(2e6, false), 1.0 + 2e6 / 2e3);
  EXPECT_REL(m->OrderUs(2e6, true), 2.0 + 2e6 / 1e3);
  EXPECT_REL(m->RouteUs(2e6), 4.0 + 2e6 / 5e2);
  EXPECT_REL(m->MemoryBoundUs(2e6), 5.0);
  EXPECT_REL(m->ActivationUs(2e6, false), 5.0);
  // A launch overhead without a bandwidth is refused, naming the field.
  p.kernels.route = {0.0, 4.0};
  EXPECT_THAT(std::string(CostModel::Create(p).status().message()),
              ::testing::StartsWith("kernels.route.launch_overhead_us: must be 0"));
}

TEST(CostModelTest, CreateKeepsTheProfile) {
  const CostModel m = MakeModel();
  EXPECT_EQ(m.profile().name, "test-4x8");
  EXPECT_EQ(m.profile().shape.nodes, 4);
  EXPECT_EQ(m.profile().shape.gpus_per_node, 8);
  EXPECT_EQ(m.profile().inter.alpha_us, 10.0);
  EXPECT_TRUE(ValidateProfile(MakeProfile()).ok());
  ClusterProfile measured = MakeProfile();
  measured.source = ProfileSource::kMeasured;
  measured.name = "a.b_c-9";
  EXPECT_TRUE(ValidateProfile(measured).ok());
}

struct BadProfileCase {
  std::string label;
  std::function<void(ClusterProfile&)> mutate;
  std::string field_prefix;  // the message must start with this
};

std::vector<BadProfileCase> BadProfileCases() {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  return {
      {"empty name", [](ClusterProfile& p) { p.name = ""; }, "name: must not be empty"},
      {"uppercase name", [](ClusterProfile& p) { p.name = "Test"; }, "name: must match"},
      {"space in name", [](ClusterProfile& p) { p.name = "a b"; }, "name: must match"},
      {"unspecified source", [](ClusterProfile& p) { p.source = ProfileSource::kUnspecified; },
       "source: "},
      {"zero nodes", [](ClusterProfile& p) { p.shape.nodes = 0; }, "nodes: must be >= 1"},
      {"zero gpus per node", [](ClusterProfile& p) { p.shape.gpus_per_node = 0; },
       "gpus_per_node: must be >= 1"},
      {"too many gpus",
       [](ClusterProfile& p) {
         p.shape = {1 << 12, 1 << 9};
       },
       "nodes: "},
      {"negative intra alpha", [](ClusterProfile& p) { p.intra.alpha_us = -1.0; },
       "links.intra.alpha_us: must be >= 0 and <= 1e7 (10 s)"},
      {"nan intra alpha", [nan](ClusterProfile& p) { p.intra.alpha_us = nan; },
       "links.intra.alpha_us: "},
      {"zero intra beta", [](ClusterProfile& p) { p.intra.beta_us_per_byte = 0.0; },
       "links.intra.beta_us_per_byte: must be > 0 and <= 1e3 (1 KB/s)"},
      {"absurd intra alpha", [](ClusterProfile& p) { p.intra.alpha_us = 1e300; },
       "links.intra.alpha_us: must be >= 0 and <= 1e7 (10 s) (got 1e+300)"},
      {"negative inter alpha", [](ClusterProfile& p) { p.inter.alpha_us = -0.5; },
       "links.inter.alpha_us: "},
      {"zero inter beta", [](ClusterProfile& p) { p.inter.beta_us_per_byte = 0.0; },
       "links.inter.beta_us_per_byte: must be > 0 and <= 1e3"},
      {"infinite inter beta", [inf](ClusterProfile& p) { p.inter.beta_us_per_byte = inf; },
       "links.inter.beta_us_per_byte: "},
      {"fit of one rank",
       [](ClusterProfile& p) {
         p.collectives.push_back({Collective::kAllGather, GroupShape{1, 1}, AlphaBeta{1, 1}, {}});
       },
       "collectives[0].shape.ranks: must be >= 2"},
      {"fit nodes not dividing ranks",
       [](ClusterProfile& p) {
         p.collectives.push_back({Collective::kAllGather, GroupShape{6, 4}, AlphaBeta{1, 1}, {}});
       },
       "collectives[0].shape.nodes: "},
      {"fit with negative alpha",
       [](ClusterProfile& p) {
         p.collectives.push_back({Collective::kAllGather, GroupShape{4, 1}, AlphaBeta{1, 1}, {}});
         p.collectives.push_back({Collective::kAllToAll, GroupShape{4, 1}, AlphaBeta{-1, 1}, {}});
       },
       "collectives[1].cost.alpha_us: "},
      {"fit with zero beta",
       [](ClusterProfile& p) {
         p.collectives.push_back({Collective::kAllToAll, GroupShape{4, 1}, AlphaBeta{1, 0}, {}});
       },
       "collectives[0].cost.beta_us_per_byte: "},
      {"duplicate fit",
       [](ClusterProfile& p) {
         p.collectives.push_back({Collective::kAllToAll, GroupShape{4, 4}, AlphaBeta{1, 1}, {}});
         p.collectives.push_back({Collective::kAllGather, GroupShape{4, 4}, AlphaBeta{1, 1}, {}});
         p.collectives.push_back({Collective::kAllToAll, GroupShape{4, 4}, AlphaBeta{2, 2}, {}});
       },
       "collectives[2]: duplicate (collective, shape) fit"},
      {"zero peak", [](ClusterProfile& p) { p.gemm.peak_tflops = 0; },
       "gemm.peak_tflops: must be > 0 and <= 1e6"},
      {"negative fp8 peak", [](ClusterProfile& p) { p.gemm.fp8_peak_tflops = -1; },
       "gemm.fp8_peak_tflops: must be > 0 and <= 1e6 when set (got -1)"},
      {"fp8 peak too large", [](ClusterProfile& p) { p.gemm.fp8_peak_tflops = 2e6; },
       "gemm.fp8_peak_tflops: must be > 0 and <= 1e6 when set"},
      {"nan fp8 peak",
       [](ClusterProfile& p) { p.gemm.fp8_peak_tflops = std::numeric_limits<double>::quiet_NaN(); },
       "gemm.fp8_peak_tflops: must be > 0 and <= 1e6 when set"},
      {"fp8 peak below the peak", [](ClusterProfile& p) { p.gemm.fp8_peak_tflops = 50; },
       "gemm.fp8_peak_tflops: must be >= gemm.peak_tflops when set (got 50 < 100)"},
      {"too many fits",
       [](ClusterProfile& p) {
         for (int r = 2; r < 5000; ++r) {
           p.collectives.push_back({Collective::kAllToAll, GroupShape{r, 1}, AlphaBeta{1, 1}, {}});
         }
       },
       "collectives: must have at most 4096 fits (got 4998)"},
      {"negative gemm overhead", [](ClusterProfile& p) { p.gemm.launch_overhead_us = -1; },
       "gemm.launch_overhead_us: "},
      {"grid without m axis",
       [](ClusterProfile& p) {
         p.gemm.grid.n = {1};
         p.gemm.grid.k = {1};
         p.gemm.grid.efficiency = {1.0};
       },
       "gemm.m: must not be empty"},
      {"bad grid size",
       [](ClusterProfile& p) {
         p.gemm.grid.m = {64, 256};
         p.gemm.grid.n = {32};
         p.gemm.grid.k = {16};
         p.gemm.grid.efficiency = {0.5, 0.5, 0.5};
       },
       "gemm.efficiency: must have |m|*|n|*|k| entries"},
      {"non-increasing axis",
       [](ClusterProfile& p) {
         p.gemm.grid.m = {64};
         p.gemm.grid.n = {32, 128, 128};
         p.gemm.grid.k = {16};
         p.gemm.grid.efficiency = {0.5, 0.5, 0.5};
       },
       "gemm.n[2]: axis must be strictly increasing"},
      {"zero axis entry",
       [](ClusterProfile& p) {
         p.gemm.grid.m = {64};
         p.gemm.grid.n = {32};
         p.gemm.grid.k = {0, 16};
         p.gemm.grid.efficiency = {0.5, 0.5};
       },
       "gemm.k[0]: must be > 0"},
      {"efficiency above one",
       [](ClusterProfile& p) {
         p.gemm.grid = GridProfile().gemm.grid;
         p.gemm.grid.efficiency[3] = 1.5;
       },
       "gemm.efficiency[3]: must be in (0, 1]"},
      {"skew gamma above one",
       [](ClusterProfile& p) {
         p.alltoall_skew = {{{4, 2}, 1.5}};
       },
       "alltoall_skew[0].gamma: must be in [0, 1]"},
      {"skew gamma on one rank",
       [](ClusterProfile& p) {
         p.alltoall_skew = {{{1, 1}, 0.5}};
       },
       "alltoall_skew[0].shape: ranks must be >= 2"},
      {"skew gamma twice for a shape",
       [](ClusterProfile& p) {
         p.alltoall_skew = {{{4, 2}, 0.5}, {{4, 2}, 0.2}};
       },
       "alltoall_skew[1].shape: duplicate shape"},
      {"zero efficiency",
       [](ClusterProfile& p) {
         p.gemm.grid = GridProfile().gemm.grid;
         p.gemm.grid.efficiency[0] = 0.0;
       },
       "gemm.efficiency[0]: must be in (0, 1]"},
      {"nan memory bandwidth", [nan](ClusterProfile& p) { p.memory.bandwidth_gbytes_per_s = nan; },
       "memory.bandwidth_gbytes_per_s: must be finite and > 0"},
      {"negative memory overhead", [](ClusterProfile& p) { p.memory.launch_overhead_us = -2; },
       "memory.launch_overhead_us: "},
      {"negative activation bandwidth",
       [](ClusterProfile& p) { p.activation.forward.bandwidth_gbytes_per_s = -1; },
       "activation.forward.bandwidth_gbytes_per_s: must be finite and >= 0"},
      {"inf activation overhead",
       [](ClusterProfile& p) {
         p.activation.backward = {10.0, std::numeric_limits<double>::infinity()};
       },
       "activation.backward.launch_overhead_us: must be finite and >= 0"},
      {"activation overhead without bandwidth",
       [](ClusterProfile& p) { p.activation.backward.launch_overhead_us = 4; },
       "activation.backward.launch_overhead_us: must be 0 when bandwidth_gbytes_per_s is 0"},
      // A profile put directly (PutProfile) with a correction no refit may fit
      // planned a 1,264 us layer in 0.001 us.
      {"in-context scale below the refit's bound",
       [](ClusterProfile& p) {
         p.context.ops = {{"fwd.gate", 1, 0.0, 1e-6}};
       },
       "context.ops[0].scale: must be >= 0.01 and <= 100"},
  };
}

TEST(CostModelTest, BadProfilesAreRejectedNamingTheField) {
  for (const BadProfileCase& c : BadProfileCases()) {
    SCOPED_TRACE(c.label);
    ClusterProfile p = MakeProfile();
    c.mutate(p);
    const absl::Status v = ValidateProfile(p);
    EXPECT_EQ(v.code(), absl::StatusCode::kInvalidArgument) << v;
    const std::string msg(View(v.message()));
    EXPECT_EQ(msg.rfind(c.field_prefix, 0), 0u) << "message: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find("(got "), std::string::npos) << msg;

    absl::StatusOr<CostModel> m = CostModel::Create(p);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status(), v);
  }
}

}  // namespace
}  // namespace moeplan::planner

namespace moeplan::planner {
namespace {

// A piecewise fit: the piece whose range holds n applies, boundaries
// included in the upper piece; below the first boundary the first piece.
TEST(CostModelPiecewise, PicksThePieceForTheSize) {
  ClusterProfile p = testing::RoundNumberProfile();
  CollectiveFit f{Collective::kAllToAll, GroupShape{4, 1}, AlphaBeta{100.0, 1.0}, {}};
  f.pieces = {{0.0, {1.0, 0.5}}, {1024.0, {10.0, 0.25}}, {1 << 20, {50.0, 0.125}}};
  p.collectives.push_back(f);
  absl::StatusOr<CostModel> m = CostModel::Create(p);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_DOUBLE_EQ(m->CollectiveUs(Collective::kAllToAll, {4, 1}, 1000), 1.0 + 500.0);
  EXPECT_DOUBLE_EQ(m->CollectiveUs(Collective::kAllToAll, {4, 1}, 1024), 10.0 + 256.0);
  EXPECT_DOUBLE_EQ(m->CollectiveUs(Collective::kAllToAll, {4, 1}, 1 << 20), 50.0 + 131072.0);
  EXPECT_DOUBLE_EQ(m->CollectiveUs(Collective::kAllToAll, {4, 1}, 4 << 20), 50.0 + 524288.0);
}

TEST(CostModelPiecewise, RejectsBadPiecesNamingTheField) {
  auto err = [](std::vector<FitPiece> pieces) {
    ClusterProfile p = testing::RoundNumberProfile();
    CollectiveFit f{Collective::kAllToAll, GroupShape{4, 1}, AlphaBeta{1.0, 1.0}, {}};
    f.pieces = std::move(pieces);
    p.collectives.push_back(f);
    return std::string(CostModel::Create(p).status().message());
  };
  EXPECT_THAT(err({{8.0, {1, 1}}}), ::testing::HasSubstr("pieces[0].from_bytes: must be 0"));
  EXPECT_THAT(
      err({{0.0, {1, 1}}, {0.0, {1, 1}}}),
      ::testing::HasSubstr("pieces[1].from_bytes: must be greater than the previous piece's"));
  EXPECT_THAT(err({{0.0, {1, 1}}, {64.0, {1, 0}}}), ::testing::HasSubstr("pieces[1].cost"));
  std::vector<FitPiece> many;
  for (int i = 0; i < 9; ++i) many.push_back({i * 10.0, {1, 1}});
  EXPECT_THAT(err(many), ::testing::HasSubstr("at most 8 pieces"));
}

}  // namespace
}  // namespace moeplan::planner
