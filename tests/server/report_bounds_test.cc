// ReportMeasurement against the physical bounds of a measurement
// (calibration/report_bounds.h, docs/service.md): a report of ops faster than
// any launch, or longer than the run they are part of, is refused naming the
// op and the total, and nothing is appended to the profile's log.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>

#include "moeplan/proto/json.h"
#include "moeplan/server/handlers.h"

namespace moeplan::server {
namespace {

class ReportBoundsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moeplan_report_bounds_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ProfileStore::OpenReport report;
    auto s = ProfileStore::Open(dir_, &report);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
    HandlerOptions o;
    o.log_requests = false;
    handlers_ = std::make_unique<Handlers>(store_.get(), &cache_, o);
  }
  void TearDown() override {
    handlers_.reset();
    std::filesystem::remove_all(dir_);
  }

  // A run of the GPT-2 layer on a100-8x8 as the server plans it, every op
  // and the total twice the prediction; `compute` (when given) gets the names
  // of the ops the planner puts on the compute stream.
  v1::ReportMeasurementRequest Run(std::set<std::string>* compute = nullptr) {
    v1::PlanLayerRequest plan;
    plan.set_profile_name("a100-8x8");
    EXPECT_TRUE(proto::ReadJsonFile(MOEPLAN_SOURCE_DIR "/examples/gpt2-moe-layer.json",
                                    plan.mutable_layer())
                    .ok());
    plan.add_schedules(v1::SCHEDULE_S1);
    plan.set_include_timeline(true);
    v1::PlanLayerResponse planned;
    EXPECT_TRUE(handlers_->PlanLayer(call_, plan, &planned).ok());
    v1::ReportMeasurementRequest r;
    r.set_profile_name("a100-8x8");
    r.set_profile_version(1);
    plan.clear_include_timeline();
    *r.mutable_plan() = plan;
    r.set_schedule(v1::SCHEDULE_S1);
    for (const v1::OpTiming& op : planned.candidates(0).ops()) {
      v1::MeasuredOp* m = r.add_ops();
      m->set_name(op.name());
      m->set_duration_us(2.0 * (op.end_us() - op.start_us()));
      if (compute != nullptr && op.resource() == "compute") compute->insert(op.name());
    }
    r.set_total_us(2.0 * planned.candidates(0).total_us());
    return r;
  }
  absl::Status Report(const v1::ReportMeasurementRequest& r) {
    v1::ReportMeasurementResponse resp;
    return handlers_->ReportMeasurement(call_, r, &resp);
  }
  bool LogExists() const { return std::filesystem::exists(dir_ + "/measurements/a100-8x8.jsonl"); }

  std::string dir_;
  std::unique_ptr<ProfileStore> store_;
  PlanCache cache_{100};
  NoDeadline call_;
  std::unique_ptr<Handlers> handlers_;
};

TEST_F(ReportBoundsTest, OpsFasterThanALaunchAreRefused) {
  v1::ReportMeasurementRequest r = Run();
  r.mutable_ops(2)->set_duration_us(1e-6);
  const absl::Status s = Report(r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("ops[2].duration_us: must be at least 0.3 us"), std::string::npos)
      << s;
  EXPECT_FALSE(LogExists());
}

TEST_F(ReportBoundsTest, OpsLongerThanTheRunAreRefused) {
  v1::ReportMeasurementRequest r = Run();
  for (v1::MeasuredOp& op : *r.mutable_ops()) op.set_duration_us(1e5);
  r.set_total_us(1.0);
  absl::Status s = Report(r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("ops[0].duration_us: an op cannot take longer than the run"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("total_us 1)"), std::string::npos) << s;
  // Each op within the total, but the compute stream's ops add up to more.
  std::set<std::string> compute;
  r = Run(&compute);
  double sum = 0.0;
  for (const v1::MeasuredOp& op : r.ops()) sum += compute.count(op.name()) ? op.duration_us() : 0;
  r.set_total_us(0.6 * sum);
  for (v1::MeasuredOp& op : *r.mutable_ops()) {
    op.set_duration_us(std::min(op.duration_us(), r.total_us()));
  }
  s = Report(r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("ops: the "), std::string::npos) << s;
  EXPECT_NE(s.message().find("ops on the compute stream run one after another"), std::string::npos)
      << s;
  EXPECT_FALSE(LogExists());
  // The run as measured is stored.
  EXPECT_TRUE(Report(Run()).ok());
  EXPECT_TRUE(LogExists());
}

}  // namespace
}  // namespace moeplan::server
