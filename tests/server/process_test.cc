// moeplan-server as a real process: the CLI's --server mode prints exactly what
// local planning prints, SIGTERM drains and exits 0, and kill -9 in the middle of
// a stream of PutProfile calls loses no acknowledged profile.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <regex>
#include <string>
#include <thread>

#include "../cli/run_cli.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/client/planner_client.h"
#include "moeplan/proto/json.h"
#include "server_process.h"

namespace moeplan::testing {
namespace {

TEST(ServerProcess, CliOutputMatchesLocalAndSigtermExitsZero) {
  TempDir dir;
  ServerProcess server(dir.path());
  ASSERT_FALSE(server.address().empty()) << "server did not announce its address";
  const std::string server_flag = " --server " + server.address();
  for (const std::string& args :
       {std::string("plan-layer --layer examples/gpt2-moe-layer.json"),
        std::string(
            "plan-layer --layer examples/bert-moe-layer.json --cluster h200-8x8 --format json"),
        std::string(
            "plan-layer --layer examples/gpt2-moe-layer.json --schedules s1,default --no-timeline"),
        std::string("plan-model --model examples/models/gpt2-s-moe.a100.json"),
        std::string("plan-model --model examples/models/fine-grained-moe.json --format json "
                    "--variants none,lancet --partition-max-k 4"),
        std::string("profiles list"), std::string("profiles get rtx2080ti-8x4")}) {
    SCOPED_TRACE(args);
    CliResult local = RunCli(args);
    CliResult remote = RunCli(args + server_flag);
    ASSERT_EQ(local.exit_code, 0) << local.err;
    ASSERT_EQ(remote.exit_code, 0) << remote.err;
    EXPECT_EQ(remote.out, local.out);
  }
  // Errors travel too: same one line.
  TempDir tmp;
  const std::string bad = tmp.Write("bad.json", R"({"batch_size": 8, "seq_len": 512,
      "model_dim": 1024, "hidden_dim": 4096, "num_experts": 32, "top_k": 40,
      "capacity_factor": 1.0, "parallel": {"mp": 4, "ep": 16, "esp": 4}})");
  CliResult local = RunCli("plan-layer --layer " + bad);
  CliResult remote = RunCli("plan-layer --layer " + bad + server_flag);
  EXPECT_NE(remote.exit_code, 0);
  EXPECT_EQ(remote.err, local.err);
  EXPECT_NE(remote.err.find("top_k: must be <= num_experts"), std::string::npos) << remote.err;

  // Model errors too, said against the file.
  const std::string bad_model =
      tmp.Write("model.json", R"({"num_layers": 2, "hidden_size": 512, "num_attention_heads": 7,
      "ffn_hidden_size": 2048, "seq_length": 128, "micro_batch_size": 2,
      "moe": {"layer_freq": 1, "num_experts": 64, "top_k": 1, "capacity_factor": 1.0,
              "expert_ffn_hidden_size": 1024, "gate": "GATE_TOP_K"},
      "parallel": {"mp": 1, "ep": 64, "esp": 1}})");
  CliResult local_model = RunCli("plan-model --model " + bad_model);
  CliResult remote_model = RunCli("plan-model --model " + bad_model + server_flag);
  EXPECT_EQ(remote_model.exit_code, 1);
  EXPECT_EQ(remote_model.err, local_model.err);
  EXPECT_NE(remote_model.err.find(bad_model + ": num_attention_heads: must divide hidden_size"),
            std::string::npos)
      << remote_model.err;

  EXPECT_EQ(server.Stop(SIGTERM), 0);
}

// The search's wall time (search_stats.elapsed_ms), the one number that is the
// machine's, not the plan's: blanked before comparing.
std::string WithoutElapsed(std::string json) {
  return std::regex_replace(json, std::regex(R"("elapsed_ms": [0-9.e+-]+)"), R"("elapsed_ms": -)");
}

// The layout search of every layout example answers over gRPC exactly as
// locally, up to the search's wall time.
TEST(ServerProcess, LayoutSearchOfEveryExampleMatchesLocal) {
  TempDir dir;
  ServerProcess server(dir.path());
  ASSERT_FALSE(server.address().empty()) << "server did not announce its address";
  for (const char* args : {
           "--model examples/models/gpt3-medium-moe.json --cluster v100-8x8 --gpus 32",
           "--model examples/models/gpt3-6.7b-moe.json --cluster a100-8x8 --gpus 128",
           "--model examples/models/mixtral-8x7b-like.json --cluster h200-8x8 --gpus 64",
           "--model examples/models/qwen-moe-like.json --cluster a100-8x8 --gpus 32",
       }) {
    // A narrowed search keeps it quick under TSan; the code paths are the same.
    const std::string cmd =
        std::string("plan-model --search --top 3 --variants none --zero-stages 1 "
                    "--pipelines 1f1b --max-microbatches 16 --format json ") +
        args;
    SCOPED_TRACE(cmd);
    CliResult local = RunCli(cmd);
    CliResult remote = RunCli(cmd + " --server " + server.address());
    ASSERT_EQ(local.exit_code, 0) << local.err;
    ASSERT_EQ(remote.exit_code, 0) << remote.err;
    EXPECT_NE(local.out.find("\"candidates\""), std::string::npos);
    EXPECT_NE(local.out.find("\"elapsed_ms\": "), std::string::npos);
    EXPECT_EQ(WithoutElapsed(remote.out), WithoutElapsed(local.out));
  }
  EXPECT_EQ(server.Stop(SIGTERM), 0);
}

TEST(ServerProcess, SigintAlsoExitsZero) {
  TempDir dir;
  ServerProcess server(dir.path());
  ASSERT_FALSE(server.address().empty());
  client::PlannerClient c(server.address());
  ASSERT_TRUE(c.ListProfiles().ok());
  EXPECT_EQ(server.Stop(SIGINT), 0);
}

TEST(ServerProcess, KillDashNineDuringPutsLosesNoAcknowledgedProfile) {
  TempDir dir;
  v1::ClusterProfile base = *calibration::BuiltinProfile("a100-8x8");
  std::vector<v1::ClusterProfile> acked;
  {
    ServerProcess server(dir.path());
    ASSERT_FALSE(server.address().empty());
    std::mutex mu;
    std::atomic<bool> stop{false};
    std::atomic<int> writers_done{0};
    // Four writers, so writes are in flight when the kill lands.
    std::vector<std::thread> writers;
    for (int w = 0; w < 4; ++w) {
      writers.emplace_back([&, w] {
        client::PlannerClient c(server.address(), std::chrono::seconds(5));
        for (int i = 0; !stop && i < 10000; ++i) {
          v1::ClusterProfile p = base;
          p.set_name("p" + std::to_string(w) + "-" + std::to_string(i % 7));
          p.set_version(static_cast<uint32_t>(i / 7 + 1));
          p.mutable_links()->mutable_inter()->set_alpha_us(1.0 + i);
          if (!c.PutProfile(p).ok()) break;  // the server is gone
          std::lock_guard<std::mutex> lock(mu);
          acked.push_back(p);
        }
        ++writers_done;
      });
    }
    // Kill once 120 writes are acknowledged; give up (and fail below) if the
    // writers stop first or it takes a minute.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (writers_done == 0 && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      std::lock_guard<std::mutex> lock(mu);
      if (acked.size() >= 120) break;
    }
    EXPECT_EQ(server.Stop(SIGKILL), 128 + SIGKILL);
    stop = true;
    for (auto& t : writers) t.join();
  }
  ASSERT_GE(acked.size(), 120u);
  // The latest acknowledged version of each name must be there, intact.
  std::map<std::string, v1::ClusterProfile> latest;
  for (const auto& p : acked) {
    auto& slot = latest[p.name()];
    if (p.version() > slot.version()) slot = p;
  }
  ServerProcess restarted(dir.path());
  ASSERT_FALSE(restarted.address().empty()) << "the store must load after kill -9";
  client::PlannerClient c(restarted.address());
  for (const auto& [name, want] : latest) {
    absl::StatusOr<v1::ClusterProfile> got = c.GetProfile(name);
    ASSERT_TRUE(got.ok()) << name << ": " << got.status();
    // An unacknowledged later write may have landed too; never an older one.
    EXPECT_GE(got->version(), want.version()) << name;
    if (got->version() == want.version()) {
      EXPECT_EQ(got->SerializeAsString(), want.SerializeAsString()) << name;
    }
  }
  EXPECT_EQ(restarted.Stop(SIGTERM), 0);
}

// The server comes back on the same port after kill -9: a call made while it
// is down is retried (gRPC's retry policy in the client) and answered, and
// the profiles acknowledged before the kill are served.
TEST(ServerProcess, ClientsRetryAcrossARestart) {
  TempDir dir;
  std::string port;
  v1::ClusterProfile p = *calibration::BuiltinProfile("a100-8x8");
  p.set_name("before-the-kill");
  p.set_version(1);
  {
    ServerProcess server(dir.path());
    ASSERT_FALSE(server.address().empty());
    port = server.port();
    ASSERT_TRUE(client::PlannerClient(server.address()).PutProfile(p).ok());
    EXPECT_EQ(server.Stop(SIGKILL), 128 + SIGKILL);
  }
  client::PlannerClient c("127.0.0.1:" + port, std::chrono::seconds(20));
  absl::StatusOr<v1::ClusterProfile> got;
  std::thread call([&] { got = c.GetProfile("before-the-kill"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the first attempt fails
  ServerProcess restarted(dir.path(), {}, "127.0.0.1:" + port);
  ASSERT_FALSE(restarted.address().empty());
  call.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->SerializeAsString(), p.SerializeAsString());
  EXPECT_EQ(restarted.Stop(SIGTERM), 0);
}

// TLS and a bearer token from the command line: the CLI's --tls-ca and
// --token-file reach a server started with --tls-cert, --tls-key, --token-file.
TEST(ServerProcess, CliWritesOverTlsWithTheTokenOnly) {
  TempDir dir;
  const std::string certs = dir.File("certs");
  ASSERT_EQ(std::system(("bash " MOEPLAN_SOURCE_DIR "/tests/server/make_test_certs.sh " + certs).c_str()),
            0);
  ServerProcess server(dir.File("data"), {"--tls-cert", certs + "/server.pem", "--tls-key",
                                          certs + "/server.key", "--token-file", certs + "/token"});
  ASSERT_FALSE(server.address().empty());
  const std::string at = "--server localhost:" + server.port() + " --tls-ca " + certs + "/ca.pem";
  v1::ClusterProfile p = *calibration::BuiltinProfile("a100-8x8");
  p.set_name("over-tls");
  p.set_version(1);
  const std::string file = dir.Write("p.json", *proto::ToJson(p));
  CliResult anon = RunCli("profiles put " + file + " " + at);
  EXPECT_EQ(anon.exit_code, 1);
  EXPECT_NE(anon.err.find("PutProfile needs the server's bearer token"), std::string::npos)
      << anon.err;
  CliResult list = RunCli("profiles list " + at);  // reads stay open
  EXPECT_EQ(list.exit_code, 0) << list.err;
  CliResult put = RunCli("profiles put " + file + " " + at + " --token-file " + certs + "/token");
  ASSERT_EQ(put.exit_code, 0) << put.err;
  EXPECT_NE(put.out.find("stored profile over-tls version 1"), std::string::npos) << put.out;
  CliResult plain = RunCli("profiles list --server localhost:" + server.port());
  EXPECT_NE(plain.exit_code, 0) << "plaintext cannot reach a TLS server";
  EXPECT_EQ(server.Stop(SIGTERM), 0);
}

}  // namespace
}  // namespace moeplan::testing
