// Multi-rank tests of the executor on the CPU + MPI backend, run by ctest under
// `mpirun -np 4` and `-np 8` (label "mpi"). Every rank runs every test; checks
// that involve other ranks reduce over MPI so all ranks agree, and every
// collective is reached by all ranks whatever a check found (no early ASSERT
// around collectives), so a failure cannot hang the job.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "../planner/test_profile.h"
#include "moeplan/executor/backends.h"
#include "moeplan/executor/check.h"
#include "moeplan/executor/model_runner.h"
#include "moeplan/executor/runner.h"
#include "moeplan/executor/saa.h"
#include "moeplan/planner/layout.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/planner/pipeline_program.h"
#include "moeplan/planner/planner.h"
#include "moeplan/planner/schedules.h"
#include "moeplan/planner/simulator.h"
#include "mpi_world.h"
#include "plan_timeline.h"

namespace moeplan::executor {

Backend* mpi_test::g_backend = nullptr;

namespace {

using mpi_test::g_backend;
using mpi_test::WorldRank;
using mpi_test::WorldSize;
using planner::LayerConfig;
using planner::Schedule;

// S = 32 tokens per MP group, E = 8 experts, top-2. capacity_factor 4 = E/k
// gives T = S: no token can be dropped.
LayerConfig Tiny(int mp, int ep, int esp, double capacity_factor = 4.0) {
  LayerConfig l;
  l.name = "tiny";
  l.batch_size = 2;
  l.seq_len = 16;
  l.model_dim = 32;
  l.hidden_dim = 64;
  l.num_experts = 8;
  l.top_k = 2;
  l.capacity_factor = capacity_factor;
  l.bytes_per_element = 4;
  l.parallel.mp = mp;
  l.parallel.ep = ep;
  l.parallel.esp = esp;
  l.parallel.dp = ep * esp / mp;
  return l;
}

struct Layout {
  int mp, ep, esp;
};
// Layouts with esp == mp (all three schedules) for the world size.
std::vector<Layout> SharedLayouts() {
  const int p = WorldSize();
  std::vector<Layout> out;
  for (int n = 1; n <= p; n *= 2) {
    if (p % n == 0 && 64 % n == 0) out.push_back({n, p / n, n});
  }
  return out;
}

std::unique_ptr<MoeLayerRunner> MakeRunner(const LayerConfig& l, Schedule s, uint64_t seed = 1) {
  RunOptions opt;
  opt.schedule = s;
  opt.seed = seed;
  absl::StatusOr<std::unique_ptr<MoeLayerRunner>> r = MoeLayerRunner::Create(
      l, opt, g_backend->device.get(), g_backend->kernels.get(), g_backend->world.get());
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : nullptr;
}

LayerResults RunLayer(const LayerConfig& l, Schedule s, int iterations = 2) {
  std::unique_ptr<MoeLayerRunner> r = MakeRunner(l, s);
  if (r == nullptr) std::abort();  // Create failed on this rank: the others are stuck anyway
  for (int i = 0; i < iterations; ++i) {
    absl::Status st = r->RunIteration();
    if (!st.ok()) {
      ADD_FAILURE() << st;
      std::abort();
    }
  }
  absl::StatusOr<LayerResults> res = r->Results();
  EXPECT_TRUE(res.ok()) << res.status();
  return res.ok() ? *std::move(res) : LayerResults{};
}

// fp32 tolerance, relative to the tensor's largest magnitude: the schedules sum
// the same terms in different orders (ESP partial sums, gate GEMMs over S or
// S/N rows, weight gradients over differently grouped rows).
constexpr double kTol = 1e-4;

void ExpectSameValues(const LayerResults& ref, const LayerResults& got, const char* what) {
  for (const TensorDiff& d : CompareResults(ref, got)) {
    const double diff = MaxOverWorld(d.max_abs_diff), scale = MaxOverWorld(d.max_abs_ref);
    EXPECT_GT(scale, 0.0) << what << " " << d.tensor << " is all zero: the test proves nothing";
    EXPECT_LE(diff, kTol * scale) << what << ": " << d.tensor << " max |diff| " << diff
                                  << " vs max |ref| " << scale;
  }
}

// Every rank's expert-weight-gradient shard placed in the global [E][M][F]
// and [E][H][M] tensors (F = H, or 2H for SwiGLU experts: the shard's gate
// columns at h, its up columns at H + h), summed over ranks (each element
// comes from one rank).
std::vector<double> GlobalExpertGrads(const LayerConfig& l, const LayerResults& r) {
  const RankPlace pl = PlaceOf(l.parallel, WorldRank());
  const int64_t m = l.model_dim, h = l.hidden_dim, el = l.num_experts / l.parallel.ep,
                hs = l.hidden_dim / l.parallel.esp;
  const int64_t halves = l.gated_linear_unit ? 2 : 1, f = halves * h, fs = halves * hs;
  const int64_t e0 = int64_t{pl.ep_rank} * el, h0 = int64_t{pl.esp_rank} * hs;
  const size_t w2_base = static_cast<size_t>(l.num_experts * m * f);
  std::vector<double> g(w2_base + static_cast<size_t>(l.num_experts * h * m), 0.0);
  for (int64_t e = 0; e < el; ++e) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < hs; ++j) {
        for (int64_t half = 0; half < halves; ++half) {
          g[static_cast<size_t>(((e0 + e) * m + i) * f + half * h + h0 + j)] =
              r.dw1[static_cast<size_t>((e * m + i) * fs + half * hs + j)];
        }
        g[w2_base + static_cast<size_t>(((e0 + e) * h + h0 + j) * m + i)] =
            r.dw2[static_cast<size_t>((e * hs + j) * m + i)];
      }
    }
  }
  std::vector<double> sum(g.size());
  MPI_Allreduce(g.data(), sum.data(), static_cast<int>(g.size()), MPI_DOUBLE, MPI_SUM,
                MPI_COMM_WORLD);
  return sum;
}

// The dropping rule, computed on the host from the routing's expert choices:
// slots are handed out choice by choice (all first choices in token order,
// then all second choices), an expert keeps its first `capacity`.
std::vector<int32_t> ReferenceSlots(const LayerResults& r, int64_t top_k, int64_t experts,
                                    int64_t capacity) {
  const int64_t tokens = static_cast<int64_t>(r.expert.size()) / top_k;
  std::vector<int32_t> slots(r.expert.size(), -1);
  std::vector<int64_t> used(static_cast<size_t>(experts), 0);
  for (int64_t j = 0; j < top_k; ++j) {
    for (int64_t s = 0; s < tokens; ++s) {
      const size_t i = static_cast<size_t>(s * top_k + j);
      int64_t& u = used[static_cast<size_t>(r.expert[i])];
      if (u < capacity) slots[i] = static_cast<int32_t>(u++);
    }
  }
  return slots;
}

TEST(MpiExecutor, SchedulesComputeTheSameWithoutDrops) {
  for (const Layout& lay : SharedLayouts()) {
    SCOPED_TRACE(testing::Message() << "mp=" << lay.mp << " ep=" << lay.ep << " esp=" << lay.esp);
    const LayerConfig l = Tiny(lay.mp, lay.ep, lay.esp);
    const LayerResults ref = RunLayer(l, Schedule::kDefault);
    EXPECT_EQ(SumOverWorld(DroppedChoices(ref)), 0);
    for (Schedule s : {Schedule::kS1, Schedule::kS2}) {
      SCOPED_TRACE(std::string(planner::ScheduleName(s)));
      const LayerResults got = RunLayer(l, s);
      EXPECT_EQ(SumOverWorld(DroppedChoices(got)), 0);
      ExpectSameValues(ref, got, "no drops");
      // S2 routes exactly as the default; S1 picks the same experts for its
      // S/N tokens (its slots count per rank).
      EXPECT_TRUE(TrueOnAllRanks(SameRouting(ref, got, l.top_k, s == Schedule::kS2)));
    }
  }
}

TEST(MpiExecutor, S2RoutesAndDropsExactlyLikeTheDefault) {
  for (const Layout& lay : SharedLayouts()) {
    if (lay.mp == 1) continue;  // S2 == default trivially
    SCOPED_TRACE(testing::Message() << "mp=" << lay.mp << " ep=" << lay.ep);
    // capacity_factor 0.5: T = ceil(2 * 0.5 * 32 / 8) = 4 slots for ~8 choices per expert.
    const LayerConfig l = Tiny(lay.mp, lay.ep, lay.esp, 0.5);
    const LayerResults ref = RunLayer(l, Schedule::kDefault);
    const LayerResults s2 = RunLayer(l, Schedule::kS2);
    EXPECT_GT(SumOverWorld(DroppedChoices(ref)), 0) << "the test needs dropped tokens";
    EXPECT_TRUE(TrueOnAllRanks(SameRouting(ref, s2, l.top_k, /*slots=*/true)));
    ExpectSameValues(ref, s2, "drops");
  }
}

TEST(MpiExecutor, CapacityIsAppliedChoiceMajorOnTheGatingRank) {
  for (const Layout& lay : SharedLayouts()) {
    if (lay.mp == 1) continue;
    SCOPED_TRACE(testing::Message() << "mp=" << lay.mp);
    const LayerConfig l = Tiny(lay.mp, lay.ep, lay.esp, 0.5);
    const int64_t s = l.batch_size * l.seq_len;
    const int64_t t = planner::Capacity(l.top_k, l.capacity_factor, s, l.num_experts);
    const int64_t t1 = planner::Capacity(l.top_k, l.capacity_factor, s / lay.mp, l.num_experts);
    const LayerResults def = RunLayer(l, Schedule::kDefault);
    const LayerResults s1 = RunLayer(l, Schedule::kS1);
    // The default keeps the first T choices per expert over the MP group's S
    // tokens; S1 (documented behaviour) keeps the first T1 = ceil(k f S/N / E)
    // over each rank's S/N tokens, so it keeps up to N*T1 >= T per expert and
    // drops other tokens.
    EXPECT_EQ(def.slot, ReferenceSlots(def, l.top_k, l.num_experts, t));
    EXPECT_EQ(s1.slot, ReferenceSlots(s1, l.top_k, l.num_experts, t1));
    EXPECT_EQ(static_cast<int64_t>(s1.expert.size()), s / lay.mp * l.top_k);
    EXPECT_EQ(s1.route_offset, PlaceOf(l.parallel, WorldRank()).mp_rank * (s / lay.mp));
    // Top-k does not depend on capacity: the same experts are chosen.
    EXPECT_TRUE(TrueOnAllRanks(SameRouting(def, s1, l.top_k, /*slots=*/false)));
    EXPECT_GE(int64_t{lay.mp} * t1, t);
  }
}

// Two layouts of the same MP groups compute the same: outputs, input and
// gate gradients per rank, and the expert gradients put back into global
// tensors (the shards differ in shape).
void ExpectSameGlobalExperts(const LayerConfig& x, const LayerConfig& y) {
  const LayerResults a = RunLayer(x, Schedule::kDefault);
  const LayerResults b = RunLayer(y, Schedule::kDefault);
  for (const TensorDiff& d : CompareResults(a, b)) {
    if (d.tensor == "dw1" || d.tensor == "dw2") continue;
    EXPECT_LE(MaxOverWorld(d.max_abs_diff), kTol * MaxOverWorld(d.max_abs_ref)) << d.tensor;
  }
  const std::vector<double> ga = GlobalExpertGrads(x, a), gb = GlobalExpertGrads(y, b);
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < ga.size(); ++i) {
    diff = std::max(diff, std::fabs(ga[i] - gb[i]));
    scale = std::max(scale, std::fabs(gb[i]));
  }
  EXPECT_GT(scale, 0.0);
  EXPECT_LE(diff, kTol * scale);
}

TEST(MpiExecutor, DefaultWithTokensDuplicatedOverMpGivesTheSameGradients) {
  // mp=2, esp=1: both MP ranks send the same tokens to every expert (the
  // planner's N_MP-fold redundancy); the runner scales the copies' weight
  // gradients by esp/mp. Against mp=2, esp=2 (no copies) on the same tensors.
  const int p = WorldSize();
  const LayerConfig dup = Tiny(2, p, 1);
  const LayerConfig shard = Tiny(2, p / 2, 2);
  ExpectSameGlobalExperts(dup, shard);
}

// SwiGLU experts (w1 [E/ep][M][2H/esp], [gate | up]) compute the same under
// every schedule, with and without drops, at every layout with esp == mp
// (ep and esp > 1 among them): what --check holds the schedules to.
TEST(MpiExecutor, SwigluExpertsComputeTheSameUnderEverySchedule) {
  for (const Layout& lay : SharedLayouts()) {
    SCOPED_TRACE(testing::Message() << "mp=" << lay.mp << " ep=" << lay.ep << " esp=" << lay.esp);
    LayerConfig l = Tiny(lay.mp, lay.ep, lay.esp);
    l.gated_linear_unit = true;
    const LayerResults ref = RunLayer(l, Schedule::kDefault);
    EXPECT_EQ(ref.dw1.size(), 2 * ref.dw2.size()) << "w1 is 2H/esp wide";
    EXPECT_EQ(SumOverWorld(DroppedChoices(ref)), 0);
    for (Schedule s : {Schedule::kS1, Schedule::kS2}) {
      SCOPED_TRACE(std::string(planner::ScheduleName(s)));
      const LayerResults got = RunLayer(l, s);
      ExpectSameValues(ref, got, "swiglu, no drops");
      EXPECT_TRUE(TrueOnAllRanks(SameRouting(ref, got, l.top_k, s == Schedule::kS2)));
    }
    if (lay.mp == 1) continue;
    l.capacity_factor = 0.5;
    const LayerResults def = RunLayer(l, Schedule::kDefault), s2 = RunLayer(l, Schedule::kS2);
    EXPECT_GT(SumOverWorld(DroppedChoices(def)), 0) << "the test needs dropped tokens";
    EXPECT_TRUE(TrueOnAllRanks(SameRouting(def, s2, l.top_k, /*slots=*/true)));
    ExpectSameValues(def, s2, "swiglu, drops");
  }
}

// The seeded SwiGLU experts are the same global weights however H is sharded:
// mp=2 with esp=1 (whole experts) and esp=2 (each rank the gate and up
// columns of its half of H) give the same outputs and gradients, the shards
// put back into the global [E][M][2H] w1 gradient.
TEST(MpiExecutor, SwigluShardsHoldTheSameGlobalExperts) {
  const int p = WorldSize();
  LayerConfig whole = Tiny(2, p, 1), sharded = Tiny(2, p / 2, 2);
  whole.gated_linear_unit = sharded.gated_linear_unit = true;
  ExpectSameGlobalExperts(whole, sharded);
}

TEST(MpiExecutor, IterationsAreIndependent) {
  const LayerConfig l = Tiny(2, WorldSize() / 2, 2, 0.5);
  for (Schedule s : planner::kAllSchedules) {
    const LayerResults once = RunLayer(l, s, 1);
    const LayerResults thrice = RunLayer(l, s, 3);
    EXPECT_EQ(once.y, thrice.y) << planner::ScheduleName(s);
    EXPECT_EQ(once.dx, thrice.dx) << planner::ScheduleName(s);
    EXPECT_EQ(once.dw1, thrice.dw1) << planner::ScheduleName(s);
    EXPECT_EQ(once.dgate, thrice.dgate) << planner::ScheduleName(s);
  }
}

// A training step's way (moeplan.torch): the forward phase, then the backward
// phase, each on its own call, computes what one iteration computes — bit for
// bit, the same ops in the same order — and the backward's ops are timed after
// the forward's end. Data written through Tensors() is what the ops read.
TEST(MpiExecutor, PhasesRunOneAtATimeComputeTheIteration) {
  const LayerConfig l = Tiny(2, WorldSize() / 2, 2, 0.5);
  for (Schedule s : planner::kAllSchedules) {
    const char* name = planner::ScheduleName(s).data();
    const LayerResults whole = RunLayer(l, s, 1);
    std::unique_ptr<MoeLayerRunner> r = MakeRunner(l, s);
    if (r == nullptr) std::abort();
    ASSERT_TRUE(r->RunPhase(planner::Phase::kForward).ok()) << name;
    for (const OpTime& t : r->timings()) {
      if (t.phase == planner::Phase::kBackward) {
        EXPECT_EQ(t.end_us, 0.0) << name << " " << t.name;
      }
    }
    const double forward_end = r->forward_us();
    ASSERT_TRUE(r->RunPhase(planner::Phase::kBackward).ok()) << name;
    for (const OpTime& t : r->timings()) {
      if (t.phase == planner::Phase::kBackward) {
        EXPECT_GE(t.start_us, forward_end) << name << " " << t.name;
      }
    }
    absl::StatusOr<LayerResults> phased = r->Results();
    ASSERT_TRUE(phased.ok()) << phased.status();
    EXPECT_EQ(phased->y, whole.y) << name;
    EXPECT_EQ(phased->dx, whole.dx) << name;
    EXPECT_EQ(phased->dgate, whole.dgate) << name;
    EXPECT_EQ(phased->dw1, whole.dw1) << name;
    EXPECT_EQ(phased->dw2, whole.dw2) << name;

    // The output gradient written through Tensors(), doubled: every gradient
    // doubles (the layer is linear in dy), the output stays.
    const LayerTensors t = r->Tensors();
    ASSERT_EQ(t.tokens, l.batch_size * l.seq_len);
    float* dy = static_cast<float*>(t.dy);
    for (int64_t i = 0; i < t.tokens * t.model_dim; ++i) dy[i] *= 2.0f;
    ASSERT_TRUE(r->RunPhase(planner::Phase::kBackward).ok()) << name;
    absl::StatusOr<LayerResults> doubled = r->Results();
    ASSERT_TRUE(doubled.ok()) << doubled.status();
    EXPECT_EQ(doubled->y, whole.y) << name;
    for (size_t i = 0; i < whole.dx.size(); ++i) {
      ASSERT_NEAR(doubled->dx[i], 2.0f * whole.dx[i], 1e-5f * (1.0f + std::fabs(whole.dx[i])))
          << name << " dx[" << i << "]";
    }
    for (size_t i = 0; i < whole.dw1.size(); ++i) {
      ASSERT_NEAR(doubled->dw1[i], 2.0f * whole.dw1[i], 1e-5f * (1.0f + std::fabs(whole.dw1[i])))
          << name << " dw1[" << i << "]";
    }
  }
}

// The world's routed choices per expert for a schedule and gate skew, counted
// once per MP group (MP ranks of the default gate the same tokens).
std::vector<int64_t> RoutedPerExpert(const LayerConfig& l, Schedule s, double skew) {
  RunOptions opt;
  opt.schedule = s;
  opt.skew_exponent = skew;
  absl::StatusOr<std::unique_ptr<MoeLayerRunner>> r = MoeLayerRunner::Create(
      l, opt, g_backend->device.get(), g_backend->kernels.get(), g_backend->world.get());
  if (!r.ok()) std::abort();  // the other ranks are stuck in Create's collectives anyway
  EXPECT_TRUE((*r)->RunIteration().ok());
  absl::StatusOr<RouteCounts> c = (*r)->Routing();
  EXPECT_TRUE(c.ok()) << c.status();
  std::vector<int64_t> local(static_cast<size_t>(l.num_experts), 0), sum(local.size());
  if (c.ok() && (*r)->place().mp_rank == 0) local = c->routed;
  MPI_Allreduce(local.data(), sum.data(), static_cast<int>(sum.size()), MPI_INT64_T, MPI_SUM,
                MPI_COMM_WORLD);
  return sum;
}

TEST(MpiExecutor, SkewedGateFollowsTheZipfRanking) {
  const LayerConfig l = Tiny(2, WorldSize() / 2, 2);
  const std::vector<float> bias = SkewBias(l.num_experts, 2.0, /*seed=*/1);
  const int64_t choices = l.batch_size * l.seq_len * l.top_k * (WorldSize() / 2);
  const std::vector<int64_t> flat = RoutedPerExpert(l, Schedule::kDefault, 0.0);
  const std::vector<int64_t> skewed = RoutedPerExpert(l, Schedule::kDefault, 2.0);
  EXPECT_EQ(std::accumulate(flat.begin(), flat.end(), int64_t{0}), choices);
  EXPECT_EQ(std::accumulate(skewed.begin(), skewed.end(), int64_t{0}), choices);
  // Popularity 1, 1/4, 1/9, ...: the gate's own logits (|z| well under 1) barely
  // matter, so nearly every token picks the two most popular experts.
  std::vector<size_t> by_rank(bias.size());
  std::iota(by_rank.begin(), by_rank.end(), size_t{0});
  std::sort(by_rank.begin(), by_rank.end(), [&](size_t a, size_t b) { return bias[a] > bias[b]; });
  const int64_t top2 = skewed[by_rank[0]] + skewed[by_rank[1]];
  EXPECT_GE(top2, choices * 9 / 10) << "the two most popular experts get the choices";
  EXPECT_GT(skewed[by_rank[0]], 3 * choices / l.num_experts);
  EXPECT_LT(*std::max_element(flat.begin(), flat.end()), 3 * choices / l.num_experts)
      << "unbiased routing is roughly balanced";
  // The bias is part of the gate, so S2 still routes exactly like the default
  // and computes the same values.
  const auto run = [&](Schedule s) {
    RunOptions opt;
    opt.schedule = s;
    opt.skew_exponent = 2.0;
    auto r = MoeLayerRunner::Create(l, opt, g_backend->device.get(), g_backend->kernels.get(),
                                    g_backend->world.get());
    if (!r.ok()) std::abort();
    EXPECT_TRUE((*r)->RunIteration().ok());
    absl::StatusOr<LayerResults> res = (*r)->Results();
    EXPECT_TRUE(res.ok()) << res.status();
    return res.ok() ? *std::move(res) : LayerResults{};
  };
  const LayerResults def = run(Schedule::kDefault), s2 = run(Schedule::kS2);
  EXPECT_TRUE(TrueOnAllRanks(SameRouting(def, s2, l.top_k, /*slots=*/true)));
  ExpectSameValues(def, s2, "skew 2");
}

TEST(MpiExecutor, DroplessRunsUnderTheDefaultScheduleOnly) {
  LayerConfig l = Tiny(2, WorldSize() / 2, 2);
  l.dropless = true;
  EXPECT_TRUE(ValidateForExecutor(l, Schedule::kDefault, WorldSize()).ok());
  for (Schedule s : {Schedule::kS1, Schedule::kS2}) {
    const absl::Status st = ValidateForExecutor(l, s, WorldSize());
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(st.message()).find("dropless: the executor runs dropless layers"),
              std::string::npos)
        << st;
  }
}

// A runner's results and its per-expert routing over the world, with a gate skew.
struct SkewedRun {
  LayerResults results;
  std::vector<int64_t> routed;  // [E] over every MP group
  int64_t dropped = 0;          // choices dropped, over every MP group
};
SkewedRun RunSkewed(const LayerConfig& l, double skew) {
  RunOptions opt;
  opt.skew_exponent = skew;
  absl::StatusOr<std::unique_ptr<MoeLayerRunner>> r = MoeLayerRunner::Create(
      l, opt, g_backend->device.get(), g_backend->kernels.get(), g_backend->world.get());
  if (!r.ok()) std::abort();  // the other ranks are stuck in Create's collectives anyway
  for (int i = 0; i < 2; ++i) EXPECT_TRUE((*r)->RunIteration().ok());
  SkewedRun out;
  absl::StatusOr<LayerResults> res = (*r)->Results();
  EXPECT_TRUE(res.ok()) << res.status();
  if (res.ok()) out.results = *std::move(res);
  absl::StatusOr<RouteCounts> c = (*r)->Routing();
  EXPECT_TRUE(c.ok()) << c.status();
  std::vector<int64_t> local(static_cast<size_t>(l.num_experts) + 1, 0), sum(local.size());
  if (c.ok() && (*r)->place().mp_rank == 0) {
    std::copy(c->routed.begin(), c->routed.end(), local.begin());
    local.back() = c->dropped;
  }
  MPI_Allreduce(local.data(), sum.data(), static_cast<int>(sum.size()), MPI_INT64_T, MPI_SUM,
                MPI_COMM_WORLD);
  out.dropped = sum.back();
  sum.pop_back();
  out.routed = std::move(sum);
  return out;
}

// Dropless keeps every choice, so it must compute exactly what the padded
// default computes at a capacity that drops nothing (f = E/k: T = S), however
// unevenly the gate routes: the irregular exchange moves uneven blocks (some
// empty at skew 2), each (peer, expert) block is its own GEMM, and the weight
// gradients add up over the peers' blocks.
TEST(MpiExecutor, DroplessComputesWhatPaddedComputesWhenNothingIsDropped) {
  const int p = WorldSize();
  for (const Layout& lay : std::vector<Layout>{{2, p / 2, 2}, {1, p, 1}, {2, p, 1}}) {
    for (double skew : {0.0, 2.0}) {
      SCOPED_TRACE(testing::Message() << "mp=" << lay.mp << " ep=" << lay.ep << " esp=" << lay.esp
                                      << " skew=" << skew);
      LayerConfig padded = Tiny(lay.mp, lay.ep, lay.esp);  // f = 4 = E/k
      LayerConfig dropless = padded;
      dropless.dropless = true;
      dropless.capacity_factor = 0.0;  // unset: dropless has none
      const SkewedRun want = RunSkewed(padded, skew), got = RunSkewed(dropless, skew);
      EXPECT_EQ(want.dropped, 0);
      EXPECT_EQ(got.dropped, 0);
      EXPECT_EQ(got.routed, want.routed);
      if (skew > 0.0) {
        EXPECT_GT(std::count(got.routed.begin(), got.routed.end(), 0), 0)
            << "at skew 2 some experts should get no token (empty blocks)";
        EXPECT_GT(*std::max_element(got.routed.begin(), got.routed.end()),
                  3 * std::accumulate(got.routed.begin(), got.routed.end(), int64_t{0}) /
                      padded.num_experts)
            << "the heaviest expert should get over 3x its share";
      }
      EXPECT_TRUE(
          TrueOnAllRanks(SameRouting(want.results, got.results, padded.top_k, /*slots=*/true)));
      ExpectSameValues(want.results, got.results, "dropless vs padded");
    }
  }
}

// The same for SwiGLU experts: the ragged blocks run the gated activation
// on their own rows.
TEST(MpiExecutor, SwigluDroplessComputesWhatPaddedComputes) {
  const int p = WorldSize();
  for (const Layout& lay : std::vector<Layout>{{2, p / 2, 2}, {1, p, 1}}) {
    SCOPED_TRACE(testing::Message() << "mp=" << lay.mp << " ep=" << lay.ep << " esp=" << lay.esp);
    LayerConfig padded = Tiny(lay.mp, lay.ep, lay.esp);
    padded.gated_linear_unit = true;
    LayerConfig dropless = padded;
    dropless.dropless = true;
    dropless.capacity_factor = 0.0;
    const SkewedRun want = RunSkewed(padded, 2.0), got = RunSkewed(dropless, 2.0);
    EXPECT_EQ(got.routed, want.routed);
    EXPECT_EQ(got.dropped, 0);
    ExpectSameValues(want.results, got.results, "swiglu dropless vs padded");
  }
}

// What padding drops, dropless keeps: at f = 1 a skewed gate overflows the
// popular experts' capacity; dropless routes every choice.
TEST(MpiExecutor, DroplessKeepsTheChoicesPaddingDrops) {
  LayerConfig padded = Tiny(1, WorldSize(), 1, /*capacity_factor=*/1.0);
  LayerConfig dropless = padded;
  dropless.dropless = true;
  const SkewedRun cut = RunSkewed(padded, 2.0), kept = RunSkewed(dropless, 2.0);
  const int64_t choices = padded.batch_size * padded.seq_len * padded.top_k * WorldSize();
  EXPECT_GT(cut.dropped, choices / 4);
  EXPECT_EQ(kept.dropped, 0);
  EXPECT_EQ(std::accumulate(kept.routed.begin(), kept.routed.end(), int64_t{0}), choices);
}

// The planner's op names for `l` under schedule `s`, in its order (none: the
// planner rejected the layer, which fails the test).
std::vector<std::string> PlannedOps(const LayerConfig& l, Schedule s) {
  const Schedule one[] = {s};
  absl::StatusOr<planner::LayerPlan> plan =
      planner::PlanLayer(l, planner::testing::RoundNumberModel(), one);
  EXPECT_TRUE(plan.ok()) << plan.status();
  std::vector<std::string> names;
  if (!plan.ok()) return names;
  const planner::OpGraph& g = plan->candidates[0].graph();
  for (int i = 0; i < g.size(); ++i) names.push_back(g.op(i).Name());
  return names;
}

TEST(MpiExecutor, OpsAreTimedUnderThePlannersNames) {
  for (const Layout& lay : SharedLayouts()) {
    const LayerConfig l = Tiny(lay.mp, lay.ep, lay.esp);
    for (Schedule s : planner::kAllSchedules) {
      SCOPED_TRACE(testing::Message() << planner::ScheduleName(s) << " mp=" << lay.mp);
      std::unique_ptr<MoeLayerRunner> r = MakeRunner(l, s);
      if (r == nullptr) std::abort();
      ASSERT_TRUE(r->RunIteration().ok());
      const std::vector<std::string> planned = PlannedOps(l, s);
      std::vector<std::string> measured;
      double last_start = 0.0;
      for (const OpTime& t : r->timings()) {
        measured.push_back(t.name);
        EXPECT_LE(t.start_us, t.end_us) << t.name;
        EXPECT_GE(t.start_us, 0.0) << t.name;
        EXPECT_LE(t.end_us, r->total_us() + 1e-9) << t.name;
        if (t.kind == planner::OpKind::kCompute) {
          EXPECT_GE(t.start_us, last_start) << t.name;  // compute ops run in issue order
          last_start = t.start_us;
        }
      }
      EXPECT_EQ(measured, planned);
      EXPECT_GT(r->forward_us(), 0.0);
      EXPECT_GT(r->total_us(), r->forward_us());
      // The interpreter honours every edge of the plan it ran: no op starts
      // before the ops it depends on have ended (here, on this rank).
      absl::StatusOr<planner::OpGraph> plan = PlanLayerRun(l, s, WorldSize(), 1, nullptr);
      ASSERT_TRUE(plan.ok()) << plan.status();
      ExpectRunFollowsPlan(*plan, r->timings());
      EXPECT_TRUE(r->threaded()) << "MPI_THREAD_MULTIPLE: every communicator has its own lane";
    }
  }
}

TEST(MpiExecutor, DroplessOpsAreTimedUnderThePlannersNames) {
  for (const Layout& lay : SharedLayouts()) {
    SCOPED_TRACE(testing::Message() << "mp=" << lay.mp << " ep=" << lay.ep);
    LayerConfig l = Tiny(lay.mp, lay.ep, lay.esp);
    l.dropless = true;
    std::unique_ptr<MoeLayerRunner> r = MakeRunner(l, Schedule::kDefault);
    if (r == nullptr) std::abort();
    ASSERT_TRUE(r->RunIteration().ok());
    std::vector<std::string> measured;
    for (const OpTime& t : r->timings()) measured.push_back(t.name);
    EXPECT_EQ(measured, PlannedOps(l, Schedule::kDefault));
    const bool counts =
        std::find(measured.begin(), measured.end(), "fwd.ep_alltoall_counts") != measured.end();
    EXPECT_EQ(counts, lay.ep > 1) << "the count exchange runs on EP groups of more than one rank";
  }
}

// The irregular exchange on its own: rank r sends r + p + 1 values to rank p,
// at uneven offsets, after exchanging the counts.
TEST(MpiExecutor, AlltoAllvMovesUnevenBlocksWhereTheCountsSay) {
  Communicator& c = *g_backend->world;
  const int n = c.size(), me = c.rank();
  std::vector<int64_t> send_counts(static_cast<size_t>(n)), recv_counts(send_counts.size());
  for (int q = 0; q < n; ++q) send_counts[static_cast<size_t>(q)] = me + q + 1;
  ASSERT_TRUE(c.ExchangeCounts(send_counts, absl::MakeSpan(recv_counts)).ok());
  for (int q = 0; q < n; ++q) EXPECT_EQ(recv_counts[static_cast<size_t>(q)], q + me + 1);
  std::vector<size_t> sn(static_cast<size_t>(n)), so(sn.size()), rn(sn.size()), ro(sn.size());
  size_t sent = 3, got = 5;  // leading gaps: offsets are honoured
  for (size_t q = 0; q < sn.size(); ++q) {
    sn[q] = static_cast<size_t>(send_counts[q]);
    so[q] = sent;
    sent += sn[q] + 1;
    rn[q] = static_cast<size_t>(recv_counts[q]);
    ro[q] = got;
    got += rn[q] + 2;
  }
  std::vector<float> send(sent, -1.0f), recv(got, -7.0f);
  for (size_t q = 0; q < sn.size(); ++q) {
    for (size_t i = 0; i < sn[q]; ++i) send[so[q] + i] = static_cast<float>(me * 1000 + q * 10 + i);
  }
  absl::StatusOr<Request> r = c.StartAlltoAllv(send.data(), sn.data(), so.data(), recv.data(),
                                               rn.data(), ro.data(), DType::kF32);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(c.Wait(&*r).ok());
  size_t wrong = 0, untouched = 0;
  for (size_t q = 0; q < rn.size(); ++q) {
    for (size_t i = 0; i < rn[q]; ++i) {
      wrong += recv[ro[q] + i] != static_cast<float>(q * 1000 + static_cast<size_t>(me) * 10 + i);
    }
    untouched += recv[ro[q] + rn[q]] == -7.0f;  // the gap after each block is left alone
  }
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(untouched, rn.size());
}

TEST(MpiExecutor, SaaEqualsAlltoAllThenAllGatherElementForElement) {
  const int p = WorldSize();
  for (int n : {2, 4}) {
    if (p % n != 0 || p / n < 2) continue;
    SCOPED_TRACE(testing::Message() << "group " << n << " x a2a " << p / n);
    const RankPlace pl = PlaceOf(Tiny(n, p / n, n).parallel, WorldRank());
    Communicator* world = g_backend->world.get();
    auto group = world->Split(pl.esp_group, pl.esp_rank);
    auto a2a = world->Split(pl.ep_group, pl.ep_rank);
    ASSERT_TRUE(group.ok() && a2a.ok());
    const int w = p / n;
    const int64_t chunk = 5;  // odd on purpose
    // Integer-valued floats: sums are exact in any order, so the dual compares exactly too.
    std::vector<float> send(static_cast<size_t>(w * chunk));
    for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<float>(WorldRank() * 1000 + i);
    std::vector<float> recv(send.size()), ref(static_cast<size_t>(n * w * chunk)),
        saa_recv(send.size()), out(ref.size(), -1.0f);
    // Reference: AlltoAll, then AllGather of the whole receive buffer.
    ASSERT_TRUE((*a2a)->AlltoAll(send.data(), recv.data(), chunk, DType::kF32).ok());
    ASSERT_TRUE((*group)->AllGather(recv.data(), ref.data(), w * chunk, DType::kF32).ok());
    SaaArgs args;
    args.device = g_backend->device.get();
    args.a2a = a2a->get();
    args.group = group->get();
    args.chunk = chunk;
    args.stride = w * chunk;
    args.a2a_name = "saa.alltoall";
    args.group_name = "saa.allgather";
    ASSERT_TRUE(SaaGather(args, send.data(), saa_recv.data(), out.data()).ok());
    EXPECT_TRUE(TrueOnAllRanks(out == ref));

    // The dual: ReduceScatter of every chunk then AlltoAll.
    std::vector<float> in(ref.size());
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>((WorldRank() + 1) * 7 + i);
    std::vector<float> reduced(send.size()), dual_ref(send.size()), staging(send.size()),
        dual(send.size(), -1.0f);
    ASSERT_TRUE((*group)->ReduceScatter(in.data(), reduced.data(), w * chunk, DType::kF32).ok());
    ASSERT_TRUE((*a2a)->AlltoAll(reduced.data(), dual_ref.data(), chunk, DType::kF32).ok());
    args.group_name = "saa.reducescatter";
    ASSERT_TRUE(SaaScatter(args, in.data(), staging.data(), dual.data()).ok());
    EXPECT_TRUE(TrueOnAllRanks(dual == dual_ref));
  }
}

// A plan whose simulation hides communication behind compute: the layer with
// its expert dW detached (Lancet's placement, docs/model.md), so bwd.expert_dw
// runs on compute while bwd.esp_allreduce and the dispatch's AlltoAll run on
// the links. The threaded lanes run them at the same time; one host thread
// issuing in plan order cannot (the control: this test can fail). Ranks
// share two cores in CI, so a lane thread may not be scheduled in time in
// a given iteration: each rank must overlap in at least one of five (it
// failed the former "two of three" beside other load).
TEST(MpiExecutor, OverlapInThePlanIsOverlapInTheRun) {
  LayerConfig l = Tiny(2, WorldSize() / 2, 2, 1.0);
  l.batch_size = 4;
  l.seq_len = 64;  // S = 256
  l.model_dim = 128;
  l.hidden_dim = 1024;  // a long dW: 2 x [El x M x H/esp] GEMMs over every routed row
  planner::LayerContext ctx;
  ctx.layer = &l;
  ctx.cost = &planner::testing::RoundNumberModel();
  ctx.topo = planner::MakeTopology(l.parallel, planner::ClusterShape{1, WorldSize()});
  ctx.detach_dw = true;
  planner::OpGraph plan;
  ASSERT_TRUE(planner::BuildSchedule(Schedule::kDefault, ctx, &plan).ok());
  planner::Simulator sim;
  planner::SimResult predicted;
  ASSERT_TRUE(sim.Run(plan, &predicted).ok());
  ASSERT_GT(predicted.hidden_comm_us, 0.0) << "the plan hides no communication";

  // Per iteration: did bwd.expert_dw overlap a backward collective it does not wait for?
  constexpr int kIterations = 5;
  auto overlaps = [&](LaneMode lanes) {
    RunOptions opt;
    opt.lanes = lanes;
    absl::StatusOr<std::unique_ptr<MoeLayerRunner>> r = MoeLayerRunner::Create(
        l, plan, opt, g_backend->device.get(), g_backend->kernels.get(), g_backend->world.get());
    if (!r.ok()) std::abort();  // the other ranks are stuck in Create's collectives anyway
    int n = 0;
    for (int it = 0; it < kIterations; ++it) {
      EXPECT_TRUE((*r)->RunIteration().ok());
      const OpTime* dw = nullptr;
      std::vector<const OpTime*> comms;
      for (const OpTime& t : (*r)->timings()) {
        if (t.name == "bwd.expert_dw") dw = &t;
        if (t.name == "bwd.esp_allreduce" || t.name == "bwd.ep_alltoall_dispatch")
          comms.push_back(&t);
      }
      EXPECT_NE(dw, nullptr);
      EXPECT_EQ(comms.size(), 2u);
      bool any = false;
      for (const OpTime* c : comms) {
        any = any || (dw != nullptr && c->start_us < dw->end_us && dw->start_us < c->end_us);
      }
      n += any;
    }
    return n;
  };
  const int threaded = overlaps(LaneMode::kThreads);
  const int sequential = overlaps(LaneMode::kSequential);
  EXPECT_TRUE(TrueOnAllRanks(threaded >= 1)) << "rank " << WorldRank() << ": " << threaded << " of "
                                             << kIterations << " iterations overlapped";
  EXPECT_EQ(sequential, 0) << "one host thread cannot overlap: the check means something";
}

// A small whole model on the world: 2 blocks (block 0 MoE, block 1 dense),
// embedding, LM head and loss.
planner::ModelConfig TinyModel(int mp) {
  planner::ModelConfig m;
  m.name = "tiny-model";
  m.num_layers = 2;
  m.hidden_size = 64;
  m.num_attention_heads = 4;
  m.ffn_hidden_size = 128;
  m.seq_length = 32;
  m.micro_batch_size = 4;
  m.vocab_size = 256;
  m.bytes_per_element = 4;
  m.moe.layer_freq = 2;
  m.moe.num_experts = 8;
  m.moe.top_k = 2;
  m.moe.capacity_factor = 2.0;
  m.moe.expert_ffn_hidden_size = 128;
  const int w = WorldSize();
  m.parallel = {.mp = mp, .ep = w / mp, .esp = mp, .dp = w / mp, .pp = 1};
  return m;
}

// Every variant of a whole model runs as planned: every op under its planner
// name, every edge of the plan honoured in the measured timeline, one MoE
// layer instance per (block, micro-batch piece) the plan names, and the
// partitioned variants really split a range.
TEST(MpiExecutor, WholeModelsRunEveryVariantAsPlanned) {
  for (int mp : {1, 2}) {
    const planner::ModelConfig m = TinyModel(mp);
    int split = 0;
    for (planner::Variant v : planner::kAllVariants) {
      SCOPED_TRACE(testing::Message() << planner::VariantName(v) << " mp=" << mp);
      // Tutel pipelines the exchange 4 ways: forward pieces without a gate.
      planner::ModelPlanOptions o;
      o.tutel_degrees = {4};
      absl::StatusOr<planner::VariantPlan> plan =
          PlanModelRun(m, v, WorldSize(), 1, &planner::testing::RoundNumberModel(), o);
      ASSERT_TRUE(plan.ok()) << plan.status();
      if (v != planner::Variant::kNone && v != planner::Variant::kDw) {
        split += plan->graph.layers().size() > 1;
      }
      RunOptions opt;
      absl::StatusOr<std::unique_ptr<ModelRunner>> r =
          ModelRunner::Create(m, plan->graph, opt, g_backend->device.get(),
                              g_backend->kernels.get(), g_backend->world.get());
      if (!r.ok()) {
        ADD_FAILURE() << r.status();
        std::abort();  // the other ranks are stuck in Create's collectives
      }
      EXPECT_EQ((*r)->layer_instances(), static_cast<int>(plan->graph.layers().size()));
      for (int it = 0; it < 2; ++it) {
        const absl::Status st = (*r)->RunIteration();
        if (!st.ok()) {
          ADD_FAILURE() << st;
          std::abort();
        }
      }
      ExpectRunFollowsPlan(plan->graph, (*r)->timings());
      EXPECT_EQ((*r)->timings().back().name, "optimizer.step");
      EXPECT_GT((*r)->total_us(), (*r)->forward_us());
      EXPECT_GT((*r)->forward_us(), 0.0);
      EXPECT_TRUE((*r)->threaded());
    }
    EXPECT_GE(split, 1) << "no variant split a range: the pieces were not exercised";
  }
}

// Today's model shapes run whole as planned: grouped-query attention with its
// own head size, qk-norm, fused attention, a layer pattern, two shared
// experts, an MTP depth (a block after the last layer), MLA's down and up
// projections, and SwiGLU FFNs (dense, shared and routed experts).
TEST(MpiExecutor, TodaysModelShapesRunAsPlanned) {
  const int w = WorldSize();
  planner::ModelConfig gqa = TinyModel(w % 2 == 0 ? 2 : 1);
  gqa.num_layers = 3;
  gqa.num_query_groups = 2;
  gqa.kv_channels = 32;
  gqa.qk_layernorm = true;
  gqa.attention_backend = planner::AttentionBackend::kFlash;
  gqa.moe.layer_freq = 0;
  gqa.moe.layer_pattern = {0, 1, 1};
  gqa.moe.shared_expert_ffn_hidden_size = 32;
  gqa.moe.num_shared_experts = 2;
  gqa.mtp_num_layers = 1;
  gqa.untie_embeddings_and_output_weights = true;
  planner::ModelConfig mla = gqa;
  mla.num_query_groups = 0;
  mla.kv_channels = 0;
  mla.multi_latent_attention = true;
  mla.mla = {.q_lora_rank = 48,
             .kv_lora_rank = 32,
             .qk_head_dim = 16,
             .qk_pos_emb_head_dim = 8,
             .v_head_dim = 16};
  mla.attention_backend = planner::AttentionBackend::kUnfused;
  planner::ModelConfig glu = gqa;
  glu.gated_linear_unit = true;
  for (const planner::ModelConfig& m : {gqa, mla, glu}) {
    for (planner::Variant v : {planner::Variant::kNone, planner::Variant::kLancet}) {
      SCOPED_TRACE(testing::Message() << planner::VariantName(v)
                                      << (m.multi_latent_attention ? " mla"
                                          : m.gated_linear_unit    ? " glu"
                                                                   : " gqa"));
      absl::StatusOr<planner::VariantPlan> plan =
          PlanModelRun(m, v, w, 1, &planner::testing::RoundNumberModel(), {});
      ASSERT_TRUE(plan.ok()) << plan.status();
      absl::StatusOr<std::unique_ptr<ModelRunner>> r =
          ModelRunner::Create(m, plan->graph, RunOptions{}, g_backend->device.get(),
                              g_backend->kernels.get(), g_backend->world.get());
      if (!r.ok()) {
        ADD_FAILURE() << r.status();
        std::abort();
      }
      const absl::Status st = (*r)->RunIteration();
      if (!st.ok()) {
        ADD_FAILURE() << st;
        std::abort();
      }
      ExpectRunFollowsPlan(plan->graph, (*r)->timings());
      // The MTP depth's block (3) ran its MoE layer.
      bool mtp_gate = false;
      for (const auto& t : (*r)->timings()) mtp_gate |= t.name == "b3.moe.fwd.gate";
      EXPECT_TRUE(mtp_gate);
    }
  }
  // The SwiGLU model's expert layer computes the same under every schedule
  // (what --check holds a layer to; f = E/k so that nothing is dropped).
  LayerConfig layer = glu.MoeLayer();
  layer.capacity_factor = 4.0;
  const LayerResults ref = RunLayer(layer, Schedule::kDefault);
  for (Schedule s : {Schedule::kS1, Schedule::kS2}) {
    SCOPED_TRACE(std::string(planner::ScheduleName(s)));
    ExpectSameValues(ref, RunLayer(layer, s), "the swiglu model's expert layer");
  }
}

// A dense model (no MoE layer) runs whole as planned: no MoE layer instance,
// no op of an MoE layer, its dense FFN (SwiGLU) and data-parallel sync only.
TEST(MpiExecutor, DenseModelsRunAsPlanned) {
  const int w = WorldSize();
  const int mp = w % 2 == 0 ? 2 : 1;
  planner::ModelConfig m = TinyModel(mp);
  m.moe = planner::MoeSpec{};
  m.moe.num_experts = 0;
  m.gated_linear_unit = true;
  m.num_query_groups = 2;
  m.parallel = {.mp = mp, .ep = 1, .esp = 1, .dp = w / mp, .pp = 1};
  ASSERT_TRUE(m.IsDense());
  absl::StatusOr<planner::VariantPlan> plan =
      PlanModelRun(m, planner::Variant::kNone, w, 1, &planner::testing::RoundNumberModel(), {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<std::unique_ptr<ModelRunner>> r =
      ModelRunner::Create(m, plan->graph, RunOptions{}, g_backend->device.get(),
                          g_backend->kernels.get(), g_backend->world.get());
  if (!r.ok()) {
    ADD_FAILURE() << r.status();
    std::abort();
  }
  for (int it = 0; it < 2; ++it) {
    const absl::Status st = (*r)->RunIteration();
    if (!st.ok()) {
      ADD_FAILURE() << st;
      std::abort();
    }
  }
  ExpectRunFollowsPlan(plan->graph, (*r)->timings());
  EXPECT_EQ((*r)->layer_instances(), 0);
  bool swiglu = false;
  for (const auto& t : (*r)->timings()) {
    EXPECT_EQ(t.name.find("moe."), std::string::npos) << t.name;
    swiglu |= t.name == "b0.fwd.swiglu";
  }
  EXPECT_TRUE(swiglu);
  EXPECT_EQ((*r)->timings().back().name, "optimizer.step");
}

// A pipelined layout's program on the world, two stages: gpipe, 1f1b (tp 1
// and 2) and interleaved. Each rank runs its stage's ops and receives the
// transfers sent to it; every edge between them is honoured in the measured
// timeline (a step's first ops start after the transfer feeding them has
// arrived), the other stages' ops are not run, and only the stage's MoE
// layer instances are built.
TEST(MpiExecutor, PipelinedLayoutsRunTheirProgram) {
  const int w = WorldSize();
  struct Case {
    int tp;
    planner::PipelineSchedule schedule;
    int v;
  };
  const Case cases[] = {{1, planner::PipelineSchedule::kGpipe, 1},
                        {1, planner::PipelineSchedule::k1F1B, 1},
                        {2, planner::PipelineSchedule::k1F1B, 1},
                        {1, planner::PipelineSchedule::kInterleaved, 2}};
  for (const Case& c : cases) {
    planner::Layout l;
    l.pp = 2;
    l.tp = c.tp;
    l.dp = w / (2 * c.tp);
    l.ep = l.tp * l.dp;
    l.esp = 1;
    l.family = planner::Family::kParm;
    l.microbatches = 4;
    l.pipeline = c.schedule;
    l.virtual_stages = c.v;
    SCOPED_TRACE(testing::Message() << planner::PipelineScheduleName(c.schedule) << " tp=" << c.tp);
    planner::ModelConfig m = TinyModel(1);
    m.num_layers = 4;
    m.micro_batch_size = 1;
    m.global_batch_size = l.dp * 4;
    planner::ModelConfig run;
    absl::StatusOr<planner::VariantPlan> plan = PlanLayoutRun(
        m, l, planner::Variant::kNone, w, &planner::testing::RoundNumberModel(), &run);
    ASSERT_TRUE(plan.ok()) << plan.status();  // the same on every rank
    EXPECT_EQ(run.parallel.pp, 2);
    EXPECT_EQ(run.micro_batch_size, 1);
    const planner::OpGraph& g = plan->graph;
    absl::StatusOr<std::unique_ptr<ModelRunner>> r =
        ModelRunner::Create(run, g, RunOptions{}, g_backend->device.get(), g_backend->kernels.get(),
                            g_backend->world.get());
    if (!r.ok()) {
      ADD_FAILURE() << r.status();
      std::abort();  // the other ranks are stuck in Create's collectives
    }
    for (int it = 0; it < 2; ++it) {
      if (const absl::Status st = (*r)->RunIteration(); !st.ok()) {
        ADD_FAILURE() << st;
        std::abort();
      }
    }
    const int stage = WorldRank() / (w / 2);
    const std::vector<OpTime>& t = (*r)->timings();
    ASSERT_EQ(t.size(), static_cast<size_t>(g.size()));
    int received = 0, mine = 0;
    std::vector<uint8_t> instances(g.layers().size() + 1, 0);
    for (planner::OpId id = 0; id < g.size(); ++id) {
      const OpTime& ti = t[static_cast<size_t>(id)];
      EXPECT_EQ(ti.name, g.op(id).Name());
      if (!planner::RunsOnStage(g, id, stage)) {
        EXPECT_EQ(ti.end_us, 0.0) << ti.name << " is another stage's";
        continue;
      }
      ++mine;
      instances[static_cast<size_t>(g.exec(id).layer)] = 1;
      received += g.op(id).device != stage;
      EXPECT_LE(ti.start_us, ti.end_us) << ti.name;
      for (planner::OpId d : g.deps(id)) {
        if (!planner::RunsOnStage(g, d, stage)) continue;
        EXPECT_GE(ti.start_us, t[static_cast<size_t>(d)].end_us)
            << ti.name << " started before " << g.op(d).Name() << " ended";
      }
    }
    // (p * v - 1) * m transfers each way, half of them towards each stage.
    EXPECT_EQ(received, (2 * c.v - 1) * 4) << "stage " << stage;
    EXPECT_LT(mine, g.size());
    EXPECT_EQ((*r)->layer_instances(),
              std::count(instances.begin() + 1, instances.end(), uint8_t{1}));
    // MoE blocks 0 and 2: stage 0 holds blocks 0-1 (interleaved: 0 and 2),
    // one instance per micro-batch.
    if (stage == 0) {
      EXPECT_EQ((*r)->layer_instances(), c.v * 4);
    }
    EXPECT_GT((*r)->total_us(), 0.0);
    EXPECT_TRUE((*r)->threaded());
  }
}

TEST(MpiExecutor, PipelinesNeedALayoutTheExecutorRuns) {
  planner::ModelConfig m = TinyModel(1);
  m.parallel.pp = 2;
  absl::StatusOr<planner::VariantPlan> plan =
      PlanModelRun(m, planner::Variant::kNone, WorldSize(), 1, nullptr);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("parallel.pp"), std::string::npos) << plan.status();
  planner::Layout l;
  l.pp = 2;
  l.dp = WorldSize() / 2;
  l.ep = l.dp;
  l.microbatches = 2;
  m.num_layers = 4;
  m.global_batch_size = l.dp * 2;
  planner::ModelConfig run;
  struct Case {
    const char* field;
    planner::Layout layout;
  };
  planner::Layout ppmoe = l;
  ppmoe.tp = 2;
  ppmoe.dp = WorldSize() / 4;
  ppmoe.ep = 2;
  ppmoe.family = planner::Family::kPpMoe;
  planner::Layout recompute = l;
  recompute.recompute = true;
  planner::Layout too_many = l;
  too_many.pp = 4;
  for (const Case& c : {Case{"layout.family", ppmoe}, Case{"layout.recompute", recompute},
                        Case{"layout: dp*tp*pp", too_many}}) {
    plan = PlanLayoutRun(m, c.layout, planner::Variant::kNone, WorldSize(), nullptr, &run);
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(plan.status().message().find(c.field), std::string::npos) << plan.status();
  }
}

// A plan op the planner costs but cannot say the semantics of (here the
// hierarchical AlltoAll's steps) is refused on every rank before any collective.
TEST(MpiExecutor, PlansWithOpsThatCannotRunAreRefusedNamingTheOp) {
  const LayerConfig l = Tiny(1, WorldSize(), 1);
  planner::LayerContext ctx;
  ctx.layer = &l;
  ctx.cost = &planner::testing::RoundNumberModel();
  ctx.topo = planner::MakeTopology(l.parallel, planner::ClusterShape{2, WorldSize() / 2});
  ctx.a2a = planner::AllToAllAlgo::kHierarchical;
  planner::OpGraph plan;
  ASSERT_TRUE(planner::BuildSchedule(Schedule::kDefault, ctx, &plan).ok());
  absl::StatusOr<std::unique_ptr<MoeLayerRunner>> r =
      MoeLayerRunner::Create(l, plan, RunOptions{}, g_backend->device.get(),
                             g_backend->kernels.get(), g_backend->world.get());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(r.status().message())
                .find("op fwd.ep_alltoall_dispatch.2dh_intra carries no executable semantics"),
            std::string::npos)
      << r.status();
  EXPECT_TRUE(TrueOnAllRanks(true));  // every rank got here
}

TEST(MpiExecutor, InvalidLayoutsAreRejectedOnEveryRankBeforeAnyCollective) {
  // Each Create below fails validation on every rank before its first
  // collective (the group splits); if one rank went on, the next test's
  // collectives would hang, and ctest's timeout would report it.
  const int p = WorldSize();
  struct Case {
    LayerConfig layer;
    Schedule schedule;
    const char* field;
  };
  LayerConfig too_many = Tiny(2, p, 2);     // mp*dp = 2p ranks
  LayerConfig s1_esp = Tiny(2, p, 1);       // esp != mp
  LayerConfig def_esp = Tiny(1, p / 2, 2);  // esp does not divide mp
  LayerConfig pp = Tiny(2, p / 2, 2);
  pp.parallel.pp = 2;
  LayerConfig experts = Tiny(2, p / 2, 2);
  experts.num_experts = 3;  // ep does not divide E
  const Case cases[] = {
      {too_many, Schedule::kDefault, "parallel"}, {s1_esp, Schedule::kS1, "parallel.esp"},
      {s1_esp, Schedule::kS2, "parallel.esp"},    {def_esp, Schedule::kDefault, "parallel.esp"},
      {pp, Schedule::kDefault, "parallel.pp"},    {experts, Schedule::kDefault, "parallel.ep"},
  };
  for (const Case& c : cases) {
    RunOptions opt;
    opt.schedule = c.schedule;
    absl::StatusOr<std::unique_ptr<MoeLayerRunner>> r = MoeLayerRunner::Create(
        c.layer, opt, g_backend->device.get(), g_backend->kernels.get(), g_backend->world.get());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_EQ(std::string(r.status().message()).rfind(std::string(c.field) + ":", 0), 0u)
        << r.status();
  }
  EXPECT_TRUE(TrueOnAllRanks(true));  // every rank got here
}

}  // namespace
}  // namespace moeplan::executor

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0 && std::getenv("MOEPLAN_MPI_TEST_ALL_RANKS") == nullptr) {
    // One report: rank 0's (MOEPLAN_MPI_TEST_ALL_RANKS=1: every rank's).
    // Failures elsewhere still fail the job (exit code).
    testing::TestEventListeners& l = testing::UnitTest::GetInstance()->listeners();
    delete l.Release(l.default_result_printer());
  }
  absl::StatusOr<moeplan::executor::Backend> b = moeplan::executor::MakeBackend("mpi");
  if (!b.ok()) {
    std::fprintf(stderr, "mpi backend: %s\n", std::string(b.status().message()).c_str());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  moeplan::executor::mpi_test::g_backend = &*b;
  const int local = RUN_ALL_TESTS();
  int worst = local;
  MPI_Allreduce(&local, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (worst != 0 && local == 0) {
    std::fprintf(stderr, "rank %d: passed here, but a test failed on another rank\n", rank);
  }
  b->world.reset();
  MPI_Finalize();
  return worst;
}
