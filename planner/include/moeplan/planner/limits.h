// What one plan may make the planner build, beyond the field rules of its
// inputs (docs/service.md, "Limits"). Each is checked before the work it
// bounds is allocated, and exceeding one is ResourceExhausted naming the limit
// and the value. They are sized for the largest real jobs with room to spare;
// a server answering many launchers at once needs every request's memory and
// time bounded, whatever the request.
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"

namespace moeplan::planner {

// Steps of one pipeline simulation: stages * chunks * micro-batches * 2
// (forward and backward). A step costs about 200 bytes while simulated, so
// the largest pipeline holds ~100 MiB (pp = 64 stages of 1,024 micro-batches
// with 4 virtual stages each, or pp = 128 with 2,048).
inline constexpr int64_t kMaxPipelineSteps = int64_t{1} << 19;

// Ops of one pipeline program (layout.h BuildPipelineProgram: every chunk's
// ops once per micro-batch): ~200 bytes each with their simulation, so the
// largest holds ~200 MiB; programs are built to be executed, and the runs
// this bounds already take minutes per iteration on the CPU backend.
inline constexpr int64_t kMaxProgramOps = int64_t{1} << 20;

// Candidates one layout search enumerates (before pruning). The largest
// searches of the examples enumerate ~10,000.
inline constexpr int64_t kMaxSearchCandidates = int64_t{1} << 18;

// Pipeline steps one layout search may simulate to bound its candidates: the
// sum over the candidates that fit memory of their PipelineSteps, checked
// before the first is bounded. Each candidate's bound is one pipeline
// simulation (~30-100 ns a step), so this caps the bounding at tens of
// seconds; the examples' searches need under 2^22.
inline constexpr int64_t kMaxSearchSteps = int64_t{1} << 28;

// Op timings one response may carry (include_timeline): a timing is ~100
// bytes of protobuf and ~300 of JSON.
inline constexpr int64_t kMaxTimelineOps = int64_t{1} << 18;

// A plan's wall-clock budget, checked between the candidates it simulates.
struct Deadline {
  std::chrono::steady_clock::time_point at = std::chrono::steady_clock::time_point::max();
  bool Passed() const { return std::chrono::steady_clock::now() >= at; }
  // DeadlineExceeded saying what was cut short, e.g. "search: ...".
  absl::Status Check(std::string_view what) const;
};

}  // namespace moeplan::planner
