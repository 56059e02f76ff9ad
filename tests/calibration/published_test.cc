// Published runs in the library (calibration/published.h): the summary's
// closed form and the stack calibration on the five A100 cases, in process
// (the CLI's tests run the whole dataset; these also run under ASan).
#include "moeplan/calibration/published.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace moeplan::calibration {
namespace {

std::vector<PublishedEntry> A100Cases(int n) {
  std::vector<PublishedEntry> out;
  for (const char* name : {"d2-gpt-1.7b-a100", "d2-gpt-7.5b-a100", "d2-gpt-39.1b-a100",
                           "d2-gpt-145.6b-a100", "d2-gpt-1008b-a100"}) {
    if (static_cast<int>(out.size()) == n) break;
    absl::StatusOr<std::vector<PublishedEntry>> one =
        ReadPublished(std::string(MOEPLAN_SOURCE_DIR "/calibration/published/") + name + ".json");
    EXPECT_TRUE(one.ok()) << one.status();
    if (one.ok()) out.push_back((*one)[0]);
  }
  return out;
}

// MAPE, nearest-rank p90, max and bias of four errors, by hand.
TEST(PublishedSummary, IsTheClosedForm) {
  const v1::PublishedSummary s = SummarizePublished("g", {-10.0, 5.0, 20.0, -2.0});
  EXPECT_EQ(s.group(), "g");
  EXPECT_EQ(s.cases(), 4);
  EXPECT_DOUBLE_EQ(s.mape_pct(), 37.0 / 4.0);
  EXPECT_DOUBLE_EQ(s.p90_abs_pct(), 20.0);  // ceil(0.9 * 4) = 4th of 2, 5, 10, 20
  EXPECT_DOUBLE_EQ(s.max_abs_pct(), 20.0);
  EXPECT_DOUBLE_EQ(s.bias_pct(), 13.0 / 4.0);
}

// One profile, no MoE case: the plateau of a100-8x8-hdr and the shared
// knee. The fit lowers the sum of squared log errors, and the written
// profile predicts the in-sample errors it reports.
TEST(StackFit, FitsThePlateauAndKneeOfTheA100Cases) {
  const std::vector<PublishedEntry> cases = A100Cases(5);
  ASSERT_EQ(cases.size(), 5u);
  StackFitOptions o;
  o.dataset = "d2";
  o.holdout = false;
  absl::StatusOr<StackFit> fit = FitPublished(cases, o);
  ASSERT_TRUE(fit.ok()) << fit.status();
  const v1::PublishedFitReport& r = fit->report;
  ASSERT_EQ(r.terms_size(), 2);
  EXPECT_EQ(r.terms(0).name(), "gemm_efficiency");
  EXPECT_EQ(r.terms(1).name(), "gemm_knee");
  EXPECT_EQ(r.fits(), 1);
  EXPECT_TRUE(r.holdout().empty());
  double spec = 0.0, fitted = 0.0;
  for (const v1::PublishedFitCase& c : r.cases()) {
    spec += std::pow(std::log1p(c.spec_error_pct() / 100.0), 2);
    fitted += std::pow(std::log1p(c.in_sample_error_pct() / 100.0), 2);
  }
  EXPECT_LT(fitted, spec);
  ASSERT_EQ(fit->profiles.size(), 1u);
  const v1::ClusterProfile& p = fit->profiles[0];
  EXPECT_EQ(p.name(), "a100-8x8-hdr");
  EXPECT_EQ(p.published_fit().cases_size(), 5);
  EXPECT_EQ(p.published_fit().dataset(), "d2");
  // The grid is the curve of the fitted terms: its largest shape's entry.
  const double e = r.terms(0).value(), k = r.terms(1).value();
  const v1::GemmModel& g = p.gemm();
  const double top = g.m(g.m_size() - 1);
  EXPECT_NEAR(g.efficiency(g.efficiency_size() - 1),
              e * top / (top + k) * top / (top + k) * top / (top + k / 2.0), 1e-12);
  PublishedProfiles profiles;
  ASSERT_TRUE(profiles.Set(p).ok());
  absl::StatusOr<v1::PublishedReport> again = PredictAllPublished(cases, false, profiles);
  ASSERT_TRUE(again.ok()) << again.status();
  for (int i = 0; i < 5; ++i) {
    EXPECT_NEAR(again->cases(i).error_pct(), r.cases(i).in_sample_error_pct(), 1e-9);
  }
}

TEST(StackFit, RefusesFewerCasesThanTheTermsNeed) {
  const std::vector<PublishedEntry> cases = A100Cases(3);
  StackFitOptions o;
  o.holdout = false;
  EXPECT_TRUE(FitPublished(cases, o).ok());  // 2 terms, 3 cases
  o.holdout = true;
  absl::StatusOr<StackFit> fit = FitPublished(cases, o);
  EXPECT_EQ(fit.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fit.status().message(),
            "--published: 3 cases fit 2 terms poorly: give at least 4 (one more than the terms, "
            "and one to hold out)");
}

}  // namespace
}  // namespace moeplan::calibration
