// Golden dumps: `moeplan plan-layer --format json` for each example layer on two
// built-in profiles, and `moeplan plan-model --format json` for example models,
// must match tests/golden/ and tests/golden/models/ (regenerate with
// scripts/regen-golden.sh and review the diff). Doubles compare to 1e-9 relative.
#include <google/protobuf/util/field_comparator.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "moeplan/proto/json.h"
#include "moeplan/v1/model.pb.h"
#include "moeplan/v1/plan.pb.h"
#include "run_cli.h"

namespace moeplan::testing {
namespace {

std::vector<std::string> GoldenFiles(const std::string& dir = MOEPLAN_SOURCE_DIR "/tests/golden") {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".json") out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Golden, EveryExampleLayerHasGoldens) {
  const std::vector<std::string> files = GoldenFiles();
  for (const char* want : {"gpt2-moe-layer.a100-8x8.json", "gpt2-moe-layer.h200-8x8.json",
                           "bert-moe-layer.a100-8x8.json", "bert-moe-layer.h200-8x8.json"}) {
    EXPECT_NE(std::find(files.begin(), files.end(), want), files.end()) << want;
  }
}

void ExpectSame(const google::protobuf::Message& want, const google::protobuf::Message& got,
                const std::string& file);

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, PlanLayerJsonMatches) {
  const std::string file = GetParam();
  // <layer>.<cluster>.json
  const std::string stem = file.substr(0, file.size() - 5);
  const std::string layer = stem.substr(0, stem.find('.'));
  const std::string cluster = stem.substr(stem.find('.') + 1);
  CliResult r =
      RunCli("plan-layer --format json --layer examples/" + layer + ".json --cluster " + cluster);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  v1::PlanLayerResponse got, want;
  ASSERT_TRUE(proto::ParseJson(r.out, &got).ok());
  ASSERT_TRUE(proto::ParseJson(Slurp(MOEPLAN_SOURCE_DIR "/tests/golden/" + file), &want).ok());

  ExpectSame(want, got, file);
}

void ExpectSame(const google::protobuf::Message& want, const google::protobuf::Message& got,
                const std::string& file) {
  google::protobuf::util::DefaultFieldComparator cmp;
  cmp.set_float_comparison(google::protobuf::util::DefaultFieldComparator::APPROXIMATE);
  // The search's wall time is the machine's, not the plan's.
  const google::protobuf::FieldDescriptor* elapsed =
      v1::SearchStats::descriptor()->FindFieldByName("elapsed_ms");
  cmp.SetDefaultFractionAndMargin(1e-9, 1e-9);
  google::protobuf::util::MessageDifferencer diff;
  diff.set_field_comparator(&cmp);
  diff.IgnoreField(elapsed);
  std::string report;
  diff.ReportDifferencesToString(&report);
  EXPECT_TRUE(diff.Compare(want, got))
      << "plan differs from tests/golden/" << file
      << " (if intended, run scripts/regen-golden.sh and review the diff):\n"
      << report.substr(0, 4000);
}

std::string TestName(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  for (char& c : n) {
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return n;
}

INSTANTIATE_TEST_SUITE_P(Examples, GoldenTest, ::testing::ValuesIn(GoldenFiles()), TestName);

const std::string kModelGoldens = MOEPLAN_SOURCE_DIR "/tests/golden/models";

TEST(Golden, ExampleModelsHaveGoldens) {
  EXPECT_GE(GoldenFiles(kModelGoldens).size(), 3u);
}

class ModelGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelGoldenTest, PlanModelJsonMatches) {
  const std::string file = GetParam();
  // <model file stem>.<cluster>.json; cluster names have no dots.
  const std::string stem = file.substr(0, file.size() - 5);
  const std::string model = stem.substr(0, stem.rfind('.'));
  const std::string cluster = stem.substr(stem.rfind('.') + 1);
  CliResult r = RunCli("plan-model --format json --model examples/models/" + model +
                       ".json --cluster " + cluster);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  v1::PlanModelResponse got, want;
  ASSERT_TRUE(proto::ParseJson(r.out, &got).ok());
  ASSERT_TRUE(proto::ParseJson(Slurp(kModelGoldens + "/" + file), &want).ok());
  ExpectSame(want, got, "models/" + file);
}

INSTANTIATE_TEST_SUITE_P(Examples, ModelGoldenTest, ::testing::ValuesIn(GoldenFiles(kModelGoldens)),
                         TestName);

// Layout search and one fixed layout (docs/layouts.md); the same commands as
// scripts/regen-golden.sh.
struct LayoutGolden {
  const char* file;
  const char* args;
};
constexpr LayoutGolden kLayoutGoldens[] = {
    {"gpt3-medium-moe.v100-8x8.search.json",
     "--model examples/models/gpt3-medium-moe.json --cluster v100-8x8 --search --gpus 32 --top 3 "
     "--variants none,dw"},
    {"qwen-moe-like.a100-8x8.layout.json",
     "--model examples/models/qwen-moe-like.json --cluster a100-8x8 "
     "--layout dp=16,tp=8,pp=8,ep=8,esp=1,microbatches=32,zero=1,pipeline=interleaved,v=2"},
    {"mixtral-8x7b-like.h200-8x8.layout.json",
     "--model examples/models/mixtral-8x7b-like.json --cluster h200-8x8 "
     "--layout dp=2,tp=8,pp=4,ep=8,esp=1,microbatches=16,family=ppmoe"},
};

TEST(Golden, LayoutJsonMatches) {
  for (const LayoutGolden& g : kLayoutGoldens) {
    CliResult r = RunCli(std::string("plan-model --format json ") + g.args);
    ASSERT_EQ(r.exit_code, 0) << g.file << ": " << r.err;
    v1::PlanModelResponse got, want;
    ASSERT_TRUE(proto::ParseJson(r.out, &got).ok());
    ASSERT_TRUE(
        proto::ParseJson(Slurp(MOEPLAN_SOURCE_DIR "/tests/golden/layouts/" + std::string(g.file)),
                         &want)
            .ok())
        << g.file;
    ExpectSame(want, got, std::string("layouts/") + g.file);
  }
}

}  // namespace
}  // namespace moeplan::testing
