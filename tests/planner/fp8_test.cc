// FP8 training (docs/model.md "FP8 training"): the linear layers' GEMMs at
// the FP8 peak after their casts, attention and the output layer not;
// DeepEP's dispatch in FP8, its combine not; the memory model's saved inputs
// and weight copies; ZeRO's parameter gathers with fp8_param_gather.
#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "moeplan/planner/layout.h"
#include "moeplan/planner/layout_memory.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/model_planner.h"
#include "test_profile.h"

namespace moeplan::planner {
namespace {

using testing::RoundNumberProfile;
using testing::SmallDenseFirstModel;
using testing::SmallDenseModel;

// The round-number profile with an FP8 peak of twice the BF16 one: an FP8
// GEMM's time past its 5 us launch is half the BF16 one's.
const CostModel& Fp8Model() {
  static const CostModel* m = [] {
    ClusterProfile p = RoundNumberProfile();
    p.gemm.fp8_peak_tflops = 200.0;
    return new CostModel(*CostModel::Create(p));
  }();
  return *m;
}

const OpGraph& PlanGraph(const ModelConfig& m, AllToAllAlgo algo, ModelPlan* plan,
                         const StageOptions& stage = {}) {
  ModelPlanner planner(Fp8Model());
  ModelPlanOptions o;
  o.variants = {Variant::kNone};
  o.schedules = {Schedule::kDefault};
  o.algos = {algo};
  EXPECT_TRUE(planner.PlanStage(m, o, stage, plan).ok());
  return plan->variants[static_cast<size_t>(plan->best)].graph;
}

// The first op of `base` (block 0's for the dense ones, the first MoE
// block's for the experts').
Op Find(const OpGraph& g, std::string_view base) {
  for (OpId id = 0; id < g.size(); ++id) {
    if (g.op(id).base == base) return g.op(id);
  }
  ADD_FAILURE() << "no op " << base;
  return {};
}

double Fp8Gemm(double bf16_us) { return 5.0 + (bf16_us - 5.0) / 2.0; }
// A cast of n elements: read 2 bytes, write two 1-byte copies, at 1e6 B/us
// after a 3 us launch.
double Cast(double n) { return 3.0 + 4.0 * n / 1e6; }

// TP 2 over 256 tokens of hidden 256: every linear layer's forward GEMM is
// its BF16 time at twice the rate plus the cast of its [256 x K] input; dX
// adds the cast of its output gradient, dW none; the attention core and the
// output layer keep their BF16 times.
TEST(Fp8, LinearLayersOnlyRunInFp8) {
  ModelConfig bf16 = SmallDenseFirstModel(2);
  ModelConfig fp8 = bf16;
  fp8.fp8_format = Fp8Format::kHybrid;
  ModelPlan pa, pb;
  const OpGraph& a = PlanGraph(bf16, AllToAllAlgo::kLinear, &pa);
  const OpGraph& b = PlanGraph(fp8, AllToAllAlgo::kLinear, &pb);
  const double S = 256, M = 256;
  // fwd.qkv: [256 x 256] . [256 x 192] (4 + 2 x 1 heads of 32 per rank).
  EXPECT_REL(Find(b, "fwd.qkv").cost_us, Fp8Gemm(Find(a, "fwd.qkv").cost_us) + Cast(S * M));
  // fwd.proj's input is the 4 heads' 128 values per token.
  EXPECT_REL(Find(b, "fwd.proj").cost_us, Fp8Gemm(Find(a, "fwd.proj").cost_us) + Cast(S * 128));
  // bwd.proj_dx reads the [256 x 256] output gradient; bwd.proj_dw the copies.
  EXPECT_REL(Find(b, "bwd.proj_dx").cost_us, Fp8Gemm(Find(a, "bwd.proj_dx").cost_us) + Cast(S * M));
  EXPECT_REL(Find(b, "bwd.proj_dw").cost_us, Fp8Gemm(Find(a, "bwd.proj_dw").cost_us));
  for (std::string_view same : {"fwd.attn_score", "fwd.attn_ctx", "fwd.softmax", "fwd.lm_head",
                                "bwd.lm_head_dx", "fwd.proj_allreduce", "fwd.ln1"}) {
    EXPECT_EQ(Find(b, same).cost_us, Find(a, same).cost_us) << same;
  }
  // The experts (one local expert of 256 x 256, SwiGLU: [rows x 256] .
  // [256 x 512] and [rows x 256] . [256 x 256]): 3 rows h m flops of
  // 2 x 2 rows h m + 2 rows m h saved at twice the rate, plus the casts of
  // both inputs. rows from the op's bytes: rows (2 m b + 3 h b) = rows 2560.
  const Op ea = Find(a, "fwd.expert"), eb = Find(b, "fwd.expert");
  const double rows = static_cast<double>(ea.bytes) / 2560.0;
  EXPECT_REL(eb.cost_us, ea.cost_us - 3.0 * rows * 256 * 256 / 1e8 + Cast(rows * 512));
  EXPECT_EQ(Find(b, "fwd.gate").cost_us, Find(a, "fwd.gate").cost_us);  // the router: BF16
  // Communication is BF16 with the AlltoAll dispatcher.
  EXPECT_EQ(Find(b, "fwd.ep_alltoall_dispatch").bytes, Find(a, "fwd.ep_alltoall_dispatch").bytes);
  // GEMMs this small gain less than their casts cost (3 us launches each):
  // the iteration is slower in FP8, as small models' published FP8 runs are
  // no faster than BF16 (docs/model.md "FP8 training").
  EXPECT_GT(pb.variants[0].iteration_us(), pa.variants[0].iteration_us());
}

// DeepEP sends towards the experts in FP8 (a byte and a 4-byte scale per
// 128 for each 2-byte element); the combine comes back in BF16.
TEST(Fp8, DeepEpDispatchesInFp8AndCombinesInBf16) {
  ModelConfig bf16 = SmallDenseFirstModel(1);
  bf16.parallel = {.mp = 1, .ep = 8, .esp = 1, .dp = 32, .pp = 1};
  ModelConfig fp8 = bf16;
  fp8.fp8_format = Fp8Format::kE4M3;
  ModelPlan pa, pb;
  const OpGraph& a = PlanGraph(bf16, AllToAllAlgo::kDeepEp, &pa);
  const OpGraph& b = PlanGraph(fp8, AllToAllAlgo::kDeepEp, &pb);
  const double share = (1.0 + 4.0 / 128.0) / 2.0;
  for (std::string_view to_experts : {"fwd.ep_alltoall_dispatch", "bwd.ep_alltoall_combine"}) {
    EXPECT_NEAR(static_cast<double>(Find(b, to_experts).bytes),
                static_cast<double>(Find(a, to_experts).bytes) * share, 1.0)
        << to_experts;
  }
  for (std::string_view back : {"fwd.ep_alltoall_combine", "bwd.ep_alltoall_dispatch"}) {
    EXPECT_EQ(Find(b, back).bytes, Find(a, back).bytes) << back;
  }
}

// Stage memory of the dense model (TP 2, 256 tokens, 4 blocks): each block
// keeps 1-byte copies of its QKV input (256 x 256), output projection input
// (256 x 128), FC1 input (256 x 256) and FC2 input (256 x 256 per rank),
// saving a byte each; the weights add their two FP8 copies (4 bytes per
// parameter), which fp8_param_gather makes the weights (2).
TEST(Fp8, MemoryKeepsFp8InputsAndWeightCopies) {
  ModelConfig bf16 = SmallDenseModel(2);
  ModelConfig fp8 = bf16;
  fp8.fp8_format = Fp8Format::kHybrid;
  Layout l;
  l.tp = 2;
  l.dp = 4;
  l.microbatches = 1;
  const MemoryOptions o{.gpu_memory_bytes = 0.0};
  const MemoryBreakdown a = StageMemory(bf16, l, 2, 0, 1.0, o);
  const MemoryBreakdown b = StageMemory(fp8, l, 2, 0, 1.0, o);
  const double saved = 256.0 * (256 + 128 + 256 + 256);
  EXPECT_REL(a.activation_per_microbatch - b.activation_per_microbatch, 4 * saved);
  EXPECT_REL(b.params, 2.0 * a.params);
  fp8.fp8_param_gather = true;
  EXPECT_REL(StageMemory(fp8, l, 2, 0, 1.0, o).params, a.params);
  EXPECT_EQ(b.grads, a.grads);
  EXPECT_EQ(b.optimizer, a.optimizer);
}

// ZeRO 1's parameter gathers after the step move 1-byte parameters with
// fp8_param_gather; the gradients' ReduceScatters stay as they were.
TEST(Fp8, ParamGatherInFp8) {
  ModelConfig m = SmallDenseModel(2);
  m.fp8_format = Fp8Format::kHybrid;
  StageOptions zero1;
  zero1.zero_stage = 1;
  ModelPlan pa, pb;
  const OpGraph& a = PlanGraph(m, AllToAllAlgo::kLinear, &pa, zero1);
  m.fp8_param_gather = true;
  const OpGraph& b = PlanGraph(m, AllToAllAlgo::kLinear, &pb, zero1);
  EXPECT_NEAR(static_cast<double>(Find(b, "optimizer.param_allgather").bytes),
              static_cast<double>(Find(a, "optimizer.param_allgather").bytes) / 2.0, 1.0);
  EXPECT_EQ(Find(b, "bwd.grad_reducescatter").bytes, Find(a, "bwd.grad_reducescatter").bytes);
}

TEST(Fp8, FieldRules) {
  ModelConfig m = SmallDenseModel(2);
  m.bytes_per_element = 1;
  EXPECT_EQ(ValidateModelShape(m).message(),
            "bytes_per_element: must be 2 (bf16/fp16) or 4 (fp32) in a model: FP8 training keeps "
            "activations, communication and the output layer in BF16; set fp8_format (e4m3 or "
            "hybrid) for FP8 GEMMs (got 1)");
  m.bytes_per_element = 4;
  m.fp8_format = Fp8Format::kE4M3;
  EXPECT_EQ(ValidateModelShape(m).message(),
            "fp8_format: needs bytes_per_element 2 (FP8 GEMMs beside BF16 activations) (got e4m3, "
            "bytes_per_element=4)");
  m.bytes_per_element = 2;
  m.fp8_format = Fp8Format::kNone;
  m.fp8_param_gather = true;
  EXPECT_EQ(ValidateModelShape(m).message(),
            "fp8_param_gather: needs fp8_format (the weights it gathers are FP8) (got true)");
  Fp8Format f;
  EXPECT_TRUE(ParseFp8Format("hybrid", &f));
  EXPECT_EQ(f, Fp8Format::kHybrid);
  EXPECT_FALSE(ParseFp8Format("e5m2", &f));
  Fp8Recipe r;
  EXPECT_TRUE(ParseFp8Recipe("blockwise", &r));
  EXPECT_EQ(Fp8RecipeName(r), "blockwise");
}

}  // namespace
}  // namespace moeplan::planner
