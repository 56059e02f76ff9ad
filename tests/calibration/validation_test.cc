#include "moeplan/calibration/validation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "moeplan/base/strings.h"

namespace moeplan::calibration {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

v1::CandidatePlan Plan(v1::Schedule s, double total_us) {
  v1::CandidatePlan p;
  p.set_schedule(s);
  p.set_total_us(total_us);
  return p;
}

// A timed op on a layer's schedule (CandidatePlan) or a model's variant (VariantPlan).
template <typename Plan>
void AddOp(Plan* p, const std::string& name, double start_us, double end_us) {
  v1::OpTiming* op = p->add_ops();
  op->set_name(name);
  op->set_start_us(start_us);
  op->set_end_us(end_us);
}

ValidationInput Config(const std::string& name, std::vector<v1::CandidatePlan> measured,
                       std::vector<v1::CandidatePlan> predicted) {
  ValidationInput in;
  in.name = name;
  in.layer.set_name(name);
  in.layer.set_batch_size(4);
  in.measured = std::move(measured);
  in.predicted = std::move(predicted);
  return in;
}

// Two configs x three schedules, totals in us chosen so every error is exact:
//   config a: default 1000 -> 1100 (+10 %), s1 800 -> 760 (-5 %), s2 900 -> 720 (-20 %)
//             measured best s1, predicted best s2: a miss, regret 100*(900-800)/800 = 12.5 %
//   config b: default 2000 -> 2080 (+4 %), s1 2500 -> 2750 (+10 %), s2 1600 -> 1520 (-5 %)
//             measured best s2, predicted best s2: a hit, regret 0
// |errors| = 10 5 20 4 10 5: MAPE 54/6 = 9; sorted 4 5 5 10 10 20, p90 at rank
// 0.9*5 = 4.5 -> 10 + 0.5*(20-10) = 15; max 20 (a, s2); signed sum -6 -> mean -1.
// Selection: 1 of 2 -> 50 %; mean regret (12.5+0)/2 = 6.25; when wrong 12.5; max 12.5.
std::vector<ValidationInput> TwoByThree() {
  return {
      Config("a",
             {Plan(v1::SCHEDULE_DEFAULT, 1000), Plan(v1::SCHEDULE_S1, 800),
              Plan(v1::SCHEDULE_S2, 900)},
             {Plan(v1::SCHEDULE_S2, 720), Plan(v1::SCHEDULE_DEFAULT, 1100),
              Plan(v1::SCHEDULE_S1, 760)}),
      Config("b",
             {Plan(v1::SCHEDULE_DEFAULT, 2000), Plan(v1::SCHEDULE_S1, 2500),
              Plan(v1::SCHEDULE_S2, 1600)},
             {Plan(v1::SCHEDULE_DEFAULT, 2080), Plan(v1::SCHEDULE_S1, 2750),
              Plan(v1::SCHEDULE_S2, 1520)}),
  };
}

// Measured 1000 vs 1020 (2 % apart) is a near tie: missing it counts against
// the strict selection accuracy but not against the decisive one.
TEST(SummarizeTest, NearTiesAreNotDecisive) {
  std::vector<ValidationInput> in = TwoByThree();
  in.push_back(Config("tie", {Plan(v1::SCHEDULE_DEFAULT, 1000), Plan(v1::SCHEDULE_S1, 1020)},
                      {Plan(v1::SCHEDULE_DEFAULT, 1100), Plan(v1::SCHEDULE_S1, 1050)}));
  absl::StatusOr<v1::ValidationSummary> s = Summarize(in, "p", 4, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_NEAR(s->selection_accuracy_pct(), 100.0 / 3.0, 1e-9);
  EXPECT_EQ(s->decisive_configs(), 2);
  EXPECT_DOUBLE_EQ(s->selection_accuracy_decisive_pct(), 50.0);
  EXPECT_DOUBLE_EQ(s->results(2).regret_pct(), 2.0);
}

// Binomial(n, 1/2) tails by hand: P(X >= 10 | 10) = 1/1024, P(X >= 9) = 11/1024,
// P(X >= 8) = (1 + 10 + 45)/1024 = 56/1024; equal pairs are dropped.
TEST(SignTestTest, ExactBinomialTails) {
  const std::vector<double> ten(10, 1.0);
  EXPECT_NEAR(SignTestP(std::vector<double>(10, 2.0), ten), 1.0 / 1024, 1e-12);
  EXPECT_NEAR(SignTestP({2, 2, 2, 2, 2, 2, 2, 2, 2, 0}, ten), 11.0 / 1024, 1e-12);
  EXPECT_NEAR(SignTestP({2, 2, 2, 2, 2, 2, 2, 2, 0, 0}, ten), 56.0 / 1024, 1e-12);
  // Every pair faster: P(X >= 0) = 1.
  EXPECT_NEAR(SignTestP(std::vector<double>(10, 0.5), ten), 1.0, 1e-12);
  // Seven pairs, two equal: 5 of 5 slower -> 1/32.
  EXPECT_NEAR(SignTestP({2, 2, 2, 2, 2, 1, 1}, {1, 1, 1, 1, 1, 1, 1}), 1.0 / 32, 1e-12);
  EXPECT_DOUBLE_EQ(SignTestP({1, 1}, {1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(SignTestP({}, {}), 1.0);
}

v1::ScheduleIterations Iters(v1::Schedule s, std::vector<double> totals) {
  v1::ScheduleIterations it;
  it.set_schedule(s);
  for (double t : totals) it.add_total_us(t);
  return it;
}

// Paired iterations decide ties for best:
//   "near": s2 median 1000 < s1 median 1010 (the measured best is s2), but s1
//     is slower in only 4 of 6 pairs: P(X >= 4 | 6) = 22/64 > 0.05, tied. The
//     planner's pick s1 misses strictly and hits with ties counted.
//   "clear": s1 slower than s2 in all 6 pairs: P = 1/64 < 0.05, not tied;
//     the pick s1 misses both ways.
//   "unpaired": sequential iterations, no tie test: left out of the
//     ties-counted accuracy.
//   "few": paired but 4 iterations (fewer than 5): left out too.
TEST(SummarizeTest, PairedIterationsDecideTiesForBest) {
  ValidationInput near = Config("near", {Plan(v1::SCHEDULE_S1, 1010), Plan(v1::SCHEDULE_S2, 1000)},
                                {Plan(v1::SCHEDULE_S1, 900), Plan(v1::SCHEDULE_S2, 950)});
  near.paired = true;
  near.iterations = {Iters(v1::SCHEDULE_S1, {1010, 990, 1020, 1005, 1030, 980}),
                     Iters(v1::SCHEDULE_S2, {1000, 1000, 1000, 1000, 1000, 1000})};
  ValidationInput clear = near;
  clear.name = "clear";
  clear.iterations[0] = Iters(v1::SCHEDULE_S1, {1010, 1001, 1020, 1005, 1030, 1002});
  ValidationInput unpaired = near;
  unpaired.name = "unpaired";
  unpaired.paired = false;
  ValidationInput few = near;
  few.name = "few";
  few.iterations = {Iters(v1::SCHEDULE_S1, {990, 1020, 1005, 980}),
                    Iters(v1::SCHEDULE_S2, {1000, 1000, 1000, 1000})};

  absl::StatusOr<v1::ValidationSummary> s = Summarize({near, clear, unpaired, few}, "p", 4, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_DOUBLE_EQ(s->selection_accuracy_pct(), 0.0);
  EXPECT_DOUBLE_EQ(s->tie_alpha(), 0.05);
  EXPECT_EQ(s->min_paired_iterations(), 5);
  EXPECT_EQ(s->paired_configs(), 2);
  EXPECT_EQ(s->tied_configs(), 1);
  EXPECT_DOUBLE_EQ(s->selection_accuracy_tied_pct(), 50.0);
  ASSERT_EQ(s->results_size(), 4);
  EXPECT_EQ(s->results(0).measured_best(), v1::SCHEDULE_S2);
  EXPECT_THAT(s->results(0).measured_tied(),
              ::testing::ElementsAre(v1::SCHEDULE_S1, v1::SCHEDULE_S2));
  EXPECT_THAT(s->results(1).measured_tied(), ::testing::ElementsAre(v1::SCHEDULE_S2));
  EXPECT_TRUE(s->results(2).measured_tied().empty());
  EXPECT_TRUE(s->results(3).measured_tied().empty());

  const std::string md = RenderMarkdown(*s, ReportContext{});
  EXPECT_THAT(md, HasSubstr("| selection accuracy, ties for best counted | 50.0 % (1 of 2 "
                            "configs; 1 with a tie) |"));
  EXPECT_THAT(md, HasSubstr("one-sided exact sign test"));
  // Misses list what was tied; the unpaired config says it cannot tell.
  EXPECT_THAT(md, HasSubstr("| near | s1 | s2 | 1.0 | s1 s2 |"));
  EXPECT_THAT(md, HasSubstr("| clear | s1 | s2 | 1.0 | s2 |"));
  EXPECT_THAT(md, HasSubstr("| unpaired | s1 | s2 | 1.0 | – |"));
}

TEST(SummarizeTest, RejectsBadPairedIterations) {
  ValidationInput in = Config("c", {Plan(v1::SCHEDULE_S1, 1010), Plan(v1::SCHEDULE_S2, 1000)},
                              {Plan(v1::SCHEDULE_S1, 900), Plan(v1::SCHEDULE_S2, 950)});
  in.paired = true;
  in.iterations = {Iters(v1::SCHEDULE_S1, {1, 2, 3, 4, 5}), Iters(v1::SCHEDULE_S2, {1, 2, 3, 4})};
  absl::StatusOr<v1::ValidationSummary> s = Summarize({in}, "p", 4, 2);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      s.status().message(),
      HasSubstr("config 'c', schedule s2: 4 paired iterations where another schedule has 5"));

  in.iterations = {Iters(v1::SCHEDULE_S1, {1, 2, 3, 4, 5}),
                   Iters(v1::SCHEDULE_S2, {1, 2, std::nan(""), 4, 5})};
  s = Summarize({in}, "p", 4, 2);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("iteration totals must be finite and > 0"));

  in.iterations = {Iters(v1::SCHEDULE_S1, {1, 2, 3, 4, 5}),
                   Iters(v1::SCHEDULE_S1, {1, 2, 3, 4, 5})};
  s = Summarize({in}, "p", 4, 2);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("schedule s1: iterations listed twice"));

  // Not paired: no tie test (the noise floor takes the first list of s1).
  in.paired = false;
  EXPECT_TRUE(Summarize({in}, "p", 4, 2).ok());
}

TEST(SummarizeTest, TwoConfigsThreeSchedulesHandComputed) {
  absl::StatusOr<v1::ValidationSummary> s = Summarize(TwoByThree(), "h200", 8, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->profile(), "h200");
  EXPECT_EQ(s->ranks(), 8);
  EXPECT_EQ(s->hosts(), 2);
  EXPECT_EQ(s->configs(), 2);
  EXPECT_EQ(s->points(), 6);
  EXPECT_DOUBLE_EQ(s->mape_pct(), 9.0);
  EXPECT_DOUBLE_EQ(s->p90_pct(), 15.0);
  EXPECT_DOUBLE_EQ(s->max_pct(), 20.0);
  EXPECT_EQ(s->worst_config(), "a");
  EXPECT_EQ(s->worst_schedule(), v1::SCHEDULE_S2);
  EXPECT_DOUBLE_EQ(s->mean_signed_pct(), -1.0);
  EXPECT_DOUBLE_EQ(s->selection_accuracy_pct(), 50.0);
  EXPECT_DOUBLE_EQ(s->mean_regret_pct(), 6.25);
  EXPECT_DOUBLE_EQ(s->mean_regret_when_wrong_pct(), 12.5);
  EXPECT_DOUBLE_EQ(s->max_regret_pct(), 12.5);
  // Both configs are decisive: a's runner-up (s2, 900) is 12.5 % behind s1,
  // b's (default, 2000) 25 % behind s2.
  EXPECT_DOUBLE_EQ(s->decisive_margin_pct(), 5.0);
  EXPECT_EQ(s->decisive_configs(), 2);
  EXPECT_DOUBLE_EQ(s->selection_accuracy_decisive_pct(), 50.0);
  EXPECT_EQ(s->ops_size(), 0);
  EXPECT_EQ(s->unmatched_ops(), 0);

  ASSERT_EQ(s->results_size(), 2);
  const v1::ValidationConfig& a = s->results(0);
  EXPECT_EQ(a.name(), "a");
  EXPECT_EQ(a.layer().batch_size(), 4);
  // Points in schedule order, whatever order the inputs came in.
  ASSERT_EQ(a.points_size(), 3);
  EXPECT_EQ(a.points(0).schedule(), v1::SCHEDULE_DEFAULT);
  EXPECT_DOUBLE_EQ(a.points(0).measured_us(), 1000);
  EXPECT_DOUBLE_EQ(a.points(0).predicted_us(), 1100);
  EXPECT_DOUBLE_EQ(a.points(0).error_pct(), 10.0);
  EXPECT_EQ(a.points(2).schedule(), v1::SCHEDULE_S2);
  EXPECT_DOUBLE_EQ(a.points(2).error_pct(), -20.0);
  EXPECT_EQ(a.measured_best(), v1::SCHEDULE_S1);
  EXPECT_EQ(a.predicted_best(), v1::SCHEDULE_S2);
  EXPECT_DOUBLE_EQ(a.regret_pct(), 12.5);
  const v1::ValidationConfig& b = s->results(1);
  EXPECT_EQ(b.measured_best(), v1::SCHEDULE_S2);
  EXPECT_EQ(b.predicted_best(), v1::SCHEDULE_S2);
  EXPECT_DOUBLE_EQ(b.regret_pct(), 0.0);
}

// One config, schedule s2, durations (end - start) in us:
//   op                              measured  predicted  error
//   fwd.gate                        100       110        +10 %
//   fwd.saa_dispatch.alltoall.1     100        80        -20 %
//   fwd.saa_dispatch.alltoall.2     200       220        +10 %
//   fwd.expert                      600       540        -10 %
//   fwd.idle                          0         5        skipped (measured 0)
//   fwd.only_measured                50         -        unmatched
// Matched measured time 1000: expert 60 %, alltoall (steps pooled) 30 %, gate 10 %.
// alltoall: |errors| 10 20 -> MAPE 15, p90 at rank 0.9 -> 10 + 0.9*10 = 19, signed -5.
TEST(SummarizeTest, OpErrorsPoolStepsAndComputeShares) {
  v1::CandidatePlan m = Plan(v1::SCHEDULE_S2, 1000);
  AddOp(&m, "fwd.gate", 0, 100);
  AddOp(&m, "fwd.saa_dispatch.alltoall.1", 100, 200);
  AddOp(&m, "fwd.saa_dispatch.alltoall.2", 200, 400);
  AddOp(&m, "fwd.expert", 400, 1000);
  AddOp(&m, "fwd.idle", 50, 50);
  AddOp(&m, "fwd.only_measured", 0, 50);
  v1::CandidatePlan p = Plan(v1::SCHEDULE_S2, 950);
  AddOp(&p, "fwd.expert", 410, 950);
  AddOp(&p, "fwd.saa_dispatch.alltoall.2", 190, 410);
  AddOp(&p, "fwd.saa_dispatch.alltoall.1", 110, 190);
  AddOp(&p, "fwd.gate", 0, 110);
  AddOp(&p, "fwd.idle", 0, 5);
  AddOp(&p, "fwd.only_predicted", 0, 5);

  absl::StatusOr<v1::ValidationSummary> s = Summarize({Config("c", {m}, {p})}, "x", 4, 1);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->ops_size(), 3);
  EXPECT_EQ(s->ops(0).op(), "fwd.expert");
  EXPECT_EQ(s->ops(0).count(), 1);
  EXPECT_DOUBLE_EQ(s->ops(0).measured_share_pct(), 60.0);
  EXPECT_DOUBLE_EQ(s->ops(0).mape_pct(), 10.0);
  EXPECT_DOUBLE_EQ(s->ops(0).mean_signed_pct(), -10.0);

  EXPECT_EQ(s->ops(1).op(), "fwd.saa_dispatch.alltoall");
  EXPECT_EQ(s->ops(1).count(), 2);
  EXPECT_DOUBLE_EQ(s->ops(1).measured_share_pct(), 30.0);
  EXPECT_DOUBLE_EQ(s->ops(1).mape_pct(), 15.0);
  EXPECT_NEAR(s->ops(1).p90_pct(), 19.0, 1e-12);
  EXPECT_DOUBLE_EQ(s->ops(1).mean_signed_pct(), -5.0);

  EXPECT_EQ(s->ops(2).op(), "fwd.gate");
  EXPECT_DOUBLE_EQ(s->ops(2).measured_share_pct(), 10.0);
  EXPECT_DOUBLE_EQ(s->ops(2).mean_signed_pct(), 10.0);

  EXPECT_EQ(s->unmatched_ops(), 1);
  // The total error is independent of the ops: 100 * (950 - 1000) / 1000.
  EXPECT_DOUBLE_EQ(s->mape_pct(), 5.0);
}

// Only a trailing ".<digits>" is a step: other dots and digits stay.
TEST(SummarizeTest, OpGroupingStripsOnlyTrailingStepNumbers) {
  v1::CandidatePlan m = Plan(v1::SCHEDULE_S1, 100);
  AddOp(&m, "bwd.w2", 0, 10);
  AddOp(&m, "bwd.saa.a2a.12", 10, 40);
  AddOp(&m, "bwd.saa.a2a.3", 40, 100);
  v1::CandidatePlan p = m;
  absl::StatusOr<v1::ValidationSummary> s = Summarize({Config("c", {m}, {p})}, "x", 4, 1);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->ops_size(), 2);
  EXPECT_EQ(s->ops(0).op(), "bwd.saa.a2a");
  EXPECT_EQ(s->ops(0).count(), 2);
  EXPECT_DOUBLE_EQ(s->ops(0).measured_share_pct(), 90.0);
  EXPECT_EQ(s->ops(1).op(), "bwd.w2");
  EXPECT_DOUBLE_EQ(s->ops(1).mape_pct(), 0.0);
}

// default measured only, s2 predicted only: both skipped; s1 pairs. A config
// with one paired schedule has no choice, so it is left out of selection.
TEST(SummarizeTest, SkipsSchedulesMissingOnOneSide) {
  std::vector<ValidationInput> in = {
      Config("one", {Plan(v1::SCHEDULE_DEFAULT, 100), Plan(v1::SCHEDULE_S1, 200)},
             {Plan(v1::SCHEDULE_S1, 300), Plan(v1::SCHEDULE_S2, 50)}),
  };
  absl::StatusOr<v1::ValidationSummary> s = Summarize(in, "x", 4, 1);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->points(), 1);
  ASSERT_EQ(s->results(0).points_size(), 1);
  EXPECT_EQ(s->results(0).points(0).schedule(), v1::SCHEDULE_S1);
  EXPECT_DOUBLE_EQ(s->mape_pct(), 50.0);  // 100 * (300 - 200) / 200
  EXPECT_EQ(s->results(0).measured_best(), v1::SCHEDULE_S1);
  EXPECT_EQ(s->results(0).predicted_best(), v1::SCHEDULE_S1);
  // No config with a choice: selection statistics stay 0 and the report says so.
  EXPECT_DOUBLE_EQ(s->selection_accuracy_pct(), 0.0);
  EXPECT_DOUBLE_EQ(s->mean_regret_pct(), 0.0);
  const std::string md = RenderMarkdown(*s, {});
  EXPECT_THAT(md, HasSubstr("| selection accuracy | not measured |"));
  EXPECT_THAT(md, HasSubstr("Selection was not measured"));
}

// Adding a one-schedule config to TwoByThree leaves the selection numbers of
// the two configs that had a choice alone.
TEST(SummarizeTest, SingleScheduleConfigsAreLeftOutOfSelection) {
  std::vector<ValidationInput> in = TwoByThree();
  in.push_back(Config("single", {Plan(v1::SCHEDULE_S1, 100)}, {Plan(v1::SCHEDULE_S1, 100)}));
  absl::StatusOr<v1::ValidationSummary> s = Summarize(in, "x", 4, 1);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->configs(), 3);
  EXPECT_EQ(s->points(), 7);
  EXPECT_DOUBLE_EQ(s->selection_accuracy_pct(), 50.0);
  EXPECT_DOUBLE_EQ(s->mean_regret_pct(), 6.25);
  EXPECT_THAT(RenderMarkdown(*s, {}),
              HasSubstr("1 config with a single schedule both measured and predicted is left out "
                        "of the selection statistics"));
}

TEST(SummarizeTest, RejectsBadInput) {
  absl::StatusOr<v1::ValidationSummary> s = Summarize({}, "x", 4, 1);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);

  s = Summarize({Config("lonely", {Plan(v1::SCHEDULE_S1, 100)}, {Plan(v1::SCHEDULE_S2, 100)})}, "x",
                4, 1);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("'lonely'"));
  EXPECT_THAT(s.status().message(), HasSubstr("no schedule is both measured and predicted"));

  s = Summarize({Config("zero", {Plan(v1::SCHEDULE_S1, 0)}, {Plan(v1::SCHEDULE_S1, 100)})}, "x", 4,
                1);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("'zero', schedule s1: measured total_us"));

  s = Summarize({Config("neg", {Plan(v1::SCHEDULE_S1, -5)}, {Plan(v1::SCHEDULE_S1, 100)})}, "x", 4,
                1);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);

  s = Summarize({Config("twice", {Plan(v1::SCHEDULE_S1, 1), Plan(v1::SCHEDULE_S1, 2)},
                        {Plan(v1::SCHEDULE_S1, 1)})},
                "x", 4, 1);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("schedule s1 measured twice"));
}

TEST(RenderMarkdownTest, ShowsSummaryMissesAndEveryConfig) {
  absl::StatusOr<v1::ValidationSummary> s = Summarize(TwoByThree(), "h200", 8, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  ReportContext ctx;
  ctx.command = "mpirun -np 8 moeplan-exec --json --schedule all";
  ctx.plot_file = "validation.png";
  ctx.profile_comment = "spec sheet numbers";
  const std::string md = RenderMarkdown(*s, ctx);

  EXPECT_THAT(md, HasSubstr("# moeplan validation: h200\n"));
  EXPECT_THAT(md, HasSubstr("8 ranks on 2 hosts"));
  EXPECT_THAT(md, HasSubstr("spec sheet numbers"));
  EXPECT_THAT(md, HasSubstr("```\nmpirun -np 8 moeplan-exec --json --schedule all\n```\n"));
  EXPECT_THAT(md, HasSubstr("| configs | 2 |"));
  EXPECT_THAT(md, HasSubstr("| points (config × schedule) | 6 |"));
  EXPECT_THAT(md, HasSubstr("| MAPE | 9.0 % |"));
  EXPECT_THAT(md, HasSubstr("| p90 absolute error | 15.0 % |"));
  EXPECT_THAT(md, HasSubstr("| max absolute error | 20.0 % (a, s2) |"));
  EXPECT_THAT(md, HasSubstr("| mean signed error | -1.0 % |"));
  EXPECT_THAT(md, HasSubstr("| selection accuracy | 50.0 % (1 of 2 configs) |"));
  EXPECT_THAT(md, HasSubstr("| mean regret when wrong | 12.5 % |"));
  EXPECT_THAT(md, HasSubstr("| max regret | 12.5 % |"));
  EXPECT_THAT(md, HasSubstr("numpy"));
  EXPECT_THAT(md, HasSubstr("![predicted vs measured](validation.png)"));
  // Per schedule: s2 has -20 and -5 -> MAPE 12.5, p90 5 + 0.9*15 = 18.5, max 20, signed -12.5.
  EXPECT_THAT(md, HasSubstr("| s2 | 2 | 12.5 | 18.5 | 20.0 | -12.5 |"));
  // The miss: config a, predicted s2, measured s1, regret 12.5 %.
  EXPECT_THAT(md, HasSubstr("| a | s2 | s1 | 12.5 | – |"));
  EXPECT_THAT(md, HasSubstr("| selection accuracy, ties for best counted | – (no paired "
                            "iterations) |"));
  // Worst point first.
  EXPECT_THAT(md, HasSubstr("|---:|\n| a | s2 | 0.900 | 0.720 | -20.0 |"));
  // Every config, every schedule.
  EXPECT_THAT(md, HasSubstr("| a | 1.000 | 1.100 | +10.0 | 0.800 | 0.760 | -5.0 | 0.900 | 0.720 | "
                            "-20.0 | s1 | s2 | 12.5 | – |"));
  EXPECT_THAT(md, HasSubstr("| b | 2.000 | 2.080 | +4.0 | 2.500 | 2.750 | +10.0 | 1.600 | 1.520 | "
                            "-5.0 | s2 | s2 | 0.0 | – |"));
  EXPECT_THAT(md, HasSubstr("No measured op matched"));
}

TEST(RenderMarkdownTest, NoPlotLinkWithoutPlotFileAndFenceOutgrowsBackticks) {
  absl::StatusOr<v1::ValidationSummary> s = Summarize(TwoByThree(), "h200", 8, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  ReportContext ctx;
  ctx.command = "run ```x```";
  const std::string md = RenderMarkdown(*s, ctx);
  EXPECT_THAT(md, Not(HasSubstr("![predicted vs measured]")));
  ctx.plot_file = "my plot.png";
  EXPECT_THAT(RenderMarkdown(*s, ctx), HasSubstr("![predicted vs measured](<my plot.png>)"));
  EXPECT_THAT(md, HasSubstr("````\nrun ```x```\n````\n"));
}

TEST(PlotDataTest, OneBlockPerSchedule) {
  absl::StatusOr<v1::ValidationSummary> s = Summarize(TwoByThree(), "h200", 8, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string data = PlotData(*s);
  EXPECT_THAT(data, HasSubstr("# schedule measured_ms predicted_ms config_name\n"
                              "default 1 1.1 \"a\"\n"
                              "default 2 2.08 \"b\"\n"
                              "\n\n"
                              "s1 0.8 0.76 \"a\"\n"
                              "s1 2.5 2.75 \"b\"\n"
                              "\n\n"
                              "s2 0.9 0.72 \"a\"\n"
                              "s2 1.6 1.52 \"b\"\n"));
  EXPECT_EQ(data.substr(data.size() - 1), "\n");
  EXPECT_THAT(data, HasSubstr("index 0, 1, ...): default s1 s2\n"));
}

v1::VariantPlan Variant(const std::string& name, double iteration_us) {
  v1::VariantPlan v;
  v.set_name(name);
  v.set_iteration_us(iteration_us);
  return v;
}

v1::VariantIterations VariantIters(const std::string& v, std::vector<double> totals) {
  v1::VariantIterations it;
  it.set_variant(v);
  for (double t : totals) it.add_total_us(t);
  return it;
}

ValidationInput ModelConfig(const std::string& name, std::vector<v1::VariantPlan> measured,
                            std::vector<v1::VariantPlan> predicted) {
  ValidationInput in;
  in.name = name;
  in.model.set_name(name);
  in.model.set_num_layers(2);
  in.measured_variants = std::move(measured);
  in.predicted_variants = std::move(predicted);
  return in;
}

// Whole models: candidates are variants, matched by name, in the measured
// order (not alphabetical), with the per-op errors pooled over blocks.
//   m1: none 1000 -> 900 (-10 %), lancet 800 -> 840 (+5 %), dw 850 -> 850 (0)
//       measured best lancet, predicted best lancet: a hit
//   m2: none 2000 -> 1800 (-10 %), lancet 1900 -> 1710 (-10 %)
//       measured best lancet, predicted best lancet: a hit
// |errors| 10 5 0 10 10: MAPE 35/5 = 7; worst 10 (m1 none, first seen).
TEST(SummarizeTest, WholeModelsAreValidatedByVariant) {
  ValidationInput m1 = ModelConfig(
      "m1", {Variant("none", 1000), Variant("lancet", 800), Variant("dw", 850)},
      {Variant("dw", 850), Variant("lancet", 840), Variant("none", 900), Variant("tutel", 1)});
  AddOp(&m1.measured_variants[0], "b0.fwd.qkv", 0, 100);
  AddOp(&m1.measured_variants[0], "b1.fwd.qkv", 100, 200);
  AddOp(&m1.measured_variants[0], "b1.moe.fwd.ep_alltoall_dispatch.p1", 200, 350);
  AddOp(&m1.predicted_variants[2], "b0.fwd.qkv", 0, 110);
  AddOp(&m1.predicted_variants[2], "b1.fwd.qkv", 110, 200);
  AddOp(&m1.predicted_variants[2], "b1.moe.fwd.ep_alltoall_dispatch.p1", 200, 275);
  ValidationInput m2 = ModelConfig("m2", {Variant("none", 2000), Variant("lancet", 1900)},
                                   {Variant("none", 1800), Variant("lancet", 1710)});
  absl::StatusOr<v1::ValidationSummary> s = Summarize({m1, m2}, "testbed", 4, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->models());
  EXPECT_EQ(s->points(), 5);
  EXPECT_DOUBLE_EQ(s->mape_pct(), 7.0);
  EXPECT_EQ(s->worst_config(), "m1");
  EXPECT_EQ(s->worst_candidate(), "none");
  EXPECT_EQ(s->worst_schedule(), v1::SCHEDULE_UNSPECIFIED);
  ASSERT_EQ(s->results_size(), 2);
  const v1::ValidationConfig& c = s->results(0);
  EXPECT_EQ(c.model().name(), "m1");
  EXPECT_FALSE(c.has_layer());
  ASSERT_EQ(c.points_size(), 3);
  EXPECT_EQ(c.points(0).candidate(), "none");
  EXPECT_EQ(c.points(1).candidate(), "lancet");
  EXPECT_EQ(c.points(2).candidate(), "dw");
  EXPECT_DOUBLE_EQ(c.points(1).error_pct(), 5.0);
  EXPECT_EQ(c.measured_best_candidate(), "lancet");
  EXPECT_EQ(c.predicted_best_candidate(), "lancet");
  EXPECT_DOUBLE_EQ(s->selection_accuracy_pct(), 100.0);
  // qkv: 100 -> 110 (+10 %) and 100 -> 90 (-10 %) pooled over blocks; the
  // dispatch: 150 -> 75 (-50 %), its part ".p1" and scope "moe." dropped.
  ASSERT_EQ(s->ops_size(), 2);
  EXPECT_EQ(s->ops(0).op(), "fwd.qkv");
  EXPECT_EQ(s->ops(0).count(), 2);
  EXPECT_DOUBLE_EQ(s->ops(0).mape_pct(), 10.0);
  EXPECT_DOUBLE_EQ(s->ops(0).mean_signed_pct(), 0.0);
  EXPECT_EQ(s->ops(1).op(), "fwd.ep_alltoall_dispatch");
  EXPECT_DOUBLE_EQ(s->ops(1).mean_signed_pct(), -50.0);

  const std::string md = RenderMarkdown(*s, {});
  EXPECT_THAT(md, HasSubstr("of whole models, for 2 models and every overlap variant"));
  EXPECT_THAT(md, HasSubstr("| points (config × variant) | 5 |"));
  EXPECT_THAT(md, HasSubstr("| max absolute error | 10.0 % (m1, none) |"));
  EXPECT_THAT(md, HasSubstr("## Error by variant\n\n| variant | points |"));
  EXPECT_THAT(md, HasSubstr("| none | 2 | 10.0 |"));
  EXPECT_THAT(md, HasSubstr("| dw | 1 | 0.0 |"));
  EXPECT_THAT(md, HasSubstr("None: the predicted best variant measured fastest in every config."));
  // Columns in first-seen order: none, lancet, dw; m2 has no dw.
  EXPECT_THAT(md,
              HasSubstr("| config | none meas ms | none pred ms | none err % | lancet meas ms |"));
  EXPECT_THAT(md, HasSubstr("| m2 | 2.000 | 1.800 | -10.0 | 1.900 | 1.710 | -10.0 | – | – | – | "
                            "lancet | lancet | 0.0 | – |"));
  EXPECT_THAT(md, Not(HasSubstr("schedule")));

  const std::string data = PlotData(*s);
  EXPECT_THAT(data, HasSubstr("index 0, 1, ...): none lancet dw\n# variant measured_ms"));
  EXPECT_THAT(data, HasSubstr("predicted vs measured training iteration time"));
  EXPECT_THAT(GnuplotScript(*s, "d.dat", "p.png"),
              HasSubstr("set xlabel 'measured training iteration time (ms)'"));
}

// Variants' paired iterations decide ties as schedules' do, and a model's
// bad input names the variant.
TEST(SummarizeTest, WholeModelTiesAndErrorsNameTheVariant) {
  ValidationInput m = ModelConfig("m", {Variant("none", 1010), Variant("lancet", 1000)},
                                  {Variant("none", 900), Variant("lancet", 950)});
  m.paired = true;
  m.variant_iterations = {VariantIters("none", {1010, 990, 1020, 1005, 1030, 980}),
                          VariantIters("lancet", {1000, 1000, 1000, 1000, 1000, 1000})};
  absl::StatusOr<v1::ValidationSummary> s = Summarize({m}, "p", 4, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->results(0).measured_best_candidate(), "lancet");
  EXPECT_EQ(s->results(0).predicted_best_candidate(), "none");
  EXPECT_THAT(s->results(0).measured_tied_candidates(), ::testing::ElementsAre("none", "lancet"));
  EXPECT_TRUE(s->results(0).measured_tied().empty());  // layers only
  EXPECT_DOUBLE_EQ(s->selection_accuracy_tied_pct(), 100.0);
  EXPECT_THAT(RenderMarkdown(*s, {}), HasSubstr("(moeplan-exec `--variant all`)"));

  ValidationInput bad = m;
  bad.variant_iterations[1] = VariantIters("lancet", {1000, 1000});
  s = Summarize({bad}, "p", 4, 2);
  EXPECT_THAT(s.status().message(),
              HasSubstr("config 'm', variant lancet: 2 paired iterations where another variant "
                        "has 6"));
  bad = m;
  bad.measured_variants.push_back(Variant("none", 5));
  s = Summarize({bad}, "p", 4, 2);
  EXPECT_THAT(s.status().message(), HasSubstr("config 'm': variant none measured twice"));
  bad = m;
  bad.measured_variants[0].set_iteration_us(0);
  s = Summarize({bad}, "p", 4, 2);
  EXPECT_THAT(s.status().message(),
              HasSubstr("config 'm', variant none: measured iteration_us must be finite and > 0"));
  bad = ModelConfig("lonely", {Variant("none", 1)}, {Variant("dw", 1)});
  s = Summarize({bad}, "p", 4, 2);
  EXPECT_THAT(s.status().message(), HasSubstr("no variant is both measured and predicted"));
  // Layers and models do not mix, in one config or one summary.
  bad = m;
  bad.measured.push_back(Plan(v1::SCHEDULE_S1, 1));
  s = Summarize({bad}, "p", 4, 2);
  EXPECT_THAT(s.status().message(), HasSubstr("has both schedules (a layer) and variants"));
  s = Summarize({m, Config("layer", {Plan(v1::SCHEDULE_S1, 1)}, {Plan(v1::SCHEDULE_S1, 1)})}, "p",
                4, 2);
  EXPECT_THAT(s.status().message(),
              HasSubstr("config 'layer': layer configs and whole models cannot be mixed"));
}

TEST(GnuplotScriptTest, QuotesPathsAndPlotsEverySchedule) {
  absl::StatusOr<v1::ValidationSummary> s = Summarize(TwoByThree(), "h200", 8, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string gp = GnuplotScript(*s, "/tmp/it's `here`/d.dat", "out \"1\".png");
  // Single-quoted: a quote doubled; backquotes and double quotes literal.
  EXPECT_THAT(gp, HasSubstr("data_file = '/tmp/it''s `here`/d.dat'\n"));
  EXPECT_THAT(gp, HasSubstr("png_file = 'out \"1\".png'\n"));
  EXPECT_THAT(gp, HasSubstr("set output png_file\n"));
  EXPECT_THAT(gp, HasSubstr("set logscale xy\n"));
  EXPECT_THAT(gp, HasSubstr("(ms)"));
  EXPECT_THAT(gp, HasSubstr("1.1*x"));
  EXPECT_THAT(gp, HasSubstr("0.9*x"));
  EXPECT_THAT(gp, HasSubstr("data_file index 0 using 2:3 with points pt 7 ps 1.3 lc rgb "
                            "'#1f77b4' title 'default'"));
  EXPECT_THAT(gp, HasSubstr("data_file index 2 using 2:3 with points pt 9 ps 1.3 lc rgb "
                            "'#2ca02c' title 's2'"));
  // Range: 0.72 / 1.25 to 2.75 * 1.25.
  EXPECT_THAT(gp, HasSubstr("set xrange [0.576:3.4375]\n"));
  // Inside one decade 1-2-5 tics would be only 1 and 2, so every 1..9 step.
  EXPECT_THAT(gp, HasSubstr("set xtics (0.6, 0.7, 0.8, 0.9, 1, 2, 3)\n"));

  const std::string nl = GnuplotScript(*s, "a\nb", "p.png");
  EXPECT_THAT(nl, HasSubstr("data_file = 'a'.\"\\n\".'b'\n"));
}

bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  return static_cast<bool>(f);
}

TEST(GnuplotScriptTest, GnuplotRendersPng) {
  struct stat st;
  if (::stat("/usr/bin/gnuplot", &st) != 0) {
    GTEST_SKIP() << "/usr/bin/gnuplot is not installed (Debian: apt-get install gnuplot-nox)";
  }
  absl::StatusOr<v1::ValidationSummary> s = Summarize(TwoByThree(), "h200", 8, 2);
  ASSERT_TRUE(s.ok()) << s.status();

  std::string tmpl = ::testing::TempDir() + "validation_plotXXXXXX";
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  // A quote and a space in the paths, and gnuplot run from another directory.
  const std::string dir = tmpl + "/it's here";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  const std::string data = dir + "/validation.dat";
  const std::string script = dir + "/validation.gp";
  const std::string png = dir + "/validation.png";
  ASSERT_TRUE(WriteFile(data, PlotData(*s)));
  ASSERT_TRUE(WriteFile(script, GnuplotScript(*s, data, png)));

  const std::string cmd = "cd / && /usr/bin/gnuplot " + ShellQuote(script) + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(png, std::ios::binary);
  ASSERT_TRUE(f) << png << " was not written";
  std::string head(8, '\0');
  f.read(head.data(), 8);
  EXPECT_EQ(head, std::string("\x89PNG\r\n\x1a\n", 8));
  f.close();
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);
}

}  // namespace
}  // namespace moeplan::calibration

namespace moeplan::calibration {
namespace {

// The noise floor on synthetic repeats: 8 totals 10..17 in order (a steady
// drift). Median 13.5; quartiles at ranks 1.75 and 5.25: 11.75 and 15.25, IQR
// 3.5 = 25.93 % of the median; halves 10-13 (median 11.5) and 14-17 (15.5):
// +4 = +29.63 %; the floor is the larger.
TEST(NoiseTest, IqrAndHalvesOfSyntheticRepeats) {
  const std::vector<double> drift = {10, 11, 12, 13, 14, 15, 16, 17};
  absl::StatusOr<v1::MeasuredNoise> n = NoiseOf(drift);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->samples(), 8);
  EXPECT_NEAR(n->iqr_pct(), 100.0 * 3.5 / 13.5, 1e-9);
  EXPECT_NEAR(n->halves_pct(), 100.0 * 4.0 / 13.5, 1e-9);
  EXPECT_NEAR(n->floor_pct(), 100.0 * 4.0 / 13.5, 1e-9);
  // The same totals shuffled so both halves hold the same values: no drift,
  // the IQR is the floor.
  const std::vector<double> mixed = {10, 17, 12, 15, 11, 16, 13, 14};
  n = NoiseOf(mixed);
  ASSERT_TRUE(n.ok());
  EXPECT_NEAR(n->halves_pct(), 100.0 * (13.5 - 13.5) / 13.5, 1e-9);
  EXPECT_NEAR(n->floor_pct(), n->iqr_pct(), 1e-12);
  // An odd count leaves the middle total out of both halves: 5 of 9 in the
  // middle; halves {1,1,1,1} and {2,2,2,2}, median 5... of all nine: 2.
  const std::vector<double> odd = {1, 1, 1, 1, 5, 2, 2, 2, 2};
  n = NoiseOf(odd);
  ASSERT_TRUE(n.ok());
  EXPECT_NEAR(n->halves_pct(), 100.0 * (2.0 - 1.0) / 2.0, 1e-9);
  // Steady totals: no noise.
  n = NoiseOf(std::vector<double>(6, 42.0));
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->floor_pct(), 0.0);
  EXPECT_EQ(std::string(NoiseOf(std::vector<double>{1, 2, 3}).status().message()),
            "noise: needs at least 4 totals (got 3)");
  EXPECT_EQ(std::string(NoiseOf(std::vector<double>{1, 2, 3, 0}).status().message()),
            "noise: iteration totals must be finite and > 0 (got 0)");
}

v1::Replay ReplayOf(double measured, double replayed) {
  v1::Replay r;
  r.set_measured_us(measured);
  r.set_replayed_us(replayed);
  r.set_composition_error_pct(100.0 * (replayed - measured) / measured);
  return r;
}

// Replays split each point's error into composition and cost; iterations give
// each point its noise floor; both are summarized and reported.
TEST(SummarizeTest, ReplaysSplitTheErrorAndIterationsGiveTheNoiseFloor) {
  ValidationInput in = Config("a", {Plan(v1::SCHEDULE_DEFAULT, 1000), Plan(v1::SCHEDULE_S1, 800)},
                              {Plan(v1::SCHEDULE_DEFAULT, 1100), Plan(v1::SCHEDULE_S1, 760)});
  // default: measured 1000, replayed 1000 * 0.98 = 980 (-2 %), predicted 1100:
  // cost +12.24 %; s1: replayed 800 (0 %), predicted 760: cost -5 %.
  in.replays.push_back({"default", ReplayOf(1000, 980)});
  in.replays.push_back({"s1", ReplayOf(800, 800)});
  v1::ScheduleIterations* it = &in.iterations.emplace_back();
  it->set_schedule(v1::SCHEDULE_DEFAULT);
  // IQR 1050 - 950 = 10 %; halves 925 and 1075: +15 %, the floor.
  for (double t : {900, 950, 1000, 1050, 1100}) it->add_total_us(t);
  it = &in.iterations.emplace_back();
  it->set_schedule(v1::SCHEDULE_S1);
  for (double t : {790, 800, 810, 800}) it->add_total_us(t);
  absl::StatusOr<v1::ValidationSummary> s = Summarize({in}, "p", 4, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  const v1::ValidationPoint& d = s->results(0).points(0);
  ASSERT_EQ(d.candidate(), "default");
  EXPECT_NEAR(d.cost_error_pct(), 100.0 * (1100.0 - 980.0) / 980.0, 1e-9);
  EXPECT_NEAR((1 + d.error_pct() / 100) / (1 + d.replay().composition_error_pct() / 100),
              1 + d.cost_error_pct() / 100, 1e-12);
  EXPECT_NEAR(d.noise().iqr_pct(), 10.0, 1e-9);
  EXPECT_NEAR(d.noise().halves_pct(), 15.0, 1e-9);
  EXPECT_TRUE(d.within_noise()) << "+10 % is within a 15 % floor";
  const v1::ValidationPoint& s1 = s->results(0).points(1);
  EXPECT_NEAR(s1.cost_error_pct(), -5.0, 1e-9);
  EXPECT_NEAR(s1.noise().floor_pct(), 100.0 * 10.0 / 800.0, 1e-9);  // IQR 7.5, halves +10
  EXPECT_FALSE(s1.within_noise()) << "-5 % is beyond a 1.25 % floor";
  EXPECT_EQ(s->replayed_points(), 2);
  EXPECT_NEAR(s->composition_mape_pct(), 1.0, 1e-9);
  EXPECT_NEAR(s->composition_max_pct(), 2.0, 1e-9);
  EXPECT_NEAR(s->cost_mape_pct(), (100.0 * 120.0 / 980.0 + 5.0) / 2, 1e-9);
  EXPECT_EQ(s->noise_points(), 2);
  EXPECT_EQ(s->within_noise_points(), 1);
  EXPECT_EQ(s->within_twice_noise_points(), 1);
  EXPECT_EQ(s->composition_within_noise_points(), 2);
  const std::string md = RenderMarkdown(*s, {});
  EXPECT_THAT(md, HasSubstr("| composition error (replay vs measured), 2 points | MAPE 1.0 %"));
  EXPECT_THAT(md, HasSubstr("| points within their noise floor | 1 of 2 (1 within twice it) |"));
  EXPECT_THAT(md, HasSubstr("## Replay: composition and cost"));
  EXPECT_THAT(md, HasSubstr("| a | default | 1.000 | 0.980 | 1.100 | +10.0 | -2.0 | +12.2 | 15.0 "
                            "(within) |"));

  // A replay of a candidate not measured, or twice, is refused.
  ValidationInput bad = in;
  bad.replays.push_back({"s2", ReplayOf(1, 1)});
  EXPECT_EQ(std::string(Summarize({bad}, "p", 4, 2).status().message()),
            "config 'a', schedule s2: replayed, not measured");
  bad = in;
  bad.replays.push_back({"s1", ReplayOf(1, 1)});
  EXPECT_EQ(std::string(Summarize({bad}, "p", 4, 2).status().message()),
            "config 'a', schedule s1: replayed twice");
  // Without replays and with too few iterations: neither.
  in.replays.clear();
  in.iterations.clear();
  s = Summarize({in}, "p", 4, 2);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->replayed_points(), 0);
  EXPECT_EQ(s->noise_points(), 0);
  EXPECT_FALSE(s->results(0).points(0).has_noise());
  EXPECT_THAT(RenderMarkdown(*s, {}), Not(HasSubstr("## Replay")));
}

// The speed probes of a run: their median per candidate, and a replay's drift
// and drift-corrected prediction carried to the point and summarized.
TEST(SummarizeTest, MachineDriftIsReportedNextToTheCorrectedError) {
  ValidationInput in = Config("a", {Plan(v1::SCHEDULE_DEFAULT, 1000), Plan(v1::SCHEDULE_S1, 800)},
                              {Plan(v1::SCHEDULE_DEFAULT, 1200), Plan(v1::SCHEDULE_S1, 760)});
  v1::ScheduleIterations* it = &in.iterations.emplace_back();
  it->set_schedule(v1::SCHEDULE_DEFAULT);
  for (double t : {1000, 1000, 1000}) it->add_total_us(t);
  for (double g : {22.0, 18.0, 20.0}) it->add_probe_gflops(g);
  EXPECT_DOUBLE_EQ(RunProbeGflops(in, "default"), 20.0);
  EXPECT_DOUBLE_EQ(RunProbeGflops(in, "s1"), 0.0) << "no iterations: no probe";
  it->set_probe_gflops(1, 0.0);
  EXPECT_DOUBLE_EQ(RunProbeGflops(in, "default"), 0.0) << "a probe that did not run";
  // default: the machine ran 20 % faster than profiled; predicted 1200,
  // corrected 1010 against measured 1000: +1 %. s1: no drift.
  ValidationInput::CandidateReplay r{"default", ReplayOf(1000, 1000)};
  r.has_drift = true;
  r.drift_pct = 20.0;
  r.drift_corrected_us = 1010.0;
  in.replays.push_back(r);
  in.replays.push_back({"s1", ReplayOf(800, 800)});
  absl::StatusOr<v1::ValidationSummary> s = Summarize({in}, "p", 4, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  const v1::ValidationPoint& d = s->results(0).points(0);
  EXPECT_TRUE(d.has_drift());
  EXPECT_DOUBLE_EQ(d.drift_pct(), 20.0);
  EXPECT_DOUBLE_EQ(d.drift_corrected_us(), 1010.0);
  EXPECT_NEAR(d.drift_corrected_error_pct(), 1.0, 1e-9);
  EXPECT_NEAR(d.error_pct(), 20.0, 1e-9);
  EXPECT_FALSE(s->results(0).points(1).has_drift());
  EXPECT_EQ(s->drift_points(), 1);
  EXPECT_DOUBLE_EQ(s->median_drift_pct(), 20.0);
  EXPECT_NEAR(s->drift_corrected_mape_pct(), 1.0, 1e-9);
  const std::string md = RenderMarkdown(*s, {});
  EXPECT_THAT(md, HasSubstr("| machine drift (run's speed probe vs the profile's), 1 points | "
                            "median +20.0 % |"));
  EXPECT_THAT(md, HasSubstr("| error of the prediction corrected for machine drift | MAPE 1.0 %"));
  EXPECT_THAT(md, HasSubstr("| a | default | +20.0 | 1.200 | 1.010 | 1.000 | +20.0 | +1.0 |"));
  // Without drift: no rows, no section.
  in.replays[0].has_drift = false;
  s = Summarize({in}, "p", 4, 2);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->drift_points(), 0);
  EXPECT_THAT(RenderMarkdown(*s, {}), Not(HasSubstr("Machine drift")));
}

}  // namespace
}  // namespace moeplan::calibration
