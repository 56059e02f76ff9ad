// Refits from reported runs (calibration/refit.h): runs whose every op took
// exactly twice what the profile predicts must come back as corrections of
// scale 2, a profile one version on whose predictions of those runs are exact.
#include "moeplan/calibration/refit.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "moeplan/calibration/profiles.h"
#include "moeplan/calibration/report_bounds.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/planner/planner.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"
#include "moeplan/requests/answer.h"
#include "moeplan/requests/replan.h"

namespace moeplan::calibration {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace p = ::moeplan::planner;

constexpr double kSlowdown = 2.0;

v1::ClusterProfile Lab() {
  v1::ClusterProfile prof = *BuiltinProfile("a100-8x8");
  prof.set_name("lab");
  prof.set_version(3);
  return prof;
}

v1::LayerConfig Layer(int batch) {
  v1::LayerConfig l;
  l.set_schema_version(1);
  l.set_name("layer");
  l.set_batch_size(batch);
  l.set_seq_len(1024);
  l.set_model_dim(1024);
  l.set_hidden_dim(4096);
  l.set_num_experts(16);
  l.set_top_k(2);
  l.set_capacity_factor(1.25);
  l.mutable_parallel()->set_mp(2);
  l.mutable_parallel()->set_ep(8);
  l.mutable_parallel()->set_esp(2);
  l.mutable_parallel()->set_dp(8);
  return l;
}

template <typename Plan>
void SlowOps(const Plan& predicted, double total, v1::ReportMeasurementRequest* r) {
  for (const v1::OpTiming& op : predicted.ops()) {
    v1::MeasuredOp* m = r->add_ops();
    m->set_name(op.name());
    m->set_duration_us(kSlowdown * (op.end_us() - op.start_us()));
  }
  r->set_total_us(kSlowdown * total);
}

// A run of `layer`'s `schedule` that took twice the prediction, op for op.
v1::ReportMeasurementRequest LayerRun(const v1::ClusterProfile& prof, const v1::LayerConfig& layer,
                                      v1::Schedule schedule) {
  const p::ClusterProfile cp = *proto::ProfileFromProto(prof);
  const p::CostModel cost = *p::CostModel::Create(cp);
  p::LayerPlanner planner(cost);
  v1::PlanLayerRequest req;
  *req.mutable_layer() = layer;
  req.add_schedules(schedule);
  req.set_include_timeline(true);
  v1::PlanLayerResponse resp;
  EXPECT_TRUE(requests::AnswerPlanLayer(req, planner, cp, &resp).ok());
  v1::ReportMeasurementRequest r;
  r.set_profile_name(prof.name());
  r.set_profile_version(prof.version());
  *r.mutable_plan() = req;
  r.mutable_plan()->clear_include_timeline();
  r.set_schedule(schedule);
  SlowOps(resp.candidates(0), resp.candidates(0).total_us(), &r);
  return r;
}

v1::ReportMeasurementRequest ModelRun(const v1::ClusterProfile& prof, int micro_batch) {
  v1::ModelConfig m;
  EXPECT_TRUE(
      proto::ReadJsonFile(MOEPLAN_SOURCE_DIR "/tests/executor/models/tiny-model-4.json", &m).ok());
  m.set_micro_batch_size(micro_batch);
  const p::ClusterProfile cp = *proto::ProfileFromProto(prof);
  const p::CostModel cost = *p::CostModel::Create(cp);
  p::ModelPlanner planner(cost);
  v1::PlanModelRequest req;
  *req.mutable_model() = m;
  req.mutable_options()->add_variants(v1::OVERLAP_VARIANT_DW);
  req.set_include_timeline(true);
  v1::PlanModelResponse resp;
  EXPECT_TRUE(requests::AnswerPlanModel(req, planner, cp, &resp).ok());
  v1::ReportMeasurementRequest r;
  r.set_profile_name(prof.name());
  r.set_profile_version(prof.version());
  *r.mutable_model_plan() = *requests::PinnedModelRequest(m, resp.variants(0));
  r.set_variant("dw");
  SlowOps(resp.variants(0), resp.variants(0).iteration_us(), &r);
  return r;
}

TEST(RefitTest, RunsTwiceAsSlowAsPredictedRefitToScaleTwo) {
  const v1::ClusterProfile lab = Lab();
  std::vector<v1::ReportMeasurementRequest> reports;
  for (int b : {2, 4, 8}) {
    reports.push_back(LayerRun(lab, Layer(b), v1::SCHEDULE_DEFAULT));
    reports.push_back(ModelRun(lab, b));
  }
  absl::StatusOr<RefitResult> r = RefitFromReports(lab, reports, {}, "the test");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->used, 6);
  EXPECT_TRUE(r->skipped.empty());
  EXPECT_EQ(r->profile.version(), 4u);
  EXPECT_EQ(r->profile.name(), "lab");
  EXPECT_THAT(r->profile.context().ops_fitted_on(),
              HasSubstr("the test: 6 reported runs (3 layer schedules, 3 model variants)"));
  ASSERT_FALSE(r->ops.empty());
  bool dense = false, moe = false;
  for (const v1::OpContext& c : r->ops) {
    EXPECT_NEAR(c.scale(), kSlowdown, 1e-6) << c.op();
    EXPECT_NEAR(c.offset_us(), 0.0, 1e-6) << c.op();
    dense = dense || c.op() == "fwd.qkv";               // models only
    moe = moe || c.op() == "fwd.ep_alltoall_dispatch";  // layers and models
  }
  EXPECT_TRUE(dense && moe);
  // Everything else about the profile is as it was.
  v1::ClusterProfile rest = r->profile;
  rest.clear_context();
  v1::ClusterProfile lab_rest = lab;
  lab_rest.clear_context();
  lab_rest.set_version(4);
  EXPECT_EQ(rest.SerializeAsString(), lab_rest.SerializeAsString());

  // The new version predicts the runs it was fitted on exactly; the old one
  // at half their time.
  EXPECT_THAT(r->report, HasSubstr("# Refit of lab: version 3 -> 4"));
  EXPECT_THAT(r->report, HasSubstr("| layers | v3 | 3 | 50.0 | 50.0 | 50.0 | -50.0 |"));
  EXPECT_THAT(r->report, HasSubstr("| layers | v4 | 3 | 0.0 | 0.0 | 0.0 | +0.0 |"));
  EXPECT_THAT(r->report, HasSubstr("| models | v4 | 3 | 0.0 |"));
  const p::ClusterProfile refit = *proto::ProfileFromProto(r->profile);
  const p::CostModel cost = *p::CostModel::Create(refit);
  absl::StatusOr<ValidationInput> again = ReportedRun(reports[0], refit, cost, "again");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NEAR(again->predicted[0].total_us(), again->measured[0].total_us(),
              1e-6 * again->measured[0].total_us());

  // Refitting the refitted profile fits against its own model without its
  // corrections: the same corrections, one version on.
  absl::StatusOr<RefitResult> twice = RefitFromReports(r->profile, reports, {}, "the test");
  ASSERT_TRUE(twice.ok()) << twice.status();
  EXPECT_EQ(twice->profile.version(), 5u);
  ASSERT_EQ(twice->ops.size(), r->ops.size());
  EXPECT_NEAR(twice->ops[0].scale(), kSlowdown, 1e-6);
}

TEST(RefitTest, ReportsThatDoNotPlanAreListedAndTooFewAreRefused) {
  const v1::ClusterProfile lab = Lab();
  std::vector<v1::ReportMeasurementRequest> reports = {
      LayerRun(lab, Layer(2), v1::SCHEDULE_DEFAULT), LayerRun(lab, Layer(4), v1::SCHEDULE_DEFAULT),
      LayerRun(lab, Layer(8), v1::SCHEDULE_DEFAULT)};
  v1::ReportMeasurementRequest bad = reports[0];
  bad.mutable_plan()->mutable_layer()->set_top_k(99);
  reports.push_back(bad);
  absl::StatusOr<RefitResult> r = RefitFromReports(lab, reports, {}, "t");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->used, 3);
  ASSERT_EQ(r->skipped.size(), 1u);
  EXPECT_THAT(r->skipped[0], HasSubstr("report 3: plan."));
  EXPECT_THAT(r->skipped[0], HasSubstr("top_k"));

  // Two runs: no op has the 3 instances a correction needs.
  reports.resize(2);
  r = RefitFromReports(lab, reports, {}, "t");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("no op could be corrected from the 2 reported runs"));
  EXPECT_THAT(r.status().message(),
              HasSubstr("was reported 2 times; 0 were dropped, leaving 2: fewer than the 3 a fit "
                        "needs"));
  r = RefitFromReports(lab, {bad}, {}, "t");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("none of the 1 reported runs plans on it"));
}

// Every op of `r` and its total times `ops` and `total`.
v1::ReportMeasurementRequest Scaled(v1::ReportMeasurementRequest r, double ops, double total) {
  for (v1::MeasuredOp& op : *r.mutable_ops()) op.set_duration_us(ops * op.duration_us());
  r.set_total_us(total * r.total_us());
  return r;
}

std::vector<v1::ReportMeasurementRequest> FourRuns(const v1::ClusterProfile& prof) {
  std::vector<v1::ReportMeasurementRequest> out;
  for (int b : {2, 4, 8, 16}) out.push_back(LayerRun(prof, Layer(b), v1::SCHEDULE_DEFAULT));
  return out;
}

// Four runs whose every op took 1e-6 µs were once refitted into a profile
// that planned a 1,264 µs layer in 0.001 µs: no op completes faster than a
// launch or latency term, so such runs are skipped, and nothing is fitted.
TEST(RefitTest, OpsFasterThanPhysicsAreSkippedNotFitted) {
  const v1::ClusterProfile lab = Lab();
  std::vector<v1::ReportMeasurementRequest> reports = FourRuns(lab);
  for (v1::ReportMeasurementRequest& r : reports) {
    for (v1::MeasuredOp& op : *r.mutable_ops()) op.set_duration_us(1e-6);
  }
  absl::StatusOr<RefitResult> r = RefitFromReports(lab, reports, {}, "t");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("none of the 4 reported runs plans on it"));
  EXPECT_THAT(r.status().message(),
              HasSubstr("report 0: ops[0].duration_us: must be at least 0.3 us"));
  EXPECT_THAT(r.status().message(), HasSubstr("(got 1e-06 for 'fwd."));
  // a100-8x8's shortest α is the 3 µs intra link; a profile without any
  // α still has the timer's floor.
  EXPECT_DOUBLE_EQ(MinOpUs(lab), 0.3);
  EXPECT_DOUBLE_EQ(MinOpUs(v1::ClusterProfile()), kMinOpUs);
}

// A correction is bounded from below as well as above: runs 250 times faster
// or 200 times slower than the profile's own model correct nothing (the
// runs are LayerRun's, twice the model, scaled by 1/500 or 100).
TEST(RefitTest, CorrectionsAreBoundedFromBelowAndAbove) {
  const v1::ClusterProfile lab = Lab();
  const p::ClusterProfile cp = *proto::ProfileFromProto(lab);
  const p::CostModel cost = *p::CostModel::Create(cp);
  for (double factor : {1.0 / 500.0, 100.0}) {
    SCOPED_TRACE(factor);
    std::vector<ValidationInput> inputs;
    for (const v1::ReportMeasurementRequest& r : FourRuns(lab)) {
      absl::StatusOr<ValidationInput> in = ReportedRun(Scaled(r, factor, factor), cp, cost, "run");
      ASSERT_TRUE(in.ok()) << in.status();
      inputs.push_back(*std::move(in));
    }
    absl::StatusOr<std::vector<v1::OpContext>> ops = FitOpContexts(inputs, OpContextOptions{});
    ASSERT_TRUE(ops.ok()) << ops.status();
    for (const v1::OpContext& c : *ops) ADD_FAILURE() << c.op() << " scale " << c.scale();
  }
}

// Runs 200 times slower than predicted, each op reported 4 times: the refit
// says what it had and why it fitted nothing, not "no op was reported 3 or
// more times".
TEST(RefitTest, NothingFittedSaysWhatWasReportedAndWhy) {
  const v1::ClusterProfile lab = Lab();
  std::vector<v1::ReportMeasurementRequest> reports = FourRuns(lab);
  for (v1::ReportMeasurementRequest& r : reports) r = Scaled(r, 100.0, 100.0);
  absl::StatusOr<RefitResult> r = RefitFromReports(lab, reports, {}, "t");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("no op could be corrected from the 4 reported runs"));
  EXPECT_THAT(r.status().message(), HasSubstr("was reported 4 times; 0 were dropped, leaving 4: "
                                              "its fit (scale 200, offset 0 us) is out of bounds"));
  EXPECT_THAT(r.status().message(), Not(HasSubstr("3 or more times")));

  // Two of the four runs measured ops faster than physics: dropped with
  // their reports, leaving two instances of every op.
  reports = FourRuns(lab);
  for (int i : {1, 3}) reports[i].mutable_ops(0)->set_duration_us(1e-6);
  r = RefitFromReports(lab, reports, {}, "t");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(r.status().message(),
              HasSubstr("was reported 4 times; 2 were dropped, leaving 2: fewer than the 3 a fit "
                        "needs"));
  EXPECT_THAT(r.status().message(), HasSubstr("dropped with 2 skipped reports, first: report 1: "
                                              "ops[0].duration_us: must be at least"));
}

// A report whose ops (100 ms each) exceed its total (1 µs) was stored and
// fitted as is: no op outlasts the run it is part of, and the ops of the
// compute stream, which run one after another, cannot add up to more.
TEST(RefitTest, OpsLongerThanTheirRunAreRefused) {
  const v1::ClusterProfile lab = Lab();
  std::vector<v1::ReportMeasurementRequest> reports = FourRuns(lab);
  for (v1::ReportMeasurementRequest& r : reports) {
    for (v1::MeasuredOp& op : *r.mutable_ops()) op.set_duration_us(1e5);
    r.set_total_us(1.0);
  }
  absl::StatusOr<RefitResult> r = RefitFromReports(lab, reports, {}, "t");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(r.status().message(),
              HasSubstr("ops[0].duration_us: an op cannot take longer than the run it is part of, "
                        "total_us (+10 %) (got 100000 us for 'fwd."));
  EXPECT_THAT(r.status().message(), HasSubstr("total_us 1)"));

  v1::ReportMeasurementRequest two;
  two.set_total_us(100.0);
  for (const char* name : {"fwd.a", "fwd.b.2", "fwd.c"}) {
    v1::MeasuredOp* op = two.add_ops();
    op->set_name(name);
    op->set_duration_us(60.0);
  }
  // Two compute ops (one by its base name), one on a link: 120 µs of compute.
  const std::map<std::string, std::string> res = {
      {"fwd.a", "compute"}, {"fwd.b", "compute"}, {"fwd.c", "intra"}};
  absl::Status s = CheckReportedTimes(two, 1.0, res);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("ops: the 2 ops on the compute stream run one after another"));
  EXPECT_THAT(s.message(), HasSubstr("(got 120 us of ops, total_us 100)"));
  // Pipeline stages run on different ranks at once: 60 µs on each of two
  // stages in a run of 100 is fine, 120 on one of them is not.
  v1::ReportMeasurementRequest staged = two;
  staged.mutable_ops(0)->set_name("s0.mb0.fwd.a");
  staged.mutable_ops(1)->set_name("s1.mb0.fwd.a");
  EXPECT_TRUE(CheckReportedTimes(staged, 1.0, res).ok());
  staged.mutable_ops(1)->set_name("s0.mb1.fwd.a");
  s = CheckReportedTimes(staged, 1.0, res);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("the 2 ops on the compute stream of pipeline stage s0 run"));
  // Ops on links may overlap each other: 120 µs of them in 100 is fine.
  EXPECT_TRUE(CheckReportedTimes(two, 1.0, {{"fwd.a", "compute"}}).ok());
  EXPECT_TRUE(CheckReportedTimes(FourRuns(lab)[0], MinOpUs(lab), {}).ok());
}

}  // namespace
}  // namespace moeplan::calibration
