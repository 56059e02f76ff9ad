// Replays (requests/replay.h): measured op durations on the plan's op graph.
// Hand-checkable graphs first (a chain, a fork and join across resources, a
// resource held in issue order, two devices), then whole plans replaying
// their own predicted timelines, and a reported run.
#include "moeplan/requests/replay.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "moeplan/calibration/profiles.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/planner.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"
#include "moeplan/requests/answer.h"
#include "moeplan/requests/replan.h"

namespace moeplan::requests {
namespace {

namespace p = ::moeplan::planner;

p::Op MakeOp(std::string_view base, p::ResourceMask res, double cost_us, int16_t device = 0) {
  p::Op op;
  op.base = base;
  op.kind = res == p::kCompute ? p::OpKind::kCompute : p::OpKind::kComm;
  op.resources = res;
  op.cost_us = cost_us;
  op.device = device;
  return op;
}

MeasuredOpTime Timed(std::string_view name, double start, double end) {
  return {name, end - start, start, true};
}

// A chain: the replay is the sum of the measured durations, which, when the
// run's ops followed one another, is the measured makespan.
TEST(Replay, OfAChainIsTheMeasuredMakespan) {
  p::OpGraph g;
  const p::OpId a = g.Add(MakeOp("a", p::kCompute, 100), {});
  const p::OpId b = g.Add(MakeOp("b", p::kIntra, 100), {a});
  g.Add(MakeOp("c", p::kCompute, 100), {b});
  const std::vector<MeasuredOpTime> m = {Timed("a", 0, 12.5), Timed("b", 12.5, 40),
                                         Timed("c", 40, 47)};
  absl::StatusOr<v1::Replay> r = ReplayOnGraph(g, m, 47.0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->replayed_us(), 47.0);
  EXPECT_DOUBLE_EQ(r->composition_error_pct(), 0.0);
  EXPECT_EQ(r->ops(), 3);
  EXPECT_EQ(r->unmeasured_ops(), 0);
  EXPECT_EQ(r->unplanned_ops(), 0);
  EXPECT_DOUBLE_EQ(r->waited_us(), 0.0);
  EXPECT_DOUBLE_EQ(r->early_us(), 0.0);
  // The measured total is longer than its ops: 3 us between them the plan lacks.
  r = ReplayOnGraph(g, m, 50.0);
  ASSERT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(r->composition_error_pct(), 100.0 * (47.0 - 50.0) / 50.0);
}

// The drift-corrected prediction scales compute only: a fork of compute (40)
// and the intra link (100) joined by compute (10) takes 110 us; computing at
// half speed (scale 2) the compute branch (80) still hides under the link and
// the join doubles, 120 us; at a tenth of the speed the compute branch (400)
// is the longer, 500 us. The plan itself is left as it was.
TEST(ScaledComputeMakespan, ScalesComputeAndKeepsCommunication) {
  p::OpGraph g;
  const p::OpId a = g.Add(MakeOp("a", p::kCompute, 40), {});
  const p::OpId b = g.Add(MakeOp("b", p::kIntra, 100), {});
  g.Add(MakeOp("c", p::kCompute, 10), {a, b});
  absl::StatusOr<double> us = ScaledComputeMakespan(g, 1.0);
  ASSERT_TRUE(us.ok()) << us.status();
  EXPECT_DOUBLE_EQ(*us, 110.0);
  us = ScaledComputeMakespan(g, 2.0);
  ASSERT_TRUE(us.ok());
  EXPECT_DOUBLE_EQ(*us, 120.0);
  us = ScaledComputeMakespan(g, 10.0);
  ASSERT_TRUE(us.ok());
  EXPECT_DOUBLE_EQ(*us, 500.0);
  EXPECT_DOUBLE_EQ(g.op(a).cost_us, 40.0);
  for (double bad : {0.0, -1.0, std::nan("")}) {
    const absl::Status s = ScaledComputeMakespan(g, bad).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("compute_scale: must be finite and > 0"), std::string::npos)
        << s.message();
  }
}

// Every dependency and resource of the plan: a fork onto compute and the
// intra link, a second intra op held behind the first in issue order, a join,
// and ops of another device that share no resource with device 0.
TEST(Replay, HonoursEveryDependencyAndResource) {
  p::OpGraph g;
  const p::OpId a = g.Add(MakeOp("a", p::kCompute, 1), {});
  g.Add(MakeOp("b", p::kIntra, 1), {a});                         // after a
  const p::OpId c = g.Add(MakeOp("c", p::kCompute, 1), {a});     // beside b
  const p::OpId d = g.Add(MakeOp("d", p::kIntra, 1), {a});       // behind b on intra
  const p::OpId e = g.Add(MakeOp("e", p::kCompute, 1), {c, d});  // the join
  const p::OpId f = g.Add(MakeOp("f", p::kIntra, 1, /*device=*/1), {});
  g.Add(MakeOp("g", p::kCompute, 1, /*device=*/1), {f, e});
  // Durations: a 10, b 30, c 5, d 7, e 4, f 100, g 2.
  // a [0,10]; b [10,40]; c [10,15]; d [40,47] (intra after b); e [47,51];
  // f [0,100] (device 1's link); g [100,102].
  const std::vector<MeasuredOpTime> m = {
      {"a", 10, 0, false}, {"b", 30, 0, false},  {"c", 5, 0, false}, {"d", 7, 0, false},
      {"e", 4, 0, false},  {"f", 100, 0, false}, {"g", 2, 0, false}};
  absl::StatusOr<v1::Replay> r = ReplayOnGraph(g, m, 102.0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->replayed_us(), 102.0);
  EXPECT_TRUE(r->waits().empty()) << "no starts measured: no waits";
  // Device 1's link busy for 30 us only: the join on device 0 binds g,
  // f [0,30], g [51,53]. Were d not held behind b, e would end at 21 and g
  // at 32.
  std::vector<MeasuredOpTime> m2 = m;
  m2[5].duration_us = 30;
  r = ReplayOnGraph(g, m2, 53.0);
  ASSERT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(r->replayed_us(), 53.0);
  EXPECT_DOUBLE_EQ(r->composition_error_pct(), 0.0);
}

// An op measured to start later than everything the plan makes it wait for
// waited for something the plan lacks; one that started before its resource
// predecessor ended ran beside it, which the plan does not allow.
TEST(Replay, NamesTheOpsThatWaitedForWhatThePlanLacks) {
  p::OpGraph g;
  const p::OpId a = g.Add(MakeOp("a", p::kCompute, 1), {});
  const p::OpId b = g.Add(MakeOp("b", p::kIntra, 1), {a});
  g.Add(MakeOp("c", p::kIntra, 1), {});  // held behind b on intra, no dependency
  g.Add(MakeOp("d", p::kCompute, 1), {b});
  const std::vector<MeasuredOpTime> m = {Timed("a", 0, 10),
                                         Timed("b", 25, 35),   // 15 us after a ended
                                         Timed("c", 30, 38),   // 5 us before b ended
                                         Timed("d", 38, 40)};  // 3 us after b ended
  absl::StatusOr<v1::Replay> r = ReplayOnGraph(g, m, 40.0);
  ASSERT_TRUE(r.ok()) << r.status();
  // Replay: a [0,10], b [10,20], c [20,28], d [20,22].
  EXPECT_DOUBLE_EQ(r->replayed_us(), 28.0);
  EXPECT_DOUBLE_EQ(r->composition_error_pct(), -30.0);
  ASSERT_EQ(r->waits_size(), 4);
  EXPECT_EQ(r->waits(0).op(), "b");
  EXPECT_DOUBLE_EQ(r->waits(0).unexplained_wait_us(), 15.0);
  EXPECT_DOUBLE_EQ(r->waits(0).measured_start_us(), 25.0);
  EXPECT_DOUBLE_EQ(r->waits(0).replayed_start_us(), 10.0);
  EXPECT_EQ(r->waits(1).op(), "c");
  EXPECT_DOUBLE_EQ(r->waits(1).unexplained_wait_us(), -5.0);
  EXPECT_EQ(r->waits(2).op(), "d");
  EXPECT_DOUBLE_EQ(r->waits(2).unexplained_wait_us(), 3.0);
  EXPECT_EQ(r->waits(3).op(), "a");
  EXPECT_DOUBLE_EQ(r->waits(3).unexplained_wait_us(), 0.0);
  EXPECT_DOUBLE_EQ(r->waited_us(), 18.0);
  EXPECT_DOUBLE_EQ(r->early_us(), 5.0);
}

TEST(Replay, KeepsThePredictedCostOfOpsNotMeasuredAndCountsTheRest) {
  p::OpGraph g;
  const p::OpId a = g.Add(MakeOp("a", p::kCompute, 100), {});
  g.Add(MakeOp("b", p::kCompute, 7), {a});
  const std::vector<MeasuredOpTime> m = {Timed("a", 0, 10), Timed("zz", 0, 1)};
  absl::StatusOr<v1::Replay> r = ReplayOnGraph(g, m, 17.0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->replayed_us(), 17.0);
  EXPECT_EQ(r->unmeasured_ops(), 1);
  EXPECT_EQ(r->unplanned_ops(), 1);
}

TEST(Replay, RefusesWhatIsNotAMeasurement) {
  p::OpGraph g;
  g.Add(MakeOp("a", p::kCompute, 1), {});
  const auto msg = [&](std::vector<MeasuredOpTime> m, double total) {
    return std::string(ReplayOnGraph(g, m, total).status().message());
  };
  EXPECT_EQ(msg({Timed("a", 0, 1)}, 0.0), "measured total: must be finite and > 0 (got 0)");
  EXPECT_EQ(msg({Timed("a", 0, 1)}, std::nan("")),
            "measured total: must be finite and > 0 (got nan)");
  EXPECT_EQ(msg({Timed("a", 5, 1)}, 1.0),
            "measured op 'a': duration must be finite and >= 0 (got -4)");
  EXPECT_EQ(msg({{"a", 1, -2, true}}, 1.0),
            "measured op 'a': start must be finite and >= 0 (got -2)");
  EXPECT_EQ(msg({Timed("a", 0, 1), Timed("a", 1, 2)}, 1.0), "measured op 'a': named twice");
}

class ReplayPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    profile_ = *calibration::LoadProfile("a100-8x8");
    cost_ = std::make_unique<p::CostModel>(*p::CostModel::Create(profile_.profile));
  }
  calibration::LoadedProfile profile_;
  std::unique_ptr<p::CostModel> cost_;
};

// A plan's own predicted timeline, replayed, is the prediction: the replay
// composes exactly as the prediction does (every schedule of a layer).
TEST_F(ReplayPlanTest, APredictionReplaysToItself) {
  v1::PlanLayerRequest req;
  ASSERT_TRUE(proto::ParseJson(R"({"batch_size": 8, "seq_len": 512, "model_dim": 1024,
      "hidden_dim": 4096, "num_experts": 32, "top_k": 2, "capacity_factor": 1.0,
      "parallel": {"mp": 4, "ep": 16, "esp": 4}})",
                               req.mutable_layer())
                  .ok());
  req.set_include_timeline(true);
  p::LayerPlanner planner(*cost_);
  v1::PlanLayerResponse resp;
  ASSERT_TRUE(AnswerPlanLayer(req, planner, profile_.profile, &resp).ok());
  const p::LayerConfig layer = *proto::LayerFromProto(req.layer());
  ASSERT_EQ(resp.candidates_size(), 3);
  for (const v1::CandidatePlan& c : resp.candidates()) {
    absl::StatusOr<v1::Replay> r = ReplayLayerRun(layer, *proto::ScheduleFromProto(c.schedule()),
                                                  MeasuredTimes(c.ops()), c.total_us(), *cost_);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_NEAR(r->replayed_us(), c.total_us(), 1e-9 * c.total_us());
    EXPECT_EQ(r->unmeasured_ops(), 0);
    EXPECT_EQ(r->unplanned_ops(), 0);
    EXPECT_EQ(r->ops(), c.ops_size());
    // Every op started when the plan let it: no unexplained wait.
    for (const v1::OpWait& w : r->waits())
      EXPECT_NEAR(w.unexplained_wait_us(), 0.0, 1e-6) << w.op();
  }
}

// The same for a whole model's variants, whose ops overlap (Lancet, Tutel):
// and a reported run of one of them gets its replay from ReplayReport.
TEST_F(ReplayPlanTest, AModelsVariantsReplayToThemselvesAndReportsReplay) {
  v1::PlanModelRequest req;
  ASSERT_TRUE(proto::ReadJsonFile(MOEPLAN_SOURCE_DIR "/tests/executor/models/tiny-model-4.json",
                                  req.mutable_model())
                  .ok());
  req.set_include_timeline(true);
  p::ModelPlanner planner(*cost_);
  v1::PlanModelResponse resp;
  ASSERT_TRUE(AnswerPlanModel(req, planner, profile_.profile, &resp).ok());
  ASSERT_EQ(resp.variants_size(), 5);
  for (const v1::VariantPlan& v : resp.variants()) {
    absl::StatusOr<v1::PlanModelRequest> pinned = PinnedModelRequest(req.model(), v);
    ASSERT_TRUE(pinned.ok()) << pinned.status();

    // Reported with every op 10 % slower than predicted: the composition
    // holds, the replay is 10 % slower, and the prediction 1/1.1 of it.
    v1::ReportMeasurementRequest report;
    *report.mutable_model_plan() = *pinned;
    report.set_variant(v.name());
    report.set_total_us(1.1 * v.iteration_us());
    for (const v1::OpTiming& op : v.ops()) {
      v1::MeasuredOp* m = report.add_ops();
      m->set_name(op.name());
      m->set_duration_us(1.1 * (op.end_us() - op.start_us()));
      m->set_start_us(1.1 * op.start_us());
      m->set_has_start(true);
    }
    v1::ReportMeasurementResponse out;
    ASSERT_TRUE(ReplayReport(report, *cost_, &out).ok()) << v.name();
    EXPECT_NEAR(out.replay().replayed_us(), 1.1 * v.iteration_us(), 1e-9 * v.iteration_us())
        << v.name();
    EXPECT_EQ(out.replay().unmeasured_ops(), 0) << v.name();
    EXPECT_NEAR(out.replay().composition_error_pct(), 0.0, 1e-6) << v.name();
    EXPECT_NEAR(out.predicted_us(), v.iteration_us(), 1e-9 * v.iteration_us());
    EXPECT_NEAR(out.cost_error_pct(), 100.0 * (1.0 / 1.1 - 1.0), 1e-6) << v.name();
    for (const v1::OpWait& w : out.replay().waits()) {
      EXPECT_NEAR(w.unexplained_wait_us(), 0.0, 1e-6) << v.name() << " " << w.op();
    }
  }
  // A run whose every op took no time replays to 0: no cost error is made up.
  v1::ReportMeasurementRequest empty;
  *empty.mutable_model_plan() = *PinnedModelRequest(req.model(), resp.variants(0));
  empty.set_variant(resp.variants(0).name());
  empty.set_total_us(1.0);
  for (const v1::OpTiming& op : resp.variants(0).ops()) empty.add_ops()->set_name(op.name());
  v1::ReportMeasurementResponse zero;
  ASSERT_TRUE(ReplayReport(empty, *cost_, &zero).ok());
  EXPECT_EQ(zero.replay().replayed_us(), 0.0);
  EXPECT_EQ(zero.cost_error_pct(), 0.0);
  EXPECT_DOUBLE_EQ(zero.replay().composition_error_pct(), -100.0);

  v1::ReportMeasurementRequest bad;
  *bad.mutable_model_plan() = req;
  bad.set_variant("fastest");
  bad.set_total_us(1.0);
  v1::ReportMeasurementResponse out;
  EXPECT_EQ(std::string(ReplayReport(bad, *cost_, &out).message()),
            "variant: 'fastest' is not a variant");
}

}  // namespace
}  // namespace moeplan::requests
