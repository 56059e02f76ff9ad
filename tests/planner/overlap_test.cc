// Overlapping micro-batches (docs/layouts.md "Overlapping micro-batches"):
// forward-backward pairs merged from a chunk's simulated graph, the
// overlapped 1F1B orders, DualPipe's bidirectional order and its layouts.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "moeplan/planner/layout.h"
#include "moeplan/planner/layout_memory.h"
#include "moeplan/planner/layout_planner.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/op_graph.h"
#include "moeplan/planner/pair_overlap.h"
#include "moeplan/planner/pipeline.h"
#include "moeplan/planner/simulator.h"
#include "test_profile.h"

namespace moeplan::planner {
namespace {

using testing::RoundNumberModel;

// A chunk's micro-batch by hand: forward compute, AlltoAll, compute,
// AlltoAll; backward AlltoAll, compute, AlltoAll, compute, each step after
// the last (the backward's first after the forward's last). `comm` and
// `compute` scale the two kinds of op.
OpGraph HandChunk(double comm, double compute) {
  OpGraph g;
  OpId prev = kNoOp;
  auto add = [&](Phase ph, bool is_comm, double cost) {
    Op op;
    op.base = is_comm ? "a2a" : "gemm";
    op.phase = ph;
    op.kind = is_comm ? OpKind::kComm : OpKind::kCompute;
    op.term = is_comm ? Term::kAllToAll : Term::kDense;
    op.resources = is_comm ? kInter : kCompute;
    op.cost_us = cost * (is_comm ? comm : compute);
    prev = g.Add(op, {prev});
  };
  add(Phase::kForward, false, 10.0);
  add(Phase::kForward, true, 6.0);
  add(Phase::kForward, false, 10.0);
  add(Phase::kForward, true, 6.0);
  add(Phase::kBackward, true, 6.0);
  add(Phase::kBackward, false, 20.0);
  add(Phase::kBackward, true, 6.0);
  add(Phase::kBackward, false, 20.0);
  return g;
}

PairTime Merge(const OpGraph& g) {
  Simulator sim;
  SimResult r;
  EXPECT_TRUE(sim.Run(g, &r).ok());
  const ChunkPhases ph = PhasesOf(g, r, [](const Op&) { return false; });
  MergeScratch scratch;
  return MergedUs(ph.fwd, ph.bwd, &scratch);
}

// Forward 32 us (20 compute, 12 AlltoAll), backward 52 (40, 12). Merged by
// hand, the earlier start first (the forward on ties): F.gemm [0,10],
// B.a2a [0,6], F.a2a [10,16], B.gemm [10,30], F.gemm [30,40], B.a2a
// [30,36], F.a2a [40,46], B.gemm [40,60]: the pair takes the compute's 60 us
// of 84, every AlltoAll hidden.
TEST(PairOverlap, HidesOneMicroBatchsAlltoAllUnderTheOthersCompute) {
  const PairTime t = Merge(HandChunk(1.0, 1.0));
  EXPECT_REL(t.fwd_end_us, 46.0);
  EXPECT_REL(t.bwd_end_us, 60.0);
  EXPECT_REL(t.total_us, 60.0);
}

// With communication free the pair is its compute, one phase after the
// other (nothing to hide); with compute free, its AlltoAlls in turn on the
// one link (nothing to hide them under).
TEST(PairOverlap, NothingHiddenWithCommunicationOrComputeFree) {
  EXPECT_REL(Merge(HandChunk(0.0, 1.0)).total_us, 20.0 + 40.0);
  EXPECT_REL(Merge(HandChunk(1.0, 0.0)).total_us, 12.0 + 12.0);
}

// Steps of an order with the pairs marked.
std::string Steps(const std::vector<PipeStep>& order) {
  std::string out;
  for (const PipeStep& st : order) {
    out += (st.forward ? "F" : "B") + std::to_string(st.chunk) + "." + std::to_string(st.mb) +
           (st.with_next ? "+" : " ");
  }
  return out;
}

// Megatron-Core's overlapped 1F1B: one more warm-up forward, then each
// forward paired with the backward after it (another micro-batch's).
TEST(OverlapOrder, OneMoreWarmUpForwardThenPairs) {
  EXPECT_EQ(Steps(PipelineOrder(PipelineSchedule::k1F1B, 1, 1, 3, 0, true)),
            "F0.0 F0.1+B0.0 F0.2+B0.1 B0.2 ");
  // Interleaved p=2, v=2, m=4: stage 1's warm-up of 2 forwards becomes 3.
  EXPECT_EQ(Steps(PipelineOrder(PipelineSchedule::kInterleaved, 2, 2, 4, 1, true)),
            "F0.0 F0.1 F1.0 F1.1+B1.0 F0.2+B1.1 F0.3+B0.0 F1.2+B0.1 F1.3+B1.2 B1.3 B0.2 B0.3 ");
  for (int p : {2, 4}) {
    for (int m : {4, 8}) {
      for (int s = 0; s < p; ++s) {
        const std::vector<PipeStep> plain =
            PipelineOrder(PipelineSchedule::kInterleaved, p, 2, m, s, false);
        const std::vector<PipeStep> paired =
            PipelineOrder(PipelineSchedule::kInterleaved, p, 2, m, s, true);
        ASSERT_EQ(paired.size(), plain.size());
        for (size_t i = 0; i + 1 < paired.size(); ++i) {
          if (!paired[i].with_next) continue;
          EXPECT_TRUE(paired[i].forward && !paired[i + 1].forward);
          EXPECT_FALSE(paired[i].chunk == paired[i + 1].chunk && paired[i].mb == paired[i + 1].mb);
        }
        EXPECT_EQ(InFlightMicrobatches(PipelineSchedule::kInterleaved, p, 2, m, s, true),
                  std::min(InFlightMicrobatches(PipelineSchedule::kInterleaved, p, 2, m, s) + 0.5,
                           m * 1.0));
      }
    }
  }
}

// DeepSeek's DualPipe on 2 stages, 4 micro-batches (2 each way), by its
// phases: both chunks' forward, chunk 0's next forward (the middle rank
// runs its first pair apart) and chunk 1's backward, chunk 1's forward with
// chunk 0's backward, then the backwards left. Both stages run the same
// order (half rank 0), chunk 0 being segment 0 of either direction.
TEST(DualPipe, OrderOfTwoStagesByHand) {
  for (int s : {0, 1}) {
    EXPECT_EQ(Steps(PipelineOrder(PipelineSchedule::kDualPipe, 2, 2, 4, s)),
              "F0.0 F1.0 F0.1 B1.0 F1.1+B0.0 B1.1 B0.1 ");
  }
  EXPECT_EQ(DualPipeChunkOf(4, 0, 0).segment, 0);
  EXPECT_EQ(DualPipeChunkOf(4, 0, 0).direction, 0);
  EXPECT_EQ(DualPipeChunkOf(4, 0, 1).segment, 3);
  EXPECT_EQ(DualPipeChunkOf(4, 0, 1).direction, 1);
  EXPECT_EQ(DualPipeChunkOf(4, 3, 0).segment, 0);
  EXPECT_EQ(DualPipeChunkOf(4, 3, 0).direction, 1);
  EXPECT_EQ(DualPipeChunkOf(4, 2, 1).segment, 2);
  EXPECT_EQ(DualPipeChunkOf(4, 2, 1).direction, 0);
}

// Every stage runs each chunk's m/2 forwards and backwards once, the walk
// never deadlocks, and the held forwards peak at p + 1 chunks.
TEST(DualPipe, EveryStepOnceAndThePeakIsPPlusOne) {
  for (int p : {2, 4, 8, 16}) {
    for (int m : {2 * p, 2 * p + 2, 4 * p, 120}) {
      if (m < 2 * p) continue;
      std::map<std::tuple<int, int, int, bool>, int> seen;
      ASSERT_TRUE(WalkPipeline(PipelineSchedule::kDualPipe, p, 2, m,
                               [&](int s, const PipeStep& st) {
                                 ++seen[{s, st.chunk, st.mb, st.forward}];
                               })
                      .ok())
          << "p=" << p << " m=" << m;
      EXPECT_EQ(seen.size(), static_cast<size_t>(p) * 2 * (m / 2) * 2);
      for (const auto& [step, n] : seen) EXPECT_EQ(n, 1);
      for (int s = 0; s < p; ++s) {
        EXPECT_EQ(InFlightMicrobatches(PipelineSchedule::kDualPipe, p, 2, m, s), (p + 1) / 2.0)
            << "p=" << p << " m=" << m << " s=" << s;
        const std::array<int, 2> held = DualPipeHeld(p, m, s);
        EXPECT_GE(held[0], held[1]);
      }
    }
  }
}

// Equal chunks, forward 1 and backward 2, no transfer time, pairs no
// faster than their two steps: DualPipe's bubble against 1F1B's (p - 1)(F +
// B) over the same work per stage (1F1B's m micro-batches of one segment,
// DualPipe's m/2 of each of two).
TEST(DualPipe, SmallerBubbleThanOneFOneB) {
  for (int p : {4, 8}) {
    const int m = 4 * p;
    PipelineSpec dual;
    dual.schedule = PipelineSchedule::kDualPipe;
    dual.stages = p;
    dual.chunks = 2;
    dual.microbatches = m;
    dual.fwd_us.assign(static_cast<size_t>(p) * 2, 1.0);
    dual.bwd_us.assign(static_cast<size_t>(p) * 2, 2.0);
    dual.pairs.assign(static_cast<size_t>(p) * 4, PairTime{1.0, 3.0, 3.0});
    PipelineSpec one = dual;
    one.schedule = PipelineSchedule::k1F1B;
    one.chunks = 1;
    one.fwd_us.assign(static_cast<size_t>(p), 1.0);
    one.bwd_us.assign(static_cast<size_t>(p), 2.0);
    one.pairs.clear();
    PipelineScratch scratch;
    PipelineResult d, o;
    ASSERT_TRUE(TimePipeline(dual, &scratch, &d).ok());
    ASSERT_TRUE(TimePipeline(one, &scratch, &o).ok());
    EXPECT_REL(o.bubble_us, (p - 1) * 3.0);
    // DeepSeek-V3's report puts DualPipe's bubble at (p/2 - 1)(F&B + B -
    // 3W): with no weight-gradient split (W = 0) and pairs of F + B, (p/2 -
    // 1)(F + 2B) = 5 (p = 4) and 15 (p = 8); the walk's order comes within one
    // forward of it (4 and 14).
    EXPECT_REL(d.bubble_us, (p / 2 - 1) * 5.0 - 1.0) << "p=" << p;
    EXPECT_LT(d.bubble_us, o.bubble_us) << "p=" << p;
    // The graph and the walk's timing agree.
    OpGraph g;
    Simulator sim;
    SimResult r;
    PipelineResult simulated;
    ASSERT_TRUE(SimulatePipeline(dual, &g, &sim, &r, &simulated).ok());
    EXPECT_EQ(simulated.makespan_us, d.makespan_us);
    EXPECT_EQ(simulated.bubble_us, d.bubble_us);
  }
  PipelineSpec bad;
  bad.schedule = PipelineSchedule::kDualPipe;
  bad.stages = 2;
  bad.chunks = 2;
  bad.microbatches = 4;
  bad.fwd_us.assign(4, 1.0);
  bad.bwd_us.assign(4, 1.0);
  PipelineScratch scratch;
  PipelineResult out;
  EXPECT_EQ(TimePipeline(bad, &scratch, &out).code(), absl::StatusCode::kInvalidArgument);
}

// Eight blocks of 256 hidden on RoundNumberProfile, MoE every other one, EP 8.
ModelConfig Moe8() {
  ModelConfig m;
  m.name = "moe8";
  m.num_layers = 8;
  m.hidden_size = 256;
  m.num_attention_heads = 8;
  m.ffn_hidden_size = 1024;
  m.seq_length = 128;
  m.bytes_per_element = 2;
  m.vocab_size = 1024;
  m.global_batch_size = 64;
  m.moe.layer_freq = 2;
  m.moe.num_experts = 16;
  m.moe.top_k = 2;
  m.moe.capacity_factor = 1.0;
  m.moe.expert_ffn_hidden_size = 1024;
  m.parallel = {.mp = 1, .ep = 8, .esp = 1, .dp = 8, .pp = 1};
  return m;
}

Layout Base(int dp, int pp, int m) {
  Layout l;
  l.dp = dp;
  l.pp = pp;
  l.ep = 8;
  l.microbatches = m;
  l.family = Family::kDpMoe;
  return l;
}

// On one stage the overlapped order runs the same steps, each pair no
// slower than its two steps in turn: the iteration is never slower, and
// faster here where the AlltoAlls cross nodes.
TEST(A2aOverlap, OneStageNeverSlower) {
  LayoutPlanner lp(RoundNumberModel());
  const ModelConfig m = Moe8();
  LayoutCandidate plain, overlapped;
  Layout l = Base(16, 1, 4);
  ASSERT_TRUE(lp.Evaluate(m, l, {}, {}, &plain).ok());
  l.a2a_overlap = true;
  ASSERT_TRUE(lp.Evaluate(m, l, {}, {}, &overlapped).ok());
  EXPECT_LT(overlapped.iteration_us, plain.iteration_us);
  // Compute is the same; only the pairs' hidden communication differs.
  EXPECT_REL(overlapped.compute_us, plain.compute_us);
}

// DualPipe's stages each hold two segments: stage 0 the first and the
// last (the embedding and the loss), so twice 1F1B's parameters per stage
// when the segments are alike, and it plans and times.
TEST(DualPipe, StagesHoldTwoSegments) {
  LayoutPlanner lp(RoundNumberModel());
  const ModelConfig m = Moe8();
  Layout l = Base(8, 4, 8);
  l.pipeline = PipelineSchedule::kDualPipe;
  LayoutCandidate dual, one;
  ASSERT_TRUE(lp.Evaluate(m, l, {}, {}, &dual).ok());
  l.pipeline = PipelineSchedule::k1F1B;
  ASSERT_TRUE(lp.Evaluate(m, l, {}, {}, &one).ok());
  EXPECT_GT(dual.iteration_us, 0.0);
  // Each chunk runs half the micro-batches: the busiest stage's compute is
  // within its iteration (counting m per chunk would double it).
  EXPECT_LT(dual.compute_us, dual.iteration_us);
  EXPECT_GT(dual.compute_us, 0.5 * one.compute_us);
  const MemoryBreakdown d1 = StageMemory(m, Base(8, 4, 8), 2, 1, 1.0, {});
  Layout dl = Base(8, 4, 8);
  dl.pipeline = PipelineSchedule::kDualPipe;
  const MemoryBreakdown d2 = StageMemory(m, dl, 2, 1, 1.0, {});
  const MemoryBreakdown d2s = StageMemory(m, Base(8, 4, 8), 2, 2, 1.0, {});
  // Stage 1 holds segments 1 and 2.
  EXPECT_REL(d2.params, d1.params + d2s.params);
}

// The search's lower bounds hold with overlapped pairs (an unplanned
// pair takes at least either step, its outputs no earlier than its start):
// pruning keeps the exhaustive top N, overlap and DualPipe among them.
TEST(A2aOverlap, SearchPruningKeepsTheExhaustiveTopN) {
  const ModelConfig m = Moe8();
  LayoutPlanner lp(RoundNumberModel());
  SearchOptions so;
  so.top = 8;
  so.max_microbatches = 8;
  so.zero_stages = {1};
  so.families = {Family::kDpMoe};
  so.pipelines = {PipelineSchedule::k1F1B, PipelineSchedule::kInterleaved,
                  PipelineSchedule::kDualPipe};
  so.a2a_overlap = {false, true};
  LayoutSearchResult pruned, all;
  ASSERT_TRUE(lp.Search(m, so, {}, {}, &pruned).ok());
  so.exhaustive = true;
  ASSERT_TRUE(lp.Search(m, so, {}, {}, &all).ok());
  EXPECT_GT(pruned.stats.pruned_bound, 0);
  ASSERT_EQ(pruned.candidates.size(), all.candidates.size());
  int overlapped = 0, dual = 0;
  for (const LayoutCandidate& c : all.candidates) {
    overlapped += c.layout.a2a_overlap;
    dual += c.layout.pipeline == PipelineSchedule::kDualPipe;
  }
  for (size_t i = 0; i < all.candidates.size(); ++i) {
    EXPECT_EQ(pruned.candidates[i].iteration_us, all.candidates[i].iteration_us) << "rank " << i;
  }
  EXPECT_GT(overlapped + dual, 0);
  so.a2a_overlap = {true, true};
  EXPECT_EQ(lp.Search(m, so, {}, {}, &all).message(),
            "search.a2a_overlap: each of false and true may be listed once (got 2 values)");
}

// One line naming the field for each rule.
TEST(A2aOverlap, BadLayoutsNameTheField) {
  const ModelConfig m = Moe8();
  const ClusterShape c{4, 8};
  Layout l = Base(8, 4, 8);
  l.pipeline = PipelineSchedule::kDualPipe;
  l.microbatches = 6;
  EXPECT_EQ(ValidateLayout(m, l, 96, c).message(),
            "layout.microbatches: dualpipe needs an even number >= 2*pp (half enter at each end) "
            "(got microbatches=6, pp=4)");
  l = Base(8, 1, 8);
  l.pp = 1;
  l.pipeline = PipelineSchedule::kDualPipe;
  EXPECT_EQ(ValidateLayout(m, l, 64, c).message(),
            "layout.pp: dualpipe needs an even pp >= 2 (stages pair from both ends) (got 1)");
  l = Base(8, 4, 8);
  l.a2a_overlap = true;
  EXPECT_EQ(ValidateLayout(m, l, 64, c).message(),
            "layout.a2a_overlap: with pp > 1 needs pipeline=interleaved (Megatron-Core's "
            "overlapped 1F1B runs one stage or virtual stages) or dualpipe (got pipeline=1f1b)");
  l = Base(16, 1, 4);
  l.ep = 1;
  l.a2a_overlap = true;
  EXPECT_EQ(ValidateLayout(m, l, 64, c).message(),
            "layout.a2a_overlap: needs expert parallelism (ep >= 2): it hides the experts' "
            "AlltoAlls (got ep=1)");
}

}  // namespace
}  // namespace moeplan::planner
