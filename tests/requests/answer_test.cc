// The requests library: grids, names on the way in, and answering
// PlanLayer / PlanModel requests.
#include "moeplan/requests/answer.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "absl/strings/str_join.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"
#include "moeplan/requests/grid.h"
#include "moeplan/requests/replan.h"

namespace moeplan::requests {
namespace {

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

v1::LayerConfig Layer(const char* json) {
  v1::LayerConfig l;
  absl::Status s = proto::ParseJson(json, &l);
  EXPECT_TRUE(s.ok()) << s;
  return l;
}

constexpr const char* kLayer = R"({"name": "t", "batch_size": 8, "seq_len": 512,
  "model_dim": 1024, "hidden_dim": 4096, "num_experts": 32, "top_k": 2,
  "capacity_factor": 1.0, "parallel": {"mp": 4, "ep": 16, "esp": 4}})";

TEST(ExpandGrid, CartesianProductInFieldOrder) {
  v1::LayerGrid g;
  ASSERT_TRUE(proto::ParseJson(R"({"name": "g", "batch_size": [1, 2], "seq_len": [8],
      "model_dim": [16], "hidden_dim": [32, 64, 128], "num_experts": [4], "top_k": [1],
      "capacity_factor": [1.0, 2.0], "parallel": [{"mp": 1, "ep": 1, "esp": 1}]})",
                               &g)
                  .ok());
  absl::StatusOr<std::vector<v1::LayerConfig>> c = ExpandGrid(g);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->size(), 12u);  // 2 * 3 * 2
  EXPECT_EQ((*c)[0].batch_size(), 1);
  EXPECT_EQ((*c)[0].hidden_dim(), 32);
  EXPECT_EQ((*c)[0].capacity_factor(), 1.0);
  EXPECT_EQ((*c)[1].capacity_factor(), 2.0);  // innermost list that varies
  EXPECT_EQ((*c)[2].hidden_dim(), 64);
  EXPECT_EQ((*c)[11].batch_size(), 2);
  EXPECT_EQ((*c)[11].hidden_dim(), 128);
  EXPECT_EQ((*c)[5].name(), "g#5");
  EXPECT_FALSE((*c)[0].has_bytes_per_element()) << "unset lists leave the field unset";
  EXPECT_FALSE((*c)[0].has_dropless());
}

TEST(ExpandGrid, DroplessIsTheInnermostAxis) {
  v1::LayerGrid g;
  ASSERT_TRUE(proto::ParseJson(R"({"batch_size": [1], "seq_len": [8], "model_dim": [16],
      "hidden_dim": [32], "num_experts": [4], "top_k": [1], "capacity_factor": [1.0],
      "token_skew": [1, 2], "parallel": [{"mp": 1, "ep": 1, "esp": 1}], "dropless": [false, true]})",
                               &g)
                  .ok());
  absl::StatusOr<std::vector<v1::LayerConfig>> c = ExpandGrid(g);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->size(), 4u);
  EXPECT_FALSE((*c)[0].dropless());
  EXPECT_TRUE((*c)[1].dropless());
  EXPECT_EQ((*c)[1].token_skew(), 1.0);
  EXPECT_EQ((*c)[2].token_skew(), 2.0);
  absl::StatusOr<planner::LayerConfig> l = proto::LayerFromProto((*c)[3]);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_TRUE(l->dropless);
  EXPECT_TRUE(proto::LayerToProto(*l).dropless());
}

// Dropless layers have no capacity: an all-dropless grid may leave it out,
// any other grid may not.
TEST(ExpandGrid, OnlyAnAllDroplessGridMayLeaveTheCapacityFactorOut) {
  v1::LayerGrid g;
  ASSERT_TRUE(proto::ParseJson(R"({"batch_size": [1], "seq_len": [8], "model_dim": [16],
      "hidden_dim": [32], "num_experts": [4], "top_k": [1],
      "parallel": [{"mp": 1, "ep": 1, "esp": 1}], "dropless": [true]})",
                               &g)
                  .ok());
  absl::StatusOr<std::vector<v1::LayerConfig>> c = ExpandGrid(g);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->size(), 1u);
  EXPECT_EQ((*c)[0].capacity_factor(), 0.0) << "left unset";
  absl::StatusOr<planner::LayerConfig> l = proto::LayerFromProto((*c)[0]);
  ASSERT_TRUE(l.ok()) << l.status();
  g.add_dropless(false);
  EXPECT_EQ(Msg(ExpandGrid(g).status()),
            "capacity_factor: a grid needs at least one value (got an empty list); only a grid "
            "whose dropless values are all true may leave it out");
}

TEST(ExpandGrid, RejectsEmptyListsAndHugeGrids) {
  v1::LayerGrid g;
  g.add_batch_size(1);
  EXPECT_EQ(Msg(ExpandGrid(g).status()),
            "seq_len: a grid needs at least one value (got an empty list)");
  for (int i = 0; i < 100; ++i) {
    g.add_seq_len(i + 1);
    g.add_model_dim(i + 1);
    g.add_hidden_dim(i + 1);
  }
  g.add_num_experts(1);
  g.add_top_k(1);
  g.add_capacity_factor(1);
  g.add_parallel();
  EXPECT_EQ(ExpandGrid(g, 1000).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(Msg(ExpandGrid(g, 1000).status()).find("exceeds the limit of 1000"), std::string::npos);
}

TEST(Names, AreLabelsOfAtMost256Bytes) {
  // A grid's name is copied into each of its configs: bounded, it cannot
  // multiply into gigabytes.
  v1::LayerGrid g;
  g.set_name(std::string(256, 'g'));
  for (int i = 0; i < 4; ++i) g.add_batch_size(i + 1);
  g.add_seq_len(8);
  g.add_model_dim(8);
  g.add_hidden_dim(8);
  g.add_num_experts(2);
  g.add_top_k(1);
  g.add_capacity_factor(1);
  g.add_parallel();
  ASSERT_TRUE(ExpandGrid(g).ok());
  g.set_name(std::string(257, 'g'));
  EXPECT_EQ(Msg(ExpandGrid(g).status()), "name: must be at most 256 bytes (got 257)");
  v1::LayerConfig l = Layer(R"({"batch_size": 4, "seq_len": 8, "model_dim": 8, "hidden_dim": 8,
                                "num_experts": 2, "top_k": 1, "parallel": {"mp": 1, "ep": 1, "esp": 1}})");
  l.set_name(std::string(256, 'l'));
  EXPECT_TRUE(proto::LayerFromProto(l).ok());
  l.set_name(std::string(257, 'l'));
  EXPECT_EQ(Msg(proto::LayerFromProto(l).status()), "name: must be at most 256 bytes (got 257)");
  v1::ModelConfig m;
  ASSERT_TRUE(
      proto::ReadJsonFile(MOEPLAN_SOURCE_DIR "/examples/models/gpt3-medium-moe.json", &m).ok());
  m.set_name(std::string(256, 'm'));
  EXPECT_TRUE(proto::ModelFromProto(m).ok());
  m.set_name(std::string(257, 'm'));
  EXPECT_EQ(Msg(proto::ModelFromProto(m).status()), "name: must be at most 256 bytes (got 257)");
}

class AnswerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    profile_ = *calibration::LoadProfile("a100-8x8");
    cost_ = std::make_unique<planner::CostModel>(*planner::CostModel::Create(profile_.profile));
    planner_ = std::make_unique<planner::LayerPlanner>(*cost_);
  }
  calibration::LoadedProfile profile_;
  std::unique_ptr<planner::CostModel> cost_;
  std::unique_ptr<planner::LayerPlanner> planner_;
};

TEST_F(AnswerTest, RanksAllSchedulesAndFillsTimelinesOnRequest) {
  v1::PlanLayerRequest req;
  *req.mutable_layer() = Layer(kLayer);
  v1::PlanLayerResponse resp;
  ASSERT_TRUE(AnswerPlanLayer(req, *planner_, profile_.profile, &resp).ok());
  ASSERT_EQ(resp.candidates_size(), 3);
  EXPECT_EQ(resp.best_schedule(), resp.candidates(0).schedule());
  EXPECT_EQ(resp.decision().best(), resp.best_schedule());
  EXPECT_LE(resp.candidates(0).total_us(), resp.candidates(1).total_us());
  EXPECT_LE(resp.candidates(1).total_us(), resp.candidates(2).total_us());
  EXPECT_EQ(resp.candidates(0).ops_size(), 0);
  EXPECT_EQ(resp.profile_name(), "a100-8x8");
  EXPECT_EQ(resp.derived().tokens(), 4096);
  EXPECT_EQ(resp.derived().capacity(), 256);  // 2 * 1.0 * 4096 / 32
  req.set_include_timeline(true);
  ASSERT_TRUE(AnswerPlanLayer(req, *planner_, profile_.profile, &resp).ok());
  for (const v1::CandidatePlan& c : resp.candidates()) {
    ASSERT_GT(c.ops_size(), 0);
    EXPECT_DOUBLE_EQ(c.forward_us() + c.backward_us(), c.total_us());
    double last_end = 0;
    double critical_sum = 0;
    for (const v1::OpTiming& op : c.ops()) {
      last_end = std::max(last_end, op.end_us());
      if (op.critical()) critical_sum += op.end_us() - op.start_us();
    }
    EXPECT_DOUBLE_EQ(last_end, c.total_us());
    EXPECT_NEAR(critical_sum, c.total_us(), 1e-6 * c.total_us());
  }
}

TEST_F(AnswerTest, ErrorsNameRequestFields) {
  v1::PlanLayerRequest req;
  v1::PlanLayerResponse resp;
  EXPECT_EQ(Msg(AnswerPlanLayer(req, *planner_, profile_.profile, &resp)), "layer: required");
  *req.mutable_layer() = Layer(kLayer);
  req.mutable_layer()->set_top_k(64);
  EXPECT_EQ(Msg(AnswerPlanLayer(req, *planner_, profile_.profile, &resp)),
            "layer.top_k: must be <= num_experts (got top_k=64, num_experts=32)");
  *req.mutable_layer() = Layer(kLayer);
  req.add_schedules(v1::SCHEDULE_S1);
  req.add_schedules(v1::SCHEDULE_UNSPECIFIED);
  EXPECT_EQ(Msg(AnswerPlanLayer(req, *planner_, profile_.profile, &resp)),
            "schedules[1]: must be SCHEDULE_DEFAULT, SCHEDULE_S1 or SCHEDULE_S2 (got 0)");
  req.clear_schedules();
  req.add_schedules(v1::SCHEDULE_S2);
  req.add_schedules(v1::SCHEDULE_S2);
  EXPECT_EQ(Msg(AnswerPlanLayer(req, *planner_, profile_.profile, &resp)).rfind("schedules: ", 0),
            0u);
}

// A model's timeline is bounded per response: 1,024 blocks of which every
// one is MoE is ~42,000 ops per variant plan without overlap, ~100,000 with
// partitions; all five variants are over kMaxTimelineOps, one is not.
TEST_F(AnswerTest, ATimelineOverTheLimitIsRefusedBeforeItIsBuilt) {
  v1::PlanModelRequest req;
  ASSERT_TRUE(proto::ReadJsonFile(MOEPLAN_SOURCE_DIR "/examples/models/gpt3-medium-moe.json",
                                  req.mutable_model())
                  .ok());
  req.mutable_model()->set_num_layers(1024);
  req.mutable_model()->mutable_moe()->set_layer_freq(1);
  req.set_include_timeline(true);
  planner::ModelPlanner planner(*cost_);
  v1::PlanModelResponse out;
  absl::Status s = AnswerPlanModel(req, planner, profile_.profile, &out);
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(Msg(s).rfind("include_timeline: the timeline would hold ", 0), 0u) << s;
  EXPECT_NE(Msg(s).find("(5 variants), over the limit of 262144 per response"), std::string::npos)
      << s;
  req.mutable_options()->add_variants(v1::OVERLAP_VARIANT_LANCET);
  ASSERT_TRUE(AnswerPlanModel(req, planner, profile_.profile, &out).ok());
  ASSERT_EQ(out.variants_size(), 1);
  EXPECT_GT(out.variants(0).ops_size(), 50000);
  EXPECT_LE(out.variants(0).ops_size(), planner::kMaxTimelineOps);
}

// Search and layout modes: every candidate carries its launcher arguments;
// include_timeline adds its pipeline, one iteration whose last span ends
// at the candidate's iteration time, every micro-batch's steps on every
// stage. A layout whose timeline would pass kMaxTimelineOps is refused
// before it is traced.
TEST_F(AnswerTest, CandidatesCarryLauncherArgumentsAndTheirPipelines) {
  v1::PlanModelRequest req;
  ASSERT_TRUE(proto::ReadJsonFile(MOEPLAN_SOURCE_DIR "/examples/models/gpt3-medium-moe.json",
                                  req.mutable_model())
                  .ok());
  req.mutable_search()->set_gpus(16);
  req.mutable_search()->set_top(3);
  req.mutable_search()->set_max_microbatches(8);
  planner::ModelPlanner planner(*cost_);
  v1::PlanModelResponse plain, traced;
  ASSERT_TRUE(AnswerPlanModel(req, planner, profile_.profile, &plain).ok());
  req.set_include_timeline(true);
  ASSERT_TRUE(AnswerPlanModel(req, planner, profile_.profile, &traced).ok());
  ASSERT_EQ(traced.candidates_size(), 3);
  for (int i = 0; i < traced.candidates_size(); ++i) {
    const v1::LayoutCandidate& c = traced.candidates(i);
    EXPECT_EQ(plain.candidates(i).pipeline_size(), 0);
    EXPECT_EQ(plain.candidates(i).iteration_us(), c.iteration_us());
    const std::string args = absl::StrJoin(c.megatron_args(), " ");
    EXPECT_NE(args.find("--tensor-model-parallel-size " + std::to_string(c.layout().tp()) + " "),
              std::string::npos)
        << args;
    EXPECT_NE(args.find("--global-batch-size 256 "), std::string::npos) << args;
    EXPECT_EQ(c.deepspeed_config().rfind("{\"train_batch_size\": 256, ", 0), 0u)
        << c.deepspeed_config();
    EXPECT_EQ(absl::StrJoin(plain.candidates(i).megatron_args(), " "), args);
    double end = 0.0;
    int steps = 0, tails = 0;
    for (const v1::PipelineSpan& sp : c.pipeline()) {
      end = std::max(end, sp.end_us());
      steps += sp.kind() == "forward" || sp.kind() == "backward";
      tails += sp.kind() == "tail";
    }
    EXPECT_EQ(end, c.iteration_us()) << i;
    EXPECT_EQ(tails, c.layout().pp()) << i;
    EXPECT_EQ(steps, c.layout().pp() * std::max(c.layout().virtual_stages(), 1) *
                         c.layout().microbatches() * 2)
        << i;
  }
  // timeline_top: the best one only; without include_timeline it is refused.
  req.mutable_search()->set_timeline_top(1);
  v1::PlanModelResponse best;
  ASSERT_TRUE(AnswerPlanModel(req, planner, profile_.profile, &best).ok());
  EXPECT_EQ(best.candidates(0).pipeline_size(), traced.candidates(0).pipeline_size());
  EXPECT_EQ(best.candidates(1).pipeline_size(), 0);
  req.clear_include_timeline();
  EXPECT_EQ(Msg(AnswerPlanModel(req, planner, profile_.profile, &best)),
            "search.timeline_top: only with include_timeline");
  req.set_include_timeline(true);
  req.mutable_search()->set_timeline_top(1001);
  EXPECT_EQ(Msg(AnswerPlanModel(req, planner, profile_.profile, &best)),
            "search.timeline_top: must be between 0 and 1000 (got 1001)");
  // One layout: the same pipeline as the search's for it.
  req.clear_search();
  *req.mutable_layout() = traced.candidates(0).layout();
  v1::PlanModelResponse one;
  ASSERT_TRUE(AnswerPlanModel(req, planner, profile_.profile, &one).ok());
  ASSERT_EQ(one.candidates_size(), 1);
  EXPECT_EQ(one.candidates(0).pipeline_size(), traced.candidates(0).pipeline_size());
  EXPECT_EQ(one.candidates(0).megatron_args_size(), traced.candidates(0).megatron_args_size());
  // 16 stages of 4096 micro-batches: up to 16 * 4096 * 4 + 16 spans.
  req.mutable_model()->set_global_batch_size(4096);
  v1::Layout* l = req.mutable_layout();
  *l = v1::Layout();
  l->set_dp(1);
  l->set_tp(1);
  l->set_pp(16);
  l->set_ep(1);
  l->set_esp(1);
  l->set_microbatches(4096);
  absl::Status s = AnswerPlanModel(req, planner, profile_.profile, &one);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(Msg(s),
            "include_timeline: the pipelines of 1 layout would hold up to 262160 spans, over the "
            "limit of 262144 per response; ask with fewer micro-batches (layout.microbatches) or "
            "without it");
  req.clear_include_timeline();
  EXPECT_TRUE(AnswerPlanModel(req, planner, profile_.profile, &one).ok());
}

// FP8 training (fp8_format) plans the linear layers' GEMMs at the profile's
// FP8 peak after their casts, and reports MFU against the BF16 peak as
// Megatron-Core does; without an FP8 peak only the casts remain, slower than
// BF16. A model in 1-byte elements is refused with the reason.
TEST(AnswerFp8, LinearGemmsRunAtTheFp8Peak) {
  v1::PlanModelRequest req;
  ASSERT_TRUE(proto::ReadJsonFile(MOEPLAN_SOURCE_DIR "/examples/models/gpt2-s-moe.a100.json",
                                  req.mutable_model())
                  .ok());
  req.mutable_options()->add_variants(v1::OVERLAP_VARIANT_NONE);
  auto plan = [&](const planner::ClusterProfile& p, std::string_view format) {
    req.mutable_model()->set_fp8_format(std::string(format));
    const planner::CostModel cost = *planner::CostModel::Create(p);
    planner::ModelPlanner planner(cost);
    v1::PlanModelResponse out;
    const absl::Status s = AnswerPlanModel(req, planner, p, &out);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(out.variants_size(), 1);
    return out;
  };
  planner::ClusterProfile h100 = calibration::LoadProfile("h100-8x8")->profile;
  const v1::PlanModelResponse bf16 = plan(h100, "");
  const v1::PlanModelResponse fp8 = plan(h100, "hybrid");
  EXPECT_EQ(fp8.accounting().peak_tflops(), 989.5);
  EXPECT_EQ(bf16.accounting().peak_tflops(), 989.5);
  EXPECT_LT(fp8.variants(0).compute_us(), bf16.variants(0).compute_us());
  EXPECT_NEAR(fp8.variants(0).mfu(),
              fp8.variants(0).tflops_per_gpu() / fp8.accounting().peak_tflops(), 1e-12);
  EXPECT_EQ(fp8.model().fp8_format(), "hybrid");
  h100.gemm.fp8_peak_tflops = 0.0;  // no FP8 tensor cores: the casts cost, nothing gains
  const v1::PlanModelResponse casts_only = plan(h100, "e4m3");
  EXPECT_GT(casts_only.variants(0).compute_us(), bf16.variants(0).compute_us());

  req.mutable_model()->set_fp8_format("");
  req.mutable_model()->set_bytes_per_element(1);
  const planner::CostModel cost = *planner::CostModel::Create(h100);
  planner::ModelPlanner planner(cost);
  v1::PlanModelResponse out;
  const absl::Status s = AnswerPlanModel(req, planner, h100, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bytes_per_element: must be 2 (bf16/fp16) or 4 (fp32) in a model"),
            std::string::npos)
      << s;
}

// A 100 KB family, families or pipelines value came back whole in the error,
// too big for a gRPC status (the client saw "received initial metadata size
// exceeds limit"): the field is named and a bounded prefix echoed (issue 35).
TEST_F(AnswerTest, ErrorsEchoABoundedPrefixOfAValue) {
  v1::PlanModelRequest req;
  ASSERT_TRUE(proto::ReadJsonFile(MOEPLAN_SOURCE_DIR "/examples/models/gpt3-medium-moe.json",
                                  req.mutable_model())
                  .ok());
  const std::string big(100 * 1024, 'p');
  planner::ModelPlanner planner(*cost_);
  v1::PlanModelResponse out;
  req.mutable_search()->add_families(big);
  std::string msg = Msg(AnswerPlanModel(req, planner, profile_.profile, &out));
  EXPECT_LT(msg.size(), 200u) << msg;
  EXPECT_EQ(msg.rfind("search.families: each must be dpmoe, ppmoe or parm (got 'ppp", 0), 0u);
  EXPECT_NE(msg.find("'... (102400 bytes))"), std::string::npos) << msg;
  req.mutable_search()->clear_families();
  req.mutable_search()->add_pipelines(big);
  msg = Msg(AnswerPlanModel(req, planner, profile_.profile, &out));
  EXPECT_LT(msg.size(), 200u) << msg;
  EXPECT_EQ(
      msg.rfind("search.pipelines: each must be gpipe, 1f1b, interleaved or dualpipe (got 'ppp", 0),
      0u);
  req.clear_search();
  v1::Layout* layout = req.mutable_layout();
  layout->set_dp(1);
  layout->set_tp(1);
  layout->set_pp(1);
  layout->set_ep(1);
  layout->set_esp(1);
  layout->set_family(big);
  msg = Msg(AnswerPlanModel(req, planner, profile_.profile, &out));
  EXPECT_LT(msg.size(), 200u) << msg;
  EXPECT_EQ(msg.rfind("layout.family: must be dpmoe, ppmoe or parm (got 'ppp", 0), 0u) << msg;
  v1::VariantPlan ran;
  ran.set_name("\x1b[2J" + big);
  msg = Msg(PinnedModelRequest(req.model(), ran).status());
  EXPECT_LT(msg.size(), 200u) << msg;
  EXPECT_EQ(msg.rfind("variant: must be none, tutel, dw, partition or lancet (got '\\x1b[2Jppp", 0),
            0u)
      << msg;
}

TEST(Names, RefuseControlCharacters) {
  v1::LayerGrid g;
  g.set_name("grid\x1b[31m");
  g.add_batch_size(1);
  g.add_seq_len(8);
  g.add_model_dim(8);
  g.add_hidden_dim(8);
  g.add_num_experts(2);
  g.add_top_k(1);
  g.add_capacity_factor(1);
  g.add_parallel();
  EXPECT_EQ(Msg(ExpandGrid(g).status()),
            "name: must not contain control characters (got 'grid\\x1b[31m')");
}

}  // namespace
}  // namespace moeplan::requests
