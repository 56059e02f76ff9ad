// TracePipeline (planner/include/moeplan/planner/pipeline.h): a pipeline's
// timeline as spans, hand-checked on a small case and, for every schedule,
// the same times as TimePipeline with each step once and no two steps of a
// stage at once.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "moeplan/planner/pipeline.h"

namespace moeplan::planner {
namespace {

using Kind = PipeSpan::Kind;

PipelineSpec Spec(PipelineSchedule s, int p, int v, int m) {
  PipelineSpec spec;
  spec.schedule = s;
  spec.stages = p;
  spec.chunks = v;
  spec.microbatches = m;
  for (int i = 0; i < p * v; ++i) {
    spec.fwd_us.push_back(1.0 + 0.25 * (i % 3));
    spec.bwd_us.push_back(2.0 + 0.5 * ((i * 7) % 5));
  }
  spec.p2p_us = 0.3;
  for (int s = 0; s < p; ++s) spec.tail_us.push_back(0.5 * (s + 1));
  return spec;
}

// Two stages, one micro-batch, forward 1, backward 2, p2p 0.5, tails 4 and
// 1: F on stage 0 [0, 1], its send [1, 1.5], F on stage 1 [1.5, 2.5], B
// there [2.5, 4.5], its send [4.5, 5], B on stage 0 [5, 7]; stage 0's tail
// [7, 11], stage 1's [4.5, 5.5]. The last forward and the first stage's
// backward send nothing.
TEST(PipelineTrace, HandCheckedOneFOneB) {
  PipelineSpec spec = Spec(PipelineSchedule::k1F1B, 2, 1, 1);
  spec.fwd_us = {1.0, 1.0};
  spec.bwd_us = {2.0, 2.0};
  spec.p2p_us = 0.5;
  spec.tail_us = {4.0, 1.0};
  PipelineScratch scratch;
  std::vector<PipeSpan> spans;
  PipelineResult r;
  ASSERT_TRUE(TracePipeline(spec, &scratch, &spans, &r).ok());
  using T = std::tuple<Kind, int, bool, double, double>;
  std::vector<T> got;
  for (const PipeSpan& s : spans) {
    // A tail has no step.
    got.emplace_back(s.kind, s.stage, s.kind != Kind::kTail && s.step.forward, s.start_us,
                     s.end_us);
  }
  const std::vector<T> want = {
      {Kind::kStep, 0, true, 0.0, 1.0},   {Kind::kSend, 0, true, 1.0, 1.5},
      {Kind::kStep, 1, true, 1.5, 2.5},   {Kind::kStep, 1, false, 2.5, 4.5},
      {Kind::kSend, 1, false, 4.5, 5.0},  {Kind::kStep, 0, false, 5.0, 7.0},
      {Kind::kTail, 0, false, 7.0, 11.0}, {Kind::kTail, 1, false, 4.5, 5.5}};
  EXPECT_EQ(got, want);
  EXPECT_EQ(r.makespan_us, 11.0);
  EXPECT_EQ(r.pipeline_end_us, 7.0);
}

// Every schedule (with and without overlapped pairs): the summary is
// TimePipeline's to the bit, the last span ends at the makespan, every step
// of every stage appears once (alone or in a pair), and a stage's steps
// never overlap one another.
TEST(PipelineTrace, EveryStepOnceAtTimePipelinesTimes) {
  PipelineScratch scratch;
  int cases = 0;
  for (auto [ps, p, v, m, pairs] : {std::tuple{PipelineSchedule::kGpipe, 3, 1, 5, false},
                                    std::tuple{PipelineSchedule::k1F1B, 4, 1, 8, false},
                                    std::tuple{PipelineSchedule::k1F1B, 1, 1, 4, true},
                                    std::tuple{PipelineSchedule::kInterleaved, 4, 2, 8, false},
                                    std::tuple{PipelineSchedule::kInterleaved, 2, 2, 4, true},
                                    std::tuple{PipelineSchedule::kDualPipe, 4, 2, 8, true},
                                    std::tuple{PipelineSchedule::kDualPipe, 2, 2, 6, true}}) {
    PipelineSpec spec = Spec(ps, p, v, m);
    if (pairs) {
      // A pair's forward output at 0.8, its backward's at 2.5, both done at 2.7.
      spec.pairs.assign(static_cast<size_t>(p) * v * v, PairTime{0.8, 2.5, 2.7});
    }
    const std::string at = std::to_string(static_cast<int>(ps)) + " p=" + std::to_string(p) +
                           " v=" + std::to_string(v) + " m=" + std::to_string(m);
    std::vector<PipeSpan> spans;
    PipelineResult traced, timed;
    ASSERT_TRUE(TracePipeline(spec, &scratch, &spans, &traced).ok()) << at;
    ASSERT_TRUE(TimePipeline(spec, &scratch, &timed).ok()) << at;
    EXPECT_EQ(traced.makespan_us, timed.makespan_us) << at;
    EXPECT_EQ(traced.bubble_us, timed.bubble_us) << at;
    EXPECT_EQ(traced.busiest_stage, timed.busiest_stage) << at;
    double last = 0.0;
    std::map<std::tuple<int, int, int, bool>, int> seen;
    std::map<int, std::vector<std::pair<double, double>>> busy;
    int pair_spans = 0, tails = 0;
    for (const PipeSpan& s : spans) {
      last = std::max(last, s.end_us);
      EXPECT_LE(s.start_us, s.end_us) << at;
      if (s.kind == Kind::kTail) ++tails;
      if (s.kind != Kind::kStep && s.kind != Kind::kPair) continue;
      ++seen[{s.stage, s.step.chunk, s.step.mb, s.step.forward}];
      busy[s.stage].emplace_back(s.start_us, s.end_us);
      if (s.kind == Kind::kPair) {
        ++pair_spans;
        EXPECT_TRUE(s.step.forward) << at;
        EXPECT_FALSE(s.paired.forward) << at;
        EXPECT_NEAR(s.end_us - s.start_us, 2.7, 1e-9) << at;
        ++seen[{s.stage, s.paired.chunk, s.paired.mb, s.paired.forward}];
      }
    }
    EXPECT_EQ(last, timed.makespan_us) << at;
    EXPECT_EQ(tails, p) << at;
    EXPECT_EQ(pair_spans > 0, pairs) << at;
    // DualPipe numbers each direction's m/2 micro-batches apart.
    const int per_chunk = ps == PipelineSchedule::kDualPipe ? m / 2 : m;
    EXPECT_EQ(seen.size(), static_cast<size_t>(p) * v * per_chunk * 2) << at;
    for (const auto& [step, n] : seen) EXPECT_EQ(n, 1) << at;
    for (auto& [stage, spans_of] : busy) {
      std::sort(spans_of.begin(), spans_of.end());
      for (size_t i = 1; i < spans_of.size(); ++i) {
        EXPECT_LE(spans_of[i - 1].second, spans_of[i].first) << at << " stage " << stage;
      }
    }
    ++cases;
  }
  EXPECT_EQ(cases, 7);
  PipelineSpec bad = Spec(PipelineSchedule::k1F1B, 2, 1, 2);
  bad.bwd_us.pop_back();
  std::vector<PipeSpan> spans;
  PipelineResult out;
  EXPECT_EQ(TracePipeline(bad, &scratch, &spans, &out).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moeplan::planner
