// The server's Prometheus metrics (docs/service.md "Metrics"): the text format
// of hand-counted calls, and the /metrics endpoint on the gRPC port's rules
// (loopback unless --allow-public, HTTPS with the certificate, the token with
// --token-for-reads). Under load, with promtool: tests/server/metrics_load_test.sh.
#include "moeplan/server/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "moeplan/base/strings.h"
#include "moeplan/client/planner_client.h"
#include "moeplan/proto/json.h"
#include "moeplan/server/plan_cache.h"
#include "moeplan/server/server.h"
#include "moeplan/v1/service.pb.h"
#include "tls_fixture.h"

namespace moeplan::server {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// The value of the sample `series` (name and labels exactly) in `text`, or -1.
double Sample(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1.0;
}

TEST(Metrics, RendersHandCountedCallsAndTheCache) {
  Metrics m;
  m.Request(Method::kPlanLayer, absl::StatusCode::kOk, 30us);                // le 5e-05
  m.Request(Method::kPlanLayer, absl::StatusCode::kOk, 2ms);                 // le 0.0025
  m.Request(Method::kPlanLayer, absl::StatusCode::kNotFound, 10us);          // le 2.5e-05
  m.Request(Method::kPlanModel, absl::StatusCode::kResourceExhausted, 90s);  // +Inf
  m.Refuse(Refusal::kModelPlansBusy);
  m.MeasurementStored();
  m.Refit(/*background=*/true, /*ok=*/false);
  PlanCache cache(10);
  cache.Put(PlanCacheKey("p", 1, "a"), std::make_shared<const std::string>("plan"));
  ASSERT_NE(cache.Get(PlanCacheKey("p", 1, "a")), nullptr);
  ASSERT_EQ(cache.Get(PlanCacheKey("p", 1, "b")), nullptr);
  MetricsSources sources;
  sources.cache = &cache;
  sources.max_model_plans = 3;
  const std::string t = m.Render(sources);

  const std::string layer = "method=\"PlanLayer\"";
  EXPECT_EQ(Sample(t, "moeplan_requests_total{method=\"PlanLayer\",code=\"OK\"}"), 2);
  EXPECT_EQ(Sample(t, "moeplan_requests_total{method=\"PlanLayer\",code=\"NOT_FOUND\"}"), 1);
  EXPECT_EQ(Sample(t, "moeplan_requests_total{method=\"PlanModel\",code=\"OK\"}"), 0);
  EXPECT_EQ(Sample(t, "moeplan_requests_total{method=\"PlanModel\",code=\"RESOURCE_EXHAUSTED\"}"),
            1);
  EXPECT_EQ(Sample(t, "moeplan_requests_total{method=\"GetProfile\",code=\"NOT_FOUND\"}"), -1)
      << "codes that never occurred are not listed";
  // The buckets are cumulative: 10 us, 30 us, 2 ms.
  const auto bucket = [&](const char* le) {
    return Sample(t, Cat("moeplan_request_duration_seconds_bucket{", layer, ",le=\"", le, "\"}"));
  };
  EXPECT_EQ(bucket("2.5e-05"), 1);
  EXPECT_EQ(bucket("5e-05"), 2);
  EXPECT_EQ(bucket("0.001"), 2);
  EXPECT_EQ(bucket("0.0025"), 3);
  EXPECT_EQ(bucket("+Inf"), 3);
  EXPECT_EQ(Sample(t, Cat("moeplan_request_duration_seconds_count{", layer, "}")), 3);
  EXPECT_NEAR(Sample(t, Cat("moeplan_request_duration_seconds_sum{", layer, "}")), 2.04e-3, 1e-12);
  EXPECT_EQ(Sample(t, "moeplan_request_duration_seconds_bucket{method=\"PlanModel\",le=\"60\"}"),
            0);
  EXPECT_EQ(Sample(t, "moeplan_request_duration_seconds_bucket{method=\"PlanModel\",le=\"+Inf\"}"),
            1);

  EXPECT_EQ(Sample(t, "moeplan_refusals_total{reason=\"model_plans_busy\"}"), 1);
  EXPECT_EQ(Sample(t, "moeplan_refusals_total{reason=\"response_too_large\"}"), 0);
  EXPECT_EQ(Sample(t, "moeplan_measurements_stored_total"), 1);
  EXPECT_EQ(Sample(t, "moeplan_refits_total{trigger=\"background\",result=\"failed\"}"), 1);
  EXPECT_EQ(Sample(t, "moeplan_refits_total{trigger=\"rpc\",result=\"ok\"}"), 0);
  EXPECT_EQ(Sample(t, "moeplan_plan_cache_hits_total{level=\"canonical\"}"), 1);
  EXPECT_EQ(Sample(t, "moeplan_plan_cache_hits_total{level=\"raw\"}"), 0);
  EXPECT_EQ(Sample(t, "moeplan_plan_cache_misses_total"), 1);
  EXPECT_EQ(Sample(t, "moeplan_plan_cache_entries"), 1);
  EXPECT_EQ(Sample(t, "moeplan_plan_cache_bytes"), static_cast<double>(cache.bytes()));
  EXPECT_EQ(Sample(t, "moeplan_model_plans_max"), 3);
  // Every family says what it is.
  EXPECT_THAT(t, HasSubstr("# TYPE moeplan_request_duration_seconds histogram\n"));
  EXPECT_THAT(t, HasSubstr("# TYPE moeplan_requests_total counter\n"));
  EXPECT_THAT(t, HasSubstr("# TYPE moeplan_plan_cache_entries gauge\n"));
}

// A server with --metrics, over TLS with a token, from tests/server/make_test_certs.sh.
class MetricsEndpointTest : public TlsFixture {
 protected:
  ServerOptions Options() const {
    ServerOptions o;
    o.listen = "127.0.0.1:0";
    o.metrics_listen = "127.0.0.1:0";
    o.data_dir = dir_ + "/data";
    o.handlers.log_requests = false;
    return o;
  }
  absl::Status Start(const ServerOptions& o) {
    ProfileStore::OpenReport report;
    absl::StatusOr<std::unique_ptr<PlannerServer>> s = PlannerServer::Start(o, &report);
    if (!s.ok()) return s.status();
    server_ = *std::move(s);
    return absl::OkStatus();
  }
  // A client of the started server's gRPC port (plaintext).
  absl::StatusOr<std::unique_ptr<client::PlannerClient>> Connect() const {
    client::ClientOptions c;
    c.address = server_->address();
    return client::PlannerClient::Connect(c);
  }
  int MetricsPort() const {
    const std::string& url = server_->metrics_url();
    return std::stoi(url.substr(url.rfind(':') + 1));
  }
  std::string Token() const {
    std::ifstream in(Cert("token"));
    std::string t;
    std::getline(in, t);
    return t;
  }
};

TEST_F(MetricsEndpointTest, ServesTheCallsItAnswered) {
  ASSERT_TRUE(Start(Options()).ok());
  ASSERT_THAT(server_->metrics_url(), ::testing::StartsWith("http://127.0.0.1:"));
  absl::StatusOr<std::unique_ptr<client::PlannerClient>> cli = Connect();
  ASSERT_TRUE(cli.ok()) << cli.status();
  ASSERT_TRUE((*cli)->ListProfiles().ok());
  ASSERT_FALSE((*cli)->GetProfile("no-such-profile").ok());

  httplib::Client http("127.0.0.1", MetricsPort());
  httplib::Result r = http.Get("/metrics");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(Sample(r->body, "moeplan_requests_total{method=\"ListProfiles\",code=\"OK\"}"), 1);
  EXPECT_EQ(Sample(r->body, "moeplan_requests_total{method=\"GetProfile\",code=\"NOT_FOUND\"}"), 1);
  EXPECT_EQ(Sample(r->body, "moeplan_profiles{kind=\"builtin\"}"), 11);
  EXPECT_EQ(Sample(r->body, "moeplan_profiles{kind=\"stored\"}"), 0);
  EXPECT_EQ(Sample(r->body, "moeplan_model_plans_running"), 0);
  EXPECT_EQ(Sample(r->body, "moeplan_model_plans_queued"), 0);
  EXPECT_EQ(http.Get("/")->status, 404);
}

// A PlanModel that misses is planned on the planning threads as the second
// half of its call: counted once as a call and once as a miss, so cache hits
// and misses add up to the plans answered; its bytes are then a raw entry.
TEST_F(MetricsEndpointTest, ADeferredModelPlanIsCountedOnce) {
  ASSERT_TRUE(Start(Options()).ok());
  absl::StatusOr<std::unique_ptr<client::PlannerClient>> cli = Connect();
  ASSERT_TRUE(cli.ok()) << cli.status();
  v1::PlanModelRequest req;
  req.set_profile_name("a100-8x8");
  ASSERT_TRUE(proto::ReadJsonFile(MOEPLAN_SOURCE_DIR "/examples/models/gpt2-s-moe.a100.json",
                                  req.mutable_model())
                  .ok());
  req.mutable_options()->add_variants(v1::OVERLAP_VARIANT_NONE);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*cli)->PlanModel(req).ok());  // miss, canonical, raw
  httplib::Client http("127.0.0.1", MetricsPort());
  httplib::Result r = http.Get("/metrics");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  const std::string& t = r->body;
  EXPECT_EQ(Sample(t, "moeplan_requests_total{method=\"PlanModel\",code=\"OK\"}"), 3);
  EXPECT_EQ(Sample(t, "moeplan_request_duration_seconds_count{method=\"PlanModel\"}"), 3);
  EXPECT_EQ(Sample(t, "moeplan_plan_cache_misses_total"), 1);
  EXPECT_EQ(Sample(t, "moeplan_plan_cache_hits_total{level=\"canonical\"}"), 1);
  EXPECT_EQ(Sample(t, "moeplan_plan_cache_hits_total{level=\"raw\"}"), 1);
}

// Requests larger than the raw level's limit (here: padded with an unknown
// field) are answered from the canonical level only, never kept by their bytes.
TEST_F(MetricsEndpointTest, LargeRequestsSkipTheRawLevel) {
  ASSERT_TRUE(Start(Options()).ok());
  absl::StatusOr<std::unique_ptr<client::PlannerClient>> cli = Connect();
  ASSERT_TRUE(cli.ok()) << cli.status();
  v1::PlanLayerRequest req;
  req.set_profile_name("a100-8x8");
  ASSERT_TRUE(
      proto::ReadJsonFile(MOEPLAN_SOURCE_DIR "/examples/gpt2-moe-layer.json", req.mutable_layer())
          .ok());
  req.GetReflection()->MutableUnknownFields(&req)->AddLengthDelimited(999, std::string(20000, 'x'));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*cli)->PlanLayer(req).ok());
  EXPECT_EQ(server_->cache().raw_hits(), 0u);
  EXPECT_EQ(server_->cache().hits(), 2u);
  EXPECT_EQ(server_->cache().size(), 1u) << "the canonical entry only";
}

// cpp-httplib 0.11 ignores stop() until its thread runs: an endpoint stopped
// at once must still stop (the test would hang otherwise).
TEST_F(MetricsEndpointTest, StopsRightAfterStarting) {
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(Start(Options()).ok());
    server_.reset();
  }
}

TEST_F(MetricsEndpointTest, KeepsTheGrpcPortsRules) {
  ServerOptions o = Options();
  o.metrics_listen = "0.0.0.0:0";
  absl::Status s = Start(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("--metrics: '0.0.0.0' is not a loopback address; pass --allow-public"));
  o.metrics_listen = "unix:/tmp/metrics.sock";
  s = Start(o);
  EXPECT_THAT(std::string(s.message()), HasSubstr("--metrics: must be host:port"));
  o.metrics_listen = "127.0.0.1:99999";
  EXPECT_THAT(std::string(Start(o).message()), HasSubstr("--metrics: port must be 0..65535"));
}

TEST_F(MetricsEndpointTest, OverTlsWithTheTokenForReads) {
  ServerOptions o = Options();
  o.tls_cert_file = Cert("server.pem");
  o.tls_key_file = Cert("server.key");
  o.token_file = Cert("token");
  o.token_for_reads = true;
  ASSERT_TRUE(Start(o).ok());
  ASSERT_THAT(server_->metrics_url(), ::testing::StartsWith("https://127.0.0.1:"));
  httplib::SSLClient https("localhost", MetricsPort());
  https.set_ca_cert_path(Cert("ca.pem").c_str());
  https.enable_server_certificate_verification(true);
  httplib::Result anon = https.Get("/metrics");
  ASSERT_TRUE(anon) << httplib::to_string(anon.error());
  EXPECT_EQ(anon->status, 401);
  EXPECT_EQ(https.Get("/metrics", {{"Authorization", "Bearer wrong-token-0123456789"}})->status,
            401);
  httplib::Result ok = https.Get("/metrics", {{"Authorization", Cat("Bearer ", Token())}});
  ASSERT_TRUE(ok) << httplib::to_string(ok.error());
  EXPECT_EQ(ok->status, 200);
  EXPECT_THAT(ok->body, HasSubstr("moeplan_build_info{version="));
  // Plain HTTP gets no metrics from an HTTPS endpoint.
  httplib::Client plain("127.0.0.1", MetricsPort());
  plain.set_connection_timeout(2);
  plain.set_read_timeout(2);
  httplib::Result p = plain.Get("/metrics");
  EXPECT_TRUE(!p || p->status != 200);
}

}  // namespace
}  // namespace moeplan::server
