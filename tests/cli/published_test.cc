// `moeplan validate --published` and `calibrate --published`: the dataset of
// published training runs (calibration/published) predicted case by case, the
// conversions between the sources' conventions, bad cases refused naming the
// field, and the stack calibration in sample and held out.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "moeplan/proto/json.h"
#include "moeplan/v1/published.pb.h"
#include "run_cli.h"

namespace moeplan::testing {
namespace {

v1::PublishedReport Report(const std::string& dataset) {
  const CliResult r = RunCli("validate --published " + dataset + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  v1::PublishedReport report;
  const absl::Status st = proto::ParseJson(r.out, &report);
  EXPECT_TRUE(st.ok()) << st << "\n" << r.out;
  return report;
}

// Every case of the dataset is predicted at its own layout, on its own
// profile; the summaries count the families.
TEST(PublishedCli, EveryCaseOfTheDatasetIsPredicted) {
  const v1::PublishedReport report = Report("calibration/published");
  ASSERT_EQ(report.cases_size(), 14);
  std::map<std::string, const v1::PublishedCase*> by_name;
  for (const v1::PublishedCase& c : report.cases()) {
    by_name[c.name()] = &c;
    EXPECT_GT(c.predicted_tflops_per_gpu(), 0.0) << c.name();
    EXPECT_TRUE(std::isfinite(c.error_pct())) << c.name();
    EXPECT_NEAR(c.error_pct(),
                100.0 * (c.predicted_tflops_per_gpu() / c.published_tflops_per_gpu() - 1.0), 1e-9);
    EXPECT_GT(c.predicted().iteration_us(), 0.0) << c.name();
    EXPECT_FALSE(c.source().empty()) << c.name();
    // Recomputation: full runs each micro-batch's forward again (the
    // busiest stage's forwards, m of them); selective less; none nothing.
    const v1::Layout& l = c.predicted().layout();
    if (l.recompute()) {
      EXPECT_NEAR(c.predicted().recompute_us(), l.microbatches() * c.predicted().stage_forward_us(),
                  1e-9 * c.predicted().iteration_us())
          << c.name();
    } else if (l.recompute_modules_size() > 0) {
      EXPECT_GT(c.predicted().recompute_us(), 0.0) << c.name();
      EXPECT_LT(c.predicted().recompute_us(), l.microbatches() * c.predicted().stage_forward_us())
          << c.name();
    } else {
      EXPECT_EQ(c.predicted().recompute_us(), 0.0) << c.name();
    }
  }
  // The 2021 paper's eq. 3 counts the recomputed forward: 137 hardware
  // TFLOP/s are 3/4 of that in the model convention.
  ASSERT_TRUE(by_name.count("d2-gpt-1.7b-a100"));
  EXPECT_DOUBLE_EQ(by_name["d2-gpt-1.7b-a100"]->published_tflops_per_gpu(), 137.0 * 0.75);
  EXPECT_EQ(by_name["d2-gpt-1.7b-a100"]->gpus(), 32);
  ASSERT_TRUE(by_name.count("m2-deepseek-v3-h100"));
  EXPECT_EQ(by_name["m2-deepseek-v3-h100"]->family(), "moe");
  EXPECT_EQ(by_name["m2-deepseek-v3-h100"]->gpus(), 1024);
  std::map<std::string, int> counts;
  for (const v1::PublishedSummary& s : report.summaries()) counts[s.group()] = s.cases();
  EXPECT_EQ(counts["all"], 14);
  EXPECT_EQ(counts["dense"], 9);
  EXPECT_EQ(counts["moe"], 5);
  EXPECT_EQ(counts["a100-8x8-hdr"], 5);
  EXPECT_EQ(counts["h100-8x8"], 9);
}

// The source states DeepSeek-V3's run both ways: 368 TFLOP/s/GPU and 1,412
// tokens/s/GPU (260.6 GFLOP per token). Given in tokens/s, the case converts
// with moeplan's own FLOP count, which must land on the same TFLOP/s.
TEST(PublishedCli, TokensPerSecondConvertWithTheModelsFlops) {
  TempDir tmp;
  std::string text = Slurp(MOEPLAN_SOURCE_DIR "/calibration/published/m2-deepseek-v3-h100.json");
  const std::string tflops = R"("value": 368,)";
  const size_t at = text.find(tflops);
  ASSERT_NE(at, std::string::npos);
  text.replace(at, tflops.size(), R"("value": 1412,)");
  const std::string unit = R"("unit": "tflops_per_gpu",)";
  text.replace(text.find(unit), unit.size(), R"("unit": "tokens_per_second_per_gpu",)");
  const std::string flops = R"("flops": "model")";
  text.replace(text.find(flops), flops.size(), R"("flops": "")");
  const std::string hf = "../../examples/hf/deepseek-v3/config.json";
  text.replace(text.find(hf), hf.size(), MOEPLAN_SOURCE_DIR "/examples/hf/deepseek-v3/config.json");
  tmp.Write("m2-deepseek-v3-h100.json", text);
  const v1::PublishedReport report = Report(tmp.path());
  ASSERT_EQ(report.cases_size(), 1);
  EXPECT_NEAR(report.cases(0).published_tflops_per_gpu(), 368.0, 368.0 * 0.01);
}

// The cases of one comparison are ranked both ways (Mixtral-8x22B: the
// folded expert grid measured faster than the tied one), and --search
// reports the best layout it predicts for a case's model and GPUs.
TEST(PublishedCli, RanksComparisonsAndSearches) {
  TempDir tmp;
  for (const char* name : {"m5-mixtral-8x22b-folded-h100", "m5-mixtral-8x22b-tied-h100"}) {
    std::string text =
        Slurp(std::string(MOEPLAN_SOURCE_DIR "/calibration/published/") + name + ".json");
    const std::string hf = "../../examples/hf/mixtral-8x22b/config.json";
    text.replace(text.find(hf), hf.size(),
                 MOEPLAN_SOURCE_DIR "/examples/hf/mixtral-8x22b/config.json");
    tmp.Write(std::string(name) + ".json", text);
  }
  const CliResult r = RunCli("validate --published " + tmp.path() + " --search --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  v1::PublishedReport report;
  ASSERT_TRUE(proto::ParseJson(r.out, &report).ok()) << r.out;
  ASSERT_EQ(report.rankings_size(), 1);
  const v1::PublishedRanking& k = report.rankings(0);
  EXPECT_EQ(k.comparison(), "m5-mixtral-8x22b-128-h100");
  ASSERT_EQ(k.published_order_size(), 2);
  EXPECT_EQ(k.published_order(0), "m5-mixtral-8x22b-folded-h100");
  EXPECT_TRUE(k.same()) << "the planner ranks the tied grid first";
  for (const v1::PublishedCase& c : report.cases()) {
    EXPECT_TRUE(c.has_searched()) << c.name();
    EXPECT_EQ(c.searched().layout().dp() * c.searched().layout().tp() * c.searched().layout().pp() *
                  std::max(1, c.searched().layout().cp()),
              128)
        << c.searched_layout();
    EXPECT_NEAR(c.searched_gain_pct(),
                100.0 * (c.searched().tflops_per_gpu() / c.predicted_tflops_per_gpu() - 1.0), 1e-9);
  }
}

// --profile-overrides: a profile file takes the place of the built-in one of
// its name (here the H100's with half the GEMM peak: its cases predict slower,
// the A100's do not move); two files naming one profile are refused.
TEST(PublishedCli, ProfileOverridesReplaceTheBuiltins) {
  TempDir tmp;
  std::string profile = RunCli("profiles show h100-8x8").out;
  const std::string peak = R"("peak_tflops": 989.5,)";
  const size_t at = profile.find(peak);
  ASSERT_NE(at, std::string::npos) << profile.substr(0, 400);
  profile.replace(at, peak.size(), R"("peak_tflops": 494.75,)");
  const std::string file = tmp.Write("h100.json", profile);
  const v1::PublishedReport base = Report("calibration/published");
  const v1::PublishedReport slow = Report("calibration/published --profile-overrides " + file);
  ASSERT_EQ(base.cases_size(), slow.cases_size());
  for (int i = 0; i < base.cases_size(); ++i) {
    const double ratio =
        slow.cases(i).predicted_tflops_per_gpu() / base.cases(i).predicted_tflops_per_gpu();
    if (base.cases(i).profile() == "h100-8x8") {
      EXPECT_LT(ratio, 0.9) << base.cases(i).name();
    } else {
      EXPECT_DOUBLE_EQ(ratio, 1.0) << base.cases(i).name();
    }
  }
  const CliResult twice =
      RunCli("validate --published calibration/published --profile-overrides " + file + "," + file);
  EXPECT_EQ(twice.exit_code, 1);
  EXPECT_NE(twice.err.find("--profile-overrides: "), std::string::npos) << twice.err;
}

// validate --published --out-dir: the Markdown and JSON reports and the plot's
// data (one block per family, published and predicted TFLOP/s per case).
TEST(PublishedCli, OutDirHoldsTheReportsAndThePlot) {
  TempDir tmp;
  const CliResult r =
      RunCli("validate --published calibration/published --out-dir " + tmp.path() + "/out");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string md = Slurp(tmp.path() + "/out/report.md");
  EXPECT_NE(md.find("| d2-gpt-1.7b-a100 | dense | 32 |"), std::string::npos) << md;
  v1::PublishedReport report;
  ASSERT_TRUE(proto::ParseJson(Slurp(tmp.path() + "/out/report.json"), &report).ok());
  ASSERT_EQ(report.cases_size(), 14);
  const std::string data = Slurp(tmp.path() + "/out/plot.dat");
  EXPECT_NE(data.find("# one block per series (gnuplot index 0, 1, ...): dense moe"),
            std::string::npos)
      << data;
  for (const v1::PublishedCase& c : report.cases()) {
    EXPECT_NE(
        data.find(fmt::format("{} {:.6g} {:.6g} \"{}\"", c.family(), c.published_tflops_per_gpu(),
                              c.predicted_tflops_per_gpu(), c.name())),
        std::string::npos)
        << c.name();
  }
}

// The five A100 cases alone (one profile, all dense): two terms, the GEMM
// plateau of a100-8x8-hdr and the shared knee; no permutation term without
// an MoE case. Each case held out once (five more fits). The profile written
// is the spec one with those terms, says what it was fitted on, and
// predicts the in-sample errors the report gives.
TEST(PublishedCli, CalibrateFitsTheStackTermsAndHoldsEachCaseOut) {
  TempDir tmp, dataset;
  for (const char* name : {"d2-gpt-1.7b-a100", "d2-gpt-7.5b-a100", "d2-gpt-39.1b-a100",
                           "d2-gpt-145.6b-a100", "d2-gpt-1008b-a100"}) {
    dataset.Write(
        std::string(name) + ".json",
        Slurp(std::string(MOEPLAN_SOURCE_DIR "/calibration/published/") + name + ".json"));
  }
  const std::string cases = dataset.path(), out = tmp.path() + "/fitted";
  const CliResult r = RunCli("calibrate --published " + cases + " --out-dir " + out + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  v1::PublishedFitReport report;
  ASSERT_TRUE(proto::ParseJson(r.out, &report).ok()) << r.out;
  ASSERT_EQ(report.terms_size(), 2);
  EXPECT_EQ(report.terms(0).name(), "gemm_efficiency");
  EXPECT_EQ(report.terms(0).profile(), "a100-8x8-hdr");
  EXPECT_NEAR(report.terms(0).spec_value(), 0.8, 1e-3);  // from the rounded grid
  EXPECT_EQ(report.terms(1).name(), "gemm_knee");
  EXPECT_NEAR(report.terms(1).spec_value(), 128.0, 1e-9);
  for (const v1::StackTerm& t : report.terms()) EXPECT_FALSE(t.why().empty()) << t.name();
  EXPECT_EQ(report.fits(), 6);
  ASSERT_EQ(report.cases_size(), 5);
  ASSERT_FALSE(report.spec().empty());
  ASSERT_FALSE(report.in_sample().empty());
  ASSERT_FALSE(report.holdout().empty());
  EXPECT_EQ(report.spec(0).group(), "all");
  // Least squares on log errors: the fit is no worse than where it started.
  double spec_sq = 0.0, fit_sq = 0.0;
  for (const v1::PublishedFitCase& c : report.cases()) {
    spec_sq += std::pow(std::log1p(c.spec_error_pct() / 100.0), 2);
    fit_sq += std::pow(std::log1p(c.in_sample_error_pct() / 100.0), 2);
    EXPECT_NE(c.holdout_error_pct(), c.in_sample_error_pct()) << c.name();
    ASSERT_EQ(c.holdout_terms_size(), 2) << c.name();  // the terms fitted without it
    EXPECT_EQ(c.holdout_terms(0).name(), "gemm_efficiency");
    EXPECT_NE(c.holdout_terms(0).value(), report.terms(0).value()) << c.name();
  }
  EXPECT_LT(fit_sq, spec_sq);
  // The profile: the spec one's next version, calibrated, saying on what.
  const std::string file = out + "/a100-8x8-hdr.json";
  v1::ClusterProfile profile;
  ASSERT_TRUE(proto::ParseJson(Slurp(file), &profile).ok());
  EXPECT_EQ(profile.name(), "a100-8x8-hdr");
  EXPECT_EQ(profile.version(), 2u);
  EXPECT_EQ(profile.source(), v1::PROFILE_SOURCE_SPEC);
  ASSERT_EQ(profile.published_fit().cases_size(), 5);
  EXPECT_EQ(profile.published_fit().dataset(), cases);
  EXPECT_EQ(profile.published_fit().terms_size(), 2);
  EXPECT_DOUBLE_EQ(profile.published_fit().holdout_mape_pct(), report.holdout(0).mape_pct());
  EXPECT_NE(profile.comment().find("Calibrated to a software stack on 5 published runs"),
            std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(out + "/fit.dat"));
  // Predicting with it gives the report's in-sample errors.
  const v1::PublishedReport again = Report(cases + " --profile-overrides " + file);
  ASSERT_EQ(again.cases_size(), 5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(again.cases(i).name(), report.cases(i).name());
    EXPECT_NEAR(again.cases(i).error_pct(), report.cases(i).in_sample_error_pct(), 1e-9);
  }
}

// The refusals: too few cases for the terms and a hold-out, the output
// directory over the dataset, --samples' flags.
TEST(PublishedCli, CalibrateRefusesWhatItCannotFit) {
  TempDir tmp, dataset;
  for (const char* name : {"d2-gpt-1.7b-a100", "d2-gpt-7.5b-a100", "d2-gpt-39.1b-a100"}) {
    dataset.Write(
        std::string(name) + ".json",
        Slurp(std::string(MOEPLAN_SOURCE_DIR "/calibration/published/") + name + ".json"));
  }
  const std::string cases = dataset.path();
  CliResult r = RunCli("calibrate --published " + cases);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--published: 3 cases fit 2 terms poorly: give at least 4 (one more than "
                       "the terms, and one to hold out)"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  r = RunCli("calibrate --published " + cases + " --no-holdout --out-dir " + cases);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--out-dir: must not be the --published directory"), std::string::npos)
      << r.err;
  r = RunCli("calibrate --published " + cases + " --no-holdout --out x.json");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--out: not used with --published"), std::string::npos) << r.err;
  r = RunCli("calibrate --published " + cases + " --samples s.jsonl");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_FALSE(std::filesystem::exists(tmp.path() + "/fitted"));
}

// The whole dataset: the terms fitted on it predict each case held out
// within the issue's bounds (MAPE <= 10 %, none beyond 20 %), dense and MoE
// both reported, and no worse in sample than on the spec profiles.
TEST(PublishedCli, StackCalibrationOfTheDatasetHoldsOut) {
  const CliResult r = RunCli("calibrate --published calibration/published --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  v1::PublishedFitReport report;
  ASSERT_TRUE(proto::ParseJson(r.out, &report).ok()) << r.out;
  ASSERT_EQ(report.cases_size(), 14);
  std::map<std::string, const v1::PublishedSummary*> held, spec, in;
  for (const v1::PublishedSummary& s : report.holdout()) held[s.group()] = &s;
  for (const v1::PublishedSummary& s : report.spec()) spec[s.group()] = &s;
  for (const v1::PublishedSummary& s : report.in_sample()) in[s.group()] = &s;
  ASSERT_TRUE(held.count("all") && held.count("dense") && held.count("moe"));
  EXPECT_LE(held["all"]->mape_pct(), 10.0);
  EXPECT_LE(held["all"]->max_abs_pct(), 20.0);
  EXPECT_LT(in["all"]->mape_pct(), spec["all"]->mape_pct());
  std::set<std::string> names;
  for (const v1::StackTerm& t : report.terms()) names.insert(t.name() + "/" + t.profile());
  EXPECT_EQ(names,
            (std::set<std::string>{"gemm_efficiency/a100-8x8-hdr", "gemm_efficiency/h100-8x8",
                                   "gemm_knee/", "permute_efficiency/"}));
}

struct BadCase {
  const char* name;
  const char* edit_from;  // replaced in d2-gpt-1.7b-a100.json
  const char* edit_to;
  const char* error;
};

class PublishedBadCase : public ::testing::TestWithParam<BadCase> {};

TEST_P(PublishedBadCase, RefusedNamingTheField) {
  const BadCase& c = GetParam();
  TempDir tmp;
  std::string text = Slurp(MOEPLAN_SOURCE_DIR "/calibration/published/d2-gpt-1.7b-a100.json");
  const size_t at = text.find(c.edit_from);
  ASSERT_NE(at, std::string::npos) << c.edit_from;
  text.replace(at, std::string(c.edit_from).size(), c.edit_to);
  const std::string file = tmp.Write("d2-gpt-1.7b-a100.json", text);
  const CliResult r = RunCli("validate --published " + file);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_NE(r.err.find(c.error), std::string::npos) << r.err;
}

INSTANTIATE_TEST_SUITE_P(
    Fields, PublishedBadCase,
    ::testing::Values(
        BadCase{"unit", R"("unit": "tflops_per_gpu")", R"("unit": "mfu")",
                "measured.unit: must be"},
        BadCase{"flops", R"("flops": "hardware")", R"("flops": "peak")",
                "measured.flops: must be model or hardware"},
        BadCase{"hardware without recomputation", ",recompute=1", "",
                "measured.flops: hardware FLOPs (the recomputed forward counted) need a layout"},
        BadCase{"value", R"("value": 137)", R"("value": -1)", "measured.value: must be"},
        BadCase{"name", R"("name": "d2-gpt-1.7b-a100")", R"("name": "other")",
                "name: must be the file's stem"},
        BadCase{"layout", "dp=32,", "dp=33,", "layout"},
        BadCase{"profile", R"("profile": "a100-8x8-hdr")", R"("profile": "nosuch")", "profile"},
        BadCase{"unknown field", R"("schema_version": 1,)", R"("schema_version": 1, "bogus": 2,)",
                "bogus"},
        BadCase{"source", R"("locator": "Table 1")", R"("locator": "")",
                "source: citation and locator are required"}),
    [](const ::testing::TestParamInfo<BadCase>& i) {
      std::string n = i.param.name;
      for (char& ch : n) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return n;
    });

}  // namespace
}  // namespace moeplan::testing
