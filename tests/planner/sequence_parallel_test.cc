// Sequence parallelism (docs/model.md "Sequence parallelism"): every TP
// AllReduce becomes a ReduceScatter and an AllGather of the same bytes, the
// norms and residuals between the TP sub-blocks run on S/t tokens, the MoE
// schedules take the rank's slice (S1) or gather it first (default, S2),
// activation memory of the replicated tensors is split t ways, and the field
// rules name the field. Round-number costs (test_profile.h): alpha-beta
// collectives, so an AllReduce costs exactly a ReduceScatter plus an
// AllGather of its pieces.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "moeplan/planner/layout.h"
#include "moeplan/planner/layout_memory.h"
#include "moeplan/planner/layout_planner.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/planner/validate.h"
#include "test_profile.h"

namespace moeplan::planner {
namespace {

using testing::RoundNumberModel;

// Two dense blocks, then two MoE blocks with a shared expert; TP 2.
ModelConfig Mixed(bool sp, int ep = 8, int esp = 1) {
  ModelConfig m = testing::SmallDenseFirstModel(2);
  m.name = "mixed";
  m.moe.num_shared_experts = 1;
  m.moe.shared_expert_ffn_hidden_size = 256;
  m.parallel = {.mp = 2, .ep = ep, .esp = esp, .dp = 4, .pp = 1, .sequence_parallel = sp};
  return m;
}

VariantPlan PlanOne(const ModelConfig& m, Schedule schedule) {
  ModelPlanner planner(RoundNumberModel());
  ModelPlanOptions o;
  o.variants = {Variant::kNone};
  o.schedules = {schedule};
  o.algos = {AllToAllAlgo::kLinear};
  ModelPlan plan;
  const absl::Status s = planner.Plan(m, o, &plan);
  EXPECT_TRUE(s.ok()) << s;
  return plan.variants.empty() ? VariantPlan{} : plan.variants[0];
}

// Mixed's stage as a layout: dp 4 x tp 2, one micro-batch.
Layout StageOf(int ep, int esp, Family family, bool sp) {
  Layout l;
  l.dp = 4;
  l.tp = 2;
  l.ep = ep;
  l.esp = esp;
  l.family = family;
  l.microbatches = 1;
  l.sequence_parallel = sp;
  return l;
}

bool EndsWith(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

// "fwd.proj_allreduce" -> "fwd.proj"; the op name without its collective.
std::string Stem(std::string_view base, std::string_view tail) {
  return std::string(base.substr(0, base.size() - tail.size()));
}

struct Coll {
  int64_t bytes;
  double cost_us;
};

// Every op of `v` named *<tail>, by (block, stem), in issue order; the
// data-parallel gradient synchronisation left out.
std::multimap<std::pair<int, std::string>, Coll> Named(const VariantPlan& v,
                                                       std::string_view tail) {
  std::multimap<std::pair<int, std::string>, Coll> out;
  for (OpId id = 0; id < v.graph.size(); ++id) {
    const Op& op = v.graph.op(id);
    if (op.flags & kGradSync) continue;
    if (EndsWith(op.base, tail))
      out.insert({{op.block, Stem(op.base, tail)}, {op.bytes, op.cost_us}});
  }
  return out;
}

int Count(const VariantPlan& v, std::string_view base) {
  int n = 0;
  for (OpId id = 0; id < v.graph.size(); ++id) n += v.graph.op(id).base == base;
  return n;
}

// The forward's AllReduces become ReduceScatters of the same op, the
// backward's too; each collective moves the AllReduce's bytes split t ways
// and costs half of it (alpha-beta: an AllReduce is a ReduceScatter and an
// AllGather). Every ReduceScatter has its AllGather: the forward gathers
// before each TP sub-block (ln1, ln2, the shared expert, the LM head) and
// the backward before each one whose forward ended in a ReduceScatter.
TEST(SequenceParallel, EachAllReduceBecomesAReduceScatterAndAnAllGatherOfTheSameBytes) {
  const VariantPlan off = PlanOne(Mixed(false), Schedule::kDefault);
  const VariantPlan on = PlanOne(Mixed(true), Schedule::kDefault);
  const auto all_reduces = Named(off, "_allreduce");
  const auto reduce_scatters = Named(on, "_reducescatter");
  EXPECT_TRUE(Named(on, "_allreduce").empty());
  // fwd: proj x4, fc2 x2, shared x2; bwd: qkv x4, fc1 x2, shared x2, lm_head.
  ASSERT_EQ(all_reduces.size(), 17u);
  ASSERT_EQ(reduce_scatters.size(), all_reduces.size());
  for (const auto& [key, ar] : all_reduces) {
    auto it = reduce_scatters.find(key);
    ASSERT_NE(it, reduce_scatters.end()) << key.second << " of block " << key.first;
    EXPECT_EQ(it->second.bytes * 2, ar.bytes) << key.second;
    EXPECT_DOUBLE_EQ(it->second.cost_us * 2.0, ar.cost_us) << key.second;
  }
  // The AllGathers (the dW inputs' and the MoE schedule's apart): as many,
  // each of a ReduceScatter's piece and cost.
  const double rs_cost = reduce_scatters.begin()->second.cost_us;
  const int64_t rs_bytes = reduce_scatters.begin()->second.bytes;
  int gathers = 0;
  for (const auto& [key, ag] : Named(on, "_allgather")) {
    if (EndsWith(key.second, "_input") || EndsWith(key.second, ".sp")) continue;
    ++gathers;
    EXPECT_EQ(ag.bytes, rs_bytes) << key.second;
    EXPECT_DOUBLE_EQ(ag.cost_us, rs_cost) << key.second;
  }
  EXPECT_EQ(gathers, 17);
  EXPECT_TRUE(Named(off, "_allgather").empty());
  // dW of the column-parallel GEMMs re-gathers its saved input slice.
  EXPECT_EQ(Count(on, "bwd.qkv_input_allgather"), 4);
  EXPECT_EQ(Count(on, "bwd.fc1_input_allgather"), 2);
  EXPECT_EQ(Count(on, "bwd.shared_fc1_input_allgather"), 2);
  EXPECT_EQ(Count(on, "bwd.lm_head_input_allgather"), 1);
  // Norms and residuals touch half the bytes.
  for (std::string_view name :
       {"fwd.ln1", "fwd.residual1", "fwd.ln2", "fwd.residual2", "fwd.ln_f", "bwd.ln1",
        "bwd.residual1", "bwd.ln2", "bwd.residual2", "bwd.ln_f"}) {
    int64_t bytes_off = 0, bytes_on = 0;
    for (OpId id = 0; id < off.graph.size(); ++id) {
      if (off.graph.op(id).base == name) bytes_off += off.graph.op(id).bytes;
    }
    for (OpId id = 0; id < on.graph.size(); ++id) {
      if (on.graph.op(id).base == name) bytes_on += on.graph.op(id).bytes;
    }
    EXPECT_GT(bytes_off, 0) << name;
    EXPECT_EQ(bytes_on * 2, bytes_off) << name;
  }
}

// S1 already routes the rank's S/t slice: with sequence parallelism it
// neither splits nor gathers the tokens. Default (and S2) route the MP
// group's tokens: they AllGather the slices first, forward and backward.
TEST(SequenceParallel, TheMoeScheduleTakesTheSliceOrGathersIt) {
  // S1 needs esp = mp.
  const VariantPlan s1_off = PlanOne(Mixed(false, 4, 2), Schedule::kS1);
  const VariantPlan s1_on = PlanOne(Mixed(true, 4, 2), Schedule::kS1);
  for (std::string_view name :
       {"fwd.mp_split", "fwd.mp_allgather", "bwd.mp_split", "bwd.mp_allgather"}) {
    EXPECT_EQ(Count(s1_off, name), 2) << name;
    EXPECT_EQ(Count(s1_on, name), 0) << name;
  }
  EXPECT_EQ(Count(s1_on, "bwd.mp_allreduce_gate"), 2);  // the router's gradient, summed over TP
  EXPECT_EQ(Count(s1_on, "fwd.sp_allgather"), 0);
  const VariantPlan def = PlanOne(Mixed(true), Schedule::kDefault);
  EXPECT_EQ(Count(def, "fwd.sp_allgather"), 2);
  EXPECT_EQ(Count(def, "bwd.sp_allgather"), 2);
  // The slice of one micro-batch's activations: S M e / t.
  const ModelConfig m = Mixed(true);
  for (OpId id = 0; id < def.graph.size(); ++id) {
    if (def.graph.op(id).base == "fwd.sp_allgather") {
      EXPECT_EQ(def.graph.op(id).bytes,
                m.micro_batch_size * m.seq_length * m.hidden_size * m.bytes_per_element / 2);
    }
  }
  EXPECT_GT(def.sim.makespan_us, 0.0);
  EXPECT_GT(s1_on.sim.makespan_us, 0.0);
}

// Korthikanti et al. 2022: without sequence parallelism each block keeps
// 10 S M (in 2-byte units) replicated over TP (norm and residual inputs,
// dropout masks, the TP GEMMs' inputs); with it, 10 S M / t. The embedding's
// output is split too. Everything else is unchanged.
TEST(SequenceParallel, SplitsTheTpReplicatedActivations) {
  const ModelConfig m = Mixed(false);
  Layout l = StageOf(8, 1, Family::kParm, false);
  MemoryOptions o;
  const int64_t mbs = 2;
  const MemoryBreakdown off = StageMemory(m, l, mbs, 0, 1.0, o);
  l.sequence_parallel = true;
  const MemoryBreakdown on = StageMemory(m, l, mbs, 0, 1.0, o);
  const double S = mbs * m.seq_length, M = m.hidden_size, e = m.bytes_per_element;
  // Four blocks of 10 S M (2-byte units, e / 2 bytes each) and the embedding's S M e, halved.
  const double replicated = 4 * 10.0 * S * M * e / 2.0 + S * M * e;
  EXPECT_DOUBLE_EQ(off.activation_per_microbatch - on.activation_per_microbatch, replicated / 2.0);
  EXPECT_EQ(on.params, off.params);
  EXPECT_EQ(on.capacity_buffers, off.capacity_buffers);
  // With full recomputation only each block's input is kept: split too.
  l.recompute = true;
  const MemoryBreakdown rc_on = StageMemory(m, l, mbs, 0, 1.0, o);
  l.sequence_parallel = false;
  const MemoryBreakdown rc_off = StageMemory(m, l, mbs, 0, 1.0, o);
  EXPECT_DOUBLE_EQ(rc_off.activation_per_microbatch - rc_on.activation_per_microbatch,
                   (4 * S * M * e + S * M * e) / 2.0);
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// A folded expert grid (Megatron-Core's expert tensor parallelism != TP):
// with sequence parallelism each rank routes its own S/t tokens, so S1
// applies to an ESP (ETP) group of any size: it dispatches the rank's own
// slots over EP, gathers the ESP group's rows before the experts only when
// the group has several ranks, and neither splits nor gathers the tokens.
// ETP = TP (esp = mp = 2) is the plain S1 plan.
TEST(FoldedExpertGrid, S1RoutesEachRanksOwnTokensOverAnyEspGroup) {
  const ModelConfig base = Mixed(true);
  const int64_t s1 = base.micro_batch_size * base.seq_length / 2;  // 128 tokens per rank
  const int64_t cap1 = (base.moe.top_k * s1 + base.moe.num_experts - 1) / base.moe.num_experts;
  ASSERT_EQ(cap1, 32);  // 2 x 128 / 8 slots per expert, capacity factor 1
  const int64_t d1 = base.moe.num_experts * cap1 * base.hidden_size * base.bytes_per_element;
  // (A model file's ESP group sits inside its MP group; a layout's may be
  // larger: below.)
  for (int esp : {1, 2}) {
    const VariantPlan v = PlanOne(Mixed(true, 8 / esp, esp), Schedule::kS1);
    ASSERT_GT(v.graph.size(), 0) << "esp " << esp;
    for (std::string_view name : {"fwd.mp_split", "fwd.mp_allgather", "bwd.mp_split",
                                  "bwd.mp_allgather", "fwd.sp_allgather", "bwd.sp_allgather"}) {
      EXPECT_EQ(Count(v, name), 0) << name << " esp " << esp;
    }
    int dispatches = 0, gathers = 0;
    for (OpId id = 0; id < v.graph.size(); ++id) {
      const Op& op = v.graph.op(id);
      if (op.base == "fwd.ep_alltoall_dispatch") {
        ++dispatches;
        EXPECT_EQ(op.bytes, d1) << "esp " << esp;  // the rank's own E x cap1 slots
      }
      if (op.base == "fwd.esp_allgather") {
        ++gathers;
        EXPECT_EQ(op.bytes, d1) << "esp " << esp;  // each shard's piece: the same slots
      }
    }
    EXPECT_EQ(dispatches, 2) << "esp " << esp;  // two MoE blocks
    EXPECT_EQ(gathers, esp > 1 ? 2 : 0) << "esp " << esp;
    EXPECT_EQ(Count(v, "fwd.expert"), 2);
  }
  // Without sequence parallelism the MP group's tokens are replicated: S1
  // still needs the ESP group to be the MP group.
  ModelConfig off = Mixed(false, 8, 1);
  ModelPlanner planner(RoundNumberModel());
  ModelPlanOptions o;
  o.schedules = {Schedule::kS1};
  ModelPlan plan;
  EXPECT_EQ(Message(planner.Plan(off, o, &plan)).rfind("schedules: s1 does not apply", 0), 0u);
}

// A folded DPMoE layout: ep x esp x edp over the stage's tp x dp ranks, esp
// smaller or larger than tp. Its chunks plan S1 alone; its ESP group holds
// esp / tp of the capacity rows the TP-sharded grid holds (each rank routed
// 1/tp of the tokens).
TEST(FoldedExpertGrid, LayoutsPlanItAndCountItsRows) {
  const ModelConfig m = Mixed(false);
  const Layout l = StageOf(2, 2, Family::kDpMoe, true);
  MemoryOptions o;
  const MemoryBreakdown tied = StageMemory(m, l, 2, 0, 1.0, o);
  Layout folded = l;
  folded.esp = 1;  // 2 x 1 x 4 over 2 x 4 ranks
  const ClusterShape c{1, 8};
  ASSERT_TRUE(ValidateLayout(m, folded, 8, c).ok());
  EXPECT_EQ(folded.ExpertReplicas(), 4);
  const MemoryBreakdown f = StageMemory(m, folded, 2, 0, 1.0, o);
  EXPECT_DOUBLE_EQ(f.capacity_buffers * 2.0, tied.capacity_buffers);
  LayoutPlanner planner(RoundNumberModel());
  Layout wide = l;
  wide.esp = 4;  // 2 x 4 x 1
  ASSERT_TRUE(ValidateLayout(m, wide, 8, c).ok());
  EXPECT_DOUBLE_EQ(StageMemory(m, wide, 2, 0, 1.0, o).capacity_buffers,
                   2.0 * tied.capacity_buffers);
  for (const Layout& x : {folded, wide}) {
    LayoutCandidate cand;
    const absl::Status s = planner.Evaluate(m, x, {}, {}, &cand);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(cand.schedule, Schedule::kS1) << "esp " << x.esp;
    EXPECT_GT(cand.iteration_us, 0.0);
  }
  // An expert's shards are consecutive ranks: esp tiles nodes, like tp.
  ModelConfig wide_ffn = m;
  wide_ffn.moe.expert_ffn_hidden_size = 768;
  Layout three = l;
  three.dp = 12;
  three.ep = 8;
  three.esp = 3;  // 8 x 3 x 1 over 2 x 12 ranks
  EXPECT_EQ(Message(ValidateLayout(wide_ffn, three, 24, ClusterShape{4, 8})),
            "layout.esp: must divide gpus_per_node (8) or be a multiple of it: an expert's "
            "shards are consecutive ranks (got 3)");
  // A dense model's family places no experts: dpmoe with tp 2 (esp 1) and
  // sequence parallelism plans its default schedule.
  ModelConfig dense = testing::SmallDenseModel(2);
  Layout d = l;
  d.ep = 1;
  d.esp = 1;
  LayoutCandidate cand;
  const absl::Status s = planner.Evaluate(dense, d, {}, {}, &cand);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(cand.schedule, Schedule::kDefault);
}

// Megatron-Core's --tp-comm-overlap: each TP sub-block's sequence-parallel
// AllGather and ReduceScatter runs in mp steps pipelined with its GEMM, one
// step exposed: 1/mp of its cost, forward and backward. The LM head's (and
// the final norm's gather before it) and everything else keep their cost.
TEST(TpCommOverlap, ExposesOneOfTheMpStepsOfEachSubBlocksCollective) {
  const VariantPlan on = PlanOne(Mixed(true), Schedule::kDefault);
  ModelConfig m = Mixed(true);
  m.parallel.tp_comm_overlap = true;
  const VariantPlan ov = PlanOne(m, Schedule::kDefault);
  ASSERT_EQ(on.graph.size(), ov.graph.size());
  const std::set<std::string_view> sub_blocks = {
      "fwd.ln1_allgather",       "fwd.ln2_allgather",       "fwd.shared_allgather",
      "fwd.proj_reducescatter",  "fwd.fc2_reducescatter",   "fwd.shared_reducescatter",
      "bwd.fc2_allgather",       "bwd.proj_allgather",      "bwd.shared_allgather",
      "bwd.qkv_input_allgather", "bwd.fc1_input_allgather", "bwd.shared_fc1_input_allgather",
      "bwd.fc1_reducescatter",   "bwd.qkv_reducescatter",   "bwd.shared_reducescatter"};
  int overlapped = 0, kept = 0;
  for (OpId id = 0; id < on.graph.size(); ++id) {
    const Op &a = on.graph.op(id), &b = ov.graph.op(id);
    ASSERT_EQ(a.base, b.base);
    if (sub_blocks.count(a.base) && !(a.flags & kGradSync)) {
      EXPECT_DOUBLE_EQ(b.cost_us * 2.0, a.cost_us) << a.base;
      ++overlapped;
    } else {
      EXPECT_DOUBLE_EQ(b.cost_us, a.cost_us) << a.base;
      ++kept;
    }
  }
  // fwd: ln1/ln2/shared gathers and proj/fc2/shared ReduceScatters; bwd:
  // their duals and the dW inputs' re-gathers.
  EXPECT_GE(overlapped, 30);
  EXPECT_GT(kept, 0);
  EXPECT_LT(ov.sim.makespan_us, on.sim.makespan_us);
}

TEST(SequenceParallel, FieldRulesNameTheField) {
  const ModelConfig m = Mixed(false);
  const ClusterShape c{2, 8};
  const Layout l = StageOf(8, 1, Family::kParm, true);
  EXPECT_TRUE(ValidateLayout(m, l, 8, c).ok());
  Layout one = l;
  one.tp = 1;
  one.dp = 8;
  EXPECT_EQ(Message(ValidateLayout(m, one, 8, c)),
            "layout.sequence_parallel: splits the sequence over the TP group: needs tp >= 2 (got "
            "tp=1)");
  ModelConfig odd = m;
  odd.seq_length = 127;
  Layout four = l;
  EXPECT_EQ(Message(ValidateLayout(odd, four, 8, c)),
            "layout.sequence_parallel: splits each sequence (each context-parallel chunk) over "
            "the TP group: seq_length must be divisible by tp*cp (got seq_length=127, tp*cp=2)");
  Layout overlap = l;
  overlap.sequence_parallel = false;
  overlap.tp_comm_overlap = true;
  EXPECT_EQ(Message(ValidateLayout(m, overlap, 8, c)),
            "layout.tp_comm_overlap: needs sequence parallelism (sp=1, tp >= 2): it overlaps the "
            "TP sub-blocks' AllGathers and ReduceScatters (got tp=2, sp=0)");
  Layout gather = l;
  gather.overlap_param_gather = true;
  EXPECT_EQ(Message(ValidateLayout(m, gather, 8, c)),
            "layout.overlap_param_gather: needs zero=1 or 2 (the distributed optimizer's "
            "parameter AllGathers) (got zero=0)");
  gather.zero_stage = 1;
  EXPECT_TRUE(ValidateLayout(m, gather, 8, c).ok());
  Layout pp = l;
  pp.family = Family::kPpMoe;
  pp.ep = 2;
  EXPECT_EQ(Message(ValidateLayout(m, pp, 8, c)),
            "layout.sequence_parallel: ppmoe dispatches locally from tokens replicated over the TP "
            "group: use dpmoe or parm (got family=ppmoe)");
  // A model file's parallel section, and a layer alone.
  ModelConfig no_tp = Mixed(true);
  no_tp.parallel.mp = 1;
  no_tp.parallel.dp = 8;
  EXPECT_EQ(Message(ValidateModel(no_tp, c)),
            "parallel.sequence_parallel: splits the sequence over the TP group: needs "
            "parallel.mp >= 2 (got parallel.mp=1)");
  EXPECT_TRUE(ValidateModel(Mixed(true), c).ok());
  LayerConfig layer = Mixed(false).MoeLayer();
  layer.parallel.sequence_parallel = true;
  EXPECT_EQ(Message(ValidateLayer(layer, c))
                .rfind("parallel.sequence_parallel: applies to models "
                       "and layouts",
                       0),
            0u);
}

}  // namespace
}  // namespace moeplan::planner
