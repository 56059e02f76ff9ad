// Layouts, pipelines, the memory model and the layout search (docs/layouts.md).
#include "moeplan/planner/layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "moeplan/planner/layout_memory.h"
#include "moeplan/planner/layout_planner.h"
#include "moeplan/planner/limits.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/planner/pipeline.h"
#include "moeplan/planner/pipeline_layout.h"
#include "moeplan/planner/pipeline_program.h"
#include "test_profile.h"

namespace moeplan::planner {
namespace {

using testing::RoundNumberModel;

// Two blocks on RoundNumberProfile (4 nodes x 8): block 0 MoE, block 1 dense.
ModelConfig TwoBlocks() {
  ModelConfig m;
  m.name = "two";
  m.num_layers = 2;
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
  m.moe.gate = Gate::kSwitch;
  m.parallel = {.mp = 1, .ep = 8, .esp = 1, .dp = 8, .pp = 1};
  return m;
}

// Eight blocks, MoE every other one, 64 sequences per iteration.
ModelConfig EightBlocks() {
  ModelConfig m = TwoBlocks();
  m.name = "eight";
  m.num_layers = 8;
  m.vocab_size = 1024;
  m.global_batch_size = 64;
  m.parallel = {.mp = 1, .ep = 32, .esp = 1, .dp = 32, .pp = 1};
  return m;
}

Layout Make(int dp, int tp, int pp, int ep, int esp, Family f) {
  Layout l;
  l.dp = dp;
  l.tp = tp;
  l.pp = pp;
  l.ep = ep;
  l.esp = esp;
  l.family = f;
  return l;
}

// ---- Pipelines ----

PipelineSpec Equal(PipelineSchedule s, int p, int v, int m, double f, double b) {
  PipelineSpec spec;
  spec.schedule = s;
  spec.stages = p;
  spec.chunks = v;
  spec.microbatches = m;
  spec.fwd_us.assign(static_cast<size_t>(p * v), f / v);
  spec.bwd_us.assign(static_cast<size_t>(p * v), b / v);
  spec.p2p_us = 0.0;
  return spec;
}

TEST(Pipeline, OneFOneBBubbleIsTheClosedForm) {
  OpGraph g;
  Simulator sim;
  SimResult r;
  for (int p : {2, 4, 8}) {
    for (int m : {p, 2 * p, 4 * p, p + 3}) {
      PipelineResult out;
      ASSERT_TRUE(
          SimulatePipeline(Equal(PipelineSchedule::k1F1B, p, 1, m, 1.0, 2.0), &g, &sim, &r, &out)
              .ok());
      // (m + p - 1)(F + B), of which (p - 1)(F + B) idle.
      EXPECT_REL(out.pipeline_end_us, (m + p - 1) * 3.0) << "p=" << p << " m=" << m;
      EXPECT_REL(out.bubble_us, (p - 1) * 3.0);
      EXPECT_REL(out.bubble_fraction, static_cast<double>(p - 1) / (m + p - 1));
    }
  }
}

// InFlightMicrobatches is computed in closed form (the search asks it for
// every stage of every candidate); it must be the peak of the order itself.
// With `overlap` too (one more warm-up forward). DualPipe's is walked
// (overlap_test.cc).
TEST(Pipeline, InFlightIsThePeakOfTheOrder) {
  for (PipelineSchedule ps : kDefaultSearchPipelines) {
    for (int p : {1, 2, 3, 4, 8}) {
      for (int v : {1, 2, 3}) {
        for (int m : {1, 2, 3, 4, 5, 8, 12, 16, 24}) {
          if (ps == PipelineSchedule::kInterleaved && v > 1 && (p < 2 || m % p != 0)) continue;
          for (int s = 0; s < p; ++s) {
            for (bool overlap : {false, true}) {
              int held = 0, peak = 0;
              for (const PipeStep& st : PipelineOrder(ps, p, v, m, s, overlap)) {
                held += st.forward ? 1 : -1;
                peak = std::max(peak, held);
              }
              EXPECT_EQ(InFlightMicrobatches(ps, p, v, m, s, overlap),
                        static_cast<double>(peak) / v)
                  << PipelineScheduleName(ps) << " p=" << p << " v=" << v << " m=" << m
                  << " s=" << s << " overlap=" << overlap;
            }
          }
        }
      }
    }
  }
}

TEST(Pipeline, GpipeHasTheSameBubbleAndHoldsEveryMicroBatch) {
  OpGraph g;
  Simulator sim;
  SimResult r;
  PipelineResult out;
  ASSERT_TRUE(
      SimulatePipeline(Equal(PipelineSchedule::kGpipe, 4, 1, 8, 1.0, 2.0), &g, &sim, &r, &out)
          .ok());
  EXPECT_REL(out.bubble_us, 3 * 3.0);
  EXPECT_EQ(InFlightMicrobatches(PipelineSchedule::kGpipe, 4, 1, 8, 0), 8.0);
  EXPECT_EQ(InFlightMicrobatches(PipelineSchedule::k1F1B, 4, 1, 8, 0), 4.0);
  EXPECT_EQ(InFlightMicrobatches(PipelineSchedule::k1F1B, 4, 1, 8, 3), 1.0);
  EXPECT_EQ(InFlightMicrobatches(PipelineSchedule::k1F1B, 4, 1, 2, 0), 2.0);
}

TEST(Pipeline, InterleavingShrinksTheBubbleByV) {
  OpGraph g;
  Simulator sim;
  SimResult r;
  for (int p : {2, 4}) {
    for (int v : {2, 3, 4}) {
      for (int m : {p, 2 * p, 4 * p}) {
        PipelineResult plain, inter;
        ASSERT_TRUE(SimulatePipeline(Equal(PipelineSchedule::k1F1B, p, 1, m, 1.0, 2.0), &g, &sim,
                                     &r, &plain)
                        .ok());
        ASSERT_TRUE(SimulatePipeline(Equal(PipelineSchedule::kInterleaved, p, v, m, 1.0, 2.0), &g,
                                     &sim, &r, &inter)
                        .ok());
        EXPECT_REL(inter.bubble_us, plain.bubble_us / v) << "p=" << p << " v=" << v << " m=" << m;
        EXPECT_REL(inter.pipeline_end_us, m * 3.0 + plain.bubble_us / v);
      }
    }
  }
  // Stage 0 holds (p - 1) * 2 + (v - 1) * p warm-up chunks and one more: (6 + 4 + 1) / 2.
  EXPECT_EQ(InFlightMicrobatches(PipelineSchedule::kInterleaved, 4, 2, 8, 0), 5.5);
}

TEST(Pipeline, P2pAndTailsAddToTheMakespan) {
  OpGraph g;
  Simulator sim;
  SimResult r;
  PipelineSpec spec = Equal(PipelineSchedule::k1F1B, 2, 1, 1, 1.0, 2.0);
  spec.p2p_us = 0.5;
  spec.tail_us = {4.0, 1.0};
  PipelineResult out;
  ASSERT_TRUE(SimulatePipeline(spec, &g, &sim, &r, &out).ok());
  // F0, send, F1, B1, send, B0: 1 + 0.5 + 1 + 2 + 0.5 + 2 = 7, then stage 0's tail 4.
  EXPECT_REL(out.pipeline_end_us, 7.0);
  EXPECT_REL(out.makespan_us, 11.0);
}

// TimePipeline times each op as the walk issues it: the summary equals the
// simulated graph's to the bit, for every schedule, uneven costs, p2p on
// either link and tails, with its scratch reused from call to call.
TEST(Pipeline, TimedWithoutAGraphAsSimulated) {
  OpGraph g;
  Simulator sim;
  SimResult r;
  PipelineScratch scratch;
  int cases = 0;
  for (PipelineSchedule ps :
       {PipelineSchedule::kGpipe, PipelineSchedule::k1F1B, PipelineSchedule::kInterleaved}) {
    for (auto [p, v, m] : {std::tuple{1, 1, 3}, std::tuple{2, 1, 4}, std::tuple{4, 1, 8},
                           std::tuple{4, 2, 8}, std::tuple{3, 3, 6}}) {
      if (v > 1 && ps != PipelineSchedule::kInterleaved) continue;
      PipelineSpec spec = Equal(ps, p, v, m, 1.0, 2.0);
      for (size_t i = 0; i < spec.fwd_us.size(); ++i) {
        spec.fwd_us[i] = 1.0 + 0.37 * static_cast<double>(i % 3);
        spec.bwd_us[i] = 2.1 + 0.53 * static_cast<double>((i * 7) % 5);
      }
      spec.p2p_us = 0.3;
      spec.p2p_resource = (p + m) % 2 ? kInter : kIntra;
      spec.tail_us.assign(static_cast<size_t>(p), 0.0);
      for (int s = 0; s < p; ++s) spec.tail_us[static_cast<size_t>(s)] = 0.7 * (s + 1);
      PipelineResult simulated, timed;
      ASSERT_TRUE(SimulatePipeline(spec, &g, &sim, &r, &simulated).ok());
      ASSERT_TRUE(TimePipeline(spec, &scratch, &timed).ok());
      const std::string at =
          "p=" + std::to_string(p) + " v=" + std::to_string(v) + " m=" + std::to_string(m);
      EXPECT_EQ(timed.makespan_us, simulated.makespan_us) << at;
      EXPECT_EQ(timed.pipeline_end_us, simulated.pipeline_end_us) << at;
      EXPECT_EQ(timed.bubble_us, simulated.bubble_us) << at;
      EXPECT_EQ(timed.busiest_stage, simulated.busiest_stage) << at;
      EXPECT_GT(timed.makespan_us, timed.pipeline_end_us) << at;  // the tails count
      ++cases;
    }
  }
  EXPECT_EQ(cases, 11);
  PipelineSpec bad = Equal(PipelineSchedule::k1F1B, 2, 1, 2, 1.0, 2.0);
  bad.fwd_us.pop_back();
  PipelineResult out;
  EXPECT_EQ(TimePipeline(bad, &scratch, &out).code(), absl::StatusCode::kInvalidArgument);
}

// ---- Memory ----

TEST(Memory, HandComputedPerZeroStage) {
  const ModelConfig m = TwoBlocks();
  Layout l = Make(8, 1, 1, 8, 1, Family::kParm);
  MemoryOptions o;
  o.gpu_memory_bytes = 0.0;
  // Dense: attention 4M^2 + 8M = 264192; FFN 2MF + F + M = 525568; gate M*E
  // = 16384: 264192 + 525568 + 264192 + 16384 = 1070336. Experts: 64/8 local,
  // 2 * 256 * 1024 each = 4194304. No expert replicas (ep * esp = dp).
  const double dense = 1070336, expert = 4194304, all = dense + expert;
  const double sharded = dense / 8 + expert;
  struct Case {
    int zero;
    double params, grads, optimizer;
  } cases[] = {
      {0, 2 * all, 4 * all, 12 * all},
      {1, 2 * all, 4 * all, 12 * sharded},
      {2, 2 * all, 4 * sharded, 12 * sharded},
      {3, 2 * sharded, 4 * sharded, 12 * sharded},
  };
  // S = 8 * 128 = 1024 tokens. Dense block: S M (10 + 24) + 5 a L S = 14155776.
  // MoE block: S M (10 + 8) + 5 a L S + 4 S E + E T (M + 2H) b with T = 16:
  // 4718592 + 5242880 + 262144 + 4718592 = 14942208.
  const double act = 14155776 + 14942208;
  for (const Case& c : cases) {
    l.zero_stage = c.zero;
    const MemoryBreakdown b = StageMemory(m, l, 8, 0, 1.0, o);
    EXPECT_REL(b.params, c.params) << "zero " << c.zero;
    EXPECT_REL(b.grads, c.grads) << "zero " << c.zero;
    EXPECT_REL(b.optimizer, c.optimizer) << "zero " << c.zero;
    EXPECT_REL(b.activations, act);
    EXPECT_REL(b.capacity_buffers, 2.0 * 64 * 16 * 256 * 2);  // dispatch and combine, E T M b
    EXPECT_REL(b.total, b.params + b.grads + b.optimizer + b.activations + b.capacity_buffers);
    EXPECT_TRUE(b.fits());
  }
  // Recomputation keeps each block's input (S M b) and one block's activations.
  l.zero_stage = 0;
  l.recompute = true;
  EXPECT_REL(StageMemory(m, l, 8, 0, 1.0, o).activations, 2 * 1024 * 256 * 2 + 14942208.0);
  // In-flight micro-batches multiply the stored activations.
  l.recompute = false;
  EXPECT_REL(StageMemory(m, l, 8, 0, 3.0, o).activations, 3 * act);
}

TEST(Memory, InfeasibleSaysWhichTermAndByHowMuch) {
  Layout l = Make(8, 1, 1, 8, 1, Family::kParm);
  MemoryOptions o;
  o.gpu_memory_bytes = 64.0 * 1024 * 1024;  // 64 MiB
  const MemoryBreakdown b = StageMemory(TwoBlocks(), l, 8, 0, 1.0, o);
  EXPECT_FALSE(b.fits());
  // Optimizer states (12 B x 5264640 = 60.2 MiB) are the largest term.
  EXPECT_NE(b.OverReason().find("over); largest term: optimizer states 0.1 GiB"), std::string::npos)
      << b.OverReason();
}

// ---- Layout rules ----

// `l` with sequence parallelism: its expert grid may differ from its TP.
Layout Folded(Layout l) {
  l.sequence_parallel = true;
  return l;
}

TEST(Layout, BadLayoutsNameTheField) {
  const ModelConfig m = EightBlocks();
  const ClusterShape c{4, 8};
  struct Case {
    Layout l;
    std::string want;
  } cases[] = {
      {Make(2, 16, 1, 32, 1, Family::kParm), "layout.tp: must divide gpus_per_node (8)"},
      {Make(1, 1, 9, 1, 1, Family::kParm), "layout.pp: must be <= num_layers (8) (got 9)"},
      {Make(6, 1, 1, 3, 2, Family::kParm), "layout.ep: must divide moe.num_experts (64) (got 3)"},
      {Make(8, 4, 1, 2, 4, Family::kPpMoe),
       "layout.ep: ppmoe spreads a layer's experts over the TP group"},
      {Make(8, 1, 1, 1, 1, Family::kPpMoe),
       "layout.tp: ppmoe spreads a layer's experts over the TP group: needs tp >= 2"},
      {Make(8, 2, 1, 16, 2, Family::kDpMoe), "layout.ep: dpmoe spreads the experts"},
      {Make(8, 2, 1, 8, 1, Family::kDpMoe),
       "layout.esp: dpmoe with esp != tp (a folded expert grid: etp != tp) needs sequence "
       "parallelism"},
      {Folded(Make(8, 2, 1, 32, 1, Family::kDpMoe)),
       "layout.ep: a folded expert grid (esp != tp) places ep*esp ranks per expert replica: "
       "ep*esp must divide the stage's tp*cp*dp ranks (got ep*esp=32, tp*cp*dp=16)"},
      {Make(16, 2, 2, 32, 1, Family::kParm), "layout: dp*tp*cp*pp must be <= the GPUs (32)"},
  };
  for (const Case& k : cases) {
    const absl::Status s = ValidateLayout(m, k.l, 64, c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << k.want;
    EXPECT_EQ(std::string(s.message()).rfind(k.want, 0), 0u) << s.message();
  }
  Layout l = Make(8, 1, 4, 8, 1, Family::kParm);
  l.microbatches = 3;
  EXPECT_EQ(std::string(ValidateLayout(m, l, 64, c).message()).rfind("layout.microbatches", 0), 0u);
  EXPECT_TRUE(ValidateLayout(m, Make(8, 4, 1, 4, 1, Family::kPpMoe), 64, c).ok());
}

TEST(Layout, InferredFamilies) {
  EXPECT_EQ(InferFamily(Make(4, 8, 1, 8, 1, Family::kParm)), Family::kPpMoe);
  EXPECT_EQ(InferFamily(Make(8, 2, 1, 4, 2, Family::kParm)), Family::kDpMoe);
  EXPECT_EQ(InferFamily(Make(8, 2, 1, 8, 2, Family::kParm)), Family::kParm);
  // Folded expert grids (sp=1): Mixtral-8x22B's EP8 x ETP1 over TP2 x DP8.
  EXPECT_EQ(InferFamily(Folded(Make(8, 2, 8, 8, 1, Family::kParm))), Family::kDpMoe);
  EXPECT_EQ(InferFamily(Make(8, 2, 8, 8, 1, Family::kParm)), Family::kParm);
  // ep * esp = tp * dp under sp: parm's S1 with a smaller esp.
  EXPECT_EQ(InferFamily(Folded(Make(8, 2, 1, 16, 1, Family::kParm))), Family::kParm);
  // cp ranks count with dp: ep 8 < dp 4 x cp 4.
  Layout cp = Make(4, 2, 1, 8, 2, Family::kParm);
  cp.cp = 4;
  EXPECT_EQ(InferFamily(cp), Family::kDpMoe);
}

// ---- Stages and evaluation ----

TEST(Layout, PpMoeLayerSendsNothingAcrossNodes) {
  // tp = 8: a stage's TP group fills a node; its experts stay inside it.
  const Layout l = Make(1, 8, 4, 8, 1, Family::kPpMoe);
  const ModelConfig m = ModelForLayout(EightBlocks(), l, 8);
  ModelPlanner planner(RoundNumberModel());
  StageOptions so;
  so.first_block = 2;
  so.end_block = 4;
  so.embed = so.head = false;
  so.local_dispatch = true;
  ModelPlan plan;
  ASSERT_TRUE(planner.PlanStage(m, {}, so, &plan).ok());
  const VariantPlan& vp = plan.variants[static_cast<size_t>(plan.best)];
  int64_t moe_inter = 0;
  int combines = 0;
  for (OpId id = 0; id < vp.graph.size(); ++id) {
    const Op& op = vp.graph.op(id);
    if (op.flags & kMoeScope) moe_inter += op.inter_node_bytes;
    combines += op.Name() == "b2.moe.fwd.mp_allreduce_combine" ? 1 : 0;
    EXPECT_NE(op.term, Term::kAllToAll) << op.Name();
  }
  EXPECT_EQ(moe_inter, 0);
  EXPECT_EQ(combines, 1);
  // The same experts over data-parallel ranks across nodes exchange tokens between nodes.
  const Layout d = Make(32, 1, 1, 32, 1, Family::kDpMoe);
  StageOptions whole;
  ASSERT_TRUE(planner.PlanStage(ModelForLayout(EightBlocks(), d, 2), {}, whole, &plan).ok());
  moe_inter = 0;
  const VariantPlan& dv = plan.variants[static_cast<size_t>(plan.best)];
  for (OpId id = 0; id < dv.graph.size(); ++id) {
    if (dv.graph.op(id).flags & kMoeScope) moe_inter += dv.graph.op(id).inter_node_bytes;
  }
  EXPECT_GT(moe_inter, 0);
}

TEST(Layout, OneStageOneMicroBatchIsTheWholeModelPlan) {
  ModelConfig m = EightBlocks();
  m.global_batch_size = 0;  // micro_batch_size * dp = 256
  ModelPlanner planner(RoundNumberModel());
  ModelPlan plan;
  ASSERT_TRUE(planner.Plan(m, {}, &plan).ok());
  LayoutPlanner lp(RoundNumberModel());
  LayoutCandidate c;
  const Layout l = Make(32, 1, 1, 32, 1, Family::kDpMoe);
  ASSERT_TRUE(lp.Evaluate(m, l, {}, {}, &c).ok());
  EXPECT_NEAR(c.iteration_us, plan.variants[static_cast<size_t>(plan.best)].iteration_us(), 1e-6);
  EXPECT_EQ(c.micro_batch_size, 8);
  EXPECT_EQ(c.bubble_us, 0.0);
  // tokens/s/GPU = 256 * 128 tokens per iteration over 32 GPUs.
  EXPECT_REL(c.tokens_per_s_per_gpu, 256.0 * 128 / (c.iteration_us * 1e-6) / 32);
}

// A pipeline layout string places the layers as written: the even split
// spelled out plans exactly as the default, a heavier first stage slows the
// pipeline, and a layout that does not fit the stages or the model is
// refused naming the field.
// The layout search plans chunks without what their ops compute; a program
// built after it by the same planner still says, op for op, what a fresh
// planner's program says.
TEST(Layout, ProgramAfterEvaluatingKeepsWhatOpsCompute) {
  const ModelConfig m = EightBlocks();
  Layout l = Make(16, 1, 2, 16, 1, Family::kDpMoe);
  l.microbatches = 4;
  LayoutPlanner fresh(RoundNumberModel()), used(RoundNumberModel());
  LayoutCandidate c;
  ASSERT_TRUE(used.Evaluate(m, l, {}, {}, &c).ok());
  VariantPlan want, got;
  ASSERT_TRUE(fresh.Program(m, l, {}, &want).ok());
  ASSERT_TRUE(used.Program(m, l, {}, &got).ok());
  ASSERT_EQ(got.graph.size(), want.graph.size());
  int computing = 0;
  for (OpId id = 0; id < got.graph.size(); ++id) {
    const OpExec& x = got.graph.exec(id);
    const OpExec& y = want.graph.exec(id);
    EXPECT_EQ(x.kind, y.kind) << got.graph.op(id).Name();
    EXPECT_EQ(x.layer, y.layer) << got.graph.op(id).Name();
    EXPECT_EQ(x.count, y.count) << got.graph.op(id).Name();
    computing += x.kind != ExecKind::kNone;
  }
  EXPECT_GT(computing, got.graph.size() / 2);
}

TEST(Layout, PipelineLayoutPlacesTheLayersAsWritten) {
  const ModelConfig m = EightBlocks();
  LayoutPlanner lp(RoundNumberModel());
  Layout l = Make(16, 1, 2, 16, 1, Family::kDpMoe);
  l.microbatches = 4;
  LayoutCandidate even, spelled, uneven;
  ASSERT_TRUE(lp.Evaluate(m, l, {}, {}, &even).ok());
  l.stage_layers = *ParsePipelineLayout("Et*4|t*4L");
  ASSERT_TRUE(lp.Evaluate(m, l, {}, {}, &spelled).ok());
  EXPECT_EQ(spelled.iteration_us, even.iteration_us);
  EXPECT_EQ(spelled.memory.total, even.memory.total);
  l.stage_layers = *ParsePipelineLayout("Et*6|ttL");
  ASSERT_TRUE(lp.Evaluate(m, l, {}, {}, &uneven).ok());
  EXPECT_GT(uneven.iteration_us, even.iteration_us);
  EXPECT_GT(uneven.memory.total, even.memory.total);
  VariantPlan program;
  ASSERT_TRUE(lp.Program(m, l, {}, &program).ok());
  // The program runs layers 0-5 on the first stage and 6-7 on the second.
  int on_first = 0;
  for (OpId id = 0; id < program.graph.size(); ++id) {
    const Op& op = program.graph.op(id);
    if (op.block < 0 || op.block >= m.num_layers) continue;
    EXPECT_EQ(op.device, op.block < 6 ? 0 : 1) << op.Name();
    on_first += op.device == 0;
  }
  EXPECT_GT(on_first, 0);

  LayoutCandidate c;
  l.stage_layers = *ParsePipelineLayout("Ett|ttt|tttL");
  EXPECT_EQ(lp.Evaluate(m, l, {}, {}, &c).message(),
            "layout.pipeline_model_parallel_layout: must name pp*virtual_stages (2) stages (got 3 "
            "stages)");
  l.stage_layers = *ParsePipelineLayout("Ett|tttttL");
  EXPECT_EQ(
      lp.Evaluate(m, l, {}, {}, &c).message(),
      "layout.pipeline_model_parallel_layout: must hold num_layers (8) decoder layers (t) (got 7)");
}

TEST(Layout, ZeroStagesChangeTheGradientSynchronisation) {
  ModelConfig m = EightBlocks();
  LayoutPlanner lp(RoundNumberModel());
  Layout l = Make(32, 1, 1, 32, 1, Family::kDpMoe);
  double us[4];
  for (int z = 0; z < 4; ++z) {
    l.zero_stage = z;
    LayoutCandidate c;
    ASSERT_TRUE(lp.Evaluate(m, l, {}, {}, &c).ok());
    us[z] = c.iteration_us;
    EXPECT_GT(c.iteration_us, 0.0);
  }
  // ZeRO-3 gathers parameters every forward and backward: the slowest.
  EXPECT_GT(us[3], us[0]);
  EXPECT_GT(us[3], us[1]);
}

// Megatron-Core's --overlap-param-gather: ZeRO 1-2's parameter AllGathers
// after the step run under the next iteration's first forward. The iteration
// loses what they added after the step, up to one forward of it, and the
// breakdown's gradient synchronisation loses the same.
TEST(Layout, OverlappedParameterGathersHideUnderTheNextForward) {
  ModelConfig m = EightBlocks();
  LayoutPlanner lp(RoundNumberModel());
  for (int z : {1, 2}) {
    Layout l = Make(32, 1, 1, 32, 1, Family::kDpMoe);
    l.zero_stage = z;
    LayoutCandidate plain, overlapped;
    ASSERT_TRUE(lp.Evaluate(m, l, {}, {}, &plain).ok());
    l.overlap_param_gather = true;
    ASSERT_TRUE(lp.Evaluate(m, l, {}, {}, &overlapped).ok());
    const double saved = plain.iteration_us - overlapped.iteration_us;
    EXPECT_GT(saved, 0.0) << "zero " << z;
    EXPECT_LE(saved, plain.stage_forward_us + 1e-9) << "zero " << z;
    EXPECT_NEAR(plain.grad_sync_us - overlapped.grad_sync_us, saved, 1e-6) << "zero " << z;
    EXPECT_DOUBLE_EQ(overlapped.compute_us, plain.compute_us);
  }
}

// 128 blocks, 4,096 sequences per iteration: pipelines as long as the
// limit on simulated steps allows.
ModelConfig LongPipelineModel() {
  ModelConfig m = EightBlocks();
  m.num_layers = 128;
  m.micro_batch_size = 1;
  m.global_batch_size = 4096;
  return m;
}

TEST(Layout, PipelinesUpToTheStepLimitAreSimulatedAndLongerOnesRefused) {
  const ModelConfig m = LongPipelineModel();
  LayoutPlanner lp(RoundNumberModel());
  Layout l = Make(1, 1, 32, 1, 1, Family::kDpMoe);
  l.pipeline = PipelineSchedule::kInterleaved;
  l.virtual_stages = 4;
  l.microbatches = 2048;  // 32 * 4 * 2048 * 2 = 2^19 steps: the worst legal pipeline
  ASSERT_EQ(PipelineSteps(l), kMaxPipelineSteps);
  MemoryOptions no_check;
  no_check.gpu_memory_bytes = 0;
  LayoutCandidate c;
  ASSERT_TRUE(lp.Evaluate(m, l, {}, no_check, &c).ok());
  EXPECT_GT(c.iteration_us, 0.0);
  l.microbatches = 4096;  // twice the steps
  const absl::Status s = lp.Evaluate(m, l, {}, no_check, &c);
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(std::string(s.message()),
            "layout: pp*virtual_stages*microbatches*2 = 1048576 pipeline steps to simulate exceed "
            "the limit of 524288 (pp=32, virtual_stages=4, microbatches=4096); use fewer "
            "micro-batches or stages");
}

TEST(Search, SkipsAndCountsCandidatesOverTheStepLimit) {
  const ModelConfig m = LongPipelineModel();
  LayoutPlanner lp(RoundNumberModel());
  SearchOptions so;
  so.top = 1;
  so.max_microbatches = 4096;
  so.families = {Family::kDpMoe};
  so.pipelines = {PipelineSchedule::kGpipe};
  so.zero_stages = {0};
  MemoryOptions no_check;
  no_check.gpu_memory_bytes = 0;
  LayoutSearchResult r;
  ASSERT_TRUE(lp.Search(m, so, {}, no_check, &r).ok());
  // pp = 32 (dp = tp = 1) with 4,096 micro-batches is 2^18 steps (legal); no
  // GPipe layout of 32 GPUs exceeds 2^19, so the count is exact: 0.
  EXPECT_EQ(r.stats.over_limit, 0);
  so.pipelines = {PipelineSchedule::kInterleaved};
  so.virtual_stages = {4};
  ASSERT_TRUE(lp.Search(m, so, {}, no_check, &r).ok());
  // Interleaved, v = 4 (pp * 4 | 128 blocks, pp | m): pp * 4 * m * 2 > 2^19
  // only for pp = 32 (dp = tp = 1) with m = 4,096; pp = 16 reaches exactly
  // 2^19 (dp = 1, tp = 2, m = 4,096), which is legal.
  EXPECT_EQ(r.stats.over_limit, 1);
  EXPECT_EQ(r.stats.enumerated,
            r.stats.pruned_memory + r.stats.pruned_bound + r.stats.simulated + r.stats.over_limit);
}

// The search of issue 35: 1,024 blocks, 16,384 experts, a global batch of
// 2^24 on 65,536 GPUs with up to 1,024 micro-batches. Every candidate fits
// (no memory check), and bounding them would simulate billions of pipeline
// steps; it used to grow past 2 GB and abort on std::bad_alloc. It is refused
// after enumeration, before the first bound.
TEST(Search, AHugeSearchIsRefusedBeforeBounding) {
  ModelConfig m = EightBlocks();
  m.num_layers = 1024;
  m.moe.layer_freq = 1;
  m.moe.num_experts = 16384;
  m.micro_batch_size = 1;
  m.global_batch_size = int64_t{1} << 24;
  LayoutPlanner lp(RoundNumberModel());
  SearchOptions so;
  so.gpus = 65536;
  so.max_microbatches = 1024;
  MemoryOptions no_check;
  no_check.gpu_memory_bytes = 0;
  LayoutSearchResult r;
  const absl::Status s = lp.Search(m, so, {}, no_check, &r);
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(std::string(s.message()).rfind("search: bounding the ", 0), 0u) << s;
  EXPECT_NE(std::string(s.message())
                .find("over the limit of 268435456; lower "
                      "search.max_microbatches or search.gpus"),
            std::string::npos)
      << s;
  EXPECT_EQ(r.stats.simulated, 0);
}

// Stages over the plan's memory bound are skipped and counted, never built;
// when every candidate is, the search says so instead of "no layout fits".
TEST(Search, SkipsCandidatesOverThePlanMemoryBound) {
  const ModelConfig m = EightBlocks();
  LayoutPlanner lp(RoundNumberModel());
  SearchOptions so;
  so.top = 1000;
  so.zero_stages = {0};
  MemoryOptions no_check;
  no_check.gpu_memory_bytes = 0;
  ModelPlanOptions plan;
  plan.variants = {Variant::kNone};
  LayoutSearchResult all;
  ASSERT_TRUE(lp.Search(m, so, plan, no_check, &all).ok());
  EXPECT_EQ(all.stats.over_memory, 0);
  // 1 MiB holds some stages of this model, not all.
  plan.max_plan_bytes = int64_t{1} << 20;
  LayoutSearchResult r;
  ASSERT_TRUE(lp.Search(m, so, plan, no_check, &r).ok());
  EXPECT_GT(r.stats.over_memory, 0);
  EXPECT_FALSE(r.candidates.empty());
  EXPECT_LT(r.stats.simulated, all.stats.simulated);
  EXPECT_EQ(r.stats.enumerated, r.stats.pruned_memory + r.stats.pruned_bound + r.stats.simulated +
                                    r.stats.over_limit + r.stats.over_memory);
  // The layouts left rank as they did in the unbounded search.
  for (const LayoutCandidate& c : r.candidates) {
    const auto same =
        std::find_if(all.candidates.begin(), all.candidates.end(), [&](const LayoutCandidate& a) {
          return a.layout.pp == c.layout.pp && a.layout.dp == c.layout.dp &&
                 a.layout.tp == c.layout.tp && a.layout.ep == c.layout.ep &&
                 a.layout.family == c.layout.family &&
                 a.layout.microbatches == c.layout.microbatches &&
                 a.layout.pipeline == c.layout.pipeline &&
                 a.layout.virtual_stages == c.layout.virtual_stages;
        });
    if (same != all.candidates.end()) {
      EXPECT_DOUBLE_EQ(same->iteration_us, c.iteration_us);
    }
  }
}

TEST(Search, ReturnsFeasibleLayoutsAndBeatsEveryFixedOne) {
  const ModelConfig m = EightBlocks();
  LayoutPlanner lp(RoundNumberModel());
  SearchOptions so;
  so.top = 1000;
  so.max_microbatches = 8;
  MemoryOptions mem;
  mem.gpu_memory_bytes = 96.0 * 1024 * 1024;  // 96 MiB: prunes the replicated layouts
  LayoutSearchResult r;
  ASSERT_TRUE(lp.Search(m, so, {}, mem, &r).ok());
  ASSERT_FALSE(r.candidates.empty())
      << r.stats.enumerated << " " << r.stats.pruned_memory << " " << r.stats.simulated;
  EXPECT_EQ(r.gpus, 32);
  EXPECT_GT(r.stats.pruned_memory, 0);
  EXPECT_EQ(r.stats.enumerated,
            r.stats.pruned_memory + r.stats.pruned_bound + r.stats.simulated + r.stats.over_limit);
  for (size_t i = 0; i < r.candidates.size(); ++i) {
    const LayoutCandidate& c = r.candidates[i];
    EXPECT_TRUE(c.feasible);
    EXPECT_LE(c.memory.total, mem.gpu_memory_bytes);
    EXPECT_EQ(c.layout.Gpus(), 32);
    if (i > 0) {
      EXPECT_GE(c.iteration_us, r.candidates[i - 1].iteration_us);
    }
  }
  // Every fixed layout that fits is no faster than the search's best.
  const double best = r.candidates[0].iteration_us;
  int fixed = 0;
  for (const Layout& base :
       {Make(32, 1, 1, 32, 1, Family::kDpMoe), Make(4, 8, 1, 8, 1, Family::kPpMoe),
        Make(16, 2, 1, 16, 2, Family::kParm), Make(2, 8, 2, 8, 1, Family::kPpMoe),
        Make(8, 2, 2, 8, 2, Family::kDpMoe), Make(8, 1, 4, 8, 1, Family::kDpMoe)}) {
    for (int z : {0, 1, 2, 3}) {
      for (int mb : {1, 2, 4, 8}) {
        Layout l = base;
        l.zero_stage = z;
        l.microbatches = mb;
        if (!ValidateLayout(m, l, 64, {4, 8}).ok()) continue;
        LayoutCandidate c;
        ASSERT_TRUE(lp.Evaluate(m, l, {}, mem, &c).ok());
        if (!c.feasible) continue;
        ++fixed;
        EXPECT_GE(c.iteration_us, best - 1e-6)
            << FamilyName(l.family) << " dp=" << l.dp << " tp=" << l.tp << " pp=" << l.pp;
      }
    }
  }
  EXPECT_GT(fixed, 5);
}

// The lower bound only skips what cannot make the top N: the pruned search
// returns exactly what simulating every candidate returns.
// The top 5 of eight blocks' layouts, up to 4 micro-batches, ZeRO 0 and 2.
SearchOptions TopFiveSearch() {
  SearchOptions so;
  so.top = 5;
  so.max_microbatches = 4;
  so.zero_stages = {0, 2};
  return so;
}

TEST(Search, BoundPruningKeepsTheExhaustiveTopN) {
  const ModelConfig m = EightBlocks();
  LayoutPlanner lp(RoundNumberModel());
  SearchOptions so = TopFiveSearch();
  LayoutSearchResult pruned, all;
  ASSERT_TRUE(lp.Search(m, so, {}, {}, &pruned).ok());
  so.exhaustive = true;
  ASSERT_TRUE(lp.Search(m, so, {}, {}, &all).ok());
  EXPECT_GT(pruned.stats.pruned_bound, 0);
  EXPECT_LT(pruned.stats.simulated, all.stats.simulated);
  EXPECT_EQ(all.stats.pruned_bound, 0);
  EXPECT_EQ(all.stats.simulated, all.stats.enumerated - all.stats.pruned_memory);
  ASSERT_EQ(pruned.candidates.size(), 5u);
  ASSERT_EQ(all.candidates.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    const Layout& a = pruned.candidates[i].layout;
    const Layout& b = all.candidates[i].layout;
    EXPECT_EQ(std::tie(a.dp, a.tp, a.pp, a.ep, a.esp, a.microbatches, a.zero_stage, a.family,
                       a.pipeline, a.virtual_stages, a.recompute),
              std::tie(b.dp, b.tp, b.pp, b.ep, b.esp, b.microbatches, b.zero_stage, b.family,
                       b.pipeline, b.virtual_stages, b.recompute))
        << "rank " << i;
    EXPECT_EQ(pruned.candidates[i].iteration_us, all.candidates[i].iteration_us) << "rank " << i;
  }
}

// record_points keeps every candidate enumerated, each with what the search
// knows of it, against the exhaustive search's exact times, and changes nothing
// the search returns.
TEST(Search, RecordedPointsAreEveryCandidateWithItsBoundOrTime) {
  const ModelConfig m = EightBlocks();
  LayoutPlanner lp(RoundNumberModel());
  SearchOptions so = TopFiveSearch();
  LayoutSearchResult plain, recorded, exact;
  ASSERT_TRUE(lp.Search(m, so, {}, {}, &plain).ok());
  so.record_points = true;
  ASSERT_TRUE(lp.Search(m, so, {}, {}, &recorded).ok());
  so.exhaustive = true;
  ASSERT_TRUE(lp.Search(m, so, {}, {}, &exact).ok());
  EXPECT_TRUE(plain.points.empty());
  ASSERT_EQ(recorded.candidates.size(), plain.candidates.size());
  for (size_t i = 0; i < plain.candidates.size(); ++i) {
    EXPECT_EQ(recorded.candidates[i].iteration_us, plain.candidates[i].iteration_us);
  }
  ASSERT_EQ(static_cast<int64_t>(recorded.points.size()), recorded.stats.enumerated);
  ASSERT_EQ(exact.points.size(), recorded.points.size());
  std::map<SearchPoint::Kind, int64_t> kinds;
  const double fifth = recorded.candidates.back().iteration_us;
  for (size_t i = 0; i < recorded.points.size(); ++i) {
    const SearchPoint& p = recorded.points[i];
    const SearchPoint& e = exact.points[i];  // the same enumeration order
    ++kinds[p.kind];
    if (p.kind == SearchPoint::Kind::kOverMemory) {
      EXPECT_EQ(p.iteration_us, 0.0);
      EXPECT_GT(p.memory_bytes, 0.0);
      continue;
    }
    ASSERT_EQ(e.kind, SearchPoint::Kind::kSimulated);
    EXPECT_EQ(p.memory_bytes, e.memory_bytes) << i;
    if (p.kind == SearchPoint::Kind::kSimulated) {
      EXPECT_EQ(p.iteration_us, e.iteration_us) << i;
    } else {
      // A bound: no more than the time, and it kept the candidate out of the top 5.
      EXPECT_LE(p.iteration_us, e.iteration_us * (1 + 1e-12)) << i;
      EXPECT_GE(p.iteration_us, fifth) << i;
    }
    EXPECT_GT(p.tokens_per_s_per_gpu, 0.0);
  }
  EXPECT_EQ(kinds[SearchPoint::Kind::kOverMemory], recorded.stats.pruned_memory);
  EXPECT_EQ(kinds[SearchPoint::Kind::kSimulated], recorded.stats.simulated);
  EXPECT_EQ(kinds[SearchPoint::Kind::kBound], recorded.stats.pruned_bound);
  EXPECT_GT(kinds[SearchPoint::Kind::kBound], 0);
}

// record_pipelines gives the best N returned candidates their pipelines,
// traced at the candidate's own times (its last span ends at iteration_us,
// its bubble as the search reported it), the others none, and changes
// nothing else; Evaluate's record_pipeline gives the same timeline for the
// same layout.
TEST(Search, RecordedPipelinesAreTheCandidatesOwnTimes) {
  const ModelConfig m = EightBlocks();
  LayoutPlanner lp(RoundNumberModel());
  SearchOptions so = TopFiveSearch();
  so.pipelines = {PipelineSchedule::k1F1B, PipelineSchedule::kInterleaved};
  LayoutSearchResult plain, traced;
  ASSERT_TRUE(lp.Search(m, so, {}, {}, &plain).ok());
  so.record_pipelines = 3;  // of the 5 returned
  ASSERT_TRUE(lp.Search(m, so, {}, {}, &traced).ok());
  ASSERT_EQ(traced.candidates.size(), plain.candidates.size());
  EXPECT_EQ(traced.stats.simulated, plain.stats.simulated);
  EXPECT_EQ(traced.stats.stage_plans, plain.stats.stage_plans);
  int staged = 0;
  for (size_t i = 0; i < traced.candidates.size(); ++i) {
    const LayoutCandidate& c = traced.candidates[i];
    EXPECT_TRUE(plain.candidates[i].pipeline.empty());
    EXPECT_EQ(c.iteration_us, plain.candidates[i].iteration_us) << i;
    EXPECT_EQ(c.bubble_us, plain.candidates[i].bubble_us) << i;
    if (i >= 3) {
      EXPECT_TRUE(c.pipeline.empty()) << i;
      continue;
    }
    ASSERT_FALSE(c.pipeline.empty()) << i;
    double end = 0.0;
    int steps = 0;
    for (const PipeSpan& s : c.pipeline) {
      end = std::max(end, s.end_us);
      EXPECT_LT(s.stage, c.layout.pp) << i;
      if (s.kind == PipeSpan::Kind::kStep) ++steps;
    }
    EXPECT_EQ(end, c.iteration_us) << i;
    EXPECT_EQ(steps, c.layout.pp * c.layout.Chunks() * c.layout.microbatches * 2) << i;
    if (c.layout.pp > 1) ++staged;
    LayoutCandidate one;
    Layout l = c.layout;
    ASSERT_TRUE(lp.Evaluate(m, l, {}, {}, &one, /*record_pipeline=*/true).ok()) << i;
    ASSERT_EQ(one.pipeline.size(), c.pipeline.size()) << i;
    EXPECT_EQ(one.pipeline.back().end_us, c.pipeline.back().end_us) << i;
  }
  EXPECT_GT(staged, 0);  // some candidate's timeline has several stages
}

// moe.layer_pattern (layer_freq 0, as a DeepSeek or Qwen model imported from
// Hugging Face has) keys each stage plan by its slice of the pattern: the
// search no longer divides by the zero layer_freq, and a pattern that says
// what layer_freq 2 says is planned exactly as it.
TEST(Search, LayerPatternIsPlannedAsTheLayerFreqItSpellsOut) {
  const ModelConfig freq = EightBlocks();  // MoE blocks 0, 2, 4, 6
  ModelConfig listed = freq;
  listed.moe.layer_freq = 0;
  listed.moe.layer_pattern = {1, 0, 1, 0, 1, 0, 1, 0};
  ASSERT_TRUE(ValidateModelShape(listed).ok());
  SearchOptions so;
  so.top = 5;
  so.max_microbatches = 4;
  so.zero_stages = {0};
  LayoutSearchResult a, b;
  ASSERT_TRUE(LayoutPlanner(RoundNumberModel()).Search(freq, so, {}, {}, &a).ok());
  ASSERT_TRUE(LayoutPlanner(RoundNumberModel()).Search(listed, so, {}, {}, &b).ok());
  ASSERT_EQ(a.candidates.size(), b.candidates.size());
  for (size_t i = 0; i < a.candidates.size(); ++i) {
    EXPECT_EQ(a.candidates[i].iteration_us, b.candidates[i].iteration_us) << "rank " << i;
  }
  // Interior stages of the same size and flags but other MoE blocks: their
  // own plans, and more MoE blocks cost more.
  ModelConfig dense_middle = listed;
  dense_middle.moe.layer_pattern = {1, 1, 0, 0, 0, 0, 1, 1};
  ModelConfig moe_middle = listed;
  moe_middle.moe.layer_pattern = {1, 1, 1, 1, 1, 1, 1, 1};
  Layout l = Make(8, 1, 4, 8, 1, Family::kDpMoe);
  l.microbatches = 4;
  LayoutPlanner lp(RoundNumberModel());
  LayoutCandidate c_dense, c_moe;
  ASSERT_TRUE(lp.Evaluate(dense_middle, l, {}, {}, &c_dense).ok());
  ASSERT_TRUE(lp.Evaluate(moe_middle, l, {}, {}, &c_moe).ok());
  EXPECT_LT(c_dense.iteration_us, c_moe.iteration_us);
}

// ---- Programs ----

// The steps a program runs on `stage`, in issue order: its copies of chunk
// ops (pipe.* transfers and the tail aside), consecutive ops of one
// (phase, micro-batch, chunk) being one step.
std::vector<PipeStep> StepsOf(const OpGraph& g, int stage) {
  std::vector<PipeStep> out;
  for (OpId id = 0; id < g.size(); ++id) {
    const Op& op = g.op(id);
    if (op.device != stage || op.mb < 0 || op.base.substr(0, 5) == "pipe.") continue;
    const PipeStep st{op.phase == Phase::kForward, std::max<int>(0, op.chunk), op.mb};
    if (out.empty() || !(out.back() == st)) out.push_back(st);
  }
  return out;
}

int CountBase(const OpGraph& g, std::string_view base) {
  int n = 0;
  for (OpId id = 0; id < g.size(); ++id) n += g.op(id).base == base;
  return n;
}

VariantPlan ProgramOf(const ModelConfig& m, const Layout& l) {
  LayoutPlanner lp(RoundNumberModel());
  ModelPlanOptions o;
  o.variants = {Variant::kNone};
  o.algos = {AllToAllAlgo::kLinear};  // what the executor runs
  VariantPlan vp;
  const absl::Status st = lp.Program(m, l, o, &vp);
  EXPECT_TRUE(st.ok()) << st;
  return vp;
}

// 2 stages x 4 micro-batches of one sequence: each stage runs its steps in
// PipelineOrder's order, the transfers between them carry every
// micro-batch once each way, each stage's tail runs once after its last
// backward, and every MoE layer has an instance per micro-batch.
TEST(Program, StagesRunThePipelineOrderWithTheirTransfers) {
  const ModelConfig m = EightBlocks();  // 64 sequences
  for (PipelineSchedule ps : {PipelineSchedule::kGpipe, PipelineSchedule::k1F1B}) {
    SCOPED_TRACE(PipelineScheduleName(ps));
    Layout l = Make(16, 1, 2, 16, 1, Family::kParm);
    l.microbatches = 4;
    l.pipeline = ps;
    const VariantPlan vp = ProgramOf(m, l);
    const OpGraph& g = vp.graph;
    for (int s = 0; s < 2; ++s) {
      std::vector<PipeStep> want = PipelineOrder(ps, 2, 1, 4, s);
      EXPECT_EQ(StepsOf(g, s), want) << "stage " << s;
    }
    // (p * v - 1) * m transfers each way; tp = 1: no gathers.
    EXPECT_EQ(CountBase(g, "pipe.send_fwd"), 4);
    EXPECT_EQ(CountBase(g, "pipe.send_bwd"), 4);
    EXPECT_EQ(CountBase(g, "pipe.gather_fwd"), 0);
    std::set<std::string> names;
    std::vector<int> fed(4, 0);
    OpId step[2] = {kNoOp, kNoOp};
    for (OpId id = 0; id < g.size(); ++id) {
      const Op& op = g.op(id);
      EXPECT_TRUE(names.insert(op.Name()).second) << "two ops named " << op.Name();
      EXPECT_TRUE(g.exec(id).kind != ExecKind::kNone) << op.Name();
      if (op.base == "pipe.send_fwd") {
        EXPECT_EQ(op.device, 0);
        EXPECT_EQ(g.exec(id).kind, ExecKind::kSendRecv);
        EXPECT_EQ(g.exec(id).group, ExecGroup::kPpEven);  // sent by stage 0
        EXPECT_EQ(g.exec(id).parts, 1);
        EXPECT_EQ(g.exec(id).count, 1 * 128 * 256);  // one sequence's activation
        EXPECT_TRUE(RunsOnStage(g, id, 0) && RunsOnStage(g, id, 1));
        // Sent once micro-batch mb's forward on stage 0 ends.
        for (OpId d : g.deps(id)) {
          EXPECT_EQ(g.op(d).device, 0);
          EXPECT_EQ(g.op(d).mb, op.mb);
        }
      }
      for (OpId d : g.deps(id)) {
        if (g.op(d).base == "pipe.send_fwd") {
          EXPECT_EQ(op.device, 1) << op.Name();
          EXPECT_EQ(op.mb, g.op(d).mb) << op.Name();
          ++fed[static_cast<size_t>(op.mb)];
        }
      }
      if (op.base == "optimizer.step") {
        EXPECT_EQ(op.mb, -1);
        EXPECT_EQ(step[op.device], kNoOp) << "one optimizer step per stage";
        step[op.device] = id;
      }
    }
    for (int i = 0; i < 4; ++i) EXPECT_GE(fed[static_cast<size_t>(i)], 1) << "mb " << i;
    ASSERT_NE(step[0], kNoOp);
    ASSERT_NE(step[1], kNoOp);
    EXPECT_EQ(g.op(step[1]).Name(), "s1.optimizer.step");
    for (int s = 0; s < 2; ++s) {
      const double end = vp.sim.times[static_cast<size_t>(step[s])].start_us;
      for (OpId id = 0; id < g.size(); ++id) {
        if (g.op(id).device == s && g.op(id).mb >= 0) {
          EXPECT_LE(vp.sim.times[static_cast<size_t>(id)].end_us, end + 1e-9) << g.op(id).Name();
        }
      }
    }
    // Blocks 0-3 on stage 0 (MoE 0, 2), 4-7 on stage 1 (MoE 4, 6): 4 layers x 4 mbs.
    ASSERT_EQ(g.layers().size(), 16u);
    for (const ExecLayer& e : g.layers()) EXPECT_GE(e.mb, 0);
    EXPECT_EQ(vp.layers.size(), 4u);
    EXPECT_GT(vp.sim.makespan_us, 0.0);
  }
}

// Interleaved: chunk c of stage s holds model chunk c * p + s; the last
// stage's chunk 0 feeds stage 0's chunk 1 (and its gradient goes back).
TEST(Program, InterleavedChunksWrapAroundTheStages) {
  const ModelConfig m = EightBlocks();
  Layout l = Make(16, 1, 2, 16, 1, Family::kParm);
  l.microbatches = 2;
  l.pipeline = PipelineSchedule::kInterleaved;
  l.virtual_stages = 2;
  const VariantPlan vp = ProgramOf(m, l);
  const OpGraph& g = vp.graph;
  for (int s = 0; s < 2; ++s) EXPECT_EQ(StepsOf(g, s), PipelineOrder(l.pipeline, 2, 2, 2, s));
  EXPECT_EQ(CountBase(g, "pipe.send_fwd") + CountBase(g, "pipe.send_bwd"), 2 * 3 * 2);
  int wraps = 0;
  for (OpId id = 0; id < g.size(); ++id) {
    const Op& op = g.op(id);
    if (op.base == "pipe.send_fwd" && op.device == 1) {
      EXPECT_EQ(op.chunk, 0);
      EXPECT_EQ(g.exec(id).parts, 0);
      ++wraps;
    }
  }
  EXPECT_EQ(wraps, 2);
  // Stage 0's chunk 1 holds blocks 4-5: its ops say so.
  bool found = false;
  for (OpId id = 0; id < g.size(); ++id) found |= g.op(id).Name() == "s0.c1.mb1.b4.fwd.qkv";
  EXPECT_TRUE(found);
  // Each chunk has its own tail: "s0.c0.optimizer.step" and "s0.c1.optimizer.step".
  std::set<std::string> steps;
  for (OpId id = 0; id < g.size(); ++id) {
    if (g.op(id).base == "optimizer.step") steps.insert(g.op(id).Name());
  }
  EXPECT_EQ(steps, (std::set<std::string>{"s0.c0.optimizer.step", "s0.c1.optimizer.step",
                                          "s1.c0.optimizer.step", "s1.c1.optimizer.step"}));
}

// tp > 1: each TP rank sends its 1/tp and the receiving TP group gathers the
// pieces before the next step starts.
TEST(Program, TensorParallelTransfersAreGatheredByTheReceiver) {
  const ModelConfig m = EightBlocks();
  Layout l = Make(8, 2, 2, 16, 1, Family::kParm);
  l.microbatches = 4;
  const VariantPlan vp = ProgramOf(m, l);
  const OpGraph& g = vp.graph;
  EXPECT_EQ(CountBase(g, "pipe.gather_fwd"), 4);
  EXPECT_EQ(CountBase(g, "pipe.gather_bwd"), 4);
  for (OpId id = 0; id < g.size(); ++id) {
    const Op& op = g.op(id);
    if (op.base != "pipe.gather_fwd" && op.base != "pipe.gather_bwd") continue;
    ASSERT_EQ(g.deps(id).size(), 1u);
    const OpId send = g.deps(id)[0];
    EXPECT_EQ(g.exec(send).parts, op.device) << "gathered where it was received";
    EXPECT_EQ(g.exec(id).kind, ExecKind::kAllGather);
    EXPECT_EQ(g.exec(id).group, ExecGroup::kMp);
    EXPECT_EQ(g.exec(id).count, g.exec(send).count);
    EXPECT_EQ(g.exec(send).count, 2 * 128 * 256 / 2);  // 2 sequences per micro-batch, over tp
  }
}

// ZeRO 0-1 synchronise the gradients once, after the last micro-batch;
// ZeRO 2 reduce-scatters each micro-batch's as they come.
TEST(Program, ZeroStagesPlaceTheGradientBuckets) {
  const ModelConfig m = EightBlocks();
  for (int z : {1, 2}) {
    Layout l = Make(16, 1, 2, 16, 1, Family::kParm);
    l.microbatches = 4;
    l.zero_stage = z;
    const VariantPlan vp = ProgramOf(m, l);
    int per_mb = 0, once = 0;
    for (OpId id = 0; id < vp.graph.size(); ++id) {
      const Op& op = vp.graph.op(id);
      if (op.base != "bwd.grad_reducescatter") continue;
      (op.mb >= 0 ? per_mb : once) += 1;
    }
    if (z == 1) {
      EXPECT_EQ(per_mb, 0);
      EXPECT_GT(once, 0);
    } else {
      EXPECT_EQ(once, 0);
      EXPECT_GT(per_mb, 0);
      EXPECT_EQ(per_mb % 4, 0) << "every micro-batch's";
    }
  }
}

// Megatron-Core's A2A overlap: each forward of the steady state is one
// program step with the backward after it, their ops merged in the order the
// planner's pair simulation issues them (MergedUs): each step keeps its own
// order, and the two interleave, so the executor's lanes overlap them.
TEST(Program, OverlappedPairsMergeTheirSteps) {
  const ModelConfig m = EightBlocks();
  Layout l = Make(16, 1, 2, 16, 1, Family::kParm);
  l.microbatches = 4;
  l.pipeline = PipelineSchedule::kInterleaved;
  l.virtual_stages = 2;
  l.a2a_overlap = true;
  const VariantPlan vp = ProgramOf(m, l);
  const OpGraph& g = vp.graph;
  for (int s = 0; s < 2; ++s) {
    const std::vector<PipeStep> order = PipelineOrder(l.pipeline, 2, 2, 4, s, /*overlap=*/true);
    int pairs = 0;
    for (size_t k = 0; k + 1 < order.size(); ++k) {
      if (!order[k].with_next) continue;
      ++pairs;
      const PipeStep& f = order[k].forward ? order[k] : order[k + 1];
      const PipeStep& b = order[k].forward ? order[k + 1] : order[k];
      // The pair's ops in program order: 1 a forward op of f, 0 a backward op of b.
      std::vector<uint8_t> seq;
      for (OpId id = 0; id < g.size(); ++id) {
        const Op& op = g.op(id);
        if (op.device != s || op.base.substr(0, 5) == "pipe.") continue;
        const int c = std::max<int>(0, op.chunk);
        if (op.phase == Phase::kForward && op.mb == f.mb && c == f.chunk) seq.push_back(1);
        if (op.phase == Phase::kBackward && op.mb == b.mb && c == b.chunk) seq.push_back(0);
      }
      ASSERT_FALSE(seq.empty());
      EXPECT_EQ(seq.front(), 1) << "a tie goes to the forward";
      // Interleaved: some forward op comes after the backward's first op.
      const auto first_b = std::find(seq.begin(), seq.end(), 0);
      ASSERT_NE(first_b, seq.end());
      EXPECT_NE(std::find(first_b, seq.end(), 1), seq.end())
          << "stage " << s << ": forward mb " << f.mb << " not interleaved with backward mb "
          << b.mb;
    }
    EXPECT_GT(pairs, 0) << "stage " << s;
  }
  // Every op of every micro-batch is there once: the plain program's count.
  Layout plain = l;
  plain.a2a_overlap = false;
  EXPECT_EQ(g.size(), ProgramOf(m, plain).graph.size());
  EXPECT_EQ(g.layers().size(), ProgramOf(m, plain).graph.layers().size());
}

// DualPipe: stage s holds segments s and p-1-s as its two chunks; micro-batches
// of direction 0 enter at stage 0, those of direction 1 (numbered m/2 on) at
// stage p-1, and each transfer goes to the chunk holding the next segment of
// its direction.
TEST(Program, DualPipeTransfersFollowTheSegments) {
  const ModelConfig m = EightBlocks();
  Layout l = Make(16, 1, 2, 16, 1, Family::kParm);
  l.microbatches = 4;
  l.pipeline = PipelineSchedule::kDualPipe;
  const VariantPlan vp = ProgramOf(m, l);
  const OpGraph& g = vp.graph;
  int sends = 0;
  for (OpId id = 0; id < g.size(); ++id) {
    const Op& op = g.op(id);
    if (op.base != "pipe.send_fwd" && op.base != "pipe.send_bwd") continue;
    ++sends;
    // Direction 0 (mb 0-1) forwards from stage 0 to 1, direction 1 (mb 2-3)
    // from stage 1 to 0; backwards the other way.
    const bool dir1 = op.mb >= 2;
    const bool fwd = op.base == "pipe.send_fwd";
    EXPECT_EQ(op.device, fwd != dir1 ? 0 : 1) << op.Name();
    EXPECT_EQ(g.exec(id).parts, 1 - op.device) << op.Name();
    // The receiving step is the next segment's chunk: 1 forwards, 0 backwards.
    for (OpId next = id + 1; next < g.size(); ++next) {
      const std::span<const OpId> deps = g.deps(next);
      if (std::find(deps.begin(), deps.end(), id) == deps.end()) continue;
      EXPECT_EQ(g.op(next).device, 1 - op.device);
      EXPECT_EQ(std::max<int>(0, g.op(next).chunk), fwd ? 1 : 0) << g.op(next).Name();
      EXPECT_EQ(g.op(next).mb, op.mb);
      break;
    }
  }
  // One activation and one gradient per micro-batch between the two segments.
  EXPECT_EQ(sends, 2 * 4);
  // Every MoE block (0, 2, 4, 6) once per micro-batch, each (block, mb) once.
  std::set<std::pair<int, int>> seen;
  for (const ExecLayer& e : g.layers()) {
    EXPECT_TRUE(seen.insert({e.block, e.mb}).second) << e.block << " " << e.mb;
  }
  EXPECT_EQ(seen.size(), 4u * 4u);
}

TEST(Program, RecomputationIsRefusedNamingTheField) {
  Layout l = Make(16, 1, 2, 16, 1, Family::kParm);
  l.recompute = true;
  LayoutPlanner lp(RoundNumberModel());
  VariantPlan vp;
  const absl::Status st = lp.Program(EightBlocks(), l, {}, &vp);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("layout.recompute"), std::string::npos) << st;
}

}  // namespace
}  // namespace moeplan::planner
