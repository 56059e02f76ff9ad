// Timing the sweep's points on the executor's own primitives (docs/executor.md): the
// Communicator's collectives on every sibling group of a shape at once, SAA and
// its dual, Kernels::Gemm and the memory-bound kernels. Collective over all
// ranks: every rank calls Measure with the same point, in the same order.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "moeplan/executor/backends.h"
#include "moeplan/executor/probe.h"
#include "moeplan/profiler/sweep.h"
#include "moeplan/v1/samples.pb.h"

namespace moeplan::profiler {

struct MeasureOptions {
  int iters = 20;  // timed repetitions at most
  int warmup = 3;  // untimed repetitions first (at least one: it is checked)
  // Budget of the timed repetitions of one point: a point whose warm-up took
  // t runs max(min_iters, min(iters, budget / t)) repetitions.
  double point_budget_s = 2.0;
  int min_iters = 3;
  // A kernel's repetition runs it back to back for at least this long, so that
  // ranks sharing cores (or a GPU) are timed while they all compute.
  double kernel_min_rep_us = 20000.0;
  executor::DType kernel_dtype = executor::DType::kF32;  // GEMM and memory kernels
};

class Profiler {
 public:
  // `world` spans every rank, numbered node-major (see NodeLayout); `backend`
  // provides the device and kernels. Neither is owned; both outlive this.
  static absl::StatusOr<std::unique_ptr<Profiler>> Create(executor::Backend* backend,
                                                          executor::Communicator* world,
                                                          NodeLayout layout,
                                                          MeasureOptions options);

  ~Profiler();

  // Times one point. The sample (op, iters, warmup, median/min/max over
  // repetitions of the max over ranks, correctness) is the same on every rank;
  // `run` is left for the caller. Errors are the backend's (a failed
  // collective leaves the ranks out of step: the caller aborts).
  absl::StatusOr<v1::ProfileSample> Measure(const Point& p);

 private:
  struct Group;
  Profiler(executor::Backend* backend, executor::Communicator* world, NodeLayout layout,
           MeasureOptions options);
  absl::StatusOr<Group*> GroupFor(GroupShape shape);
  absl::StatusOr<Group*> SaaGroup(int gather_ranks, bool gather);
  absl::StatusOr<v1::ProfileSample> Collective(const Point& p);
  absl::StatusOr<v1::ProfileSample> Saa(const Point& p);
  absl::StatusOr<v1::ProfileSample> Gemm(const Point& p);
  absl::StatusOr<v1::ProfileSample> Memory(const Point& p);
  // The compute phase before each repetition of an in-context point (null for
  // `us` <= 0: isolated).
  absl::StatusOr<const std::function<absl::Status()>*> ContextPhase(double us);
  // The speed probe on every rank at once, mean over ranks (collective).
  absl::StatusOr<double> ProbeGflops();

  executor::Backend* backend_;
  executor::Communicator* world_;
  NodeLayout layout_;
  MeasureOptions options_;
  std::vector<std::unique_ptr<Group>> groups_;
  struct Context {
    executor::DeviceBuffer a, b, c;
    double gemm_us = 0.0;  // one GEMM, all ranks at once, the slowest rank
    std::function<absl::Status()> phase;
  };
  Context context_;
  std::optional<executor::SpeedProbe> probe_;  // made at the first GEMM point
};

}  // namespace moeplan::profiler
