// moeplan-server in-process on an ephemeral loopback port, exercised through the
// C++ client library and raw stubs: every RPC round trip, the cache, health,
// reflection, and a table of invalid requests.
#include "moeplan/server/server.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <thread>

#include "grpc_std/health.grpc.pb.h"
#include "grpc_std/reflection.pb.h"
#include "moeplan/base/strings.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/client/planner_client.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"
#include "moeplan/requests/answer.h"
#include "tls_fixture.h"

namespace moeplan::server {
namespace {

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

v1::LayerConfig Gpt2Layer() {
  v1::LayerConfig l;
  EXPECT_TRUE(proto::ReadJsonFile(MOEPLAN_SOURCE_DIR "/examples/gpt2-moe-layer.json", &l).ok());
  return l;
}

v1::PlanLayerRequest PlanRequest() {
  v1::PlanLayerRequest r;
  r.set_profile_name("a100-8x8");
  *r.mutable_layer() = Gpt2Layer();
  return r;
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moeplan_server_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    StartServer();
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
    std::filesystem::remove_all(dir_);
  }
  void StartServer(int refit_every = 0, int refit_window = 1000) {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.data_dir = dir_;
    options.handlers.log_requests = false;
    options.handlers.refit_every = refit_every;
    options.handlers.refit_window = refit_window;
    ProfileStore::OpenReport report;
    absl::StatusOr<std::unique_ptr<PlannerServer>> s = PlannerServer::Start(options, &report);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    ASSERT_GT(server_->port(), 0);
    client_ = std::make_unique<client::PlannerClient>(server_->address());
  }

  std::string dir_;
  std::unique_ptr<PlannerServer> server_;
  std::unique_ptr<client::PlannerClient> client_;
};

TEST_F(ServerTest, PlanLayerEqualsLocalPlanning) {
  v1::PlanLayerRequest req = PlanRequest();
  req.set_include_timeline(true);
  absl::StatusOr<v1::PlanLayerResponse> remote = client_->PlanLayer(req);
  ASSERT_TRUE(remote.ok()) << remote.status();

  calibration::LoadedProfile profile = *calibration::LoadProfile("a100-8x8");
  planner::CostModel cost = *planner::CostModel::Create(profile.profile);
  planner::LayerPlanner planner(cost);
  v1::PlanLayerResponse local;
  ASSERT_TRUE(requests::AnswerPlanLayer(req, planner, profile.profile, &local).ok());
  EXPECT_EQ(remote->SerializeAsString(), local.SerializeAsString());
  EXPECT_EQ(remote->candidates_size(), 3);
  EXPECT_GT(remote->candidates(0).ops_size(), 0);
}

TEST_F(ServerTest, PlanModelValidatesAndCaches) {
  v1::PlanModelRequest req;
  req.set_profile_name("a100-8x8");
  ASSERT_TRUE(proto::ReadJsonFile(MOEPLAN_SOURCE_DIR "/examples/models/gpt2-s-moe.a100.json",
                                  req.mutable_model())
                  .ok());
  req.mutable_options()->add_variants(v1::OVERLAP_VARIANT_NONE);
  req.mutable_options()->add_variants(v1::OVERLAP_VARIANT_LANCET);
  absl::StatusOr<v1::PlanModelResponse> first = client_->PlanModel(req);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->variants_size(), 2);
  EXPECT_EQ(first->variants(1).name(), "lancet");
  EXPECT_LE(first->variants(1).iteration_us(), first->variants(0).iteration_us());
  const uint64_t hits = server_->cache().hits();
  req.mutable_model()->set_name("another label");  // not an input: same plan
  absl::StatusOr<v1::PlanModelResponse> second = client_->PlanModel(req);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(server_->cache().hits(), hits + 1);
  EXPECT_EQ(second->SerializeAsString(), first->SerializeAsString());

  v1::PlanModelRequest bad = req;
  bad.mutable_model()->mutable_moe()->set_num_experts(100);
  absl::StatusOr<v1::PlanModelResponse> r = client_->PlanModel(bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(r.status()).rfind("model.parallel.ep: must divide num_experts", 0), 0u)
      << r.status();
  bad = req;
  bad.mutable_options()->set_partition_max_k(0);
  r = client_->PlanModel(bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(r.status()).rfind("options.partition_max_k: must be between 1 and 64", 0), 0u)
      << r.status();
  bad = req;
  bad.clear_model();
  EXPECT_EQ(Msg(client_->PlanModel(bad).status()), "model: required");
  // Found by fuzz_server_requests: a layout request read the model's shape
  // (MoE layers = num_layers / layer_freq) before validating it.
  for (bool search : {false, true}) {
    bad = req;
    bad.mutable_model()->mutable_moe()->set_layer_freq(0);
    if (search) {
      bad.mutable_search();
    } else {
      bad.mutable_layout()->set_dp(8);
      bad.mutable_layout()->set_tp(1);
      bad.mutable_layout()->set_pp(1);
    }
    r = client_->PlanModel(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(Msg(r.status()).rfind("model.moe.layer_freq: must be between 1 and 1024", 0), 0u)
        << r.status();
  }
}

TEST_F(ServerTest, EquivalentRequestsShareACacheEntry) {
  v1::PlanLayerRequest a = PlanRequest();
  ASSERT_TRUE(client_->PlanLayer(a).ok());
  EXPECT_EQ(server_->cache().misses(), 1u);
  EXPECT_EQ(server_->cache().hits(), 0u);
  // Same layer with the defaults written out, another name, schedules explicit.
  v1::PlanLayerRequest b = a;
  b.mutable_layer()->set_name("renamed");
  b.mutable_layer()->mutable_parallel()->set_dp(16);
  b.mutable_layer()->mutable_parallel()->set_pp(1);
  b.mutable_layer()->set_token_skew(1.0);
  b.add_schedules(v1::SCHEDULE_DEFAULT);
  b.add_schedules(v1::SCHEDULE_S1);
  b.add_schedules(v1::SCHEDULE_S2);
  absl::StatusOr<v1::PlanLayerResponse> rb = client_->PlanLayer(b);
  ASSERT_TRUE(rb.ok());
  EXPECT_EQ(server_->cache().hits(), 1u);
  EXPECT_EQ(server_->cache().raw_hits(), 0u) << "b's bytes differ from a's";
  // a again: found by its canonical key, and from then on by its bytes, the
  // same response each time.
  absl::StatusOr<v1::PlanLayerResponse> ra = client_->PlanLayer(a);
  ASSERT_TRUE(ra.ok());
  EXPECT_EQ(server_->cache().raw_hits(), 0u);
  absl::StatusOr<v1::PlanLayerResponse> ra2 = client_->PlanLayer(a);
  ASSERT_TRUE(ra2.ok());
  EXPECT_EQ(server_->cache().raw_hits(), 1u);
  EXPECT_EQ(server_->cache().hits(), 3u);
  EXPECT_EQ(ra->SerializeAsString(), rb->SerializeAsString());
  EXPECT_EQ(ra2->SerializeAsString(), rb->SerializeAsString());
  // A different layer misses; asking for the timeline is a different answer too.
  v1::PlanLayerRequest c = a;
  c.mutable_layer()->set_batch_size(16);
  ASSERT_TRUE(client_->PlanLayer(c).ok());
  v1::PlanLayerRequest d = a;
  d.set_include_timeline(true);
  ASSERT_TRUE(client_->PlanLayer(d).ok());
  EXPECT_EQ(server_->cache().misses(), 3u);
  // Three plans under their canonical keys; the bytes of a and b, the two asked
  // for again (a request seen once adds no entry for its bytes).
  EXPECT_EQ(server_->cache().size(), 3u + 2u);
}

TEST_F(ServerTest, ProfilesListGetPutAndANewVersionInvalidatesPlans) {
  absl::StatusOr<v1::ListProfilesResponse> list = client_->ListProfiles();
  ASSERT_TRUE(list.ok());
  // The built-ins: nine spec profiles and the two measured testbed ones.
  ASSERT_EQ(list->profiles_size(), 11);
  EXPECT_EQ(list->profiles(0).name(), "a100-8x8");

  absl::StatusOr<v1::ClusterProfile> h200 = client_->GetProfile("h200-8x8");
  ASSERT_TRUE(h200.ok());
  EXPECT_EQ(h200->SerializeAsString(),
            calibration::BuiltinProfile("h200-8x8")->SerializeAsString());

  v1::ClusterProfile mine = *h200;
  mine.set_name("lab-cluster");
  absl::StatusOr<v1::PutProfileResponse> put = client_->PutProfile(mine);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->name(), "lab-cluster");
  EXPECT_EQ(put->version(), 1u);
  EXPECT_TRUE(client_->PutProfile(mine).ok()) << "re-putting the same profile is idempotent";
  EXPECT_EQ(client_->GetProfile("lab-cluster")->SerializeAsString(), mine.SerializeAsString());
  EXPECT_EQ(client_->ListProfiles()->profiles_size(), 12);

  ASSERT_TRUE(client_->PlanLayer(PlanRequest()).ok());  // an a100-8x8 entry
  v1::PlanLayerRequest req = PlanRequest();
  req.set_profile_name("lab-cluster");
  absl::StatusOr<v1::PlanLayerResponse> v1_plan = client_->PlanLayer(req);
  ASSERT_TRUE(v1_plan.ok());
  ASSERT_TRUE(client_->PlanLayer(req).ok());
  EXPECT_EQ(server_->cache().hits(), 1u);
  EXPECT_EQ(server_->cache().size(), 3u);  // two plans; the repeated one by its bytes too

  // Version 2 with slower NICs: the cached plan must not be served.
  mine.set_version(2);
  mine.mutable_links()->mutable_inter()->set_beta_us_per_byte(
      4 * mine.links().inter().beta_us_per_byte());
  ASSERT_TRUE(client_->PutProfile(mine).ok());
  EXPECT_EQ(server_->cache().size(), 1u) << "lab-cluster entries dropped, a100 one kept";
  absl::StatusOr<v1::PlanLayerResponse> v2_plan = client_->PlanLayer(req);
  ASSERT_TRUE(v2_plan.ok());
  EXPECT_EQ(v2_plan->profile_version(), 2u);
  EXPECT_GT(v2_plan->candidates(0).total_us(), v1_plan->candidates(0).total_us());

  // Stale or equal versions with other numbers, and built-in names, are refused.
  mine.set_version(1);
  absl::StatusOr<v1::PutProfileResponse> stale = client_->PutProfile(mine);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      Msg(stale.status()).rfind("profile.version: must be greater than the stored version 2", 0),
      0u)
      << stale.status();
  v1::ClusterProfile builtin = *h200;
  builtin.set_version(9);
  absl::StatusOr<v1::PutProfileResponse> ro = client_->PutProfile(builtin);
  EXPECT_EQ(ro.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(Msg(ro.status()).find("built-in profile and read-only"), std::string::npos);

  // Persisted: a restarted server on the same directory serves version 2.
  client_.reset();
  server_.reset();
  StartServer();
  absl::StatusOr<v1::ClusterProfile> back = client_->GetProfile("lab-cluster");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->version(), 2u);
}

TEST(ServerThreadsTest, ThreadCapServesTheSameAnswersOnTheSynchronousApi) {
  char tmpl[] = "/tmp/moeplan_server_threads.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.data_dir = tmpl;
  options.handlers.log_requests = false;
  options.threads = 2;
  ProfileStore::OpenReport report;
  absl::StatusOr<std::unique_ptr<PlannerServer>> server = PlannerServer::Start(options, &report);
  ASSERT_TRUE(server.ok()) << server.status();
  client::PlannerClient c((*server)->address());
  v1::PlanLayerRequest req = PlanRequest();
  absl::StatusOr<v1::PlanLayerResponse> r = c.PlanLayer(req);
  ASSERT_TRUE(r.ok()) << r.status();
  calibration::LoadedProfile profile = *calibration::LoadProfile("a100-8x8");
  planner::CostModel cost = *planner::CostModel::Create(profile.profile);
  planner::LayerPlanner planner(cost);
  v1::PlanLayerResponse local;
  ASSERT_TRUE(requests::AnswerPlanLayer(req, planner, profile.profile, &local).ok());
  EXPECT_EQ(r->SerializeAsString(), local.SerializeAsString());
  req.mutable_layer()->set_top_k(0);
  EXPECT_EQ(c.PlanLayer(req).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.ListProfiles()->profiles_size(), 11);
  server->reset();
  std::filesystem::remove_all(tmpl);
}

TEST_F(ServerTest, UnknownProfilesAreNotFound) {
  EXPECT_EQ(client_->GetProfile("nope").status().code(), absl::StatusCode::kNotFound);
  v1::PlanLayerRequest req = PlanRequest();
  req.set_profile_name("nope");
  absl::StatusOr<v1::PlanLayerResponse> r = client_->PlanLayer(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(
      Msg(r.status()),
      "profile_name: no profile named 'nope' (known: a100-8x8, a100-8x8-hdr, b200-8x8, "
      "cpu-testbed-1x4, cpu-testbed-2x2, gb200-nvl72, h100-8x8, h200-8x8, h800-8x8, rtx2080ti-8x4, "
      "v100-8x8)");
}

// With many stored profiles NOT_FOUND stays NOT_FOUND: the message lists a
// bounded few, and the requested name is echoed escaped and cut.
TEST_F(ServerTest, NotFoundStaysSmallAtAnyNumberOfProfiles) {
  v1::ClusterProfile p = *calibration::BuiltinProfile("a100-8x8");
  for (int i = 0; i < 40; ++i) {
    p.set_name("many-" + std::to_string(100 + i));
    ASSERT_TRUE(client_->PutProfile(p).ok()) << i;
  }
  const std::string asked = "evil\nmethod=PutProfile code=OK" + std::string(4000, 'x');
  absl::StatusOr<v1::PlanLayerResponse> r = [&] {
    v1::PlanLayerRequest req = PlanRequest();
    req.set_profile_name(asked);
    return client_->PlanLayer(req);
  }();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  const std::string msg = Msg(r.status());
  EXPECT_LT(msg.size(), 600u) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  EXPECT_NE(msg.find("no profile named 'evil\\x0amethod=PutProfile code=OK"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("...(4030 bytes)"), std::string::npos) << msg;
  // 40 stored and 11 built-in, 16 named.
  EXPECT_NE(msg.find(" and 35 more; ListProfiles lists them)"), std::string::npos) << msg;
}

TEST_F(ServerTest, InlineProfilesArePlannedAndCachedByContent) {
  v1::PlanLayerRequest req = PlanRequest();
  *req.mutable_profile() = *calibration::BuiltinProfile("h200-8x8");
  absl::StatusOr<v1::PlanLayerResponse> a = client_->PlanLayer(req);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->profile_name(), "h200-8x8");
  req.mutable_profile()->mutable_links()->mutable_inter()->set_alpha_us(100);
  // Other numbers under a stored profile's name would be labelled as that profile.
  absl::StatusOr<v1::PlanLayerResponse> clash = client_->PlanLayer(req);
  ASSERT_EQ(clash.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(clash.status().message())
                .rfind("profile.name: 'h200-8x8' is the name of a built-in profile", 0),
            0u)
      << clash.status();
  req.mutable_profile()->set_name("h200-8x8-slow-inter");
  absl::StatusOr<v1::PlanLayerResponse> b = client_->PlanLayer(req);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->profile_name(), "h200-8x8-slow-inter");
  EXPECT_EQ(server_->cache().hits(), 0u);
  EXPECT_GT(b->candidates(0).total_us(), a->candidates(0).total_us());
  // The same numbers under another name are another cache entry, not a hit.
  req.mutable_profile()->set_name("h200-8x8-slow-inter-2");
  ASSERT_TRUE(client_->PlanLayer(req).ok());
  EXPECT_EQ(server_->cache().hits(), 0u);
  // Every field keys the entry, the FP8 peak too (plans do not read it yet).
  const double fp8 = req.profile().gemm().fp8_peak_tflops();
  req.mutable_profile()->mutable_gemm()->set_fp8_peak_tflops(fp8 + 1);
  ASSERT_TRUE(client_->PlanLayer(req).ok());
  EXPECT_EQ(server_->cache().hits(), 0u);
  req.mutable_profile()->mutable_gemm()->set_fp8_peak_tflops(fp8);
  ASSERT_TRUE(client_->PlanLayer(req).ok());
  EXPECT_EQ(server_->cache().hits(), 1u);  // the same content as before
}

TEST_F(ServerTest, ReportMeasurementAppendsDurably) {
  v1::ReportMeasurementRequest req;
  req.set_profile_name("a100-8x8");
  req.set_profile_version(1);
  *req.mutable_plan() = PlanRequest();
  req.set_schedule(v1::SCHEDULE_S2);
  v1::MeasuredOp* op = req.add_ops();
  op->set_name("fwd.gate");
  op->set_duration_us(25.5);
  req.set_total_us(9000);
  absl::StatusOr<v1::ReportMeasurementResponse> r1 = client_->ReportMeasurement(req);
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(r1->stored(), 1u);
  EXPECT_EQ(client_->ReportMeasurement(req)->stored(), 2u);
  const std::string log = *proto::ReadFile(dir_ + "/measurements/a100-8x8.jsonl");
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 2);
  v1::ReportMeasurementRequest back;
  ASSERT_TRUE(proto::ParseJson(log.substr(0, log.find('\n')), &back).ok());
  EXPECT_EQ(back.SerializeAsString(), req.SerializeAsString());
  // The count survives a restart.
  client_.reset();
  server_.reset();
  StartServer();
  EXPECT_EQ(client_->ReportMeasurement(req)->stored(), 3u);
}

// A run of the Gpt2 layer at batch `batch` on profile `name`, S1, that took
// twice the server's prediction, op for op; the prediction's total.
v1::ReportMeasurementRequest SlowRun(client::PlannerClient& c, const std::string& name, int batch,
                                     double* predicted_us = nullptr) {
  v1::PlanLayerRequest plan = PlanRequest();
  plan.set_profile_name(name);
  plan.mutable_layer()->set_batch_size(batch);
  plan.clear_schedules();
  plan.add_schedules(v1::SCHEDULE_S1);
  plan.set_include_timeline(true);
  absl::StatusOr<v1::PlanLayerResponse> p = c.PlanLayer(plan);
  EXPECT_TRUE(p.ok()) << p.status();
  v1::ReportMeasurementRequest r;
  r.set_profile_name(name);
  r.set_profile_version(p->profile_version());
  plan.clear_include_timeline();
  *r.mutable_plan() = plan;
  r.set_schedule(v1::SCHEDULE_S1);
  for (const v1::OpTiming& op : p->candidates(0).ops()) {
    v1::MeasuredOp* m = r.add_ops();
    m->set_name(op.name());
    m->set_duration_us(2.0 * (op.end_us() - op.start_us()));
  }
  r.set_total_us(2.0 * p->candidates(0).total_us());
  if (predicted_us != nullptr) *predicted_us = p->candidates(0).total_us();
  return r;
}

// A tiny whole model's report against a100-8x8 (variant none, one op).
v1::ReportMeasurementRequest GoodModelReport() {
  v1::ReportMeasurementRequest r;
  r.set_profile_name("a100-8x8");
  r.set_profile_version(1);
  EXPECT_TRUE(proto::ReadJsonFile(MOEPLAN_SOURCE_DIR "/tests/executor/models/tiny-model-4.json",
                                  r.mutable_model_plan()->mutable_model())
                  .ok());
  r.mutable_model_plan()->mutable_options()->add_variants(v1::OVERLAP_VARIANT_NONE);
  r.set_variant("none");
  v1::MeasuredOp* op = r.add_ops();
  op->set_name("b1.fwd.qkv");
  op->set_duration_us(12);
  r.set_total_us(5000);
  return r;
}

TEST_F(ServerTest, WholeModelRunsAreReportedToo) {
  absl::StatusOr<v1::ReportMeasurementResponse> r = client_->ReportMeasurement(GoodModelReport());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stored(), 1u);
  v1::ReportMeasurementRequest back;
  const std::string log = *proto::ReadFile(dir_ + "/measurements/a100-8x8.jsonl");
  ASSERT_TRUE(proto::ParseJson(log.substr(0, log.find('\n')), &back).ok());
  EXPECT_EQ(back.variant(), "none");
  EXPECT_EQ(back.model_plan().model().name(), "tiny-model-4");
}

// RefitProfile: runs that took twice the prediction make a version 2 whose
// plans take twice as long; the old version's cached plans are not served.
TEST_F(ServerTest, RefitProfileStoresTheNextVersionFromReportedRuns) {
  v1::ClusterProfile lab = *calibration::BuiltinProfile("a100-8x8");
  lab.set_name("lab");
  ASSERT_TRUE(client_->PutProfile(lab).ok());
  auto refit = [&](const std::string& name) {
    v1::RefitProfileRequest req;
    req.set_profile_name(name);
    return client_->RefitProfile(req);
  };
  EXPECT_EQ(refit("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refit("nope").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<v1::RefitProfileResponse> ro = refit("a100-8x8");
  EXPECT_EQ(ro.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(Msg(ro.status()).find("built-in profile 'a100-8x8' is read-only"), std::string::npos);
  absl::StatusOr<v1::RefitProfileResponse> none = refit("lab");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(Msg(none.status()).find("no measurements have been reported against 'lab'"),
            std::string::npos);

  double before_us = 0.0;
  for (int b : {2, 8, 4}) {
    ASSERT_TRUE(client_->ReportMeasurement(SlowRun(*client_, "lab", b, &before_us)).ok());
  }
  const size_t cached = server_->cache().size();
  ASSERT_GT(cached, 0u);
  absl::StatusOr<v1::RefitProfileResponse> r = refit("lab");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->profile().version(), 2u);
  EXPECT_EQ(r->measurements(), 3u);
  EXPECT_EQ(r->used(), 3u);
  EXPECT_GT(r->profile().context().ops_size(), 0);
  EXPECT_NE(r->report().find("# Refit of lab: version 1 -> 2"), std::string::npos);
  EXPECT_NE(r->report().find("| layers | v2 | 3 | 0.0 |"), std::string::npos) << r->report();
  EXPECT_EQ(server_->cache().size(), 0u) << "lab's cached plans dropped";
  EXPECT_EQ(client_->GetProfile("lab")->SerializeAsString(), r->profile().SerializeAsString());

  v1::PlanLayerRequest plan = PlanRequest();
  plan.set_profile_name("lab");
  plan.mutable_layer()->set_batch_size(4);
  plan.clear_schedules();
  plan.add_schedules(v1::SCHEDULE_S1);
  absl::StatusOr<v1::PlanLayerResponse> after = client_->PlanLayer(plan);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->profile_version(), 2u);
  EXPECT_NEAR(after->candidates(0).total_us(), 2.0 * before_us, 1e-6 * before_us);

  // Stored: a restarted server serves version 2, and refits again from the
  // same log (the corrections are fitted on the profile without its own).
  client_.reset();
  server_.reset();
  StartServer();
  absl::StatusOr<v1::RefitProfileResponse> again = refit("lab");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->profile().version(), 3u);
}

// --refit-window: a refit fits on the newest reports only and says so; the
// older ones stay in the log.
TEST_F(ServerTest, RefitFitsOnTheNewestReportsOfItsWindow) {
  client_.reset();
  server_.reset();
  StartServer(/*refit_every=*/0, /*refit_window=*/3);
  v1::ClusterProfile lab = *calibration::BuiltinProfile("a100-8x8");
  lab.set_name("lab");
  ASSERT_TRUE(client_->PutProfile(lab).ok());
  // Five reports, all usable: without the window all five would be used.
  for (int b : {2, 8, 4, 2, 8}) {
    ASSERT_TRUE(client_->ReportMeasurement(SlowRun(*client_, "lab", b)).ok());
  }
  v1::RefitProfileRequest req;
  req.set_profile_name("lab");
  absl::StatusOr<v1::RefitProfileResponse> r = client_->RefitProfile(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->measurements(), 5u);
  EXPECT_EQ(r->used(), 3u);
  EXPECT_NE(r->profile().context().ops_fitted_on().find(
                "the newest 3 of 5 measurements (--refit-window)"),
            std::string::npos)
      << r->profile().context().ops_fitted_on();
  const std::string log = *proto::ReadFile(dir_ + "/measurements/lab.jsonl");
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 5) << "every report stays stored";
}

TEST_F(ServerTest, RefitEveryNReportsRunsInTheBackground) {
  client_.reset();
  server_.reset();
  StartServer(/*refit_every=*/3);
  v1::ClusterProfile lab = *calibration::BuiltinProfile("a100-8x8");
  lab.set_name("lab");
  ASSERT_TRUE(client_->PutProfile(lab).ok());
  for (int b : {2, 8}) ASSERT_TRUE(client_->ReportMeasurement(SlowRun(*client_, "lab", b)).ok());
  EXPECT_EQ(client_->GetProfile("lab")->version(), 1u) << "two reports: no refit yet";
  ASSERT_TRUE(client_->ReportMeasurement(SlowRun(*client_, "lab", 4)).ok());
  // The third report queues a refit; wait for version 2 (bounded).
  uint32_t version = 1;
  for (int i = 0; i < 400 && version == 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    version = client_->GetProfile("lab")->version();
  }
  EXPECT_EQ(version, 2u);
  EXPECT_GT(client_->GetProfile("lab")->context().ops_size(), 0);
}

TEST_F(ServerTest, HealthAndReflectionAnswer) {
  auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  for (const char* service : {"", "moeplan.v1.Planner"}) {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status s = health->Check(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << service << ": " << s.error_message();
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING) << service;
  }
  // Reflection: a bidi stream through the generic stub.
  namespace refl = moeplan::testing::reflection;
  grpc::GenericStub generic(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  auto wait = [&cq](intptr_t want) {
    void* tag = nullptr;
    bool ok = false;
    return cq.Next(&tag, &ok) && ok && reinterpret_cast<intptr_t>(tag) == want;
  };
  auto call = generic.PrepareCall(
      &ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(wait(1));
  refl::ServerReflectionRequest req;
  req.set_list_services("");
  const std::string bytes = req.SerializeAsString();
  grpc::Slice slice(bytes);
  grpc::ByteBuffer out(&slice, 1);
  call->Write(out, reinterpret_cast<void*>(2));
  ASSERT_TRUE(wait(2));
  grpc::ByteBuffer in;
  call->Read(&in, reinterpret_cast<void*>(3));
  ASSERT_TRUE(wait(3));
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(in.Dump(&slices).ok());
  std::string got;
  for (const grpc::Slice& s : slices)
    got.append(reinterpret_cast<const char*>(s.begin()), s.size());
  refl::ServerReflectionResponse resp;
  ASSERT_TRUE(resp.ParseFromString(got));
  std::set<std::string> names;
  for (const auto& s : resp.list_services_response().service()) names.insert(s.name());
  EXPECT_TRUE(names.count("moeplan.v1.Planner")) << resp.DebugString();
  EXPECT_TRUE(names.count("grpc.health.v1.Health")) << resp.DebugString();
  call->WritesDone(reinterpret_cast<void*>(4));
  ASSERT_TRUE(wait(4));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  ASSERT_TRUE(wait(5));
  EXPECT_TRUE(status.ok()) << status.error_message();
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
}

// ---- Invalid requests: INVALID_ARGUMENT naming the field ----

struct BadRequest {
  const char* label;
  std::function<absl::Status(client::PlannerClient&)> call;
  const char* field;  // the message must start with this
};

v1::ReportMeasurementRequest GoodReport() {
  v1::ReportMeasurementRequest r;
  r.set_profile_name("a100-8x8");
  r.set_profile_version(1);
  *r.mutable_plan() = PlanRequest();
  r.set_schedule(v1::SCHEDULE_S1);
  v1::MeasuredOp* op = r.add_ops();
  op->set_name("fwd.gate");
  op->set_duration_us(20);
  r.set_total_us(9000);
  return r;
}

using LayerEdit = std::function<void(v1::LayerConfig*)>;
BadRequest Layer(const char* label, LayerEdit edit, const char* field) {
  return {label,
          [edit](client::PlannerClient& c) {
            v1::PlanLayerRequest r = PlanRequest();
            edit(r.mutable_layer());
            return c.PlanLayer(r).status();
          },
          field};
}
BadRequest Plan(const char* label, std::function<void(v1::PlanLayerRequest*)> edit,
                const char* field) {
  return {label,
          [edit](client::PlannerClient& c) {
            v1::PlanLayerRequest r = PlanRequest();
            edit(&r);
            return c.PlanLayer(r).status();
          },
          field};
}
BadRequest Put(const char* label, std::function<void(v1::ClusterProfile*)> edit,
               const char* field) {
  return {label,
          [edit](client::PlannerClient& c) {
            v1::ClusterProfile p = *calibration::BuiltinProfile("h200-8x8");
            p.set_name("new-profile");
            edit(&p);
            return c.PutProfile(p).status();
          },
          field};
}
BadRequest Report(const char* label, std::function<void(v1::ReportMeasurementRequest*)> edit,
                  const char* field) {
  return {label,
          [edit](client::PlannerClient& c) {
            v1::ReportMeasurementRequest r = GoodReport();
            edit(&r);
            return c.ReportMeasurement(r).status();
          },
          field};
}

std::vector<BadRequest> BadRequests() {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto bad_inline = [](std::function<void(v1::ClusterProfile*)> edit) {
    return [edit](v1::PlanLayerRequest* r) {
      *r->mutable_profile() = *calibration::BuiltinProfile("a100-8x8");
      edit(r->mutable_profile());
    };
  };
  return {
      Plan(
          "no_layer", [](auto* r) { r->clear_layer(); }, "layer: required"),
      Plan(
          "no_profile", [](auto* r) { r->clear_cluster(); }, "profile_name: required"),
      Layer(
          "batch_zero", [](auto* l) { l->set_batch_size(0); }, "layer.batch_size: must be > 0"),
      Layer(
          "seq_negative", [](auto* l) { l->set_seq_len(-1); }, "layer.seq_len: must be > 0"),
      Layer(
          "model_dim_zero", [](auto* l) { l->set_model_dim(0); }, "layer.model_dim: "),
      Layer(
          "hidden_dim_zero", [](auto* l) { l->set_hidden_dim(0); }, "layer.hidden_dim: "),
      Layer(
          "experts_zero", [](auto* l) { l->set_num_experts(0); }, "layer.num_experts: "),
      Layer(
          "top_k_zero", [](auto* l) { l->set_top_k(0); }, "layer.top_k: must be >= 1"),
      Layer(
          "top_k_above_e", [](auto* l) { l->set_top_k(65); },
          "layer.top_k: must be <= num_experts"),
      Layer(
          "capacity_zero", [](auto* l) { l->set_capacity_factor(0); }, "layer.capacity_factor: "),
      Layer(
          "capacity_nan", [nan](auto* l) { l->set_capacity_factor(nan); },
          "layer.capacity_factor: "),
      Layer(
          "bytes_3", [](auto* l) { l->set_bytes_per_element(3); }, "layer.bytes_per_element: "),
      Layer(
          "skew_below_1", [](auto* l) { l->set_token_skew(0.5); }, "layer.token_skew: "),
      Layer(
          "mp_zero", [](auto* l) { l->mutable_parallel()->set_mp(0); }, "layer.parallel.mp: "),
      Layer(
          "ep_zero", [](auto* l) { l->mutable_parallel()->set_ep(0); }, "layer.parallel.ep: "),
      Layer(
          "esp_zero", [](auto* l) { l->mutable_parallel()->set_esp(0); }, "layer.parallel.esp: "),
      Layer(
          "dp_zero", [](auto* l) { l->mutable_parallel()->set_dp(0); }, "layer.parallel.dp: "),
      Layer(
          "pp_zero", [](auto* l) { l->mutable_parallel()->set_pp(0); }, "layer.parallel.pp: "),
      Layer(
          "ep_not_dividing_e", [](auto* l) { l->set_num_experts(24); },
          "layer.parallel.ep: must divide num_experts"),
      Layer(
          "esp_not_dividing_h", [](auto* l) { l->set_hidden_dim(4098); },
          "layer.parallel.esp: must divide hidden_dim"),
      Layer(
          "dense_ne_expert", [](auto* l) { l->mutable_parallel()->set_dp(8); },
          "layer.parallel: mp*dp must equal ep*esp"),
      Layer(
          "too_many_ranks", [](auto* l) { l->mutable_parallel()->set_pp(2); },
          "layer.parallel: mp*dp*pp must be <="),
      Layer(
          "mp_ne_esp",
          [](auto* l) {
            l->mutable_parallel()->set_mp(8);
            l->mutable_parallel()->set_dp(8);
          },
          "layer.parallel.esp: schedules s1 and s2 need esp == mp"),
      Layer(
          "esp_not_dividing_mp",
          [](auto* l) {
            l->mutable_parallel()->set_mp(2);
            l->mutable_parallel()->set_dp(32);
          },
          "layer.parallel.esp: must divide mp"),
      Layer(
          "dp_underivable", [](auto* l) { l->mutable_parallel()->set_mp(3); },
          "layer.parallel.dp: unset"),
      Layer(
          "schema_2", [](auto* l) { l->set_schema_version(2); }, "layer.schema_version: must be 1"),
      Plan(
          "schedule_unspecified", [](auto* r) { r->add_schedules(v1::SCHEDULE_UNSPECIFIED); },
          "schedules[0]: "),
      Plan(
          "schedule_twice",
          [](auto* r) {
            r->add_schedules(v1::SCHEDULE_S1);
            r->add_schedules(v1::SCHEDULE_S1);
          },
          "schedules: each schedule may be listed once"),
      Plan("inline_beta_zero", bad_inline([](auto* p) {
             p->mutable_links()->mutable_intra()->set_beta_us_per_byte(0);
           }),
           "profile.links.intra.beta_us_per_byte: "),
      Plan("inline_bad_name", bad_inline([](auto* p) { p->set_name("Big Cluster"); }),
           "profile.name: "),
      Plan("inline_no_links", bad_inline([](auto* p) { p->clear_links(); }), "profile.links: "),
      Plan("inline_no_source",
           bad_inline([](auto* p) { p->set_source(v1::PROFILE_SOURCE_UNSPECIFIED); }),
           "profile.source: "),
      Plan("inline_grid_size", bad_inline([](auto* p) { p->mutable_gemm()->add_efficiency(0.5); }),
           "profile.gemm.efficiency: "),
      Put(
          "put_empty_profile", [](auto* p) { *p = v1::ClusterProfile(); }, "profile.links: "),
      Put(
          "put_peak_zero", [](auto* p) { p->mutable_gemm()->set_peak_tflops(0); },
          "profile.gemm.peak_tflops: "),
      Put(
          "put_version_zero", [](auto* p) { p->set_version(0); }, "profile.version: must be >= 1"),
      Put(
          "put_path_name", [](auto* p) { p->set_name("../etc"); }, "profile.name: "),
      Put(
          "put_dup_fit",
          [](auto* p) {
            for (int i = 0; i < 2; ++i) {
              auto* f = p->add_collectives();
              f->set_collective(v1::COLLECTIVE_ALL_GATHER);
              f->mutable_shape()->set_ranks(8);
              f->mutable_shape()->set_nodes(1);
              f->mutable_cost()->set_beta_us_per_byte(1e-6);
            }
          },
          "profile.collectives[1]: duplicate"),
      Put(
          "put_neg_memory", [](auto* p) { p->mutable_memory()->set_bandwidth_gbytes_per_s(-1); },
          "profile.memory.bandwidth_gbytes_per_s: "),
      Put(
          "put_nodes_zero", [](auto* p) { p->set_nodes(0); }, "profile.nodes: "),
      {"get_empty_name", [](client::PlannerClient& c) { return c.GetProfile("").status(); },
       "name: required"},
      Report(
          "report_no_profile", [](auto* r) { r->clear_profile_name(); }, "profile_name: required"),
      Report(
          "report_version_zero", [](auto* r) { r->set_profile_version(0); }, "profile_version: "),
      Report(
          "report_version_future", [](auto* r) { r->set_profile_version(5); }, "profile_version: "),
      Report(
          "report_no_plan", [](auto* r) { r->clear_plan(); }, "plan.layer: required"),
      Report(
          "report_bad_layer", [](auto* r) { r->mutable_plan()->mutable_layer()->set_top_k(99); },
          "plan.layer.top_k: "),
      Report(
          "report_no_schedule", [](auto* r) { r->set_schedule(v1::SCHEDULE_UNSPECIFIED); },
          "schedule: "),
      Report(
          "report_schedule_invalid_for_layout",
          [](auto* r) {
            auto* p = r->mutable_plan()->mutable_layer()->mutable_parallel();
            p->set_mp(2);
            p->set_dp(32);
          },
          "plan.layer.parallel.esp: "),
      Report(
          "report_no_ops", [](auto* r) { r->clear_ops(); }, "ops: "),
      Report(
          "report_op_no_name", [](auto* r) { r->mutable_ops(0)->clear_name(); },
          "ops[0].name: required"),
      Report(
          "report_op_negative", [](auto* r) { r->mutable_ops(0)->set_duration_us(-3); },
          "ops[0].duration_us: "),
      Report(
          "report_total_zero", [](auto* r) { r->set_total_us(0); }, "total_us: "),
      Report(
          "report_total_huge", [](auto* r) { r->set_total_us(1e308); }, "total_us: "),
      Report(
          "report_op_huge", [](auto* r) { r->mutable_ops(0)->set_duration_us(1e308); },
          "ops[0].duration_us: must be finite, >= 0 and <= 3.6e9"),
      Report(
          "report_op_start_without_has_start",
          [](auto* r) { r->mutable_ops(0)->set_start_us(12.0); },
          "ops[0].start_us: set has_start with it"),
      Report(
          "report_op_start_negative",
          [](auto* r) {
            r->mutable_ops(0)->set_has_start(true);
            r->mutable_ops(0)->set_start_us(-1.0);
          },
          "ops[0].start_us: must be finite, >= 0 and <= 3.6e9 (an hour) (got -1)"),
      Report(
          "report_op_unknown",
          [](auto* r) { r->mutable_ops(0)->set_name(std::string(1 << 20, 'x')); },
          "ops[0].name: not an op of the plan's s1 schedule (got 'xxxx"),
      Report(
          "report_op_twice", [](auto* r) { *r->add_ops() = r->ops(0); },
          "ops[1].name: each op may be reported once (got 'fwd.gate' twice)"),
      {"report_model_and_plan",
       [](client::PlannerClient& c) {
         v1::ReportMeasurementRequest r = GoodModelReport();
         *r.mutable_plan() = PlanRequest();
         return c.ReportMeasurement(r).status();
       },
       "plan: give plan (a layer) or model_plan (a model), not both"},
      {"report_model_bad_variant",
       [](client::PlannerClient& c) {
         v1::ReportMeasurementRequest r = GoodModelReport();
         r.set_variant("fast");
         return c.ReportMeasurement(r).status();
       },
       "variant: must be none, tutel, dw, partition or lancet (got 'fast')"},
      {"report_model_bad_model",
       [](client::PlannerClient& c) {
         v1::ReportMeasurementRequest r = GoodModelReport();
         r.mutable_model_plan()->mutable_model()->set_num_layers(0);
         return c.ReportMeasurement(r).status();
       },
       "model_plan.model.num_layers: "},
      {"report_model_search",
       [](client::PlannerClient& c) {
         v1::ReportMeasurementRequest r = GoodModelReport();
         r.mutable_model_plan()->mutable_search();
         return c.ReportMeasurement(r).status();
       },
       "model_plan: a variants plan is reported"},
      {"report_model_unknown_op",
       [](client::PlannerClient& c) {
         v1::ReportMeasurementRequest r = GoodModelReport();
         r.mutable_ops(0)->set_name("b1.fwd.teleport");
         return c.ReportMeasurement(r).status();
       },
       "ops[0].name: not an op of the model's none plan (got 'b1.fwd.teleport')"},
      Report(
          "report_too_many_ops",
          [](auto* r) {
            for (int i = 0; i < 1000; ++i) *r->add_ops() = r->ops(0);
          },
          "ops: at most one entry per op of the plan"),
  };
}

class BadRequestTest : public ServerTest, public ::testing::WithParamInterface<BadRequest> {};

TEST_P(BadRequestTest, IsInvalidArgumentNamingTheField) {
  const absl::Status s = GetParam().call(*client_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(Msg(s).rfind(GetParam().field, 0), 0u) << s;
  EXPECT_EQ(Msg(s).find('\n'), std::string::npos);
  EXPECT_EQ(server_->cache().size(), 0u) << "nothing invalid is cached";
}

INSTANTIATE_TEST_SUITE_P(Table, BadRequestTest, ::testing::ValuesIn(BadRequests()),
                         [](const auto& info) { return std::string(info.param.label); });

TEST(BadRequestTable, HasAtLeastThirtyCases) { EXPECT_GE(BadRequests().size(), 30u); }

}  // namespace
}  // namespace moeplan::server

namespace moeplan::server {
namespace {

// TLS and the bearer token (docs/service.md "Who may write"), with a CA and
// server certificate made for the test by tests/server/make_test_certs.sh.
class SecureServerTest : public TlsFixture {
 protected:
  ServerOptions Options() const {
    ServerOptions o;
    o.listen = "127.0.0.1:0";
    o.data_dir = dir_ + "/data";
    o.handlers.log_requests = false;
    o.tls_cert_file = Cert("server.pem");
    o.tls_key_file = Cert("server.key");
    o.token_file = Cert("token");
    return o;
  }
  void Start(const ServerOptions& o) {
    ProfileStore::OpenReport report;
    absl::StatusOr<std::unique_ptr<PlannerServer>> s = PlannerServer::Start(o, &report);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }
  std::unique_ptr<client::PlannerClient> Client(std::string token_file, bool tls = true) {
    client::ClientOptions c;
    c.address = Cat("localhost:", server_->port());
    c.timeout = std::chrono::seconds(5);
    if (tls) c.tls_ca_file = Cert("ca.pem");
    c.token_file = std::move(token_file);
    absl::StatusOr<std::unique_ptr<client::PlannerClient>> r = client::PlannerClient::Connect(c);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : nullptr;
  }
  static v1::ClusterProfile Custom() {
    v1::ClusterProfile p = *calibration::BuiltinProfile("a100-8x8");
    p.set_name("secure-custom");
    p.set_version(1);
    return p;
  }
};

TEST_F(SecureServerTest, WritesNeedTheTokenReadsDoNot) {
  Start(Options());
  const std::string wrong = Cat(dir_, "/wrong-token");
  std::ofstream(wrong) << "0123456789abcdef0123456789abcdef\n";
  for (const std::string& token : {std::string(), wrong}) {
    std::unique_ptr<client::PlannerClient> c = Client(token);
    absl::StatusOr<v1::PutProfileResponse> put = c->PutProfile(Custom());
    ASSERT_EQ(put.status().code(), absl::StatusCode::kUnauthenticated) << put.status();
    EXPECT_EQ(Msg(put.status()).rfind("PutProfile", 0), 0u) << put.status();
    v1::ReportMeasurementRequest report;
    report.set_profile_name("a100-8x8");
    EXPECT_EQ(c->ReportMeasurement(report).status().code(), absl::StatusCode::kUnauthenticated);
    // Reads stay open.
    absl::StatusOr<v1::PlanLayerResponse> plan = c->PlanLayer(PlanRequest());
    EXPECT_TRUE(plan.ok()) << plan.status();
    EXPECT_TRUE(c->ListProfiles().ok());
  }
  EXPECT_EQ(server_->store().Get("secure-custom"), nullptr) << "nothing written";
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/data/profiles/secure-custom.profile"));
  // The right token writes.
  std::unique_ptr<client::PlannerClient> ok = Client(Cert("token"));
  absl::StatusOr<v1::PutProfileResponse> put = ok->PutProfile(Custom());
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_NE(server_->store().Get("secure-custom"), nullptr);
  // Plaintext cannot talk to a TLS server: UNAVAILABLE, or the deadline
  // passes while the client retries.
  std::unique_ptr<client::PlannerClient> plain = Client(Cert("token"), /*tls=*/false);
  const absl::StatusCode code = plain->ListProfiles().status().code();
  EXPECT_TRUE(code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded)
      << code;
}

TEST_F(SecureServerTest, TokenForReadsClosesEveryRpc) {
  ServerOptions o = Options();
  o.token_for_reads = true;
  Start(o);
  std::unique_ptr<client::PlannerClient> anon = Client("");
  EXPECT_EQ(anon->ListProfiles().status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(anon->PlanLayer(PlanRequest()).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(Client(Cert("token"))->ListProfiles().ok());
}

TEST_F(SecureServerTest, ServingBeyondThisMachineNeedsTlsAndAToken) {
  ProfileStore::OpenReport report;
  ServerOptions o = Options();
  o.allow_public = true;
  o.tls_cert_file.clear();
  o.tls_key_file.clear();
  absl::Status s = PlannerServer::Start(o, &report).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(s).rfind("--allow-public: serving beyond this machine needs TLS and a token", 0),
            0u)
      << s;
  o = Options();
  o.allow_public = true;
  o.token_file.clear();
  EXPECT_EQ(PlannerServer::Start(o, &report).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options();
  o.tls_key_file.clear();
  EXPECT_EQ(Msg(PlannerServer::Start(o, &report).status()),
            "--tls-cert and --tls-key: give both (the certificate chain and its key)");
  const std::string short_token = Cat(dir_, "/short");
  std::ofstream(short_token) << "abc\n";
  o = Options();
  o.token_file = short_token;
  EXPECT_EQ(Msg(PlannerServer::Start(o, &report).status()),
            "--token-file: the token (the file's first line) must be at least 16 characters "
            "(got 3)");
  o = Options();
  o.tls_cert_file = Cert("token");  // not a certificate
  EXPECT_EQ(Msg(PlannerServer::Start(o, &report).status()).rfind("--tls-cert: ", 0), 0u);
}

}  // namespace
}  // namespace moeplan::server
